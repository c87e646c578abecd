"""LayerNorm followed by an add (the norm's output plus a residual or a bias):

    y = LayerNorm(x, axis=-1) * gamma (+ beta) + r

The norm's output must be read only by the add (otherwise a residual stream such as BERT's,
where the norm's output also feeds the next block, is not this rule; ``skip_layernorm`` takes
the add before the norm). Generic form: one fused ``LayerNormAdd`` call. Native form only for
the exact case where ``r`` is a constant bias over the normalized axis: it folds into the
LayerNorm's ``beta``, ``LayerNormalization(x, gamma, beta + r)``. A non-constant ``r`` has no
native operator and stays in the generic form.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.patterns.library._norm_common import (
    bound,
    layernorm_last_axis,
    layernorm_node,
    outputs_unread,
)
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule


def _rewrite(ctx: RewriteContext):
    ln = ctx.label("ln")
    x, gamma, addend = bound(ctx, "x"), bound(ctx, "gamma"), bound(ctx, "addend")
    beta = bound(ctx, "beta")
    out = ctx.match.outputs[0]
    outputs_unread(ln, 1, "LayerNormalization's Mean/InvStdDev")
    r = const_value(addend)
    if r is None:
        raise RewriteError(
            f"the addend %{addend.name} is not a constant bias; LayerNorm + residual has no "
            f"native operator (generic form only)"
        )
    hidden = x.shape[-1] if x.shape is not None else None
    if not isinstance(hidden, int) or r.ndim > (x.rank or 0):
        raise RewriteError(f"the bias %{addend.name} {r.shape} would change the output shape")
    if any(d != 1 for d in r.shape[:-1]) or (r.ndim and r.shape[-1] not in (1, hidden)):
        raise RewriteError(f"the bias %{addend.name} {r.shape} varies outside the last axis")
    old_beta = None
    if beta is not None:
        old_beta = const_value(beta)
        if old_beta is None:
            raise RewriteError(f"beta %{beta.name} is not constant; it cannot absorb the bias")
    if out.dtype is None or x.dtype != out.dtype:
        raise RewriteError("the add changes the element type")
    np_dtype = out.dtype.to_numpy()
    folded = np.broadcast_to(r.reshape(-1) if r.ndim else r, (hidden,)).astype(np_dtype)
    if old_beta is not None:
        folded = (np.broadcast_to(old_beta, (hidden,)).astype(np_dtype) + folded).astype(np_dtype)
    new_beta = ctx.add_constant("ln_beta", folded, out.dtype)  # bfloat16 stays bfloat16
    node = ctx.make_node("LayerNormalization", [x, gamma, new_beta], dict(ln.attrs))
    return node.outputs[:1]


_p = PatternBuilder()

RULE = FusionRule(
    "layernorm_add",
    pattern=_p.Add(layernorm_node(_p, _p.var("x")), _p.var("addend"), _label="add"),
    fuse_pattern="LayerNormAdd",
    native_op="LayerNormalization",
    priority=170,
    presets=("transformer",),
    checks=(layernorm_last_axis,),
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
