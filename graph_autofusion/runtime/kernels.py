"""Calling compiled kernels on NumPy arrays and CPU torch tensors, without copies.

    lib = load_library(compiled)                  # a CompiledLibrary from codegen.compiler
    fn = lib.kernel("k0")
    (y,) = fn(x, gamma)                           # torch tensors in, torch tensors out

A call applies the kernel inputs' views (strided, no copy), computes the loop shape, each
operand's strides over it, merges the axes every operand walks contiguously, and calls the
fast variant when every innermost stride is the one compiled in (else the generic one). That
preparation is cached per input shapes and strides, so a repeated call costs a dict look-up,
the output allocation and one ctypes call.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.codegen.kernel_ir import ROW, Kernel
from graph_autofusion.codegen.views import (
    apply_views,
    collapse,
    element_strides,
    is_torch,
    loop_strides,
    view_inputs,
)

_NP = {
    "f32": np.float32,
    "f16": np.float16,
    "f64": np.float64,
    "i64": np.int64,
    "i32": np.int32,
    "i8": np.int8,
    "u8": np.uint8,
    "bool": np.bool_,
}


def torch_dtype(storage: str):
    import torch

    return {
        "f32": torch.float32,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "f64": torch.float64,
        "i64": torch.int64,
        "i32": torch.int32,
        "i8": torch.int8,
        "u8": torch.uint8,
        "bool": torch.bool,
    }[storage]


def _storage_use_count(cdata: int) -> int:
    import torch

    return int(torch._C._storage_Use_Count(cdata))


def default_threads() -> int:
    try:
        import torch

        return int(torch.get_num_threads())
    except ImportError:  # pragma: no cover - torch is a dependency of the cpu target
        return os.cpu_count() or 1


#: Output tensors kept per output slot for reuse.
POOL = 4


@dataclass
class CallPlan:
    """Everything a call with one set of input shapes, strides and dtypes needs."""

    fn: Any
    sizes: Any
    strides: Any
    out_shapes: list[tuple[int, ...]]
    fast: bool
    sizes_addr: int = 0
    strides_addr: int = 0
    offsets: tuple[int, ...] = ()  # byte offset of each (viewed) input from the tensor's data
    out_dtypes: tuple[Any, ...] = ()
    pool: list[Any] = field(default_factory=list)  # last output tensor of each output slot
    fn_addr: int = 0
    offsets_array: Any = None  # int64 byte offsets of every operand (the shim's argument)
    offsets_addr: int = 0


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


class KernelFunction:
    """One compiled kernel, callable on arrays or tensors (outputs of the same kind)."""

    def __init__(self, kernel: Kernel, cdll: Any, threads: int | None = None) -> None:
        self.kernel = kernel
        args = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self._fast = getattr(cdll, kernel.name) if kernel.inner_classes else None
        self._generic = getattr(cdll, kernel.name + "_g")
        for f in (self._fast, self._generic):
            if f is not None:
                f.argtypes = args
                f.restype = None
        self.threads = threads or default_threads()
        self._plans: dict[tuple, CallPlan] = {}
        self._tensor_plans: dict[tuple, CallPlan] = {}
        self._out_views = any(o.views for o in kernel.outputs)
        from graph_autofusion.runtime.shim import load_shim

        self._shim = load_shim() if len(kernel.inputs) + len(kernel.outputs) <= 64 else None
        self._nops = len(kernel.inputs) + len(kernel.outputs)
        self._ptr_t = ctypes.c_void_p * self._nops

    def _plan(self, xs: Sequence[Any], key: tuple) -> CallPlan:
        k = self.kernel
        shapes = [(tuple(int(d) for d in x.shape), element_strides(x)) for x in xs]
        loop = loop_shape(k, [s for s, _ in shapes])
        oshapes = output_shapes(k, loop)
        outs = output_operands(k, loop, oshapes)
        sizes, st = plan_strides(k, loop, shapes + outs)
        fast = self._fast is not None and all(
            p[-1] == c or sizes[-1] == 1 for p, c in zip(st, k.inner_classes)
        )
        if k.concat is not None:  # the branches' offsets along the last axis follow the sizes
            lengths = concat_lengths(k, [s for s, _ in shapes])
            sizes = list(sizes) + [int(x) for x in np.cumsum([0, *lengths])]
        sz = np.asarray(sizes, dtype=np.int64)
        stv = np.asarray([v for p in st for v in p], dtype=np.int64)
        plan = CallPlan(self._fast if fast else self._generic, sz, stv, oshapes, fast)
        plan.sizes_addr, plan.strides_addr = sz.ctypes.data, stv.ctypes.data
        self._plans[key] = plan
        return plan

    def __call__(self, *inputs: Any) -> list[Any]:
        """Run on torch tensors (the cached fast path) or NumPy arrays."""
        try:
            key = tuple((x.shape, x.stride(), x.dtype) for x in inputs)
            plan = self._tensor_plans[key]
        except (KeyError, AttributeError, TypeError):
            return self._call(inputs)
        outs = self._outputs(plan)
        if self._shim is not None:
            self._shim.call(
                plan.fn_addr,
                plan.sizes_addr,
                plan.strides_addr,
                self.threads,
                plan.offsets_addr,
                *inputs,
                *outs,
            )
            return self._view_outputs(outs) if self._out_views else outs
        ptrs = self._ptr_t(
            *[x.data_ptr() + off for x, off in zip(inputs, plan.offsets)],
            *[o.data_ptr() for o in outs],
        )
        plan.fn(plan.sizes_addr, ptrs, plan.strides_addr, self.threads)
        if self._out_views:
            return self._view_outputs(outs)
        return outs

    @staticmethod
    def _outputs(plan: CallPlan) -> list[Any]:
        """Output tensors: earlier calls' tensors that nothing references any more, neither the
        tensor nor its storage (run-time liveness: a fresh 64 MB tensor costs ~16k page faults
        per call), else new ones. Each output slot keeps up to ``POOL`` tensors."""
        import torch

        outs = []
        for slot, s, d in zip(plan.pool, plan.out_shapes, plan.out_dtypes):
            got = None
            for t in slot:
                # references: the slot list, ``t``, getrefcount's argument; storage: the
                # tensor and the temporary storage object
                if sys.getrefcount(t) <= 3 and _storage_use_count(t.untyped_storage()._cdata) <= 2:
                    got = t
                    break
            if got is None:
                got = torch.empty(s, dtype=d)
                slot.append(got)
                if len(slot) > POOL:
                    del slot[0]
            outs.append(got)
        return outs

    def _view_outputs(self, outs: list[Any]) -> list[Any]:
        return [
            apply_views(t, o.views) if o.views else t for t, o in zip(outs, self.kernel.outputs)
        ]

    def _call(self, inputs: Sequence[Any]) -> list[Any]:
        k = self.kernel
        if len(inputs) != len(k.inputs):
            raise TypeError(f"kernel {k.name} takes {len(k.inputs)} inputs, got {len(inputs)}")
        torch_mode = any(is_torch(x) for x in inputs)
        xs = view_inputs(
            k, [self._as_storage(x, inp.dtype, torch_mode) for x, inp in zip(inputs, k.inputs)]
        )
        key = tuple((tuple(x.shape), element_strides(x)) for x in xs)
        plan = self._plans.get(key) or self._plan(xs, key)
        if torch_mode:
            import torch

            same = all(
                isinstance(a, torch.Tensor)
                and a.dtype == torch_dtype(i.dtype)
                # a view that had to copy (a Reshape of a non-contiguous layout) has no fixed
                # offset from the caller's tensor: such calls keep taking this slow path
                and x.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
                for a, x, i in zip(inputs, xs, k.inputs)
            )
            if same:  # later calls with these tensors' layout skip all of the above
                offsets = tuple(x.data_ptr() - a.data_ptr() for x, a in zip(xs, inputs))
                array = np.asarray(list(offsets) + [0] * len(k.outputs), dtype=np.int64)
                fast = dataclasses.replace(
                    plan,
                    offsets=offsets,
                    out_dtypes=tuple(torch_dtype(o.dtype) for o in k.outputs),
                    pool=[[] for _ in k.outputs],
                    fn_addr=ctypes.cast(plan.fn, ctypes.c_void_p).value or 0,
                    offsets_array=array,
                    offsets_addr=array.ctypes.data,
                )
                tkey = tuple((a.shape, a.stride(), a.dtype) for a in inputs)
                self._tensor_plans[tkey] = fast

            outs = [
                torch.empty(s, dtype=torch_dtype(o.dtype))
                for s, o in zip(plan.out_shapes, k.outputs)
            ]
            ptrs = [x.data_ptr() for x in xs] + [o.data_ptr() for o in outs]
        else:
            outs = [np.empty(s, dtype=_NP[o.dtype]) for s, o in zip(plan.out_shapes, k.outputs)]
            ptrs = [x.__array_interface__["data"][0] for x in xs] + [
                o.__array_interface__["data"][0] for o in outs
            ]
        plan.fn(plan.sizes_addr, self._ptr_t(*ptrs), plan.strides_addr, self.threads)
        return self._view_outputs(outs) if self._out_views else outs

    @staticmethod
    def _as_storage(x: Any, storage: str, torch_mode: bool) -> Any:
        if torch_mode:
            import torch

            if not isinstance(x, torch.Tensor):
                x = torch.from_numpy(np.asarray(x))
            dt = torch_dtype(storage)
            if x.dtype != dt:
                x = x.to(dt)
            if x.device.type != "cpu":
                raise ValueError("generated CPU kernels take CPU tensors")
            return x
        if storage == "bf16":
            raise TypeError("bf16 kernel inputs need torch tensors (NumPy has no bfloat16)")
        x = np.asarray(x)
        if x.dtype != _NP[storage]:
            x = x.astype(_NP[storage])
        return x


class KernelLibrary:
    """A loaded kernel library: ``lib.kernel(name)`` gives a :class:`KernelFunction`."""

    def __init__(self, compiled: Any, threads: int | None = None) -> None:
        try:
            import torch  # noqa: F401  - one OpenMP runtime: torch's libgomp, loaded first
        except ImportError:  # pragma: no cover
            pass
        self.compiled = compiled
        self.cdll = ctypes.CDLL(compiled.path)
        self.functions = {k.name: KernelFunction(k, self.cdll, threads) for k in compiled.kernels}

    def kernel(self, name: str) -> KernelFunction:
        return self.functions[name]


def load_library(compiled: Any, threads: int | None = None) -> KernelLibrary:
    return KernelLibrary(compiled, threads)
