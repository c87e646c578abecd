"""GELU, exact (erf) form, spelled out by an exporter:

    y = 0.5 * x * (1 + erf(x / sqrt(2)))

Exporters write the division as ``Div(x, 1.4142…)`` or ``Mul(x, 0.7071…)`` and put the
``0.5`` on either product (``Mul(Mul(x, Add(Erf, 1)), 0.5)`` or ``Mul(Mul(x, 0.5), Add(…))``);
all of these match. Native form: ``com.microsoft.Gelu(x)``.
"""

from __future__ import annotations

import math

from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"


def gelu_erf_pattern(p: PatternBuilder, x: Pattern, tag: str = "") -> Pattern:
    """The decomposed erf-GELU of ``x`` (shared with ``bias_gelu``)."""
    scaled = p.Div(x, p.const(f"{tag}sqrt2", scalar=True, value=math.sqrt(2.0))) | p.Mul(
        x, p.const(f"{tag}inv_sqrt2", scalar=True, value=1.0 / math.sqrt(2.0))
    )
    one_plus = p.Add(p.Erf(scaled), p.const(f"{tag}one", scalar=True, value=1.0))
    half = p.const(f"{tag}half", scalar=True, value=0.5)
    return p.Mul(p.Mul(x, one_plus), half) | p.Mul(p.Mul(x, half), one_plus)


def _rewrite(ctx: RewriteContext):
    return ctx.make_node("Gelu", [ctx.value("x")], domain=MS).outputs


_p = PatternBuilder()

RULE = FusionRule(
    "gelu_erf",
    pattern=gelu_erf_pattern(_p, _p.var("x")),
    fuse_pattern="Gelu",
    priority=128,
    presets=("transformer", "llm"),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
