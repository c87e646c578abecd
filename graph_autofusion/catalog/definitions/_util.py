"""Helpers shared by the operator definitions: attribute decoding, fp16 handling, axes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graph_autofusion.catalog.registry import OpContext
from graph_autofusion.ir.core import Node, Value
from graph_autofusion.ir.dtypes import DType

_LOW_FLOATS = (np.dtype(np.float16),)


def upcast(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` on float32 copies of fp16 inputs and cast floating results back to fp16.

    This gives the fp32 accumulation the catalog promises for half-precision inputs.
    """

    @functools.wraps(fn)
    def wrapper(ctx: OpContext, *args: Any) -> Any:
        low = None
        new_args = []
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype in _LOW_FLOATS:
                low = a.dtype if low is None else low
                a = a.astype(np.float32)
            new_args.append(a)
        result = fn(ctx, *new_args)
        if low is None:
            return result
        if isinstance(result, tuple | list):
            return tuple(_down(r, low) for r in result)
        return _down(result, low)

    return wrapper


def _down(r: Any, low: np.dtype) -> Any:
    if isinstance(r, np.ndarray) and r.dtype == np.float32:
        return r.astype(low)
    return r


def attr_str(ctx: OpContext, name: str, default: str) -> str:
    """String attribute (the frontend may deliver ``bytes``)."""
    v = ctx.attr(name, default)
    if isinstance(v, bytes):
        return v.decode()
    return str(v)


def attr_ints(ctx: OpContext, name: str, default: Sequence[int] | None = None) -> list[int] | None:
    v = ctx.attr(name, None)
    if v is None:
        return None if default is None else list(default)
    if isinstance(v, np.ndarray):
        return [int(x) for x in v.reshape(-1)]
    if isinstance(v, int | np.integer):
        return [int(v)]
    return [int(x) for x in v]


def attr_tensor(ctx: OpContext, name: str) -> np.ndarray | None:
    """Tensor attribute as an array (accepts ndarray or onnx TensorProto)."""
    v = ctx.attr(name, None)
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return v
    if hasattr(v, "dims") and hasattr(v, "data_type"):
        from onnx import numpy_helper

        return numpy_helper.to_array(v)
    return np.asarray(v)


def dtype_attr(value: Any) -> np.dtype:
    """NumPy dtype of an ONNX ``to``/``dtype`` attribute (TensorProto enum number)."""
    return DType(int(value)).to_numpy()


def axes_of(ctx: OpContext, axes_input: np.ndarray | None, name: str = "axes") -> list[int] | None:
    """Axes from the second input (newer opsets) or the attribute (older opsets)."""
    if axes_input is not None:
        return [int(a) for a in np.asarray(axes_input).reshape(-1)]
    return attr_ints(ctx, name)


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def numel(v: Value | None) -> int | None:
    """Static element count of a value (``None`` when unknown)."""
    if v is None:
        return None
    return v.numel()


def shape_of(v: Value | None) -> tuple[int, ...] | None:
    if v is None or not v.is_static:
        return None
    return tuple(int(d) for d in v.shape)  # type: ignore[arg-type]


def out_numel(node: Node, index: int = 0) -> int | None:
    if index >= len(node.outputs):
        return None
    return node.outputs[index].numel()


def per_element(k: int) -> Callable[[Node], int | None]:
    """FLOP formula: ``k`` FLOPs per output element."""

    def f(node: Node) -> int | None:
        n = out_numel(node)
        return None if n is None else k * n

    return f


def per_input_element(k: int) -> Callable[[Node], int | None]:
    """FLOP formula: ``k`` FLOPs per element of the first input."""

    def f(node: Node) -> int | None:
        n = numel(node.inputs[0]) if node.inputs else None
        return None if n is None else k * n

    return f


def zero_flops(node: Node) -> int:
    return 0
