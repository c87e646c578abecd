"""Control flow (If, Loop, Scan) and ONNX-proto-level execution of subgraphs and functions.

These operators carry subgraph bodies (``GraphProto`` inside a
:class:`~graph_autofusion.ir.core.RawAttribute`), so they have no plain reference function:
the reference interpreter runs them through :func:`call_op`, which executes the body's
``NodeProto`` list directly with the catalog's references. Local functions
(``FunctionProto``) are expanded the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from graph_autofusion.catalog.registry import (
    FusionKind,
    OpContext,
    OpSchema,
    get_schema,
    register,
)
from graph_autofusion.errors import UnsupportedOperatorError

CONTROL_FLOW_OPS = ("If", "Loop", "Scan")

for _name in CONTROL_FLOW_OPS:
    register(
        OpSchema(
            _name,
            "",
            FusionKind.OPAQUE,
            None,
            None,
            False,
            f"{_name} with subgraph bodies; run by graph_autofusion.runtime.interpreter",
        )
    )

Lookup = Callable[[str], Any]
FunctionTable = Mapping[tuple[str, str], Any]


class ExecScope:
    """What proto-level execution needs: opsets, local functions and the outer value scope."""

    def __init__(
        self,
        opsets: Mapping[str, int],
        functions: FunctionTable,
        outer: Lookup | None = None,
    ) -> None:
        self.opsets = dict(opsets)
        self.functions = functions
        self.outer = outer

    def child(self, env: Mapping[str, Any]) -> ExecScope:
        """Scope for a nested subgraph that can read ``env`` and everything outside it."""
        parent = self.outer

        def lookup(name: str) -> Any:
            if name in env:
                return env[name]
            if parent is not None:
                return parent(name)
            raise KeyError(name)

        return ExecScope(self.opsets, self.functions, lookup)


def attr_value(attr: Any, caller_attrs: Mapping[str, Any] | None = None) -> Any:
    """Python value of an ``AttributeProto`` (strings decoded, tensors as arrays)."""
    from onnx import AttributeProto, helper, numpy_helper

    if attr.ref_attr_name:
        return (caller_attrs or {}).get(attr.ref_attr_name)
    value = helper.get_attribute_value(attr)
    if attr.type == AttributeProto.STRING:
        return value.decode() if isinstance(value, bytes) else value
    if attr.type == AttributeProto.STRINGS:
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if attr.type == AttributeProto.TENSORS:
        return [numpy_helper.to_array(v) for v in value]
    return value


def call_op(
    op_type: str,
    domain: str,
    attrs: Mapping[str, Any],
    inputs: Sequence[Any],
    num_outputs: int,
    scope: ExecScope,
    *,
    node: Any = None,
    node_name: str = "",
) -> list[Any]:
    """Execute one operator on arrays: control flow, local function or catalog reference."""
    domain = "" if domain == "ai.onnx" else domain
    if domain == "" and op_type in CONTROL_FLOW_OPS:
        return _CONTROL[op_type](attrs, list(inputs), num_outputs, scope)
    fn = scope.functions.get((domain, op_type))
    if fn is not None:
        return run_function(fn, attrs, inputs, scope)
    schema = get_schema(op_type, domain)
    qual = f"{domain}::{op_type}" if domain else op_type
    if not schema.known:
        raise UnsupportedOperatorError(
            f"node {node_name!r}: operator {qual!r} is not in the operator catalog (and is not "
            f"a local function); the reference interpreter cannot execute it"
        )
    if schema.reference is None:
        raise UnsupportedOperatorError(
            f"node {node_name!r}: operator {qual!r} has no NumPy reference implementation"
        )
    ctx = OpContext(_plain_attrs(attrs), node, [None] * num_outputs, scope.opsets.get(domain))
    try:
        result = schema.reference(ctx, *inputs)
    except NotImplementedError as exc:
        raise UnsupportedOperatorError(f"node {node_name!r} ({qual}): {exc}") from exc
    if not isinstance(result, tuple | list):
        result = (result,)
    return [np.asarray(r) if isinstance(r, np.generic) else r for r in result]


def run_nodes(
    nodes: Sequence[Any], env: dict[str, Any], scope: ExecScope, caller_attrs: Mapping | None = None
) -> None:
    """Run ``NodeProto``s in order, reading from ``env`` then the outer scope, writing ``env``."""
    for n in nodes:
        ins = []
        for name in n.input:
            if not name:
                ins.append(None)
            elif name in env:
                ins.append(env[name])
            elif scope.outer is not None:
                ins.append(scope.outer(name))
            else:
                raise KeyError(f"value {name!r} read by node {n.name!r} is not defined")
        attrs = {a.name: attr_value(a, caller_attrs) for a in n.attribute}
        attrs = {k: v for k, v in attrs.items() if v is not None}
        inner = scope.child(env)
        outs = call_op(n.op_type, n.domain, attrs, ins, len(n.output), inner, node_name=n.name)
        for name, value in zip(n.output, outs):
            if name:
                env[name] = value


def run_graph_proto(graph: Any, feeds: Sequence[Any], scope: ExecScope) -> list[Any]:
    """Run a subgraph body: bind its inputs positionally, return its outputs in order."""
    from onnx import numpy_helper

    env: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for vi, value in zip(graph.input, feeds):
        env[vi.name] = value
    run_nodes(graph.node, env, scope)
    return [env[o.name] if o.name in env else scope.outer(o.name) for o in graph.output]


def run_function(
    fn: Any, attrs: Mapping[str, Any], inputs: Sequence[Any], scope: ExecScope
) -> list:
    """Expand a local ``FunctionProto``: bind inputs and attributes, run its body."""
    caller = {a.name: attr_value(a) for a in fn.attribute_proto}  # defaults
    caller.update(attrs)
    env = {name: v for name, v in zip(fn.input, inputs) if v is not None}
    opsets = dict(scope.opsets)
    opsets.update({o.domain: o.version for o in fn.opset_import})
    inner = ExecScope(opsets, scope.functions, None)
    run_nodes(fn.node, env, inner, caller)
    return [env[o] for o in fn.output]


def _if(attrs: Mapping[str, Any], inputs: list[Any], n: int, scope: ExecScope) -> list[Any]:
    cond = bool(np.asarray(inputs[0]).reshape(-1)[0])
    body = _graph_of(attrs["then_branch" if cond else "else_branch"])
    return run_graph_proto(body, [], scope)


def _loop(attrs: Mapping[str, Any], inputs: list[Any], n: int, scope: ExecScope) -> list[Any]:
    body = _graph_of(attrs["body"])
    m = None if inputs[0] is None else int(np.asarray(inputs[0]).reshape(-1)[0])
    cond = None if len(inputs) < 2 or inputs[1] is None else bool(np.asarray(inputs[1]))
    carried = list(inputs[2:])
    scans: list[list[Any]] = []
    i = 0
    while (m is None or i < m) and (cond is None or cond):
        res = run_graph_proto(
            body,
            [np.asarray(i, dtype=np.int64), np.asarray(True if cond is None else cond)] + carried,
            scope,
        )
        cond = bool(np.asarray(res[0]))
        carried = res[1 : 1 + len(carried)]
        for k, s in enumerate(res[1 + len(carried) :]):
            if len(scans) <= k:
                scans.append([])
            scans[k].append(s)
        i += 1
    n_scan = n - len(carried)
    stacked = [np.stack(s) if s else np.zeros((0,), np.float32) for s in scans]
    stacked += [np.zeros((0,), np.float32)] * (n_scan - len(stacked))
    return carried + stacked


def _scan(attrs: Mapping[str, Any], inputs: list[Any], n: int, scope: ExecScope) -> list[Any]:
    raise UnsupportedOperatorError("Scan is not supported by the reference interpreter")


def _graph_of(attr: Any) -> Any:
    """GraphProto of a subgraph attribute: a RawAttribute holding an AttributeProto or a
    GraphProto (IR), or a GraphProto (proto execution)."""
    p = getattr(attr, "proto", attr)
    if _is_attribute_proto(p):
        return p.g
    return p


def _is_attribute_proto(p: Any) -> bool:
    return hasattr(p, "ref_attr_name") and hasattr(p, "type")


def _plain_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes with IR RawAttribute(AttributeProto) values decoded to Python values."""
    out = dict(attrs)
    for k, v in attrs.items():
        p = getattr(v, "proto", None)
        if p is not None and _is_attribute_proto(p) and not p.ref_attr_name:
            out[k] = attr_value(p)
    return out


_CONTROL = {"If": _if, "Loop": _loop, "Scan": _scan}
