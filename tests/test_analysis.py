"""Benefit analysis (F14) and plan selection (F10) over rule matches and clusters."""

from __future__ import annotations

import json
import os

import pytest

from graph_autofusion.cli_analyze import main as cli_main
from graph_autofusion.cost.hardware import (
    HardwareError,
    HardwareProfile,
    load_profile,
    save_profile,
)
from graph_autofusion.cost.model import Verdict
from graph_autofusion.ir.text import parse_model, print_model
from graph_autofusion.patterns.clustering import Cluster
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import FusionRule, RuleMatch, RuleSet
from graph_autofusion.planner.analysis import (
    CHOSEN,
    SAME_AS_RULE,
    analyze_model,
    bind_model,
    cost_candidates,
    default_feeds,
    estimate_benefit,
    find_candidates,
)
from graph_autofusion.planner.plan import STRATEGIES, plan


def profile(
    name: str,
    *,
    kind: str = "npu",
    bw_gbs: float = 100.0,
    gflops: float = 1000.0,
    overhead_us: float = 5.0,
    local_kb: float = 256.0,
) -> HardwareProfile:
    """A hand-made profile without caches (so no cache-bandwidth bonus)."""
    return HardwareProfile(
        name=name,
        description="test profile",
        kind=kind,
        memory_bandwidth_gbs=bw_gbs,
        peak_gflops={"f32": gflops},
        launch_overhead_us=overhead_us,
        local_memory_kb=local_kb,
        cores=1,
        vector_width_bytes=64,
    )


CPU = profile("cpu", kind="cpu", bw_gbs=20.0, gflops=200.0, overhead_us=0.5, local_kb=1024)
NPU = profile("npu", bw_gbs=1600.0, gflops=300_000.0, overhead_us=20.0, local_kb=1024)
NO_RULES = RuleSet(())

# MatMul + bias (rule matmul_bias and a matmul+epilogue cluster claim the same two nodes),
# then an elementwise tail Relu -> Mul that only clustering finds.
MATMUL_BIAS = """
graph g(%x: f32[256,1024], %s: f32[256,1024]) -> (%y, %z) {
  init %w: f32[1024,1024] = zeros
  init %b: f32[1024] = zeros
  %t: f32[256,1024] = MatMul(%x, %w) @mm
  %y: f32[256,1024] = Add(%t, %b) @bias
  %r: f32[256,1024] = Relu(%s) @relu
  %z: f32[256,1024] = Mul(%r, %s) @mul
}
"""

SOFTMAX_ROW = """
graph g(%x: f32[64,8192]) -> (%y) {
  init %scale: f32[] = [0.125]
  %s: f32[64,8192] = Mul(%x, %scale) @scale
  %y: f32[64,8192] = Softmax<axis=-1>(%s) @softmax
}
"""


# a residual Add and a LayerNormalization: skip_layernorm's match, priced by its native rate
SKIP_LN = """
graph g(%x: f32[128,768], %r: f32[128,768]) -> (%y) {
  init %g: f32[768] = zeros
  init %b: f32[768] = zeros
  %s: f32[128,768] = Add(%x, %r) @add
  %y: f32[128,768] = LayerNormalization<axis=-1>(%s, %g, %b) @ln
}
"""


def by_source(report, source):
    return [c for c in report.candidates if c.source == source]


