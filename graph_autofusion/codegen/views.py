"""Views on kernel inputs and the strides a kernel call reads them through.

:func:`apply_views` applies a kernel input's layout operators (ONNX semantics) to a NumPy array
or a torch tensor as views: a ``Transpose`` permutes strides, a ``Slice`` offsets and scales
them, an ``Unsqueeze`` adds a zero-stride axis. Nothing is copied unless a ``Reshape`` cannot
be expressed on the input's strides (then NumPy and torch copy, as their ``reshape`` does).

:func:`loop_strides` gives an operand's element strides over a kernel's loop shape (aligned from
the right, ``0`` on broadcast axes); :func:`collapse` merges loop axes that every operand walks
contiguously, so a contiguous ``[8, 128, 64]`` chain becomes one loop of 65,536.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graph_autofusion.codegen.kernel_ir import View


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def apply_views(x: Any, views: Sequence[View]) -> Any:
    """``x`` seen through ``views`` (NumPy array or torch tensor in, same kind out)."""
    torch_mode = is_torch(x)
    for v in views:
        shape = tuple(x.shape)
        if v.op == "transpose":
            x = x.permute(*v.args) if torch_mode else x.transpose(v.args)
        elif v.op == "reshape":
            target = [shape[i] if d == 0 else d for i, d in enumerate(v.args)]
            x = x.reshape(target)
        elif v.op == "flatten":
            a = v.args[0]
            outer = int(np.prod(shape[:a], dtype=np.int64))
            x = (
                x.reshape(outer, -1)
                if outer or not shape
                else x.reshape(0, int(np.prod(shape[a:])))
            )
        elif v.op == "unsqueeze":
            for a in sorted(v.args):
                x = x.unsqueeze(a) if torch_mode else np.expand_dims(x, a)
        elif v.op == "squeeze":
            keep = [d for i, d in enumerate(shape) if i not in v.args]
            x = x.reshape(keep)
        elif v.op == "slice":
            index = [slice(None)] * len(shape)
            for axis, start, end, step in v.args:
                n = shape[axis]
                start = max(0, min(n, start + n if start < 0 else start))
                end = max(0, min(n, end + n if end < 0 else end))
                index[axis] = slice(start, end, step)
            x = x[tuple(index)]
        elif v.op == "select":
            axis, i = v.args
            index = [slice(None)] * len(shape)
            index[axis] = i if i >= 0 else i + shape[axis]
            x = x[tuple(index)]
        else:  # pragma: no cover - the lowering makes only the ops above
            raise ValueError(f"unknown view {v.op}")
    return x


def view_inputs(kernel: Any, inputs: Sequence[Any]) -> list[Any]:
    """Every kernel input seen through its views."""
    return [apply_views(x, inp.views) if inp.views else x for x, inp in zip(inputs, kernel.inputs)]


def element_strides(x: Any) -> tuple[int, ...]:
    """Strides in elements of a NumPy array or torch tensor."""
    if is_torch(x):
        return tuple(int(s) for s in x.stride())
    item = x.itemsize
    return tuple(int(s) // item for s in x.strides)


def loop_strides(shape: Sequence[int], strides: Sequence[int], loop: Sequence[int]) -> list[int]:
    """An operand's strides over ``loop`` (right-aligned broadcast: 0 where it has size 1)."""
    r = len(loop)
    off = r - len(shape)
    out = [0] * r
    for i, (d, s) in enumerate(zip(shape, strides)):
        out[i + off] = int(s) if d != 1 else 0
    return out


def collapse(
    sizes: Sequence[int], strides: Sequence[Sequence[int]], groups: Sequence[int]
) -> tuple[list[int], list[list[int]], list[int]]:
    """Merge adjacent loop axes within the same group (outer axes, inner axes) when every
    operand's stride allows it; drop size-1 axes. Returns new sizes, strides and groups."""
    keep = [i for i, d in enumerate(sizes) if d != 1]
    ns: list[int] = []
    nst: list[list[int]] = [[] for _ in strides]
    ng: list[int] = []
    for i in keep:
        if (
            ns
            and ng[-1] == groups[i]
            and all(st[i] * sizes[i] == acc[-1] for st, acc in zip(strides, nst))
        ):
            ns[-1] *= sizes[i]
            for st, acc in zip(strides, nst):
                acc[-1] = st[i]
            continue
        ns.append(int(sizes[i]))
        ng.append(groups[i])
        for st, acc in zip(strides, nst):
            acc.append(int(st[i]))
    return ns, nst, ng
