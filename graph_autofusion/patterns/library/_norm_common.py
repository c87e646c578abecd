"""Pieces shared by the normalization rules (``skip_layernorm``, ``layernorm_add``,
``layernorm_decomposed``, ``rmsnorm``, ``skip_rmsnorm``): the residual-sum pattern, the
last-axis checks, and the input conventions of onnxruntime's Skip*LayerNormalization ops."""

from __future__ import annotations

from collections.abc import Callable

from graph_autofusion.ir.core import Node, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError

MS = "com.microsoft"


# ----------------------------------------------------------------------------- patterns
def skip_sum_pattern(p: PatternBuilder) -> Pattern:
    """``input + skip``, or ``(input + bias) + skip`` with a 1-D ``bias`` (a constant, or
    torchscript's ``Identity`` of a deduplicated initializer).

    The sum is labelled ``sum`` (rules export it: onnxruntime's Skip*LayerNormalization ops
    output it as ``input_skip_bias_sum``), the bias add ``bias_add``. The biased form is tried
    first, so a bias is absorbed whenever one is there; operand order never matters.
    """
    inp, skip = p.var("input"), p.var("skip")
    bias = p.var("bias", rank=1)
    biased = p.Add(p.Add(inp, bias, _label="bias_add"), skip, _label="sum")
    return biased | p.Add(inp, skip, _label="sum")


def layernorm_node(p: PatternBuilder, x: Pattern) -> Pattern:
    """``LayerNormalization(x, gamma[, beta])``, labelled ``ln`` (axis checked separately)."""
    gamma, beta = p.var("gamma"), p.var("beta")
    return p.LayerNormalization(x, gamma, beta, _label="ln") | p.LayerNormalization(
        x, gamma, _label="ln"
    )


# ----------------------------------------------------------------------------- checks
def reduce_axes(node: Node) -> list[int] | None:
    """The axes of a Reduce* (or Unsqueeze/Squeeze) node: its ``axes`` attribute (opset < 18,
    < 13 for Unsqueeze) or its constant second input; ``None`` when absent or not constant."""
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        data = const_value(node.inputs[1])
        if data is None:
            return None
        axes = data.reshape(-1).tolist()
    return None if axes is None else [int(a) for a in axes]


def is_last_axis(axes: list[int], rank: int | None) -> bool:
    """True when ``axes`` names exactly the last axis of a tensor of ``rank``."""
    if axes == [-1]:
        return True
    return rank is not None and len(axes) == 1 and axes[0] in (rank - 1, -1)


def reduces_last_axis(*labels: str) -> Callable[[MatchContext], str | None]:
    """A rule check: every labelled ReduceMean reduces only the last axis."""

    def check(ctx: MatchContext) -> str | None:
        for label in labels:
            node = ctx.nodes[label]
            axes = reduce_axes(node)
            if axes is None:
                return f"{node.op_type} {node.name!r} has no constant axes (it reduces all axes)"
            x = node.inputs[0]
            rank = x.rank if x is not None else None
            if rank is None and node.attrs.get("keepdims", 1):
                rank = node.outputs[0].rank  # keepdims keeps the rank
            if not is_last_axis(axes, rank):
                return f"{node.op_type} {node.name!r} reduces axes {axes}, not the last axis"
        return None

    return check


def layernorm_last_axis(ctx: MatchContext) -> str | None:
    """A rule check: the LayerNormalization labelled ``ln`` normalizes the last axis only."""
    ln = ctx.nodes["ln"]
    axis = int(ln.attrs.get("axis", -1))
    x = ln.inputs[0]
    rank = x.rank if x is not None and x.rank is not None else ln.outputs[0].rank
    if not is_last_axis([axis], rank):
        return f"LayerNormalization {ln.name!r} normalizes from axis {axis}, not the last axis"
    return None


# ----------------------------------------------------------------------------- rewrites
def bound(ctx: RewriteContext, name: str) -> Value | None:
    """The value bound to ``name`` as it is now (``ctx.value`` follows values an earlier
    rewrite replaced: chained residual norms, one match's exported sum is the next one's
    input), or ``None`` when the pattern did not bind it."""
    return ctx.value(name) if name in ctx.match.values else None


