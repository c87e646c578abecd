"""Conv, inference BatchNormalization, Relu (the ResNet block body when BN is kept):

    y = Relu((Conv(x, W, b) - mean) * gamma / sqrt(var + eps) + beta)

Native form: the BatchNormalization folds into the Conv weights (see ``conv_bn``) and the Relu
becomes the epilogue of ``com.microsoft::FusedConv(x, W', b', activation="Relu")``.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._conv_common import (
    MS,
    batch_norm,
    bn_single_output,
    conv,
    fold_bn,
    fused_conv,
    pad_not_hidden,
)
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import EPILOGUE_THRESHOLD, FusionRule


def _rewrite(ctx: RewriteContext):
    w, b = fold_bn(ctx)
    return fused_conv(ctx, ctx.label("conv"), w, b, None, "Relu")


_p = PatternBuilder()

RULE = FusionRule(
    "conv_bn_relu",
    pattern=_p.Relu(batch_norm(_p, conv(_p, const_weight=True))),
    fuse_pattern="FusedConv",
    priority=110,
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("cnn",),
    checks=(bn_single_output, pad_not_hidden),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
