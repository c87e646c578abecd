"""Scaled dot-product attention, spelled out:

    out = softmax((q @ kT) * c + mask, axis=-1) @ v

The spellings exporters use all match:

* TorchScript-era BERT: ``MatMul(q, Transpose(k))`` -> ``Div(sqrt d)`` -> ``Add(mask)`` ->
  ``Softmax`` -> ``MatMul(v)``; our PyTorch frontend writes ``Mul(1/sqrt d)`` instead of the
  Div and guards the result with ``Where(IsNaN(out), 0, out)``.
* dynamo and TorchScript exports of ``scaled_dot_product_attention`` scale ``q`` and ``kT``
  by ``d**-0.25`` each before the score MatMul and guard the probabilities with
  ``Where(IsNaN(p), 0, p)`` before the value MatMul.
* Causal models (GPT-2) mask with ``Add`` of a precomputed mask or ``Where(cond, scores,
  fill)``, or both; the mask may be absent, and so may the scale (folded into the weights).
* Logit soft-capping (Gemma-2, Grok): ``Mul(Tanh(Div(scores, c)), c)`` (or ``Mul`` by
  ``1/c`` inside) between the scale and the mask. It becomes ``Attention``'s ``softcap``
  attribute, which onnxruntime applies, as the ONNX specification now orders it, to the
  scaled scores before the mask (a masked key stays masked, as in the matched graph). The two
  constants must agree (``softcap_agrees``). onnxruntime 1.32 caps in a pass of its own
  that made the operator 1.5-3x slower than the unfused graph on a 2-core EPYC, which the cost
  model does not price, so a capped attention is fused only when safe mode times it
  (``softcap_unpriced``).

``q``, ``kT`` (or ``k`` when the Transpose swapping its last two axes is only read here) and
``v`` are bound at the MatMul inputs: the head split (Reshape/Transpose), a rotary embedding or
a grouped-query ``repeat_kv`` (Unsqueeze/Expand/Reshape) stay outside. Native form: the
standard ``Attention`` of opset 23 (after a checked opset upgrade of an opset 18-22 model; see
``_attention_native``), which takes the un-repeated grouped-query K/V and the mask as they are.
onnxruntime's ``com.microsoft`` MultiHeadAttention/GroupQueryAttention take 3-D
``[batch, seq, hidden]`` queries (before the head split), so they would need the projections
and the head split in the match too.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._attention_native import (
    rewrite_attention,
    softcap_agrees,
    softcap_unpriced,
    swaps_last_two,
)
from graph_autofusion.patterns.library.attention_scale_mask import (
    masked_softmax_pattern,
    nan_guard,
    prescaled_matmul,
    scale_pattern,
    softmax_last_axis,
)
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule


def attention_pattern(p: PatternBuilder) -> Pattern:
    q = p.var("q")
    kt = p.Transpose(p.var("k"), perm=swaps_last_two, _label="k_transpose") | p.var("kt")
    plain_qk = p.MatMul(q, kt, _label="qk")
    scaled = scale_pattern(p, plain_qk, prescaled=prescaled_matmul(p, q, kt)) | plain_qk
    probs = masked_softmax_pattern(p, softcap_pattern(p, scaled))
    out = p.MatMul(probs, p.var("v"), _label="pv")
    return nan_guard(p, out, "out")


def softcap_pattern(p: PatternBuilder, scores: Pattern) -> Pattern:
    """``c * tanh(scores / c)`` (the division also as ``Mul`` by ``1/c``), or ``scores``."""
    inner = p.Div(scores, p.const("softcap_in", scalar=True), _label="softcap_in") | p.Mul(
        scores, p.const("softcap_in", scalar=True), _label="softcap_in"
    )
    tanh = p.Tanh(inner, _label="softcap_tanh")
    capped = p.Mul(tanh, p.const("softcap", scalar=True), _label="softcap_out")
    return p.optional(capped, scores)


_p = PatternBuilder()

RULE = FusionRule(
    "attention",
    pattern=attention_pattern(_p),
    fuse_pattern="Attention",
    native_op="Attention",
    priority=200,
    presets=("transformer", "llm"),
    checks=(softmax_last_axis, softcap_agrees),
    rewrite=rewrite_attention,
    measure_first=softcap_unpriced,
    doc=__doc__.strip().splitlines()[0],
)
