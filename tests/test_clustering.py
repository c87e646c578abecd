"""Automatic clustering (F4c): fusions no rule names, every refusal with a reason, runnable."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.ir.core import Model, is_convex
from graph_autofusion.ir.text import parse_model
from graph_autofusion.ir.verify import verify
from graph_autofusion.patterns.clustering import ClusterResult, apply_clusters, cluster
from graph_autofusion.patterns.pairs import PairReason as R
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.testing.rules import random_feeds


def clusters_of(text: str, **limits) -> tuple[Model, ClusterResult]:
    model = parse_model(text)
    return model, cluster(model.graph, **limits)


def shapes(result: ClusterResult) -> list[tuple[str, list[str]]]:
    return [(c.kind, [n.name for n in c.nodes]) for c in result.clusters]


def codes(result: ClusterResult) -> dict[tuple[str, str], str]:
    return {(r.producer.name, r.consumer.name): r.code for r in result.rejections}


def assert_runs_the_same(model: Model, result: ClusterResult, feeds=None) -> list[str]:
    """Rewrite every cluster into one fused node and compare the interpreter's outputs."""
    feeds = feeds if feeds is not None else random_feeds(model.graph)
    before = run_model(model, feeds)
    fused = apply_clusters(model, result)
    verify(model)
    after = run_model(model, feeds)
    assert len(fused) == len(result.clusters)
    for name, ref in before.items():
        np.testing.assert_allclose(after[name], ref, rtol=1e-5, atol=1e-6)
    return [n.op_type for n in model.graph.nodes]


CHAIN = """
graph g(%x: f32[2,8], %b: f32[8]) -> (%y) {
  init %c: f32[] = [0.5]
  %a = Add(%x, %b) @add
  %m = Mul(%a, %c) @mul
  %y = Tanh(%m) @tanh
}
"""


def test_elementwise_chain_is_one_cluster_and_runs():
    model, result = clusters_of(CHAIN)
    assert shapes(result) == [("elementwise", ["add", "mul", "tanh"])]
    (c,) = result.clusters
    assert [v.name for v in c.inputs] == ["x", "b", "c"]
    assert c.num_inputs == 2  # the scalar constant is an immediate
    assert [v.name for v in c.outputs] == ["y"]
    assert result.rejections == []
    assert assert_runs_the_same(model, result) == ["Cluster_elementwise"]


REDUCE = """
graph g(%x: f32[2,4,16]) -> (%y) {
  init %ax: i64[1] = [-1]
  init %eps: f32[] = [1e-5]
  %sq = Mul(%x, %x) @square
  %ms = ReduceMean<keepdims=1>(%sq, %ax) @mean
  %v = Add(%ms, %eps) @add_eps
  %r = Sqrt(%v) @sqrt
  %y = Div(%x, %r) @div
}
"""


def test_reduction_with_prologue_and_epilogue():
    model, result = clusters_of(REDUCE)
    assert shapes(result) == [
        ("prologue+reduction+epilogue", ["square", "mean", "add_eps", "sqrt", "div"])
    ]
    assert_runs_the_same(model, result)


LAYERNORM = """
graph g(%x: f32[2,4,16], %gamma: f32[16], %beta: f32[16]) -> (%y) {
  init %ax: i64[1] = [2]
  init %two: f32[] = [2.0]
  init %eps: f32[] = [1e-5]
  %mean = ReduceMean<keepdims=1>(%x, %ax) @mean
  %d: f32[2,4,16] = Sub(%x, %mean) @sub
  %p: f32[2,4,16] = Pow(%d, %two) @pow
  %var = ReduceMean<keepdims=1>(%p, %ax) @var
  %ve = Add(%var, %eps) @add_eps
  %s = Sqrt(%ve) @sqrt
  %n = Div(%d, %s) @div
  %g = Mul(%n, %gamma) @mul
  %y = Add(%g, %beta) @add
}
"""


def test_decomposed_layernorm_is_one_cluster_with_two_reductions():
    """Both ReduceMeans reduce f32[2,4,16] over axis 2 (the types must be known to tell)."""
    model, result = clusters_of(LAYERNORM)
    ((kind, names),) = shapes(result)
    assert kind == "reduction+epilogue"
    assert names == ["mean", "sub", "pow", "var", "add_eps", "sqrt", "div", "mul", "add"]
    assert_runs_the_same(model, result)


