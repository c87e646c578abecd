"""Data-movement operators: concatenation, splitting, gathers, scatters, tiling, padding."""

from __future__ import annotations

import numpy as np

from graph_autofusion.catalog.definitions._util import attr_ints, attr_str, norm_axis, zero_flops
from graph_autofusion.catalog.registry import FusionKind, OpContext, op

DM = FusionKind.DATA_MOVEMENT


def _wrap(idx: np.ndarray, dim: int | np.ndarray) -> np.ndarray:
    idx = np.asarray(idx).astype(np.int64, copy=False)
    return np.where(idx < 0, idx + dim, idx)


@op("Concat", DM, flops=zero_flops)
def concat(ctx: OpContext, *xs: np.ndarray) -> np.ndarray:
    """Join along ``axis``."""
    arrays = [x for x in xs if x is not None]
    axis = norm_axis(int(ctx.attr("axis")), arrays[0].ndim)
    return np.concatenate(arrays, axis=axis)


@op("Split", DM, flops=zero_flops)
def split(ctx: OpContext, x: np.ndarray, sizes: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Split along ``axis`` by ``split`` sizes (input or attribute) or into equal parts."""
    axis = norm_axis(int(ctx.attr("axis", 0)), x.ndim)
    dim = x.shape[axis]
    if sizes is not None:
        parts = [int(s) for s in np.asarray(sizes).reshape(-1)]
    elif ctx.attr("split") is not None:
        parts = attr_ints(ctx, "split") or []
    else:
        n = int(ctx.attr("num_outputs", 0)) or len(ctx.output_dtypes)
        chunk = -(-dim // n)
        parts = [min(chunk, max(0, dim - i * chunk)) for i in range(n)]
    bounds = np.cumsum(parts)[:-1]
    return tuple(np.split(x, bounds, axis=axis))


@op("Gather", DM, flops=zero_flops)
def gather(ctx: OpContext, data: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Take ``indices`` (negative wrap) along ``axis``."""
    axis = norm_axis(int(ctx.attr("axis", 0)), data.ndim)
    return np.take(data, _wrap(indices, data.shape[axis]), axis=axis)


@op("GatherElements", DM, flops=zero_flops)
def gather_elements(ctx: OpContext, data: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """out[i][j] = data[indices[i][j]][j] (for axis 0), like take_along_axis."""
    axis = norm_axis(int(ctx.attr("axis", 0)), data.ndim)
    grids = list(np.indices(indices.shape, sparse=True))
    grids[axis] = _wrap(indices, data.shape[axis])
    return data[tuple(grids)]


@op("GatherND", DM, flops=zero_flops)
def gather_nd(ctx: OpContext, data: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Gather slices addressed by the last axis of ``indices`` (with ``batch_dims``)."""
    b = int(ctx.attr("batch_dims", 0))
    batch = data.shape[:b]
    nb = int(np.prod(batch, dtype=np.int64))
    k = indices.shape[-1]
    d = data.reshape((nb,) + data.shape[b:])
    idx = indices.reshape((nb, -1, k))
    idx = _wrap(idx, np.asarray(data.shape[b : b + k]))
    bi = np.arange(nb)[:, None]
    out = d[(bi, *[idx[..., i] for i in range(k)])]
    return out.reshape(indices.shape[:-1] + data.shape[b + k :])


def _scatter_apply(out: np.ndarray, index: tuple, upd: np.ndarray, reduction: str) -> None:
    if reduction == "none":
        out[index] = upd
    elif reduction == "add":
        np.add.at(out, index, upd)
    elif reduction == "mul":
        np.multiply.at(out, index, upd)
    elif reduction == "max":
        np.maximum.at(out, index, upd)
    elif reduction == "min":
        np.minimum.at(out, index, upd)
    else:
        raise ValueError(f"unknown scatter reduction {reduction!r}")


@op("ScatterND", DM, flops=zero_flops)
def scatter_nd(
    ctx: OpContext, data: np.ndarray, indices: np.ndarray, updates: np.ndarray
) -> np.ndarray:
    """Copy of ``data`` with slices at ``indices`` replaced (or reduced) by ``updates``."""
    out = np.array(data, copy=True)
    k = indices.shape[-1]
    idx = _wrap(indices.reshape(-1, k), np.asarray(data.shape[:k]))
    upd = updates.reshape((idx.shape[0],) + data.shape[k:])
    _scatter_apply(out, tuple(idx[:, i] for i in range(k)), upd, attr_str(ctx, "reduction", "none"))
    return out


@op("ScatterElements", DM, flops=zero_flops)
def scatter_elements(
    ctx: OpContext, data: np.ndarray, indices: np.ndarray, updates: np.ndarray
) -> np.ndarray:
    """Copy of ``data`` with ``updates`` written at ``indices`` along ``axis``."""
    axis = norm_axis(int(ctx.attr("axis", 0)), data.ndim)
    out = np.array(data, copy=True)
    idx = _wrap(indices, data.shape[axis])
    grids = list(np.indices(idx.shape, sparse=True))
    grids[axis] = idx
    _scatter_apply(out, tuple(grids), updates, attr_str(ctx, "reduction", "none"))
    return out


@op("Tile", DM, flops=zero_flops)
def tile(ctx: OpContext, x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    """Repeat ``x`` ``repeats[i]`` times along each axis."""
    return np.tile(x, [int(r) for r in np.asarray(repeats).reshape(-1)])


@op("Pad", DM, flops=zero_flops)
def pad(
    ctx: OpContext,
    x: np.ndarray,
    pads: np.ndarray | None = None,
    value: np.ndarray | None = None,
    axes: np.ndarray | None = None,
) -> np.ndarray:
    """Pad (negative pads crop) in mode constant, reflect, edge or wrap."""
    p = (
        [int(v) for v in np.asarray(pads).reshape(-1)]
        if pads is not None
        else attr_ints(ctx, "pads")
    )
    p = p or []
    ax = list(range(x.ndim)) if axes is None else [norm_axis(int(a), x.ndim) for a in axes]
    n = len(ax)
    begin = [0] * x.ndim
    end = [0] * x.ndim
    for i, a in enumerate(ax):
        begin[a], end[a] = p[i], p[i + n]
    # Negative pads crop first.
    crop = tuple(
        slice(max(0, -b), x.shape[i] - max(0, -e)) for i, (b, e) in enumerate(zip(begin, end))
    )
    x = x[crop]
    widths = [(max(0, b), max(0, e)) for b, e in zip(begin, end)]
    mode = attr_str(ctx, "mode", "constant")
    if mode == "constant":
        if value is not None and np.asarray(value).size:
            cv = np.asarray(value).reshape(-1)[0]
        else:
            cv = ctx.attr("value", 0)
        return np.pad(x, widths, mode="constant", constant_values=cv)
    np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    return np.pad(x, widths, mode=np_mode)


@op("Compress", DM, flops=zero_flops)
def compress(ctx: OpContext, x: np.ndarray, cond: np.ndarray) -> np.ndarray:
    """Select slices where ``condition`` is true along ``axis`` (flattened if no axis)."""
    axis = ctx.attr("axis", None)
    c = np.asarray(cond).astype(bool)
    if axis is None:
        return np.compress(c, x.reshape(-1))
    return np.compress(c, x, axis=norm_axis(int(axis), x.ndim))
