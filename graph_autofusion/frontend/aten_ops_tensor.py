"""ATen layout / data-movement converters.

=================================================  =============================================
ATen                                               canonical (ONNX opset 20)
=================================================  =============================================
view _unsafe_view reshape                          Reshape(x, static target shape)
permute, t, transpose.int                          Transpose(perm)
expand                                             Expand(x, shape)
unsqueeze / squeeze(.dim/.dims)                    Unsqueeze / Squeeze (axes as input)
slice.Tensor                                       Slice(starts, ends, axes, steps); no node when
                                                   it selects the whole axis
slice_scatter (step 1)                             Concat(Slice before, src, Slice after)
copy                                               Expand(Cast(src), Shape(x))
select.int                                         Gather(x, scalar index, axis)
index.Tensor (integer indices)                     Gather (one index) or Transpose + GatherND
                                                   (+ Transpose back) for several indices, each
                                                   Expanded to their broadcast shape (symbolic:
                                                   the Shape of their sum)
index_select / gather                              Gather / GatherElements
scatter / scatter_add                              ScatterElements(reduction)
index_put                                          see ``aten_ops_indexing``
cat / stack                                        Concat / Unsqueeze + Concat
split.Tensor split_with_sizes unbind.int           Split (+ Squeeze for unbind)
constant_pad_nd                                    Pad(constant)
flip                                               Slice with step -1
repeat                                             Tile (+ Unsqueeze for new leading dims)
tril / triu                                        Trilu
full_like zeros_like ones_like                     constant (static) / ConstantOfShape(Shape(x))
arange full (symbolic sizes only)                  Range / ConstantOfShape
sym_size.int (symbolic)                            Shape + Gather
=================================================  =============================================

Static-shape creation ops (``arange``, ``full``, ``zeros`` ...) never reach a converter: their
arguments are constants, so the frontend folds them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graph_autofusion.frontend.aten_ops import aten_op
from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _static(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


@aten_op("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def _view(cx: ConvertContext, x: Any, size: Any) -> Value:
    xv = cx.v(x)
    target = cx.out_shape if _static(cx.out_shape) else list(size)
    if xv.shape is not None and tuple(xv.shape) == tuple(target) and _static(target):
        return xv
    return cx.op("Reshape", [xv, cx.ints(list(target))])


@aten_op("permute.default")
def _permute(cx: ConvertContext, x: Any, dims: Any) -> Value:
    xv = cx.v(x)
    rank = len(dims)
    perm = [d % rank for d in dims]
    if perm == list(range(rank)):
        return xv
    return cx.op("Transpose", [xv], {"perm": perm})


@aten_op("t.default")
def _t(cx: ConvertContext, x: Any) -> Value:
    xv = cx.v(x)
    return xv if len(xv.shape) < 2 else cx.op("Transpose", [xv], {"perm": [1, 0]})


@aten_op("transpose.int")
def _transpose(cx: ConvertContext, x: Any, d0: int, d1: int) -> Value:
    xv = cx.v(x)
    rank = len(xv.shape)
    perm = list(range(rank))
    perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
    return xv if perm == list(range(rank)) else cx.op("Transpose", [xv], {"perm": perm})


@aten_op("expand.default", "expand_copy.default")
def _expand(cx: ConvertContext, x: Any, size: Any, implicit: bool = False) -> Value:
    xv = cx.v(x)
    if _static(cx.out_shape):
        if xv.shape is not None and tuple(xv.shape) == tuple(cx.out_shape):
            return xv
        return cx.op("Expand", [xv, cx.ints(list(cx.out_shape))])
    return cx.op("Expand", [xv, cx.ints([1 if s == -1 else s for s in size])])


@aten_op("unsqueeze.default")
def _unsqueeze(cx: ConvertContext, x: Any, dim: int) -> Value:
    rank = len(cx.out_shape)
    return cx.op("Unsqueeze", [cx.v(x), cx.ints([dim % rank])])


@aten_op("squeeze.dims", "squeeze.dim", "squeeze.default")
def _squeeze(cx: ConvertContext, x: Any, dims: Any = None) -> Value:
    xv = cx.v(x)
    shape = xv.shape
    if dims is None:
        dims = list(range(len(shape)))
    elif isinstance(dims, int):
        dims = [dims]
    axes = sorted({d % len(shape) for d in dims if shape[d % len(shape)] == 1}) if shape else []
    if not axes:
        return xv
    return cx.op("Squeeze", [xv, cx.ints(axes)])


@aten_op("slice.Tensor", "slice_copy.Tensor")
def _slice(
    cx: ConvertContext, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Value:
    xv = cx.v(x)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    size = xv.shape[dim] if xv.shape is not None else None
    if isinstance(end, int):
        end = min(end, INT64_MAX)
    if isinstance(size, int) and start == 0 and step == 1 and isinstance(end, int) and end >= size:
        return xv
    return cx.op("Slice", [xv, cx.ints([start]), cx.ints([end]), cx.ints([dim]), cx.ints([step])])


@aten_op("slice_scatter.default")
def _slice_scatter(
    cx: ConvertContext,
    x: Any,
    src: Any,
    dim: int = 0,
    start: Any = None,
    end: Any = None,
    step: int = 1,
) -> Value:
    """``x`` with ``src`` written over ``x[start:end]`` along ``dim`` (a functionalized
    ``y[:, 1:] = ...``, BART's ``shift_tokens_right``): the parts of ``x`` before and after,
    concatenated around ``src``."""
    xv = cx.v(x)
    if step != 1 or xv.shape is None:
        return cx.opaque(cx.node.target, (x, src, dim, start, end, step), {})
    dim %= len(xv.shape)
    sv = cx.v(src, xv.dtype)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    size = xv.shape[dim]
    axes, one = cx.ints([dim]), cx.ints([1])
    parts = []
    if not (isinstance(start, int) and start == 0):
        parts.append(cx.op("Slice", [xv, cx.ints([0]), cx.ints([start]), axes, one]))
    parts.append(sv)
    if not (isinstance(end, int) and (end >= INT64_MAX or (isinstance(size, int) and end >= size))):
        parts.append(cx.op("Slice", [xv, cx.ints([end]), cx.ints([INT64_MAX]), axes, one]))
    return parts[0] if len(parts) == 1 else cx.op("Concat", parts, {"axis": dim})


@aten_op("copy.default")
def _copy(cx: ConvertContext, x: Any, src: Any, non_blocking: bool = False) -> Value:
    """The functional ``x.copy_(src)``: ``src`` in ``x``'s dtype, broadcast to ``x``'s shape."""
    xv = cx.v(x)
    sv = cx.v(src, xv.dtype)
    if xv.shape is not None and sv.shape is not None and tuple(sv.shape) == tuple(xv.shape):
        return sv
    shape = cx.ints(list(xv.shape)) if _static(xv.shape) else cx.op("Shape", [xv])
    return cx.op("Expand", [sv, shape])


@aten_op("select.int", "select_copy.int")
def _select(cx: ConvertContext, x: Any, dim: int, index: Any) -> Value:
    xv = cx.v(x)
    if isinstance(index, int) and index < 0 and isinstance(xv.shape[dim], int):
        index += xv.shape[dim]
    return cx.op("Gather", [xv, cx.v(index, DType.INT64)], {"axis": dim % len(xv.shape)})


@aten_op("index.Tensor")
def _index(cx: ConvertContext, x: Any, indices: Any) -> Value:
    xv = cx.v(x)
    rank = len(xv.shape)
    pos = [i for i, t in enumerate(indices) if t is not None]
    if any(cx.dtype(indices[i]) in (DType.BOOL, DType.UINT8) for i in pos):
        return cx.opaque(cx.node.target, (x, indices), {})
    if len(pos) == 1:
        return cx.op("Gather", [xv, cx.v(indices[pos[0]], DType.INT64)], {"axis": pos[0]})
    shapes = [cx.shape(indices[i]) for i in pos]
    if any(s is None for s in shapes):
        return cx.opaque(cx.node.target, (x, indices), {})
    ivs = [cx.v(indices[i], DType.INT64) for i in pos]
    if all(_static(s) for s in shapes):
        bshape: list[Any] = list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
        target = cx.ints(bshape)
    else:  # symbolic sizes (a mask read at [batch, kv positions]): broadcast at run time
        bshape = [None] * max(len(s) for s in shapes)
        total = ivs[0]
        for iv in ivs[1:]:
            total = cx.op("Add", [total, iv])
        target = cx.op("Shape", [total])
    perm = pos + [d for d in range(rank) if d not in pos]
    if perm != list(range(rank)):
        xv = cx.op("Transpose", [xv], {"perm": perm})
    parts = []
    for iv in ivs:
        if list(iv.shape) != bshape:
            iv = cx.op("Expand", [iv, target])
        parts.append(cx.op("Unsqueeze", [iv, cx.ints([len(bshape)])]))
    out = cx.op("GatherND", [xv, cx.op("Concat", parts, {"axis": -1})], {"batch_dims": 0})
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    if adjacent and pos[0] > 0:
        nb, before, rest = len(bshape), pos[0], rank - len(pos)
        perm2 = list(range(nb, nb + before)) + list(range(nb)) + list(range(nb + before, nb + rest))
        out = cx.op("Transpose", [out], {"perm": perm2})
    return out


@aten_op("index_select.default")
def _index_select(cx: ConvertContext, x: Any, dim: int, index: Any) -> Value:
    return cx.op("Gather", [cx.v(x), cx.v(index, DType.INT64)], {"axis": dim})


@aten_op("gather.default")
def _gather(cx: ConvertContext, x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Value:
    return cx.op("GatherElements", [cx.v(x), cx.v(index, DType.INT64)], {"axis": dim})


@aten_op("scatter.src", "scatter.value", "scatter_add.default", "scatter.reduce")
def _scatter(cx: ConvertContext, x: Any, dim: int, index: Any, src: Any, reduce: Any = None):
    name = cx.node.target._schema.name
    red = (
        "add"
        if name.endswith("scatter_add")
        else {None: "none", "add": "add", "multiply": "mul"}[reduce]
    )
    xv = cx.v(x)
    iv = cx.v(index, DType.INT64)
    sv = cx.v(src, xv.dtype)
    if not isinstance(src, Value) and sv.shape == ():
        shape = cx.ints(list(iv.shape)) if _static(iv.shape) else cx.op("Shape", [iv])
        sv = cx.op("Expand", [sv, shape])
    return cx.op("ScatterElements", [xv, iv, sv], {"axis": dim, "reduction": red})


@aten_op("cat.default")
def _cat(cx: ConvertContext, tensors: Any, dim: int = 0) -> Value:
    dt = cx.out_dtype
    parts = [cx.v(t, dt) for t in tensors]
    parts = [p for p in parts if not (p.shape is not None and tuple(p.shape) == (0,))]
    if len(parts) == 1:
        return parts[0]
    return cx.op("Concat", parts, {"axis": dim % len(cx.out_shape)})


@aten_op("stack.default")
def _stack(cx: ConvertContext, tensors: Any, dim: int = 0) -> Value:
    dt = cx.out_dtype
    d = dim % len(cx.out_shape)
    parts = [cx.op("Unsqueeze", [cx.v(t, dt), cx.ints([d])]) for t in tensors]
    return parts[0] if len(parts) == 1 else cx.op("Concat", parts, {"axis": d})


@aten_op("split_with_sizes.default", "split.Tensor", "split_with_sizes_copy.default")
def _split(cx: ConvertContext, x: Any, sizes: Any, dim: int = 0) -> list[Value]:
    xv = cx.v(x)
    if isinstance(sizes, int):
        total = xv.shape[dim]
        sizes = [min(sizes, total - i) for i in range(0, total, sizes)]
    if len(sizes) == 1:
        return [xv]
    outs = cx.op(
        "Split", [xv, cx.ints(list(sizes))], {"axis": dim % len(xv.shape)}, num_outputs=len(sizes)
    )
    return list(outs)


@aten_op("unbind.int")
def _unbind(cx: ConvertContext, x: Any, dim: int = 0) -> list[Value]:
    xv = cx.v(x)
    d = dim % len(xv.shape)
    n = xv.shape[d]
    outs = [xv] if n == 1 else cx.op("Split", [xv, cx.ints([1] * n)], {"axis": d}, num_outputs=n)
    return [cx.op("Squeeze", [o, cx.ints([d])]) for o in outs]


@aten_op("constant_pad_nd.default")
def _pad(cx: ConvertContext, x: Any, pad: Any, value: float = 0.0) -> Value:
    xv = cx.v(x)
    rank = len(xv.shape)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return cx.op("Pad", [xv, cx.ints(begins + ends), cx.v(value, xv.dtype)], {"mode": "constant"})


@aten_op("flip.default")
def _flip(cx: ConvertContext, x: Any, dims: Any) -> Value:
    n = len(dims)
    return cx.op(
        "Slice",
        [
            cx.v(x),
            cx.ints([-1] * n),
            cx.ints([INT64_MIN] * n),
            cx.ints(list(dims)),
            cx.ints([-1] * n),
        ],
    )


@aten_op("repeat.default")
def _repeat(cx: ConvertContext, x: Any, repeats: Any) -> Value:
    xv = cx.v(x)
    extra = len(repeats) - len(xv.shape)
    if extra > 0:
        xv = cx.op("Unsqueeze", [xv, cx.ints(list(range(extra)))])
    return cx.op("Tile", [xv, cx.ints(list(repeats))])


@aten_op("tril.default", "triu.default")
def _trilu(cx: ConvertContext, x: Any, diagonal: int = 0) -> Value:
    upper = int(cx.node.target._schema.name.endswith("triu"))
    return cx.op("Trilu", [cx.v(x), cx.scalar(int(diagonal), DType.INT64)], {"upper": upper})


def _filled(cx: ConvertContext, x: Any, value: Any) -> Value:
    dt = cx.out_dtype
    shape = cx.out_shape
    if isinstance(value, Value):  # a size (``full_like(x, n - 1)``): read at run time
        target = cx.ints(list(shape)) if _static(shape) else cx.op("Shape", [cx.v(x)])
        return cx.op("Expand", [cx.v(value, dt), target])
    if _static(shape):
        if int(np.prod(shape, dtype=np.int64)) <= 1024:
            return cx.const(np.full(shape, value), dt, "filled")
        return cx.op("Expand", [cx.scalar(value, dt), cx.ints(list(shape))])
    arr = np.array([value], dtype=dt.to_numpy())
    return cx.op("ConstantOfShape", [cx.op("Shape", [cx.v(x)])], {"value": arr})


@aten_op("full_like.default")
def _full_like(cx: ConvertContext, x: Any, value: Any, **kwargs: Any) -> Value:
    return _filled(cx, x, value)


@aten_op("zeros_like.default", "empty_like.default")
def _zeros_like(cx: ConvertContext, x: Any, **kwargs: Any) -> Value:
    return _filled(cx, x, 0)


@aten_op("ones_like.default")
def _ones_like(cx: ConvertContext, x: Any, **kwargs: Any) -> Value:
    return _filled(cx, x, 1)


@aten_op("_local_scalar_dense.default", "item.default")
def _item(cx: ConvertContext, x: Any) -> Any:
    """A one-element tensor read as a number: the 0-d value itself (Dynamo passes a module's
    float attribute that differs between two compiled instances as a 0-d tensor and reads
    it with ``item()``; what uses the number takes the 0-d tensor, cast to its dtype)."""
    xv = cx.v(x)
    if xv.shape == ():
        return xv
    if _static(xv.shape) and int(np.prod(xv.shape)) == 1:
        return cx.op("Reshape", [xv, cx.ints([])])
    return cx.opaque(cx.node.target, (x,), {})


@aten_op("scalar_tensor.default")
def _scalar_tensor(cx: ConvertContext, value: Any, **kwargs: Any) -> Value:
    """``torch.scalar_tensor(n)`` of a size (a size written into a tensor: ``idx[0] = n -
    3``); a constant one is folded before it gets here."""
    return cx.v(value, cx.out_dtype)


@aten_op("sym_size.int")
def sym_size(cx: ConvertContext, x: Any, dim: int) -> Any:
    xv = cx.v(x)
    d = xv.shape[dim] if xv.shape is not None else None
    if isinstance(d, int):
        return d
    return cx.op("Gather", [cx.op("Shape", [xv]), cx.scalar(dim, DType.INT64)], {"axis": 0})


@aten_op("arange.start_step", "arange.start", "arange.default")
def _arange(cx: ConvertContext, *args: Any, **kwargs: Any) -> Value:
    nums = [a for a in args if not isinstance(a, str)]
    start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums + [1])[:3]
    dt = cx.out_dtype
    return cx.op("Range", [cx.v(start, dt), cx.v(end, dt), cx.v(step, dt)])


#: The fill of each creation operator that has one of its own (the others: their value).
#: An empty tensor's values are undefined: zeros.
_FILLS = {"zeros": 0, "ones": 1, "empty": 0, "empty_permuted": 0}


@aten_op(
    "full.default", "zeros.default", "ones.default", "empty.memory_format", "empty_permuted.default"
)
def _full(cx: ConvertContext, size: Any, value: Any = None, **kwargs: Any) -> Value:
    """(empty_permuted's second argument is its memory layout, which a value-semantics graph
    does not keep; a ``new_*`` operator's name without its prefix)"""
    name = cx.node.target._schema.name.split("::")[-1].removeprefix("new_")
    fill = _FILLS.get(name, value)
    if isinstance(fill, Value):  # a size (``torch.full((n,), n - 1)``): read at run time
        return cx.op("Expand", [cx.v(fill, cx.out_dtype), cx.ints(list(size))])
    arr = np.array([fill], dtype=cx.out_dtype.to_numpy())
    return cx.op("ConstantOfShape", [cx.ints(list(size))], {"value": arr})


@aten_op("new_empty.default", "new_zeros.default", "new_ones.default", "new_full.default")
def _new_full(cx: ConvertContext, x: Any, size: Any, value: Any = None, **kwargs: Any) -> Value:
    return _full(cx, size, value)
