"""The graph fuzzer (issue 15): generated graphs through the whole pipeline, every invariant.

Each run checks 250 seeds: a fixed window (``FIXED``: the same 150 graphs every run, whose
coverage of operator kinds, dtypes, shapes and patterns ``test_corpus_covers_...`` asserts) and a
rotating one of ``ROTATING`` seeds whose start changes every day (``GAF_FUZZ_START=<n>`` runs
a given window again; the start is printed). Every seed the fuzzer ever failed on is listed in
``tests/fuzz_regressions.txt`` and always runs (a line ``<seed> xfail <reason>`` keeps a seed
whose bug is not fixed yet as a strict xfail). The corpus of 10,000 graphs runs in
``benchmarks/fuzz.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings

from graph_autofusion.frontend.onnx_frontend import load_onnx
from graph_autofusion.ir.core import Graph, Node, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.testing.fuzz import graphs, random_graph
from graph_autofusion.testing.fuzz_check import (
    check_graph,
    compare,
    plan_problems,
    run_graph,
    tolerance,
)

FIXED = range(0, 150)
ROTATING = 100
REGRESSIONS = Path(__file__).with_name("fuzz_regressions.txt")


def _rotating_start() -> int:
    env = os.environ.get("GAF_FUZZ_START")
    return int(env) if env else 200 + (int(time.time() // 86400) % 10_000) * ROTATING


def _regressions() -> list:
    params = []
    for line in REGRESSIONS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        seed, _, rest = line.partition(" ")
        marks = []
        if rest.startswith("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=rest[5:].strip() or "open bug"))
        params.append(pytest.param(int(seed), marks=marks, id=f"seed{seed}"))
    return params


def _check_window(seeds: range, capsys: pytest.CaptureFixture[str], what: str) -> None:
    with capsys.disabled():
        print(f"\nfuzz {what}: seeds {seeds.start}..{seeds.stop - 1}", flush=True)
    # kernels compiled (and the custom-operator library built) on every 50th seed, safe mode
    # on every 3rd: the 250 seeds stay near 80 s of one core
    failures = {s: check_graph(s, compile_every=50, safe_every=3) for s in seeds}
    failures = {s: f for s, f in failures.items() if f}
    assert not failures, "\n".join(
        f"seed {s} ({random_graph(s).describe()}): {fs}" for s, fs in failures.items()
    )


def test_fixed_window(capsys: pytest.CaptureFixture[str]) -> None:
    _check_window(FIXED, capsys, "fixed window")


def test_rotating_window(capsys: pytest.CaptureFixture[str]) -> None:
    start = _rotating_start()
    _check_window(
        range(start, start + ROTATING), capsys, f"rotating window (GAF_FUZZ_START={start})"
    )


@pytest.mark.parametrize("seed", _regressions())
def test_regression(seed: int) -> None:
    assert check_graph(seed, compile_every=1, safe_every=1) == []


@settings(
    max_examples=8,
    deadline=None,
    database=None,
    derandomize=os.environ.get("GAF_FUZZ") != "1",  # GAF_FUZZ=1 draws new examples
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(graphs())
def test_hypothesis_graphs(g) -> None:
    failures = run_graph(graph=g, safe_every=1).failures
    assert not failures, [str(f) for f in failures]


# --------------------------------------------------------------------------- the generator
def test_generator_is_deterministic_and_valid() -> None:
    for seed in (0, 7, 123456):
        a, b = random_graph(seed), random_graph(seed)
        assert a.model.SerializeToString() == b.model.SerializeToString()
        assert all(np.array_equal(a.feeds[k], b.feeds[k]) for k in a.feeds)
        onnx.checker.check_model(a.model, full_check=True)
        assert 5 <= len(a.model.graph.node) <= 48
    assert random_graph(1).model.SerializeToString() != random_graph(2).model.SerializeToString()


def test_corpus_covers_kinds_dtypes_and_shapes() -> None:
    gs = [random_graph(s) for s in FIXED]  # what the fixed window covers
    ops = {op for g in gs for op in g.ops}
    assert {"Add", "Relu", "ReduceMean", "Transpose", "Reshape", "Concat", "Slice"} <= ops
    assert {"MatMul", "Gemm", "Conv", "Where", "If", "Gather", "Softmax"} <= ops
    assert {g.dtype for g in gs} == {"float32", "float16", "bfloat16", "int64"}
    assert any(g.symbolic for g in gs) and not all(g.symbolic for g in gs)
    assert any(len(g.model.graph.output) > 1 for g in gs)
    patterns = {p for g in gs for p in g.patterns}
    assert {"layernorm_decomposed", "gelu_erf", "softmax", "rmsnorm", "silu"} <= patterns
    # an output that internal nodes also read, and a constant read by several nodes
    assert any(_output_read_inside(g.model.graph) for g in gs)
    assert any(_shared_constant(g.model.graph) for g in gs)


def _output_read_inside(graph: onnx.GraphProto) -> bool:
    read = {i for n in graph.node for i in n.input}
    return any(o.name in read for o in graph.output)


def _shared_constant(graph: onnx.GraphProto) -> bool:
    inits = {t.name for t in graph.initializer}
    reads = [i for n in graph.node for i in n.input if i in inits]
    return len(reads) != len(set(reads))


def test_fusions_happen() -> None:
    """The corpus is useful only if the rules and clusters actually fire on it."""
    fused = {"ort": 0, "cpu": 0}
    for s in range(12):
        r = run_graph(s, safe_every=10**9)
        for k in fused:
            fused[k] += r.fused.get(k, 0)
    assert fused["ort"] >= 5 and fused["cpu"] >= 10, fused


# --------------------------------------------------------------------------- the checks
def _chain() -> tuple[Graph, list[Node]]:
    """x -> a -> b -> c and a -> c (a diamond): {a, c} is not convex."""
    g = Graph("t")
    x = Value("x", DType.FLOAT, (2,))
    g.add_input(x)
    a = g.add_node(Node("Relu", [x], name="a", outputs=[Value("va")]))
    b = g.add_node(Node("Neg", [a.outputs[0]], name="b", outputs=[Value("vb")]))
    c = g.add_node(Node("Add", [a.outputs[0], b.outputs[0]], name="c", outputs=[Value("vc")]))
    g.set_outputs([c.outputs[0]])
    return g, [a, b, c]


def test_plan_check_finds_non_convex_overlapping_and_cyclic_plans() -> None:
    g, (a, b, c) = _chain()
    assert plan_problems([[a, b, c]], g.nodes) == []
    assert any("not convex" in p for p in plan_problems([[a, c]], g.nodes))
    assert any("groups 0 and 1" in p for p in plan_problems([[a, b], [b, c]], g.nodes))
    # {a, c} and {b}: each group alone is fine for b, but together they form a cycle
    assert any("cycle" in p for p in plan_problems([[a, c], [b]], g.nodes))


def test_tolerance_scales_with_dtype_and_magnitude() -> None:
    assert tolerance("float16", 1.0) > tolerance("float32", 1.0)
    assert tolerance("bfloat16", 1.0) > tolerance("float16", 1.0)
    assert tolerance("float32", 100.0) == pytest.approx(100 * tolerance("float32", 1.0))
    want = {"y": np.array([1.0, 2.0], np.float32)}
    assert compare({"y": want["y"] + 1e-6}, want, "float32", 1.0) == ""
    assert "differ" in compare({"y": want["y"] + 1e-2}, want, "float32", 1.0)
    assert compare({"y": want["y"] + 1e-2}, want, "float16", 1.0) == ""
    assert "non-finite" in compare({"y": np.array([1.0, np.nan])}, want, "float32", 1.0)
    ints = {"y": np.array([1, 2])}
    assert "integers differ" in compare({"y": np.array([1, 3])}, ints, "int64", 1.0)


def test_runner_reports_a_wrong_fused_model() -> None:
    """The runner's checks on a "fused" model that differs: its first output negated."""
    from graph_autofusion.runtime.interpreter import run_model
    from graph_autofusion.testing.fuzz_check import GraphReport, _Ctx, _ort_run, _Run

    g = next(random_graph(s) for s in range(50) if random_graph(s).dtype == "float32")
    proto = onnx.ModelProto()
    proto.CopyFrom(g.model)
    name = proto.graph.output[0].name
    for n in proto.graph.node:
        n.output[:] = [o + "_inner" if o == name else o for o in n.output]
        n.input[:] = [i + "_inner" if i == name else i for i in n.input]
    proto.graph.node.append(onnx.helper.make_node("Neg", [name + "_inner"], [name]))
    model = load_onnx(g.model)
    ref = run_model(model, g.feeds)
    report = GraphReport(g.seed, g)
    ctx = _Ctx(_Run(report), model, g, ref, _ort_run(g.model, g.feeds), 1.0)
    ctx.check_fused("wrong", load_onnx(proto))
    assert {f.invariant for f in report.failures} == {"interpreter", "onnxruntime"}


