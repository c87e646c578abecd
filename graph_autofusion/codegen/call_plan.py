"""The calling convention of a generated kernel, in shapes and strides: the loop shape of a
call, each operand's strides over it (merged where every operand allows), the output shapes,
and the innermost-stride classes the fast variant compiles in. Pure NumPy: the runtime
(:mod:`graph_autofusion.runtime.kernels`) plans its calls with it, the reference evaluator and
the kernel finalization (:func:`finalize_kernel`) use it before anything is compiled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from graph_autofusion.codegen.kernel_ir import ROW, Kernel
from graph_autofusion.codegen.lower import KernelReason, KernelRefused
from graph_autofusion.codegen.views import collapse, element_strides, loop_strides, view_inputs
from graph_autofusion.ir.core import Model

#: NumPy dtype of each kernel storage type
NP_DTYPES = {
    "f32": np.float32,
    "f16": np.float16,
    "f64": np.float64,
    "i64": np.int64,
    "i32": np.int32,
    "i8": np.int8,
    "u8": np.uint8,
    "bool": np.bool_,
}


def loop_shape(kernel: Kernel, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The loop shape of a call: every input and ``Expand`` shape broadcast, padded to the
    kernel's rank. An input read inside a Concat branch takes part with its last axis as 1
    (its leading axes broadcast like everyone's); the Concat's axis is the sum of the
    branches' lengths."""
    parts = [
        s if i.branch is None else (*s[:-1], 1) if s else s for s, i in zip(shapes, kernel.inputs)
    ]
    f = tuple(int(d) for d in np.broadcast_shapes(*parts, *kernel.shape_sources))
    f = (1,) * (kernel.rank - len(f)) + f
    if kernel.concat is not None:
        total = sum(concat_lengths(kernel, shapes))
        if f[-1] == 1:
            f = (*f[:-1], total)
        elif f[-1] != total:
            raise ValueError(f"kernel {kernel.name}: Concat of length {total}, loop {f}")
    return f


def concat_lengths(kernel: Kernel, shapes: Sequence[tuple[int, ...]]) -> list[int]:
    """Each Concat branch's length along the last axis: its inputs' last axes broadcast (a
    symbolic dim that is 1 in this call broadcasts, as in ONNX)."""
    assert kernel.concat is not None
    lengths = []
    for b in range(len(kernel.concat[1])):
        dims = {
            int(s[-1]) if s else 1
            for s, i in zip(shapes, kernel.inputs)
            if i.branch is not None and i.branch[1] == b
        }
        wide = dims - {1}
        if len(wide) > 1:
            raise ValueError(f"kernel {kernel.name}: Concat branch {b} lengths {sorted(dims)}")
        lengths.append(wide.pop() if wide else 1)
    return lengths


def output_shapes(kernel: Kernel, loop: tuple[int, ...]) -> list[tuple[int, ...]]:
    out = []
    red = set(kernel.reduce_axes)
    for o in kernel.outputs:
        if o.level == ROW and not o.keepdims:
            s = tuple(d for a, d in enumerate(loop) if a not in red)
        elif o.level == ROW:
            s = tuple(1 if a in red else d for a, d in enumerate(loop))
        else:
            s = loop
        out.append(s[len(s) - o.rank :] if o.rank <= len(s) else (1,) * (o.rank - len(s)) + s)
    return out