def test_reductions_over_other_axes_stay_apart():
    text = """
    graph g(%x: f32[4,8]) -> (%y) {
      init %a0: i64[1] = [0]
      init %a1: i64[1] = [1]
      %s = ReduceSum<keepdims=1>(%x, %a1) @rows
      %d: f32[4,8] = Sub(%x, %s) @sub
      %y = ReduceMax<keepdims=1>(%d, %a0) @cols
    }
    """
    _, result = clusters_of(text)
    assert shapes(result) == [("reduction+epilogue", ["rows", "sub"])]
    assert codes(result) == {("sub", "cols"): R.REDUCTION_MISMATCH}


MATMUL = """
graph g(%x: f32[4,8], %w: f32[8,16], %b: f32[16]) -> (%y) {
  %t = MatMul(%x, %w) @mm
  %a = Add(%t, %b) @bias
  %y = Relu(%a) @relu
}
"""


def test_matmul_bias_relu_epilogue():
    model, result = clusters_of(MATMUL)
    assert shapes(result) == [("matmul+epilogue", ["mm", "bias", "relu"])]
    assert_runs_the_same(model, result)


def test_no_prologue_into_a_contraction_and_one_contraction_per_group():
    text = """
    graph g(%x: f32[4,8], %w: f32[8,8]) -> (%y) {
      %r = Relu(%x) @relu
      %t = MatMul(%r, %w) @mm1
      %u = MatMul(%t, %w) @mm2
      %y = Sigmoid(%u) @sig
    }
    """
    _, result = clusters_of(text)
    assert shapes(result) == [("matmul+epilogue", ["mm2", "sig"])]
    assert codes(result) == {
        ("relu", "mm1"): R.CONTRACTION_PROLOGUE,
        ("mm1", "mm2"): R.TWO_CONTRACTIONS,
    }


def test_side_input_computed_elementwise_is_not_pulled_into_an_epilogue():
    text = """
    graph g(%x: f32[4,8], %w: f32[8,8], %z: f32[4,8]) -> (%y) {
      %t = MatMul(%x, %w) @mm
      %e = Exp(%z) @exp
      %y = Add(%t, %e) @add
    }
    """
    _, result = clusters_of(text)
    assert shapes(result) == [("matmul+epilogue", ["mm", "add"])]
    assert codes(result) == {("exp", "add"): R.CONTRACTION_PROLOGUE}


def test_diamond_through_an_opaque_op_is_rejected_as_not_convex():
    text = """
    graph g(%x: f32[4,8]) -> (%y) {
      init %axis: i64[] = [1]
      %a = Relu(%x) @relu
      %c = CumSum(%a, %axis) @cumsum
      %y = Add(%a, %c) @add
    }
    """
    model, result = clusters_of(text)
    assert result.clusters == []
    assert codes(result) == {
        ("relu", "cumsum"): R.OPAQUE_OP,
        ("relu", "add"): R.NOT_CONVEX,
        ("cumsum", "add"): R.OPAQUE_OP,
    }
    # Fusing the two anyway would indeed create a cycle.
    g = model.graph
    assert not is_convex([n for n in g.nodes if n.name in ("relu", "add")])


def test_unknown_custom_op_splits_a_chain():
    text = """
    model opset {"": 20, "custom": 1}
    graph g(%x: f32[4,8]) -> (%y) {
      %a = Add(%x, %x) @add
      %b = Exp(%a) @exp
      %c = custom::Foo(%b) @foo
      %d = Mul(%c, %c) @mul
      %y = Tanh(%d) @tanh
    }
    """
    _, result = clusters_of(text)
    assert shapes(result) == [("elementwise", ["add", "exp"]), ("elementwise", ["mul", "tanh"])]
    assert codes(result) == {("exp", "foo"): R.UNKNOWN_OP, ("foo", "mul"): R.UNKNOWN_OP}


def adds_chain(n_inputs: int, scalar: bool = False) -> str:
    lines = ["graph g(" + ", ".join(f"%x{i}: f32[4]" for i in range(n_inputs)) + ") -> (%y) {"]
    prev = "%x0"
    for i in range(1, n_inputs):
        rhs = f"%c{i}" if scalar else f"%x{i}"
        if scalar:
            lines.append(f"  init %c{i}: f32[] = [{i}.0]")
        out = "%y" if i == n_inputs - 1 else f"%s{i}"
        lines.append(f"  {out} = Add({prev}, {rhs}) @add{i}")
        prev = out
    return "\n".join(lines) + "\n}\n"


