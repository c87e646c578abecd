"""Fusion controls (F17): progressive fusion, size switches, mixed-precision constraints and
the debug float check, through ``GraphAutoFusion`` on real onnxruntime sessions (and the cpu
target's compiled kernels for the precision constraint)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion import GraphAutoFusion
from graph_autofusion.cli import main
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.rules import FusionRule
from graph_autofusion.planner.controls import ControlError, parse_size_switch
from graph_autofusion.testing import ort_outputs
from tests.test_fuse_pipeline import WRONG  # exp(-u) rewritten as relu(u): deliberately wrong

PROFILE = "x86_avx2"  # fixed: the fusions here save far more than the threshold on any profile

GELU_AND_NEG_EXP = """
model opset {"": 18}
graph g(%x: f32[2,SEQ,64], %u: f32[4,64]) -> (%h, %z) {
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %s = Div(%x, %c) @div
  %e = Erf(%s) @erf
  %a1 = Add(%e, %one) @add1
  %mg = Mul(%x, %a1) @mul
  %h = Mul(%mg, %half) @gelu_out
  %n = Neg(%u) @neg
  %z = Exp(%n) @exp
}
"""


def _model(seq: int = 16):
    return parse_model(GELU_AND_NEG_EXP.replace("SEQ", str(seq)))


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph.nodes]


# ----------------------------------------------------------------------------- progressive


def test_progressive_keeps_stage_one_and_rolls_back_the_wrong_stage_two():
    model = _model()
    gaf = GraphAutoFusion(model, preset="transformer", rules=[WRONG], hardware=PROFILE)
    prog = gaf.fuse_progressive([["gelu_erf"], ["neg_exp_wrong"]], check_speed=False)
    s1, s2 = prog.stages
    assert s1.passed and s1.fused and s1.rules == ["gelu_erf"]
    assert not s2.passed and prog.stopped_at == 2
    assert [f["rule"] for f in s2.failures] == ["neg_exp_wrong"]
    assert s2.failures[0]["code"] not in ("slower", "")
    kept = prog.result
    assert kept is gaf.result
    assert [low.rule for low in kept.lowered] == ["gelu_erf"]  # stage 1's fusion kept
    assert "Gelu" in _ops(kept.model) and "Neg" in _ops(kept.model)  # stage 2 not applied
    feeds = kept.feeds
    want, got = ort_outputs(to_onnx(model), feeds), ort_outputs(to_onnx(kept.model), feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
    text = prog.to_text()
    assert "stage 2 [neg_exp_wrong]: FAILED, rolled back" in text
    assert "stopped at stage 2" in text


def test_progressive_stops_before_a_later_stage_runs():
    gaf = GraphAutoFusion(_model(), preset="transformer", rules=[WRONG], hardware=PROFILE)
    prog = gaf.fuse_progressive(["neg_exp_wrong", "gelu_erf"], check_speed=False)
    assert len(prog.stages) == 1 and prog.stopped_at == 1
    assert prog.result is gaf.result and not gaf.result.lowered  # stage 1 failed: unfused
    assert _ops(gaf.result.model) == _ops(_model())


def test_progressive_every_stage_passing():
    gaf = GraphAutoFusion(_model(), preset="transformer", hardware=PROFILE)
    prog = gaf.fuse_progressive(["gelu_erf"], check_speed=False)
    assert prog.stopped_at is None and prog.stages[0].passed
    assert "every stage passed" in prog.to_text()


def test_progressive_unknown_rule_names_the_known_ones():
    gaf = GraphAutoFusion(_model(), preset="transformer", hardware=PROFILE)
    with pytest.raises(ControlError, match=r"stage 2 names rule 'nope'.*gelu_erf"):
        gaf.fuse_progressive(["gelu_erf", "nope"])


# ----------------------------------------------------------------------------- size switches


@pytest.mark.parametrize("seq,fused", [(4, False), (8, True), (32, True)])
def test_size_switch_turns_the_rule_off_below_its_threshold(seq, fused):
    gaf = GraphAutoFusion(
        _model(seq),
        preset="transformer",
        hardware=PROFILE,
        size_switches=["gelu_erf:x[1]>=8"],
    )
    gaf.fuse(check_speed=False)
    assert ("Gelu" in _ops(gaf.result.model)) is fused
    (rec,) = gaf.result.controls["size_switches"]
    assert rec["on"] is fused and rec["size"] == seq
    assert rec["code"] == ("" if fused else "size-switch-off")
    report = gaf.analyze()
    assert any(c.key.startswith("gelu_erf@") for c in report.candidates) is fused


def test_size_switch_errors_name_the_problem():
    with pytest.raises(ControlError, match="expected RULE:INPUT"):
        parse_size_switch("gelu_erf x>8")
    gaf = GraphAutoFusion(_model(), preset="transformer", size_switches=["gelu_erf:nope[1]>=8"])
    with pytest.raises(ControlError, match=r"no input 'nope'; inputs: \['u', 'x'\]"):
        gaf.analyze()
    gaf = GraphAutoFusion(_model(), preset="transformer", size_switches=["gelu_erf:x[5]>=8"])
    with pytest.raises(ControlError, match="has rank 3"):
        gaf.analyze()
    gaf = GraphAutoFusion(_model(), preset="transformer", size_switches=["nope:x[1]>=8"])
    with pytest.raises(ControlError, match="no rule 'nope'"):
        gaf.analyze()


# ----------------------------------------------------------------------------- mixed precision

# An fp16 block: LayerNorm written out (ReduceMean twice), a sum over the last axis, and a
# BatchNormalization on a channel-first view.
FP16_BLOCK = """
model opset {"": 18}
graph g(%x: f16[2,8,64], %c: f16[1,8,4,4]) -> (%ln, %s, %bn) {
  init %eps: f16[] = [1e-5]
  init %two: f16[] = [2.0]
  init %g: f16[64] = randn(2)
  init %be: f16[64] = randn(3)
  init %scale: f16[8] = randn(4)
  init %bias: f16[8] = randn(5)
  init %mean: f16[8] = randn(6)
  init %var: f16[8] = [1.0, 2.0, 0.5, 1.5, 1.0, 3.0, 0.25, 1.0]
  init %ax: i64[1] = [-1]
  %mu = ReduceMean(%x, %ax) @mean1
  %d = Sub(%x, %mu) @sub
  %p = Pow(%d, %two) @pow
  %v = ReduceMean(%p, %ax) @mean2
  %ve = Add(%v, %eps) @addeps
  %sd = Sqrt(%ve) @sqrt
  %nrm = Div(%d, %sd) @div
  %sc = Mul(%nrm, %g) @mulg
  %ln = Add(%sc, %be) @addb
  %s = ReduceSum(%x, %ax) @sum
  %bn = BatchNormalization(%c, %scale, %bias, %mean, %var) @bn
}
"""


def _inputs_of(model, op: str) -> list[DType]:
    return [
        v.dtype for n in model.graph.nodes if n.op_type == op for v in n.inputs if v is not None
    ]


def test_fp16_model_keeps_its_reductions_and_batchnorm_in_fp32():
    model = parse_model(FP16_BLOCK)
    gaf = GraphAutoFusion(model, preset="transformer", hardware=PROFILE, keep_fp32="default")
    gaf.fuse(check_speed=False)
    fused = gaf.result.model
    # the written-out LayerNorm became onnxruntime's LayerNormalization (accumulates in fp32)
    assert "LayerNormalization" in _ops(fused)
    # the unfused ReduceSum and BatchNormalization compute in float32; axes stay int64
    assert _inputs_of(fused, "ReduceSum") == [DType.FLOAT, DType.INT64]
    assert set(_inputs_of(fused, "BatchNormalization")) == {DType.FLOAT}
    assert gaf.result.fp32_islands == 2
    assert gaf.result.controls["keep_fp32"][0] == "BatchNormalization"
    # the graph's interface is unchanged: the same names, still float16
    proto = to_onnx(fused)
    onnx.checker.check_model(proto)
    outs = {o.name: o.type.tensor_type.elem_type for o in proto.graph.output}
    assert outs == {
        "ln": onnx.TensorProto.FLOAT16,
        "s": onnx.TensorProto.FLOAT16,
        "bn": onnx.TensorProto.FLOAT16,
    }
    assert gaf.result.end_to_end is not None
    # the fp32 sum is at least as close to a float64 sum as the fp16 original's
    feeds = gaf.result.feeds
    exact = feeds["x"].astype(np.float64).sum(-1, keepdims=True)
    got = ort_outputs(proto, feeds)["s"].astype(np.float64)
    orig = ort_outputs(to_onnx(model), feeds)["s"].astype(np.float64)
    assert np.abs(got - exact).max() <= np.abs(orig - exact).max() + 1e-12


def test_without_the_constraint_the_fp16_model_is_left_as_written():
    gaf = GraphAutoFusion(parse_model(FP16_BLOCK), preset="transformer", hardware=PROFILE)
    gaf.fuse(check_speed=False)
    assert _inputs_of(gaf.result.model, "ReduceSum") == [DType.FLOAT16, DType.INT64]
    assert gaf.result.fp32_islands == 0


HALF_SOFTMAX_SUM = """
model opset {"": 18}
graph g(%x: f16[4,32]) -> (%y) {
  init %ax: i64[1] = [-1]
  %e = Exp(%x) @exp
  %s = ReduceSum(%e, %ax) @sum
  %y = Sqrt(%s) @sqrt
}
"""


def test_a_fusion_computing_a_kept_reduction_in_half_is_refused_on_onnxruntime_not_cpu():
    from graph_autofusion.codegen.targets import get_target
    from graph_autofusion.patterns.candidates import match_rules
    from graph_autofusion.patterns.rules import RuleSet
    from graph_autofusion.planner.controls import PrecisionGuard

    model = parse_model(HALF_SOFTMAX_SUM)
    rule = FusionRule("exp_sum", op1="Exp", op2="ReduceSum", fuse_pattern="ExpSum")
    (m,) = match_rules(model.graph, RuleSet((rule,))).kept
    ort = PrecisionGuard(get_target("onnxruntime"), ("ReduceSum",))
    code, message = ort.refusal(m, None)
    assert code == "precision-constraint" and "ReduceSum" in message
    assert (
        PrecisionGuard(get_target("onnxruntime"), ("BatchNormalization",)).refusal(m, None) is None
    )
    # the cpu target's kernels widen half values to float32: the constraint holds, kept
    gaf = GraphAutoFusion(model, target="cpu", hardware=PROFILE, keep_fp32="default")
    report = gaf.analyze()
    assert report.chosen and not any(c.code == "precision-constraint" for c in report.candidates)
    gaf.fuse(check_speed=False)
    assert gaf.result.lowered and not gaf.result.rolled_back


# ----------------------------------------------------------------------------- float check


def test_float_check_reports_each_fused_groups_drift():
    model = parse_model(FP16_BLOCK)
    gaf = GraphAutoFusion(model, preset="transformer", hardware=PROFILE)
    gaf.fuse(check_speed=False)
    report = gaf.float_check()
    assert report.precision == "float16"
    (g,) = [g for g in report.groups if "layernorm" in g.rule]
    assert g.outputs == ["ln"]
    # fp16 storage drifts from the fp32 reference; the fp32 run of the fused model does not
    assert 0 < g.fused["max_abs"] < 0.1 and g.unfused["max_abs"] > 0
    assert g.fused_fp32 is not None and g.fused_fp32["max_abs"] < 1e-4
    assert g.fused["cosine"] > 0.999
    text = report.to_text()
    assert g.key[:30] in text and "unfused" in text


def test_float_check_on_fp32_model_is_the_fusions_own_error():
    gaf = GraphAutoFusion(_model(), preset="transformer", hardware=PROFILE)
    gaf.fuse(check_speed=False)
    report = gaf.float_check()
    (g,) = report.groups
    assert report.precision == "float32" and g.unfused["max_abs"] == 0.0
    assert g.fused["max_abs"] < 1e-5


# ----------------------------------------------------------------------------- CLI


def test_cli_controls(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(to_onnx(parse_model(FP16_BLOCK)), src)
    out = tmp_path / "f.onnx"
    argv = ["fuse", str(src), "-o", str(out), "--hardware", PROFILE, "--no-speed-check"]
    assert main([*argv, "--keep-fp32", "default", "--float-check"]) == 0
    text = capsys.readouterr().out
    assert "debug float check" in text
    fused = onnx.load(out)
    reduce_in = [n.input[0] for n in fused.graph.node if n.op_type == "ReduceSum"]
    assert reduce_in and all("fp32" in name for name in reduce_in)
    assert main([*argv, "--stage", "layernorm_decomposed", "--stage", "nope"]) == 2
    assert "stage 2 names rule 'nope'" in capsys.readouterr().err
    assert main([*argv, "--size-switch", "bad"]) == 2
    assert "expected RULE:INPUT" in capsys.readouterr().err
