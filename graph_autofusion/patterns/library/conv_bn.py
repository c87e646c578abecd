"""Conv followed by an inference BatchNormalization (constant statistics):

    y = (Conv(x, W, b) - mean) * gamma / sqrt(var + eps) + beta

Native form: one Conv with folded weights (new initializers, the originals are untouched)::

    W' = W * gamma / sqrt(var + eps)              (per output channel)
    b' = (b - mean) * gamma / sqrt(var + eps) + beta
"""

from __future__ import annotations

from graph_autofusion.patterns.library._conv_common import (
    batch_norm,
    bn_single_output,
    conv,
    conv_attrs,
    fold_bn,
    live_input,
)
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import EPILOGUE_THRESHOLD, FusionRule


def conv_bn_pattern(p: PatternBuilder) -> Pattern:
    """``BatchNormalization(Conv(x, w[, b]), scale, B, mean, var)`` with a constant ``w``."""
    return batch_norm(p, conv(p, const_weight=True))


def rewrite_folded_conv(ctx: RewriteContext):
    """One Conv with the BatchNormalization folded into its weight and bias."""
    w, b = fold_bn(ctx)
    node = ctx.label("conv")
    return ctx.make_node("Conv", [live_input(node, 0), w, b], conv_attrs(node)).outputs


_p = PatternBuilder()

RULE = FusionRule(
    "conv_bn",
    pattern=conv_bn_pattern(_p),
    fuse_pattern="ConvBatchNorm",
    priority=104,
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("cnn",),
    checks=(bn_single_output,),
    rewrite=rewrite_folded_conv,
    doc=__doc__.strip().splitlines()[0],
)
