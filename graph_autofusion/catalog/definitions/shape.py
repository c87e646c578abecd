"""Layout (injective) operators and shape computations, exact in int64."""

from __future__ import annotations

import numpy as np

from graph_autofusion.catalog.definitions._util import (
    attr_ints,
    attr_str,
    attr_tensor,
    axes_of,
    dtype_attr,
    norm_axis,
    zero_flops,
)
from graph_autofusion.catalog.registry import FusionKind, OpContext, op

INJ = FusionKind.INJECTIVE
DM = FusionKind.DATA_MOVEMENT


def reshape_target(shape_in: tuple[int, ...], shape: np.ndarray, allowzero: bool) -> list[int]:
    """Resolve ONNX Reshape's 0 (copy the input dim unless allowzero) and -1 (infer)."""
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            out.append(int(shape_in[i]))
        else:
            out.append(d)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(shape_in, dtype=np.int64))
        out[out.index(-1)] = total // known if known else 0
    return out


@op("Reshape", INJ, flops=zero_flops)
def reshape(ctx: OpContext, x: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
    """Reshape to ``shape`` (input; attribute at opset < 5); 0 copies, -1 infers."""
    if shape is None:
        shape = np.asarray(attr_ints(ctx, "shape"), dtype=np.int64)
    return x.reshape(reshape_target(x.shape, shape, bool(int(ctx.attr("allowzero", 0)))))


@op("Flatten", INJ, flops=zero_flops)
def flatten(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """2-D view: dims before ``axis`` times dims from ``axis`` (default 1)."""
    axis = norm_axis(int(ctx.attr("axis", 1)), x.ndim)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(rows, int(np.prod(x.shape[axis:], dtype=np.int64)))


@op("Transpose", INJ, flops=zero_flops)
def transpose(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Permute axes by ``perm`` (default: reverse)."""
    perm = attr_ints(ctx, "perm")
    return np.transpose(x, perm)


@op("Squeeze", INJ, flops=zero_flops)
def squeeze(ctx: OpContext, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    """Remove size-1 ``axes`` (input at opset >= 13), or all size-1 axes."""
    ax = axes_of(ctx, axes)
    if not ax:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(norm_axis(a, x.ndim) for a in ax))


@op("Unsqueeze", INJ, flops=zero_flops)
def unsqueeze(ctx: OpContext, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    """Insert size-1 ``axes`` (positions in the output)."""
    ax = axes_of(ctx, axes) or []
    rank = x.ndim + len(ax)
    shape = list(x.shape)
    for a in sorted(norm_axis(a, rank) for a in ax):
        shape.insert(a, 1)
    return x.reshape(shape)


@op("Expand", INJ, flops=zero_flops)
def expand(ctx: OpContext, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Broadcast ``x`` bidirectionally with ``shape``."""
    target = np.broadcast_shapes(x.shape, tuple(int(d) for d in np.asarray(shape).reshape(-1)))
    return np.broadcast_to(x, target)


def _slice_bounds(start: int, end: int, step: int, dim: int) -> slice:
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        return slice(start, end, step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@op("Slice", INJ, flops=zero_flops)
def slice_(
    ctx: OpContext,
    x: np.ndarray,
    starts: np.ndarray | None = None,
    ends: np.ndarray | None = None,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> np.ndarray:
    """Strided slice with ONNX clamping of negative and out-of-range starts/ends."""
    if starts is None:  # opset < 10: attributes
        st = attr_ints(ctx, "starts") or []
        en = attr_ints(ctx, "ends") or []
        ax = attr_ints(ctx, "axes") or list(range(len(st)))
        sp = [1] * len(st)
    else:
        st = [int(v) for v in np.asarray(starts).reshape(-1)]
        en = [int(v) for v in np.asarray(ends).reshape(-1)]
        ax = list(range(len(st))) if axes is None else [int(a) for a in axes.reshape(-1)]
        sp = [1] * len(st) if steps is None else [int(s) for s in steps.reshape(-1)]
    index = [slice(None)] * x.ndim
    for s, e, a, p in zip(st, en, ax, sp):
        a = norm_axis(a, x.ndim)
        index[a] = _slice_bounds(s, e, p, x.shape[a])
    return x[tuple(index)]


@op("DepthToSpace", INJ, flops=zero_flops)
def depth_to_space(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Move channel blocks into spatial blocks (mode DCR or CRD)."""
    b = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    if attr_str(ctx, "mode", "DCR") == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth", INJ, flops=zero_flops)
def space_to_depth(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Move spatial blocks into channels."""
    b = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return t.reshape(n, c * b * b, h // b, w // b)


@op("Trilu", INJ, flops=zero_flops)
def trilu(ctx: OpContext, x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
    """Upper (default) or lower triangle of the last two axes, offset by ``k``."""
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    if int(ctx.attr("upper", 1)):
        return np.triu(x, kk)
    return np.tril(x, kk)


# ----- shape computations and constants ------------------------------------------------------


@op("Shape", DM, flops=zero_flops)
def shape(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Shape as int64, optionally sliced by ``start``/``end`` (opset 15)."""
    dims = np.asarray(x.shape, dtype=np.int64)
    start = ctx.attr("start", None)
    end = ctx.attr("end", None)
    r = x.ndim
    s = 0 if start is None else min(max(norm_axis(int(start), r), 0), r)
    e = r if end is None else min(max(norm_axis(int(end), r), 0), r)
    return dims[s:e]


@op("Size", DM, flops=zero_flops)
def size(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Element count as an int64 scalar."""
    return np.asarray(x.size, dtype=np.int64)


@op("ConstantOfShape", DM, flops=zero_flops)
def constant_of_shape(ctx: OpContext, shape: np.ndarray) -> np.ndarray:
    """Tensor of ``shape`` filled with ``value`` (default float32 0)."""
    value = attr_tensor(ctx, "value")
    if value is None:
        value = np.zeros(1, dtype=np.float32)
    dims = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)


@op("Constant", DM, flops=zero_flops)
def constant(ctx: OpContext) -> np.ndarray:
    """The constant held in one of its value attributes."""
    value = attr_tensor(ctx, "value")
    if value is not None:
        return value
    if "value_float" in ctx.attrs:
        return np.asarray(ctx.attr("value_float"), dtype=np.float32)
    if "value_floats" in ctx.attrs:
        return np.asarray(ctx.attr("value_floats"), dtype=np.float32)
    if "value_int" in ctx.attrs:
        return np.asarray(ctx.attr("value_int"), dtype=np.int64)
    if "value_ints" in ctx.attrs:
        return np.asarray(ctx.attr("value_ints"), dtype=np.int64)
    if "value_string" in ctx.attrs:
        return np.asarray(ctx.attr("value_string"), dtype=object)
    if "value_strings" in ctx.attrs:
        return np.asarray(ctx.attr("value_strings"), dtype=object)
    raise ValueError("Constant node has no value attribute (sparse_value is not supported)")


@op("Range", DM, flops=zero_flops)
def range_(ctx: OpContext, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """start, start + delta, ... below ``limit``; exact integer arithmetic for int types."""
    dt = np.asarray(start).dtype
    if np.issubdtype(dt, np.integer):
        s, lim, d = int(start), int(limit), int(delta)
        n = max(0, -((s - lim) // d))
        return (s + d * np.arange(n, dtype=np.int64)).astype(dt)
    s, lim, d = float(start), float(limit), float(delta)
    n = max(0, int(np.ceil((lim - s) / d)))
    return (np.asarray(s, dtype=dt) + np.arange(n).astype(dt) * np.asarray(d, dtype=dt)).astype(dt)


@op("EyeLike", DM, flops=zero_flops)
def eye_like(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """2-D identity-like matrix of ``x``'s shape, diagonal offset ``k``."""
    dt = ctx.attr("dtype", None)

    dtype = x.dtype if dt is None else dtype_attr(dt)
    return np.eye(x.shape[0], x.shape[1], int(ctx.attr("k", 0)), dtype=dtype)


@op("OneHot", DM, flops=zero_flops)
def one_hot(
    ctx: OpContext, indices: np.ndarray, depth: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """One-hot encoding along ``axis`` with [off, on] ``values``; negative indices wrap."""
    d = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    axis = norm_axis(int(ctx.attr("axis", -1)), idx.ndim + 1)
    hot = np.expand_dims(idx, axis) == np.arange(d).reshape(
        [d if i == axis else 1 for i in range(idx.ndim + 1)]
    )
    return np.where(hot, values[1], values[0]).astype(values.dtype)


@op("NonZero", FusionKind.OPAQUE, flops=zero_flops)
def non_zero(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Indices of the non-zero elements, shape (rank, count), int64."""
    return np.asarray(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(x.ndim or 1, -1)
