"""Binary and variadic operators with NumPy broadcasting (ONNX semantics)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graph_autofusion.catalog.definitions._util import out_numel, per_element, upcast
from graph_autofusion.catalog.registry import FusionKind, OpContext, op
from graph_autofusion.ir.core import Node

B = FusionKind.BROADCAST


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics, as ONNX Div on integers)."""
    q = np.floor_divide(a, b)
    r = np.remainder(a, b)
    fix = (r != 0) & ((a < 0) != (b < 0))
    return (q + fix).astype(np.result_type(a, b))


def _binary(name: str, fn: Callable, *, commutative: bool = False) -> None:
    @op(name, B, commutative=commutative, flops=per_element(1))
    @upcast
    def ref(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(fn(a, b))

    ref.__doc__ = f"{name}(a, b) with broadcasting."


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return int_div(a, b)
    return np.divide(a, b)


for _name, _fn, _comm in [
    ("Add", np.add, True),
    ("Sub", np.subtract, False),
    ("Mul", np.multiply, True),
    ("Div", _div, False),
    ("Equal", np.equal, True),
    ("Less", np.less, False),
    ("LessOrEqual", np.less_equal, False),
    ("Greater", np.greater, False),
    ("GreaterOrEqual", np.greater_equal, False),
    ("And", np.logical_and, True),
    ("Or", np.logical_or, True),
    ("Xor", np.logical_xor, True),
    ("BitwiseAnd", np.bitwise_and, True),
    ("BitwiseOr", np.bitwise_or, True),
    ("BitwiseXor", np.bitwise_xor, True),
]:
    _binary(_name, _fn, commutative=_comm)


@op("Pow", B, flops=per_element(1))
@upcast
def pow_(ctx: OpContext, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x ** y; the result has x's element type."""
    if np.issubdtype(x.dtype, np.integer):
        if np.issubdtype(y.dtype, np.integer):
            return np.power(x, y.astype(x.dtype)).astype(x.dtype)
        return np.power(x.astype(np.float64), y).astype(x.dtype)
    if np.issubdtype(y.dtype, np.integer):
        return np.power(x, y.astype(x.dtype)).astype(x.dtype)
    return np.power(x, y.astype(x.dtype, copy=False)).astype(x.dtype, copy=False)


@op("Mod", B, flops=per_element(1))
@upcast
def mod(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Remainder: sign of the divisor (fmod = 0) or of the dividend (fmod = 1, C fmod)."""
    if int(ctx.attr("fmod", 0)):
        return np.fmod(a, b)
    return np.mod(a, b)


@op("BitShift", B, flops=per_element(1))
def bit_shift(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Shift unsigned integers left or right (direction attribute)."""
    direction = ctx.attr("direction", "LEFT")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction == "LEFT":
        return np.left_shift(a, b)
    return np.right_shift(a, b)


@op("PRelu", B, flops=per_element(2))
@upcast
def prelu(ctx: OpContext, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """x if x >= 0 else slope * x (slope broadcast unidirectionally)."""
    return np.where(x >= 0, x, x * slope).astype(x.dtype)


@op("Where", B, flops=per_element(1))
def where(ctx: OpContext, cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cond ? a : b with broadcasting of all three inputs."""
    return np.where(cond, a, b).astype(np.result_type(a, b), copy=False)


def _variadic_flops(node: Node) -> int | None:
    n = out_numel(node)
    if n is None:
        return None
    return n * max(1, len([v for v in node.inputs if v is not None]) - 1)


def _variadic(name: str, fn: Callable, finish: Callable | None = None) -> None:
    @op(name, B, commutative=True, flops=_variadic_flops)
    @upcast
    def ref(ctx: OpContext, *xs: np.ndarray) -> np.ndarray:
        arrays = [x for x in xs if x is not None]
        acc = arrays[0]
        for x in arrays[1:]:
            acc = fn(acc, x)
        if finish is not None:
            acc = finish(acc, len(arrays))
        return np.asarray(acc).astype(arrays[0].dtype, copy=False)

    ref.__doc__ = f"{name} of any number of inputs, with broadcasting."


_variadic("Sum", np.add)
_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
_variadic("Mean", np.add, lambda acc, n: acc / np.asarray(n, dtype=acc.dtype))
