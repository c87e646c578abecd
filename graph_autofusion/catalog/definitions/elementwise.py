"""Unary elementwise operators (ONNX semantics), including activations and casts."""

from __future__ import annotations

import math

import numpy as np

from graph_autofusion.catalog.definitions._util import (
    attr_str,
    dtype_attr,
    per_element,
    upcast,
    zero_flops,
)
from graph_autofusion.catalog.registry import FusionKind, OpContext, op

E = FusionKind.ELEMENTWISE


def erf(x: np.ndarray) -> np.ndarray:
    """Error function (SciPy when available, else ``math.erf`` elementwise)."""
    try:
        from scipy.special import erf as _erf

        return _erf(x).astype(x.dtype, copy=False)
    except ImportError:  # pragma: no cover - SciPy ships with the dev environment
        return np.vectorize(math.erf, otypes=[x.dtype])(x)


def _f(x: np.ndarray, value: float) -> np.ndarray:
    """A scalar in ``x``'s dtype (keeps float32 math in float32)."""
    return np.asarray(value, dtype=x.dtype)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function."""
    e = np.exp(-np.abs(x))
    one = np.asarray(1.0, dtype=x.dtype)
    return np.where(x >= 0, one / (one + e), e / (one + e)).astype(x.dtype, copy=False)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU, exact (erf) or tanh approximation."""
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return (0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))).astype(x.dtype)
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def _unary(name: str, fn, *, flops: int = 1, kind: FusionKind = E) -> None:
    @op(name, kind, flops=per_element(flops))
    @upcast
    def ref(ctx: OpContext, x: np.ndarray) -> np.ndarray:
        return np.asarray(fn(x)).astype(x.dtype, copy=False)

    ref.__doc__ = f"{name}(x), elementwise."


for _name, _fn, _fl in [
    ("Abs", np.abs, 1),
    ("Neg", np.negative, 1),
    ("Sqrt", np.sqrt, 1),
    ("Exp", np.exp, 1),
    ("Log", np.log, 1),
    ("Reciprocal", np.reciprocal, 1),
    ("Tanh", np.tanh, 1),
    ("Sin", np.sin, 1),
    ("Cos", np.cos, 1),
    ("Tan", np.tan, 1),
    ("Asin", np.arcsin, 1),
    ("Acos", np.arccos, 1),
    ("Atan", np.arctan, 1),
    ("Sinh", np.sinh, 1),
    ("Cosh", np.cosh, 1),
    ("Asinh", np.arcsinh, 1),
    ("Acosh", np.arccosh, 1),
    ("Atanh", np.arctanh, 1),
    ("Floor", np.floor, 1),
    ("Ceil", np.ceil, 1),
    ("Round", np.round, 1),
    ("Sign", np.sign, 1),
    ("Erf", erf, 1),
    ("Sigmoid", sigmoid, 4),
    ("Softsign", lambda x: x / (1 + np.abs(x)), 3),
    ("Relu", lambda x: np.maximum(x, 0), 1),
]:
    _unary(_name, _fn, flops=_fl)


@op("LeakyRelu", E, flops=per_element(2))
@upcast
def leaky_relu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x if x >= 0 else alpha * x (alpha = 0.01)."""
    alpha = float(ctx.attr("alpha", 0.01))
    return np.where(x >= 0, x, x * _f(x, alpha))


@op("ThresholdedRelu", E)
@upcast
def thresholded_relu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x if x > alpha else 0 (alpha = 1)."""
    alpha = float(ctx.attr("alpha", 1.0))
    return np.where(x > alpha, x, _f(x, 0.0))


