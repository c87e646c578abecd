"""RMSNorm, spelled out by an exporter (Llama, T5, Mistral):

    y = weight * (x / sqrt(mean(x^2, axis=-1, keepdims=True) + eps))

Accepted spellings: the square as ``Pow(x, 2)`` or ``Mul(x, x)``; ``ReduceMean`` over the last
axis with ``axes`` as an attribute (opset < 18) or a constant input (opset >= 18), keepdims=1;
the normalization as ``Div(x, Sqrt(.))``, ``Mul(x, Reciprocal(Sqrt(.)))`` (torch's ``rsqrt``),
``Mul(x, Div(1, Sqrt(.)))`` (torchscript) or ``Mul(x, Pow(., -0.5))``; the weight on either side
of the last ``Mul``. Optional ``Cast`` nodes around the normalization (Llama computes in
float32: ``Cast(x)`` before, ``Cast`` back to the input type before the weight) are part of
the match; an input Cast whose output is also read elsewhere stays outside. The weight is a
1-D vector. Native form, when input, weight and output share one element type and the input
Cast, if any, only widens to float32: the standard ``RMSNormalization`` of opset 23 when the
model is at opset 23 or can be raised to it unchanged (``ir/opset_upgrade``; onnxruntime's
kernel is also ~3x faster than the skip form at 128x512); otherwise
``com.microsoft.SkipSimplifiedLayerNormalization(x, x, weight, epsilon=4 * eps)``, which is the
same function (RMSNorm is scale invariant and both scalings are powers of two) and, unlike
onnxruntime's ``SimplifiedLayerNormalization`` (registered in the ONNX domain), passes
``onnx.checker``; it takes 2-D or 3-D inputs, so a per-head norm (``[B, S, H, D]``) is
reshaped to ``[-1, D]`` around it.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.opset_upgrade import ATTENTION_OPSET, upgrade_opset, upgrade_problem
from graph_autofusion.patterns.library._norm_common import (
    bound,
    casts_widen,
    reduces_last_axis,
    same_dtype,
)
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"


def rmsnorm_pattern(p: PatternBuilder, x: Pattern) -> Pattern:
    """RMSNorm of ``x`` times ``%weight`` (shared with ``skip_rmsnorm``).

    Labels: ``reduce`` (the ReduceMean), ``cast_in`` / ``cast_out`` (the optional Casts),
    ``norm`` (the root, the weight ``Mul``). Variables: ``eps``, ``weight``.
    """
    xc = p.optional(p.Cast(x, _label="cast_in"), x)
    square = p.Pow(xc, p.const("two", scalar=True, value=2.0)) | p.Mul(xc, xc)
    mean_sq = p.ReduceMean(square, keepdims=1, _exact=False, _label="reduce")
    shifted = p.Add(mean_sq, p.const("eps", scalar=True))
    root = p.Sqrt(shifted)
    one = p.const("one", scalar=True, value=1.0)
    normed = (
        p.Div(xc, root)
        | p.Mul(xc, p.Reciprocal(root))
        | p.Mul(xc, p.Div(one, root))
        | p.Mul(xc, p.Pow(shifted, p.const("neg_half", scalar=True, value=-0.5)))
    )
    back = p.optional(p.Cast(normed, _label="cast_out"), normed)
    return p.Mul(back, p.var("weight", rank=1), _label="norm")


def epsilon(ctx: RewriteContext) -> float:
    eps = ctx.const("eps")
    if eps is None:  # pragma: no cover - the pattern requires a constant
        raise RewriteError("epsilon is not a constant")
    return float(eps.reshape(-1)[0])


def _rewrite(ctx: RewriteContext):
    x, weight = bound(ctx, "x"), bound(ctx, "weight")
    casts_widen(ctx)
    same_dtype(x, weight)  # Mul(., weight) makes the output the weight's type
    if x.shape is not None and weight.shape[0] != x.shape[-1]:
        raise RewriteError(f"weight %{weight.name} {weight.shape} does not span the last axis")
    eps = epsilon(ctx)
    if upgrade_problem(ctx.model, ATTENTION_OPSET) is None:
        upgrade_opset(ctx.model, ATTENTION_OPSET)
        node = ctx.make_node(
            "RMSNormalization", [x, weight], {"axis": -1, "epsilon": eps, "stash_type": 1}
        )
        return node.outputs
    # onnxruntime's SimplifiedLayerNormalization lives in the ONNX domain, where onnx.checker
    # rejects it. RMSNorm is scale invariant: RMSNorm(x + x, eps * 4) == RMSNorm(x, eps)
    # exactly (both scalings are powers of two), so the com.microsoft skip form computes it.
    flat = x
    if x.shape is not None and len(x.shape) not in (2, 3):
        # a per-head norm ([B, S, H, D]: Qwen3's, Gemma3's q/k norms)
        cols = ctx.add_constant("rms_rows", np.array([-1, weight.shape[0]], np.int64))
        flat = ctx.make_node("Reshape", [x, cols]).outputs[0]
    node = ctx.make_node(
        "SkipSimplifiedLayerNormalization", [flat, flat, weight], {"epsilon": eps * 4.0},
        domain=MS,
    )  # fmt: skip
    if flat is x:
        return node.outputs[:1]
    shape = ctx.make_node("Shape", [x]).outputs[0]
    out = ctx.make_node("Reshape", [node.outputs[0], shape]).outputs[0]
    out.dtype, out.shape = x.dtype, x.shape
    return [out]


_p = PatternBuilder()

RULE = FusionRule(
    "rmsnorm",
    pattern=rmsnorm_pattern(_p, _p.var("x")),
    fuse_pattern="RMSNorm",
    native_op="SkipSimplifiedLayerNormalization",
    priority=180,
    presets=("llm",),
    checks=(reduces_last_axis("reduce"),),
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
