"""Torch implementations of the canonical (ONNX) operators, one function per operator.

Each implementation is registered with :func:`torch_op` and receives an :class:`OpCall` (the
node, its attributes and the default-domain opset) followed by the input tensors (``None`` for
omitted optional inputs); it returns one tensor or a tuple of tensors. ONNX semantics are
honoured exactly (attribute-vs-input forms of every opset, integer division truncation,
``Pow`` keeping the base dtype, ...), because the same IR may come from an ONNX file.

This module holds the registry plus the elementwise, reduction and matrix operators; layout
operators live in :mod:`graph_autofusion.runtime.torch_ops_tensor` and neural-network and
contrib operators in :mod:`graph_autofusion.runtime.torch_ops_nn`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.ir.core import Node
from graph_autofusion.ir.dtypes import DType

TorchImpl = Callable[..., Any]
_IMPLS: dict[tuple[str, str], TorchImpl] = {}

_TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.FLOAT: torch.float32,
    DType.UINT8: torch.uint8,
    DType.INT8: torch.int8,
    DType.UINT16: torch.uint16,
    DType.INT16: torch.int16,
    DType.INT32: torch.int32,
    DType.INT64: torch.int64,
    DType.BOOL: torch.bool,
    DType.FLOAT16: torch.float16,
    DType.DOUBLE: torch.float64,
    DType.UINT32: torch.uint32,
    DType.UINT64: torch.uint64,
    DType.COMPLEX64: torch.complex64,
    DType.COMPLEX128: torch.complex128,
    DType.BFLOAT16: torch.bfloat16,
}
_FROM_TORCH = {v: k for k, v in _TORCH_DTYPES.items()}


def to_torch_dtype(dtype: DType | int) -> torch.dtype:
    """Torch dtype of an IR dtype (or ONNX element-type number)."""
    try:
        return _TORCH_DTYPES[DType(int(dtype))]
    except (KeyError, ValueError) as e:
        raise UnsupportedOperatorError(f"dtype {dtype!r} has no torch equivalent") from e


def from_torch_dtype(dtype: torch.dtype) -> DType:
    """IR dtype of a torch dtype."""
    if dtype not in _FROM_TORCH:
        raise UnsupportedOperatorError(f"torch dtype {dtype} has no IR equivalent")
    return _FROM_TORCH[dtype]


@dataclass
class OpCall:
    """What an implementation may read besides its input tensors."""

    node: Node
    opset: int = 20

    @property
    def attrs(self) -> dict[str, Any]:
        return self.node.attrs

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)


def tensor_version(t: torch.Tensor) -> int:
    """``t._version``, or -1 for an inference tensor (made under ``torch.inference_mode()``,
    e.g. a model loaded there), which has no version counter: an in-place write to one is not
    seen by version (its memory and identity still are)."""
    return -1 if t.is_inference() else t._version


def torch_op(*op_types: str, domain: str = "") -> Callable[[TorchImpl], TorchImpl]:
    """Decorator registering a torch implementation for ``op_types`` in ``domain``."""

    def deco(fn: TorchImpl) -> TorchImpl:
        for name in op_types:
            _IMPLS[(domain, name)] = fn
        return fn

    return deco


def get_impl(op_type: str, domain: str = "") -> TorchImpl | None:
    """The registered implementation, or ``None``."""
    _ensure_loaded()
    if domain == "ai.onnx":
        domain = ""
    return _IMPLS.get((domain, op_type))


def supported_ops() -> list[tuple[str, str]]:
    """Every ``(domain, op_type)`` with a torch implementation."""
    _ensure_loaded()
    return sorted(_IMPLS)


def _ensure_loaded() -> None:
    from graph_autofusion.runtime import torch_ops_nn, torch_ops_tensor  # noqa: F401


def ints(t: torch.Tensor | None) -> list[int]:
    """A 0-d/1-d integer tensor as a list of Python ints (empty for ``None``)."""
    if t is None:
        return []
    return [int(v) for v in t.reshape(-1).tolist()]


def axes_of(call: OpCall, t: torch.Tensor | None, name: str = "axes") -> list[int] | None:
    """Axes given as an input (new opsets) or as an attribute (old opsets); ``None`` if absent."""
    if t is not None:
        return ints(t)
    a = call.attr(name)
    return None if a is None else [int(v) for v in a]


# ----- elementwise -----------------------------------------------------------------------
def _unary(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    torch_op(name)(lambda call, x: fn(x))


for _name, _fn in {
    "Abs": torch.abs,
    "Neg": torch.neg,
    "Exp": torch.exp,
    "Log": torch.log,
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tan": torch.tan,
    "Asin": torch.asin,
    "Acos": torch.acos,
    "Atan": torch.atan,
    "Sinh": torch.sinh,
    "Cosh": torch.cosh,
    "Asinh": torch.asinh,
    "Acosh": torch.acosh,
    "Atanh": torch.atanh,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "Relu": torch.relu,
    "Erf": torch.erf,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
    "Round": torch.round,
    "Sign": torch.sign,
    "Not": torch.logical_not,
    "BitwiseNot": torch.bitwise_not,
    "IsNaN": torch.isnan,
    "Softsign": F.softsign,
    "Mish": F.mish,
    "Identity": lambda x: x,
}.items():
    _unary(_name, _fn)


@torch_op("IsInf")
def _isinf(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    pos, neg = call.attr("detect_positive", 1), call.attr("detect_negative", 1)
    return (torch.isposinf(x) & bool(pos)) | (torch.isneginf(x) & bool(neg))


@torch_op("Add")
def _add(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b)


@torch_op("Sub")
def _sub(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.sub(a, b)


@torch_op("Mul")
def _mul(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mul(a, b)


@torch_op("Div")
def _div(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


@torch_op("Mod")
def _mod(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.fmod(a, b) if call.attr("fmod", 0) else torch.remainder(a, b)


@torch_op("Pow")
def _pow(call: OpCall, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.pow(x, y).to(x.dtype)  # ONNX: the result has the base's type


@torch_op("Max", "Min", "Sum", "Mean")
def _variadic(call: OpCall, *xs: torch.Tensor) -> torch.Tensor:
    op = call.node.op_type
    out = xs[0]
    for x in xs[1:]:
        if op == "Max":
            out = torch.maximum(out, x)
        elif op == "Min":
            out = torch.minimum(out, x)
        else:
            out = out + x
    if op == "Mean":
        out = out / len(xs)
    return out


for _name, _fn in {
    "Equal": torch.eq,
    "Less": torch.lt,
    "LessOrEqual": torch.le,
    "Greater": torch.gt,
    "GreaterOrEqual": torch.ge,
    "And": torch.logical_and,
    "Or": torch.logical_or,
    "Xor": torch.logical_xor,
    "BitwiseAnd": torch.bitwise_and,
    "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
}.items():
    torch_op(_name)(lambda call, a, b, _f=_fn: _f(a, b))


@torch_op("BitShift")
def _bitshift(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if call.attr("direction") in ("LEFT", b"LEFT"):
        return torch.bitwise_left_shift(a, b)
    return torch.bitwise_right_shift(a, b)


@torch_op("Where")
def _where(call: OpCall, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(c, a, b)


@torch_op("Cast")
def _cast(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return x.to(to_torch_dtype(call.attr("to")))


@torch_op("CastLike")
def _cast_like(call: OpCall, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype)


@torch_op("Clip")
def _clip(
    call: OpCall, x: torch.Tensor, lo: torch.Tensor | None = None, hi: torch.Tensor | None = None
) -> torch.Tensor:
    if call.opset < 11:
        lo_v, hi_v = call.attr("min"), call.attr("max")
        return torch.clamp(x, lo_v, hi_v)
    if lo is not None:
        x = torch.maximum(x, lo.to(x.dtype))
    if hi is not None:
        x = torch.minimum(x, hi.to(x.dtype))
    return x


@torch_op("LeakyRelu")
def _leaky(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, call.attr("alpha", 0.01))


@torch_op("Elu")
def _elu(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return F.elu(x, call.attr("alpha", 1.0))


@torch_op("Celu")
def _celu(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return F.celu(x, call.attr("alpha", 1.0))


@torch_op("Selu")
def _selu(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    alpha = call.attr("alpha", 1.67326319217681884765625)
    gamma = call.attr("gamma", 1.05070102214813232421875)
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@torch_op("ThresholdedRelu")
def _threlu(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > call.attr("alpha", 1.0), x, torch.zeros_like(x))


@torch_op("HardSigmoid")
def _hardsigmoid(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    alpha, beta = call.attr("alpha", 0.2), call.attr("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return F.hardsigmoid(x)
    return torch.clamp(alpha * x + beta, 0, 1)


@torch_op("HardSwish")
def _hardswish(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return F.hardswish(x)


@torch_op("Softplus")
def _softplus(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.exp(-x.abs())) + torch.clamp(x, min=0)


@torch_op("PRelu")
def _prelu(call: OpCall, x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, x, x * slope)


@torch_op("Gelu")
def _gelu(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate=call.attr("approximate", "none"))


# ----- reductions --------------------------------------------------------------------------
def _reduce(call: OpCall, x: torch.Tensor, axes_t: torch.Tensor | None, fn: Callable) -> Any:
    new_form = call.node.op_type == "ReduceSum" and call.opset >= 13 or call.opset >= 18
    axes = ints(axes_t) if (new_form and axes_t is not None) else call.attr("axes")
    keep = bool(call.attr("keepdims", 1))
    if not axes:
        if call.attr("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.dim()))
    axes = sorted(a % max(x.dim(), 1) for a in axes)
    if x.dim() == 0:
        return fn(x, [], keep)
    return fn(x, axes, keep)


def _amax(x: torch.Tensor, axes: list[int], keep: bool) -> torch.Tensor:
    return torch.amax(x, dim=axes, keepdim=keep) if axes else x


def _amin(x: torch.Tensor, axes: list[int], keep: bool) -> torch.Tensor:
    return torch.amin(x, dim=axes, keepdim=keep) if axes else x


def _prod(x: torch.Tensor, axes: list[int], keep: bool) -> torch.Tensor:
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keep)
    return x


_REDUCERS: dict[str, Callable[[torch.Tensor, list[int], bool], torch.Tensor]] = {
    "ReduceSum": lambda x, a, k: torch.sum(x, dim=a, keepdim=k).to(x.dtype) if a else x,
    "ReduceMean": lambda x, a, k: torch.mean(x, dim=a, keepdim=k) if a else x,
    "ReduceMax": _amax,
    "ReduceMin": _amin,
    "ReduceProd": _prod,
    "ReduceSumSquare": lambda x, a, k: torch.sum(x * x, dim=a, keepdim=k) if a else x * x,
    "ReduceL1": lambda x, a, k: torch.sum(x.abs(), dim=a, keepdim=k) if a else x.abs(),
    "ReduceL2": lambda x, a, k: torch.sqrt(torch.sum(x * x, dim=a, keepdim=k)) if a else x.abs(),
    "ReduceLogSum": lambda x, a, k: torch.log(torch.sum(x, dim=a, keepdim=k)),
    "ReduceLogSumExp": lambda x, a, k: torch.logsumexp(x, dim=a, keepdim=k),
}
for _name, _fn in _REDUCERS.items():
    torch_op(_name)(lambda call, x, axes=None, _f=_fn: _reduce(call, x, axes, _f))


@torch_op("ArgMax", "ArgMin")
def _argmax(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    axis, keep = call.attr("axis", 0), bool(call.attr("keepdims", 1))
    is_max = call.node.op_type == "ArgMax"
    if call.attr("select_last_index", 0):
        flipped = torch.flip(x, [axis])
        idx = torch.argmax(flipped, axis, keep) if is_max else torch.argmin(flipped, axis, keep)
        return x.shape[axis] - 1 - idx
    return torch.argmax(x, axis, keep) if is_max else torch.argmin(x, axis, keep)


@torch_op("CumSum")
def _cumsum(call: OpCall, x: torch.Tensor, axis: torch.Tensor) -> torch.Tensor:
    a = ints(axis)[0]
    if call.attr("reverse", 0):
        x = torch.flip(x, [a])
    out = torch.cumsum(x, a).to(x.dtype)
    if call.attr("exclusive", 0):
        out = out - x
    if call.attr("reverse", 0):
        out = torch.flip(out, [a])
    return out


@torch_op("Softmax", "LogSoftmax", "Hardmax")
def _softmax(call: OpCall, x: torch.Tensor) -> torch.Tensor:
    op = call.node.op_type
    if call.opset < 13:  # coerce to 2-D at `axis` (default 1)
        axis = call.attr("axis", 1) % max(x.dim(), 1)
        flat = x.reshape(int(torch.tensor(x.shape[:axis]).prod()), -1)
        return _softmax_1(op, flat, 1).reshape(x.shape)
    return _softmax_1(op, x, call.attr("axis", -1))


def _softmax_1(op: str, x: torch.Tensor, axis: int) -> torch.Tensor:
    if op == "Softmax":
        return torch.softmax(x, axis)
    if op == "LogSoftmax":
        return torch.log_softmax(x, axis)
    idx = torch.argmax(x, axis, keepdim=True)
    return torch.zeros_like(x).scatter_(axis, idx, 1.0)


@torch_op("TopK")
def _topk(call: OpCall, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kk = ints(k)[0] if call.opset >= 10 else call.attr("k")
    largest = bool(call.attr("largest", 1))
    axis = call.attr("axis", -1)
    if kk == x.shape[axis]:  # a whole sort: ONNX breaks ties by the lower index (stable)
        return torch.sort(x, dim=axis, descending=largest, stable=True)
    v, i = torch.topk(x, kk, dim=axis, largest=largest, sorted=True)
    return v, i


# ----- matrix products --------------------------------------------------------------------
@torch_op("MatMul")
def _matmul(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


@torch_op("Gemm")
def _gemm(
    call: OpCall, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None
) -> torch.Tensor:
    if call.attr("transA", 0):
        a = a.t()
    if call.attr("transB", 0):
        b = b.t()
    alpha, beta = call.attr("alpha", 1.0), call.attr("beta", 1.0)
    if c is None:
        return torch.matmul(a, b) if alpha == 1.0 else alpha * torch.matmul(a, b)
    if alpha == 1.0 and beta == 1.0:
        return torch.addmm(c.expand(a.shape[0], b.shape[1]), a, b)
    return torch.addmm(c.expand(a.shape[0], b.shape[1]), a, b, beta=beta, alpha=alpha)


@torch_op("Einsum")
def _einsum(call: OpCall, *xs: torch.Tensor) -> torch.Tensor:
    return torch.einsum(call.attr("equation"), *xs)


@torch_op("FusedMatMul", domain="com.microsoft")
def _fused_matmul(call: OpCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if call.attr("transA", 0):
        a = a.transpose(-1, -2)
    if call.attr("transB", 0):
        b = b.transpose(-1, -2)
    out = torch.matmul(a, b)
    alpha = call.attr("alpha", 1.0)
    return out if alpha == 1.0 else out * alpha
