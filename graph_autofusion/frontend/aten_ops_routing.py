"""ATen converters for token routing: sorting, counting and per-group matrix products.

Mixture-of-experts layers (Hugging Face's ``grouped_mm`` experts, which every MoE family in
``transformers`` shares) sort the routed tokens by expert, count them per expert and multiply
each expert's rows by its own weight. Their ONNX forms:

=================================================  =============================================
ATen                                               canonical (ONNX opset 20)
=================================================  =============================================
sort (.default, .stable)                           TopK(k = the axis' size, largest=descending);
                                                   ONNX breaks ties by the lower index, a
                                                   stable sort
histc (constant min < max)                         bin = Cast((x - min) * bins / (max - min))
                                                   to int64 (torch's arithmetic, in x's
                                                   dtype), max in the last bin; counts:
                                                   ReduceSum of the one-hot bins of the values
                                                   in [min, max]
_grouped_mm, transformers::grouped_mm_fallback     per expert g (their number is static): rows
(2-D rows, 3-D weights, cumulative ``offs``)       Range(offs[g-1], offs[g]) Gathered, MatMul
                                                   by weight g (+ bias g), Concat; rows past
                                                   offs[-1] zero (Pad), as the fallback leaves
                                                   them
=================================================  =============================================

A weight that is a parameter (or its transpose, as the experts hand it over) is read per
expert as a view of the parameter's memory, never copied, as the linear layers' weights are.
Anything else (a histogram over the data's own range, other ranks) stays an opaque ``aten``
node that the torch program runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graph_autofusion.frontend.aten_ops import aten_op
from graph_autofusion.frontend.aten_ops_tensor import sym_size
from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType


@aten_op("sort.default", "sort.stable")
def _sort(
    cx: ConvertContext,
    x: Any,
    *args: Any,
    stable: bool | None = None,
    dim: int = -1,
    descending: bool = False,
) -> list[Value]:
    if cx.node.target._overloadname == "default":  # sort(self, dim=-1, descending=False)
        dim = args[0] if args else dim
        descending = args[1] if len(args) > 1 else descending
    xv = cx.v(x)
    if xv.shape is None or len(xv.shape) == 0:  # a 0-d sort: torch's own operator
        return cx.opaque(cx.node.target, (x,), _sort_args(cx, dim, descending))
    axis = dim % len(xv.shape)
    return cx.op(
        "TopK",
        [xv, cx.ints([sym_size(cx, xv, axis)])],  # k: the whole axis
        {"axis": axis, "largest": int(bool(descending)), "sorted": 1},
        num_outputs=2,
    )


def _sort_args(cx: ConvertContext, dim: int, descending: bool) -> dict[str, Any]:
    """The keyword arguments of the opaque ``sort`` node (``stable`` has no default)."""
    kw: dict[str, Any] = {"dim": dim, "descending": descending}
    if cx.node.target._overloadname == "stable":
        kw["stable"] = cx.node.kwargs.get("stable")
    return kw


@aten_op("histc.default")
def _histc(cx: ConvertContext, x: Any, bins: int = 100, min: Any = 0, max: Any = 0) -> Value:
    lo, hi = min, max
    xv = cx.v(x)
    fixed = all(isinstance(b, int | float) and not isinstance(b, bool) for b in (lo, hi))
    fixed = fixed and isinstance(bins, int) and bins >= 1  # not a symbolic bin count
    if not fixed or not lo < hi or xv.dtype not in (DType.FLOAT, DType.DOUBLE):
        # a range taken from the data itself: torch's own operator
        return cx.opaque(cx.node.target, (x, bins, lo, hi), {})
    dt = xv.dtype
    # torch's own arithmetic (its linear-interpolation histogram, no search among edges):
    # bin = int((x - min) * bins / (max - min)) in the input's dtype, max in the last bin
    flat = cx.op("Reshape", [xv, cx.ints([-1, 1])])
    scaled = cx.op(
        "Div",
        [
            cx.op("Mul", [cx.op("Sub", [flat, cx.scalar(float(lo), dt)]), cx.scalar(bins, dt)]),
            cx.scalar(float(np.array(hi, dt.to_numpy()) - np.array(lo, dt.to_numpy())), dt),
        ],
    )
    pos = cx.op(
        "Min", [cx.op("Cast", [scaled], {"to": int(DType.INT64)}), cx.scalar(bins - 1, DType.INT64)]
    )  # [n, 1]
    inside = cx.op(
        "And",
        [
            cx.op("GreaterOrEqual", [flat, cx.scalar(float(lo), dt)]),
            cx.op("LessOrEqual", [flat, cx.scalar(float(hi), dt)]),
        ],
    )
    hit = cx.op(
        "And", [cx.op("Equal", [pos, cx.const(np.arange(bins)[None, :], DType.INT64)]), inside]
    )
    counts = cx.op("ReduceSum", [cx.op("Cast", [hit], {"to": int(dt)}), cx.ints([0])])
    return cx.op("Reshape", [counts, cx.ints([bins])])


@aten_op("grouped_mm_fallback.default", "_grouped_mm.default")
def _grouped_mm(
    cx: ConvertContext, a: Any, b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None
) -> Value:
    av = cx.v(a)
    bshape = cx.shape(b)
    static = bshape is not None and len(bshape) == 3 and isinstance(bshape[0], int)
    if offs is None or out_dtype is not None or not static or len(av.shape or ()) != 2:
        return cx.opaque(cx.node.target, (a, b, offs, bias, out_dtype), {})
    groups = bshape[0]
    ends = cx.v(offs, DType.INT64)
    one = cx.scalar(1, DType.INT64)
    start = cx.scalar(0, DType.INT64)
    parts = []
    for g in range(groups):
        end = cx.op("Gather", [ends, cx.scalar(g, DType.INT64)], {"axis": 0})
        rows = cx.op("Gather", [av, cx.op("Range", [start, end, one])], {"axis": 0})
        out = cx.op("MatMul", [rows, _expert_weight(cx, b, g)])
        if bias is not None:
            out = cx.op("Add", [out, cx.op("Gather", [cx.v(bias), cx.scalar(g, DType.INT64)])])
        parts.append(out)
        start = end
    out = cx.op("Concat", parts, {"axis": 0}) if groups > 1 else parts[0]
    # the fallback leaves the rows past offs[-1] (routed to no expert here) at zero
    past = cx.op("Sub", [cx.op("Gather", [cx.op("Shape", [av]), cx.scalar(0, DType.INT64)]), start])
    zero = cx.const([0])
    pads = cx.op("Concat", [zero, zero, cx.op("Reshape", [past, cx.ints([1])]), zero], {"axis": 0})
    return cx.op("Pad", [out, pads])


def _expert_weight(cx: ConvertContext, b: Any, g: int) -> Value:
    """Expert ``g``'s [K, N] weight: for a parameter (or its transpose over the last two
    axes, the experts' ``weight.transpose(-2, -1)``), a view of the parameter's memory;
    otherwise a Gather."""
    if isinstance(b, torch.Tensor) and b.dim() == 3:
        w = b.detach()[g]
        name = f"{_param_name(cx)}_{g}"
        if w.is_contiguous():
            cx.name_constant(w, name)
            return cx.v(w)
        if w.t().is_contiguous():  # read through the transpose, as a linear's weight
            base = w.t()
            cx.name_constant(base, name)
            return cx.op("Transpose", [cx.v(base)], {"perm": [1, 0]})
    return cx.op("Gather", [cx.v(b), cx.scalar(g, DType.INT64)], {"axis": 0})


def _param_name(cx: ConvertContext) -> str:
    """The placeholder the weight argument comes from (through a transpose), for names."""
    node = cx.node.args[1]
    while isinstance(node, torch.fx.Node) and node.op != "placeholder" and node.args:
        node = node.args[0]
    return getattr(node, "name", "expert_weight")