# ----------------------------------------------------------------------------- hand graphs
def test_known_verdicts_and_totals_on_a_hand_graph():
    m = parse_model(MATMUL_BIAS)
    text_before = print_model(m)
    rep = analyze_model(m, builtin_rules().preset("transformer"), NPU, strategy="dp")
    assert print_model(m) == text_before  # model never mutated
    (rule,) = by_source(rep, "rule:matmul_bias")
    (mm_cluster,) = by_source(rep, "cluster:matmul+epilogue")
    (tail,) = by_source(rep, "cluster:elementwise")
    assert [c.key for c in rep.candidates] == [rule.key, mm_cluster.key, tail.key]
    assert rule.ops == ["MatMul", "Add"] and tail.ops == ["Relu", "Mul"]
    assert rule.fused_op == "MatMulBias" and tail.fused_op == "Cluster_elementwise"
    for c in rep.candidates:
        assert c.verdict == Verdict.FUSE, c.message
    # the cluster has exactly the rule's nodes: the rule is preferred, the cluster says why
    assert rule.chosen and rule.code == CHOSEN
    assert not mm_cluster.chosen and mm_cluster.code == SAME_AS_RULE
    assert rule.key in mm_cluster.message
    assert tail.chosen
    assert rule.cost.hbm_accesses_before == 6 and rule.cost.hbm_accesses_after == 4
    assert tail.cost.hbm_accesses_before == 5 and tail.cost.hbm_accesses_after == 2  # s once
    # totals: sums over the whole model, minus the chosen savings
    saved = rule.saving_s + tail.saving_s
    assert rep.time_after_s == pytest.approx(rep.time_before_s - saved)
    assert rep.hbm_accesses_before == 11 and rep.hbm_accesses_after == 6
    assert rep.hbm_access_reduction == pytest.approx(5 / 11)
    assert rep.performance_improvement == pytest.approx(rep.time_before_s / rep.time_after_s - 1)
    assert rep.verdict_counts() == {
        "fuse": 3,
        "skip-low-benefit": 0,
        "skip-local-memory-overflow": 0,
        "maybe": 0,
    }
    benefit = estimate_benefit(rep)
    assert benefit["fusions"] == 2
    assert benefit["performance_improvement"] == rep.performance_improvement > 0
    assert benefit["hbm_access_reduction"] == rep.hbm_access_reduction
    assert benefit["time_before_s"] > benefit["time_after_s"]
    # chosen payloads in graph order, ready for the fuse step
    chosen = rep.chosen_matches()
    assert isinstance(chosen[0], RuleMatch) and chosen[0].rule.name == "matmul_bias"
    assert isinstance(chosen[1], Cluster) and [n.name for n in chosen[1].nodes] == ["relu", "mul"]


def test_npu_fuses_a_small_epilogue_the_cpu_profile_skips():
    m = parse_model(MATMUL_BIAS)
    rules = builtin_rules().preset("transformer")
    on_cpu = analyze_model(m, rules, CPU)
    on_npu = analyze_model(m, rules, NPU)
    (cpu_rule,) = by_source(on_cpu, "rule:matmul_bias")
    (npu_rule,) = by_source(on_npu, "rule:matmul_bias")
    assert cpu_rule.verdict == Verdict.SKIP_LOW_BENEFIT and not cpu_rule.chosen
    assert cpu_rule.code == "skip-low-benefit" and "below the 20% threshold" in cpu_rule.message
    assert npu_rule.verdict == Verdict.FUSE and npu_rule.chosen
    assert npu_rule.cost.saving > 0.2 > cpu_rule.cost.saving
    assert on_npu.performance_improvement > on_cpu.performance_improvement


def test_local_memory_overflow_on_one_profile_fuse_on_another():
    m = parse_model(SOFTMAX_ROW)
    ample = analyze_model(m, NO_RULES, profile("ample", local_kb=1024))
    small = analyze_model(m, NO_RULES, profile("small", local_kb=16))
    (fits,) = ample.candidates
    (over,) = small.candidates
    assert fits.source == over.source == "cluster:prologue+reduction"
    assert fits.chosen and fits.verdict == Verdict.FUSE
    assert fits.cost.local_memory_bytes <= fits.cost.local_memory_capacity == 1024 * 1024
    assert not over.chosen and over.code == "skip-local-memory-overflow"
    assert "16.0 KiB" in over.message
    assert small.time_after_s == small.time_before_s and small.performance_improvement == 0
    assert ample.to_dict()["candidates"][0]["local_memory_capacity"] == 1024 * 1024


def test_rule_benefit_threshold_overrides_the_global_one():
    strict = FusionRule(name="mm_add_strict", op1="MatMul", op2="Add", priority=999,
                        benefit_threshold=0.95)  # fmt: skip
    m = parse_model(MATMUL_BIAS)
    rep = analyze_model(m, RuleSet((strict,)), NPU)
    (rule,) = by_source(rep, "rule:mm_add_strict")
    (cl,) = by_source(rep, "cluster:matmul+epilogue")
    assert rule.cost.benefit_threshold == 0.95 and cl.cost.benefit_threshold == 0.2
    assert rule.code == "skip-low-benefit" and not rule.chosen
    assert cl.code == SAME_AS_RULE and not cl.chosen  # the rule's refusal is not bypassed
    loose = analyze_model(m, RuleSet((strict,)), NPU, benefit_threshold=0.99)
    assert not any(c.chosen for c in loose.candidates)


