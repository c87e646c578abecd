"""ATen converters for windows, strided views, indexed writes, bags and boolean reductions.

=================================================  =============================================
ATen                                               canonical (ONNX opset 20)
=================================================  =============================================
unfold(dim, size, step)                            Gather(x, start + offset [n, size], dim) +
                                                   Transpose (the window axis last); n from the
                                                   axis' size at run time when it is symbolic
as_strided (static sizes, an input dense in        Gather(Reshape(Transpose(x), [-1]), flat
memory in eager, every offset inside it)           offsets): eager's storage read, exactly
index_put, one integer index tensor at one axis    ScatterElements(x, index broadcast to the
(a static cache's ``index_copy_``)                 values' shape, values, axis; add when
                                                   accumulating)
index_put, several integer index tensors           Transpose (indexed axes first) + ScatterND
                                                   (indices stacked over their broadcast shape,
                                                   negatives wrapped) + Transpose back
index_put, one boolean mask, values broadcast      Where(mask, values, x) (x + Where(mask, v, 0)
over the unmasked axes                             when accumulating)
any / all (dim, dims, every element)               ReduceSum of x != 0 (x == 0) > 0 (== 0)
scatter_reduce.two (sum prod amax amin mean,      ScatterElements(reduction), the targets first
include_self or not)                               set to the reduction's identity when self is
                                                   left out; mean: the sum over a scattered count
_embedding_bag(_forward_only), sum and mean        Gather rows, bag of each index by CumSum of
                                                   the offsets' marks, ScatterElements(add) into
                                                   [bags, dim]; mean divides by the bag's count
=================================================  =============================================

Anything else (a mask beside integer indices, values of a mask's data-dependent length,
``max`` bags, an ``as_strided`` over memory the values do not cover) stays an opaque node
the torch program runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graph_autofusion.frontend.aten_ops import aten_op, reduce
from graph_autofusion.frontend.aten_ops_nn import used_outputs
from graph_autofusion.frontend.aten_ops_tensor import sym_size
from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType


def _static(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _dims(cx: ConvertContext, xv: Value, lo: int, hi: int) -> Value:
    """``x.shape[lo:hi]`` as a 1-D int64 value (a constant where those sizes are static)."""
    part = list(xv.shape[lo:hi])
    if _static(part):
        return cx.ints(part)
    return cx.op("Slice", [cx.op("Shape", [xv]), cx.ints([lo]), cx.ints([hi])])


def axis_size(cx: ConvertContext, xv: Value, axis: int) -> Value:
    """``x.shape[axis]`` as a 0-d int64 value (:func:`sym_size`'s number or value)."""
    return cx.v(sym_size(cx, xv, axis), DType.INT64)


# ----- windows and strided views ----------------------------------------------------------------
@aten_op("unfold.default")
def _unfold(cx: ConvertContext, x: Any, dimension: int, size: int, step: int) -> Value:
    """``x.unfold(d, size, step)``: windows of ``size`` every ``step`` along ``d``, the window
    as a new last axis (PatchTST's patches, a sliding-window conv done by hand)."""
    xv = cx.v(x)
    if xv.shape is None or not isinstance(size, int) or not isinstance(step, int):
        return cx.opaque(cx.node.target, (x, dimension, size, step), {})
    rank = len(xv.shape)
    if rank == 0:  # a 0-d tensor unfolds to [size] (size must be 1)
        return cx.op("Unsqueeze", [xv, cx.ints([0])])
    d = dimension % rank
    offsets = np.arange(size, dtype=np.int64)[None, :]
    length = xv.shape[d]
    if isinstance(length, int):
        n = (length - size) // step + 1
        idx = cx.const(np.arange(n, dtype=np.int64)[:, None] * step + offsets)
    else:
        count = cx.op(
            "Add",
            [
                cx.op(
                    "Div",
                    [
                        cx.op("Sub", [axis_size(cx, xv, d), cx.scalar(size, DType.INT64)]),
                        cx.scalar(step, DType.INT64),
                    ],
                ),
                cx.scalar(1, DType.INT64),
            ],
        )
        starts = cx.op("Range", [cx.scalar(0, DType.INT64), count, cx.scalar(1, DType.INT64)])
        starts = cx.op("Mul", [starts, cx.scalar(step, DType.INT64)])
        idx = cx.op("Add", [cx.op("Unsqueeze", [starts, cx.ints([1])]), cx.const(offsets)])
    out = cx.op("Gather", [xv, idx], {"axis": d})  # [..., n, size, ...rest]
    if d + 1 < rank:
        perm = list(range(d + 1)) + list(range(d + 2, rank + 1)) + [d + 1]
        out = cx.op("Transpose", [out], {"perm": perm})
    return out


def _dense_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int] | None:
    """The axis order in which a tensor of these strides lies densely in memory (each
    stride the product of the sizes after it in that order: a permutation of a contiguous
    tensor), or ``None`` when its elements do not tile its memory (a slice, a broadcast)."""
    order = sorted(range(len(shape)), key=lambda d: (shape[d] != 1, -strides[d]))
    expected = 1
    for d in reversed(order):
        if shape[d] == 1:
            continue
        if strides[d] != expected:
            return None
        expected *= shape[d]
    return order


