"""Torch implementations of the neural-network operators (ONNX) and common contrib operators."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.runtime.torch_ops import OpCall, tensor_version, torch_op

Tensor = torch.Tensor
_MS = "com.microsoft"


def _spatial_pads(call: OpCall, x: Tensor, kernel: list[int], strides: list[int], dil: list[int]):
    """ONNX pads (begins..., ends...) honouring ``auto_pad``."""
    n = len(kernel)
    auto = call.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads_b, pads_e = [], []
        for i in range(n):
            size = x.shape[2 + i]
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - size, 0)
            small = total // 2
            big = total - small
            pads_b.append(big if auto == "SAME_LOWER" else small)
            pads_e.append(small if auto == "SAME_LOWER" else big)
        return pads_b + pads_e
    if auto == "VALID":
        return [0] * (2 * n)
    return list(call.attr("pads", [0] * (2 * n)))


def _torch_padding(x: Tensor, pads: list[int], value: float = 0.0) -> tuple[Tensor, list[int]]:
    """Symmetric part as a torch padding list; asymmetric remainder applied with ``F.pad``."""
    n = len(pads) // 2
    b, e = pads[:n], pads[n:]
    if b == e:
        return x, b
    extra: list[int] = []
    for i in reversed(range(n)):
        extra += [b[i], e[i]]
    return F.pad(x, extra, value=value), [0] * n


@torch_op("Conv")
def _conv(call: OpCall, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    n = x.dim() - 2
    kernel = list(w.shape[2:])
    strides = list(call.attr("strides", [1] * n))
    dil = list(call.attr("dilations", [1] * n))
    x, pad = _torch_padding(x, _spatial_pads(call, x, kernel, strides, dil))
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    return fn(x, w, b, strides, pad, dil, call.attr("group", 1))


@torch_op("ConvTranspose")
def _conv_transpose(call: OpCall, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    n = x.dim() - 2
    strides = list(call.attr("strides", [1] * n))
    dil = list(call.attr("dilations", [1] * n))
    pads = list(call.attr("pads", [0] * (2 * n)))
    if pads[:n] != pads[n:] or call.attr("output_shape") is not None:
        raise UnsupportedOperatorError("ConvTranspose with asymmetric pads/output_shape")
    outpad = list(call.attr("output_padding", [0] * n))
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
    return fn(x, w, b, strides, pads[:n], outpad, call.attr("group", 1), dil)


@torch_op("MaxPool")
def _maxpool(call: OpCall, x: Tensor):
    kernel = list(call.attr("kernel_shape"))
    n = len(kernel)
    strides = list(call.attr("strides", [1] * n))
    dil = list(call.attr("dilations", [1] * n))
    pads = _spatial_pads(call, x, kernel, strides, dil)
    x, pad = _torch_padding(x, pads, value=float("-inf"))
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
    ceil = bool(call.attr("ceil_mode", 0))
    if call.num_outputs == 1:
        return fn(x, kernel, strides, pad, dil, ceil_mode=ceil)
    y, idx = fn(x, kernel, strides, pad, dil, ceil_mode=ceil, return_indices=True)
    plane = 1
    for d in x.shape[2:]:
        plane *= d
    base = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(x.shape[:2] + (1,) * n)
    return y, idx + base * plane


@torch_op("AveragePool")
def _avgpool(call: OpCall, x: Tensor) -> Tensor:
    kernel = list(call.attr("kernel_shape"))
    n = len(kernel)
    strides = list(call.attr("strides", [1] * n))
    pads = _spatial_pads(call, x, kernel, strides, [1] * n)
    include = bool(call.attr("count_include_pad", 0))
    ceil = bool(call.attr("ceil_mode", 0))
    if pads[:n] != pads[n:]:
        if not include:
            raise UnsupportedOperatorError(
                "AveragePool with asymmetric pads and count_include_pad=0"
            )
        x, pad = _torch_padding(x, pads)
    else:
        pad = pads[:n]
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
    return fn(x, kernel, strides, pad, ceil_mode=ceil, count_include_pad=include)


@torch_op("GlobalAveragePool")
def _gap(call: OpCall, x: Tensor) -> Tensor:
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@torch_op("GlobalMaxPool")
def _gmp(call: OpCall, x: Tensor) -> Tensor:
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@torch_op("BatchNormalization")
def _batchnorm(call: OpCall, x, scale, bias, mean, var) -> Tensor:
    if call.attr("training_mode", 0):
        raise UnsupportedOperatorError("BatchNormalization with training_mode=1")
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, call.attr("epsilon", 1e-5))


@torch_op("InstanceNormalization")
def _instnorm(call: OpCall, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    return F.instance_norm(x, weight=scale, bias=bias, eps=call.attr("epsilon", 1e-5))


@torch_op("GroupNormalization")
def _groupnorm(call: OpCall, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    g = call.attr("num_groups")
    if scale.shape[0] == g and g != x.shape[1]:  # opset-18 per-group scale
        rep = x.shape[1] // g
        scale, bias = scale.repeat_interleave(rep), bias.repeat_interleave(rep)
    return F.group_norm(x, g, scale, bias, call.attr("epsilon", 1e-5))


def _layer_norm(x: Tensor, axis: int, scale, bias, eps: float, n_out: int, rms: bool = False):
    axis = axis % x.dim()
    dims = tuple(range(axis, x.dim()))
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if rms:
        inv = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
        y = (xf * inv).to(x.dtype) * scale
        if bias is not None:
            y = y + bias
        return (y, inv) if n_out > 1 else y
    y = F.layer_norm(
        x,
        x.shape[axis:],
        scale.expand(x.shape[axis:]) if scale is not None else None,
        bias.expand(x.shape[axis:]) if bias is not None else None,
        eps,
    )
    if n_out == 1:
        return y
    mean = xf.mean(dims, keepdim=True)
    inv = torch.rsqrt(((xf - mean) ** 2).mean(dims, keepdim=True) + eps)
    return (y, mean, inv)[:n_out]


@torch_op("LayerNormalization")
def _ln(call: OpCall, x: Tensor, scale: Tensor, bias: Tensor | None = None):
    return _layer_norm(
        x, call.attr("axis", -1), scale, bias, call.attr("epsilon", 1e-5), call.num_outputs
    )


@torch_op("SimplifiedLayerNormalization")
@torch_op("SimplifiedLayerNormalization", domain=_MS)
def _sln(call: OpCall, x: Tensor, scale: Tensor):
    return _layer_norm(
        x,
        call.attr("axis", -1),
        scale,
        None,
        call.attr("epsilon", 1e-5),
        call.num_outputs,
        rms=True,
    )


@torch_op("RMSNormalization")
def _rmsnorm(call: OpCall, x: Tensor, scale: Tensor):
    return _layer_norm(x, call.attr("axis", -1), scale, None, call.attr("epsilon", 1e-5), 1, True)


@torch_op("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain=_MS)
def _skip_ln(call: OpCall, x, skip, gamma, beta=None, bias=None):
    rms = call.node.op_type == "SkipSimplifiedLayerNormalization"
    if rms:
        bias, beta = beta, None
    s = x + skip
    if bias is not None:
        s = s + bias
    eps = call.attr("epsilon", 1e-12 if not rms else 1e-6)
    y = _layer_norm(s, -1, gamma, beta, eps, 1, rms)
    if call.num_outputs == 1:
        return y
    # outputs: output, mean, inv_std_var, input_skip_bias_sum (only the last is computed)
    empty = torch.empty(0, dtype=torch.float32, device=x.device)
    outs = [y, empty, empty, s]
    return tuple(outs[: call.num_outputs])


@torch_op("Gelu", domain=_MS)
def _ms_gelu(call: OpCall, x: Tensor) -> Tensor:
    return F.gelu(x)


@torch_op("BiasGelu", domain=_MS)
def _bias_gelu(call: OpCall, x: Tensor, b: Tensor) -> Tensor:
    return F.gelu(x + b)


@torch_op("FastGelu", domain=_MS)
def _fast_gelu(call: OpCall, x: Tensor, b: Tensor | None = None) -> Tensor:
    return F.gelu(x if b is None else x + b, approximate="tanh")


@torch_op("QuickGelu", domain=_MS)
def _quick_gelu(call: OpCall, x: Tensor) -> Tensor:
    return x * torch.sigmoid(call.attr("alpha", 1.702) * x)


@torch_op("BiasAdd", domain=_MS)
def _bias_add(call: OpCall, x: Tensor, bias: Tensor, skip: Tensor) -> Tensor:
    return x + bias + skip


_ACT = {"Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "": lambda t: t}


def node_cached(
    call: OpCall,
    slot: str,
    sources: tuple[Tensor | None, ...],
    extra: Any,
    make: Any,
    limit: int = 4,
) -> Any:
    """``make()``, kept on the node's call while the same ``sources`` tensors (the same
    objects, at the same versions) and ``extra`` come in: a weight derived from a constant
    (reordered, packed) is made once, not per call. Sources that require grad are not cached."""
    cache = call.__dict__.setdefault(slot, {})
    key = (tuple(None if t is None else (id(t), tensor_version(t)) for t in sources), extra)
    hit = cache.get(key)
    if hit is not None and all(a is t for a, t in zip(hit[0], sources)):  # ids can be reused
        return hit[1]
    value = make()
    if not any(t is not None and t.requires_grad for t in sources):
        if len(cache) >= limit:
            cache.clear()
        cache[key] = (sources, value)
    return value


def _packed_conv(call: OpCall, x, w, b, z) -> Tensor | None:
    """The fused conv on oneDNN with its weight reordered once into the blocked layout
    (``mkldnn._convolution_pointwise``, what Inductor's freezing uses), the residual add and
    the Relu as its post-ops; ``None`` when this call does not qualify (the caller runs the
    plain form). The reordered weight is cached per node, weight and input shape."""
    act = call.attr("activation", "")
    if act not in ("", "Relu") or x.dim() != 4 or x.dtype != torch.float32 or x.requires_grad:
        return None
    if not torch.backends.mkldnn.is_available() or w.requires_grad:
        return None
    kernel = list(w.shape[2:])
    strides = list(call.attr("strides", [1, 1]))
    dil = list(call.attr("dilations", [1, 1]))
    pads = _spatial_pads(call, x, kernel, strides, dil)
    if pads[:2] != pads[2:]:
        return None
    pad = list(pads[:2])
    groups = call.attr("group", 1)
    try:
        packed = node_cached(
            call,
            "_packed_conv",
            (w,),
            tuple(x.shape),
            lambda: torch.ops.mkldnn._reorder_convolution_weight(
                w, pad, strides, dil, groups, list(x.shape)
            ),
        )
    except (RuntimeError, AttributeError):
        return None
    unary = "relu" if act == "Relu" else "none"
    if z is None:
        return torch.ops.mkldnn._convolution_pointwise(
            x, packed, b, pad, strides, dil, groups, unary, [], ""
        )
    out_hw = [
        (x.shape[2 + i] + 2 * pad[i] - dil[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i in range(2)
    ]
    if tuple(z.shape) != (x.shape[0], w.shape[0], *out_hw) or z.dtype != x.dtype:
        return None
    if unary == "none":  # oneDNN's binary post-op is defined only with an activation after it
        y = torch.ops.mkldnn._convolution_pointwise(
            x, packed, b, pad, strides, dil, groups, "none", [], ""
        )
        return y.add_(z)
    return torch.ops.mkldnn._convolution_pointwise(
        x, z, packed, b, pad, strides, dil, groups, "add", 1.0, unary, [], ""
    )


@torch_op("FusedConv", domain=_MS)
def _fused_conv(call: OpCall, x, w, b=None, z=None) -> Tensor:
    fast = _packed_conv(call, x, w, b, z)
    if fast is not None:
        return fast
    y = _conv(call, x, w, b)  # a fresh tensor: the epilogue runs in place on it
    inplace = not y.requires_grad
    if z is not None:
        y = y.add_(z) if inplace and z.shape == y.shape else y + z
    act = call.attr("activation", "")
    if act == "LeakyRelu":
        return F.leaky_relu(y, (call.attr("activation_params") or [0.01])[0], inplace=inplace)
    if act == "Clip":
        lo, hi = call.attr("activation_params")
        return y.clamp_(lo, hi) if inplace else torch.clamp(y, lo, hi)
    if act == "Relu" and inplace:
        return y.relu_()
    return _ACT[act](y)


def _reorder_iofc_to_ifgo(t: Tensor, hidden: int) -> Tensor:
    i, o, f, c = torch.split(t, hidden, dim=0)
    return torch.cat([i, f, c, o], dim=0)


def _lstm_params(call: OpCall, w, r, b, dirs: int, hidden: int, x) -> list[Tensor]:
    """torch's LSTM weights (gates reordered iofc -> ifgo), cached per node while the same
    weight tensors at the same versions come in (constants: reordered once, not per call)."""

    def reorder() -> list[Tensor]:
        params: list[Tensor] = []
        for d in range(dirs):
            zeros = torch.zeros(8 * hidden, dtype=x.dtype, device=x.device)
            bias = b[d] if b is not None else zeros
            params += [
                _reorder_iofc_to_ifgo(w[d], hidden),
                _reorder_iofc_to_ifgo(r[d], hidden),
                _reorder_iofc_to_ifgo(bias[: 4 * hidden], hidden),
                _reorder_iofc_to_ifgo(bias[4 * hidden :], hidden),
            ]
        return params

    return node_cached(call, "_lstm_params", (w, r, b), (x.dtype, x.device), reorder)


@torch_op("LSTM")
def _lstm(call: OpCall, x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None):
    """ONNX LSTM executed by torch's fused LSTM (gates reordered iofc -> ifgo)."""
    if p is not None or call.attr("clip") is not None or call.attr("input_forget", 0):
        raise UnsupportedOperatorError("LSTM with peepholes, clip or input_forget")
    acts = call.attr("activations")
    if acts and [a.lower() for a in acts[:3]] != ["sigmoid", "tanh", "tanh"]:
        raise UnsupportedOperatorError(f"LSTM with activations {acts}")
    layout = call.attr("layout", 0)
    if layout:
        x = x.transpose(0, 1)
        h0 = h0.transpose(0, 1) if h0 is not None else None
        c0 = c0.transpose(0, 1) if c0 is not None else None
    hidden = call.attr("hidden_size") or r.shape[-1]
    dirs = w.shape[0]
    batch = x.shape[1]
    if h0 is None:
        h0 = torch.zeros(dirs, batch, hidden, dtype=x.dtype, device=x.device)
    if c0 is None:
        c0 = torch.zeros(dirs, batch, hidden, dtype=x.dtype, device=x.device)
    params = _lstm_params(call, w, r, b, dirs, hidden, x)
    direction = call.attr("direction", "forward")
    if direction == "reverse":
        x = torch.flip(x, [0])
    y, hn, cn = torch.lstm(x, (h0, c0), params, True, 1, 0.0, False, dirs == 2, False)
    if direction == "reverse":
        y = torch.flip(y, [0])
    y = y.reshape(y.shape[0], batch, dirs, hidden).permute(0, 2, 1, 3)
    if layout:
        y, hn, cn = y.permute(2, 0, 1, 3), hn.transpose(0, 1), cn.transpose(0, 1)
    return (y, hn, cn)[: call.num_outputs]


@torch_op("GridSample")
def _grid_sample(call: OpCall, x: Tensor, grid: Tensor) -> Tensor:
    mode = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}
    return torch.nn.functional.grid_sample(
        x,
        grid,
        mode=mode[call.attr("mode", "linear")],
        padding_mode=call.attr("padding_mode", "zeros"),
        align_corners=bool(call.attr("align_corners", 0)),
    )


@torch_op("Resize")
def _resize(call: OpCall, x, roi=None, scales=None, sizes=None) -> Tensor:
    mode = call.attr("mode", "nearest")
    ctm = call.attr("coordinate_transformation_mode", "half_pixel")
    if sizes is not None and sizes.numel():
        size = [int(v) for v in sizes.tolist()][2:]
        kw: dict = {"size": size}
    else:
        kw = {"scale_factor": [float(v) for v in scales.tolist()][2:]}
    if (
        mode == "nearest"
        and ctm == "asymmetric"
        and call.attr("nearest_mode", "round_prefer_floor") == "floor"
    ):
        return F.interpolate(x, mode="nearest", **kw)
    if mode == "linear" and ctm in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        m = {3: "linear", 4: "bilinear", 5: "trilinear"}[x.dim()]
        return F.interpolate(x, mode=m, align_corners=ctm == "align_corners", **kw)
    if mode == "cubic" and ctm in ("half_pixel", "align_corners") and x.dim() == 4:
        return F.interpolate(x, mode="bicubic", align_corners=ctm == "align_corners", **kw)
    raise UnsupportedOperatorError(f"Resize mode={mode} coordinate_transformation_mode={ctm}")