def test_input_shapes_and_generated_feeds_bind_symbols_without_mutation():
    m = parse_model(
        """
        graph g(%x: f32[B,S,64], %ids: i64[B,S]) -> (%z, %e) {
          init %table: f32[3,64] = randn(0)
          %y: f32[B,S,64] = Relu(%x) @relu
          %z: f32[B,S,64] = Exp(%y) @exp
          %e: f32[B,S,64] = Gather(%table, %ids) @emb
        }
        """
    )
    feeds = default_feeds(m)
    assert feeds["x"].shape == (1, 16, 64) and feeds["ids"].max() < 3  # 3-row table
    assert feeds["ids"].shape == (1, 16)
    # a symbol keeps the value of its first appearance (S is first seen in position 1)
    m2 = parse_model("graph g(%a: f32[B,S], %p: i64[S]) -> (%b) {\n %b = Relu(%a)\n}")
    assert default_feeds(m2)["p"].shape == (16,)
    rep = analyze_model(m, NO_RULES, NPU)
    assert rep.binding_method == "execute" and rep.symbols == {"B": 1, "S": 16}
    assert rep.unknown_nodes == 0 and rep.candidates[0].verdict != Verdict.MAYBE
    rep2 = analyze_model(m, NO_RULES, NPU, input_shapes={"x": (2, 128, 64)})
    assert rep2.symbols == {"B": 2, "S": 128} and rep2.binding_method == "symbols"
    assert rep2.candidates[0].cost.bytes_after == 2 * (2 * 128 * 64 * 4)
    assert m.graph.inputs[0].shape == ("B", "S", 64)


# ----------------------------------------------------------------------------- strategies
def _assert_overlap_free(report):
    seen: set = set()
    for c in report.candidates:
        if c.chosen:
            names = set(c.cost.nodes)
            assert not (names & seen), f"{c.key} overlaps"
            seen |= names


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_gives_an_overlap_free_plan(strategy):
    from graph_autofusion.testing.synthetic import synthetic_transformer

    m = synthetic_transformer(300)
    rep = analyze_model(m, builtin_rules(), load_profile("ascend910b"), strategy=strategy,
                        max_work=200_000)  # fmt: skip
    _assert_overlap_free(rep)
    assert rep.chosen and all(c.code for c in rep.candidates)
    assert {c.code for c in rep.candidates if not c.chosen} <= {
        "overlap",
        SAME_AS_RULE,
        "joint-cycle",
        "no-saving",
        *(v.value for v in Verdict),
    }
    positions = [c.position for c in rep.candidates]
    assert positions == sorted(positions)
    assert rep.strategy_used in ("greedy", "dp", "evolutionary")


def test_unknown_strategy_and_hardware_are_refused_profile_by_name_works():
    m = parse_model(SOFTMAX_ROW)
    with pytest.raises(ValueError, match="greedy"):
        analyze_model(m, NO_RULES, NPU, strategy="annealing")
    with pytest.raises(HardwareError, match="ascend910b"):
        analyze_model(m, NO_RULES, "tpu9000")
    assert analyze_model(m, NO_RULES, "ascend910b").profile == "ascend910b"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "resnet50"])
def test_dp_and_evolutionary_never_below_greedy_on_zoo_models(name):
    from graph_autofusion.testing import example_feeds
    from graph_autofusion.testing.rules import zoo_model

    m = zoo_model(name, "dynamo")
    before = print_model(m)
    binding = bind_model(m, feeds=example_feeds(name))
    assert binding.method == "execute"
    found = find_candidates(m.graph, builtin_rules())
    for hw in ("ascend910b", "x86_avx512"):
        pcs = cost_candidates(found, load_profile(hw), binding)
        assert any(c.legal for c in pcs)
        greedy = plan(pcs, "greedy").total_saving_s
        for strategy in ("dp", "evolutionary", "auto"):
            got = plan(pcs, strategy, max_work=400_000)
            assert got.total_saving_s >= greedy * (1 - 1e-9), (hw, strategy)
            claimed = [n for c in got.chosen for n in c.nodes]
            assert len(claimed) == len(set(claimed))
    assert print_model(m) == before


