"""ATen neural-network converters (contractions, norms, conv/pool, attention, embedding, LSTM).

=================================================  =============================================
ATen                                               canonical (ONNX opset 20)
=================================================  =============================================
linear(x, W, b)                                    MatMul(x, W^T pre-transposed constant) +
                                                   Add(b) (as the ONNX exporters emit it)
addmm(b, x, W) / baddbmm                           MatMul + Add (Mul for alpha/beta != 1)
mm bmm matmul                                      MatMul
layer_norm / native_layer_norm                     LayerNormalization(axis, epsilon)
group_norm / native_group_norm (its output only)   Reshape [N, G, -1], InstanceNormalization,
                                                   Reshape back, Mul(w) and Add(b) per channel
_native_batch_norm_legit_no_training, batch_norm   BatchNormalization(epsilon, momentum)
conv1d/2d/3d, convolution                          Conv / ConvTranspose (explicit pads)
max_pool2d(_with_indices)                          MaxPool (indices: Mod by the plane's size)
avg_pool2d                                         AveragePool(count_include_pad)
adaptive_avg/max_pool                              see ``aten_ops_math``
upsample_(bi/tri)linear(1/2/3)d.vec               Resize(mode=linear, align_corners or
                                                   pytorch_half_pixel; sizes or scales)
upsample_nearest(1/2/3)d.vec                       Resize(mode=nearest, asymmetric, floor)
embedding                                          Gather(W, ids, axis=0)
scaled_dot_product_attention                       MatMul(q, Transpose(k)), Mul(scale),
                                                   Add(mask) (bool mask -> Where(m, 0, -inf),
                                                   is_causal -> constant mask, or Where(
                                                   Range(L)[:,None] >= Range(S)) when a
                                                   length is symbolic), Softmax(-1),
                                                   MatMul(v); enable_gqa -> Unsqueeze/Expand/
                                                   Reshape of k and v. A non-constant mask adds
                                                   Where(IsNaN(out), 0, out) after the last
                                                   MatMul: aten yields 0 for fully masked rows
lstm.input                                         one ONNX LSTM per layer (gates reordered
                                                   torch ifgo -> ONNX iofc), Transpose/Reshape
                                                   between layers, Concat for h_n/c_n
=================================================  =============================================
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from graph_autofusion.frontend.aten_ops import aten_op
from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType


def used_outputs(cx: ConvertContext) -> set[int]:
    import operator

    used = set()
    for u in cx.node.users:
        if u.target is operator.getitem:
            used.add(u.args[1])
        else:
            used.update(range(8))
    return used


# ----- contractions --------------------------------------------------------------------------
def _transpose_last2(cx: ConvertContext, w: Value) -> Value:
    rank = len(w.shape)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return cx.op("Transpose", [w], {"perm": perm})


@aten_op("linear.default")
def linear(cx: ConvertContext, x: Any, w: Any, b: Any = None) -> Value:
    """``x @ w^T + b`` for an nn.Linear-layout weight ``w`` (``[N, K]``; the transformer fast
    path's projections too)."""
    wv = cx.v(w)
    out = cx.op("MatMul", [cx.v(x), _transpose_last2(cx, wv) if len(wv.shape) == 2 else wv])
    return out if b is None else cx.op("Add", [out, cx.v(b)])


@aten_op("addmm.default", "baddbmm.default")
def _addmm(cx: ConvertContext, b: Any, m1: Any, m2: Any, *, beta: Any = 1, alpha: Any = 1):
    dt = cx.out_dtype
    out = cx.op("MatMul", [cx.v(m1, dt), cx.v(m2, dt)])
    if alpha != 1:
        out = cx.op("Mul", [out, cx.scalar(alpha, dt)])
    if beta == 0:
        return out
    bv = cx.v(b, dt)
    if beta != 1:
        bv = cx.op("Mul", [bv, cx.scalar(beta, dt)])
    return cx.op("Add", [out, bv])


@aten_op("mm.default", "bmm.default", "matmul.default")
def _mm(cx: ConvertContext, a: Any, b: Any) -> Value:
    dt = cx.out_dtype
    return cx.op("MatMul", [cx.v(a, dt), cx.v(b, dt)])


# ----- normalization -----------------------------------------------------------------------------
def _layer_norm(cx: ConvertContext, x: Any, shape: Any, w: Any, b: Any, eps: float, n_out: int):
    xv = cx.v(x)
    wv = cx.v(w) if w is not None else cx.const(np.ones(list(shape)), xv.dtype, "ln_scale")
    ins = [xv, wv] + ([cx.v(b)] if b is not None else [])
    attrs = {"axis": -len(shape), "epsilon": float(eps)}
    return cx.op("LayerNormalization", ins, attrs, num_outputs=n_out)


@aten_op("layer_norm.default")
def _ln(cx: ConvertContext, x, shape, w=None, b=None, eps: float = 1e-5, cudnn: bool = True):
    return _layer_norm(cx, x, shape, w, b, eps, 1)


@aten_op("native_layer_norm.default")
def _native_ln(cx: ConvertContext, x, shape, w, b, eps: float):
    used = used_outputs(cx)
    if used <= {0}:
        return [_layer_norm(cx, x, shape, w, b, eps, 1), None, None]
    return list(_layer_norm(cx, x, shape, w, b, eps, 3))


def _group_norm(cx: ConvertContext, x: Any, groups: int, w: Any, b: Any, eps: float) -> Value:
    """``x [N, C, *]`` normalized over each group of ``C / groups`` channels (and every
    spatial position), then ``w`` and ``b`` per channel: an ``InstanceNormalization`` of
    ``x`` seen as ``[N, groups, -1]`` (each row of which is one group), read back in ``x``'s
    shape, as the ONNX exporters write it (ONNX's own ``GroupNormalization`` changed its
    scale's meaning between opsets 18 and 21)."""
    xv = cx.v(x)
    dt = xv.dtype
    flat = cx.op("Reshape", [xv, cx.ints([0, int(groups), -1])])
    ones = cx.const(np.ones(int(groups)), dt, "gn_scale")
    zeros = cx.const(np.zeros(int(groups)), dt, "gn_bias")
    y = cx.op("InstanceNormalization", [flat, ones, zeros], {"epsilon": float(eps)})
    y = cx.op("Reshape", [y, cx.op("Shape", [xv])])
    per_channel = [-1] + [1] * (len(xv.shape) - 2)  # [C, 1, ...]: broadcast over positions
    if w is not None:
        y = cx.op("Mul", [y, cx.op("Reshape", [cx.v(w, dt), cx.ints(per_channel)])])
    if b is not None:
        y = cx.op("Add", [y, cx.op("Reshape", [cx.v(b, dt), cx.ints(per_channel)])])
    return y


@aten_op("native_group_norm.default")
def _native_gn(cx: ConvertContext, x, w, b, n, c, hxw, groups: int, eps: float):
    if not used_outputs(cx) <= {0}:  # the saved mean and rstd (training): torch runs it
        return cx.opaque(cx.node.target, (x, w, b, n, c, hxw, groups, eps), {})
    return [_group_norm(cx, x, groups, w, b, eps), None, None]


@aten_op("group_norm.default")
def _gn(cx: ConvertContext, x, groups: int, w=None, b=None, eps: float = 1e-5, cudnn=True):
    return _group_norm(cx, x, groups, w, b, eps)


def _batch_norm(cx: ConvertContext, x, w, b, mean, var, momentum: float, eps: float) -> Value:
    xv = cx.v(x)
    c = xv.shape[1]
    wv = cx.v(w) if w is not None else cx.const(np.ones(c), xv.dtype, "bn_scale")
    bv = cx.v(b) if b is not None else cx.const(np.zeros(c), xv.dtype, "bn_bias")
    attrs = {"epsilon": float(eps), "momentum": float(1.0 - momentum)}
    return cx.op("BatchNormalization", [xv, wv, bv, cx.v(mean), cx.v(var)], attrs)


@aten_op("_native_batch_norm_legit_no_training.default")
def _bn_no_training(cx: ConvertContext, x, w, b, mean, var, momentum: float, eps: float):
    return [_batch_norm(cx, x, w, b, mean, var, momentum, eps), None, None]


@aten_op("batch_norm.default")
def _bn(
    cx: ConvertContext,
    x,
    w,
    b,
    mean,
    var,
    training: bool,
    momentum: float,
    eps: float,
    cudnn: bool = True,
):
    if training or mean is None:
        return cx.opaque(cx.node.target, (x, w, b, mean, var, training, momentum, eps, cudnn), {})
    return _batch_norm(cx, x, w, b, mean, var, momentum, eps)


# ----- convolution and pooling ---------------------------------------------------------------------
def per_axis(v: Any, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


@aten_op(
    "conv1d.default",
    "conv2d.default",
    "conv3d.default",
    "conv1d.padding",
    "conv2d.padding",
    "conv3d.padding",
)
def _conv(cx: ConvertContext, x, w, b=None, stride=1, padding=0, dilation=1, groups: int = 1):
    return _emit_conv(cx, x, w, b, stride, padding, dilation, groups, False, 0)


@aten_op("convolution.default")
def _convolution(
    cx: ConvertContext, x, w, b, stride, padding, dilation, transposed, out_pad, groups
):
    return _emit_conv(cx, x, w, b, stride, padding, dilation, groups, transposed, out_pad)


def _emit_conv(cx, x, w, b, stride, padding, dilation, groups, transposed, out_pad) -> Value:
    wv = cx.v(w)
    kernel = [int(k) for k in wv.shape[2:]]
    n = len(kernel)
    dil = per_axis(dilation, n)
    if isinstance(padding, str):
        if padding == "valid":
            begins = ends = [0] * n
        else:  # "same": torch puts the odd element at the end
            total = [d * (k - 1) for d, k in zip(dil, kernel)]
            begins = [t // 2 for t in total]
            ends = [t - bg for t, bg in zip(total, begins)]
    else:
        begins = ends = per_axis(padding, n)
    attrs: dict[str, Any] = {
        "kernel_shape": kernel,
        "strides": per_axis(stride, n),
        "pads": list(begins) + list(ends),
        "dilations": dil,
        "group": groups,
    }
    ins = [cx.v(x), wv] + ([cx.v(b)] if b is not None else [])
    if transposed:
        attrs["output_padding"] = per_axis(out_pad, n)
        return cx.op("ConvTranspose", ins, attrs)
    return cx.op("Conv", ins, attrs)


def _pool_attrs(kernel, stride, padding, n: int) -> dict[str, Any]:
    k = per_axis(kernel, n)
    s = per_axis(stride, n) if stride not in (None, [], ()) else k
    p = per_axis(padding, n)
    return {"kernel_shape": k, "strides": s, "pads": p + p}


@aten_op(
    "max_pool2d.default",
    "max_pool1d.default",
    "max_pool3d.default",
    "max_pool2d_with_indices.default",
)
def _max_pool(cx: ConvertContext, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    xv = cx.v(x)
    n = len(xv.shape) - 2
    with_idx = cx.node.target._schema.name.endswith("with_indices")
    attrs = _pool_attrs(kernel, stride, padding, n)
    attrs.update({"dilations": per_axis(dilation, n), "ceil_mode": int(ceil_mode)})
    if with_idx and not used_outputs(cx) <= {0}:
        # onnxruntime's indices count over the whole tensor, torch's within each (n, c)
        # plane: their remainder by the plane's size (max_unpool's input, SegNet-style)
        out, idx = cx.op("MaxPool", [xv], attrs, num_outputs=2)
        spatial = xv.shape[2:]
        if all(isinstance(d, int) for d in spatial):
            plane = cx.scalar(int(np.prod(spatial, dtype=np.int64)), DType.INT64)
        else:
            dims = cx.op("Slice", [cx.op("Shape", [xv]), cx.ints([2]), cx.ints([n + 2])])
            plane = cx.op("ReduceProd", [dims], {"keepdims": 0})
        return [out, cx.op("Mod", [idx, plane])]
    out = cx.op("MaxPool", [xv], attrs)
    return [out, None] if with_idx else out


@aten_op("avg_pool2d.default", "avg_pool1d.default", "avg_pool3d.default")
def _avg_pool(
    cx: ConvertContext,
    x,
    kernel,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    xv = cx.v(x)
    if divisor_override is not None:
        return cx.opaque(
            cx.node.target,
            (x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override),
            {},
        )
    attrs = _pool_attrs(kernel, stride, padding, len(xv.shape) - 2)
    attrs.update({"ceil_mode": int(ceil_mode), "count_include_pad": int(count_include_pad)})
    return cx.op("AveragePool", [xv], attrs)


@aten_op("upsample_linear1d.vec", "upsample_bilinear2d.vec", "upsample_trilinear3d.vec")
def _upsample_linear(cx: ConvertContext, x, output_size, align_corners, scale_factors=None):
    attrs = {
        "mode": "linear",
        "coordinate_transformation_mode": "align_corners"
        if align_corners
        else "pytorch_half_pixel",
    }
    return _resize(cx, x, output_size, scale_factors, attrs)


@aten_op("upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec")
def _upsample_nearest(cx: ConvertContext, x, output_size, scale_factors=None):
    # torch's nearest: source index floor(dst * in / out), or floor(dst / scale)
    attrs = {
        "mode": "nearest",
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    }
    return _resize(cx, x, output_size, scale_factors, attrs)


def _resize(cx: ConvertContext, x, output_size, scale_factors, attrs) -> Any:
    xv = cx.v(x)
    if output_size is None:  # the scale factors, as torch uses them (1 / scale per axis)
        scales = cx.const([1.0, 1.0, *scale_factors], DType.FLOAT, "scales")
        return cx.op("Resize", [xv, None, scales], attrs)
    lead: list[Any] = list(xv.shape[:2])
    for axis, d in enumerate(lead):
        if not isinstance(d, int):  # a symbolic batch or channel count: read at run time
            lead[axis] = cx.op(
                "Gather", [cx.op("Shape", [xv]), cx.scalar(axis, DType.INT64)], {"axis": 0}
            )
    return cx.op("Resize", [xv, None, None, cx.ints([*lead, *output_size])], attrs)


@aten_op("embedding.default")
def _embedding(cx: ConvertContext, w, ids, padding_idx=-1, scale_grad=False, sparse=False):
    return cx.op("Gather", [cx.v(w), cx.v(ids, DType.INT64)], {"axis": 0})


# ----- attention --------------------------------------------------------------------------------
def _repeat_heads(cx: ConvertContext, t: Value, heads: int) -> Value:
    b, hk, s, d = t.shape
    rep = heads // hk
    t5 = cx.op("Unsqueeze", [t, cx.ints([2])])
    t5 = cx.op(
        "Expand",
        [t5, cx.ints([b if isinstance(b, int) else 1, hk, rep, s if isinstance(s, int) else 1, d])],
    )
    out = cx.op("Reshape", [t5, cx.ints([0, heads, -1, d])])
    if out.shape is None:  # symbolic sizes: shape inference on meta tensors cannot run
        out.shape, out.dtype = (b, heads, s, d), t.dtype
    return out


@aten_op("scaled_dot_product_attention.default")
def _sdpa(
    cx: ConvertContext,
    q,
    k,
    v,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
):
    qv, kv, vv = cx.v(q), cx.v(k), cx.v(v)
    dt = qv.dtype
    if enable_gqa and kv.shape[-3] != qv.shape[-3]:
        kv = _repeat_heads(cx, kv, qv.shape[-3])
        vv = _repeat_heads(cx, vv, qv.shape[-3])
    e = qv.shape[-1]
    s = scale if scale is not None else 1.0 / math.sqrt(e)
    scores = cx.op("MatMul", [qv, _transpose_last2(cx, kv)])
    scores = cx.op("Mul", [scores, cx.scalar(s, dt)])
    if is_causal:
        scores = cx.op("Add", [scores, _causal_mask(cx, qv, kv, dt)])
    if attn_mask is not None:
        if cx.dtype(attn_mask) == DType.BOOL:
            keep = cx.v(attn_mask)
            mv = cx.op("Where", [keep, cx.scalar(0.0, dt), cx.scalar(float("-inf"), dt)])
            if mv.shape is None and keep.shape is not None:
                # a symbolic length stops inference: the attention lowering needs the mask's
                # rank and shape (a key-padding mask [B, 1, 1, T] gets a row per query)
                mv.shape, mv.dtype = tuple(keep.shape), dt
        else:
            mv = cx.v(attn_mask, dt)
        scores = cx.op("Add", [scores, mv])
    probs = cx.op("Softmax", [scores], {"axis": -1})
    out = cx.op("MatMul", [probs, vv])
    if attn_mask is not None and _may_mask_whole_row(mv):
        # aten's SDPA returns 0 for a query row whose keys are all masked, where Softmax gives
        # NaN: zero those rows after the attention chain (keeps MatMul..MatMul contiguous).
        out = cx.op("Where", [cx.op("IsNaN", [out]), cx.scalar(0.0, dt), out])
    return out


def _causal_mask(cx: ConvertContext, q: Value, k: Value, dt: DType) -> Value:
    """torch's ``is_causal`` mask, ``[L, S]``: 0 where key ``j <= i`` (query ``i``), else -inf
    (top-left aligned, ``ones(L, S).tril()``, whatever ``S`` is). A constant for static
    lengths; for symbolic ones, built at run time: ``Where(Range(L)[:, None] >=
    Range(S)[None, :], 0, -inf)``."""
    L, S = q.shape[-2], k.shape[-2]
    if isinstance(L, int) and isinstance(S, int):
        keep = np.tril(np.ones((L, S), dtype=bool))
        return cx.const(np.where(keep, 0.0, -np.inf), dt, "causal_mask")

    def positions(x: Value, n: int | str, axis: int) -> Value:
        if isinstance(n, int):
            return cx.const(np.arange(n).reshape((n, 1) if axis == 1 else (1, n)))
        size = cx.op("Gather", [cx.op("Shape", [x]), cx.scalar(-2, DType.INT64)], {"axis": 0})
        zero, one = cx.scalar(0, DType.INT64), cx.scalar(1, DType.INT64)
        r = cx.op("Range", [zero, size, one])
        r.shape, r.dtype = (n,), DType.INT64
        out = cx.op("Unsqueeze", [r, cx.ints([axis])])
        out.shape, out.dtype = ((n, 1) if axis == 1 else (1, n)), DType.INT64
        return out

    keep = cx.op("GreaterOrEqual", [positions(q, L, 1), positions(k, S, 0)])
    keep.shape, keep.dtype = (L, S), DType.BOOL
    mask = cx.op("Where", [keep, cx.scalar(0.0, dt), cx.scalar(float("-inf"), dt)])
    mask.shape, mask.dtype = (L, S), dt
    return mask


def _may_mask_whole_row(mask: Value) -> bool:
    if mask.const is None:
        return True
    return bool(np.isneginf(np.asarray(mask.const)).all(axis=-1).any())


# ----- LSTM -------------------------------------------------------------------------------------
def _iofc(t: torch.Tensor) -> np.ndarray:
    i, f, g, o = torch.chunk(t.detach(), 4, dim=0)
    return torch.cat([i, o, f, g], dim=0).float().numpy()


@aten_op("lstm.input")
def _lstm(
    cx: ConvertContext,
    x,
    hx,
    params,
    has_biases,
    num_layers,
    dropout,
    train,
    bidirectional,
    batch_first,
):
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != num_layers * dirs * per or not all(
        isinstance(p, torch.Tensor) for p in params
    ):
        return cx.opaque(
            cx.node.target,
            (x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first),
            {},
        )
    xv = cx.v(x)
    dt = xv.dtype
    if batch_first:
        xv = cx.op("Transpose", [xv], {"perm": [1, 0, 2]})
    h0, c0 = cx.v(hx[0], dt), cx.v(hx[1], dt)
    hidden = params[1].shape[1]
    hs, cs = [], []
    for layer in range(num_layers):
        ws, rs, bs = [], [], []
        for d in range(dirs):
            p = params[(layer * dirs + d) * per : (layer * dirs + d + 1) * per]
            ws.append(_iofc(p[0]))
            rs.append(_iofc(p[1]))
            if has_biases:
                bs.append(np.concatenate([_iofc(p[2]), _iofc(p[3])]))
            else:
                bs.append(np.zeros(8 * hidden, dtype=np.float32))
        sl = [cx.ints([layer * dirs]), cx.ints([(layer + 1) * dirs]), cx.ints([0])]
        h_l = cx.op("Slice", [h0, *sl])
        c_l = cx.op("Slice", [c0, *sl])
        ins = [
            xv,
            cx.const(np.stack(ws), dt, "lstm_W"),
            cx.const(np.stack(rs), dt, "lstm_R"),
            cx.const(np.stack(bs), dt, "lstm_B"),
            None,
            h_l,
            c_l,
        ]
        attrs = {
            "hidden_size": int(hidden),
            "direction": "bidirectional" if bidirectional else "forward",
        }
        y, yh, yc = cx.op("LSTM", ins, attrs, num_outputs=3)
        hs.append(yh)
        cs.append(yc)
        y = cx.op("Transpose", [y], {"perm": [0, 2, 1, 3]})
        xv = cx.op("Reshape", [y, cx.ints([0, 0, -1])])
    if batch_first:
        xv = cx.op("Transpose", [xv], {"perm": [1, 0, 2]})
    h_n = hs[0] if len(hs) == 1 else cx.op("Concat", hs, {"axis": 0})
    c_n = cs[0] if len(cs) == 1 else cx.op("Concat", cs, {"axis": 0})
    return [xv, h_n, c_n]
