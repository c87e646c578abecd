"""Property tests of the kernel generator: random fused groups compiled to C match the NumPy
reference that executes the same kernel IR, and (fp32) the groups' own operators in torch.

5 hypothesis examples of 45 groups each, in 5 library compiles (gcc is most of the time, about
linear in the number of distinct groups): hypothesis' first example is its simplest draw (one
minimal group 45 times, one kernel), the other 4 are random: 180 random groups, which draw
nearly every (operator, dtype) pair of the generator (counted on a seeded RngChooser draw: 89
of its 90; 540 drew all 90); GAF_FUZZ=1 draws new ones.
On a failure hypothesis prints the reproduction blob (``print_blob``): the seed is recorded.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_autofusion.codegen.compiler import compile_library
from graph_autofusion.codegen.lower import lower_group
from graph_autofusion.codegen.reference import run_reference
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.pipeline.cpu_kernels import finalize_kernel
from graph_autofusion.runtime.kernels import load_library
from graph_autofusion.runtime.torch_runtime import TorchRunner
from graph_autofusion.testing.fused_groups import HypothesisChooser, random_group

GROUPS_PER_EXAMPLE = 45
DISCONTINUOUS = {"Floor", "Greater", "Where", "Max", "Min", "ReduceMax", "ReduceMin", "Relu"}
TOL = {DType.FLOAT: 1e-5, DType.FLOAT16: 2e-3, DType.BFLOAT16: 1.6e-2}


def _close(got: np.ndarray, want: np.ndarray, tol: float, loose: bool) -> tuple[bool, str]:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return False, f"shape {got.shape} != {want.shape}"
    scale = max(1.0, float(np.nanmax(np.abs(want))) if want.size else 1.0)
    bad = ~(np.isclose(got, want, rtol=0, atol=tol * scale) | (np.isnan(got) & np.isnan(want)))
    frac = float(bad.mean()) if bad.size else 0.0
    limit = 2e-3 if loose else 0.0  # one-ulp differences may flip a Floor or a comparison
    return (
        frac <= limit,
        f"{bad.sum()} of {bad.size} elements differ (worst {np.nanmax(np.abs(got - want)):.3g}, scale {scale:.3g})",
    )


def _torch_inputs(group, kernel):
    out = []
    for i in kernel.inputs:
        a = torch.from_numpy(np.ascontiguousarray(group.feeds[i.name]))
        out.append(a.to(torch.bfloat16) if group.dtype == DType.BFLOAT16 else a)
    return out


@settings(
    max_examples=5,
    deadline=None,
    database=None,
    # the same examples every run (CI must not depend on the draw); GAF_FUZZ=1 draws new ones
    derandomize=os.environ.get("GAF_FUZZ") != "1",
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_groups_compiled_to_c_match_the_reference(data):
    groups, kernels = [], []
    for i in range(GROUPS_PER_EXAMPLE):
        g = random_group(HypothesisChooser(data), name=f"g{i}")
        low = lower_group(g.nodes, g.outputs, None, name="k", opset=20)
        shapes = [g.feeds[inp.name].shape for inp in low.kernel.inputs]
        groups.append(g)
        kernels.append(finalize_kernel(low.kernel, shapes))
    lib = load_library(compile_library(list({k.name: k for k in kernels}.values())))
    for g, k in zip(groups, kernels):
        ins = _torch_inputs(g, k)
        got = [t.float().numpy() for t in lib.kernel(k.name)(*ins)]
        ref = run_reference(k, [g.feeds[i.name] for i in k.inputs])
        loose = any(n.op_type in DISCONTINUOUS for n in g.nodes)
        for o, a, b in zip(k.outputs, got, ref):
            ok, why = _close(a, b, TOL[g.dtype], loose)
            assert ok, f"{g.description}: output {o.name}: {why}\n{k.to_text()}"
        if g.dtype == DType.FLOAT:  # the kernel IR means what the operators mean
            want = TorchRunner(g.model).run({n: torch.from_numpy(v) for n, v in g.feeds.items()})
            for o, a in zip(k.outputs, got):
                ok, why = _close(a, want[o.name].numpy(), 2e-5, loose)
                assert ok, f"{g.description}: output {o.name} vs torch: {why}\n{k.to_text()}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_groups_run_on_numpy_arrays_too(seed):
    from graph_autofusion.testing.fused_groups import RngChooser

    c = RngChooser(seed)
    g = random_group(c, name="s")
    while g.dtype == DType.BFLOAT16:  # NumPy has no bfloat16: those take torch tensors
        g = random_group(c, name="s")
    low = lower_group(g.nodes, g.outputs, None, opset=20)
    k = finalize_kernel(low.kernel, [g.feeds[i.name].shape for i in low.kernel.inputs])
    fn = load_library(compile_library([k])).kernel(k.name)
    arrays = [g.feeds[i.name] for i in k.inputs]
    got = fn(*arrays)
    assert all(isinstance(a, np.ndarray) for a in got)
    for a, b in zip(got, run_reference(k, arrays)):
        ok, why = _close(a, b, TOL[g.dtype], True)
        assert ok, why
