"""Residual add followed by LayerNorm (BERT post-LN, GPT-2 pre-LN residual stream):

    s = input + skip (+ bias)
    y = LayerNorm(s, axis=-1) * gamma (+ beta)

``bias`` is an optional 1-D add on one operand (a projection's bias). The sum may
also be read after the norm (the next residual add of a pre-LN model): it is exported, like
onnxruntime's 4th output ``input_skip_bias_sum``. A LayerNormalization without ``beta``
matches too. Native form: ``com.microsoft.SkipLayerNormalization(input, skip, gamma[, beta
[, bias]], epsilon)`` (outputs Y, mean, inv_std_var, input_skip_bias_sum), when the shapes fit
its conventions (2-D or 3-D input; skip of the same shape, or ``(1,S,H)`` / ``(S,H)``), the
parameters are 1-D and only the LayerNorm's first output is read.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._norm_common import (
    MS,
    bound,
    layernorm_last_axis,
    layernorm_node,
    outputs_unread,
    require_vector,
    same_dtype,
    skip_operands,
    skip_sum_pattern,
)
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule


def _rewrite(ctx: RewriteContext):
    ln = ctx.label("ln")
    outputs_unread(ln, 1, "LayerNormalization's Mean/InvStdDev")
    if int(ln.attrs.get("stash_type", 1)) != 1:
        raise RewriteError(f"LayerNormalization {ln.name!r} computes in double (stash_type=0)")
    inp, skip, bias = skip_operands(ctx)
    gamma, beta = bound(ctx, "gamma"), bound(ctx, "beta")
    hidden = inp.shape[-1]
    params = [v for v in (gamma, beta, bias) if v is not None]
    for v in params:
        require_vector(v, "parameter", hidden)
    same_dtype(inp, skip, *params)
    node = ctx.make_node(
        "SkipLayerNormalization",
        [inp, skip, gamma, beta, bias] if bias is not None else [inp, skip, gamma, beta],
        {"epsilon": float(ln.attrs.get("epsilon", 1e-5))},
        domain=MS,
        num_outputs=4,
    )
    outs = node.outputs
    # match outputs: the LayerNorm's outputs (Y[, Mean, InvStdDev]), then the exported sum
    return [*outs[: len(ln.outputs)], outs[3]]


_p = PatternBuilder()

RULE = FusionRule(
    "skip_layernorm",
    pattern=layernorm_node(_p, skip_sum_pattern(_p)),
    fuse_pattern="SkipLayerNormalization",
    priority=175,
    presets=("transformer",),
    checks=(layernorm_last_axis,),
    exported=("sum",),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
