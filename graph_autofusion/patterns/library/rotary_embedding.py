"""Rotary position embedding (RoPE, half-split form) applied to one tensor (q or k):

    y = x * cos + rotate_half(x) * sin
    rotate_half(x) = concat(-x[..., h:], x[..., :h], axis=-1)      (h = x.shape[-1] / 2)

Exporters spell the halves as two ``Slice(x, starts, ends, axes, steps)`` nodes on the last
axis (constant bounds, or in TorchScript a bound computed at run time as
``Unsqueeze(Cast(Div(Gather(Shape(x), last), 2)))``), or as one ``Split`` of the last axis in
two equal halves. ``cos`` and ``sin`` (gathered and unsqueezed from cache tables, or constants)
are bound as variables; the rule is applied separately to q and to k.

Native form: the standard ``RotaryEmbedding`` of opset 23 (after a checked opset upgrade, see
``ir/opset_upgrade``) without position ids, which takes ``[batch, seq, head / 2]`` tables.
The full-width tables of the match are ``concat(t, t)`` (possibly through ``Cos``/``Sin``, a
scalar scale, a Cast and the head-axis Unsqueeze), so their first half is the table; that is
proved from the graph (or from the data of a constant table) before the lowering, which slices
the half (shared by every layer once verified) and drops the head axis. The contrib
``com.microsoft.RotaryEmbedding`` needs position ids and cache tables indexed by position, which
the exports do not have.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Node, Value
from graph_autofusion.ir.opset_upgrade import ATTENTION_OPSET, upgrade_opset, upgrade_problem
from graph_autofusion.patterns.library._norm_common import reduce_axes
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
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


#: Ops a rotary table goes through after ``concat(t, t)`` that keep its two halves equal.
_HALF_PRESERVING = {"Cos", "Sin", "Cast", "Identity", "Neg"}


def duplicated_halves(table: Value) -> bool:
    """The last axis of ``table`` is ``concat(t, t)``: proved from a constant's data or from
    the graph (a last-axis Concat of one value twice, then elementwise ops and Unsqueeze)."""
    for _ in range(16):
        data = const_value(table)
        if data is not None:
            if data.ndim == 0 or data.shape[-1] % 2:
                return False
            h = data.shape[-1] // 2
            return bool(np.array_equal(data[..., :h], data[..., h:]))
        node = table.producer
        if node is None or node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type == "Concat":
            ins = node.inputs
            return (
                len(ins) == 2
                and ins[0] is ins[1]
                and _last_axis(node.attrs.get("axis"), table.rank)
            )
        if node.op_type in ("Mul", "Div"):
            scalars = [v for v in node.inputs[1:] if _scalar_float(v) is not None]
            if len(node.inputs) != 2 or not scalars:
                return False
            table = node.inputs[0]
        elif node.op_type == "Unsqueeze":
            axes = reduce_axes(node)
            rank = table.rank
            if axes is None or rank is None or any(int(a) in (-1, rank - 1) for a in axes):
                return False
            table = node.inputs[0]
        elif node.op_type in _HALF_PRESERVING:
            table = node.inputs[0]
        else:
            return False
    return False


def _scalar_float(value: Value | None) -> float | None:
    data = None if value is None else const_value(value)
    return None if data is None or data.size != 1 else float(np.asarray(data).reshape(-1)[0])


def half_table(ctx: RewriteContext, table: Value, x: Value) -> Value:
    """``table[..., :head/2]`` as ``[batch, seq, head/2]`` (each rotary makes its own; the
    lowering shares identical ones afterwards, see ``codegen.onnxruntime.share_created``)."""
    if table.rank not in (3, 4) or table.dtype != x.dtype:
        raise RewriteError(
            f"rotary table %{table.name} {table.type_str()} does not fit {x.type_str()}"
        )
    if table.rank == 4 and table.shape[1] != 1:
        raise RewriteError(f"rotary table %{table.name} is not shared by the heads")
    if not duplicated_halves(table):
        raise RewriteError(f"rotary table %{table.name} is not concat(t, t) on its last axis")
    half = x.shape[-1] // 2
    i64 = np.int64
    out = ctx.make_node(
        "Slice",
        [
            table,
            ctx.add_constant("rotary_start", np.array([0], i64)),
            ctx.add_constant("rotary_half", np.array([half], i64)),
            ctx.add_constant("rotary_axis", np.array([-1], i64)),
        ],
    ).outputs[0]
    if table.rank == 4:
        out = ctx.make_node(
            "Squeeze", [out, ctx.add_constant("rotary_heads", np.array([1], i64))]
        ).outputs[0]
    out.dtype = table.dtype
    out.shape = (*((table.shape[0], table.shape[2]) if table.rank == 4 else table.shape[:2]), half)
    return _batch_of(ctx, out, x)


def _batch_of(ctx: RewriteContext, table: Value, x: Value) -> Value:
    """``table`` (``[b, seq, head/2]``) with ``x``'s batch: the exporters' tables have one row
    of positions for the whole batch (``b`` = 1, broadcast by the ``Mul``), and
    ``RotaryEmbedding`` does not broadcast them. A table of one row is expanded to
    ``[B, seq, head/2]`` unless ``x``'s batch is 1 too; a symbolic ``b`` is taken to be the
    batch (position ids given per sequence)."""
    if table.shape[0] != 1 or x.shape[0] == 1:
        return table
    return ctx.expand_to(table, 0, x, 0)


def _rewrite(ctx: RewriteContext) -> list[Value]:
    problem = upgrade_problem(ctx.model, ATTENTION_OPSET)
    if problem is not None:
        raise RewriteError(f"RotaryEmbedding needs opset {ATTENTION_OPSET}: {problem}")
    x = ctx.value("x")
    if x.rank != 4:
        raise RewriteError(
            f"RotaryEmbedding needs a 4-D [batch, heads, seq, head] input, %{x.name}"
        )
    cos = half_table(ctx, ctx.value("cos"), x)
    sin = half_table(ctx, ctx.value("sin"), x)
    upgrade_opset(ctx.model, ATTENTION_OPSET)
    node = ctx.make_node("RotaryEmbedding", [x, cos, sin], {"interleaved": 0})
    node.outputs[0].dtype, node.outputs[0].shape = x.dtype, x.shape
    return list(node.outputs)


_p = PatternBuilder()

RULE = FusionRule(
    "rotary_embedding",
    pattern=rotary_pattern(_p, _p.var("x")),
    fuse_pattern="RotaryEmbedding",
    native_op="RotaryEmbedding",
    priority=190,
    presets=("llm",),
    checks=(halves_check,),
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
