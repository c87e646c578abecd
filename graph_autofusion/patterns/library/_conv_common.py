"""Shared pieces of the CNN rules: Conv and BatchNormalization patterns, BN folding, FusedConv.

Not a rule module (the leading underscore keeps it out of rule discovery).

Folding an inference BatchNormalization into the Conv that feeds it::

    s  = gamma / sqrt(var + eps)                 (per output channel)
    W' = W * s[:, None, ...]
    b' = (b - mean) * s + beta                   (b = 0 when the Conv has no bias)

The folded weights are new initializers; the original ones are left untouched (another node
may still read them). The arithmetic runs in float64 and is cast back to the weight's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graph_autofusion.catalog.definitions.control import ExecScope, call_op
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Node, Value
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError

MS = "com.microsoft"

#: Conv attributes FusedConv shares with Conv.
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def conv(p: PatternBuilder, *, const_weight: bool = False, label: str = "conv") -> Pattern:
    """``Conv(x, w[, b])``; the optional bias is read from the node in the rewrite."""
    w = p.const("w") if const_weight else p.var("w")
    return p.Conv(p.var("x"), w, _label=label, _exact=False)


def batch_norm(p: PatternBuilder, inner: Pattern, label: str = "bn") -> Pattern:
    """Inference ``BatchNormalization(inner, scale, B, mean, var)`` with constant parameters."""
    return p.BatchNormalization(
        inner,
        p.const("bn_scale"),
        p.const("bn_bias"),
        p.const("bn_mean"),
        p.const("bn_var"),
        training_mode=lambda v: not v,
        _label=label,
    )


def bn_single_output(ctx: MatchContext) -> str | None:
    """Check: the BatchNormalization has one output (inference mode)."""
    bn = ctx.nodes.get("bn")
    if bn is not None and len(bn.outputs) != 1:
        return (
            f"BatchNormalization {bn.name!r} has {len(bn.outputs)} outputs "
            f"(training statistics); only the inference form folds"
        )
    return None


def live_input(node: Node, index: int) -> Value:
    """Input ``index`` of a matched node, read from the node itself.

    A rewrite must not use ``ctx.value(var)`` for a value another match may have produced:
    when that match was rewritten first, the binding still names the replaced value, while
    the node's input was redirected to its replacement.
    """
    value = node.inputs[index]
    if value is None:
        raise RewriteError(f"node {node.name!r} input {index} is omitted")
    return value


def conv_bias(node: Node) -> Value | None:
    """The Conv's bias input, if present."""
    return node.inputs[2] if len(node.inputs) > 2 else None


def conv_attrs(node: Node) -> dict[str, Any]:
    """The Conv node's attributes that FusedConv / a new Conv should carry."""
    return {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}


