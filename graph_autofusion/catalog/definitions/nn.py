"""Contractions (MatMul, Gemm, Einsum) and normalization layers."""

from __future__ import annotations

import numpy as np

from graph_autofusion.catalog.definitions._util import (
    attr_ints,
    attr_str,
    norm_axis,
    numel,
    out_numel,
    per_input_element,
    shape_of,
    upcast,
)
from graph_autofusion.catalog.registry import FusionKind, OpContext, op
from graph_autofusion.ir.core import Node

C = FusionKind.CONTRACTION
N = FusionKind.NORMALIZATION


def matmul_flops(node: Node) -> int | None:
    """2 * M * N * K * batch = 2 * numel(Y) * K."""
    a = shape_of(node.inputs[0])
    n = out_numel(node)
    if a is None or n is None:
        return None
    return 2 * n * int(a[-1])


def gemm_flops(node: Node) -> int | None:
    """2 * M * N * K, plus M * N when the bias C is present."""
    a = shape_of(node.inputs[0])
    n = out_numel(node)
    if a is None or n is None:
        return None
    k = int(a[0] if int(node.attr("transA", 0)) else a[-1])
    bias = len(node.inputs) > 2 and node.inputs[2] is not None
    return 2 * n * k + (n if bias else 0)


@op("MatMul", C, flops=matmul_flops)
@upcast
def matmul(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy matmul semantics (batched, 1-D operands promoted)."""
    return np.matmul(a, b)


@op("Gemm", C, flops=gemm_flops)
@upcast
def gemm(ctx: OpContext, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C."""
    alpha = float(ctx.attr("alpha", 1.0))
    beta = float(ctx.attr("beta", 1.0))
    if int(ctx.attr("transA", 0)):
        a = a.T
    if int(ctx.attr("transB", 0)):
        b = b.T
    y = a @ b
    if alpha != 1.0:
        y = y * np.asarray(alpha, dtype=y.dtype)
    if c is not None and beta != 0.0:
        y = y + (c if beta == 1.0 else c * np.asarray(beta, dtype=c.dtype))
    return y.astype(a.dtype, copy=False)


def einsum_flops(node: Node) -> int | None:
    """2 * product of every distinct index extent (a dense contraction)."""
    eq = node.attr("equation", "")
    eq = eq.decode() if isinstance(eq, bytes) else eq
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, v in zip(lhs, node.inputs):
        s = shape_of(v)
        if s is None or "..." in term:
            return None
        for ch, d in zip(term, s):
            sizes[ch] = d
    return 2 * int(np.prod(list(sizes.values()), dtype=np.int64))


@op("Einsum", C, flops=einsum_flops)
@upcast
def einsum(ctx: OpContext, *xs: np.ndarray) -> np.ndarray:
    """Einstein summation over ``equation``."""
    eq = attr_str(ctx, "equation", "").replace(" ", "")
    return np.asarray(np.einsum(eq, *xs, optimize=True)).astype(xs[0].dtype, copy=False)


# ----- normalizations ---------------------------------------------------------------------


def _bcast_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    """Per-channel (axis 1) parameter shaped to broadcast against an ``ndim`` tensor."""
    return p.reshape((1, -1) + (1,) * (ndim - 2))


@op("BatchNormalization", N, flops=per_input_element(2))
@upcast
def batch_norm(
    ctx: OpContext,
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
) -> np.ndarray:
    """Inference batch norm: (x - mean) / sqrt(var + eps) * scale + bias per channel."""
    if int(ctx.attr("training_mode", 0)):
        raise NotImplementedError("BatchNormalization with training_mode=1 is not supported")
    eps = float(ctx.attr("epsilon", 1e-5))
    k = scale / np.sqrt(var + np.asarray(eps, dtype=var.dtype))
    y = x * _bcast_channel(k, x.ndim) + _bcast_channel(bias - mean * k, x.ndim)
    return y.astype(x.dtype, copy=False)


def _normalize(x: np.ndarray, axes: tuple, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + np.asarray(eps, dtype=var.dtype))
    return d * inv, mean, inv


@op("InstanceNormalization", N, flops=per_input_element(7))
@upcast
def instance_norm(ctx: OpContext, x: np.ndarray, scale: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Normalize each (n, c) over the spatial axes, then per-channel scale and bias."""
    eps = float(ctx.attr("epsilon", 1e-5))
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), eps)
    return (y * _bcast_channel(scale, x.ndim) + _bcast_channel(b, x.ndim)).astype(x.dtype)


def _stash_dtype(ctx: OpContext) -> np.dtype:
    return np.dtype(np.float32) if int(ctx.attr("stash_type", 1)) == 1 else np.dtype(np.float64)


@op("LayerNormalization", N, flops=per_input_element(8))
def layer_norm(
    ctx: OpContext, x: np.ndarray, scale: np.ndarray, b: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalize over axes [axis, rank); outputs Y, Mean and InvStdDev (stash_type)."""
    axis = norm_axis(int(ctx.attr("axis", -1)), x.ndim)
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = _stash_dtype(ctx)
    y, mean, inv = _normalize(x.astype(stash), tuple(range(axis, x.ndim)), eps)
    y = y * scale.astype(stash)
    if b is not None:
        y = y + b.astype(stash)
    return y.astype(x.dtype), mean.astype(stash), inv.astype(stash)


@op("SimplifiedLayerNormalization", N, flops=per_input_element(5))
@op("RMSNormalization", N, flops=per_input_element(5))
def rms_norm(
    ctx: OpContext, x: np.ndarray, scale: np.ndarray, *rest: np.ndarray | None
) -> np.ndarray | tuple[np.ndarray, ...]:
    """x / sqrt(mean(x^2 over [axis, rank)) + eps) * scale (RMSNorm, opset 23 / ORT)."""
    axis = norm_axis(int(ctx.attr("axis", -1)), x.ndim)
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = _stash_dtype(ctx)
    xs = x.astype(stash)
    ms = np.mean(xs * xs, axis=tuple(range(axis, x.ndim)), keepdims=True)
    inv = 1.0 / np.sqrt(ms + np.asarray(eps, dtype=stash))
    y = (xs * inv * scale.astype(stash)).astype(x.dtype)
    if len(ctx.output_dtypes) > 1:
        return (y, inv.astype(stash))[: len(ctx.output_dtypes)]
    return y


@op("GroupNormalization", N, flops=per_input_element(8))
@upcast
def group_norm(ctx: OpContext, x: np.ndarray, scale: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Normalize channel groups; scale/bias per channel (opset 21) or per group (opset 18)."""
    g = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    n, c = x.shape[:2]
    xg = x.reshape(n, g, -1)
    y, _, _ = _normalize(xg, (2,), eps)
    y = y.reshape(x.shape)
    if scale.size == g and g != c:
        scale = np.repeat(scale, c // g)
        b = np.repeat(b, c // g)
    return (y * _bcast_channel(scale, x.ndim) + _bcast_channel(b, x.ndim)).astype(x.dtype)


@op("LpNormalization", N, flops=per_input_element(3))
@upcast
def lp_norm(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x / ||x||_p along ``axis`` (p = 1 or 2)."""
    axis = int(ctx.attr("axis", -1))
    p = int(ctx.attr("p", 2))
    if p == 1:
        nrm = np.sum(np.abs(x), axis=axis, keepdims=True)
    else:
        nrm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    return (x / np.where(nrm == 0, 1, nrm)).astype(x.dtype)


@op("MeanVarianceNormalization", N, flops=per_input_element(7))
@upcast
def mvn(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """(x - mean) / sqrt(var) over ``axes`` (default [0, 2, 3]); epsilon 1e-9."""
    axes = tuple(attr_ints(ctx, "axes", [0, 2, 3]) or [])
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    std = np.sqrt(np.mean(d * d, axis=axes, keepdims=True))
    return (d / (std + np.asarray(1e-9, dtype=x.dtype))).astype(x.dtype)


def numel_or_none(node: Node) -> int | None:
    return numel(node.inputs[0]) if node.inputs else None