@op("HardSigmoid", E, flops=per_element(3))
@upcast
def hard_sigmoid(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """max(0, min(1, alpha * x + beta)) (alpha = 0.2, beta = 0.5)."""
    alpha = float(ctx.attr("alpha", 0.2))
    beta = float(ctx.attr("beta", 0.5))
    return np.clip(x * _f(x, alpha) + _f(x, beta), 0, 1).astype(x.dtype)


@op("HardSwish", E, flops=per_element(4))
@upcast
def hard_swish(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x * max(0, min(1, x / 6 + 1 / 2))."""
    return (x * np.clip(x * _f(x, 1.0 / 6.0) + _f(x, 0.5), 0, 1)).astype(x.dtype)


@op("Softplus", E, flops=per_element(3))
@upcast
def softplus(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x))."""
    return np.logaddexp(x, _f(x, 0.0)).astype(x.dtype)


@op("Elu", E, flops=per_element(3))
@upcast
def elu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x if x > 0 else alpha * (exp(x) - 1)."""
    alpha = float(ctx.attr("alpha", 1.0))
    return np.where(x > 0, x, _f(x, alpha) * np.expm1(np.minimum(x, 0))).astype(x.dtype)


@op("Celu", E, flops=per_element(4))
@upcast
def celu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    alpha = float(ctx.attr("alpha", 1.0))
    neg = _f(x, alpha) * np.expm1(np.minimum(x, 0) / _f(x, alpha))
    return (np.maximum(x, 0) + np.minimum(neg, 0)).astype(x.dtype)


@op("Selu", E, flops=per_element(4))
@upcast
def selu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """gamma * (x if x > 0 else alpha * (exp(x) - 1))."""
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    y = np.where(x > 0, x, _f(x, alpha) * np.expm1(np.minimum(x, 0)))
    return (y * _f(x, gamma)).astype(x.dtype)


@op("Mish", E, flops=per_element(5))
@upcast
def mish(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x * tanh(softplus(x))."""
    return (x * np.tanh(np.logaddexp(x, _f(x, 0.0)))).astype(x.dtype)


@op("Gelu", E, flops=per_element(8))
@upcast
def gelu_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """GELU (opset 20), approximate = none (erf) or tanh."""
    return gelu(x, attr_str(ctx, "approximate", "none"))


@op("Shrink", E, flops=per_element(2))
@upcast
def shrink(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x + bias if x < -lambd; x - bias if x > lambd; else 0."""
    lambd = float(ctx.attr("lambd", 0.5))
    bias = float(ctx.attr("bias", 0.0))
    y = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return y.astype(x.dtype)


@op("Clip", E, flops=per_element(2))
@upcast
def clip(
    ctx: OpContext, x: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None
) -> np.ndarray:
    """min(max(x, min), max); bounds as inputs (opset >= 11) or attributes (older)."""
    if lo is None and "min" in ctx.attrs:
        lo = np.asarray(ctx.attr("min"), dtype=x.dtype)
    if hi is None and "max" in ctx.attrs:
        hi = np.asarray(ctx.attr("max"), dtype=x.dtype)
    y = x
    if lo is not None:
        y = np.maximum(y, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi, dtype=x.dtype))
    return np.asarray(y, dtype=x.dtype)


@op("IsNaN", E)
def isnan(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """x != x."""
    return np.isnan(x)


@op("IsInf", E)
def isinf(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Infinity test, optionally only positive or negative infinities."""
    pos = int(ctx.attr("detect_positive", 1))
    neg = int(ctx.attr("detect_negative", 1))
    return (np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))


@op("Not", E)
def logical_not(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Logical negation of a bool tensor."""
    return np.logical_not(x)


@op("BitwiseNot", E)
def bitwise_not(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Bitwise complement of an integer tensor."""
    return np.invert(x)


@op("Identity", E, flops=zero_flops)
def identity(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Returns its input."""
    return x


@op("Dropout", E, flops=zero_flops)
def dropout(
    ctx: OpContext,
    x: np.ndarray,
    ratio: np.ndarray | None = None,
    training_mode: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Inference dropout: the identity, plus an all-true mask when a second output exists."""
    if training_mode is not None and bool(np.asarray(training_mode)):
        r = 0.0 if ratio is None else float(np.asarray(ratio))
        if r > 0.0:
            raise NotImplementedError("Dropout in training mode is random; not supported")
    if len(ctx.output_dtypes) > 1:
        return x, np.ones(x.shape, dtype=bool)
    return x


@op("Cast", E, flops=zero_flops)
def cast(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """Convert to the element type ``to``."""
    return _cast(x, dtype_attr(ctx.attr("to")))


@op("CastLike", E, flops=zero_flops)
def cast_like(ctx: OpContext, x: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Convert to the element type of the second input."""
    return _cast(x, like.dtype)


def _cast(x: np.ndarray, to: np.dtype) -> np.ndarray:
    if to == np.bool_:
        return x != 0
    if np.issubdtype(to, np.integer) and np.issubdtype(x.dtype, np.floating):
        # ONNX casts float -> int by truncation toward zero; NaN/inf are undefined.
        with np.errstate(invalid="ignore"):
            return np.trunc(x).astype(to)
    return np.asarray(x).astype(to)