# --------------------------------------------------------------------------- bugs it found
def _proto(nodes, inputs, outputs, inits=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


def _fuse(proto, feeds, safe_mode=False):
    from graph_autofusion.options import FuseOptions
    from graph_autofusion.pipeline import fuse_model
    from graph_autofusion.testing.fuzz_check import _profile, _rules

    opts = FuseOptions(safe_mode=safe_mode, check_speed=False)
    return fuse_model(load_onnx(proto), _rules(), _profile(), options=opts, feeds=feeds)


def test_layernorm_bias_folded_into_a_bfloat16_beta_stays_bfloat16() -> None:
    """layernorm_add folded the bias into a float32 beta of a bfloat16 LayerNormalization:
    onnx.checker refused the fused model (found by the fuzzer)."""
    from onnx import TensorProto as T
    from onnx import helper

    bf = [16256, 16256, 16256, 16256]  # 1.0 in bfloat16
    inits = [helper.make_tensor(n, T.BFLOAT16, [4], bf) for n in ("gamma", "beta", "bias")]
    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=T.BFLOAT16),
        helper.make_node("LayerNormalization", ["xb", "gamma", "beta"], ["ln"], axis=-1),
        helper.make_node("Add", ["ln", "bias"], ["y"]),
        helper.make_node("Cast", ["y"], ["out"], to=T.FLOAT),
    ]
    proto = _proto(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("out", T.FLOAT, [2, 4])],
        inits,
    )
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    res = _fuse(proto, feeds)
    assert [n.op_type for n in res.model.graph.nodes] == ["Cast", "LayerNormalization", "Cast"]
    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.runtime.interpreter import run_model

    onnx.checker.check_model(to_onnx(res.model), full_check=True)
    want = run_model(load_onnx(proto), feeds)["out"]
    np.testing.assert_allclose(run_model(res.model, feeds)["out"], want, atol=0.05)


