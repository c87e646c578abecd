"""The lowering's vocabulary: refusal reasons, storage types, the operator sets, the result
(:class:`GroupLowering`) and small shape helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graph_autofusion import reasons
from graph_autofusion.codegen.kernel_ir import (
    Kernel,
)
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Node, Value, const_value
from graph_autofusion.ir.dtypes import DType


class KernelReason:
    """Why a group cannot become a generated kernel (reason codes, docs/reasons.md)."""

    UNSUPPORTED_OP = reasons.CODEGEN_UNSUPPORTED_OP
    UNSUPPORTED_DTYPE = reasons.CODEGEN_UNSUPPORTED_DTYPE
    UNKNOWN_SHAPE = reasons.CODEGEN_UNKNOWN_SHAPE
    LAYOUT_INSIDE = reasons.CODEGEN_LAYOUT_INSIDE
    REDUCTION_MISMATCH = reasons.CODEGEN_REDUCTION_MISMATCH
    BROADCAST = reasons.CODEGEN_BROADCAST
    OUTPUT_SHAPE = reasons.CODEGEN_OUTPUT_SHAPE
    CONTRACTION = reasons.CODEGEN_CONTRACTION_NOT_FIRST
    COMPILE_FAILED = reasons.CODEGEN_COMPILE_FAILED


class KernelRefused(GraphAutoFusionError):
    """A group cannot be lowered; ``code`` is a :class:`KernelReason`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


STORAGE = {
    DType.FLOAT: "f32",
    DType.FLOAT16: "f16",
    DType.BFLOAT16: "bf16",
    DType.INT64: "i64",
    DType.INT32: "i32",
    DType.BOOL: "bool",
}


CONTRACTIONS = {"MatMul", "Gemm", "Conv", "FusedMatMul"}


VIEW_OPS = {"Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Slice", "Gather"}


PASS_THROUGH = {"Identity", "Dropout"}


def storage_of(dtype: DType | None, where: str) -> str:
    """The kernel storage name of an IR dtype (refused when the kernel cannot hold it)."""
    s = STORAGE.get(dtype) if dtype is not None else None
    if s is None:
        name = dtype.name if dtype is not None else "unknown"
        raise KernelRefused(KernelReason.UNSUPPORTED_DTYPE, f"{where} has dtype {name}")
    return s


@dataclass
class GroupLowering:
    """A group lowered: its kernel, and the nodes torch computes before it (a first
    contraction, whose output the kernel reads once; ``Reshape`` of a group input to a shape
    known only at run time, a zero-copy view of a contiguous tensor)."""

    kernel: Kernel
    prologue: list[Node] = field(default_factory=list)


def broadcast_shapes(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes)) if shapes else ()
    except ValueError as exc:
        raise KernelRefused(
            KernelReason.BROADCAST, f"shapes {list(shapes)} do not broadcast"
        ) from exc


def ints_of(v: Value | None) -> list[int] | None:
    if v is None:
        return None
    c = const_value(v)
    return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]


def axes_of(node: Node, rank: int, *, input_index: int = 1, attr: str = "axes") -> list[int] | None:
    axes = node.attr(attr)
    if axes is None and len(node.inputs) > input_index and node.inputs[input_index] is not None:
        axes = ints_of(node.inputs[input_index])
        if axes is None:
            raise KernelRefused(
                KernelReason.UNSUPPORTED_OP, f"{node.name}: axes known only at run time"
            )
    if axes is None:
        return None
    return sorted(int(a) % rank if rank else 0 for a in np.asarray(axes).reshape(-1))


def graph_outputs(node: Node) -> set[str]:
    g = node.graph
    return {v.name for v in g.outputs} if g is not None else set()