def require_vector(value: Value, what: str, size=None) -> None:
    """Decline a native rewrite unless ``value`` is 1-D (of ``size`` when both are known)."""
    if value.rank != 1:
        raise RewriteError(f"{what} %{value.name} is not 1-D (shape {value.shape})")
    if size is not None and isinstance(size, int) and isinstance(value.shape[0], int):
        if value.shape[0] != size:
            raise RewriteError(f"{what} %{value.name} has {value.shape[0]} elements, want {size}")


def same_dtype(*values: Value) -> None:
    """Decline a native rewrite when the values' element types differ."""
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1 or None in dtypes:
        names = ", ".join(f"%{v.name}: {v.dtype.short if v.dtype else '?'}" for v in values)
        raise RewriteError(f"mixed or unknown element types ({names}); no exact native form")


def skip_operands(ctx: RewriteContext) -> tuple[Value, Value, Value | None]:
    """``(input, skip, bias)`` in the order onnxruntime's Skip*LayerNormalization accepts.

    ``input`` must be 2-D or 3-D with the sum's shape; ``skip`` has that shape, or
    ``(1, S, H)`` / ``(S, H)`` against a 3-D input. The two are swapped when only the other
    order is valid (the sum commutes); otherwise the native rewrite is declined.
    """
    a, b = bound(ctx, "input"), bound(ctx, "skip")
    assert a is not None and b is not None
    total = ctx.label("sum").outputs[0]
    bias = bound(ctx, "bias")

    def same(xs, ys) -> bool:
        # symbolic dims with different names (torchscript's unk__N) are taken as equal
        return len(xs) == len(ys) and all(
            a == b or not (isinstance(a, int) and isinstance(b, int)) for a, b in zip(xs, ys)
        )

    def ok(inp: Value, skip: Value) -> bool:
        if inp.shape is None or skip.shape is None or inp.rank not in (2, 3):
            return False
        if total.shape is not None and not same(total.shape, inp.shape):
            return False
        if same(skip.shape, inp.shape):
            return True
        if inp.rank == 3 and skip.rank == 3 and skip.shape[0] == 1:
            return same(skip.shape[1:], inp.shape[1:])
        return inp.rank == 3 and same(skip.shape, inp.shape[1:])

    # input + skip + bias commutes: which operand the bias add read does not matter
    if ok(a, b):
        return a, b, bias
    if ok(b, a):
        return b, a, bias
    raise RewriteError(
        f"operands %{a.name} {a.shape} and %{b.name} {b.shape} do not fit "
        f"Skip*LayerNormalization's input/skip shapes (2-D or 3-D, skip broadcast only as "
        f"(1,S,H) or (S,H))"
    )


def outputs_unread(node: Node, first: int, why: str) -> None:
    """Decline when any output of ``node`` from index ``first`` on has a reader."""
    graph = node.graph
    for out in node.outputs[first:]:
        if out.users or (graph is not None and graph.is_output(out)):
            raise RewriteError(f"%{out.name} ({why}) is read; the native form does not match it")


def casts_widen(ctx: RewriteContext) -> None:
    """Decline when the optional input Cast (label ``cast_in``) narrows the computation: the
    native ops compute in float32, so only a no-op Cast or one to float32 is exact."""

    node = ctx.match.labels.get("cast_in")
    if node is None:
        return
    src = node.inputs[0]
    try:
        dst = DType(int(node.attrs.get("to", 0)))
    except ValueError:
        dst = None
    if dst not in (src.dtype, DType.FLOAT):
        shown = dst.short if dst is not None else node.attrs.get("to")
        raise RewriteError(
            f"Cast {node.name!r} computes the norm in {shown}, not float32; no exact native form"
        )


def read_outside(ctx: RewriteContext, value: Value) -> bool:
    """True when ``value`` has a reader outside the match or is a graph output."""
    members = set(ctx.match.nodes)
    graph = ctx.graph
    return graph.is_output(value) or any(u not in members for u in value.user_nodes)


def exported_cast(ctx: RewriteContext, total: Value) -> list[Value]:
    """The replacement for the exported ``cast_in`` output (torchscript's Llama reads the
    float32 copy of the residual sum in the next residual add), or nothing if absent.

    When the copy is read outside, the Cast is redone on the fused op's sum output; when it is
    not, the old value is returned unchanged (it disappears with the matched nodes).
    """
    cast = ctx.match.labels.get("cast_in")
    if cast is None:
        return []
    old = cast.outputs[0]
    if not read_outside(ctx, old):
        return [old]
    return ctx.make_node("Cast", [total], dict(cast.attrs)).outputs[:1]
