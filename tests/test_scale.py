"""Scale (issue 15): a ~5,000-node graph through the whole pipeline, and deep chains.

Behaviour only (the stages complete, the plan is valid, the counts, the numerics); the
growth rate of each stage is measured by ``benchmarks/scale.py``, never asserted here.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.frontend.loader import load_model
from graph_autofusion.frontend.onnx_frontend import save_onnx, to_onnx
from graph_autofusion.ir.core import Graph, Model, Value, is_convex
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.verify import verify
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.pipeline import fuse_model
from graph_autofusion.planner.plan import _cycle_groups
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.scale_graphs import NODES_PER_STAGE, hybrid_feeds, hybrid_stack

STAGES = 5000 // NODES_PER_STAGE
UNSAFE = FuseOptions(safe_mode=False)


def _run(model, feeds):
    return ort_session(model, "disable", 1).run(None, feeds)


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "hybrid.onnx"
    save_onnx(to_onnx(hybrid_stack(5000)), path)
    model = load_model(path)
    feeds = hybrid_feeds(model)
    result = fuse_model(
        model, builtin_rules(), load_profile("ascend910b"), options=UNSAFE, feeds=feeds
    )
    out = path.with_name("fused.onnx")
    save_onnx(result.model, out)
    return model, feeds, result, out


def test_the_stages_complete_with_the_expected_counts(fused):
    model, _, result, out = fused
    assert len(model.graph) == STAGES * NODES_PER_STAGE
    analysis = result.analysis
    # per stage: 12 candidates (rule matches and clusters), 8 native rewrites lowered
    assert len(analysis.candidates) == 12 * STAGES
    assert len(result.lowered) == 8 * STAGES
    assert len(result.model.graph) == 30 * STAGES
    fused_ops = {op for low in result.lowered for op in low.fused_ops}
    assert {"com.microsoft::FusedConv", "com.microsoft::BiasGelu", "RMSNormalization"} <= fused_ops
    assert set(analysis.timings) >= {"bind", "candidates", "cost", "plan", "report"}
    assert out.stat().st_size > 0


def test_the_plan_is_valid(fused):
    _, _, result, _ = fused
    chosen = result.analysis.plan.chosen
    assert chosen
    claimed: set = set()
    for c in chosen:  # disjoint, each convex, together acyclic
        assert claimed.isdisjoint(c.nodes), c.key
        claimed.update(c.nodes)
        assert is_convex(c.nodes), c.key
    group_of = {n: i for i, c in enumerate(chosen) for n in c.nodes}
    assert _cycle_groups(list(chosen), group_of) == set()


def test_the_fused_model_is_valid_and_computes_the_same(fused):
    model, feeds, result, out = fused
    verify(result.model)
    onnx.checker.check_model(str(out), full_check=True)
    (want,) = _run(model, feeds)
    (got,) = _run(onnx.load(str(out)), feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def _chain(n: int) -> Model:
    """About ``n`` nodes in one dependency chain on a [4, 8] tensor: Add of a bias, then
    SiLU written out (``h * Sigmoid(h)``, the ``silu`` rule's pattern)."""
    g = Graph("chain")
    h = g.add_input(Value("x", DType.FLOAT, (4, 8)))
    bias = g.add_initializer("bias", np.full((8,), 0.25, np.float32))

    def op(op_type: str, *ins: Value) -> Value:
        out = g.make_node(op_type, list(ins)).outputs[0]
        out.dtype, out.shape = DType.FLOAT, (4, 8)
        return out

    for _ in range(n // 3):
        h = op("Add", h, bias)
        h = op("Mul", h, op("Sigmoid", h))
    g.set_outputs([h])
    return Model(g, {"": 18})


def test_a_deep_chain_goes_through_without_recursion(tmp_path):
    """A chain deeper than the recursion limit in force at every level a walk may recurse
    over: ``3 * (limit + 200)`` nodes (3,600 at the default limit of 1,000), as many SiLU
    groups as ``limit + 200`` and a fused chain of twice that: import, candidates, cost, plan,
    lowering, export, no RecursionError anywhere (the walks are iterative). The chain follows
    the limit, so a raised limit cannot make it shallow (tests/test_hostile_onnx.py fuses a
    10,000-node chain through the API and the CLI)."""
    chain = 3 * (sys.getrecursionlimit() + 200)
    path = tmp_path / "chain.onnx"
    save_onnx(to_onnx(_chain(chain)), path)
    model = load_model(path)
    feeds = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}
    result = fuse_model(
        model, builtin_rules(), load_profile("ascend910b"), options=UNSAFE, feeds=feeds
    )
    assert len(result.analysis.candidates) == chain // 3
    assert len(result.lowered) == chain // 3  # every SiLU
    save_onnx(result.model, tmp_path / "fused.onnx")
    verify(result.model)
    (want,) = _run(model, feeds)
    (got,) = _run(onnx.load(str(tmp_path / "fused.onnx")), feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
