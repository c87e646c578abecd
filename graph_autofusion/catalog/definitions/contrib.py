"""onnxruntime contrib operators (domain ``com.microsoft``) that fusion emits.

Conventions follow onnxruntime's ContribOperators.md and are checked against onnxruntime's
CPU kernels by ``tests/test_catalog.py``.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.catalog.definitions._util import (
    attr_str,
    per_element,
    upcast,
)
from graph_autofusion.catalog.definitions.conv import conv_flops, conv_nd, conv_params
from graph_autofusion.catalog.definitions.elementwise import gelu, sigmoid
from graph_autofusion.catalog.definitions.nn import gemm, gemm_flops, matmul_flops
from graph_autofusion.catalog.registry import FusionKind, OpContext, op

MS = "com.microsoft"


def apply_activation(name: str, x: np.ndarray, params: list[float]) -> np.ndarray:
    """Activation epilogue of FusedConv / FusedGemm (ORT's MLAS activation set)."""
    if not name:
        return x
    if name == "Relu":
        return np.maximum(x, 0)
    if name == "Tanh":
        return np.tanh(x)
    if name == "Sigmoid":
        return sigmoid(x)
    if name == "LeakyRelu":
        a = params[0] if params else 0.01
        return np.where(x >= 0, x, x * np.asarray(a, dtype=x.dtype))
    if name == "Clip":
        lo, hi = (params + [-np.inf, np.inf][len(params) :])[:2]
        return np.clip(x, lo, hi).astype(x.dtype)
    if name == "HardSigmoid":
        a = params[0] if params else 0.2
        b = params[1] if len(params) > 1 else 0.5
        return np.clip(x * np.asarray(a, dtype=x.dtype) + np.asarray(b, dtype=x.dtype), 0, 1)
    raise NotImplementedError(f"fused activation {name!r} is not supported")


def _layer_norm(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float, simple: bool
):
    xs = x.astype(np.float32)
    if simple:
        mean = np.zeros(x.shape[:-1] + (1,), dtype=np.float32)
        d = xs
    else:
        mean = np.mean(xs, axis=-1, keepdims=True)
        d = xs - mean
    inv = 1.0 / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + np.float32(eps))
    y = d * inv * gamma.astype(np.float32)
    if beta is not None:
        y = y + beta.astype(np.float32)
    return y.astype(x.dtype), mean, inv