def test_safe_mode_on_a_model_onnxruntime_cannot_run_is_a_clear_error() -> None:
    """Safe mode on a bfloat16 model (no onnxruntime CPU kernels) raised onnxruntime's own
    NotImplemented exception (found by the fuzzer)."""
    from onnx import TensorProto as T
    from onnx import helper

    from graph_autofusion.errors import UnsupportedOperatorError

    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], to=T.BFLOAT16),
        helper.make_node("Sigmoid", ["xb"], ["s"]),
        helper.make_node("Mul", ["xb", "s"], ["y"]),
        helper.make_node("Cast", ["y"], ["out"], to=T.FLOAT),
    ]
    proto = _proto(
        nodes,
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("out", T.FLOAT, [2, 4])],
    )
    feeds = {"x": np.ones((2, 4), np.float32)}
    with pytest.raises(UnsupportedOperatorError, match="safe_mode=False"):
        _fuse(proto, feeds, safe_mode=True)


def test_gelu_tanh_of_a_scalar_is_not_lowered_to_fastgelu() -> None:
    """onnxruntime's FastGelu rejects a 0-d input: the fused model did not run (found by the
    fuzzer); the scalar GELU stays unfused, a tensor one still becomes FastGelu."""
    from onnx import TensorProto as T
    from onnx import helper

    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.testing.fuzz_check import _ort_run

    def scalar(name, v):
        return helper.make_tensor(name, T.FLOAT, [], [v])

    inits = [scalar("three", 3.0), scalar("k", 0.044715), scalar("c", 0.7978845834732056)]
    inits += [scalar("one", 1.0), scalar("half", 0.5)]
    nodes = []
    for x in ("s", "t"):
        nodes += [
            helper.make_node("Pow", [x, "three"], [f"{x}3"]),
            helper.make_node("Mul", [f"{x}3", "k"], [f"{x}m"]),
            helper.make_node("Add", [x, f"{x}m"], [f"{x}a"]),
            helper.make_node("Mul", [f"{x}a", "c"], [f"{x}c"]),
            helper.make_node("Tanh", [f"{x}c"], [f"{x}t"]),
            helper.make_node("Add", [f"{x}t", "one"], [f"{x}p"]),
            helper.make_node("Mul", [x, f"{x}p"], [f"{x}x"]),
            helper.make_node("Mul", [f"{x}x", "half"], [f"{x}_out"]),
        ]
    info = helper.make_tensor_value_info
    proto = _proto(
        nodes,
        [info("s", T.FLOAT, []), info("t", T.FLOAT, [3])],
        [info("s_out", T.FLOAT, []), info("t_out", T.FLOAT, [3])],
        inits,
    )
    feeds = {"s": np.array(0.7, np.float32), "t": np.array([0.1, -1.0, 2.0], np.float32)}
    res = _fuse(proto, feeds)
    assert [n.op_type for n in res.model.graph.nodes].count("FastGelu") == 1
    got, want = _ort_run(to_onnx(res.model), feeds), _ort_run(proto, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_clone_keeps_the_values_a_subgraph_reads() -> None:
    """clone_model dropped an If's captures (outer values its branches read): every later
    stage saw those values as dead (found by the fuzzer, seed 65)."""
    from graph_autofusion.ir.verify import verify_problems
    from graph_autofusion.pipeline import clone_model

    g = random_graph(65)
    model = load_onnx(g.model)
    (node,) = [n for n in model.graph.nodes if n.op_type == "If"]
    copy = clone_model(model)
    (twin,) = [n for n in copy.graph.nodes if n.op_type == "If"]
    assert [v.name for v in twin.captures] == [v.name for v in node.captures] != []
    assert twin.captures[0] is not node.captures[0]  # the copy's own value
    assert verify_problems(copy.graph) == []
