"""Attention scale, mask and softmax, the middle of scaled dot-product attention:

    p = softmax(s * c + mask, axis=-1)        (c a scalar constant, usually 1/sqrt(d))

``s`` is the score matrix ``q @ k^T``. Exporters spell the scale as ``Div(s, sqrt(d))`` or
``Mul(s, 1/sqrt(d))``; the dynamo and TorchScript exporters of ``scaled_dot_product_attention``
instead scale ``q`` and ``k^T`` by ``d**-0.25`` each *before* the score MatMul, so the scale is
``MatMul(Mul(q, c1), Mul(kT, c2))`` (that MatMul is then part of the match). The mask is an
``Add`` of an additive mask, a ``Where(cond, scores, fill)`` (a boolean causal mask), both, or
absent. Those exporters also guard the probabilities with ``Where(IsNaN(p), 0, p)`` (a row that
is fully masked gives NaN); the guard is matched when present. Softmax must run over the last
axis. No onnxruntime CPU kernel computes exactly this, so the rule keeps the generic form.
"""

from __future__ import annotations

from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule


def scale_pattern(p: PatternBuilder, scores: Pattern, *, prescaled: Pattern | None = None):
    """``scores / c`` or ``scores * c`` (c a scalar constant), or the pre-scaled score MatMul
    ``prescaled`` when given."""
    alts = p.Div(scores, p.const("scale", scalar=True), _label="scale") | p.Mul(
        scores, p.const("scale", scalar=True), _label="scale"
    )
    return alts | prescaled if prescaled is not None else alts


def prescaled_matmul(p: PatternBuilder, q: Pattern, kt: Pattern) -> Pattern:
    """``MatMul(q * c1, kT * c2)`` with at least one of the two scalar scales present."""
    q_scaled = p.Mul(q, p.const("q_scale", scalar=True), _label="q_scale")
    k_scaled = p.Mul(kt, p.const("k_scale", scalar=True), _label="k_scale")
    return p.MatMul(q_scaled, p.optional(k_scaled, kt), _label="qk") | p.MatMul(
        q, k_scaled, _label="qk"
    )


def nan_guard(p: PatternBuilder, inner: Pattern, tag: str) -> Pattern:
    """``Where(IsNaN(inner), 0, inner)`` or just ``inner``."""
    zero = p.const(f"{tag}_zero", scalar=True, value=0.0)
    return p.optional(p.Where(p.IsNaN(inner), zero, inner, _label=f"{tag}_guard"), inner)


def masked_softmax_pattern(p: PatternBuilder, scaled: Pattern) -> Pattern:
    """``Softmax(scaled [Where-masked] [+ mask])`` with its optional NaN guard."""
    where_masked = p.optional(
        p.Where(p.var("mask_cond"), scaled, p.var("mask_fill"), _label="mask_where"), scaled
    )
    masked = p.optional(p.Add(where_masked, p.var("mask"), _label="mask_add"), where_masked)
    softmax = p.Softmax(masked, _label="softmax")
    return nan_guard(p, softmax, "probs")


def softmax_last_axis(ctx: MatchContext) -> str | None:
    """Reject a Softmax that does not normalize over the last axis."""
    node = ctx.nodes["softmax"]
    axis = node.attrs.get("axis", -1)
    rank = node.inputs[0].rank if node.inputs[0].rank is not None else node.outputs[0].rank
    for name in ("scores", "q", "kt", "k"):  # the score matrix has the rank of q and kT
        if rank is None and name in ctx.values:
            rank = ctx.values[name].rank
    if axis == -1 or (rank is not None and axis == rank - 1):
        return None
    return f"Softmax {node.name!r} normalizes over axis {axis}, not the last axis"


def attention_scale_mask_pattern(p: PatternBuilder) -> Pattern:
    prescaled = prescaled_matmul(p, p.var("q"), p.var("kt"))
    return masked_softmax_pattern(p, scale_pattern(p, p.var("scores"), prescaled=prescaled))


_p = PatternBuilder()

RULE = FusionRule(
    "attention_scale_mask",
    pattern=attention_scale_mask_pattern(_p),
    fuse_pattern="AttentionScaleMaskSoftmax",
    priority=165,
    presets=("transformer", "llm"),
    checks=(softmax_last_axis,),
    doc=__doc__.strip().splitlines()[0],
)
