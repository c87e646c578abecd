"""QuickGELU (CLIP's sigmoid approximation of GELU), spelled out:

    y = x * sigmoid(1.702 * x)

``Mul(x, Sigmoid(Mul(x, 1.702)))`` with every operand order. Native form:
``com.microsoft.QuickGelu(x, alpha)`` with the graph's constant as ``alpha``.
"""

from __future__ import annotations

from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"

#: QuickGelu's default alpha.
ALPHA = 1.702


def _rewrite(ctx: RewriteContext):
    alpha = float(ctx.const("alpha").reshape(-1)[0])
    return ctx.make_node("QuickGelu", [ctx.value("x")], {"alpha": alpha}, domain=MS).outputs


_p = PatternBuilder()
_x = _p.var("x")
_alpha = _p.const("alpha", scalar=True, value=ALPHA, rtol=1e-4)

RULE = FusionRule(
    "quick_gelu",
    pattern=_p.Mul(_x, _p.Sigmoid(_p.Mul(_x, _alpha, _label="scale"), _label="sigmoid")),
    fuse_pattern="QuickGelu",
    priority=127,
    presets=("transformer",),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