@aten_op("as_strided.default", "as_strided_copy.default")
def _as_strided(
    cx: ConvertContext, x: Any, size: Any, stride: Any, storage_offset: Any = None
) -> Value:
    """``x.as_strided(size, stride, offset)`` (Longformer's overlapping chunks) read as a
    Gather of flat offsets. Exact only where eager reads the values themselves: the input
    lies densely in memory in eager (its example value's strides say in which axis order:
    a contiguous tensor or a permutation of one) and every offset falls inside it;
    otherwise it reads memory the values do not hold (a slice's base) and stays opaque."""
    fake = cx.arg_val(0)
    xv = cx.v(x)
    sizes, strides = list(size), list(stride)
    order = None
    if (
        isinstance(fake, torch.Tensor)
        and _static(xv.shape)
        and all(isinstance(s, int) for s in sizes + strides)
        and (storage_offset is None or isinstance(storage_offset, int))
        and not any(isinstance(s, torch.SymInt) for s in (*fake.shape, *fake.stride()))
    ):
        order = _dense_order(tuple(fake.shape), tuple(fake.stride()))
    if order is None:
        return cx.opaque(cx.node.target, (x, size, stride, storage_offset), {})
    start = 0 if storage_offset is None else storage_offset - int(fake.storage_offset())
    flat = np.full(sizes, start, dtype=np.int64) if sizes else np.array(start, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[axis] = n
        flat = flat + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    numel = int(np.prod(xv.shape, dtype=np.int64))
    if flat.size and (flat.min() < 0 or flat.max() >= numel):
        return cx.opaque(cx.node.target, (x, size, stride, storage_offset), {})
    if order != list(range(len(order))):  # the values in their memory's order
        xv = cx.op("Transpose", [xv], {"perm": order})
    return cx.op("Gather", [cx.op("Reshape", [xv, cx.ints([-1])]), cx.const(flat)], {"axis": 0})


# ----- indexed writes ---------------------------------------------------------------------------
@aten_op("index_put.default")
def _index_put(
    cx: ConvertContext, x: Any, indices: Any, values: Any, accumulate: bool = False
) -> Value:
    """``x[indices] = values`` (``+=`` when accumulating), in the forms listed above."""
    xv = cx.v(x)
    pos = [i for i, t in enumerate(indices) if t is not None]
    kinds = [cx.dtype(indices[i]) for i in pos]
    if xv.shape is None or not pos:
        out = None
    elif len(pos) == 1 and kinds[0] in (DType.BOOL, DType.UINT8):
        out = _put_masked(cx, xv, pos[0], indices[pos[0]], values, accumulate)
    elif all(k in (DType.INT64, DType.INT32) for k in kinds):
        one = len(pos) == 1 and len(cx.shape(indices[pos[0]]) or ()) == 1
        put = _put_along_axis if one else _put_nd
        out = put(cx, xv, pos, [indices[i] for i in pos], values, accumulate)
    else:
        out = None
    if out is None:
        return cx.opaque(cx.node.target, (x, indices, values, accumulate), {})
    return out


def _put_along_axis(cx, xv: Value, pos, idx, values, accumulate) -> Value:
    """One 1-D integer index at one axis (a static KV cache's ``index_copy_``): the index
    broadcast to the values' shape, one ScatterElements."""
    axis, rank = pos[0], len(xv.shape)
    iv = cx.v(idx[0], DType.INT64)
    vv = cx.v(values, xv.dtype)
    want = list(xv.shape)
    want[axis] = (iv.shape or [None])[0]
    if vv.shape is None or list(vv.shape) != want:  # values broadcast to the target
        if _static(want):
            target = cx.ints(want)
        else:
            parts = [_dims(cx, xv, 0, axis)] if axis > 0 else []
            parts.append(cx.op("Shape", [iv]))
            if axis + 1 < rank:
                parts.append(_dims(cx, xv, axis + 1, rank))
            target = cx.op("Concat", parts, {"axis": 0}) if len(parts) > 1 else parts[0]
        vv = cx.op("Expand", [vv, target])
    axes = [d for d in range(rank) if d != axis]
    if axes:
        iv = cx.op("Unsqueeze", [iv, cx.ints(axes)])
    iv = cx.op("Expand", [iv, cx.op("Shape", [vv])])
    red = "add" if accumulate else "none"
    return cx.op("ScatterElements", [xv, iv, vv], {"axis": axis, "reduction": red})


def _put_nd(cx, xv: Value, pos, idx, values, accumulate) -> Value | None:
    """Several integer indices (or one of rank > 1): the indexed axes moved first, the
    indices (negatives wrapped) stacked over their broadcast shape ``B``, the values laid out
    as ``B + other axes`` (torch puts ``B`` where adjacent indices stood, else first), one
    ScatterND, the axes moved back."""
    rank = len(xv.shape)
    shapes = [cx.shape(i) for i in idx]
    if any(s is None for s in shapes):
        return None
    ivs = []
    for axis, i in zip(pos, idx):
        iv = cx.v(i, DType.INT64)
        n = axis_size(cx, xv, axis)
        neg = cx.op("Less", [iv, cx.scalar(0, DType.INT64)])
        ivs.append(cx.op("Where", [neg, cx.op("Add", [iv, n]), iv]))
    nb = max(len(s) for s in shapes)
    if all(_static(s) for s in shapes):
        bshape = cx.ints(list(np.broadcast_shapes(*[tuple(s) for s in shapes])))
    else:
        total = ivs[0]
        for iv in ivs[1:]:
            total = cx.op("Add", [total, iv])
        bshape = cx.op("Shape", [total])
    stacked = cx.op(
        "Concat",
        [cx.op("Unsqueeze", [cx.op("Expand", [iv, bshape]), cx.ints([-1])]) for iv in ivs],
        {"axis": -1},
    )
    others = [d for d in range(rank) if d not in pos]
    perm = pos + others
    xt = cx.op("Transpose", [xv], {"perm": perm}) if perm != list(range(rank)) else xv
    rest = [_dims(cx, xv, d, d + 1) for d in others]
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    lead = pos[0] if adjacent else 0  # the other axes torch puts before B in the values
    natural = rest[:lead] + [bshape] + rest[lead:]
    vv = cx.op("Expand", [cx.v(values, xv.dtype), cx.op("Concat", natural, {"axis": 0})])
    if lead:
        vperm = (
            list(range(lead, lead + nb))
            + list(range(lead))
            + list(range(lead + nb, nb + len(rest)))
        )
        vv = cx.op("Transpose", [vv], {"perm": vperm})
    red = "add" if accumulate else "none"
    out = cx.op("ScatterND", [xt, stacked, vv], {"reduction": red})
    if perm != list(range(rank)):
        out = cx.op("Transpose", [out], {"perm": [perm.index(d) for d in range(rank)]})
    return out


def _put_masked(cx, xv: Value, axis: int, mask: Any, values: Any, accumulate: bool):
    """``x[..., mask] = v`` where ``v`` broadcasts over the axes after the mask's (a scalar,
    or one row per masked position): ``Where(mask, v, x)``. Values of the mask's own
    (data-dependent) length stay opaque."""
    rank = len(xv.shape)
    mv = cx.v(mask, DType.BOOL)
    mrank = len(mv.shape or ())
    trailing = rank - axis - mrank
    vv = cx.v(values, xv.dtype)
    vshape = vv.shape
    if mv.shape is None or trailing < 0 or vshape is None:
        return None
    numel_one = _static(vshape) and int(np.prod(vshape, dtype=np.int64)) == 1
    if not numel_one and len(vshape) > trailing:
        return None
    if numel_one and vshape:
        vv = cx.op("Reshape", [vv, cx.ints([])])
    if trailing:
        mv = cx.op("Unsqueeze", [mv, cx.ints(list(range(mrank, mrank + trailing)))])
    if accumulate:
        zero = cx.scalar(0, xv.dtype)
        return cx.op("Add", [xv, cx.op("Where", [mv, vv, zero])])
    return cx.op("Where", [mv, vv, xv])


@aten_op("scatter_reduce.two")
def _scatter_reduce(
    cx: ConvertContext, x: Any, dim: int, index: Any, src: Any, how: str, *, include_self=True
) -> Value:
    xv = cx.v(x)
    dt = xv.dtype
    red = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}.get(how)
    if red is None or xv.shape is None or (how == "mean" and not dt.is_float):
        args = (x, dim, index, src, how)
        return cx.opaque(cx.node.target, args, {"include_self": include_self})
    iv = cx.v(index, DType.INT64)
    sv = cx.v(src, dt)
    where = cx.op("Shape", [iv])
    base = xv
    if not include_self:  # the scattered targets start from the reduction's identity
        big = float("inf") if dt.is_float else int(np.iinfo(dt.to_numpy()).max)
        start = {"sum": 0, "mean": 0, "prod": 1, "amax": -big, "amin": big}[how]
        fill = cx.op("Expand", [cx.scalar(start, dt), where])
        base = cx.op("ScatterElements", [xv, iv, fill], {"axis": dim, "reduction": "none"})
    out = cx.op("ScatterElements", [base, iv, sv], {"axis": dim, "reduction": red})
    if how != "mean":
        return out
    ones = cx.op("Expand", [cx.scalar(1, dt), where])
    counted = cx.op(
        "ConstantOfShape",
        [cx.op("Shape", [xv])],
        {"value": np.array([1 if include_self else 0], dtype=dt.to_numpy())},
    )
    count = cx.op("ScatterElements", [counted, iv, ones], {"axis": dim, "reduction": "add"})
    return cx.op("Div", [out, cx.op("Max", [count, cx.scalar(1, dt)])])