def _skip_sum(x: np.ndarray, skip: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x + skip (+ bias), computed in float32 and returned in x's dtype."""
    s = x.astype(np.float32) + skip.astype(np.float32)
    if bias is not None:
        s = s + bias.astype(np.float32)
    return s.astype(x.dtype)


@op("SkipLayerNormalization", FusionKind.NORMALIZATION, domain=MS, flops=per_element(10))
def skip_layer_norm(ctx: OpContext, x, skip, gamma, beta=None, bias=None):
    """LayerNorm(x + skip + bias) * gamma + beta; outputs Y, mean, inv_std, sum."""
    s = _skip_sum(x, skip, bias)
    y, mean, inv = _layer_norm(s, gamma, beta, float(ctx.attr("epsilon", 1e-12)), False)
    return y, mean, inv, s


@op("SkipSimplifiedLayerNormalization", FusionKind.NORMALIZATION, domain=MS, flops=per_element(8))
def skip_simplified_layer_norm(ctx: OpContext, x, skip, gamma, bias=None):
    """RMSNorm(x + skip + bias) * gamma; outputs Y, mean, inv_std, sum."""
    s = _skip_sum(x, skip, bias)
    y, mean, inv = _layer_norm(s, gamma, None, float(ctx.attr("epsilon", 1e-12)), True)
    return y, mean, inv, s


@op("Gelu", FusionKind.ELEMENTWISE, domain=MS, flops=per_element(8))
@upcast
def ms_gelu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """0.5 * x * (1 + erf(x / sqrt(2)))."""
    return gelu(x)


@op("BiasGelu", FusionKind.BROADCAST, domain=MS, flops=per_element(9))
@upcast
def bias_gelu(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Gelu(A + B) with the erf form; B is a bias over the last axis."""
    return gelu(a + b)


@op("FastGelu", FusionKind.BROADCAST, domain=MS, flops=per_element(9))
@upcast
def fast_gelu(ctx: OpContext, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Tanh-approximated GELU of X (+ bias)."""
    return gelu(x if bias is None else x + bias, "tanh")


@op("QuickGelu", FusionKind.ELEMENTWISE, domain=MS, flops=per_element(5))
@upcast
def quick_gelu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x * sigmoid(alpha * x), alpha = 1.702."""
    alpha = float(ctx.attr("alpha", 1.702))
    return x * sigmoid(x * np.asarray(alpha, dtype=x.dtype))


def _batch_transpose(a: np.ndarray, trans_batch: int, trans: int) -> np.ndarray:
    if trans_batch and a.ndim > 2:
        perm = list(range(1, a.ndim - 1)) + [0, a.ndim - 1]
        a = a.transpose(perm)
    if trans and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    return a


@op("FusedMatMul", FusionKind.CONTRACTION, domain=MS, flops=matmul_flops)
@upcast
def fused_matmul(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """alpha * op(A) @ op(B) with transA/transB and transBatchA/transBatchB."""
    a = _batch_transpose(a, int(ctx.attr("transBatchA", 0)), int(ctx.attr("transA", 0)))
    b = _batch_transpose(b, int(ctx.attr("transBatchB", 0)), int(ctx.attr("transB", 0)))
    y = np.matmul(a, b)
    alpha = float(ctx.attr("alpha", 1.0))
    return y if alpha == 1.0 else (y * np.asarray(alpha, dtype=y.dtype))


def _act_params(ctx: OpContext, names: tuple[str, ...]) -> list[float]:
    return [float(ctx.attr(n)) for n in names if ctx.attr(n) is not None]


@op("FusedGemm", FusionKind.CONTRACTION, domain=MS, flops=gemm_flops)
@upcast
def fused_gemm(ctx: OpContext, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None):
    """Gemm followed by ``activation`` (activation_alpha / _beta / _gamma)."""
    y = gemm(ctx, a, b, c)
    name = attr_str(ctx, "activation", "")
    return apply_activation(
        name, y, _act_params(ctx, ("activation_alpha", "activation_beta", "activation_gamma"))
    ).astype(y.dtype)


@op("FusedConv", FusionKind.CONTRACTION, domain=MS, flops=conv_flops)
@upcast
def fused_conv(ctx: OpContext, x, w, b=None, z=None):
    """Conv (+ Z) followed by ``activation`` with ``activation_params``."""
    strides, dil, pads = conv_params(ctx, x, w)
    y = conv_nd(x, w, b, strides, dil, pads, int(ctx.attr("group", 1)))
    if z is not None:
        y = y + z
    params = [float(p) for p in (ctx.attr("activation_params", []) or [])]
    return apply_activation(attr_str(ctx, "activation", ""), y, params).astype(x.dtype)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding of the leading ``2 * cos.shape[-1]`` features of ``x``'s last axis."""
    half = cos.shape[-1]
    rot = 2 * half
    out = np.array(x, copy=True)
    if interleaved:
        x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
        out[..., 0:rot:2] = x1 * cos - x2 * sin
        out[..., 1:rot:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:rot]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rot] = x2 * cos + x1 * sin
    return out


def _rotary(ctx: OpContext, x, pos, cos_cache, sin_cache) -> np.ndarray:
    """Shared body: x is (B, S, H) or (B, N, S, h); caches gathered at positions."""
    interleaved = bool(int(ctx.attr("interleaved", 0)))
    num_heads = int(ctx.attr("num_heads", 0))
    if x.ndim == 3:
        b, s, hidden = x.shape
        if num_heads:
            heads = num_heads
        else:
            heads = hidden // (2 * cos_cache.shape[-1])
        v = x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)
    else:
        b, _, s, _ = x.shape
        v = x
    if pos is None:
        cos, sin = cos_cache, sin_cache  # already (B, S, rot/2)
    else:
        pos = np.asarray(pos).astype(np.int64)
        if pos.size == 1 and (pos.ndim <= 1):
            pos = int(pos.reshape(-1)[0]) + np.arange(s)[None, :].repeat(b, 0)
        cos, sin = cos_cache[pos], sin_cache[pos]  # (B, S, rot/2)
    y = rotate(v, cos[:, None], sin[:, None], interleaved)
    if x.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(x.shape)
    return y.astype(x.dtype)


@op("RotaryEmbedding", FusionKind.BROADCAST, domain=MS, flops=per_element(3))
@upcast
def ms_rotary_embedding(ctx: OpContext, x, position_ids, cos_cache, sin_cache):
    """com.microsoft rotary embedding: inputs (input, position_ids, cos_cache, sin_cache)."""
    return _rotary(ctx, x, position_ids, cos_cache, sin_cache)


@op("RotaryEmbedding", FusionKind.BROADCAST, flops=per_element(3))
@upcast
def onnx_rotary_embedding(ctx: OpContext, x, cos_cache, sin_cache, position_ids=None):
    """ONNX opset-23 rotary embedding: inputs (X, cos_cache, sin_cache, position_ids?)."""
    rot_dim = int(ctx.attr("rotary_embedding_dim", 0))
    if rot_dim:
        cos_cache = cos_cache[..., : rot_dim // 2]
        sin_cache = sin_cache[..., : rot_dim // 2]
    return _rotary(ctx, x, position_ids, cos_cache, sin_cache)
