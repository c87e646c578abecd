"""Softmax followed by an inference-mode Dropout (a no-op):

    y = dropout(softmax(x), ratio, training_mode=false) = softmax(x)

The Dropout's ``training_mode`` input must be absent or a constant false (any ratio; a Dropout
that trains is random and never matches). Its optional mask output must have no readers.
Native form: the Softmax alone, the Dropout removed.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import FusionRule


def _inference_only(ctx: MatchContext) -> str | None:
    drop = ctx.nodes["dropout"]
    if len(drop.inputs) > 2 and drop.inputs[2] is not None:
        mode = const_value(drop.inputs[2])
        if mode is None:
            return "the Dropout's training_mode is not a constant"
        if bool(np.asarray(mode).reshape(-1)[0]):
            return "the Dropout is in training mode"
    if len(drop.outputs) > 1:
        mask = drop.outputs[1]
        g = drop.graph
        if mask.user_nodes or (g is not None and g.is_output(mask)):
            return f"the Dropout's mask %{mask.name} is read"
    return None


def _rewrite(ctx: RewriteContext):
    sm = ctx.label("softmax")
    outs = list(ctx.make_node("Softmax", [sm.inputs[0]], dict(sm.attrs)).outputs)
    drop = ctx.label("dropout")
    if len(drop.outputs) > 1:  # an unread mask: stand in an unread constant of ones
        outs.append(ctx.add_constant("dropout_mask", np.ones((), dtype=np.bool_)))
    return outs


_p = PatternBuilder()

RULE = FusionRule(
    "softmax_dropout",
    pattern=_p.Dropout(_p.Softmax(_p.var("x"), _label="softmax"), _label="dropout", _exact=False),
    fuse_pattern="Softmax",
    priority=125,
    presets=("transformer", "llm"),
    checks=(_inference_only,),
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
