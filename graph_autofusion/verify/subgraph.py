"""Standalone onnxruntime runs for safe mode: sessions, activation capture, and
:func:`subgraph_model` (a node list of a model as its own ONNX model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.frontend.onnx_export import node_to_proto
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.frontend.onnx_types import make_value_info, tensor_for_value
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.runtime.ort_session import in_place_weights, model_weights, ort_session


class SafetyCheckError(GraphAutoFusionError, RuntimeError):
    """A check could not run (missing activation, a subgraph onnxruntime rejects)."""


# ----------------------------------------------------------------------------- ORT plumbing
def run_session(
    sess: Any,
    arrays: Mapping[str, np.ndarray],
    *,
    quiet: bool = False,
    outputs: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``sess`` on the arrays it takes (``outputs``: only these, default all). ``quiet``:
    a failure is expected to be possible (a probe with other sizes): onnxruntime does not log
    it, the caller reports it."""
    feeds = {}
    for i in sess.get_inputs():
        if i.name not in arrays:
            raise SafetyCheckError(f"no value for input %{i.name}")
        feeds[i.name] = arrays[i.name]
    names = list(outputs) if outputs is not None else [o.name for o in sess.get_outputs()]
    opts = None
    if quiet:
        import onnxruntime as ort

        opts = ort.RunOptions()
        opts.log_severity_level = 4
    return dict(zip(names, sess.run(names, feeds, opts)))


# ----------------------------------------------------------------------------- activations
def capture_activations(
    model: Model, feeds: Mapping[str, np.ndarray], *, threads: int = 2
) -> dict[str, np.ndarray]:
    """Run ``model`` once in onnxruntime (``ORT_DISABLE_ALL``) with every intermediate value of
    the main graph exposed as an output.

    Returns:
        Value name -> array for the feeds, every node output onnxruntime could expose, and the
        graph outputs. Intermediates are added untyped (onnxruntime infers their types), so
        values the IR has no type for are captured too.
    """
    return activation_runner(model, threads=threads)(feeds)


def activation_runner(model: Model, *, threads: int = 2) -> Callable[..., dict[str, np.ndarray]]:
    """:func:`capture_activations`' session, kept to run more than one set of inputs:
    ``run(feeds)`` returns what :func:`capture_activations` does for ``feeds``, and
    ``run(feeds, outputs=names)`` only those values (the feeds and the named outputs)."""
    arrays = model_weights(model)
    proto = to_onnx(model, without_data=set(arrays))
    # numpy has no bfloat16: such a value (a cast through bfloat16 inside a float32 graph)
    # cannot come back from the session, so it is not captured
    unheld = {v.name for v in model.graph.values() if v.dtype == DType.BFLOAT16}
    return _runner(proto, threads, arrays, unheld)