def test_nine_inputs_exceed_max_inputs():
    _, result = clusters_of(adds_chain(9))
    ((kind, names),) = shapes(result)
    assert names == [f"add{i}" for i in range(1, 8)]  # 8 inputs
    assert result.clusters[0].num_inputs == 8
    assert codes(result) == {("add7", "add8"): R.MAX_INPUTS}
    _, relaxed = clusters_of(adds_chain(9), max_inputs=9)
    assert [len(c.nodes) for c in relaxed.clusters] == [8]


def test_scalar_constants_do_not_count_as_inputs():
    _, result = clusters_of(
        adds_chain(12, scalar=True).replace(
            "graph g(%x0: f32[4], %x1: f32[4], %x2: f32[4], %x3: f32[4], %x4: f32[4], %x5: f32[4], "
            "%x6: f32[4], %x7: f32[4], %x8: f32[4], %x9: f32[4], %x10: f32[4], %x11: f32[4])",
            "graph g(%x0: f32[4])",
        )
    )
    assert [len(c.nodes) for c in result.clusters] == [11]
    assert result.clusters[0].num_inputs == 1


def test_max_nodes_limit():
    body = "\n".join(f"  %r{i} = Relu(%r{i - 1}) @r{i}" for i in range(1, 11))
    text = "graph g(%r0: f32[4]) -> (%r10) {\n" + body + "\n}\n"
    model, result = clusters_of(text, max_nodes=4)
    assert [len(c.nodes) for c in result.clusters] == [4, 4, 2]
    assert codes(result) == {("r4", "r5"): R.MAX_NODES, ("r8", "r9"): R.MAX_NODES}
    assert_runs_the_same(model, result)


def test_shared_producer_stays_materialized():
    text = """
    graph g(%x: f32[4,8], %w: f32[8,8]) -> (%y, %z) {
      %a = Sigmoid(%x) @sig
      %y = Mul(%a, %x) @mul
      %t = MatMul(%a, %w) @mm
      %z = Relu(%t) @relu
    }
    """
    model, result = clusters_of(text)
    assert shapes(result) == [
        ("elementwise", ["sig", "mul"]),
        ("matmul+epilogue", ["mm", "relu"]),
    ]
    first = result.clusters[0]
    assert [v.name for v in first.outputs] == ["a", "y"]  # a is read by the MatMul too
    assert result.cluster_of(model.graph.nodes[0]) is first
    assert assert_runs_the_same(model, result) == [
        "Cluster_elementwise",
        "Cluster_matmul_epilogue",
    ]


def test_clusters_of_a_synthetic_transformer_run_the_same():
    from graph_autofusion.runtime.torch_runtime import infer_shapes
    from graph_autofusion.testing.synthetic import synthetic_feeds, synthetic_transformer

    # One block: with more, synthetic_transformer's second block applies a rank-3 Transpose
    # to a rank-4 value and the reference interpreter fails before any clustering.
    model = synthetic_transformer(26)
    infer_shapes(model)
    result = cluster(model.graph)
    kinds = result.kinds()
    assert kinds["matmul+epilogue"] == 3  # scores+scale+mask, FFN1+bias+GELU, FFN2+bias+residual
    # the first LayerNorm (two ReduceMeans) is one cluster
    ln = result.cluster_of(model.graph.nodes[0])
    assert ln is not None and [n.op_type for n in ln.nodes].count("ReduceMean") == 2
    for c in result.clusters:
        assert is_convex(c.nodes) and len(c.nodes) <= 64 and c.num_inputs <= 8
    assert_runs_the_same(model, result, synthetic_feeds(model))


def check_limits(result: ClusterResult, max_nodes: int = 64, max_inputs: int = 8) -> None:
    seen = set()
    for c in result.clusters:
        assert len(c.nodes) >= 2
        assert len(c.nodes) <= max_nodes and c.num_inputs <= max_inputs
        assert is_convex(c.nodes), c.kind
        assert not seen & set(c.nodes)
        seen |= set(c.nodes)