def fold_bn(ctx: RewriteContext) -> tuple[Value, Value]:
    """New (W', b') initializers folding the matched BN into the matched Conv."""
    conv_node = ctx.label("conv")
    bn = ctx.label("bn")
    w = const_value(live_input(conv_node, 1))
    if w is None:
        raise RewriteError("the Conv weight is not constant")
    gamma, beta = ctx.const("bn_scale"), ctx.const("bn_bias")
    mean, var = ctx.const("bn_mean"), ctx.const("bn_var")
    m = w.shape[0]
    params = {"scale": gamma, "B": beta, "mean": mean, "var": var}
    for name, arr in params.items():
        if arr is None or arr.size != m:
            raise RewriteError(
                f"BatchNormalization {name} has {None if arr is None else arr.size} elements, "
                f"the Conv has {m} output channels"
            )
    b_val = conv_bias(conv_node)
    if b_val is not None:
        b = const_value(b_val)
        if b is None:
            raise RewriteError("the Conv bias is not constant")
        if b.size != m:
            raise RewriteError(f"the Conv bias has {b.size} elements, want {m}")
    else:
        b = np.zeros(m)
    eps = float(bn.attrs.get("epsilon", 1e-5))
    # Fold in float64, round once to the weight's dtype.
    s = gamma.reshape(-1).astype(np.float64) / np.sqrt(var.reshape(-1).astype(np.float64) + eps)
    w2 = (w.astype(np.float64) * s.reshape((m,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    b2 = (
        b.reshape(-1).astype(np.float64) - mean.reshape(-1).astype(np.float64)
    ) * s + beta.reshape(-1).astype(np.float64)
    w_new = ctx.add_constant(f"{conv_node.name}_folded_weight", w2)
    b_new = ctx.add_constant(f"{conv_node.name}_folded_bias", b2.astype(w.dtype))
    return w_new, b_new


#: Shape operators :func:`_const_eval` runs on constant inputs (the catalog's references).
_CONST_SHAPE_OPS = frozenset(
    {"ConstantOfShape", "Concat", "Reshape", "Slice", "Transpose", "Cast", "Unsqueeze", "Squeeze"}
)


def _const_eval(value: Value, depth: int = 16) -> np.ndarray | None:
    """The data of ``value`` when it is computed from constants by a short chain of shape
    operators (a TorchScript export's TF-style pads: ConstantOfShape, Concat, Reshape, Slice,
    Transpose, Cast; Shape of a static tensor), else ``None``. Each operator runs on the
    operator catalog's NumPy reference."""
    data = const_value(value)
    if data is not None or depth <= 0:
        return data
    node = value.producer
    if node is None or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    op = node.op_type
    if op == "Shape":
        x = node.inputs[0]
        if x is None or x.shape is None or not all(isinstance(d, int) for d in x.shape):
            return None
        shape = np.asarray(x.shape, np.int64)
        return shape[node.attrs.get("start", 0) : node.attrs.get("end", len(shape))]
    if op not in _CONST_SHAPE_OPS:
        return None
    args = []
    for v in node.inputs:
        a = None if v is None else _const_eval(v, depth - 1)
        if v is not None and a is None:
            return None
        args.append(a)
    try:
        (out,) = call_op(op, "", node.attrs, args, 1, ExecScope({}, {}), node=node)
    except (GraphAutoFusionError, ValueError, IndexError, KeyError, TypeError):
        return None
    return np.asarray(out)


def foldable_pad(conv_node: Node) -> tuple[Node, list[int]] | None:
    """The ``Pad`` feeding ``conv_node`` and its spatial pads (begins, then ends), when the Pad
    folds into the Conv's own ``pads``: constant mode, zero fill, constant non-negative pads
    on the spatial axes only, no ``auto_pad``. ``None`` when no Pad feeds it or it does not
    fold (see :func:`pad_not_hidden`)."""
    x = conv_node.inputs[0] if conv_node.inputs else None
    pad = x.producer if x is not None else None
    if pad is None or pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx"):
        return None
    if conv_node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    if pad.attrs.get("mode", "constant") not in ("constant", b"constant"):
        return None
    if "pads" in pad.attrs:  # opset < 11
        pads, fill = np.asarray(pad.attrs["pads"]), float(pad.attrs.get("value", 0.0))
    else:
        if len(pad.inputs) < 2 or pad.inputs[1] is None:
            return None
        data = _const_eval(pad.inputs[1])
        if data is None:
            return None
        pads, fill = np.asarray(data).reshape(-1), 0.0
        if len(pad.inputs) > 2 and pad.inputs[2] is not None:
            value = _const_eval(pad.inputs[2])
            if value is None or value.size != 1:
                return None
            fill = float(value.reshape(-1)[0])
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            return None  # explicit axes
    rank = pads.size // 2
    if fill != 0.0 or rank < 3 or pads.size != 2 * rank or (pads < 0).any():
        return None
    begins, ends = pads[:rank], pads[rank:]
    if begins[:2].any() or ends[:2].any():
        return None  # batch or channel padding
    return pad, [int(v) for v in begins[2:]] + [int(v) for v in ends[2:]]


def pad_not_hidden(ctx: MatchContext) -> str | None:
    """Check: the Conv does not read a Pad that FusedConv would hide from onnxruntime.
    onnxruntime folds a constant ``Pad`` into the ``Conv`` after it (its pad fusion, after
    its own constant folding) but not into a ``FusedConv``: a Pad whose pads are computed at
    run time here (TF-style padding: pads from the input's shape) would stay a node, and
    the layout reorders around it (NCHWc) cost more than the fusion saves. Pads computed
    from constants by shape operators (:func:`_const_eval`) fold."""
    node = ctx.nodes["conv"]
    x = node.inputs[0] if node.inputs else None
    pad = x.producer if x is not None else None
    if pad is None or pad.op_type != "Pad" or foldable_pad(node) is not None:
        return None
    return (
        f"Conv {node.name!r} reads Pad {pad.name!r}, which does not fold into its pads here "
        f"(pads computed at run time, or padding more than the spatial axes): onnxruntime "
        f"folds a Pad into a Conv, not into a FusedConv"
    )


def fused_conv(
    ctx: RewriteContext,
    conv_node: Node,
    w: Value,
    b: Value | None,
    z: Value | None,
    activation: str,
    params: list[float] | None = None,
) -> list[Value]:
    """``com.microsoft::FusedConv(X, W, B, Z)`` with the Conv's attributes and an activation
    (a constant zero ``Pad`` before the Conv folded into its ``pads``, as onnxruntime would
    fold it into the Conv)."""
    attrs = conv_attrs(conv_node)
    attrs["activation"] = activation
    if params:
        attrs["activation_params"] = [float(x) for x in params]
    x = live_input(conv_node, 0)
    folded = foldable_pad(conv_node)
    if folded is not None:
        pad, extra = folded
        n = len(extra) // 2
        own = list(attrs.get("pads", [0] * (2 * n)))
        attrs["pads"] = [int(a) + int(e) for a, e in zip(own, extra)]
        x = live_input(pad, 0)
    inputs: list[Value | None] = [x, w, b]
    if z is not None:
        inputs.append(z)
    while inputs and inputs[-1] is None:
        inputs.pop()
    return ctx.make_node("FusedConv", inputs, attrs, domain=MS).outputs


def activation_params(node: Node) -> tuple[str, list[float]]:
    """FusedConv ``activation`` and ``activation_params`` for an activation node.

    Raises:
        RewriteError: a Clip bound that is not constant.
    """
    op = node.op_type
    if op == "LeakyRelu":
        return op, [float(node.attrs.get("alpha", 0.01))]
    if op == "HardSigmoid":
        return op, [float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))]
    if op == "Clip":
        lo, hi = float(np.finfo(np.float32).min), float(np.finfo(np.float32).max)
        if "min" in node.attrs:  # opset < 11
            lo = float(node.attrs["min"])
        if "max" in node.attrs:
            hi = float(node.attrs["max"])
        bounds = list(node.inputs[1:3])
        for i, v in enumerate(bounds):
            if v is None:
                continue
            data = const_value(v)
            if data is None or data.size != 1:
                raise RewriteError(f"Clip bound %{v.name} is not a constant scalar")
            if i == 0:
                lo = float(data.reshape(-1)[0])
            else:
                hi = float(data.reshape(-1)[0])
        return op, [lo, hi]
    return op, []