def plan_strides(
    kernel: Kernel,
    loop: tuple[int, ...],
    operands: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
) -> tuple[list[int], list[list[int]]]:
    """Sizes and per-operand strides in kernel order (outer axes, inner axes), merged where
    every operand allows and padded to the kernel's compiled axis counts."""
    r = kernel.rank
    red = list(kernel.reduce_axes)
    order = [a for a in range(r) if a not in red] + red
    groups = [0] * (r - len(red)) + [1] * len(red)
    if kernel.concat is not None and loop[-1] == 1:
        raise ValueError(f"kernel {kernel.name}: a Concat of length 1 is not supported")
    per = []
    for shape, strides in operands:
        s = loop_strides(shape, strides, loop)
        per.append([s[a] for a in order])
    sizes = [loop[a] for a in order]
    if not red:
        groups = [0] * r
        if kernel.concat is not None:  # the Concat axis keeps its own loop
            groups[-1] = 2
    sizes, per, groups = collapse(sizes, per, groups)
    ni = kernel.inner_count
    if red:
        outer = [i for i, g in enumerate(groups) if g == 0]
        inner = [i for i, g in enumerate(groups) if g == 1]
    else:
        outer = list(range(max(0, len(sizes) - 1)))
        inner = list(range(max(0, len(sizes) - 1), len(sizes)))
    no = r - ni
    pad_o, pad_i = no - len(outer), ni - len(inner)
    new_sizes = [1] * pad_o + [sizes[i] for i in outer] + [1] * pad_i + [sizes[i] for i in inner]
    new_st = [
        [0] * pad_o + [p[i] for i in outer] + [0] * pad_i + [p[i] for i in inner] for p in per
    ]
    return new_sizes, new_st


def output_operands(
    kernel: Kernel, loop: tuple[int, ...], shapes: Sequence[tuple[int, ...]]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each (contiguous) output's shape and strides as an operand over the loop. An output
    without its reduced axes gets the loop's rank back (size 1, stride 0 on the reduced axes):
    aligning its shorter shape from the right would put its strides on the wrong axes."""
    red = set(kernel.reduce_axes)
    out = []
    for o, s in zip(kernel.outputs, shapes):
        st = contiguous_strides(s)
        if o.level == ROW and not o.keepdims:
            kept = [a for a in range(len(loop)) if a not in red]
            kept = kept[len(kept) - len(s) :] if s else []
            full_shape, full_st = [1] * len(loop), [0] * len(loop)
            for a, d, t in zip(kept, s, st):
                full_shape[a], full_st[a] = d, t
            out.append((tuple(full_shape), tuple(full_st)))
        else:
            out.append((tuple(s), st))
    return out


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def inner_classes(kernel: Kernel, input_shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The innermost stride of every operand (1 or 0) for contiguous operands of these shapes:
    what the fast variant compiles in. An operand whose innermost stride is neither gets 1
    (calls with it take the generic variant)."""
    shapes = []
    xs = view_inputs(kernel, [np.empty(s, dtype=np.uint8) for s in input_shapes])
    for x in xs:
        shapes.append((tuple(x.shape), element_strides(x)))
    loop = loop_shape(kernel, [s for s, _ in shapes])
    outs = output_operands(kernel, loop, output_shapes(kernel, loop))
    _, st = plan_strides(kernel, loop, shapes + outs)
    return tuple(0 if p[-1] == 0 else 1 for p in st)


def sample_shape(model: Model, binding: Any, name: str) -> tuple[int, ...]:
    """The shape of value ``name`` on the sample inputs (``binding``: the analysis' shape
    binding), else its constant's or its static declared shape.

    Raises:
        KernelRefused: no static shape is known (``KernelReason.UNKNOWN_SHAPE``).
    """
    t = binding.types.get(name) if binding is not None else None
    if t is not None and t[1] is not None:
        return tuple(int(d) for d in t[1])
    v = model.graph.value_map().get(name)
    if v is not None and v.const is not None:
        return tuple(v.const.shape)
    if v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
        return tuple(v.shape)
    raise KernelRefused(KernelReason.UNKNOWN_SHAPE, f"no sample shape for {name!r}")


def finalize_kernel(kernel: Kernel, input_shapes: list[tuple[int, ...]]) -> Kernel:
    """Fix the fast path's stride classes from the sample shapes and name the kernel by its
    structure (identical groups share one compiled function)."""
    k = replace(kernel, inner_classes=inner_classes(kernel, input_shapes))
    return replace(k, name=f"gaf_{k.digest()}")