# ----------------------------------------------------------------------------- renderings
def test_text_json_and_html_renderings():
    m = parse_model(MATMUL_BIAS)
    m.graph.nodes[2].name = "<relu&x>"  # shown in the node list of its cluster
    rep = analyze_model(m, builtin_rules().preset("transformer"), NPU, model_name="<m & co>")
    text = rep.to_text()
    for needle in ("rule:matmul_bias", "MatMul+Add", "6 -> 4", "fuse", "CHOSEN", SAME_AS_RULE,
                   "performance_improvement", "hbm_access_reduction", "1024.0/1024.0"):  # fmt: skip
        assert needle in text, needle
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["profile"] == "npu" and len(data["candidates"]) == 3
    assert data["totals"]["chosen"] == 2
    assert data["candidates"][0]["hbm_accesses"] == [6, 4]
    assert set(data["totals"]["by_verdict"]) == {v.value for v in Verdict}
    page = rep.to_html()
    assert page.startswith("<!DOCTYPE html>") and 'id="cand-table"' in page
    assert page.count("<script") == 3  # the data, the vendored layout, the page's own script
    assert "&lt;m &amp; co&gt;" in page and "<m & co>" not in page
    assert "&lt;relu&amp;x&gt;" in page and "<relu&x>" not in page


# ----------------------------------------------------------------------------- command line
@pytest.fixture
def onnx_file(tmp_path):
    import onnx

    from graph_autofusion.frontend.onnx_export import to_onnx

    path = tmp_path / "mm.onnx"
    onnx.save(to_onnx(parse_model(MATMUL_BIAS)), str(path))
    return path


