"""Convolution (im2col + matmul), transposed convolution and pooling, any spatial rank."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from graph_autofusion.catalog.definitions._util import (
    attr_ints,
    attr_str,
    out_numel,
    per_element,
    per_input_element,
    shape_of,
    upcast,
)
from graph_autofusion.catalog.registry import FusionKind, OpContext, op
from graph_autofusion.ir.core import Node


def conv_pads(
    ctx: OpContext, in_sizes: tuple[int, ...], kernel: list[int], strides: list[int], dil: list[int]
) -> list[int]:
    """Begin pads then end pads, resolving ``auto_pad``."""
    nd = len(kernel)
    auto = attr_str(ctx, "auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for i in range(nd):
            eff = (kernel[i] - 1) * dil[i] + 1
            out = -(-in_sizes[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + eff - in_sizes[i])
            small = total // 2
            begins.append(small if auto == "SAME_UPPER" else total - small)
            ends.append(total - begins[-1])
        return begins + ends
    if auto == "VALID":
        return [0] * (2 * nd)
    return attr_ints(ctx, "pads", [0] * (2 * nd)) or [0] * (2 * nd)


def _windows(xp: np.ndarray, kernel: list[int], strides: list[int], dil: list[int]) -> np.ndarray:
    """View (N, C, *out, *kernel) of a padded input."""
    nd = len(kernel)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    win = sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    sl = (slice(None), slice(None))
    sl += tuple(slice(None, None, s) for s in strides)
    sl += tuple(slice(None, None, d) for d in dil)
    return win[sl]


def conv_nd(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    strides: list[int],
    dil: list[int],
    pads: list[int],
    group: int,
) -> np.ndarray:
    """N-D grouped convolution by im2col and one (batched) matmul."""
    n, c = x.shape[:2]
    m = w.shape[0]
    kernel = list(w.shape[2:])
    nd = len(kernel)
    if any(pads):
        x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    if all(k == 1 for k in kernel) and group == 1:
        xs = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
        y = np.einsum("nc...,mc->nm...", xs, w.reshape(m, c), optimize=True)
    else:
        win = _windows(x, kernel, strides, dil)
        outs = win.shape[2 : 2 + nd]
        cg, mg = c // group, m // group
        k = int(np.prod(kernel))
        p = int(np.prod(outs))
        win = win.reshape((n, group, cg) + outs + tuple(kernel))
        perm = (1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
        cols = win.transpose(perm).reshape(group, n * p, cg * k)
        wm = w.reshape(group, mg, cg * k).transpose(0, 2, 1)
        y = np.matmul(cols, wm)  # (group, n * p, mg)
        y = y.reshape((group, n) + outs + (mg,))
        y = y.transpose((1, 0, 2 + nd, *range(2, 2 + nd))).reshape((n, m) + outs)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return np.ascontiguousarray(y, dtype=x.dtype)


def conv_flops(node: Node) -> int | None:
    """2 * numel(Y) * (C_in / group) * prod(kernel)."""
    w = shape_of(node.inputs[1])
    n = out_numel(node)
    if w is None or n is None:
        return None
    return 2 * n * int(w[1]) * int(np.prod(w[2:], dtype=np.int64))


def conv_params(ctx: OpContext, x: np.ndarray, w: np.ndarray) -> tuple[list[int], ...]:
    nd = w.ndim - 2
    kernel = attr_ints(ctx, "kernel_shape") or list(w.shape[2:])
    strides = attr_ints(ctx, "strides", [1] * nd) or [1] * nd
    dil = attr_ints(ctx, "dilations", [1] * nd) or [1] * nd
    pads = conv_pads(ctx, x.shape[2:], kernel, strides, dil)
    return strides, dil, pads


@op("Conv", FusionKind.CONTRACTION, flops=conv_flops)
@upcast
def conv(ctx: OpContext, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """N-D convolution (NCHW, weights M x C/group x k...), pads/strides/dilations/group."""
    strides, dil, pads = conv_params(ctx, x, w)
    return conv_nd(x, w, b, strides, dil, pads, int(ctx.attr("group", 1)))


def conv_transpose_flops(node: Node) -> int | None:
    """2 * numel(X) * (C_out / group) * prod(kernel)."""
    w = shape_of(node.inputs[1])
    x = shape_of(node.inputs[0])
    if w is None or x is None:
        return None
    return 2 * int(np.prod(x)) * int(w[1]) * int(np.prod(w[2:], dtype=np.int64))


@op("ConvTranspose", FusionKind.CONTRACTION, flops=conv_transpose_flops)
@upcast
def conv_transpose(
    ctx: OpContext, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None
) -> np.ndarray:
    """Transposed convolution (weights C x M/group x k...), col2im by kernel position."""
    n, c = x.shape[:2]
    nd = x.ndim - 2
    group = int(ctx.attr("group", 1))
    kernel = attr_ints(ctx, "kernel_shape") or list(w.shape[2:])
    strides = attr_ints(ctx, "strides", [1] * nd) or [1] * nd
    dil = attr_ints(ctx, "dilations", [1] * nd) or [1] * nd
    opad = attr_ints(ctx, "output_padding", [0] * nd) or [0] * nd
    out_shape = attr_ints(ctx, "output_shape")
    auto = attr_str(ctx, "auto_pad", "NOTSET")
    ins = x.shape[2:]
    full = [(ins[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 + opad[i] for i in range(nd)]
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = out_shape[-nd:] if out_shape else [ins[i] * strides[i] for i in range(nd)]
        pads = [0] * (2 * nd)
        for i in range(nd):
            total = full[i] - target[i]
            half = total // 2
            if auto == "SAME_UPPER":
                pads[i], pads[i + nd] = half, total - half
            else:
                pads[i], pads[i + nd] = total - half, half
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    else:
        pads = attr_ints(ctx, "pads", [0] * (2 * nd)) or [0] * (2 * nd)
    mg = w.shape[1]
    cg = c // group
    y = np.zeros((n, mg * group, *full), dtype=np.float32 if x.dtype != np.float64 else x.dtype)
    xm = np.moveaxis(x, 1, -1)  # (N, *ins, C)
    for g in range(group):
        wg = w[g * cg : (g + 1) * cg].reshape(cg, -1)  # (cg, mg * prod(k))
        cols = xm[..., g * cg : (g + 1) * cg] @ wg  # (N, *ins, mg * prod(k))
        cols = cols.reshape((n, *ins, mg, *kernel))
        for pos in np.ndindex(*kernel):
            sl = tuple(
                slice(pos[i] * dil[i], pos[i] * dil[i] + (ins[i] - 1) * strides[i] + 1, strides[i])
                for i in range(nd)
            )
            contrib = np.moveaxis(cols[(Ellipsis, *pos)], -1, 1)  # (N, mg, *ins)
            y[(slice(None), slice(g * mg, (g + 1) * mg), *sl)] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[i + nd]) for i in range(nd))
    y = y[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return np.ascontiguousarray(y, dtype=x.dtype)


# ----- pooling ------------------------------------------------------------------------------


def _pool_geometry(ctx: OpContext, x: np.ndarray) -> tuple[list[int], ...]:
    """kernel, strides, dilations, begin pads, end pads (grown for ceil_mode), ceil extra."""
    kernel = attr_ints(ctx, "kernel_shape") or []
    nd = len(kernel)
    strides = attr_ints(ctx, "strides", [1] * nd) or [1] * nd
    dil = attr_ints(ctx, "dilations", [1] * nd) or [1] * nd
    pads = conv_pads(ctx, x.shape[2:], kernel, strides, dil)
    begins, ends = pads[:nd], pads[nd:]
    extra = [0] * nd
    if int(ctx.attr("ceil_mode", 0)):
        for i in range(nd):
            eff = (kernel[i] - 1) * dil[i] + 1
            span = x.shape[2 + i] + begins[i] + ends[i] - eff
            out = math.ceil(span / strides[i]) + 1
            if (out - 1) * strides[i] >= x.shape[2 + i] + begins[i]:
                out -= 1
            extra[i] = max(0, (out - 1) * strides[i] + eff - (x.shape[2 + i] + begins[i] + ends[i]))
    return kernel, strides, dil, begins, [e + x_ for e, x_ in zip(ends, extra)], extra


@op("MaxPool", FusionKind.REDUCTION, flops=per_element(1))
@upcast
def max_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Max over sliding windows (pads, strides, dilations, ceil_mode); optional Indices."""
    kernel, strides, dil, begins, ends, _ = _pool_geometry(ctx, x)
    nd = len(kernel)
    fill = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    xp = np.pad(
        x,
        [(0, 0), (0, 0)] + [(begins[i], ends[i]) for i in range(nd)],
        constant_values=fill,
    )
    win = _windows(xp, kernel, strides, dil)
    axes = tuple(range(2 + nd, 2 + 2 * nd))
    y = np.max(win, axis=axes)
    if len(ctx.output_dtypes) < 2:
        return y
    flat = win.reshape(win.shape[: 2 + nd] + (-1,))
    arg = np.argmax(flat, axis=-1)
    kpos = np.unravel_index(arg, kernel)
    n, c = x.shape[:2]
    sp = x.shape[2:]
    outs = y.shape[2:]
    grids = np.meshgrid(*[np.arange(o) for o in outs], indexing="ij")
    coords = [grids[i] * strides[i] - begins[i] + kpos[i] * dil[i] for i in range(nd)]
    if int(ctx.attr("storage_order", 0)):
        lin = np.zeros_like(arg)
        for i in range(nd):  # column-major over the spatial dims
            lin = lin + coords[i] * int(np.prod(sp[:i], dtype=np.int64))
    else:
        lin = np.ravel_multi_index(coords, sp)
    base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * int(np.prod(sp))
    return y, (lin + base.reshape((n, c) + (1,) * nd)).astype(np.int64)


