"""Residual add followed by RMSNorm (Llama's pre-norm residual stream):

    s = input + skip (+ bias)
    y = weight * (s / sqrt(mean(s^2, axis=-1) + eps))

The RMSNorm accepts every spelling of ``rmsnorm`` (square as Pow or Mul, axes as attribute or
input, Div / Reciprocal / Div(1, .) / Pow(-0.5), optional Casts). The sum is usually read again
by the next residual add: it is exported, like onnxruntime's 4th output
``input_skip_bias_sum``; so is the optional float32 ``Cast`` of the sum (torchscript's Llama
reads that copy in the next residual add; the native form redoes the Cast). Native form: ``com.microsoft.SkipSimplifiedLayerNormalization(input,
skip, weight[, bias], epsilon)`` when the shapes fit its conventions and input, skip, weight
and output share one element type.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._norm_common import (
    MS,
    bound,
    casts_widen,
    exported_cast,
    reduces_last_axis,
    require_vector,
    same_dtype,
    skip_operands,
    skip_sum_pattern,
)
from graph_autofusion.patterns.library.rmsnorm import epsilon, rmsnorm_pattern
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule


def _rewrite(ctx: RewriteContext):
    inp, skip, bias = skip_operands(ctx)
    casts_widen(ctx)
    weight = bound(ctx, "weight")
    params = [v for v in (weight, bias) if v is not None]
    for v in params:
        require_vector(v, "parameter", inp.shape[-1])
    same_dtype(inp, skip, *params)  # the output has the weight's type (Mul)
    if inp.shape is not None and len(inp.shape) not in (2, 3):
        raise RewriteError(
            f"SkipSimplifiedLayerNormalization takes 2-D or 3-D inputs, %{inp.name} is "
            f"{len(inp.shape)}-D"
        )
    node = ctx.make_node(
        "SkipSimplifiedLayerNormalization",
        [inp, skip, weight, bias] if bias is not None else [inp, skip, weight],
        {"epsilon": epsilon(ctx)},
        domain=MS,
        num_outputs=4,
    )
    outs = node.outputs
    # the normalized output, the exported sum, and the sum's exported Cast (if matched)
    return [outs[0], outs[3], *exported_cast(ctx, outs[3])]


_p = PatternBuilder()

RULE = FusionRule(
    "skip_rmsnorm",
    pattern=rmsnorm_pattern(_p, skip_sum_pattern(_p)),
    fuse_pattern="SkipSimplifiedLayerNormalization",
    priority=185,
    presets=("llm",),
    checks=(reduces_last_axis("reduce"),),
    exported=("sum", "cast_in"),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
