"""ONNX -> graph IR import (F1): :func:`load_onnx`.

Everything the IR does not model is kept so :func:`to_onnx` can write it back: subgraph
attributes (If/Loop/Scan bodies) as :class:`RawAttribute` with the outer names they read (also
registered as node captures), local functions as FunctionProto, non-tensor types, sparse
initializers, node metadata. The import is O(graph size): no per-element Python loops.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto

from graph_autofusion.errors import CycleError, FrontendError, IRError
from graph_autofusion.frontend.onnx_checks import node_problem
from graph_autofusion.frontend.onnx_read import infer_types, read_model
from graph_autofusion.frontend.onnx_types import (
    apply_type,
    dtype_of,
    gc_paused,
    remember_value_info,
    sparse_to_dense,
    tensor_to_array,
)
from graph_autofusion.ir.core import Graph, Model, Node, RawAttribute, Shape, Value
from graph_autofusion.ir.node import OVERRIDABLE

_A = AttributeProto


def load_onnx(
    source: str | os.PathLike[str] | ModelProto,
    *,
    infer_shapes: bool = True,
    normalize: bool = False,
) -> Model:
    """Import an ONNX model (file path or ModelProto) into the graph IR.

    Args:
        source: Path to a ``.onnx`` file (external data is read relative to its folder) or an
            in-memory ``onnx.ModelProto`` (never modified).
        infer_shapes: Run ONNX shape inference (with data propagation where it works) to fill
            ``dtype``/``shape`` of intermediate values. Failure to infer never fails the import.
        normalize: Rewrite older exporters' spellings into what fresh exports write (data
            ``Constant`` nodes and constant ``ConstantOfShape`` as initializers, IR-3 input
            listings of initializers, two-input ``Sum`` as ``Add``; see
            :mod:`graph_autofusion.frontend.onnx_legacy`, whose report is kept in
            ``model.meta["legacy_normalization"]``). Off by default: the import is then exact,
            node for node; :func:`~graph_autofusion.frontend.loader.load_model` turns it on.

    Returns:
        The imported :class:`Model`; nodes are in a topological order.

    Raises:
        ModelLoadError: the file is missing, truncated, not ONNX, or its external data is missing.
        FrontendError: a node reads an undefined value or a value is defined twice.
        CycleError: the graph has a cycle (the message names nodes on it).
    """
    proto, label = read_model(source)
    model = import_model(proto, label=label, infer_shapes=infer_shapes)
    if normalize:
        from graph_autofusion.frontend.onnx_legacy import normalize_legacy

        normalize_legacy(model)
    return model


def import_model(proto: ModelProto, *, label: str = "<model>", infer_shapes: bool = True) -> Model:
    """Convert a loaded ModelProto (external data already inline) into a :class:`Model`."""
    with gc_paused():
        return _import_model(proto, label, infer_shapes)


def _import_model(proto: ModelProto, label: str, infer_shapes: bool) -> Model:
    g = proto.graph
    graph = Graph(g.name or "main")
    graph.doc = g.doc_string
    model = Model(graph)
    model.opset_imports = {op.domain: int(op.version) for op in proto.opset_import}
    model.meta["onnx_opset_import"] = (
        [_copy(op) for op in proto.opset_import],
        model.opset_imports.copy(),
    )
    model.ir_version = int(proto.ir_version)
    model.producer_name = proto.producer_name
    model.producer_version = proto.producer_version
    model.domain = proto.domain
    model.model_version = int(proto.model_version)
    model.doc = proto.doc_string
    model.meta["onnx_source"] = label  # the file, for messages of later stages
    model.metadata_props = {p.key: p.value for p in proto.metadata_props}
    model.functions = [_copy(f) for f in proto.functions]
    for field in ("training_info", "configuration"):
        if len(getattr(proto, field)):
            model.meta[f"onnx_{field}"] = [_copy(x) for x in getattr(proto, field)]
    for field in ("quantization_annotation", "metadata_props"):
        if len(getattr(g, field)):
            graph.meta[f"onnx_{field}"] = [_copy(x) for x in getattr(g, field)]

    values = _import_values(g, graph, label)
    if model.ir_version >= 4:  # before, listing was how an initializer was declared
        for name in graph.meta.get("onnx_initializer_inputs", {}):
            values[name].meta[OVERRIDABLE] = True  # a feed may replace it: no constant
    nodes = _import_nodes(g, graph, values, label, model.opset_imports)
    typed: list[tuple[Value, onnx.ValueInfoProto, bool]] = []
    for vi in g.value_info:
        v = values.get(vi.name)
        if v is None:
            v = graph.value_info.setdefault(vi.name, Value(vi.name))
        v.meta["onnx_in_value_info"] = True
        if v.const is None:
            apply_type(v, vi.type)
            v.doc = v.doc or vi.doc_string
            typed.append((v, vi, False))
        else:
            remember_value_info(v, _copy(vi))
    if len(g.value_info):
        graph.meta["onnx_value_info_order"] = [vi.name for vi in g.value_info]
    outputs = []
    for vi in g.output:
        v = values.get(vi.name)
        if v is None:
            raise FrontendError(f"{label}: graph output {vi.name!r} is not defined by the graph")
        if v.const is None and v.producer is not None:
            apply_type(v, vi.type)
            v.doc = v.doc or vi.doc_string
            typed.append((v, vi, True))
        outputs.append(v)
    graph.set_outputs(outputs)

    if infer_shapes:
        inferred, status = infer_types(proto, label)
        model.meta["onnx_shape_inference"] = status
        described = {id(v) for v, _, _ in typed}
        for name, tp in inferred.items():
            v = values.get(name)
            if v is not None and v.const is None and v.producer is not None:
                _merge_type(v, tp)
                if id(v) not in described:
                    v.meta["onnx_inferred"] = True
    # Export reuses the source's ValueInfoProto while the type stays as imported: intermediates
    # exactly as given (more shape info changes onnxruntime's fusions, hence its numbers), graph
    # outputs only if inference added nothing (the checker wants their shapes).
    for v, vi, is_output in typed:
        probe = Value(vi.name)
        apply_type(probe, vi.type)
        if not is_output or _same_type(probe, v):
            remember_value_info(v, _copy(vi))
    _sort(graph, nodes, label)
    return model


def _import_values(g: GraphProto, graph: Graph, label: str) -> dict[str, Value]:
    values: dict[str, Value] = {}
    try:
        for t in g.initializer:
            arr, upcast = tensor_to_array(t)
            v = graph.add_initializer(t.name, arr)
            v.doc = t.doc_string
            _set_tensor_type(v, t.data_type)
            if upcast or len(t.metadata_props):
                v.meta["onnx_tensor"] = _copy(t)
                v.meta["onnx_tensor_const"] = v.const
            values[t.name] = v
        sparse = []
        for sp in g.sparse_initializer:
            name = sp.values.name
            v = graph.add_initializer(name, sparse_to_dense(sp))
            _set_tensor_type(v, sp.values.data_type)
            v.meta["onnx_sparse"] = _copy(sp)
            v.meta["onnx_tensor_const"] = v.const
            values[name] = v
            sparse.append(name)
        if sparse:
            graph.meta["onnx_sparse_initializers"] = sparse
        listed_inits: dict[str, onnx.ValueInfoProto] = {}
        listed: set[str] = set()
        for vi in g.input:
            if vi.name in listed:
                raise FrontendError(f"{label}: graph input {vi.name!r} is listed twice")
            listed.add(vi.name)
            if vi.name in values:
                listed_inits[vi.name] = _copy(vi)
                continue
            v = Value(vi.name)
            apply_type(v, vi.type)
            v.doc = vi.doc_string
            remember_value_info(v, _copy(vi))
            graph.add_input(v)
            values[vi.name] = v
        if listed_inits:
            graph.meta["onnx_initializer_inputs"] = listed_inits
            graph.meta["onnx_input_order"] = [vi.name for vi in g.input]
    except IRError as exc:
        raise FrontendError(f"{label}: {exc}") from exc
    return values


def _set_tensor_type(v: Value, elem_type: int) -> None:
    v.dtype = dtype_of(elem_type)
    if v.dtype is None:
        v.meta["onnx_elem_type"] = int(elem_type)


def _import_nodes(
    g: GraphProto, graph: Graph, values: dict[str, Value], label: str, opsets: dict[str, int]
) -> list[Node]:
    used_node_names = {n.name for n in g.node if n.name}
    used_values = set(values) | {o for n in g.node for o in n.output if o}
    counters: dict[str, int] = {}
    claimed: set[str] = set()
    nodes: list[Node] = []
    captures: list[list[str]] = []
    for npr in g.node:
        outs = []
        for o in npr.output:
            if o:
                outs.append(Value(o))
            else:
                v = Value(_fresh(f"{npr.op_type}_omitted", used_values, counters))
                v.meta["onnx_omitted"] = True
                outs.append(v)
        attrs, types, meta, caps = _import_attrs(npr, label)
        name = npr.name
        if not name or name in claimed:
            name = _fresh(npr.name or npr.op_type, used_node_names, counters)
            if not npr.name:  # exported unnamed again; a repeated name stays unique
                meta["onnx_name"] = npr.name
                meta["onnx_generated_name"] = name
        node = Node(npr.op_type, (), attrs, domain=npr.domain, name=name, outputs=outs)
        node.attr_types = types
        node.meta.update(meta)
        node.doc = npr.doc_string
        node.overload = npr.overload
        claimed.add(name)
        try:
            graph.add_node(node)
        except IRError as exc:
            who = repr(npr.name) if npr.name else f"#{len(nodes)} (unnamed)"
            raise FrontendError(f"{label}: node {who} ({npr.op_type}): {exc}") from exc
        for o, v in zip(npr.output, outs):
            if o:
                values[o] = v
        nodes.append(node)
        captures.append(caps)
    for node, npr, caps in zip(nodes, g.node, captures):
        ins: list[Value | None] = []
        for name in npr.input:
            if not name:
                ins.append(None)
                continue
            v = values.get(name)
            if v is None:
                raise FrontendError(
                    f"{label}: node {node.name!r} ({npr.op_type}) reads undefined value {name!r}"
                )
            ins.append(v)
        node.set_inputs(ins)
        if caps:
            missing = [c for c in caps if c not in values]
            if missing:
                raise FrontendError(
                    f"{label}: node {node.name!r} ({npr.op_type}) has a subgraph reading "
                    f"undefined value {missing[0]!r}"
                )
            node.set_captures([values[c] for c in caps])
            node.meta["onnx_capture_names"] = list(caps)
    for i, node in enumerate(nodes):  # damaged fields (not UTF-8, wrong attribute types)
        problem = node_problem(node, opsets)
        if problem:
            name = node.meta.get("onnx_name", node.name)
            who = repr(name) if type(name) is str and name else f"#{i}"
            raise FrontendError(f"{label}: node {who} ({node.op_type!r}): {problem}")
    return nodes


def _fresh(base: str, used: set[str], counters: dict[str, int]) -> str:
    k = counters.get(base, 0)
    while True:
        k += 1
        name = f"{base}_{k}"
        if name not in used:
            counters[base] = k
            used.add(name)
            return name


def _import_attrs(
    npr: NodeProto, label: str
) -> tuple[dict[str, Any], dict[str, int], dict[str, Any], list[str]]:
    attrs: dict[str, Any] = {}
    types: dict[str, int] = {}
    meta: dict[str, Any] = {}
    caps: dict[str, None] = {}
    for a in npr.attribute:
        types[a.name] = a.type
        if a.doc_string:
            meta.setdefault("onnx_attr_docs", {})[a.name] = a.doc_string
        attrs[a.name] = _attr_value(a, meta, caps)
    if len(npr.metadata_props):
        meta["onnx_metadata_props"] = [(p.key, p.value) for p in npr.metadata_props]
    if len(npr.device_configurations):
        meta["onnx_device_configurations"] = [_copy(d) for d in npr.device_configurations]
    return attrs, types, meta, list(caps)


def _attr_value(a: AttributeProto, meta: dict[str, Any], caps: dict[str, None]) -> Any:
    t = a.type
    if a.ref_attr_name:
        return RawAttribute(_copy(a))
    if t == _A.INT:
        return int(a.i)
    if t == _A.FLOAT:
        return float(a.f)
    if t == _A.INTS:
        return [int(x) for x in a.ints]
    if t == _A.FLOATS:
        return [float(x) for x in a.floats]
    try:
        if t == _A.STRING:
            return a.s.decode("utf-8")
        if t == _A.STRINGS:
            return [s.decode("utf-8") for s in a.strings]
    except UnicodeDecodeError:
        return RawAttribute(_copy(a))
    if t == _A.TENSOR:
        arr, upcast = tensor_to_array(a.t)
        if upcast or a.t.name or a.t.doc_string:
            meta.setdefault("onnx_attr_tensors", {})[a.name] = (arr, _copy(a.t))
        return arr
    if t in (_A.GRAPH, _A.GRAPHS):
        free: dict[str, None] = {}
        for sub in [a.g] if t == _A.GRAPH else list(a.graphs):
            free.update(dict.fromkeys(subgraph_free_names(sub)))
        caps.update(free)
        return RawAttribute(_copy(a), captures=list(free))
    return RawAttribute(_copy(a))


def subgraph_free_names(g: GraphProto) -> list[str]:
    """Outer-scope names read by ``g`` (recursively through nested bodies), in first-use order."""
    defined = {vi.name for vi in g.input}
    defined.update(t.name for t in g.initializer)
    defined.update(sp.values.name for sp in g.sparse_initializer)
    for n in g.node:
        defined.update(n.output)
    used: dict[str, None] = {}
    for n in g.node:
        for name in n.input:
            if name and name not in defined:
                used[name] = None
        for a in n.attribute:
            if a.type == _A.GRAPH:
                subs: Iterable[GraphProto] = [a.g]
            elif a.type == _A.GRAPHS:
                subs = a.graphs
            else:
                continue
            for sub in subs:
                for name in subgraph_free_names(sub):
                    if name not in defined:
                        used[name] = None
    for vi in g.output:
        if vi.name not in defined:
            used[vi.name] = None
    return list(used)


def _same_type(a: Value, b: Value) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.meta.get("onnx_elem_type") == b.meta.get("onnx_elem_type")
        and ("onnx_type" in a.meta) == ("onnx_type" in b.meta)
    )


def _merge_type(v: Value, tp: onnx.TypeProto) -> None:
    probe = Value(v.name)
    apply_type(probe, tp)
    if v.dtype is None and "onnx_elem_type" not in v.meta:
        v.dtype = probe.dtype
        if "onnx_elem_type" in probe.meta:
            v.meta["onnx_elem_type"] = probe.meta["onnx_elem_type"]
    if "onnx_type" in probe.meta and "onnx_type" not in v.meta and v.dtype is None:
        v.meta["onnx_type"] = _copy(probe.meta["onnx_type"])
    v.shape = _merge_shape(v.shape, probe.shape)


def _merge_shape(old: Shape | None, new: Shape | None) -> Shape | None:
    if old is None:
        return new
    if new is None or len(new) != len(old):
        return old
    rank = {int: 2, str: 1}
    return tuple(n if rank.get(type(n), 0) > rank.get(type(o), 0) else o for o, n in zip(old, new))


def _sort(graph: Graph, nodes: list[Node], label: str) -> None:
    seen: set[Node] = set()
    ordered = True
    for n in nodes:
        for v in n.all_inputs():
            if v.producer is not None and v.producer not in seen:
                ordered = False
                break
        if not ordered:
            break
        seen.add(n)
    if ordered:
        return
    try:
        graph.topological_sort()
    except CycleError:
        raise CycleError(f"{label}: graph has a cycle: {' -> '.join(_find_cycle(nodes))}") from None


def _find_cycle(nodes: list[Node]) -> list[str]:
    """Names of nodes forming one cycle (walks predecessors among nodes not on any DAG prefix)."""
    indeg = {n: len(n.predecessors()) for n in nodes}
    ready = [n for n in nodes if indeg[n] == 0]
    while ready:
        n = ready.pop()
        for s in n.successors():
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    stuck = {n for n, d in indeg.items() if d > 0}
    start = next(n for n in nodes if n in stuck)
    path: list[Node] = []
    pos: dict[Node, int] = {}
    n = start
    while n not in pos:
        pos[n] = len(path)
        path.append(n)
        n = next(p for p in n.predecessors() if p in stuck)
    cycle = path[pos[n] :][::-1]
    return [c.name for c in cycle + [cycle[0]]]


def _copy(proto: Any) -> Any:
    new = type(proto)()
    new.CopyFrom(proto)
    return new