@op("AveragePool", FusionKind.REDUCTION, flops=per_input_element(1))
@upcast
def average_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Mean over sliding windows; ``count_include_pad`` counts explicit pads."""
    kernel, strides, dil, begins, ends, extra = _pool_geometry(ctx, x)
    nd = len(kernel)
    padw = [(0, 0), (0, 0)] + [(begins[i], ends[i]) for i in range(nd)]
    xp = np.pad(x, padw)
    axes = tuple(range(2 + nd, 2 + 2 * nd))
    s = np.sum(_windows(xp, kernel, strides, dil), axis=axes)
    if int(ctx.attr("count_include_pad", 0)):
        mask = np.ones([x.shape[2 + i] + begins[i] + ends[i] - extra[i] for i in range(nd)])
        mask = np.pad(mask, [(0, e) for e in extra])
    else:
        mask = np.pad(np.ones(x.shape[2:]), [(begins[i], ends[i]) for i in range(nd)])
    cnt = np.sum(_windows(mask[None, None], kernel, strides, dil), axis=axes)
    return (s / cnt).astype(x.dtype)


@op("GlobalAveragePool", FusionKind.REDUCTION, flops=per_input_element(1))
@upcast
def global_average_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Mean over all spatial axes, kept as size-1 dims."""
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)


@op("GlobalMaxPool", FusionKind.REDUCTION, flops=per_input_element(1))
def global_max_pool(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Max over all spatial axes, kept as size-1 dims."""
    return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)
