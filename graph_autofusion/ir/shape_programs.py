"""Shape programs: the small integer programs exporters write to compute a shape at run time
(``Shape -> Gather -> Unsqueeze -> Concat``, ``Slice(Shape(y))`` ...), evaluated symbolically.

:class:`ShapeEvaluator` follows the operators of :data:`SHAPE_OPS` over a value's symbolic dims
(a table of symbols, or the IR's value shapes) and constants, never a sample;
:func:`static_ints` gives a program's value when every entry is a known integer;
:func:`shape_program_nodes` and :func:`remove_dead_shape_nodes` find and remove the nodes of
programs nothing reads any more. Shape folding
(:mod:`graph_autofusion.patterns.shape_folding`) and the legacy normalisation
(:mod:`graph_autofusion.frontend.onnx_legacy`) both use them.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Graph, Node, Value, const_value

__all__ = [
    "SHAPE_OPS",
    "Entry",
    "ShapeEvaluator",
    "dead_shape_nodes",
    "remove_dead_shape_nodes",
    "shape_program_nodes",
    "static_ints",
]

#: Operators of the integer shape programs the evaluator follows.
SHAPE_OPS = frozenset(
    {"Shape", "Gather", "Slice", "Unsqueeze", "Squeeze", "Concat", "Cast", "Identity", "Constant"}
)
_INT_CASTS = {6, 7}  # TensorProto INT32, INT64

Entry = int | str | None  # a known int, a symbolic dim, or unknown


class ShapeEvaluator:
    """Symbolic values of 0-D / 1-D integer tensors: ``(entries, is_scalar)`` or ``None``."""

    def __init__(
        self,
        shapes: dict[str, tuple[Entry, ...]] | None = None,
        overridable: frozenset[str] = frozenset(),
    ) -> None:
        self.memo: dict[Value, tuple[list[Entry], bool] | None] = {}
        self.shapes = shapes or {}
        self.overridable = overridable  # initializers also listed as graph inputs
        self.visited: set[Node] = set()  # nodes of the programs evaluated

    def const(self, v: Value | None) -> np.ndarray | None:
        """``v``'s constant value, unless a feed may override it."""
        if v is None or v.name in self.overridable:
            return None
        c = const_value(v)
        if c is not None and c.dtype.kind in "iu" and c.ndim <= 1:
            n = v.producer
            while n is not None and n.op_type in ("Constant", "Identity"):  # as const_value
                self.visited.add(n)
                n = n.inputs[0].producer if n.inputs and n.inputs[0] is not None else None
            return c
        return None

    def shape(self, v: Value | None) -> tuple[Entry, ...] | None:
        """``v``'s symbolic shape from this evaluator's one source of symbols: the symbolic
        inference's table when it has one (symbols of the two sources never mix), else the
        IR's value shapes."""
        if v is None:
            return None
        if self.shapes:
            return self.shapes.get(v.name)
        return None if v.shape is None else tuple(v.shape)

    def __call__(self, v: Value | None, depth: int = 0) -> tuple[list[Entry], bool] | None:
        if v is None or depth > 32:
            return None
        if v not in self.memo:
            self.memo[v] = self._eval(v, depth)
            if self.memo[v] is not None and v.producer is not None:
                self.visited.add(v.producer)
        return self.memo[v]

    def _ints(self, v: Value | None) -> list[int] | None:
        c = self.const(v)
        return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]

    def _eval(self, v: Value, depth: int) -> tuple[list[Entry], bool] | None:
        c = self.const(v)
        if c is not None:
            return [int(x) for x in np.asarray(c).reshape(-1)], c.ndim == 0
        n = v.producer  # no evaluation for other constants: Constant has no input to follow
        if n is None or n.domain not in ("", "ai.onnx") or n.op_type not in SHAPE_OPS:
            return None
        if len(n.outputs) != 1 or n.outputs[0] is not v:
            return None
        op = n.op_type
        if op == "Shape":
            shape = self.shape(n.inputs[0])
            if shape is None:
                return None
            dims: list[Entry] = [d if isinstance(d, int | str) else None for d in shape]
            r = len(dims)
            start = int(n.attr("start", 0))
            end = n.attr("end", None)
            end = r if end is None else int(end)
            start = min(max(start + r if start < 0 else start, 0), r)
            end = min(max(end + r if end < 0 else end, 0), r)
            return dims[start:end], False
        first = self(n.inputs[0], depth + 1) if n.inputs else None
        if first is None:
            return None
        entries, scalar = first
        if op == "Identity":
            return first
        if op == "Cast":
            to = n.attr("to", 0)
            return first if isinstance(to, int) and to in _INT_CASTS else None
        if op == "Gather":
            if int(n.attr("axis", 0)) != 0 or scalar or len(n.inputs) < 2:
                return None
            idx = self.const(n.inputs[1])
            if idx is None:
                return None
            out = []
            for i in np.asarray(idx).reshape(-1):
                i = int(i) + (len(entries) if int(i) < 0 else 0)
                if not 0 <= i < len(entries):
                    return None
                out.append(entries[i])
            return out, idx.ndim == 0
        if op == "Unsqueeze":
            axes = self._ints(n.inputs[1]) if len(n.inputs) > 1 else n.attr("axes")
            if scalar and axes is not None and list(axes) in ([0], [-1]):
                return entries, False
            return None
        if op == "Squeeze":
            axes = self._ints(n.inputs[1]) if len(n.inputs) > 1 else n.attr("axes")
            if not scalar and len(entries) == 1 and (axes is None or list(axes) in ([0], [-1])):
                return entries, True
            return None
        if op == "Concat":
            if int(n.attr("axis", 0)) not in (0, -1):
                return None
            out = []
            for x in n.inputs:
                got = self(x, depth + 1)
                if got is None or got[1]:
                    return None
                out.extend(got[0])
            return out, False
        if op == "Slice":
            if scalar:
                return None
            if len(n.inputs) == 1:  # Slice-1 (opset < 10): the bounds are attributes
                starts, ends = n.attr("starts"), n.attr("ends")
                axes, steps = n.attr("axes", [0]), [1]
            elif len(n.inputs) >= 3:
                starts, ends = self._ints(n.inputs[1]), self._ints(n.inputs[2])
                axes = self._ints(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] else [0]
                steps = self._ints(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else [1]
            else:
                return None
            starts = None if starts is None else [int(x) for x in starts]
            ends = None if ends is None else [int(x) for x in ends]
            axes = None if axes is None else [int(x) for x in axes]
            if not (starts and ends and axes in ([0], [-1]) and steps == [1]):
                return None
            r = len(entries)
            s, e = starts[0], ends[0]
            s = min(max(s + r if s < 0 else s, 0), r)
            e = min(max(e + r if e < 0 else e, 0), r)
            return entries[s:e], False
        return None


def static_ints(
    value: Value, overridable: frozenset[str] = frozenset()
) -> tuple[list[int], bool] | None:
    """The value of a 0-D or 1-D integer tensor computed by a shape program (the operators of
    :data:`SHAPE_OPS`) when every entry is a known integer over the IR's static shapes:
    ``(entries, is_scalar)``, else ``None`` (a dynamic dim, an operator the evaluator does not
    follow). Initializers named in ``overridable`` (a feed may replace them) are not constants.
    """
    got = ShapeEvaluator(None, overridable)(value)
    if got is None or not all(isinstance(e, int) for e in got[0]):
        return None
    return [int(e) for e in got[0]], got[1]


def remove_dead_shape_nodes(graph: Graph, nodes: set[Node]) -> list[Node]:
    """Remove the nodes among ``nodes`` whose outputs nothing reads any more (transitively)
    and that are no graph output; returns them."""
    dead = dead_shape_nodes(graph, nodes)
    if dead:
        graph.remove_nodes(dead)
    return dead


def shape_program_nodes(value: Value) -> set[Node]:
    """The shape-program nodes (:data:`SHAPE_OPS`) ``value`` is computed from."""
    seen: set[Node] = set()
    todo = [value.producer] if value.producer is not None else []
    while todo:
        n = todo.pop()
        if n in seen or n.op_type not in SHAPE_OPS or n.domain not in ("", "ai.onnx"):
            continue
        seen.add(n)
        if n.op_type != "Shape":
            todo.extend(x.producer for x in n.inputs if x is not None and x.producer is not None)
    return seen


def dead_shape_nodes(graph: Graph, candidates: set[Node]) -> list[Node]:
    """Shape-program nodes among ``candidates`` that nothing reads any more (transitively)."""
    dead: list[Node] = []
    gone: set[Node] = set()
    changed = True
    while changed:
        changed = False
        for n in candidates - gone:
            if n.captures:
                continue
            if all(
                not graph.is_output(o) and all(u in gone for u in o.user_nodes) for o in n.outputs
            ):
                gone.add(n)
                dead.append(n)
                changed = True
    return dead
