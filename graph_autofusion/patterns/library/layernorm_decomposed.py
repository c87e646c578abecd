"""LayerNorm spelled out (older exporters, opset < 17, hand-written models):

    d = x - mean(x, axis=-1, keepdims=True)
    y = d / sqrt(mean(d^2, axis=-1, keepdims=True) + eps) * gamma (+ beta)

Accepted spellings: the square as ``Pow(d, 2)`` or ``Mul(d, d)``; both ``ReduceMean`` over the
last axis only, with ``axes`` as an attribute (opset < 18) or a constant input (opset >= 18),
keepdims=1; the normalization as ``Div(d, Sqrt(.))``, ``Mul(d, Reciprocal(Sqrt(.)))``,
``Mul(d, Div(1, Sqrt(.)))`` or ``Mul(d, Pow(., -0.5))``; gamma and beta 1-D, beta optional.
Native form: ONNX ``LayerNormalization(x, gamma[, beta], axis=-1, epsilon=eps)``.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._norm_common import (
    bound,
    reduces_last_axis,
    require_vector,
    same_dtype,
)
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule


def layernorm_decomposed_pattern(p: PatternBuilder, x: Pattern) -> Pattern:
    """The spelled-out LayerNorm of ``x``. Labels ``mean`` and ``var`` (the two ReduceMean);
    variables ``eps``, ``gamma`` and (when present) ``beta``."""
    mean = p.ReduceMean(x, keepdims=1, _exact=False, _label="mean")
    d = p.Sub(x, mean)
    square = p.Pow(d, p.const("two", scalar=True, value=2.0)) | p.Mul(d, d)
    var = p.ReduceMean(square, keepdims=1, _exact=False, _label="var")
    shifted = p.Add(var, p.const("eps", scalar=True))
    root = p.Sqrt(shifted)
    one = p.const("one", scalar=True, value=1.0)
    normed = (
        p.Div(d, root)
        | p.Mul(d, p.Reciprocal(root))
        | p.Mul(d, p.Div(one, root))
        | p.Mul(d, p.Pow(shifted, p.const("neg_half", scalar=True, value=-0.5)))
    )
    scaled = p.Mul(normed, p.var("gamma", rank=1))
    return p.Add(scaled, p.var("beta", rank=1)) | scaled


def _rewrite(ctx: RewriteContext):
    x, gamma = bound(ctx, "x"), bound(ctx, "gamma")
    beta = bound(ctx, "beta")
    params = [v for v in (gamma, beta) if v is not None]
    hidden = x.shape[-1] if x.shape is not None else None
    for v in params:
        require_vector(v, "parameter", hidden)
    same_dtype(x, *params)  # ONNX arithmetic keeps one type: the output's too
    eps = ctx.const("eps")
    if eps is None:  # pragma: no cover - the pattern requires a constant
        raise RewriteError("epsilon is not a constant")
    node = ctx.make_node(
        "LayerNormalization",
        [x, gamma, beta] if beta is not None else [x, gamma],
        {"axis": -1, "epsilon": float(eps.reshape(-1)[0])},
    )
    return node.outputs[:1]


_p = PatternBuilder()

RULE = FusionRule(
    "layernorm_decomposed",
    pattern=layernorm_decomposed_pattern(_p, _p.var("x")),
    fuse_pattern="LayerNormalization",
    priority=168,
    presets=("transformer",),
    checks=(reduces_last_axis("mean", "var"),),
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
