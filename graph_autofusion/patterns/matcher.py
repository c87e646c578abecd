"""Match patterns against the IR, with reasons for every failure.

:func:`match_at` tries one pattern rooted at one node and returns a :class:`Match` or the
:class:`Rejection` that got furthest; :func:`find_matches` scans a graph. The matcher
backtracks over alternatives, optional operators and commuted operands, so a pattern is written
once. After a structural match it checks that internal values have no readers outside the match
(unless exported) and that the matched set is convex.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion import reasons
from graph_autofusion.catalog.registry import schema_of
from graph_autofusion.ir.core import (  # noqa: F401 (const_value: re-exported)
    Graph,
    Node,
    Value,
    const_value,
    is_convex,
    topological_order,
)
from graph_autofusion.patterns.pattern import (
    ANY,
    ATTR_DEFAULTS,
    AltPattern,
    MatchContext,
    OpPattern,
    OptionalPattern,
    Pattern,
    VarPattern,
)


class Reason:
    """Reason codes for a failed match (documented in docs/reasons.md)."""

    OP_MISMATCH = reasons.OP_MISMATCH
    NO_PRODUCER = reasons.NO_PRODUCER
    OUTPUT_INDEX = reasons.OUTPUT_INDEX
    ARITY = reasons.ARITY
    ATTR_MISMATCH = reasons.ATTR_MISMATCH
    DTYPE = reasons.DTYPE
    RANK = reasons.RANK
    DYNAMIC_SHAPE = reasons.DYNAMIC_SHAPE
    NOT_CONST = reasons.NOT_CONSTANT
    VALUE_MISMATCH = reasons.VALUE_MISMATCH
    BINDING_CONFLICT = reasons.BINDING_CONFLICT
    CHECK_FAILED = reasons.CHECK_FAILED
    EXTERNAL_USER = reasons.EXTERNAL_USER
    NOT_CONVEX = reasons.NOT_CONVEX
    HORIZONTAL = reasons.TOO_FEW_SIBLINGS


@dataclass(frozen=True)
class Rejection:
    """Why a match failed, after how many matched nodes (``depth``)."""

    code: str
    message: str
    depth: int = 0
    node: str = ""


@dataclass
class Match:
    """A successful match: the root, every matched node, variable bindings, labelled nodes."""

    root: Node
    nodes: list[Node]
    values: dict[str, Value]
    labels: dict[str, Node]
    outputs: list[Value] = field(default_factory=list)

    def value(self, name: str) -> Value:
        return self.values[name]

    def inputs(self) -> list[Value]:
        """Values read by the match from outside it, in first-use order."""
        inside = {id(o) for n in self.nodes for o in n.outputs}
        seen: dict[int, Value] = {}
        for n in self.nodes:
            for v in n.all_inputs():
                if id(v) not in inside:
                    seen.setdefault(id(v), v)
        return list(seen.values())


@dataclass
class _State:
    values: dict[str, Value] = field(default_factory=dict)
    by_pattern: dict[int, Node] = field(default_factory=dict)
    labels: dict[str, Node] = field(default_factory=dict)
    order: list[Node] = field(default_factory=list)

    def copy(self) -> _State:
        return _State(dict(self.values), dict(self.by_pattern), dict(self.labels), list(self.order))


class _Tracer:
    def __init__(self) -> None:
        self.best: Rejection | None = None

    #: Failures found after the structure matched: at equal depth they explain more.
    LATE = ("external-user", "not-convex", "check-failed")

    def fail(self, state: _State, code: str, message: str, node: Node | None = None) -> None:
        depth = len(state.order)
        best = self.best
        if (
            best is None
            or depth > best.depth
            or (depth == best.depth and code in self.LATE and best.code not in self.LATE)
        ):
            self.best = Rejection(code, message, depth, node.name if node else "")


def _attr_ok(node: Node, key: str, spec: Any) -> bool:
    if spec is ANY:
        return True
    actual = node.attrs.get(key, ATTR_DEFAULTS.get((node.op_type, key)))
    if callable(spec):
        return bool(spec(actual))
    if isinstance(spec, float) and isinstance(actual, int | float):
        return math.isclose(actual, spec, rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(spec, list | tuple) and isinstance(actual, list | tuple | np.ndarray):
        return list(actual) == list(spec)
    return actual == spec


def _match_var(pat: VarPattern, value: Value, st: _State, tr: _Tracer) -> Iterator[_State]:
    bound = st.values.get(pat.name)
    if bound is not None:
        if bound is value:
            yield st
        else:
            tr.fail(
                st,
                Reason.BINDING_CONFLICT,
                f"%{pat.name} would bind both %{bound.name} and %{value.name}",
            )
        return
    if pat.dtypes and value.dtype not in pat.dtypes:
        tr.fail(
            st,
            Reason.DTYPE,
            f"%{value.name} has dtype "
            f"{value.dtype.short if value.dtype else '?'}, want one of "
            f"{[d.short for d in pat.dtypes]}",
        )
        return
    if pat.rank is not None and value.rank != pat.rank:
        tr.fail(st, Reason.RANK, f"%{value.name} has rank {value.rank}, want {pat.rank}")
        return
    if pat.last_dim is not None and (not value.shape or value.shape[-1] != pat.last_dim):
        last = value.shape[-1] if value.shape else "?"
        tr.fail(st, Reason.RANK, f"%{value.name} has last dim {last}, want {pat.last_dim}")
        return
    if pat.static and not value.is_static:
        tr.fail(st, Reason.DYNAMIC_SHAPE, f"%{value.name} has no static shape")
        return
    if pat.const or pat.scalar or pat.value is not None:
        data = const_value(value)
        if data is None:
            tr.fail(st, Reason.NOT_CONST, f"%{value.name} is not a constant")
            return
        if pat.scalar and data.size != 1:
            tr.fail(st, Reason.VALUE_MISMATCH, f"%{value.name} has {data.size} elements, want 1")
            return
        if pat.value is not None:
            want = pat.value(value) if callable(pat.value) else pat.value
            if want is None or not np.allclose(
                data.astype(np.float64), want, rtol=pat.rtol, atol=pat.atol
            ):
                tr.fail(
                    st,
                    Reason.VALUE_MISMATCH,
                    f"%{value.name} = {np.asarray(data).reshape(-1)[:4]} is not {want}",
                )
                return
    if pat.check is not None:
        why = pat.check(value)
        if why:
            tr.fail(st, Reason.CHECK_FAILED, why)
            return
    nst = st.copy()
    nst.values[pat.name] = value
    yield nst


def _match_inputs(
    pats: tuple[Pattern | None, ...], vals: list[Value | None], st: _State, tr: _Tracer
) -> Iterator[_State]:
    if not pats:
        yield st
        return
    head, value = pats[0], vals[0]
    if head is None:
        yield from _match_inputs(pats[1:], vals[1:], st, tr)
        return
    if value is None:
        tr.fail(st, Reason.ARITY, "an input the pattern needs is omitted")
        return
    for s in _match_value(head, value, st, tr):
        yield from _match_inputs(pats[1:], vals[1:], s, tr)


def _match_node(pat: OpPattern, node: Node, st: _State, tr: _Tracer) -> Iterator[_State]:
    prior = st.by_pattern.get(id(pat))
    if prior is not None:
        if prior is node:
            yield st
        else:
            tr.fail(
                st,
                Reason.BINDING_CONFLICT,
                f"one pattern operator matched both {prior.name!r} and {node.name!r}",
                node,
            )
        return
    if node.op_type not in pat.op_types or node.domain not in (
        pat.domain,
        "ai.onnx" if not pat.domain else pat.domain,
    ):
        tr.fail(
            st,
            Reason.OP_MISMATCH,
            f"node {node.name!r} is {node.qualified_op}, want {'|'.join(pat.op_types)}",
            node,
        )
        return
    if node in st.order:
        tr.fail(st, Reason.BINDING_CONFLICT, f"node {node.name!r} matched twice", node)
        return
    for key, spec in pat.attrs.items():
        if not _attr_ok(node, key, spec):
            tr.fail(
                st,
                Reason.ATTR_MISMATCH,
                f"node {node.name!r}: attribute {key}="
                f"{node.attrs.get(key, ATTR_DEFAULTS.get((node.op_type, key)))!r} fails "
                f"{spec!r}",
                node,
            )
            return
    ins = list(node.inputs)
    while ins and ins[-1] is None:
        ins.pop()
    n = len(pat.inputs)
    if (pat.exact_inputs and len(ins) != n) or len(ins) < n:
        tr.fail(st, Reason.ARITY, f"node {node.name!r} has {len(ins)} inputs, pattern {n}", node)
        return
    nst = st.copy()
    nst.by_pattern[id(pat)] = node
    nst.order.append(node)
    if pat.label:
        nst.labels[pat.label] = node
    orders = [ins[:n]]
    if n == 2 and schema_of(node).commutative:
        orders.append([ins[1], ins[0]])
    for vals in orders:
        yield from _match_inputs(pat.inputs, vals, nst, tr)


def _match_value(pat: Pattern, value: Value, st: _State, tr: _Tracer) -> Iterator[_State]:
    if isinstance(pat, VarPattern):
        yield from _match_var(pat, value, st, tr)
    elif isinstance(pat, OpPattern):
        node = value.producer
        if node is not None and value.index != pat.output_index:
            tr.fail(
                st,
                Reason.OUTPUT_INDEX,
                f"%{value.name} is output {value.index} of "
                f"{node.name!r}, the pattern reads output {pat.output_index}",
                node,
            )
            return
        if node is None:
            tr.fail(
                st,
                Reason.NO_PRODUCER,
                f"%{value.name} is not computed by "
                f"{'|'.join(pat.op_types)} (it is a graph input or initializer)",
            )
            return
        yield from _match_node(pat, node, st, tr)
    elif isinstance(pat, OptionalPattern):
        yield from _match_value(pat.op, value, st, tr)
        yield from _match_value(pat.inner, value, st, tr)
    elif isinstance(pat, AltPattern):
        for option in pat.options:
            yield from _match_value(option, value, st, tr)
    else:  # pragma: no cover - closed set of pattern classes
        raise TypeError(f"not a pattern: {pat!r}")


def _closure_ok(st: _State, graph: Graph | None, exported: set[str], tr: _Tracer) -> bool:
    members = set(st.order)
    root = st.order[0]
    for node in st.order[1:]:
        label = next((k for k, v in st.labels.items() if v is node), "")
        if label in exported:
            continue
        for out in node.outputs:
            outside = [u.name for u in out.user_nodes if u not in members]
            if outside or (graph is not None and graph.is_output(out)):
                tr.fail(
                    st,
                    Reason.EXTERNAL_USER,
                    f"%{out.name} (inside the match) is also read "
                    f"by {outside or ['the graph output']}",
                    node,
                )
                return False
    if not is_convex(members):
        tr.fail(
            st,
            Reason.NOT_CONVEX,
            f"fusing the match rooted at {root.name!r} would create a cycle",
            root,
        )
        return False
    return True


def _root_options(pattern: Pattern) -> tuple[OpPattern, ...]:
    if isinstance(pattern, OpPattern):
        return (pattern,)
    if isinstance(pattern, AltPattern):
        return tuple(r for o in pattern.options for r in _root_options(o))
    if isinstance(pattern, OptionalPattern):
        return _root_options(pattern.op) + _root_options(pattern.inner)
    return ()


def match_outputs(nodes: list[Node], root: Node, labels: dict[str, Node], exported) -> list[Value]:
    """Values a fused operator replacing ``nodes`` must produce: the root's outputs, then the
    outputs of exported (labelled) internal nodes."""
    outs = list(root.outputs)
    for label in exported:
        node = labels.get(label)
        if node is not None and node is not root:
            outs.extend(o for o in node.outputs if o not in outs)
    return outs


def match_at(
    pattern: Pattern,
    node: Node,
    *,
    checks: tuple = (),
    exported: tuple[str, ...] = (),
) -> Match | Rejection:
    """Match ``pattern`` with its root at ``node``.

    Args:
        pattern: Root operator pattern.
        node: Candidate root node.
        checks: Callables ``(MatchContext) -> str | None``; a string rejects with that reason.
        exported: Labels of internal nodes whose outputs the fused operator also exports (they
            may have readers outside the match).

    Returns:
        The first full match, or the rejection that got furthest.
    """
    tr = _Tracer()
    graph = node.graph
    states = (st for root in _root_options(pattern) for st in _match_node(root, node, _State(), tr))
    for st in states:
        if not _closure_ok(st, graph, set(exported), tr):
            continue
        ctx = MatchContext(st.values, st.labels)
        why = next((w for c in checks if (w := c(ctx))), None)
        if why:
            tr.fail(st, Reason.CHECK_FAILED, why, node)
            continue
        outs = match_outputs(st.order, node, st.labels, exported)
        return Match(node, topological_order(st.order), st.values, st.labels, outs)
    return tr.best or Rejection(Reason.OP_MISMATCH, "no match", 0, node.name)


def root_op_types(pattern: Pattern) -> set[str]:
    """Operator types a pattern's root can have."""
    return {t for r in _root_options(pattern) for t in r.op_types}


def index_by_op(graph: Graph) -> dict[str, list[Node]]:
    """Nodes of ``graph`` grouped by operator type, in graph order."""
    index: dict[str, list[Node]] = {}
    for node in graph.nodes:
        index.setdefault(node.op_type, []).append(node)
    return index


def find_matches(
    graph: Graph,
    pattern: Pattern,
    *,
    checks: tuple = (),
    exported: tuple[str, ...] = (),
    index: dict[str, list[Node]] | None = None,
) -> tuple[list[Match], list[Rejection]]:
    """Every match of ``pattern`` in ``graph`` (possibly overlapping), and the rejections.

    Only nodes of the root's operator types are tried (``index`` from :func:`index_by_op`
    can be shared across patterns), so the scan is linear in the graph.
    """
    index = index if index is not None else index_by_op(graph)
    roots = root_op_types(pattern)
    candidates = [n for t in roots for n in index.get(t, ())]
    if len(roots) > 1:
        candidates.sort(key=graph.position)
    matches: list[Match] = []
    rejections: list[Rejection] = []
    for node in candidates:
        result = match_at(pattern, node, checks=checks, exported=exported)
        (matches if isinstance(result, Match) else rejections).append(result)
    return matches, rejections
