"""The standard ``Attention`` operator of opset 23 (what the attention lowering emits).

``Y = softmax(Q @ K^T * scale + mask) @ V`` over ``[batch, heads, seq, head_size]`` tensors
(or ``[batch, seq, heads * head_size]`` with ``q_num_heads``/``kv_num_heads``), with fewer
key/value heads than query heads (grouped-query attention), a boolean (True attends) or
additive mask, ``is_causal`` (upper-left aligned, offset by the past length), ``softcap``
(``c * tanh(scores / c)`` of the scaled scores, before either mask), and
``past_key``/``past_value`` concatenated in front of K/V (outputs ``present_key``/``present_value``).
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.catalog.definitions._util import shape_of, upcast
from graph_autofusion.catalog.definitions.reduction import softmax
from graph_autofusion.catalog.registry import FusionKind, OpContext, op
from graph_autofusion.ir.core import Node


def attention_flops(node: Node) -> int | None:
    """4 * batch * heads * q_seq * kv_seq * head_size (the two products)."""
    q, k = shape_of(node.inputs[0]), shape_of(node.inputs[1])
    if q is None or k is None or len(q) != 4 or len(k) != 4:
        return None
    b, h, s, d = (int(x) for x in q)
    return 4 * b * h * s * int(k[2]) * d


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    if x.ndim == 4:
        return x
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


@op("Attention", FusionKind.CONTRACTION, flops=attention_flops)
@upcast
def attention(
    ctx: OpContext, q, k, v, mask=None, past_key=None, past_value=None, *rest
) -> tuple[np.ndarray, ...] | np.ndarray:
    """softmax(Q K^T * scale + mask) V, grouped-query K/V, past K/V in front (opset 23)."""
    q4 = _heads(q, int(ctx.attr("q_num_heads", 0) or 1))
    k4 = _heads(k, int(ctx.attr("kv_num_heads", 0) or 1))
    v4 = _heads(v, int(ctx.attr("kv_num_heads", 0) or 1))
    if past_key is not None:
        k4 = np.concatenate([past_key, k4], axis=2)
    if past_value is not None:
        v4 = np.concatenate([past_value, v4], axis=2)
    present_k, present_v = k4, v4
    heads, kv_heads = q4.shape[1], k4.shape[1]
    if heads != kv_heads:
        k4 = np.repeat(k4, heads // kv_heads, axis=1)
        v4 = np.repeat(v4, heads // kv_heads, axis=1)
    scale = ctx.attr("scale", None)
    scale = 1.0 / np.sqrt(q4.shape[-1]) if scale is None else float(scale)
    scores = (q4 @ np.swapaxes(k4, -1, -2)) * np.asarray(scale, dtype=q4.dtype)
    cap = float(ctx.attr("softcap", 0.0))
    if cap > 0:  # before the masks (the ONNX specification's order; onnxruntime 1.32's)
        scores = cap * np.tanh(scores / cap)
    total, qs = k4.shape[2], q4.shape[2]
    if int(ctx.attr("is_causal", 0)):
        past = total - qs
        allowed = np.arange(total)[None, :] <= (np.arange(qs)[:, None] + past)
        scores = np.where(allowed, scores, -np.inf)
    if mask is not None:
        if mask.dtype == np.bool_:
            scores = np.where(mask, scores, -np.inf)
        else:
            scores = scores + mask
    y = softmax(scores, -1) @ v4
    if q.ndim == 3:
        b, s = q.shape[:2]
        y = y.transpose(0, 2, 1, 3).reshape(b, s, -1)
    y = y.astype(q.dtype)
    n = max(len(ctx.output_dtypes), 1)
    return (y, present_k.astype(q.dtype), present_v.astype(q.dtype))[:n] if n > 1 else y
