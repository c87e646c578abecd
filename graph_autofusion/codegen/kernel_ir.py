"""The loop-level kernel IR (F12): one fused group as one loop nest over one iteration space.

A :class:`Kernel` computes its outputs over a *loop shape* ``F`` of rank ``rank``: the shape of
the group's widest value. Every value of the group broadcasts (NumPy rules, aligned from the
right) to ``F``. ``reduce_axes`` are the axes of ``F`` that the group's reductions reduce (all
reductions of a kernel reduce the same axes); empty for a pure elementwise kernel.

The body is a straight-line SSA list of :class:`Instr`. An instruction is either
``elem``-level (one value per element of ``F``) or ``row``-level (one value per element of the
non-reduced axes: a reduction's result and whatever is computed from such results alone).
Arithmetic is done in the instruction's compute type: ``f32`` for every floating type (fp16 and
bf16 are widened on load and rounded on store), ``i64`` for integers, ``bool``.

Instructions (``op``, arguments, attributes):

* ``load`` (attr ``input``): element of kernel input ``input`` at the current index.
* ``const`` (attr ``value``): an immediate.
* ``rowlen``: the number of reduced elements per row, as ``f32`` (for means).
* unary: ``neg abs exp log sqrt recip tanh erf sigmoid relu sin cos floor ceil round sign
  not isnan isinf softplus log1p``; binary: ``add sub mul div pow min max eq lt le gt ge and
  or xor``; ternary: ``where``.
* ``cast`` (attrs ``to`` compute type, ``round`` storage type or ``""``): convert, rounding
  through fp16/bf16 when the ONNX cast goes to one.
* ``concat`` (arguments: one per branch): along the last loop axis, branch ``b`` for the
  indices ``[offset_b, offset_b + length_b)``; loads inside a branch read at the branch's own
  index. The C kernel runs one inner loop per branch.
* ``reduce`` (attr ``kind``: ``sum max min prod``): the reduction of an ``elem`` argument over
  the reduced axes; the result is ``row``-level.

Inputs carry the *views* the wrapper applies before the call (a ``Transpose``, ``Reshape``,
``Unsqueeze``, ``Slice`` ... directly on a kernel input): index arithmetic through strides, no
copy. :mod:`graph_autofusion.codegen.c_backend` prints C from this IR;
:mod:`graph_autofusion.codegen.reference` executes the same IR with NumPy.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

ELEM = "elem"
ROW = "row"

#: Storage dtypes a kernel reads and writes, and their compute types.
STORAGE_COMPUTE = {
    "f32": "f32",
    "f16": "f32",
    "bf16": "f32",
    "f64": "f32",
    "i64": "i64",
    "i32": "i64",
    "i8": "i64",
    "u8": "i64",
    "bool": "bool",
}

UNARY = (
    "id neg abs exp log sqrt recip tanh erf sigmoid relu sin cos floor ceil round sign not "
    "isnan isinf softplus log1p"
).split()
BINARY = "add sub mul div pow min max eq lt le gt ge and or xor".split()
COMPARE = {"eq", "lt", "le", "gt", "ge"}
LOGICAL = {"and", "or", "xor", "not"}
FLOAT_ONLY = {
    "exp",
    "log",
    "sqrt",
    "recip",
    "tanh",
    "erf",
    "sigmoid",
    "sin",
    "cos",
    "floor",
    "ceil",
    "round",
    "softplus",
    "log1p",
    "div",
    "pow",
    "isnan",
    "isinf",
}
REDUCE_KINDS = ("sum", "max", "min", "prod")


@dataclass(frozen=True)
class Instr:
    """One SSA instruction; its result is referred to by its position in the body."""

    op: str
    args: tuple[int, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    ctype: str = "f32"
    level: str = ELEM

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default


@dataclass(frozen=True)
class View:
    """A layout operator the wrapper applies to a kernel input before the call (a view)."""

    op: str  # transpose, reshape, unsqueeze, squeeze, expand, slice, select, flatten
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class KernelInput:
    """A tensor the kernel reads: ``name`` is the graph value, ``dtype`` its storage type."""

    name: str
    dtype: str
    views: tuple[View, ...] = ()
    #: ``(concat instr, branch)``: read inside that branch of a ``Concat``, at the branch's
    #: own index along the last axis (it is left out of the loop shape).
    branch: tuple[int, int] | None = None


@dataclass(frozen=True)
class KernelOutput:
    """A tensor the kernel writes from instruction ``instr``.

    ``keepdims``: a row-level output keeps the reduced axes as size 1 (``True``) or drops them.
    """

    name: str
    dtype: str
    instr: int
    level: str = ELEM
    keepdims: bool = True
    rank: int = 0  # the output's own rank (the loop may be wider: a rank-4 constant)
    #: Reshapes the call applies to the written tensor (a group ending in a Reshape).
    views: tuple[View, ...] = ()


@dataclass(frozen=True)
class Kernel:
    """One fused group as one kernel (see the module docstring)."""

    name: str
    rank: int
    reduce_axes: tuple[int, ...]
    inputs: tuple[KernelInput, ...]
    outputs: tuple[KernelOutput, ...]
    body: tuple[Instr, ...]
    fused_ops: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()
    #: Constant shapes the loop shape also broadcasts with (an ``Expand`` inside the group).
    shape_sources: tuple[tuple[int, ...], ...] = ()
    #: Inner-stride class of every operand (inputs then outputs) on the fast path:
    #: ``1`` contiguous, ``0`` broadcast; set at compile time from the sample shapes.
    inner_classes: tuple[int, ...] = field(default=())
    #: The kernel's ``Concat`` along the last loop axis (at most one): its instruction and, per
    #: branch, the input whose extent along that axis is the branch's length.
    concat: tuple[int, tuple[int, ...]] | None = None

    @property
    def is_reduction(self) -> bool:
        return bool(self.reduce_axes)

    @property
    def inner_count(self) -> int:
        """How many axes the kernel loops over inside one outer index (the reduced axes, or
        the last axis of an elementwise kernel)."""
        return len(self.reduce_axes) if self.reduce_axes else 1

    def structure(self) -> dict[str, Any]:
        """Everything the generated code depends on (not the name)."""
        return {
            "rank": self.rank,
            "reduce_axes": list(self.reduce_axes),
            "inputs": [
                [i.dtype, [[v.op, list(map(_plain, v.args))] for v in i.views]] for i in self.inputs
            ],
            "outputs": [
                [
                    o.dtype,
                    o.instr,
                    o.level,
                    o.keepdims,
                    o.rank,
                    [[v.op, list(map(_plain, v.args))] for v in o.views],
                ]
                for o in self.outputs
            ],
            "body": [
                [b.op, list(b.args), [[k, _plain(v)] for k, v in b.attrs], b.ctype, b.level]
                for b in self.body
            ],
            "shape_sources": [list(s) for s in self.shape_sources],
            "inner_classes": list(self.inner_classes),
            "concat": [self.concat[0], list(self.concat[1])] if self.concat else None,
            "branches": [list(i.branch) if i.branch else None for i in self.inputs],
        }

    def digest(self) -> str:
        """Hash of :meth:`structure`: identical groups share one kernel."""
        text = json.dumps(self.structure(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def signature(self) -> str:
        """A one-line signature: ``(f32[r4], f32[r4]) -> f32[r4] reduce(3)``."""
        ins = ", ".join(f"{i.dtype}" for i in self.inputs)
        outs = ", ".join(f"{o.dtype}{'' if o.level == ELEM else '/row'}" for o in self.outputs)
        red = f" reduce{list(self.reduce_axes)}" if self.reduce_axes else ""
        return f"rank {self.rank}: ({ins}) -> ({outs}){red}"

    def to_text(self) -> str:
        """Readable listing of the body (for dumps and tests)."""
        lines = [f"kernel {self.name} {self.signature()}"]
        for i, b in enumerate(self.body):
            attrs = ", ".join(f"{k}={v!r}" for k, v in b.attrs)
            args = ", ".join(f"%{a}" for a in b.args)
            lines.append(
                f"  %{i} = {b.op}({args}{'; ' + attrs if attrs else ''}) : {b.ctype} {b.level}"
            )
        for o in self.outputs:
            lines.append(f"  store {o.name} <- %{o.instr} ({o.dtype})")
        return "\n".join(lines)


def _plain(v: Any) -> Any:
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return str(v)
    return v
