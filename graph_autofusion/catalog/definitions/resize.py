"""Resize (nearest, linear, cubic; separable, one axis at a time)."""

from __future__ import annotations

import math

import numpy as np

from graph_autofusion.catalog.definitions._util import attr_ints, attr_str, norm_axis, per_element
from graph_autofusion.catalog.registry import FusionKind, OpContext, op


def _source_coords(mode: str, out: int, inn: int, scale: float) -> np.ndarray:
    """Input coordinate of every output index under ``coordinate_transformation_mode``."""
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return np.zeros(out) if out == 1 else x * (inn - 1) / (out - 1)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adj = out / (scale * inn)
        center = inn / 2.0
        return center * (1 - adj) + (x + 0.5) / scale - 0.5
    raise NotImplementedError(f"Resize coordinate_transformation_mode {mode!r} is not supported")


def _nearest_index(c: np.ndarray, mode: str, inn: int) -> np.ndarray:
    if mode == "round_prefer_floor":
        idx = np.where(c - np.floor(c) == 0.5, np.floor(c), np.round(c))
    elif mode == "round_prefer_ceil":
        idx = np.where(c - np.floor(c) == 0.5, np.ceil(c), np.round(c))
    elif mode == "floor":
        idx = np.floor(c)
    elif mode == "ceil":
        idx = np.ceil(c)
    else:
        raise NotImplementedError(f"Resize nearest_mode {mode!r} is not supported")
    return np.clip(idx, 0, inn - 1).astype(np.int64)


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic weights for offsets -1, 0, 1, 2 around floor(c); t in [0, 1)."""

    def k(d: np.ndarray) -> np.ndarray:
        d = np.abs(d)
        return np.where(
            d <= 1,
            ((a + 2) * d - (a + 3)) * d * d + 1,
            np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
        )

    return np.stack([k(t + 1), k(t), k(1 - t), k(2 - t)], axis=-1)


def _resize_axis(x: np.ndarray, axis: int, out: int, scale: float, ctx: OpContext) -> np.ndarray:
    inn = x.shape[axis]
    mode = attr_str(ctx, "mode", "nearest")
    c = _source_coords(
        attr_str(ctx, "coordinate_transformation_mode", "half_pixel"), out, inn, scale
    )
    shape = [1] * x.ndim
    shape[axis] = out
    if mode == "nearest":
        idx = _nearest_index(c, attr_str(ctx, "nearest_mode", "round_prefer_floor"), inn)
        return np.take(x, idx, axis=axis)
    if mode == "linear":
        c = np.clip(c, 0, inn - 1)
        i0 = np.floor(c).astype(np.int64)
        i1 = np.minimum(i0 + 1, inn - 1)
        w = (c - i0).reshape(shape)
        a, b = np.take(x, i0, axis=axis), np.take(x, i1, axis=axis)
        return a + (b - a) * w.astype(x.dtype)
    if mode == "cubic":
        a_coef = float(ctx.attr("cubic_coeff_a", -0.75))
        f = np.floor(c)
        w = _cubic_weights(c - f, a_coef)  # (out, 4)
        taps = f.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
        if int(ctx.attr("exclude_outside", 0)):
            w = np.where((taps >= 0) & (taps < inn), w, 0.0)
            w = w / np.sum(w, axis=1, keepdims=True)
        taps = np.clip(taps, 0, inn - 1)
        y = 0
        for j in range(4):
            y = y + np.take(x, taps[:, j], axis=axis) * w[:, j].reshape(shape).astype(x.dtype)
        return y
    raise NotImplementedError(f"Resize mode {mode!r} is not supported")


@op("Resize", FusionKind.INJECTIVE, flops=per_element(4))
def resize(
    ctx: OpContext,
    x: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
) -> np.ndarray:
    """Resize by ``scales`` or to ``sizes`` (opset 11+; ``axes`` of opset 18)."""
    if attr_str(ctx, "coordinate_transformation_mode", "") == "tf_crop_and_resize":
        raise NotImplementedError("Resize tf_crop_and_resize is not supported")
    if int(ctx.attr("antialias", 0)):
        raise NotImplementedError("Resize antialias=1 is not supported")
    axes = [norm_axis(a, x.ndim) for a in (attr_ints(ctx, "axes") or range(x.ndim))]
    if sizes is not None and np.asarray(sizes).size:
        outs = [int(s) for s in np.asarray(sizes).reshape(-1)]
        sc = [o / x.shape[a] for o, a in zip(outs, axes)]
        policy = attr_str(ctx, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = min(sc) if policy == "not_larger" else max(sc)
            sc = [s] * len(axes)
            outs = [int(math.floor(s * x.shape[a] + 0.5)) for a in axes]
    else:
        sc = [float(s) for s in np.asarray(scales).reshape(-1)]
        outs = [int(math.floor(x.shape[a] * s)) for a, s in zip(axes, sc)]
    work = x.astype(np.float32) if x.dtype == np.float16 else x
    for a, o, s in zip(axes, outs, sc):
        if o != work.shape[a] or s != 1.0:
            work = _resize_axis(work, a, o, s, ctx)
    return np.asarray(work).astype(x.dtype, copy=False)
