"""Sanity checks of an ONNX file's tensors before anything converts them to arrays.

A hostile or damaged file can declare a tensor far larger than the data it holds (a
``[2**20, 2**20]`` initializer with no data), negative dimensions, an element type that does
not exist, or external data beyond the end of its file. Each is refused here with a
:class:`~graph_autofusion.errors.ModelLoadError` naming the file, the tensor (and the node
holding it) and the problem, before any array of the declared size is allocated: the checks
only read field lengths, file sizes and dimensions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from graph_autofusion.errors import ModelLoadError

#: One ONNX (protobuf) file cannot exceed 2 GiB: larger models keep weights as external data.
PROTOBUF_LIMIT = 2**31 - 1
#: NumPy's largest rank: a tensor of more dims cannot become an array.
MAX_RANK = 64

_A = AttributeProto
_HOLDERS = frozenset((_A.TENSOR, _A.TENSORS, _A.GRAPH, _A.GRAPHS, _A.SPARSE_TENSOR))
_HOLDING_OPS = frozenset(("Constant", "ConstantOfShape", "If", "Loop", "Scan", "SequenceMap"))
_BYTES: dict[int, float] = {
    TensorProto.FLOAT: 4,
    TensorProto.UINT8: 1,
    TensorProto.INT8: 1,
    TensorProto.UINT16: 2,
    TensorProto.INT16: 2,
    TensorProto.INT32: 4,
    TensorProto.INT64: 8,
    TensorProto.BOOL: 1,
    TensorProto.FLOAT16: 2,
    TensorProto.DOUBLE: 8,
    TensorProto.UINT32: 4,
    TensorProto.UINT64: 8,
    TensorProto.COMPLEX64: 8,
    TensorProto.COMPLEX128: 16,
    TensorProto.BFLOAT16: 2,
}
for _name, _size in (
    ("FLOAT8E4M3FN", 1),
    ("FLOAT8E4M3FNUZ", 1),
    ("FLOAT8E5M2", 1),
    ("FLOAT8E5M2FNUZ", 1),
    ("FLOAT8E8M0", 1),
    ("UINT4", 0.5),
    ("INT4", 0.5),
    ("FLOAT4E2M1", 0.5),
    ("UINT2", 0.25),
    ("INT2", 0.25),
    ("FLOAT6E2M3", 0.75),
    ("FLOAT6E3M2", 0.75),
):
    if hasattr(TensorProto, _name):
        _BYTES[getattr(TensorProto, _name)] = _size
_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def physical_memory() -> int:
    """Bytes of RAM of this machine (0 when unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 0


def check_file_size(path: str) -> None:
    """Refuse a file over protobuf's 2 GiB limit before reading it (a clear message instead
    of a decoder error after reading gigabytes)."""
    size = os.path.getsize(path)
    if size > PROTOBUF_LIMIT:
        raise ModelLoadError(
            f"{path}: the file is {size / 2**30:.1f} GiB, over protobuf's 2 GiB limit for one "
            f"ONNX file (a valid model this large keeps its weights as external data)"
        )


def named_tensors(proto: ModelProto) -> Iterator[tuple[str, TensorProto]]:
    """Every tensor of the model (initializers and attribute tensors, subgraphs and local
    functions included) with where it is, for messages; iterative (no recursion limit)."""
    stack: list[tuple[str, GraphProto]] = [("", proto.graph)]
    for f in proto.functions:
        for node in f.node:
            yield from _node_tensors(node, f"function {f.name!r} ", stack)
    while stack:
        where, g = stack.pop()
        for t in g.initializer:
            yield f"{where}initializer {t.name!r}", t
        for sp in g.sparse_initializer:
            yield f"{where}sparse initializer {sp.values.name!r} (values)", sp.values
            yield f"{where}sparse initializer {sp.values.name!r} (indices)", sp.indices
        for node in g.node:  # standard operators: only these hold tensors or graphs
            if node.op_type in _HOLDING_OPS or node.domain not in ("", "ai.onnx"):
                yield from _node_tensors(node, where, stack)


def _node_tensors(
    node, where: str, stack: list[tuple[str, GraphProto]]
) -> Iterator[tuple[str, TensorProto]]:
    for a in node.attribute:
        if a.type not in _HOLDERS:
            continue
        label = f"{where}node {node.name or '(unnamed)'!r} ({node.op_type}) attribute {a.name!r}"
        if a.type == _A.TENSOR:
            yield label, a.t
        elif a.type == _A.TENSORS:
            for i, t in enumerate(a.tensors):
                yield f"{label}[{i}]", t
        elif a.type == _A.SPARSE_TENSOR:
            yield f"{label} (values)", a.sparse_tensor.values
        elif a.type == _A.GRAPH:
            stack.append((f"{label} body: ", a.g))
        else:
            for i, sub in enumerate(a.graphs):
                stack.append((f"{label}[{i}] body: ", sub))


def element_count(t: TensorProto, label: str, where: str) -> int:
    """Declared element count of ``t`` (exact Python int); negative dims are refused."""
    if len(t.dims) > MAX_RANK:
        raise ModelLoadError(f"{label}: {where} has rank {len(t.dims)} (at most {MAX_RANK})")
    n = 1
    for d in t.dims:
        if d < 0:
            raise ModelLoadError(f"{label}: {where} has a negative dimension {list(t.dims)}")
        n *= int(d)
    return n


def expected_bytes(t: TensorProto, n: int) -> int | None:
    """Bytes of raw data ``n`` elements of ``t``'s type take (None: no fixed size)."""
    size = _BYTES.get(t.data_type)
    return None if size is None else math.ceil(n * size)


def check_tensors(proto: ModelProto, label: str, base_dir: str | None) -> None:
    """Refuse tensors whose data does not match their declaration (see the module docstring).

    ``base_dir``: the folder external data is read from (``None``: external data is not
    checked here, e.g. for an in-memory ModelProto, which refuses it anyway).

    Raises:
        ModelLoadError: naming the file, the tensor and the problem.
    """
    external_total = 0
    for where, t in named_tensors(proto):
        n = element_count(t, label, where)
        if t.data_type == TensorProto.UNDEFINED or (
            t.data_type not in _BYTES and t.data_type != TensorProto.STRING
        ):
            if n == 0 and not t.dims and not t.raw_data:
                continue  # an empty placeholder (e.g. sparse indices of an all-zero tensor)
            raise ModelLoadError(
                f"{label}: {where} has element type {t.data_type}, which ONNX does not define"
            )
        if t.data_location == TensorProto.EXTERNAL:
            if base_dir is not None:
                external_total += _check_external(t, n, label, where, base_dir)
            continue
        _check_inline(t, n, label, where)
    memory = physical_memory()
    if memory and external_total > memory:
        raise ModelLoadError(
            f"{label}: its external data declares {external_total / 2**30:.1f} GiB of tensors, "
            f"more than this machine's {memory / 2**30:.1f} GiB of memory"
        )
    for sp in proto.graph.sparse_initializer:
        _check_sparse(sp, label, memory)


def _check_inline(t: TensorProto, n: int, label: str, where: str) -> None:
    shape = list(t.dims)
    if t.data_type == TensorProto.STRING:
        have = len(t.string_data)
        if have != n:
            raise ModelLoadError(
                f"{label}: {where} declares shape {shape} ({n} strings) but holds {have}"
            )
        return
    if t.HasField("raw_data"):
        want = expected_bytes(t, n)
        have = len(t.raw_data)
        sizes = {want, n} if t.data_type in _PACKED_OR_ODD else {want}
        if have not in sizes:
            raise ModelLoadError(
                f"{label}: {where} declares shape {shape} ({n} elements, {want} bytes) but holds "
                f"{have} bytes of data (truncated or damaged file?)"
            )
        return
    have = sum(len(getattr(t, f)) for f in _TYPED_FIELDS)
    if n == 0 and have == 0:
        return
    if have == 0:
        raise ModelLoadError(
            f"{label}: {where} declares shape {shape} ({n} elements) but holds no data"
        )
    ok = {n, 2 * n, (n + 1) // 2, (n + 3) // 4}
    if have not in ok:
        raise ModelLoadError(
            f"{label}: {where} declares shape {shape} ({n} elements) but holds {have} values"
        )


_PACKED_OR_ODD = {
    v
    for k, v in TensorProto.DataType.items()
    if k.startswith(("FLOAT6", "FLOAT4", "INT4", "UINT4", "INT2", "UINT2"))
}


def _check_external(t: TensorProto, n: int, label: str, where: str, base_dir: str) -> int:
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    full = os.path.join(base_dir, loc)
    if not loc or not os.path.isfile(full):
        raise ModelLoadError(f"{label}: external data file {full!r} ({where}) is missing")
    folder = os.path.realpath(base_dir)
    if os.path.isabs(loc) or os.path.commonpath([os.path.realpath(full), folder]) != folder:
        raise ModelLoadError(
            f"{label}: {where} points to external data {loc!r} outside the model's folder"
        )
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise ModelLoadError(
            f"{label}: {where} has a malformed external-data offset or length: {info}"
        ) from None
    size = os.path.getsize(full)
    want = expected_bytes(t, n)
    if offset < 0 or (length is not None and length < 0):
        raise ModelLoadError(f"{label}: {where} has a negative external-data offset or length")
    if offset > size or (length is not None and offset + length > size):
        end = "end" if length is None else f"{offset + length}"
        raise ModelLoadError(
            f"{label}: {where} reads bytes {offset}..{end} of external data file {full!r}, "
            f"which has {size} bytes (truncated data file?)"
        )
    have = length if length is not None else size - offset
    if want is not None and have != want and not (t.data_type in _PACKED_OR_ODD and have == n):
        raise ModelLoadError(
            f"{label}: {where} declares shape {list(t.dims)} ({n} elements, {want} bytes) but its "
            f"external data in {full!r} holds {have} bytes"
        )
    return have


def _check_sparse(sp, label: str, memory: int) -> None:
    name = sp.values.name
    where = f"sparse initializer {name!r}"
    dense = 1
    for d in sp.dims:
        if d < 0:
            raise ModelLoadError(f"{label}: {where} has a negative dimension {list(sp.dims)}")
        dense *= int(d)
    nnz = sp.values.dims[0] if len(sp.values.dims) == 1 else None
    if nnz is None:
        raise ModelLoadError(
            f"{label}: {where}: its values must be 1-D, got {list(sp.values.dims)}"
        )
    idx = list(sp.indices.dims)
    if nnz and idx not in ([nnz], [nnz, len(sp.dims)]):
        raise ModelLoadError(
            f"{label}: {where}: indices of shape {idx} do not fit {nnz} values of a "
            f"{len(sp.dims)}-D tensor"
        )
    size = expected_bytes(sp.values, dense) or dense
    if memory and size > memory // 2:
        raise ModelLoadError(
            f"{label}: {where} declares dense shape {list(sp.dims)} ({size / 2**30:.1f} GiB), "
            f"more than half of this machine's memory"
        )
    if nnz and sp.indices.data_location != TensorProto.EXTERNAL:
        from onnx import numpy_helper

        ind = numpy_helper.to_array(sp.indices)
        bound = dense if ind.ndim == 1 else list(sp.dims)
        if (ind < 0).any() or (ind >= bound).any():
            raise ModelLoadError(f"{label}: {where} has indices outside its shape {list(sp.dims)}")


# ----------------------------------------------------------------------------- text, attributes
# A string field of a damaged file that is not valid UTF-8 reads back as ``bytes``: every later
# stage would fail on it (export cannot even write it back).
_NODE_TEXT = ("op_type", "domain", "name", "doc_string")


def check_text(proto: ModelProto, label: str) -> None:
    """Refuse model, graph and value names or docs that are not valid UTF-8 (node fields are
    checked by :func:`node_problem` during the import)."""
    fields = [
        ("producer name", proto.producer_name),
        ("producer version", proto.producer_version),
        ("domain", proto.domain),
        ("doc string", proto.doc_string),
        ("graph name", proto.graph.name),
        ("graph doc string", proto.graph.doc_string),
    ]
    fields += [("opset domain", op.domain) for op in proto.opset_import]
    fields += [("metadata", p.key) for p in proto.metadata_props]
    fields += [("metadata", p.value) for p in proto.metadata_props]
    g = proto.graph
    for kind, infos in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        fields += [(f"a graph {kind} name", vi.name) for vi in infos]
        fields += [(f"a graph {kind} doc string", vi.doc_string) for vi in infos]
    fields += [("an initializer name", t.name) for t in g.initializer]
    fields += [("an initializer doc string", t.doc_string) for t in g.initializer]
    for what, value in fields:
        if type(value) is not str:
            raise ModelLoadError(
                f"{label}: {what} is not valid UTF-8 (damaged file?): {value!r:.60}"
            )


def node_problem(node, opsets: dict[str, int]) -> str | None:
    """Why an imported node cannot be used (``None``: it can): a name field that is not valid
    UTF-8, or an attribute of a type the operator's schema does not take (a damaged file).
    Reads the IR node (plain Python fields), not its NodeProto: cheap on 100k-node graphs."""
    name = node.meta.get("onnx_name", node.name)
    for field, value in (("op_type", node.op_type), ("domain", node.domain), ("name", name)):
        if type(value) is not str:
            return f"its {field} is not valid UTF-8 (damaged file?)"
    if type(node.doc) is not str or type(node.overload) is not str:
        return "its doc string is not valid UTF-8 (damaged file?)"
    for v in node.outputs:
        if type(v.name) is not str:
            return f"an output name is not valid UTF-8 (damaged file?): {v.name!r:.40}"
    if not node.attr_types:
        return None
    expected = _attribute_types(node.op_type, node.domain, opsets.get(node.domain, 0))
    for key, kind in node.attr_types.items():
        if type(key) is not str:
            return "an attribute name is not valid UTF-8 (damaged file?)"
        want = expected.get(key) if expected else None
        if (
            want is not None
            and kind != want
            and not getattr(getattr(node.attrs.get(key), "proto", None), "ref_attr_name", "")
        ):
            return (
                f"attribute {key!r} is of type {_A.AttributeType.Name(kind)}; "
                f"{node.op_type} takes {_A.AttributeType.Name(want)} (damaged file?)"
            )
    return None


_SCHEMA_CACHE: dict[tuple[str, str, int], dict[str, int] | None] = {}


def _attribute_types(op_type: str, domain: str, version: int) -> dict[str, int] | None:
    """Attribute name -> type of the operator's schema at ``version`` (None: no schema)."""
    key = (op_type, domain, version)
    if key not in _SCHEMA_CACHE:
        from onnx import defs

        try:
            schema = defs.get_schema(op_type, version or defs.onnx_opset_version(), domain)
            _SCHEMA_CACHE[key] = {n: int(a.type) for n, a in schema.attributes.items()}
        except Exception:  # noqa: BLE001 - unknown operator or domain: nothing to compare
            _SCHEMA_CACHE[key] = None
    return _SCHEMA_CACHE[key]
