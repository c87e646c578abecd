"""Rotary position embedding (RoPE, half-split form) applied to one tensor (q or k):

    y = x * cos + rotate_half(x) * sin
    rotate_half(x) = concat(-x[..., h:], x[..., :h], axis=-1)      (h = x.shape[-1] / 2)

Exporters spell the halves as two ``Slice(x, starts, ends, axes, steps)`` nodes on the last
axis (constant bounds, or in TorchScript a bound computed at run time as
``Unsqueeze(Cast(Div(Gather(Shape(x), last), 2)))``), or as one ``Split`` of the last axis in
two equal halves. ``cos`` and ``sin`` (gathered and unsqueezed from cache tables, or constants)
are bound as variables; the rule is applied separately to q and to k. The native
``com.microsoft.RotaryEmbedding`` takes position ids and half-width cache tables instead of the
gathered full-width ``cos``/``sin``, so the rule keeps the generic form.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Node, Value
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule

_INT64_MAX = np.iinfo(np.int64).max


def _last_axis(axis, rank: int | None) -> bool:
    return axis == -1 or (rank is not None and axis == rank - 1)


def _scalar(value: Value | None) -> int | None:
    """The one integer a constant holds, else ``None``."""
    data = None if value is None else const_value(value)
    if data is None or data.size != 1:
        return None
    return int(np.asarray(data).reshape(-1)[0])


def _is_runtime_half(value: Value | None, x: Value) -> bool:
    """``value`` is ``Div(Gather(Shape(x), last axis), 2)``, maybe through Cast/Unsqueeze/
    Reshape/Squeeze (how TorchScript computes ``x.shape[-1] // 2``)."""
    for _ in range(8):
        node = value.producer if value is not None else None
        if node is None or node.op_type not in ("Cast", "Unsqueeze", "Reshape", "Squeeze"):
            break
        value = node.inputs[0]
    node = value.producer if value is not None else None
    if node is None or node.op_type not in ("Div", "FloorDiv") or _scalar(node.inputs[1]) != 2:
        return False
    gather = node.inputs[0].producer
    if gather is None or gather.op_type != "Gather" or gather.attrs.get("axis", 0) != 0:
        return False
    shape = gather.inputs[0].producer
    if shape is None or shape.op_type != "Shape" or shape.inputs[0] is not x:
        return False
    if shape.attrs.get("start", 0) != 0 or "end" in shape.attrs:
        return False
    return _last_axis(_scalar(gather.inputs[1]), x.rank)


def _bound_is(value: Value | None, want: int, x: Value, *, at_least: bool = False) -> bool:
    got = _scalar(value)
    if got is None:
        return _is_runtime_half(value, x) and want * 2 == x.shape[-1]
    if got < 0:  # counted from the end
        got = max(got + x.shape[-1], 0)
    return got >= want if at_least else got == want


def _slice_problem(node: Node, x: Value, half: int, upper: bool) -> str | None:
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    _, starts, ends, axes, steps = ins[:5]
    axis = _scalar(axes) if axes is not None else (0 if x.rank == 1 else None)
    if axis is None or not _last_axis(axis, x.rank):
        return f"Slice {node.name!r} does not slice the last axis of %{x.name}"
    if steps is not None and _scalar(steps) != 1:
        return f"Slice {node.name!r} has a step other than 1"
    if upper:
        ok = _bound_is(starts, half, x) and _bound_is(ends, 2 * half, x, at_least=True)
    else:
        ok = _bound_is(starts, 0, x) and _bound_is(ends, half, x)
    if not ok:
        which = "upper" if upper else "lower"
        return f"Slice {node.name!r} is not the {which} half of the last axis of %{x.name}"
    return None


def halves_check(ctx: MatchContext) -> str | None:
    """The two slices (or the Split) cut the last axis of ``x`` into equal halves, and the
    Concat joins them on the last axis."""
    x = ctx.values["x"]
    if not x.shape or not isinstance(x.shape[-1], int) or x.shape[-1] % 2:
        return f"%{x.name} needs a static, even last dimension"
    half = x.shape[-1] // 2
    concat = ctx.nodes["concat"]
    if not _last_axis(concat.attrs.get("axis"), x.rank):
        return f"Concat {concat.name!r} does not join on the last axis"
    split = ctx.nodes.get("split")
    if split is not None:
        if ctx.values["x_lo"] is not split.outputs[0] or len(split.outputs) != 2:
            return f"Split {split.name!r} does not feed the rotation with its two halves"
        if not _last_axis(split.attrs.get("axis", 0), x.rank):
            return f"Split {split.name!r} does not split the last axis"
        sizes = split.inputs[1] if len(split.inputs) > 1 else None
        if sizes is not None:
            data = const_value(sizes)
            if data is None or list(np.asarray(data).reshape(-1)) != [half, half]:
                return f"Split {split.name!r} does not cut equal halves"
        elif split.attrs.get("split") not in (None, [half, half]):
            return f"Split {split.name!r} does not cut equal halves"
        return None
    return _slice_problem(ctx.nodes["slice_hi"], x, half, True) or _slice_problem(
        ctx.nodes["slice_lo"], x, half, False
    )


def rotary_pattern(p: PatternBuilder, x: Pattern) -> Pattern:
    """``x * cos + rotate_half(x) * sin`` (slices or a Split)."""
    by_slices = p.Concat(
        p.Neg(p.Slice(x, None, None, _exact=False, _label="slice_hi")),
        p.Slice(x, None, None, _exact=False, _label="slice_lo"),
        _label="concat",
    )
    by_split = p.Concat(
        p.Neg(p.Split(x, _exact=False, _output=1, _label="split")),
        p.var("x_lo"),
        _label="concat",
    )
    rotated = by_slices | by_split
    return p.Add(
        p.Mul(x, p.var("cos"), _label="mul_cos"),
        p.Mul(rotated, p.var("sin"), _label="mul_sin"),
        _label="add",
    )


_p = PatternBuilder()

RULE = FusionRule(
    "rotary_embedding",
    pattern=rotary_pattern(_p, _p.var("x")),
    fuse_pattern="RotaryEmbedding",
    priority=190,
    presets=("llm",),
    checks=(halves_check,),
    doc=__doc__.strip().splitlines()[0],
)