def test_scale_on_a_large_synthetic_graph():
    from graph_autofusion.testing.synthetic import NODES_PER_BLOCK, synthetic_transformer

    model = synthetic_transformer(5000)
    result = cluster(model.graph)
    blocks = 5000 // NODES_PER_BLOCK
    assert len(result.clusters) >= 3 * blocks
    assert sum(len(c.nodes) for c in result.clusters) > len(model.graph) // 2
    check_limits(result)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "count"),
    # llama: 72 since its rotary halves (a Slice taking half of a group's loop) stay apart
    [("bert", 162), ("gpt2", 126), ("llama", 72), ("resnet50", 50), ("lstm", 4)],
)
def test_zoo_models(model, count):
    from graph_autofusion.testing.rules import zoo_model

    result = cluster(zoo_model(model, "dynamo").graph)
    assert len(result.clusters) == count
    check_limits(result)
    if model == "resnet50":
        assert result.kinds()["conv+epilogue"] == 49
    if model in ("bert", "llama"):
        assert result.kinds()["matmul+epilogue"] >= 12


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lstm", "llama"])
def test_clustered_zoo_model_runs_the_same(name):
    from graph_autofusion.frontend.onnx_frontend import load_onnx
    from graph_autofusion.testing import example_feeds, export_onnx

    model = load_onnx(export_onnx(name, "dynamo"))  # a private copy: it gets rewritten
    result = cluster(model.graph)
    feeds = example_feeds(name) if name == "llama" else None
    ops = assert_runs_the_same(model, result, feeds)
    assert sum(op.startswith("Cluster_") for op in ops) == len(result.clusters) > 0


def random_dag(seed: int, n: int = 60) -> str:
    """A random DAG of [4,4] values over every fusion kind (CumSum is opaque)."""
    rng = np.random.default_rng(seed)
    ops = ["Relu", "Tanh", "Add", "Mul", "Sub", "MatMul", "CumSum", "Transpose", "Softmax"]
    lines = ["graph g(%x0: f32[4,4], %x1: f32[4,4], %x2: f32[4,4]) -> ({outs}) {"]
    lines.append("  init %axis: i64[] = [1]")
    vals = ["%x0", "%x1", "%x2"]
    for i in range(n):
        op = ops[rng.integers(len(ops))]
        a, b = (vals[j] for j in rng.integers(max(0, len(vals) - 8), len(vals), 2))
        args = {
            "CumSum": f"CumSum({a}, %axis)",
            "Transpose": f"Transpose<perm=[1, 0]>({a})",
            "Softmax": f"Softmax<axis=-1>({a})",
        }.get(op, f"{op}({a}, {b})" if op in ("Add", "Mul", "Sub", "MatMul") else f"{op}({a})")
        lines.append(f"  %v{i}: f32[4,4] = {args} @n{i}")
        vals.append(f"%v{i}")
    return "\n".join(lines).replace("{outs}", ", ".join(vals[-3:])) + "\n}\n"


@pytest.mark.parametrize("seed", range(8))
def test_random_dags_cluster_legally_and_run_the_same(seed):
    model, result = clusters_of(random_dag(seed), max_nodes=6, max_inputs=3)
    check_limits(result, max_nodes=6, max_inputs=3)
    assert result.clusters
    codes_seen = {r.code for r in result.rejections}
    assert R.OPAQUE_OP in codes_seen
    # rewriting all clusters together must leave an acyclic graph with the same numbers
    assert_runs_the_same(model, result)


def test_cycle_through_a_group_merged_earlier_is_found():
    """After relu+where merge, greater/cast/cumsum precede the merged group in the renumbered
    order; without renumbering, the search from greater+cast would stop at cumsum and miss the
    path greater -> cast -> cumsum -> where."""
    text = """
    graph g(%x: f32[4,4]) -> (%y) {
      init %zero: f32[] = [0.0]
      init %axis: i64[] = [1]
      %a = Relu(%x) @relu
      %p = Greater(%x, %zero) @greater
      %c = Cast<to=1>(%p) @cast
      %r = CumSum(%c, %axis) @cumsum
      %y = Where(%p, %a, %r) @where
    }
    """
    model, result = clusters_of(text)
    assert shapes(result) == [
        ("elementwise", ["relu", "where"]),
        ("elementwise", ["greater", "cast"]),
    ]
    assert codes(result)[("greater", "where")] == R.NOT_CONVEX
    assert_runs_the_same(model, result)
