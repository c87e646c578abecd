"""Conv followed by an activation FusedConv supports as an epilogue:

    y = act(Conv(x, W, b))     act in Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, Clip

Native form: ``com.microsoft::FusedConv(x, W, b, activation=act, activation_params=...)``;
LeakyRelu passes ``[alpha]``, HardSigmoid ``[alpha, beta]``, Clip ``[min, max]`` (constant
bounds only; an omitted bound is the float32 limit).
"""

from __future__ import annotations

from graph_autofusion.patterns.library._conv_common import (
    MS,
    activation_params,
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

#: Activations with no parameter inputs.
SIMPLE = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid")


def clip_bounds_constant(ctx: MatchContext) -> str | None:
    """Check: a Clip's min/max are constants (FusedConv takes them as attributes)."""
    act = ctx.nodes["act"]
    if act.op_type != "Clip":
        return None
    for v in act.inputs[1:]:
        if v is not None and const_value(v) is None:
            return f"Clip bound %{v.name} is computed at run time"
    return None


def _rewrite(ctx: RewriteContext):
    node = ctx.label("conv")
    name, params = activation_params(ctx.label("act"))
    return fused_conv(ctx, node, live_input(node, 1), conv_bias(node), None, name, params)


_p = PatternBuilder()
_conv = conv(_p)

RULE = FusionRule(
    "conv_activation",
    pattern=_p.op(*SIMPLE)(_conv, _label="act") | _p.Clip(_conv, _label="act", _exact=False),
    fuse_pattern="FusedConv",
    priority=102,
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("cnn",),
    checks=(clip_bounds_constant, pad_not_hidden),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
