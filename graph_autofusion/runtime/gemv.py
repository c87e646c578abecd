"""``MatMul`` by a constant matrix: the gemv kernel for few rows, oneDNN's prepacked GEMM for
more.

    count = install_gemv(runner)    # patches a TorchRunner's plan in place

Each ``MatMul`` of the default domain whose right operand is a constant fp32 matrix becomes a
:class:`GemvMatMul`: a call with at most :data:`~graph_autofusion.codegen.gemv.MAX_ROWS`
contiguous fp32 rows runs the kernel of :mod:`graph_autofusion.codegen.gemv`; a call with more
rows runs oneDNN's GEMM on the weight reordered once into its blocked layout
(``torch.ops.mkldnn._linear_pointwise``, what Inductor's ``freezing=True`` uses); any other
call (another dtype, a strided input, no oneDNN) runs ``torch.matmul`` exactly as before.

Why: on this machine (an AMD EPYC) torch's ``mm`` goes to MKL, which runs a generic path on
AMD processors: 2.5-3x slower than oneDNN's packed GEMM at 16-128 rows, and its ``sgemv``
streams weights at ~15 GB/s where a plain read runs at 50-60 GB/s (``benchmarks/torch_e2e.py``
prints the GEMV floors of each).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np
import torch

from graph_autofusion.codegen.compiler import compile_source
from graph_autofusion.codegen.gemv import MAX_ROWS, SOURCE
from graph_autofusion.runtime.kernels import default_threads
from graph_autofusion.runtime.shim import load_shim


@functools.lru_cache(maxsize=4)
def load_gemv(options: Any = None) -> Any:
    """The compiled kernel of :data:`graph_autofusion.codegen.gemv.SOURCE` (its library, its
    address) and the call shim (``None`` when either cannot be built: the matrix products then
    stay on torch's kernels)."""
    shim = load_shim()
    if shim is None:
        return None
    built = compile_source(SOURCE, options, what="the gemv kernel")
    lib = ctypes.CDLL(built.path)
    fn = lib.gaf_gemv_f32
    return lib, ctypes.cast(fn, ctypes.c_void_p).value, shim


class GemvMatMul:
    """The implementation of one ``MatMul(x, W)`` node (``W`` a constant ``[K, N]`` matrix)."""

    def __init__(self, weight: torch.Tensor, loaded: Any, threads: int) -> None:
        self._lib, self._fn, self._shim = loaded
        w = weight.t()
        self.w = w if w.is_contiguous() else w.contiguous()  # [N, K], row-major
        self.n, self.k = int(self.w.shape[0]), int(self.w.shape[1])
        self.threads = threads
        self.packed: torch.Tensor | None = None  # oneDNN's blocked layout, on first need
        self._pack_tried = False
        self._plans: dict[int, tuple[np.ndarray, np.ndarray, int, int, int]] = {}
        self._offsets = np.zeros(3, dtype=np.int64)
        self.kernel_calls = 0

    def _plan(self, m: int) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        sizes = np.array([m, self.n, self.k], dtype=np.int64)
        strides = np.array([self.k, self.k, self.n], dtype=np.int64)
        plan = (sizes, strides, sizes.ctypes.data, strides.ctypes.data, self._offsets.ctypes.data)
        self._plans[m] = plan
        return plan

    def __call__(self, _call: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype is torch.float32 and x.dim() >= 1 and x.shape[-1] == self.k:
            m = x.numel() // self.k if self.k else 0
            if 0 < m <= MAX_ROWS and x.is_contiguous() and not x.requires_grad:
                plan = self._plans.get(m) or self._plan(m)
                y = torch.empty((*x.shape[:-1], self.n), dtype=torch.float32)
                self._shim.call(self._fn, plan[2], plan[3], self.threads, plan[4], x, self.w, y)
                self.kernel_calls += 1
                return y
            if not self._pack_tried:  # a graph that only decodes never needs the copy
                self._pack_tried = True
                self.packed = _pack(self.w)
            if self.packed is not None and not x.requires_grad and x.dim() >= 2:
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return torch.matmul(x, w)


def _pack(w: torch.Tensor) -> torch.Tensor | None:
    """``w`` ([N, K]) reordered for oneDNN's GEMM (``None`` without oneDNN)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return None
        return torch.ops.mkldnn._reorder_linear_weight(w, 128)
    except (RuntimeError, AttributeError):  # a build without the op
        return None


class LazyConstMatMul:
    """A ``MatMul`` whose right operand is a constant the caller passes in (a kernel's
    prologue): the first call with a given weight builds its :class:`GemvMatMul`."""

    def __init__(self, threads: int | None = None, options: Any = None) -> None:
        self.threads, self.options = threads, options
        self._impl: GemvMatMul | None = None
        self._weight: torch.Tensor | None = None
        self._failed = False

    def __call__(self, call: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self._weight is not w and not self._failed:
            self._impl = None
            if w.dim() == 2 and w.dtype is torch.float32 and not w.requires_grad:
                try:
                    loaded = load_gemv(self.options)
                except Exception:  # noqa: BLE001 - no compiler or shim: torch's matmul
                    loaded = None
                if loaded is None:
                    self._failed = True
                else:
                    self._impl = GemvMatMul(w, loaded, self.threads or default_threads())
            self._weight = w
        if self._impl is not None:
            return self._impl(call, x, w)
        return torch.matmul(x, w)


def gemv_candidates(runner: Any) -> list[int]:
    """Plan positions of the ``MatMul`` nodes by a constant fp32 matrix."""
    out = []
    for k, (node, _impl, _call) in enumerate(runner._plan):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        if getattr(runner, "steps", {}).get(node.name) is not None:
            continue
        w = node.inputs[1] if len(node.inputs) > 1 else None
        t = runner.constants.get(w.name) if w is not None else None
        if t is not None and t.dim() == 2 and t.dtype is torch.float32:
            out.append(k)
    return out


def install_gemv(runner: Any, threads: int | None = None, options: Any = None) -> int:
    """Route every eligible ``MatMul`` of ``runner`` through the gemv kernel; returns how many
    (0 when the kernel or its call shim cannot be built)."""

    positions = gemv_candidates(runner)
    if not positions:
        return 0
    try:
        loaded = load_gemv(options)
    except Exception:  # noqa: BLE001 - no compiler, no shim: torch's kernels as before
        return 0
    if loaded is None:
        return 0
    threads = threads or default_threads()
    shared: dict[int, GemvMatMul] = {}
    for k in positions:
        node, _impl, call = runner._plan[k]
        t = runner.constants[node.inputs[1].name]
        impl = shared.get(id(t)) or GemvMatMul(t, loaded, threads)
        shared[id(t)] = impl
        runner._plan[k] = (node, impl, call)
    runner.gemv = list(shared.values())
    return len(positions)
