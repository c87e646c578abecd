"""ATen converters for torch's fused transformer fast path.

In eval mode without autograd, each ``nn.TransformerEncoderLayer`` (``batch_first=True``) runs
one fused ATen operator, which a Dynamo graph keeps; without this converter the graph had no
ONNX form and ran in eager. It becomes the operators the layer computes (what the ONNX
exporters write for the same layer in training mode), so the ONNX route's rules (attention,
LayerNormalization, bias-activation) see a standard layer. (``nn.MultiheadAttention``'s own
fast path, ``_native_multi_head_attention``, is not taken under Dynamo: its graph has the
decomposed attention.)

=================================================  =============================================
ATen                                               canonical (ONNX opset 20)
=================================================  =============================================
_transformer_encoder_layer_fwd                     self-attention: MatMul by the in-projection
                                                   + Add, Split in q, k, v, heads Reshape/
                                                   Transpose, MatMul(q, k^T), Mul(1/sqrt(d)),
                                                   Add(mask), Softmax, MatMul(v), merge, out-
                                                   projection; residual Add; LayerNormalization
                                                   (before each block with ``norm_first``, else
                                                   after it); MatMul + Add, Relu or Gelu,
                                                   MatMul + Add
=================================================  =============================================

Masks, as the fused kernel reads them: ``mask_type`` 0 is an ``[L, S]`` attention mask, 1 a
``[B, S]`` key-padding mask, 2 one of ``[B, H, L, S]``; a boolean mask is ``True`` where a key is
masked out (``Where(mask, -inf, 0)``, the opposite of ``scaled_dot_product_attention``'s), a
float one is added. A query whose keys are all masked gives NaN, as the fused kernel does.
"""

from __future__ import annotations

import math
from typing import Any

from graph_autofusion.frontend.aten_ops import aten_op
from graph_autofusion.frontend.aten_ops_nn import linear
from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType


def _split_heads(cx: ConvertContext, t: Value, heads: int, d: int) -> Value:
    """``[B, L, heads * d]`` -> ``[B, heads, L, d]``."""
    r = cx.op("Reshape", [t, cx.ints([0, 0, heads, d])])
    return cx.op("Transpose", [r], {"perm": [0, 2, 1, 3]})


def _mask(cx: ConvertContext, mask: Any, mask_type: int | None, dt: DType) -> Value:
    """The additive form of a fused kernel's mask, shaped to broadcast over the scores."""
    if cx.dtype(mask) == DType.BOOL:  # True: masked out
        mv = cx.op("Where", [cx.v(mask), cx.scalar(float("-inf"), dt), cx.scalar(0.0, dt)])
    else:
        mv = cx.v(mask, dt)
    if mask_type == 1:  # [B, S] key padding -> [B, 1, 1, S]
        mv = cx.op("Unsqueeze", [mv, cx.ints([1, 2])])
    return mv


def _self_attention(cx, x: Value, e: int, heads: int, wqkv, bqkv, wo, bo, mask, mask_type, dt):
    """One in-projection, split into q, k and v; scaled dot-product attention; the
    out-projection (``dt``: the input's dtype, which a symbolic-size graph may not have
    inferred on ``x``)."""
    d = e // heads
    qkv = cx.op(
        "Split", [linear(cx, x, wqkv, bqkv), cx.ints([e, e, e])], {"axis": -1}, num_outputs=3
    )
    q, k, v = (_split_heads(cx, t, heads, d) for t in qkv)
    scores = cx.op("MatMul", [q, cx.op("Transpose", [k], {"perm": [0, 1, 3, 2]})])
    scores = cx.op("Mul", [scores, cx.scalar(1.0 / math.sqrt(d), dt)])
    if mask is not None:
        scores = cx.op("Add", [scores, _mask(cx, mask, mask_type, dt)])
    probs = cx.op("Softmax", [scores], {"axis": -1})
    out = cx.op("Transpose", [cx.op("MatMul", [probs, v])], {"perm": [0, 2, 1, 3]})
    return linear(cx, cx.op("Reshape", [out, cx.ints([0, 0, e])]), wo, bo)


@aten_op("_transformer_encoder_layer_fwd.default")
def _encoder_layer(
    cx: ConvertContext,
    src,
    embed_dim: int,
    num_heads: int,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type: int | None = None,
) -> Value:
    x = cx.v(src)
    e, dt = int(embed_dim), x.dtype

    def norm(t: Value, w: Any, b: Any) -> Value:
        attrs = {"axis": -1, "epsilon": float(eps)}
        return cx.op("LayerNormalization", [t, cx.v(w), cx.v(b)], attrs)

    def attend(t: Value) -> Value:
        return _self_attention(
            cx,
            t,
            e,
            int(num_heads),
            qkv_weight,
            qkv_bias,
            proj_weight,
            proj_bias,
            mask,
            mask_type,
            dt,
        )

    def feed_forward(t: Value) -> Value:
        h = linear(cx, t, ffn_weight_1, ffn_bias_1)
        h = cx.op("Gelu", [h]) if use_gelu else cx.op("Relu", [h])
        return linear(cx, h, ffn_weight_2, ffn_bias_2)

    if norm_first:
        x = cx.op("Add", [x, attend(norm(x, norm_weight_1, norm_bias_1))])
        return cx.op("Add", [x, feed_forward(norm(x, norm_weight_2, norm_bias_2))])
    x = norm(cx.op("Add", [x, attend(x)]), norm_weight_1, norm_bias_1)
    return norm(cx.op("Add", [x, feed_forward(x)]), norm_weight_2, norm_bias_2)
