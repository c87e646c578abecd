"""ATen converters for statistics, distances, elementwise functions ONNX composes, and a few
operators with a direct ONNX form that a held-out sweep found missing.

=================================================  =============================================
ATen                                               canonical (ONNX opset 20)
=================================================  =============================================
var.correction, var_mean.correction,               ReduceMean of the squared deviation times
std.correction                                     n / (n - correction); n from the shape at
                                                   run time for symbolic sizes (+ Sqrt for std)
expm1, trunc, round.decimals                       Exp - 1 / Sign * Floor(Abs) / Round(x * 10^d)
                                                   / 10^d
elu (scale, input_scale: selu, celu)               Where(x > 0, s * x, s * a * (Exp(i * x) - 1))
atan2                                              Atan(y / x) corrected by quadrant (Where)
_cdist_forward (p = 2; 0, 1, inf, other)           sqrt(|a|^2 + |b|^2 - 2 a.b) (MatMul); other p:
                                                   ReduceSum / ReduceMax of |a - b| over the
                                                   pairs (static, at most 16 M products)
diagonal                                           Gather of the diagonal's flat offsets after a
                                                   Transpose of the two axes last
searchsorted, bucketize (left or right)            ReduceSum of Less / LessOrEqual against x
median, kthvalue (values)                          Gather of the k-th of TopK(smallest)
copysign, signbit, hypot                           Where on the sign bit (1 / v < 0 for -0),
                                                   Sqrt(a^2 + b^2)
_native_batch_norm_legit.no_stats (instance norm)  statistics of the batch per channel
grid_sampler_2d                                    GridSample (bilinear/nearest/bicubic; zeros,
                                                   border, reflection padding)
adaptive_avg_pool / adaptive_max_pool (1-3 d)      GlobalAveragePool / AveragePool where the bins
                                                   are equal; else per axis a Gather of each
                                                   bin's window (short bins padded with their own
                                                   last element) + ReduceMax, or a weighted
                                                   ReduceSum
=================================================  =============================================
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graph_autofusion.frontend.aten_ops import aten_op, p_norm, reduce
from graph_autofusion.frontend.aten_ops_indexing import axis_size
from graph_autofusion.frontend.aten_ops_nn import per_axis, used_outputs
from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType


# ----- statistics -------------------------------------------------------------------------------
def _count(cx: ConvertContext, xv: Value, dims: list[int]) -> Value | int:
    """The number of elements over ``dims``: an int, or a value read from the shape."""
    sizes = [xv.shape[d] for d in dims]
    if all(isinstance(s, int) for s in sizes):
        return int(np.prod(sizes, dtype=np.int64))
    shape = cx.op("Shape", [xv])
    picked = cx.op("Gather", [shape, cx.ints(dims)], {"axis": 0})
    return cx.op("ReduceProd", [picked], {"keepdims": 0})


def _variance(
    cx: ConvertContext, x: Any, dim: Any, correction: Any, keepdim: bool
) -> tuple[Value, Value]:
    """(variance, mean) over ``dim`` (every axis when empty) with ``correction``."""
    xv = cx.v(x, cx.out_dtype)
    rank = len(xv.shape)
    if rank == 0:  # a 0-d input: its variance is over no axis
        dim = None
    if isinstance(dim, int):
        dim = [dim]
    dims = list(range(rank)) if not dim else [d % rank for d in dim]
    mean = reduce(cx, "ReduceMean", xv, dims, True, xv.dtype)
    diff = cx.op("Sub", [xv, mean])
    var = reduce(cx, "ReduceMean", cx.op("Mul", [diff, diff]), dims, keepdim, xv.dtype)
    corr = 1 if correction is None else correction
    if not keepdim:
        mean = cx.op("Squeeze", [mean, cx.ints(dims)]) if dims else mean
    if not corr:
        return var, mean
    n = _count(cx, xv, dims)
    if isinstance(n, int):
        factor = cx.scalar(n / max(n - corr, 0) if n > corr else float("inf"), xv.dtype)
    else:  # n / max(n - corr, 0): inf where n <= corr, as torch's nan / inf
        nf = cx.op("Cast", [n], {"to": int(xv.dtype)})
        less = cx.op("Sub", [nf, cx.scalar(float(corr), xv.dtype)])
        factor = cx.op("Div", [nf, cx.op("Max", [less, cx.scalar(0.0, xv.dtype)])])
    return cx.op("Mul", [var, factor]), mean


@aten_op("var.correction")
def _var(cx: ConvertContext, x: Any, dim: Any = None, *, correction: Any = None, keepdim=False):
    return _variance(cx, x, dim, correction, keepdim)[0]


@aten_op("std.correction")
def _std(cx: ConvertContext, x: Any, dim: Any = None, *, correction: Any = None, keepdim=False):
    return cx.op("Sqrt", [_variance(cx, x, dim, correction, keepdim)[0]])


@aten_op("var_mean.correction")
def _var_mean(
    cx: ConvertContext, x: Any, dim: Any = None, *, correction: Any = None, keepdim=False
):
    return list(_variance(cx, x, dim, correction, keepdim))


@aten_op("_native_batch_norm_legit.no_stats")
def _batch_stats_norm(
    cx: ConvertContext, x: Any, w: Any, b: Any, training: bool, momentum: float, eps: float
) -> Any:
    """Normalization by the batch's own statistics per channel (axis 1), what
    ``F.instance_norm`` and a norm without running statistics lower to."""
    if not used_outputs(cx) <= {0}:  # the saved statistics (training): torch runs it
        return cx.opaque(cx.node.target, (x, w, b, training, momentum, eps), {})
    xv = cx.v(x, cx.out_dtype)
    rank = len(xv.shape)
    dims = [0, *range(2, rank)]
    var, mean = _variance(cx, xv, dims, 0, True)
    inv = cx.op("Reciprocal", [cx.op("Sqrt", [cx.op("Add", [var, cx.scalar(eps, xv.dtype)])])])
    out = cx.op("Mul", [cx.op("Sub", [xv, mean]), inv])
    per_channel = cx.ints([-1] + [1] * (rank - 2))
    if w is not None:
        out = cx.op("Mul", [out, cx.op("Reshape", [cx.v(w, xv.dtype), per_channel])])
    if b is not None:
        out = cx.op("Add", [out, cx.op("Reshape", [cx.v(b, xv.dtype), per_channel])])
    return [out, None, None]


# ----- elementwise ------------------------------------------------------------------------------
@aten_op("expm1.default")
def _expm1(cx: ConvertContext, x: Any) -> Value:
    """``exp(x) - 1`` to a few ulps near 0, where the subtraction cancels (ONNX has no
    Expm1): with ``u = exp(x)``, ``(u - 1) * x / log(u)`` (``x`` where ``u`` rounds to 1),
    and ``u - 1`` itself for ``|x| > 0.5``."""
    xv = cx.v(x, cx.out_dtype)
    dt = xv.dtype
    u = cx.op("Exp", [xv])
    d = cx.op("Sub", [u, cx.scalar(1, dt)])
    ratio = cx.op("Div", [cx.op("Mul", [d, xv]), cx.op("Log", [u])])
    near = cx.op("Where", [cx.op("Equal", [d, cx.scalar(0, dt)]), xv, ratio])
    far = cx.op("Greater", [cx.op("Abs", [xv]), cx.scalar(0.5, dt)])
    return cx.op("Where", [far, d, near])


@aten_op("trunc.default")
def _trunc(cx: ConvertContext, x: Any) -> Value:
    xv = cx.v(x, cx.out_dtype)
    if not xv.dtype.is_float:
        return xv
    return cx.op("Mul", [cx.op("Sign", [xv]), cx.op("Floor", [cx.op("Abs", [xv])])])


@aten_op("round.decimals")
def _round_decimals(cx: ConvertContext, x: Any, *, decimals: int = 0) -> Value:
    xv = cx.v(x, cx.out_dtype)
    if not decimals:
        return cx.op("Round", [xv])
    scale = cx.scalar(10.0**decimals, xv.dtype)
    return cx.op("Div", [cx.op("Round", [cx.op("Mul", [xv, scale])]), scale])


@aten_op("elu.default")
def _elu(cx: ConvertContext, x: Any, alpha: float = 1.0, scale: float = 1.0, in_scale: float = 1.0):
    """``scale * (x if x > 0 else alpha * (exp(in_scale * x) - 1))`` (SELU and CELU are ELU
    with a scale and an input scale)."""
    xv = cx.v(x, cx.out_dtype)
    if scale == 1.0 and in_scale == 1.0:
        return cx.op("Elu", [xv], {"alpha": float(alpha)})
    dt = xv.dtype
    neg = cx.op(
        "Sub", [cx.op("Exp", [cx.op("Mul", [xv, cx.scalar(in_scale, dt)])]), cx.scalar(1, dt)]
    )
    neg = cx.op("Mul", [neg, cx.scalar(alpha * scale, dt)])
    pos = cx.op("Mul", [xv, cx.scalar(scale, dt)])
    return cx.op("Where", [cx.op("Greater", [xv, cx.scalar(0, dt)]), pos, neg])


@aten_op("atan2.default")
def _atan2(cx: ConvertContext, y: Any, x: Any) -> Value:
    """``atan(y / x)`` moved to the quadrant of ``(x, y)``, signed zeros included (a sign
    read as ``1 / v < 0``, true for -0): +-pi added where ``x`` is negative; where ``x`` is
    a zero, +-pi/2, or for ``y`` a zero too, ``y`` itself (``x`` +0) or +-pi (``x`` -0).
    Both infinite: NaN (torch: an odd multiple of pi/4)."""
    dt = cx.out_dtype
    yv, xv = cx.v(y, dt), cx.v(x, dt)
    zero = cx.scalar(0, dt)

    y_neg, x_neg = _sign_bit(cx, yv), _sign_bit(cx, xv)
    base = cx.op("Atan", [cx.op("Div", [yv, xv])])
    pi = cx.op("Where", [y_neg, cx.scalar(-math.pi, dt), cx.scalar(math.pi, dt)])
    out = cx.op("Where", [x_neg, cx.op("Add", [base, pi]), base])
    half = cx.op("Where", [y_neg, cx.scalar(-math.pi / 2, dt), cx.scalar(math.pi / 2, dt)])
    origin = cx.op("Where", [x_neg, pi, yv])
    on_axis = cx.op("Where", [cx.op("Equal", [yv, zero]), origin, half])
    out = cx.op("Where", [cx.op("Equal", [xv, zero]), on_axis, out])
    nan = cx.op("Or", [cx.op("IsNaN", [yv]), cx.op("IsNaN", [xv])])
    return cx.op("Where", [nan, cx.op("Add", [yv, xv]), out])  # NaN in, NaN out


# ----- distances, diagonals, sorted lookups -----------------------------------------------------
#: The most pair-feature products (P x R x M) cdist spreads out for p other than 2 (16 M).
_CDIST_PAIRS_MAX = 1 << 24


@aten_op("_cdist_forward.default")
def _cdist(cx: ConvertContext, a: Any, b: Any, p: float, compute_mode: Any = None) -> Value:
    """``torch.cdist``: ``|a_i - b_j|_p`` over every pair."""
    dt = cx.out_dtype
    a0, b0 = cx.v(a, dt), cx.v(b, dt)
    if p == 2:  # |a|^2 + |b|^2 - 2 a.b, as torch's matrix-product form: O(P R) memory
        sq_a = reduce(cx, "ReduceSumSquare", a0, [-1], True, dt)  # [..., P, 1]
        sq_b = reduce(cx, "ReduceSumSquare", b0, [-1], True, dt)  # [..., R, 1]
        rank = len(b0.shape)
        perm = [*range(rank - 2), rank - 1, rank - 2]
        dot = cx.op("MatMul", [a0, cx.op("Transpose", [b0], {"perm": perm})])
        total = cx.op("Add", [sq_a, cx.op("Transpose", [sq_b], {"perm": perm})])
        d2 = cx.op("Sub", [total, cx.op("Mul", [dot, cx.scalar(2, dt)])])
        return cx.op("Sqrt", [cx.op("Max", [d2, cx.scalar(0, dt)])])
    pairs = [*(a0.shape or ())[-2:-1], *(b0.shape or ())[-2:]]
    if not all(isinstance(s, int) for s in pairs) or np.prod(pairs) > _CDIST_PAIRS_MAX:
        return cx.opaque(cx.node.target, (a, b, p, compute_mode), {})  # too large to spread
    av = cx.op("Unsqueeze", [a0, cx.ints([-2])])  # [..., P, 1, M]
    bv = cx.op("Unsqueeze", [b0, cx.ints([-3])])  # [..., 1, R, M]
    return p_norm(cx, cx.op("Sub", [av, bv]), float(p), [-1], False, dt)


@aten_op("diagonal.default", "diagonal_copy.default")
def _diagonal(cx: ConvertContext, x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    """The two axes moved last and merged, then a Gather of the diagonal's flat offsets
    ``r * (n2 + 1) + offset`` for rows ``r`` in ``[max(0, -offset), min(n1, n2 - offset))``
    (folded to constants for static sizes, computed at run time for symbolic ones)."""
    xv = cx.v(x)
    rank = len(xv.shape or ())
    d1, d2 = dim1 % rank, dim2 % rank
    i64 = DType.INT64
    n1, n2 = axis_size(cx, xv, d1), axis_size(cx, xv, d2)
    end = cx.op("Min", [n1, cx.op("Sub", [n2, cx.scalar(offset, i64)])])
    start = cx.scalar(max(0, -offset), i64)
    rows = cx.op("Range", [start, cx.op("Max", [end, start]), cx.scalar(1, i64)])
    step = cx.op("Add", [n2, cx.scalar(1, i64)])
    flat = cx.op("Add", [cx.op("Mul", [rows, step]), cx.scalar(offset, i64)])
    rest = [d for d in range(rank) if d not in (d1, d2)]
    moved = cx.op("Transpose", [xv], {"perm": [*rest, d1, d2]})
    if rest:
        lead = cx.op("Slice", [cx.op("Shape", [moved]), cx.ints([0]), cx.ints([len(rest)])])
        target = cx.op("Concat", [lead, cx.ints([-1])], {"axis": 0})
    else:
        target = cx.ints([-1])
    merged = cx.op("Reshape", [moved, target])
    return cx.op("Gather", [merged, flat], {"axis": -1})


@aten_op("searchsorted.Tensor")
def _searchsorted(
    cx: ConvertContext,
    seq: Any,
    x: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: Any = None,
    sorter: Any = None,
) -> Value:
    """The insertion index of each ``x`` in the sorted last axis of ``seq``: how many of its
    values are below ``x`` (at or below, ``right``)."""
    if sorter is not None:
        kw = {"out_int32": out_int32, "right": right, "side": side, "sorter": sorter}
        return cx.opaque(cx.node.target, (seq, x), kw)
    return _sorted_count(cx, seq, x, right or side == "right", out_int32)


@aten_op("bucketize.Tensor")
def _bucketize(cx: ConvertContext, x: Any, boundaries: Any, *, out_int32=False, right=False):
    """``torch.bucketize``: ``searchsorted(boundaries, x)`` with the same ``right``."""
    return _sorted_count(cx, boundaries, x, right, out_int32)


def _sorted_count(cx: ConvertContext, seq: Any, x: Any, right: bool, out_int32: bool) -> Value:
    dt = cx.promoted()
    sv, xv = cx.v(seq, dt), cx.v(x, dt)
    if len(sv.shape or ()) > 1:  # per row: the rows' leading axes match x's
        sv = cx.op("Unsqueeze", [sv, cx.ints([-2])])
    query = cx.op("Unsqueeze", [xv, cx.ints([-1])])
    below = cx.op("LessOrEqual" if right else "Less", [sv, query])
    if dt.is_float:  # a NaN query sorts after everything (torch: the sequence's length)
        below = cx.op("Or", [below, cx.op("IsNaN", [query])])
    counted = cx.op("Cast", [below], {"to": int(DType.INT64)})
    count = reduce(cx, "ReduceSum", counted, [-1], False, DType.INT64)
    return cx.op("Cast", [count], {"to": int(DType.INT32)}) if out_int32 else count


@aten_op("median.default", "median.dim", "kthvalue.default")
def _kth(cx: ConvertContext, x: Any, *args: Any) -> Any:
    """The k-th smallest value along an axis (``median``: the lower middle one, ``k = (n -
    1) // 2 + 1``; NaN where the axis holds one, as torch) from a TopK of the smallest.
    Where the indices are read (ties may pick another one than torch's), opaque."""
    name = cx.node.target._schema.name.split("::")[-1]
    overload = cx.node.target._overloadname
    xv = cx.v(x)
    if overload == "default" and name == "median":
        xv, dim, keepdim, k = cx.op("Reshape", [xv, cx.ints([-1])]), 0, False, None
    elif name == "median":
        dim, keepdim, k = args[0], (args[1] if len(args) > 1 else False), None
    else:
        k, dim, keepdim = (
            args[0],
            (args[1] if len(args) > 1 else -1),
            (args[2] if len(args) > 2 else False),
        )
    tuple_out = overload != "default" or name == "kthvalue"
    dt = cx.dtype(x)
    if (tuple_out and not used_outputs(cx) <= {0}) or not dt.is_float:
        return cx.opaque(cx.node.target, (x, *args), {})
    i64 = DType.INT64
    if k is None:
        if xv.shape is not None:
            n = axis_size(cx, xv, dim)
        else:  # a flattened input: its length read at run time
            n = cx.op("Gather", [cx.op("Shape", [xv]), cx.scalar(dim, i64)], {"axis": 0})
        k = cx.op(
            "Add",
            [
                cx.op("Div", [cx.op("Sub", [n, cx.scalar(1, i64)]), cx.scalar(2, i64)]),
                cx.scalar(1, i64),
            ],
        )
    kv = cx.op("Reshape", [cx.v(k, i64), cx.ints([1])])
    smallest, _ = cx.op("TopK", [xv, kv], {"axis": dim, "largest": 0, "sorted": 1}, num_outputs=2)
    last = cx.op("Sub", [cx.op("Reshape", [kv, cx.ints([])]), cx.scalar(1, i64)])
    value = cx.op("Gather", [smallest, last], {"axis": dim})
    if name == "median":
        isnan = cx.op("Cast", [cx.op("IsNaN", [xv])], {"to": int(dt)})
        has_nan = reduce(cx, "ReduceMax", isnan, [dim], False, dt)
        flag = cx.op("Cast", [has_nan], {"to": int(DType.BOOL)})
        value = cx.op("Where", [flag, cx.scalar(math.nan, dt), value])
    if keepdim:
        value = cx.op("Unsqueeze", [value, cx.ints([dim])])
    return [value, None] if tuple_out else value


@aten_op("copysign.Tensor", "copysign.Scalar")
def _copysign(cx: ConvertContext, a: Any, b: Any) -> Value:
    dt = cx.out_dtype
    av, bv = cx.v(a, dt), cx.v(b, dt)
    mag = cx.op("Abs", [av])
    return cx.op("Where", [_sign_bit(cx, bv), cx.op("Neg", [mag]), mag])


@aten_op("signbit.default")
def _signbit(cx: ConvertContext, x: Any) -> Value:
    xv = cx.v(x)
    if not xv.dtype.is_float:
        return cx.op("Less", [xv, cx.scalar(0, xv.dtype)])
    return _sign_bit(cx, xv)


def _sign_bit(cx: ConvertContext, v: Value) -> Value:
    """``v < 0`` or ``-0`` (``1 / v < 0``)."""
    zero = cx.scalar(0, v.dtype)
    return cx.op("Or", [cx.op("Less", [v, zero]), cx.op("Less", [cx.op("Reciprocal", [v]), zero])])


@aten_op("hypot.default")
def _hypot(cx: ConvertContext, a: Any, b: Any) -> Value:
    dt = cx.out_dtype
    av, bv = cx.v(a, dt), cx.v(b, dt)
    return cx.op("Sqrt", [cx.op("Add", [cx.op("Mul", [av, av]), cx.op("Mul", [bv, bv])])])


@aten_op("grid_sampler_2d.default")
def _grid_sample(
    cx: ConvertContext, x: Any, grid: Any, mode: int, padding: int, align_corners: bool
) -> Value:
    modes = {0: "linear", 1: "nearest", 2: "cubic"}
    pads = {0: "zeros", 1: "border", 2: "reflection"}
    attrs = {
        "mode": modes[mode],
        "padding_mode": pads[padding],
        "align_corners": int(align_corners),
    }
    dt = cx.out_dtype
    return cx.op("GridSample", [cx.v(x, dt), cx.v(grid, dt)], attrs)


# ----- adaptive pools ---------------------------------------------------------------------------
@aten_op(
    "adaptive_avg_pool2d.default",
    "_adaptive_avg_pool2d.default",
    "adaptive_avg_pool1d.default",
    "adaptive_avg_pool3d.default",
    "_adaptive_avg_pool3d.default",
)
def _adaptive_avg_pool(cx: ConvertContext, x, output_size):
    xv = cx.v(x)
    spatial = list(xv.shape[2:])
    out = per_axis(output_size, len(spatial))
    out = [s if o is None else o for s, o in zip(spatial, out)]
    if all(o == 1 for o in out):
        return cx.op("GlobalAveragePool", [xv])
    if all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, out)):
        k = [s // o for s, o in zip(spatial, out)]
        return cx.op(
            "AveragePool", [xv], {"kernel_shape": k, "strides": k, "pads": [0] * (2 * len(k))}
        )
    return _adaptive(cx, xv, out, average=True)


@aten_op(
    "adaptive_max_pool2d.default", "adaptive_max_pool1d.default", "adaptive_max_pool3d.default"
)
def _adaptive_max_pool(cx: ConvertContext, x, output_size):
    xv = cx.v(x)
    spatial = list(xv.shape[2:])
    out = per_axis(output_size, len(spatial))
    out = [s if o is None else o for s, o in zip(spatial, out)]
    if not used_outputs(cx) <= {0}:
        return cx.opaque(cx.node.target, (x, output_size), {})
    if all(o == 1 for o in out):
        return [cx.op("GlobalMaxPool", [xv]), None]
    return [_adaptive(cx, xv, out, average=False), None]


def _adaptive(cx: ConvertContext, xv: Value, out: list[int], *, average: bool) -> Value:
    """torch's adaptive bins, ``[floor(i * n / o), ceil((i + 1) * n / o))`` on each spatial
    axis in turn (a mean or a max over a box is one over each of its axes): the windows
    gathered (``ceil(n / o) + 1`` wide, a short bin padded with its own last element, which
    leaves a max unchanged and which a mean weighs 0), then reduced. The indices are
    computed from the axis' size, constants where it is static."""
    i64 = DType.INT64
    shape, dt = list(xv.shape), xv.dtype  # tracked: a reduction may leave its type unknown
    rank = len(shape)
    for axis, o in enumerate(out, start=2):
        if isinstance(shape[axis], int):
            n = cx.scalar(shape[axis], i64)
        else:
            n = cx.op("Gather", [cx.op("Shape", [xv]), cx.scalar(axis, i64)], {"axis": 0})
        shape[axis] = o
        bins = cx.const(np.arange(o, dtype=np.int64))
        starts = cx.op("Div", [cx.op("Mul", [bins, n]), cx.scalar(o, i64)])
        ends = cx.op(
            "Add",
            [cx.op("Mul", [cx.op("Add", [bins, cx.scalar(1, i64)]), n]), cx.scalar(o - 1, i64)],
        )
        ends = cx.op("Div", [ends, cx.scalar(o, i64)])
        width = cx.op(
            "Add",
            [
                cx.op("Div", [cx.op("Add", [n, cx.scalar(o - 1, i64)]), cx.scalar(o, i64)]),
                cx.scalar(1, i64),
            ],
        )
        offsets = cx.op("Range", [cx.scalar(0, i64), width, cx.scalar(1, i64)])
        first = cx.op("Unsqueeze", [starts, cx.ints([1])])
        last = cx.op("Unsqueeze", [cx.op("Sub", [ends, cx.scalar(1, i64)]), cx.ints([1])])
        at = cx.op("Add", [first, cx.op("Unsqueeze", [offsets, cx.ints([0])])])  # [o, width]
        idx = cx.op("Min", [at, last])
        windows = cx.op("Gather", [xv, idx], {"axis": axis})  # [..., o, width, ...]
        trailing = cx.ints(list(range(2, 2 + rank - axis - 1)))
        if average:
            inside = cx.op("Cast", [cx.op("LessOrEqual", [at, last])], {"to": int(dt)})
            count = cx.op("Cast", [cx.op("Sub", [ends, starts])], {"to": int(dt)})
            weight = cx.op("Div", [inside, cx.op("Unsqueeze", [count, cx.ints([1])])])
            if rank - axis - 1:
                weight = cx.op("Unsqueeze", [weight, trailing])
            xv = reduce(cx, "ReduceSum", cx.op("Mul", [windows, weight]), [axis + 1], False, dt)
        else:
            xv = reduce(cx, "ReduceMax", windows, [axis + 1], False, dt)
    return xv
