"""GELU, tanh approximation (GPT-2's ``gelu_new``), spelled out by an exporter:

    y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

Exporters write the cube as ``Pow(x, 3)`` or ``Mul(x, Mul(x, x))``, sometimes factor the inner
term as ``x * (1 + 0.044715 * x * x)`` (BLOOM's ``bloom_gelu``: ``0.79788456 * x * (1 + 0.044715
* x * x)``, the scale on ``x`` first), and put the ``0.5`` on either product
(``Mul(Mul(x, 0.5), Add(…))``, ``Mul(Mul(x, Add(…)), 0.5)`` or ``Mul(x, Mul(Add(…), 0.5))``);
all of these match, with their constants on either side. Native form:
``com.microsoft.FastGelu(x)``.
"""

from __future__ import annotations

import math

from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"

#: sqrt(2 / pi), the tanh argument's scale.
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
#: The cubic coefficient.
CUBIC = 0.044715


def gelu_tanh_pattern(p: PatternBuilder, x: Pattern, tag: str = "") -> Pattern:
    """The decomposed tanh-GELU of ``x`` (shared with ``bias_gelu``).

    Every node of the form is labelled; the ``Tanh`` is ``{tag}tanh``.
    """
    square = p.Mul(x, x)
    cube = p.Pow(x, p.const(f"{tag}three", scalar=True, value=3.0)) | p.Mul(x, square)
    coef = p.const(f"{tag}cubic", scalar=True, value=CUBIC)
    # 1 + 0.044715 x^2, its square as (x x) c or (c x) x
    one_plus_sq = p.Add(
        p.Mul(p.Mul(x, x), coef) | p.Mul(p.Mul(x, coef), x),
        p.const(f"{tag}one_in", scalar=True, value=1.0),
    )
    inner = p.Add(x, p.Mul(cube, coef)) | p.Mul(x, one_plus_sq)
    sqrt_2_pi = p.const(f"{tag}sqrt_2_pi", scalar=True, value=SQRT_2_OVER_PI)
    # sqrt(2/pi) times the inner term, or (BLOOM's bloom_gelu) times x before the factor
    scaled = p.Mul(inner, sqrt_2_pi) | p.Mul(p.Mul(x, sqrt_2_pi), one_plus_sq)
    one_plus = p.Add(
        p.Tanh(scaled, _label=f"{tag}tanh"), p.const(f"{tag}one", scalar=True, value=1.0)
    )
    half = p.const(f"{tag}half", scalar=True, value=0.5)
    return (
        p.Mul(p.Mul(x, half), one_plus)
        | p.Mul(p.Mul(x, one_plus), half)
        | p.Mul(x, p.Mul(one_plus, half))
    )


def _rewrite(ctx: RewriteContext):
    x = ctx.value("x")
    if x.shape is not None and len(x.shape) == 0:  # onnxruntime's kernel rejects a scalar
        raise RewriteError(f"FastGelu needs a tensor of rank >= 1; %{x.name} is a scalar")
    return ctx.make_node("FastGelu", [x], domain=MS).outputs


_p = PatternBuilder()

RULE = FusionRule(
    "gelu_tanh",
    pattern=gelu_tanh_pattern(_p, _p.var("x")),
    fuse_pattern="FastGelu",
    priority=130,
    presets=("transformer", "llm"),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