def capture_proto(
    proto: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    threads: int = 2,
    in_place: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """:func:`capture_activations` of a model proto (modified: every node output of its main
    graph becomes a graph output; ``in_place``: its initializers read from these arrays, whose
    data it then no longer holds)."""
    return _runner(proto, threads, in_place)(feeds)


def _runner(
    proto: onnx.ModelProto,
    threads: int,
    in_place: Mapping[str, np.ndarray] | None,
    unheld: set[str] | frozenset[str] = frozenset(),
) -> Callable[..., dict[str, np.ndarray]]:
    taken = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input} | unheld
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in taken:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                taken.add(name)
    sess = ort_session(proto, "disable", threads, lean=True, in_place=in_place)
    given = {i.name for i in sess.get_inputs()}

    def run(
        feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        out = {k: np.asarray(v) for k, v in feeds.items() if k in given}
        # a failure is the caller's one clear error
        out.update(run_session(sess, feeds, quiet=True, outputs=outputs))
        return out

    return run


# ----------------------------------------------------------------------------- subgraphs
def subgraph_model(
    model: Model,
    nodes: Sequence[Node],
    inputs: Sequence[str],
    outputs: Sequence[str],
    *,
    arrays: Mapping[str, np.ndarray] | None = None,
    in_place: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """A standalone model of just ``nodes``.

    ``in_place``: a dict that receives the large float32 constants (name -> array) a session
    of the model must read in place (``ort_session(proto, ..., in_place=that dict)``); the
    model declares them with their type and dims only, so no copy of a weight is serialized.

    Graph inputs are ``inputs`` (and any other non-constant value the nodes read), typed from
    ``arrays`` when given (exact) or from the IR; constants the nodes read become initializers;
    outputs are ``outputs`` (untyped: onnxruntime infers them). The local functions the nodes
    call (transitively) and the model's opsets come along.
    """
    graph = model.graph
    order = sorted(nodes, key=lambda n: graph.position(n) if n.graph is graph else 0)
    produced = {o.name for n in order for o in n.outputs}
    read: dict[str, Value] = {}
    for n in order:
        for v in n.all_inputs():
            if v.name not in produced:
                read.setdefault(v.name, v)
    g = onnx.GraphProto(name="subgraph")
    g.node.extend(node_to_proto(n, set(outputs)) for n in order)
    wanted = list(dict.fromkeys([*inputs, *read]))
    for name in wanted:
        v = read.get(name)
        if v is not None and v.const is not None:
            if in_place is not None and _by_reference(v):
                t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT)
                t.dims.extend(v.const.shape)
                g.initializer.append(t)
                # the original's and the fused model's constant of one name are the same
                # (clone_model shares the arrays, or copies them equal)
                in_place.setdefault(name, v.const)
            else:
                g.initializer.append(tensor_for_value(v))
            continue
        if arrays is not None and name in arrays:
            arr = np.asarray(arrays[name])
            elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
            g.input.append(helper.make_tensor_value_info(name, elem, list(arr.shape)))
        elif v is not None and v.dtype is not None:
            g.input.append(make_value_info(v))
        elif v is None:
            continue  # listed but neither read nor known: nothing to declare
        else:
            raise SafetyCheckError(f"input %{name} has no type (capture it to type it)")
    g.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    proto = helper.make_model(g, opset_imports=[])
    proto.ir_version = max(int(model.ir_version), 8)
    domains = dict(model.opset_imports)
    for fn in _called_functions(model, order):
        proto.functions.append(fn)
        domains.setdefault(fn.domain, 1)
        for op in fn.opset_import:
            domains.setdefault(op.domain, op.version)
    for n in order:
        domains.setdefault(n.domain, 1)
    for domain, version in sorted(domains.items()):
        proto.opset_import.append(helper.make_opsetid(domain, version))
    return proto


def _by_reference(v: Value) -> bool:
    """Whether a session can read constant ``v`` in place: a large float32 array of a float32
    value (the importer holds bfloat16 and float8 data as float32 arrays: those keep their
    own type's bytes in the model)."""
    a = v.const
    return (
        v.dtype == DType.FLOAT
        and isinstance(a, np.ndarray)
        and a.dtype == np.float32
        and bool(in_place_weights({v.name: a}))
    )


def _called_functions(model: Model, nodes: Sequence[Node]) -> list[Any]:
    table = {(f.domain, f.name): f for f in model.functions}
    if not table:
        return []
    todo = [(n.domain, n.op_type) for n in nodes]
    found: dict[tuple[str, str], Any] = {}
    while todo:
        key = todo.pop()
        if key in found or key not in table:
            continue
        found[key] = table[key]
        todo.extend((b.domain, b.op_type) for b in table[key].node)
    return list(found.values())


def flat_ops(model: Model, nodes: Sequence[Node]) -> list[tuple[str, str, dict[str, Any]]]:
    """(domain, op_type, attrs) of ``nodes`` and of every node inside the functions they call."""
    out = [(n.domain, n.op_type, dict(n.attrs)) for n in nodes]
    for fn in _called_functions(model, nodes):
        for b in fn.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in b.attribute}
            out.append((b.domain, b.op_type, attrs))
    return out
