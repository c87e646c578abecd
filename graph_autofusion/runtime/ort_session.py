"""The one onnxruntime CPU session helper of the project.

sess = ort_session(model_or_path_or_proto, level="all", threads=2)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graph_autofusion.codegen import ort_customop as co
from graph_autofusion.errors import MissingFileError
from graph_autofusion.ir.core import Model

_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def ort_session(
    model: Any,
    level: str = "disable",
    threads: int = 2,
    spinning: bool = False,
    custom_ops_library: str | None = None,
    in_place: Mapping[str, np.ndarray] | None = None,
    *,
    log_severity: int = 3,
    profile_prefix: str | None = None,
    lean: bool = False,
    prepack: bool = True,
    optimized_model_path: str | None = None,
    find_library: bool = True,
) -> Any:
    """An onnxruntime CPU session of an IR :class:`Model`, a ``ModelProto``, its serialized
    bytes or a path.

    ``level``: ``disable``, ``basic``, ``extended`` or ``all``. ``spinning``: let idle worker
    threads spin (onnxruntime's default, what deployments run); off by default because
    sessions here are often used side by side, and an idle session's spinning threads take the
    cores from the one being timed.

    A model using graph-autofusion's custom operators gets their library registered:
    ``custom_ops_library``, else the one its metadata names (next to a saved file), else the
    one this process built for those operators. Without any, onnxruntime refuses the model
    with a message naming the ``ai.graph_autofusion`` domain. ``find_library=False``: only
    ``custom_ops_library`` is registered, never one found from the model (the session plain
    onnxruntime makes of a saved file, as a user without graph-autofusion opens it).

    ``in_place``: initializers (by name) that the session reads from these arrays' memory
    instead of the model's bytes (:func:`in_place_weights`): nothing is copied beyond what
    onnxruntime's own kernels pack, and a write into an array is seen by the next run.

    ``threads``: 0 is onnxruntime's own choice (one per physical core). ``log_severity``:
    onnxruntime's ``log_severity_level`` (3: errors only; 4: fatal only). ``profile_prefix``:
    onnxruntime's profiling on, its JSON trace written under this prefix
    (``sess.end_profiling()`` returns the file).

    ``lean``: a session for numerics only (safe mode's whole-model runs): no weight packing,
    no memory arena, and an IR model's large initializers read in place (its arrays are not
    serialized): a session over a model of N bytes of weights adds almost none. ``prepack``:
    onnxruntime packs constant GEMM weights into its own layout (a copy of each); off, its
    kernels read them as stored. ``optimized_model_path``: onnxruntime writes the model its
    optimizer made there (what ``level`` turned the graph into).
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = log_severity
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    if lean:
        so.enable_cpu_mem_arena = False
    if lean or not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if lean and isinstance(model, Model) and not in_place:
        in_place = model_weights(model)
    if isinstance(model, str | os.PathLike):
        src: Any = os.fspath(model)
    elif isinstance(model, bytes):
        src = model
    elif isinstance(model, Model):
        from graph_autofusion.frontend.onnx_frontend import to_onnx

        # the weights read in place are not serialized: the proto goes to the session as is
        src = to_onnx(model, without_data=set(in_place or ()))
        if not in_place:
            src = src.SerializeToString()
    else:
        src = model.SerializeToString()
    lib = custom_ops_library or (_custom_ops_library(model) if find_library else None)
    if lib:
        so.register_custom_ops_library(lib)
    if in_place:
        return _session_in_place(src, so, in_place, level)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


#: Only float initializers at least this large are read in place: onnxruntime reads small
#: integer initializers (shapes, indices) from the model's bytes while it optimizes the graph.
IN_PLACE_MIN_BYTES = 1 << 16


def in_place_weights(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of ``arrays`` (initializer name -> array) that a session can read in place:
    contiguous floating-point arrays of at least :data:`IN_PLACE_MIN_BYTES`, and transposed
    matrices (a parameter's transposed view: read through ``transB``, see
    :func:`_transposed_operands`)."""
    return {
        name: a
        for name, a in arrays.items()
        if isinstance(a, np.ndarray)
        and a.dtype.kind == "f"
        and (a.flags.c_contiguous or (a.ndim == 2 and a.flags.f_contiguous))
        and a.nbytes >= IN_PLACE_MIN_BYTES
    }


def model_weights(model: Any) -> dict[str, np.ndarray]:
    """The initializers of IR ``model`` a session can read in place (:func:`in_place_weights`)."""
    return in_place_weights({n: v.const for n, v in model.graph.initializers.items()})


def _session_in_place(
    src: Any, so: Any, arrays: Mapping[str, np.ndarray], level: str = "all"
) -> Any:
    """A session whose initializers ``arrays`` are onnxruntime values over the arrays' memory
    (``SessionOptions.add_initializer``). The model declares them as external data in a
    placeholder file holding the same bytes, which lives in a temporary folder only while the
    session is created: the session runs on the values given here, but onnxruntime's graph
    optimizer reads some initializers from the model's own data (an fp16 MatMul's weight, whose
    Cast to float32 it makes at every level), so the placeholder must hold the real bytes, not
    zeros. With the optimizer off (``level="disable"``: safe mode's whole-model sessions),
    nothing reads a float32 initializer there: those stay a hole in a sparse file (no copy of
    the weights written)."""
    import onnx
    import onnxruntime as ort

    if isinstance(src, onnx.ModelProto):
        proto = src  # the caller's own copy (made for this session)
    else:
        proto = onnx.load_from_string(src) if isinstance(src, bytes) else onnx.load(src)
    arrays = _transposed_operands(proto, arrays)
    values = {}
    offsets: dict[str, int] = {}
    end = 0
    for init in proto.graph.initializer:
        a = arrays.get(init.name)
        if a is None:
            continue
        offsets[init.name] = end
        end += -(-a.nbytes // 4096) * 4096
        init.ClearField("raw_data")
        for field in ("float_data", "double_data", "int32_data", "int64_data"):
            init.ClearField(field)
        init.data_location = onnx.TensorProto.EXTERNAL
        del init.external_data[:]
        place = (("location", "weights.bin"), ("offset", str(offsets[init.name])))
        for key, val in (*place, ("length", str(a.nbytes))):
            entry = init.external_data.add()
            entry.key, entry.value = key, val
        values[init.name] = ort.OrtValue.ortvalue_from_numpy(a)
        so.add_initializer(init.name, values[init.name])
    with tempfile.TemporaryDirectory(prefix="autofusion-ort-") as d:
        with open(os.path.join(d, "weights.bin"), "wb") as f:
            for name, offset in offsets.items():
                a = arrays[name]
                if level == "disable" and a.dtype == np.float32:
                    continue  # read from the given values only (see above)
                f.seek(offset)
                f.write(memoryview(a).cast("B"))
            f.truncate(end)  # every declared range lies inside the file
        path = os.path.join(d, "model.onnx")
        onnx.save(proto, path)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    # onnxruntime keeps raw pointers: the values (and the arrays under them) must outlive it
    sess._autofusion_in_place = (values, dict(arrays))
    return sess


#: The contractions whose right operand may be given transposed (``transB``), by operator.
_TRANS_B = {"MatMul": "FusedMatMul", "Gemm": "Gemm"}


def _transposed_operands(proto: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with each transposed matrix (an F-contiguous ``[K, N]`` array: a linear
    weight's transposed view of its ``[N, K]`` parameter) replaced by its C-contiguous transpose,
    the parameter's own memory, which ``proto`` (modified) then reads through ``transB``: a
    ``MatMul`` becomes ``com.microsoft.FusedMatMul(transB=1)`` and a ``Gemm`` flips ``transB``.
    onnxruntime packs both from that layout, as it packs a ``MatMul``'s weight. A transposed
    matrix read any other way (or not fp32) is given as a contiguous copy."""
    odd = {n for n, a in arrays.items() if not a.flags.c_contiguous}
    if not odd:
        return dict(arrays)
    import onnx

    out = dict(arrays)
    uses: dict[str, list[tuple[Any, int]]] = {n: [] for n in odd}
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name in uses:
                uses[name].append((node, i))
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            for name in _subgraph_names(node) & odd:
                uses[name].append((node, -1))  # read inside a subgraph: not rewritten
    outputs = {o.name for o in proto.graph.output}
    rewritten = False
    for name in odd:
        a = arrays[name]
        ok = (
            a.dtype == np.float32
            and name not in outputs
            and bool(uses[name])
            and all(
                i == 1 and n.op_type in _TRANS_B and n.domain in ("", "ai.onnx")
                for n, i in uses[name]
            )
        )
        if not ok:
            out[name] = np.ascontiguousarray(a)
            continue
        for node, _ in uses[name]:
            if node.op_type == "Gemm":
                trans = next((t for t in node.attribute if t.name == "transB"), None)
                if trans is None:
                    node.attribute.append(onnx.helper.make_attribute("transB", 1))
                else:
                    trans.i = 1 - trans.i
            else:
                node.op_type, node.domain = "FusedMatMul", "com.microsoft"
                node.attribute.append(onnx.helper.make_attribute("transB", 1))
        out[name] = a.T
        for init in proto.graph.initializer:
            if init.name == name:
                del init.dims[:]
                init.dims.extend(a.T.shape)
        for vi in (*proto.graph.value_info, *proto.graph.input):
            if vi.name == name and vi.type.tensor_type.HasField("shape"):
                vi.type.tensor_type.ClearField("shape")
        rewritten = True
    if rewritten and not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return out


def _subgraph_names(node: Any) -> set[str]:
    """Every value name a node's subgraphs (If branches, Loop bodies) read."""
    import onnx

    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for n in g.node:
                names.update(n.input)
                names.update(_subgraph_names(n))
    return names


def _custom_ops_library(model: Any) -> str | None:
    """The library for the custom operators ``model`` uses (None: it uses none, or none is
    known)."""
    path = None
    if isinstance(model, bytes) and co.DOMAIN.encode() not in model:
        return None  # serialized: the domain's name would appear in it
    if isinstance(model, bytes):
        import onnx

        model = onnx.load_from_string(model)
    if isinstance(model, Model):
        ops = co.library_ops(model)
        proto = None
    elif isinstance(model, str | os.PathLike):
        import onnx

        path = os.fspath(model)
        proto = onnx.load(path, load_external_data=False)
        ops = co.custom_ops_of(proto)
    else:
        proto = model
        ops = co.custom_ops_of(proto)
    if not ops:
        return None
    if proto is not None:
        named = co.library_path_from_metadata(proto, path)
        if named and os.path.exists(named):
            return named
    return co.library_for(ops)


def fused_session(path: str | Path, level: str = "all", threads: int = 2, **kw: Any) -> Any:
    """An onnxruntime session of a fused model saved by graph-autofusion, with the
    custom-operator library its metadata names registered (a model without one opens as is).

    Raises:
        FileNotFoundError: the metadata names a library that is not there (copy the kernel
            folder along with the model).
    """
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    lib = co.library_path_from_metadata(proto, str(path))
    if lib is not None and not os.path.exists(lib):
        raise MissingFileError(
            f"{path} needs its custom-operator library {lib}, which is missing (the kernel "
            f"folder written next to the model must stay next to it)"
        )
    return ort_session(path, level, threads, custom_ops_library=lib, **kw)
