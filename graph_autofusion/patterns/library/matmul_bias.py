"""MatMul followed by a constant bias over the last axis (a linear layer):

    y = x @ W + bias          bias: constant, shape [N] or [1, .., 1, N]

Also matches a ``Gemm`` without its ``C`` input followed by the bias ``Add`` (the dynamo
exporter's spelling of ``addmm``). The bias may be an initializer, a ``Constant``, or an
``Identity`` of one (the TorchScript exporter deduplicates equal initializers that way).
Native form, only for 2-D operands: ``Gemm(x, W, bias)`` (Gemm attributes kept, ``beta=1``);
an N-D MatMul has no exact single-operator form, so it keeps the generic form (the native
rewrite declines it).
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Value
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, PatternBuilder, VarPattern
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule


def _is_const(value: Value) -> str | None:
    return None if const_value(value) is not None else f"%{value.name} is not a constant"


def bias_var(p: PatternBuilder, name: str = "bias") -> VarPattern:
    """A constant (possibly behind ``Identity``) bias variable."""
    return p.var(name, check=_is_const)


def _known(*values: Value) -> tuple[int | None, int | None]:
    """(static last dimension, rank) from the first value that knows them."""
    n = rank = None
    for v in values:
        if v is None or v.shape is None:
            continue
        rank = rank if rank is not None else len(v.shape)
        if n is None and v.shape and isinstance(v.shape[-1], int):
            n = v.shape[-1]
    return n, rank


def last_axis_bias(bias: np.ndarray | None, *values: Value) -> str | None:
    """Why ``bias`` is not a vector broadcast over the last axis of the first of ``values``
    whose shape is known (None if it is)."""
    if bias is None:
        return "the bias is not a constant"
    n, rank = _known(*values)
    if n is None or rank is None:
        return f"%{values[0].name} has no static last dimension"
    if bias.ndim == 0 or bias.ndim > rank or bias.size != n or bias.shape[-1] != n:
        return f"bias of shape {list(bias.shape)} is not a vector over the last axis ({n})"
    return None


def check_bias(ctx: MatchContext, bias: str = "bias", label: str = "bias_add") -> str | None:
    """Rule check: the bias is a constant vector over the last axis of the bias add (whose
    shape is the bias add's, else the matmul's, else its weight's last axis)."""
    add, mm = ctx.nodes[label], ctx.nodes.get("matmul")
    values = [add.outputs[0]]
    if mm is not None:
        values.append(mm.outputs[0])
        w = mm.inputs[1]
        if w.rank is not None and w.rank >= 2 and not mm.attrs.get("transB", 0):
            values.append(w)
    return last_axis_bias(const_value(ctx.values[bias]), *values)


def _rewrite(ctx: RewriteContext):
    mm = ctx.label("matmul")
    x, w = mm.inputs[0], mm.inputs[1]
    if x.rank != 2 or w.rank != 2:
        raise RewriteError(
            f"MatMul of rank-{x.rank} by rank-{w.rank} operands has no exact Gemm form"
        )
    bias = const_value(ctx.value("bias"))
    assert bias is not None
    b = ctx.add_constant("gemm_bias", bias.reshape(-1))
    attrs = dict(mm.attrs) if mm.op_type == "Gemm" else {}
    attrs["beta"] = 1.0
    return ctx.make_node("Gemm", [x, w, b], attrs).outputs


_p = PatternBuilder()
_mm = _p.MatMul(_p.var("x"), _p.var("w"), _label="matmul") | _p.Gemm(
    _p.var("x"), _p.var("w"), _label="matmul"
)
PATTERN = _p.Add(_mm, bias_var(_p), _label="bias_add")

RULE = FusionRule(
    "matmul_bias",
    pattern=PATTERN,
    fuse_pattern="MatMulBias",
    priority=115,
    presets=("transformer", "llm", "cnn"),
    checks=(check_bias,),
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
