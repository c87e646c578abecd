"""Depthwise Conv (group == input channels == output channels) followed by an inference
BatchNormalization (MobileNet / EfficientNet blocks):

    y = (Conv<group=C>(x, W[C,1,k,k], b) - mean) * gamma / sqrt(var + eps) + beta

Native form: one depthwise Conv with folded weights, as in ``conv_bn``.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._conv_common import batch_norm, bn_single_output
from graph_autofusion.patterns.library.conv_bn import rewrite_folded_conv
from graph_autofusion.patterns.pattern import MatchContext, PatternBuilder
from graph_autofusion.patterns.rules import EPILOGUE_THRESHOLD, FusionRule


def is_depthwise(ctx: MatchContext) -> str | None:
    """Check: group == input channels == output channels (weight shape ``[C, 1, k...]``)."""
    node = ctx.nodes["conv"]
    group = int(node.attrs.get("group", 1))
    w = ctx.values["w"]
    x = ctx.values["x"]
    if w.shape is None or len(w.shape) < 3:
        return f"Conv {node.name!r}: weight shape unknown"
    c_out, c_in_per_group = w.shape[0], w.shape[1]
    c_in = x.shape[1] if x.shape is not None and len(x.shape) > 1 else None
    if group <= 1 or c_in_per_group != 1 or c_out != group or c_in not in (group, None):
        return (
            f"Conv {node.name!r} is not depthwise: group={group}, weight {list(w.shape)}, "
            f"input channels {c_in}"
        )
    return None


_p = PatternBuilder()

RULE = FusionRule(
    "depthwise_conv_bn",
    pattern=batch_norm(
        _p, _p.Conv(_p.var("x"), _p.const("w"), _label="conv", _exact=False, group=lambda g: g > 1)
    ),
    fuse_pattern="DepthwiseConvBatchNorm",
    priority=108,
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("cnn",),
    checks=(bn_single_output, is_depthwise),
    rewrite=rewrite_folded_conv,
    doc=" ".join(__doc__.strip().split("\n\n")[0].split()),
)