def test_cli_text_and_json(onnx_file, capsys):
    assert cli_main(["analyze", str(onnx_file), "--hardware", "ascend910b",
                     "--preset", "transformer"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "on ascend910b (npu)" in out and "rule:matmul_bias" in out and "estimated time" in out
    assert cli_main(["analyze", str(onnx_file), "--hardware", "ascend910b", "--json",
                     "--strategy", "greedy", "--benefit-threshold", "0.9"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["strategy_used"] == "greedy" and data["benefit_threshold"] == 0.9


def test_cli_hardware_from_a_profile_file(onnx_file, tmp_path, capsys):
    path = tmp_path / "mynpu.yaml"
    save_profile(NPU, path)
    assert cli_main(["analyze", str(onnx_file), "--hardware", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "npu"


def test_cli_unknown_hardware_lists_the_known_ones(onnx_file, capsys):
    assert cli_main(["analyze", str(onnx_file), "--hardware", "tpu9000"]) == 2
    err = capsys.readouterr().err
    assert "unknown hardware 'tpu9000'" in err
    for name in ("ascend910b", "a100", "h200", "x86_avx512", "host"):
        assert name in err


def test_cli_html_is_written_atomically(onnx_file, tmp_path, capsys):
    dest = tmp_path / "out" / "report.html"
    assert cli_main(["analyze", str(onnx_file), "--hardware", "ascend910b", "--brief",
                     "--html", str(dest)]) == 0  # fmt: skip
    page = dest.read_text(encoding="utf-8")
    assert "<table>" in page and "rule:matmul_bias" in page and page.rstrip().endswith("</html>")
    assert os.listdir(dest.parent) == ["report.html"]  # no temp file left behind
    assert "HTML report written" in capsys.readouterr().err


def test_analysis_prices_a_rule_by_its_native_operator():
    """Calibrated native-kernel rates decide: a rule whose runtime operator measured slow is
    skipped as estimated slower; the same group is fused when its native kernel is fast."""
    import dataclasses

    m = parse_model(SKIP_LN)
    rules = RuleSet((builtin_rules().get("skip_layernorm"),))
    assert rules.get("skip_layernorm").native_op == "SkipLayerNormalization"
    base = profile("cpuish", local_kb=4096)
    rates = {"Add": 0.1, "LayerNormalization": 0.2}
    slow = dataclasses.replace(
        base, extra={"op_ns_per_element": {**rates, "SkipLayerNormalization": 2.0}}
    )
    fast = dataclasses.replace(
        base, extra={"op_ns_per_element": {**rates, "SkipLayerNormalization": 0.05}}
    )
    (on_slow,) = by_source(analyze_model(m, rules, slow, clustering=False), "rule:skip_layernorm")
    (on_fast,) = by_source(analyze_model(m, rules, fast, clustering=False), "rule:skip_layernorm")
    assert not on_slow.chosen and on_slow.code == "skip-low-benefit"
    assert "estimated slower" in on_slow.message and on_slow.cost.saving < 0
    assert on_fast.chosen and on_fast.cost.saving > 0.2


def test_the_evolutionary_plan_does_not_depend_on_the_clock(monkeypatch):
    """The search's budget counts work, not seconds: under a clock that jumps an hour on every
    read (a loaded machine) it runs every generation and gives the same plan."""
    import graph_autofusion.planner.plan as planmod
    from graph_autofusion.testing.synthetic import synthetic_transformer

    m = synthetic_transformer(300)
    args = dict(strategy="evolutionary", seed=3, max_work=300_000)
    want = analyze_model(m, builtin_rules(), load_profile("ascend910b"), **args)
    decodes = []
    real_decode = planmod._decode
    monkeypatch.setattr(planmod, "_decode", lambda order: decodes.append(1) or real_decode(order))
    ticks = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(planmod.time, "perf_counter", lambda: float(next(ticks)))
    got = analyze_model(m, builtin_rules(), load_profile("ascend910b"), **args)
    assert [c.key for c in got.chosen] == [c.key for c in want.chosen]
    population = 24
    assert len(decodes) > 2 * population  # generations ran (a wall-clock stop would run none)


def test_a_runtime_operator_below_the_threshold_is_a_close_call_safe_mode_measures():
    """A native fusion estimated to save a little (attention's own ratio is small: its matrix
    products dominate) is ``maybe`` on the onnxruntime target: planned when safe mode times
    it (``accept_maybe``), not when nothing would measure it; a generic target keeps the plain
    refusal, and a fusion estimated slower stays refused."""
    import dataclasses

    m = parse_model(SKIP_LN)
    rules = RuleSet((builtin_rules().get("skip_layernorm"),))
    rates = {"Add": 0.1, "LayerNormalization": 0.2, "SkipLayerNormalization": 0.33}
    hw = dataclasses.replace(profile("cpuish", local_kb=4096), extra={"op_ns_per_element": rates})

    def cand(**kw):
        (c,) = by_source(analyze_model(m, rules, hw, clustering=False, **kw), "rule:skip_layernorm")
        return c

    plain = cand()
    assert 0 < plain.cost.saving < 0.2 and plain.code == "skip-low-benefit", plain.message
    close = cand(native_target=True)
    assert not close.chosen and close.code == "maybe" and "close call" in close.message
    assert cand(native_target=True, accept_maybe=True).chosen
    slow = dataclasses.replace(
        hw, extra={"op_ns_per_element": {**rates, "SkipLayerNormalization": 2.0}}
    )
    (slower,) = by_source(
        analyze_model(m, rules, slow, clustering=False, native_target=True, accept_maybe=True),
        "rule:skip_layernorm",
    )
    assert not slower.chosen and slower.code == "skip-low-benefit"


def test_renderers_come_from_the_report_layer():
    """AnalysisReport.to_text/to_html draw through the renderers the report layer registers
    (planner never imports report); an unknown renderer is a clear error."""
    from graph_autofusion.errors import GraphAutoFusionError
    from graph_autofusion.renderers import render
    from graph_autofusion.report.analysis_report import render_text
    from graph_autofusion.report.html_report import analysis_page

    report = analyze_model(parse_model(MATMUL_BIAS), builtin_rules().preset("transformer"), NPU)
    assert report.to_text() == render_text(report) == render("analysis-text", report)
    assert report.to_text(reasons=False) == render_text(report, reasons=False)
    assert render("analysis-html", report) == analysis_page(report)
    with pytest.raises(GraphAutoFusionError, match="no renderer 'nope'"):
        render("nope", report)
