"""Conv, residual Add, Relu (the tail of a ResNet block once BatchNormalization is folded):

    y = Relu(Conv(x, W, b) + z)          z: the residual, same shape as the Conv output

Native form: ``com.microsoft::FusedConv(x, W, b, z, activation="Relu")`` (FusedConv adds its
optional fourth input ``Z`` before the activation).
"""

from __future__ import annotations

from graph_autofusion.patterns.library._conv_common import (
    MS,
    conv,
    conv_bias,
    fused_conv,
    live_input,
    pad_not_hidden,
)
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import EPILOGUE_THRESHOLD, FusionRule


def residual_same_shape(ctx: MatchContext) -> str | None:
    """Check: the residual is a computed tensor of exactly the Conv output's shape."""
    z = ctx.values["z"]
    y = ctx.nodes["conv"].outputs[0]
    if const_value(z) is not None:
        return f"%{z.name} is a constant (a bias add, not a residual)"
    if z.shape is None or y.shape is None or tuple(z.shape) != tuple(y.shape):
        return (
            f"residual %{z.name} has shape {z.shape}, the Conv output {y.shape}: "
            f"FusedConv's Z must match it exactly"
        )
    return None


def _rewrite(ctx: RewriteContext):
    node = ctx.label("conv")
    add = ctx.label("add")
    # the Add's operand that is not the Conv output (read live: see ``live_input``)
    z = next(v for v in add.inputs if v is not node.outputs[0])
    return fused_conv(ctx, node, live_input(node, 1), conv_bias(node), z, "Relu")


_p = PatternBuilder()

RULE = FusionRule(
    "conv_add_relu",
    pattern=_p.Relu(_p.Add(conv(_p), _p.var("z"), _label="add")),
    fuse_pattern="FusedConv",
    priority=106,
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("cnn",),
    checks=(residual_same_shape, pad_not_hidden),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
