"""Graph IR -> ONNX export (F1): :func:`to_onnx`.

Writes back everything the importer kept: node names/domains/docs, attributes with their
original ``AttributeProto`` types, initializers (raw protos reused for dtypes NumPy cannot hold),
value_info, opset imports, metadata, local functions, sparse initializers, subgraph bodies. If a
captured outer value was replaced in the IR (``replace_all_uses_with``), the references inside
the subgraph body are renamed to the new value.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import numpy as np
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    OperatorSetIdProto,
    StringStringEntryProto,
    TensorProto,
)

from graph_autofusion.frontend.onnx_types import (
    array_to_tensor,
    elem_type_of,
    gc_paused,
    make_value_info,
    tensor_for_value,
)
from graph_autofusion.ir.core import Graph, Model, Node, RawAttribute

_A = AttributeProto


def to_onnx(
    model: Model, *, all_value_info: bool = False, without_data: Collection[str] = ()
) -> ModelProto:
    """Build an ``onnx.ModelProto`` from ``model`` (the IR is not modified).

    ``value_info`` is written for every intermediate value with a known type, except types the
    importer only inferred (``Value.meta["onnx_inferred"]``): extra shape information lets
    onnxruntime apply more graph fusions, which changes float results in the last bits, so by
    default a round trip reproduces the source's onnxruntime outputs bit for bit.

    Args:
        model: The model to export.
        all_value_info: Also write the types found by shape inference on import.
        without_data: Initializers written with their type and dims only (a session reads
            their data from elsewhere: ``ort_session(in_place=...)``), not serialized.

    Returns:
        A new ModelProto; run ``onnx.checker`` on it with :func:`check_model` if wanted.
    """
    with gc_paused():
        return _to_onnx(model, all_value_info, frozenset(without_data))


def _to_onnx(
    model: Model, all_value_info: bool, without_data: frozenset = frozenset()
) -> ModelProto:
    proto = ModelProto()
    proto.ir_version = model.ir_version
    raw_opsets, imported = model.meta.get("onnx_opset_import", ((), None))
    if imported == model.opset_imports:
        proto.opset_import.extend(raw_opsets)
    else:
        for domain, version in model.opset_imports.items():
            op = OperatorSetIdProto(version=version)
            if domain:
                op.domain = domain
            proto.opset_import.append(op)
    for field, value in (
        ("producer_name", model.producer_name),
        ("producer_version", model.producer_version),
        ("domain", model.domain),
        ("model_version", model.model_version),
        ("doc_string", model.doc),
    ):
        if value:
            setattr(proto, field, value)
    _props(proto.metadata_props, model.metadata_props.items())
    proto.functions.extend(model.functions)
    for field in ("training_info", "configuration"):
        getattr(proto, field).extend(model.meta.get(f"onnx_{field}", []))
    export_graph(model.graph, proto.graph, all_value_info=all_value_info, without_data=without_data)
    return proto


def _props(target: Any, items: Iterable[tuple[str, str]]) -> None:
    for k, v in items:
        target.append(StringStringEntryProto(key=k, value=v))


def export_graph(
    graph: Graph,
    g: GraphProto,
    *,
    all_value_info: bool = False,
    without_data: frozenset = frozenset(),
) -> GraphProto:
    """Fill GraphProto ``g`` from ``graph`` (``all_value_info``, ``without_data`` as in
    :func:`to_onnx`)."""
    g.name = graph.name
    if graph.doc:
        g.doc_string = graph.doc
    output_names = {v.name for v in graph.outputs}
    g.node.extend(node_to_proto(n, output_names) for n in graph.nodes)

    inputs = {v.name: v for v in graph.inputs}
    listed: dict[str, Any] = graph.meta.get("onnx_initializer_inputs", {})
    emitted: set[str] = set()
    for name in graph.meta.get("onnx_input_order", []):
        if name in inputs:
            g.input.append(make_value_info(inputs[name]))
            emitted.add(name)
        elif name in listed and name in graph.initializers:
            init = graph.initializers[name]
            vi = make_value_info(init)
            old = listed[name]
            if old.type.tensor_type.elem_type == vi.type.tensor_type.elem_type and list(
                old.type.tensor_type.shape.dim
            ) == list(vi.type.tensor_type.shape.dim):
                vi = old
            g.input.append(vi)
            emitted.add(name)
    g.input.extend(make_value_info(v) for v in graph.inputs if v.name not in emitted)

    sparse = set(graph.meta.get("onnx_sparse_initializers", []))
    for v in graph.initializers.values():
        if (
            v.name in sparse
            and v.const is v.meta.get("onnx_tensor_const")
            and "onnx_sparse" in v.meta
        ):
            sp = v.meta["onnx_sparse"]
            if sp.values.name != v.name:
                sp = _copy(sp)
                sp.values.name = v.name
            g.sparse_initializer.append(sp)
        elif v.name in without_data and isinstance(v.const, np.ndarray):
            t = TensorProto(name=v.name, data_type=elem_type_of(v))
            t.dims.extend(v.const.shape)
            g.initializer.append(t)
        else:
            g.initializer.append(tensor_for_value(v))

    g.output.extend(make_value_info(v) for v in graph.outputs)

    infos: dict[str, Any] = {}
    for n in graph.nodes:
        for v in n.outputs:
            if v.name in output_names or v.meta.get("onnx_omitted"):
                continue
            if v.meta.get("onnx_inferred") and not all_value_info:
                continue
            if v.dtype is not None or "onnx_elem_type" in v.meta or "onnx_type" in v.meta:
                infos[v.name] = v
    for v in (*graph.inputs, *graph.initializers.values()):
        if v.meta.get("onnx_in_value_info") and v.name not in output_names:
            infos[v.name] = v
    if graph.value_info:  # entries naming no value of this graph (e.g. describing subgraphs)
        defined = {v.name for n in graph.nodes for v in n.outputs}
        defined.update(inputs, graph.initializers)
        for name, v in graph.value_info.items():
            if name not in defined:
                infos.setdefault(name, v)
    for name in graph.meta.get("onnx_value_info_order", []):  # source order first
        if name in infos:
            g.value_info.append(make_value_info(infos.pop(name)))
    g.value_info.extend(make_value_info(v) for v in infos.values())
    g.quantization_annotation.extend(graph.meta.get("onnx_quantization_annotation", []))
    g.metadata_props.extend(graph.meta.get("onnx_metadata_props", []))
    return g


def node_to_proto(node: Node, output_names: set[str] | None = None) -> NodeProto:
    """NodeProto for ``node`` (attributes typed by ``node.attr_types`` where known)."""
    n = NodeProto(op_type=node.op_type)
    if node.domain:
        n.domain = node.domain
    name = node.name
    if "onnx_name" in node.meta and name == node.meta.get("onnx_generated_name"):
        name = node.meta["onnx_name"]
    if name:
        n.name = name
    n.input.extend("" if v is None else v.name for v in node.inputs)
    outs = output_names or set()
    n.output.extend(
        "" if (v.meta.get("onnx_omitted") and not v.users and v.name not in outs) else v.name
        for v in node.outputs
    )
    if node.doc:
        n.doc_string = node.doc
    if node.overload:
        n.overload = node.overload
    renames = _capture_renames(node)
    docs = node.meta.get("onnx_attr_docs", {})
    tensors = node.meta.get("onnx_attr_tensors", {})
    for key, value in node.attrs.items():
        a = make_attribute(key, value, node.attr_types.get(key), tensors.get(key), renames)
        if key in docs:
            a.doc_string = docs[key]
        n.attribute.append(a)
    _props(n.metadata_props, node.meta.get("onnx_metadata_props", []))
    n.device_configurations.extend(node.meta.get("onnx_device_configurations", []))
    return n


def _capture_renames(node: Node) -> dict[str, str]:
    old = node.meta.get("onnx_capture_names")
    caps = node.captures
    if not old or len(old) != len(caps):
        return {}
    return {o: v.name for o, v in zip(old, caps) if o != v.name}


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (float, np.floating))


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating))


def _is_str(x: Any) -> bool:
    return isinstance(x, (str, bytes))


def _fits(kind: int, v: Any) -> bool:
    if kind == _A.INT:
        return _is_int(v)
    if kind == _A.FLOAT:
        return _is_num(v)
    if kind == _A.STRING:
        return _is_str(v)
    if kind == _A.TENSOR:
        return isinstance(v, (np.ndarray, TensorProto))
    if kind == _A.GRAPH:
        return isinstance(v, GraphProto)
    if isinstance(v, (list, tuple)):
        if kind == _A.INTS:
            return all(_is_int(x) for x in v)
        if kind == _A.FLOATS:
            return all(_is_num(x) for x in v)
        if kind == _A.STRINGS:
            return all(_is_str(x) for x in v)
        if kind == _A.TENSORS:
            return all(isinstance(x, (np.ndarray, TensorProto)) for x in v)
        if kind == _A.GRAPHS:
            return all(isinstance(x, GraphProto) for x in v)
    return False


def infer_attribute_type(value: Any) -> int:
    """AttributeProto type for a Python attribute value (empty lists default to INTS)."""
    for kind in (_A.INT, _A.FLOAT, _A.STRING, _A.TENSOR, _A.GRAPH):
        if _fits(kind, value):
            return kind
    if isinstance(value, (list, tuple)):
        for kind in (_A.INTS, _A.FLOATS, _A.STRINGS, _A.TENSORS, _A.GRAPHS):
            if _fits(kind, value):
                return kind
    raise TypeError(f"cannot encode attribute value of type {type(value).__name__}")


def make_attribute(
    name: str,
    value: Any,
    kind: int | None = None,
    cached_tensor: tuple[np.ndarray, TensorProto] | None = None,
    renames: dict[str, str] | None = None,
) -> AttributeProto:
    """AttributeProto ``name`` holding ``value``; ``kind`` (AttributeProto type) is kept if valid."""
    if isinstance(value, RawAttribute):
        return _raw_attribute(name, value.proto, renames or {})
    if kind is None or not _fits(kind, value):
        kind = infer_attribute_type(value)
    a = AttributeProto(name=name, type=kind)
    if kind == _A.INT:
        a.i = int(value)
    elif kind == _A.FLOAT:
        a.f = float(value)
    elif kind == _A.STRING:
        a.s = value.encode() if isinstance(value, str) else value
    elif kind == _A.INTS:
        a.ints.extend(int(x) for x in value)
    elif kind == _A.FLOATS:
        a.floats.extend(float(x) for x in value)
    elif kind == _A.STRINGS:
        a.strings.extend(x.encode() if isinstance(x, str) else x for x in value)
    elif kind == _A.TENSOR:
        a.t.CopyFrom(_tensor(value, cached_tensor))
    elif kind == _A.TENSORS:
        a.tensors.extend(_tensor(x, None) for x in value)
    elif kind == _A.GRAPH:
        a.g.CopyFrom(value)
    elif kind == _A.GRAPHS:
        a.graphs.extend(value)
    return a


def _tensor(value: Any, cached: tuple[np.ndarray, TensorProto] | None) -> TensorProto:
    if isinstance(value, TensorProto):
        return value
    if cached is not None and cached[0] is value:
        return cached[1]
    elem = cached[1].data_type if cached is not None else None
    name = cached[1].name if cached is not None else ""
    return array_to_tensor(value, name, elem)


def _raw_attribute(name: str, proto: Any, renames: dict[str, str]) -> AttributeProto:
    if isinstance(proto, AttributeProto):
        a = _copy(proto)
        a.name = name
    elif isinstance(proto, GraphProto):
        a = AttributeProto(name=name, type=_A.GRAPH)
        a.g.CopyFrom(proto)
    elif isinstance(proto, (list, tuple)) and all(isinstance(p, GraphProto) for p in proto):
        a = AttributeProto(name=name, type=_A.GRAPHS)
        a.graphs.extend(proto)
    else:
        raise TypeError(f"RawAttribute {name!r} holds {type(proto).__name__}, not an ONNX proto")
    if renames:
        if a.type == _A.GRAPH:
            _rename_free(a.g, renames)
        elif a.type == _A.GRAPHS:
            for sub in a.graphs:
                _rename_free(sub, renames)
    return a


def _rename_free(g: GraphProto, renames: dict[str, str]) -> None:
    """Rename references to outer names inside ``g`` (names defined in ``g`` shadow them)."""
    defined = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        defined.update(n.output)
    live = {k: v for k, v in renames.items() if k not in defined}
    if not live:
        return
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in live:
                n.input[i] = live[x]
        for a in n.attribute:
            if a.type == _A.GRAPH:
                _rename_free(a.g, live)
            elif a.type == _A.GRAPHS:
                for sub in a.graphs:
                    _rename_free(sub, live)
    for vi in g.output:
        if vi.name in live:
            vi.name = live[vi.name]


def _copy(proto: Any) -> Any:
    new = type(proto)()
    new.CopyFrom(proto)
    return new
