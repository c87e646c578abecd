"""The cpu target's kernels as safe mode and the profilers see them: the planned groups
(:class:`KernelGroup`, :class:`NativeGroup`), the callables that run them (compiled, or the
NumPy reference), the unfused operators they replace on torch's kernels, and safe mode's
verdict on one kernel (:func:`check_kernel`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion import defaults, reasons
from graph_autofusion.codegen.call_plan import finalize_kernel  # noqa: F401 - its public name here
from graph_autofusion.codegen.kernel_ir import Kernel
from graph_autofusion.codegen.onnxruntime import Lowered
from graph_autofusion.codegen.reference import run_reference
from graph_autofusion.options import FuseOptions
from graph_autofusion.runtime.kernels import load_library
from graph_autofusion.verify.compare import compare_tensors
from graph_autofusion.verify.safety import SafetyResult
from graph_autofusion.verify.speed import SpeedPolicy


@dataclass
class KernelGroup:
    """One planned group and its kernel."""

    key: str
    rule: str
    fused_op: str
    node_names: list[str]
    output_names: list[str]
    kernel: Kernel
    prologue: list[str]  # nodes torch computes first (a contraction, run-time reshapes)
    tolerance: float = defaults.FUSION_COSINE
    #: This group's values for the kernel's inputs (a kernel shared by identical groups
    #: names the first group's values).
    input_names: list[str] = field(default_factory=list)


@dataclass
class NativeGroup:
    """One planned rule match the cpu target runs as its rule's native rewrite (a fused
    operator torch executes, :data:`~graph_autofusion.codegen.targets.TORCH_NATIVE_OPS`)."""

    key: str
    rule: Any  # the FusionRule
    root: str
    node_names: list[str]
    output_names: list[str]
    tolerance: float = defaults.FUSION_COSINE


def native_step(low: Lowered, opset: int, consts: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """A callable running a native group's new nodes on torch: ``step(None, *args)`` with
    ``args`` for the returned input names; returns the group's outputs in order."""
    names = list(low.inputs)
    run = unfused_runner(low.new_nodes, names, consts, opset, outputs=low.outputs)
    return (lambda _call, *args: run(*args)), names


def kernel_functions(
    library: Any, groups: list[KernelGroup], options: FuseOptions
) -> dict[str, Any]:
    """Kernel name -> callable (compiled, or the NumPy reference when asked for)."""
    if options.backend == "reference":
        out: dict[str, Any] = {}
        for g in groups:
            out[g.kernel.name] = ReferenceKernel(g.kernel, run_reference)
        return out
    if library is None:
        return {}
    lib = load_library(library, options.threads)
    return dict(lib.functions)


class ReferenceKernel:
    def __init__(self, kernel: Kernel, fn: Any) -> None:
        self.kernel, self.fn = kernel, fn

    def __call__(self, *inputs: Any) -> list[Any]:
        import torch

        arrays = [x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy() for x in inputs]
        outs = self.fn(self.kernel, arrays)
        res = []
        for o, spec in zip(outs, self.kernel.outputs):
            t = torch.from_numpy(np.array(o, order="C"))
            res.append(t.to(torch.bfloat16) if spec.dtype == "bf16" else t)
        return res


def unfused_runner(
    nodes: list,
    input_names: list[str],
    consts: Mapping[str, Any],
    opset: int,
    acts: Mapping[str, Any] | None = None,
    outputs: Sequence[str] = (),
):
    """A callable running ``nodes`` (of the original model) one by one on torch's kernels:
    what a kernel replaces. Values outside the fused node's inputs (a shape the original
    computes at run time where the fused model has a folded constant) come from ``consts`` or
    the captured activations ``acts``. It returns the ``outputs`` named (one value, a tuple
    of several, ``None`` for none)."""
    from graph_autofusion.runtime.torch_ops import OpCall  # heavy: torch
    from graph_autofusion.runtime.torch_runtime import impl_for

    acts = acts or {}

    calls = [(n, impl_for(n), OpCall(n, opset)) for n in nodes]

    def run(*args: Any) -> Any:
        env = dict(zip(input_names, args))
        for n, impl, call in calls:
            ins = [
                None
                if v is None
                else env[v.name]
                if v.name in env
                else consts.get(v.name, acts.get(v.name))
                for v in n.inputs
            ]
            out = impl(call, *ins)
            for v, t in zip(n.outputs, out if isinstance(out, tuple | list) else (out,)):
                env[v.name] = t
        if not outputs:
            return None
        outs = [env[o] for o in outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def kernel_and_operators(
    result: Any, low: Lowered, acts: Mapping[str, Any], opset: int
) -> tuple[Any, list[Any], Any]:
    """One fused group's kernel step, its arguments taken from the original's captured
    activations ``acts``, and a runner of the operators it replaced (what safe mode and
    ``profile_fusion_kernel`` compare)."""
    consts = result.program.constants
    originals = {n.name: n for n in result.original.graph.nodes}
    nodes = [originals[n] for n in low.original_node_names if n in originals]
    if isinstance(low.payload, NativeGroup):
        step, names = native_step(low, opset, consts)
        args = [acts.get(n, consts.get(n)) for n in names]
        return step, args, unfused_runner(nodes, names, consts, opset, acts)
    fused = low.new_nodes[0]
    names = [v.name if v is not None else "" for v in fused.inputs]
    args = [acts.get(n, consts.get(n)) for n in names]
    unfused = unfused_runner(nodes, names, consts, opset, acts)
    return result.program.step_of(fused.name), args, unfused


def check_kernel(
    low: Lowered,
    step: Any,
    args: list[Any],
    expected: Mapping[str, Any],
    *,
    floor: float,
    unfused: Any = None,
    speed: SpeedPolicy | None = None,
) -> SafetyResult:
    """Safe mode's verdict on one kernel: its outputs on the real activations against the
    unfused operators' (cosine, max error), then (``unfused`` and ``speed`` given) its time
    against theirs by the one speed policy (:class:`~graph_autofusion.verify.speed.
    SpeedPolicy`, the onnxruntime target's too)."""
    import torch

    try:
        with torch.no_grad():
            got = step(None, *args)
    except Exception as exc:  # noqa: BLE001 - a failing kernel is rolled back, never a crash
        return SafetyResult(low.key, False, reasons.ERROR, f"{type(exc).__name__}: {exc}")
    got = got if isinstance(got, tuple | list) else (got,)
    res = SafetyResult(low.key, True, reasons.OK, "kernel outputs equal its unfused operators'")
    worst = None
    for name, t in zip(low.outputs, got):
        if name in expected:
            cmp = compare_tensors(t.float().numpy(), expected[name].float().numpy())
            if worst is None or cmp["cosine"] < worst["cosine"]:
                worst = cmp
    if worst is not None:
        res.cosine, res.max_abs, res.max_rel = worst["cosine"], worst["max_abs"], worst["max_rel"]
        if worst["cosine"] < floor:
            res.passed, res.code = False, reasons.NUMERICS
            res.message = f"cosine {worst['cosine']:.6f} below {floor}"
    if res.passed and unfused is not None and speed is not None:
        with torch.no_grad():
            tu, tf, slower = speed.measure(
                lambda: unfused(*args), lambda: step(None, *args), low.key
            )
        res.time_unfused_us, res.time_fused_us = tu, tf
        if slower:
            res.passed, res.code = False, reasons.SLOWER
            res.message = (
                f"kernel {res.time_fused_us:.1f} us vs unfused {res.time_unfused_us:.1f} us"
            )
    return res