# ----- boolean reductions -----------------------------------------------------------------------
@aten_op("any.default", "any.dim", "any.dims", "all.default", "all.dim", "all.dims")
def _any_all(cx: ConvertContext, x: Any, dim: Any = None, keepdim: bool = False) -> Value:
    is_any = cx.node.target._schema.name.endswith("any")
    xv = cx.v(x)
    nonzero = (
        xv
        if xv.dtype == DType.BOOL
        else cx.op("Not", [cx.op("Equal", [xv, cx.scalar(0, xv.dtype)])])
    )
    # counted, not ReduceMax / ReduceMin: those give -inf / +inf over no element
    counted = nonzero if is_any else cx.op("Not", [nonzero])
    as_float = cx.op("Cast", [counted], {"to": int(DType.FLOAT)})
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim else None)
    if dims is None and keepdim and xv.shape is not None:
        dims = list(range(len(xv.shape)))
    count = reduce(cx, "ReduceSum", as_float, dims, keepdim, DType.FLOAT)
    zero = cx.scalar(0.0, DType.FLOAT)
    found = cx.op("Greater" if is_any else "Equal", [count, zero])
    return cx.op("Cast", [found], {"to": int(cx.out_dtype)})


# ----- bags -------------------------------------------------------------------------------------
@aten_op(
    "_embedding_bag_forward_only.default",
    "_embedding_bag.default",
)
def _embedding_bag(
    cx: ConvertContext,
    weight: Any,
    indices: Any,
    offsets: Any,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Any = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> Any:
    """``nn.EmbeddingBag`` (sum and mean) over 1-D indices and offsets; the bag outputs
    torch returns beside (offset2bag, sizes, max indices) only when nothing reads them."""
    args = (weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights)
    args += (include_last_offset, padding_idx)
    iv = cx.v(indices, DType.INT64)
    if mode not in (0, 1) or not used_outputs(cx) <= {0} or len(cx.shape(indices) or ()) != 1:
        return cx.opaque(cx.node.target, args, {})
    wv = cx.v(weight)
    ov = cx.v(offsets, DType.INT64)
    n_idx = axis_size(cx, iv, 0)
    bags = axis_size(cx, ov, 0)
    if include_last_offset:
        bags = cx.op("Sub", [bags, cx.scalar(1, DType.INT64)])
        ov = cx.op("Slice", [ov, cx.ints([0]), cx.op("Reshape", [bags, cx.ints([1])])])
    # each index's bag: the number of offsets at or before it, minus one (an empty bag's
    # offset repeats its neighbour's and is counted twice, so it is skipped)
    n1 = cx.op("Reshape", [cx.op("Add", [n_idx, cx.scalar(1, DType.INT64)]), cx.ints([1])])
    marks = cx.op("ConstantOfShape", [n1], {"value": np.zeros(1, dtype=np.int64)})
    ones = cx.op("Expand", [cx.scalar(1, DType.INT64), cx.op("Shape", [ov])])
    marks = cx.op("ScatterElements", [marks, ov, ones], {"axis": 0, "reduction": "add"})
    marks = cx.op("Slice", [marks, cx.ints([0]), cx.op("Reshape", [n_idx, cx.ints([1])])])
    bag = cx.op(
        "Sub", [cx.op("CumSum", [marks, cx.scalar(0, DType.INT64)]), cx.scalar(1, DType.INT64)]
    )
    rows = cx.op("Gather", [wv, iv], {"axis": 0})  # [N, D]
    keep = None
    if padding_idx is not None and padding_idx >= 0:
        keep = cx.op("Not", [cx.op("Equal", [iv, cx.scalar(padding_idx, DType.INT64)])])
        keep = cx.op("Cast", [keep], {"to": int(wv.dtype)})
        rows = cx.op("Mul", [rows, cx.op("Unsqueeze", [keep, cx.ints([1])])])
    if per_sample_weights is not None:
        psw = cx.v(per_sample_weights, wv.dtype)
        rows = cx.op("Mul", [rows, cx.op("Unsqueeze", [psw, cx.ints([1])])])
    dim = _dims(cx, wv, 1, 2)
    bag_dims = cx.op("Reshape", [bags, cx.ints([1])])
    zeros = cx.op(
        "ConstantOfShape",
        [cx.op("Concat", [bag_dims, dim], {"axis": 0})],
        {"value": np.zeros(1, dtype=wv.dtype.to_numpy())},
    )
    where = cx.op("Expand", [cx.op("Unsqueeze", [bag, cx.ints([1])]), cx.op("Shape", [rows])])
    out = cx.op("ScatterElements", [zeros, where, rows], {"axis": 0, "reduction": "add"})
    if mode == 1:
        counted = (
            keep
            if keep is not None
            else cx.op("Expand", [cx.scalar(1, wv.dtype), cx.op("Shape", [iv])])
        )
        count0 = cx.op(
            "ConstantOfShape", [bag_dims], {"value": np.zeros(1, dtype=wv.dtype.to_numpy())}
        )
        count = cx.op("ScatterElements", [count0, bag, counted], {"axis": 0, "reduction": "add"})
        count = cx.op("Max", [count, cx.scalar(1, wv.dtype)])
        out = cx.op("Div", [out, cx.op("Unsqueeze", [count, cx.ints([1])])])
    return [out, None, None, None]
