"""SiLU (swish), spelled out:

    y = x * sigmoid(x)

``Mul(x, Sigmoid(x))`` with the operands in either order. The scaled form
``x * sigmoid(1.702 * x)`` is ``quick_gelu``, not this rule (the Sigmoid must read ``x``
itself). Native form: ``com.microsoft.QuickGelu(x, alpha=1.0)``, which is exactly SiLU.
"""

from __future__ import annotations

from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"


def _rewrite(ctx: RewriteContext):
    return ctx.make_node("QuickGelu", [ctx.value("x")], {"alpha": 1.0}, domain=MS).outputs


_p = PatternBuilder()
_x = _p.var("x")

RULE = FusionRule(
    "silu",
    pattern=_p.Mul(_x, _p.Sigmoid(_x, _label="sigmoid")),
    fuse_pattern="QuickGelu",
    priority=126,
    presets=("llm", "cnn"),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
