"""Reductions, Softmax-like normalizations over one axis, CumSum and TopK."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graph_autofusion.catalog.definitions._util import (
    axes_of,
    norm_axis,
    per_input_element,
    upcast,
)
from graph_autofusion.catalog.registry import FusionKind, OpContext, op

R = FusionKind.REDUCTION


def _reduce_axes(ctx: OpContext, x: np.ndarray, axes_input: np.ndarray | None) -> tuple | None:
    """Normalized reduction axes; ``None`` means the reduction is a no-op."""
    axes = axes_of(ctx, axes_input)
    if not axes:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            return None
        return tuple(range(x.ndim))
    return tuple(sorted(norm_axis(a, x.ndim) for a in axes))


def _reduction(name: str, fn: Callable[[np.ndarray, tuple, bool], np.ndarray], k: int = 1) -> None:
    @op(name, R, flops=per_input_element(k))
    @upcast
    def ref(ctx: OpContext, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        ax = _reduce_axes(ctx, x, axes)
        if ax is None:
            return x
        keep = bool(int(ctx.attr("keepdims", 1)))
        return np.asarray(fn(x, ax, keep)).astype(x.dtype, copy=False)

    ref.__doc__ = f"{name} over ``axes`` (attribute or input), keepdims = 1."


def _logsumexp(x: np.ndarray, ax: tuple, keep: bool) -> np.ndarray:
    m = np.max(x, axis=ax, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    s = np.log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
    return s if keep else np.squeeze(s, axis=ax)


_reduction("ReduceSum", lambda x, a, k: np.sum(x, axis=a, keepdims=k))
_reduction("ReduceMean", lambda x, a, k: np.mean(x, axis=a, keepdims=k))
_reduction("ReduceMax", lambda x, a, k: np.max(x, axis=a, keepdims=k))
_reduction("ReduceMin", lambda x, a, k: np.min(x, axis=a, keepdims=k))
_reduction("ReduceProd", lambda x, a, k: np.prod(x, axis=a, keepdims=k))
_reduction("ReduceL1", lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k), 2)
_reduction("ReduceL2", lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)), 2)
_reduction("ReduceSumSquare", lambda x, a, k: np.sum(x * x, axis=a, keepdims=k), 2)
_reduction("ReduceLogSum", lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)), 1)
_reduction("ReduceLogSumExp", _logsumexp, 3)


def _arg(name: str, fn: Callable) -> None:
    @op(name, R, flops=per_input_element(1))
    def ref(ctx: OpContext, x: np.ndarray) -> np.ndarray:
        axis = norm_axis(int(ctx.attr("axis", 0)), x.ndim)
        keep = bool(int(ctx.attr("keepdims", 1)))
        if int(ctx.attr("select_last_index", 0)):
            flipped = np.flip(x, axis=axis)
            idx = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(x, axis=axis)
        idx = idx.astype(np.int64)
        return np.expand_dims(idx, axis) if keep else idx

    ref.__doc__ = f"{name} along ``axis`` (int64 indices)."


_arg("ArgMax", np.argmax)
_arg("ArgMin", np.argmin)


def _softmax_axis(ctx: OpContext, x: np.ndarray) -> tuple[np.ndarray, int, tuple]:
    """Input viewed so softmax runs over one axis (opset < 13 flattens to 2-D)."""
    if ctx.opset is not None and ctx.opset < 13:
        axis = norm_axis(int(ctx.attr("axis", 1)), x.ndim)
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        return x.reshape(rows, -1), 1, x.shape
    return x, norm_axis(int(ctx.attr("axis", -1)), x.ndim), x.shape


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Numerically stable softmax along ``axis``."""
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


@op("Softmax", FusionKind.NORMALIZATION, flops=per_input_element(5))
@upcast
def softmax_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """exp(x) / sum(exp(x)) along ``axis`` (default -1 at opset >= 13)."""
    v, axis, shape = _softmax_axis(ctx, x)
    return softmax(v, axis).reshape(shape).astype(x.dtype, copy=False)


@op("LogSoftmax", FusionKind.NORMALIZATION, flops=per_input_element(5))
@upcast
def log_softmax(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x - log(sum(exp(x))) along ``axis``."""
    v, axis, shape = _softmax_axis(ctx, x)
    m = np.max(v, axis=axis, keepdims=True)
    s = v - m
    y = s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))
    return y.reshape(shape).astype(x.dtype, copy=False)


@op("Hardmax", FusionKind.NORMALIZATION, flops=per_input_element(1))
def hardmax(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """One-hot of the first maximum along ``axis``."""
    v, axis, shape = _softmax_axis(ctx, x)
    idx = np.expand_dims(np.argmax(v, axis=axis), axis)
    out = np.zeros_like(v)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out.reshape(shape)


@op("CumSum", FusionKind.OPAQUE, flops=per_input_element(1))
@upcast
def cumsum(ctx: OpContext, x: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Cumulative sum along ``axis`` (input), optionally exclusive and/or reversed."""
    ax = norm_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim)
    v = np.flip(x, ax) if int(ctx.attr("reverse", 0)) else x
    y = np.cumsum(v, axis=ax, dtype=x.dtype)
    if int(ctx.attr("exclusive", 0)):
        y = np.roll(y, 1, axis=ax)
        y[(slice(None),) * ax + (0,)] = 0
    if int(ctx.attr("reverse", 0)):
        y = np.flip(y, ax)
    return np.ascontiguousarray(y)


@op("TopK", FusionKind.OPAQUE, flops=per_input_element(1))
@upcast
def topk(ctx: OpContext, x: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest (or smallest) elements along ``axis`` and their int64 indices."""
    kk = int(np.asarray(k).reshape(-1)[0])
    axis = norm_axis(int(ctx.attr("axis", -1)), x.ndim)
    largest = int(ctx.attr("largest", 1))
    keyed = x.astype(np.int64) if np.issubdtype(x.dtype, np.unsignedinteger) else x
    order = np.argsort(-keyed if largest else keyed, axis=axis, kind="stable")
    idx = np.take(order, np.arange(kk), axis=axis)
    vals = np.take_along_axis(x, idx, axis=axis)
    return vals, idx.astype(np.int64)
