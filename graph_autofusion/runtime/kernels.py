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

from graph_autofusion.codegen.call_plan import (
    NP_DTYPES,
    concat_lengths,
    loop_shape,
    output_operands,
    output_shapes,
    plan_strides,
)
from graph_autofusion.codegen.kernel_ir import Kernel
from graph_autofusion.codegen.views import apply_views, element_strides, is_torch, view_inputs
from graph_autofusion.runtime.shim import load_shim


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
            outs = [
                np.empty(s, dtype=NP_DTYPES[o.dtype]) for s, o in zip(plan.out_shapes, k.outputs)
            ]
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
        if x.dtype != NP_DTYPES[storage]:
            x = x.astype(NP_DTYPES[storage])
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
