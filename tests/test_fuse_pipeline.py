"""The fuse pipeline (F11, F13-F15) end to end: safe mode through ``GraphAutoFusion`` and
``fuse_model``, the safe-fusion report, the CLI's ``fuse``/``verify``/``bench`` commands and the
articles' CamelCase API names.

Safe mode's engine has its own tests (``tests/test_safety.py``); here the deliberately broken
rules go through the whole pipeline (planner, onnxruntime lowering, per-fusion checks, rollback,
end-to-end comparison) next to real built-in fusions in the same hand-written graph. Each broken
fusion must be rolled back with its reason, the correct fusions must stay, and the final model
must compute what the original computes in onnxruntime.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

from graph_autofusion import GraphAutoFusion
from graph_autofusion.api import NotFusedYetError
from graph_autofusion.cli import main
from graph_autofusion.errors import ModelWriteError
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteError
from graph_autofusion.patterns.rules import FusionRule
from graph_autofusion.pipeline import fuse_model
from graph_autofusion.report.fuse_report import SafeFusionReport
from graph_autofusion.runtime.timing import use_timer
from graph_autofusion.samples.inputs import generate_inputs
from graph_autofusion.testing import ort_outputs

MS = "com.microsoft"
#: A fixed hardware profile: ``host`` is calibrated per machine (the planner's choices would
#: vary); the fusions in these small graphs save far more than the threshold on any profile.
PROFILE = "x86_avx2"
FAST = ("--hardware", PROFILE, "--no-speed-check")

# MatMul + bias + erf-GELU (bias_gelu -> BiasGelu), residual Add + LayerNorm (skip_layernorm ->
# SkipLayerNormalization), and an unrelated exp(-u) for the broken rules to claim.
TRANSFORMER_BLOCK = """
model opset {"": 18}
graph g(%x: f32[4,16,64], %res: f32[4,16,64], %u: f32[4,64]) -> (%y, %z) {
  init %w: f32[64,64] = randn(0)
  init %b: f32[64] = randn(1)
  init %g: f32[64] = randn(2)
  init %be: f32[64] = randn(3)
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %m = MatMul(%x, %w) @mm
  %a = Add(%m, %b) @bias
  %s = Div(%a, %c) @div
  %e = Erf(%s) @erf
  %a1 = Add(%e, %one) @add1
  %mg = Mul(%a, %a1) @mul
  %h = Mul(%mg, %half) @gelu_out
  %r = Add(%h, %res) @resid
  %y = LayerNormalization<axis=-1, epsilon=1e-5>(%r, %g, %be) @ln
  %n = Neg(%u) @neg
  %z = Exp(%n) @exp
}
"""


def _relu_instead_of_exp_neg(ctx):
    """Deliberately wrong: exp(-u) is not relu(u)."""
    return ctx.make_node("Relu", [ctx.label("op1").inputs[0]]).outputs


WRONG = FusionRule(
    "neg_exp_wrong",
    op1="Neg",
    op2="Exp",
    fuse_pattern="NegExp",
    priority=10_000,
    rewrite=_relu_instead_of_exp_neg,
)
NEG_EXP_GENERIC = FusionRule(
    "neg_exp", op1="Neg", op2="Exp", fuse_pattern="NegExp", priority=10_000
)


def assert_same_outputs(original, fused, feeds, *, rtol=1e-4, atol=1e-5) -> None:
    """``fused`` (IR Model or proto) passes onnx.checker and computes ``original``'s outputs."""
    fused_p = to_onnx(fused) if not isinstance(fused, onnx.ModelProto) else fused
    orig_p = to_onnx(original) if not isinstance(original, onnx.ModelProto) else original
    onnx.checker.check_model(fused_p)
    want, got = ort_outputs(orig_p, feeds), ort_outputs(fused_p, feeds)
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=rtol, atol=atol, err_msg=k)


def ops(model) -> list[str]:
    return [n.qualified_op for n in model.graph.nodes]


# ----------------------------------------------------------------------------- safe mode
def test_wrong_rule_is_rolled_back_for_numerics_and_the_others_stay():
    original = parse_model(TRANSFORMER_BLOCK)
    before = to_onnx(original).SerializeToString()
    gaf = GraphAutoFusion(original, rules=[WRONG], preset="all", hardware=PROFILE)
    fused = gaf.fuse(check_speed=False)
    res = gaf.result
    (bad,) = res.rolled_back
    assert (bad.rule, bad.code) == ("neg_exp_wrong", "numerics"), bad
    assert "%z" in bad.message and bad.result.cosine < 0.9
    assert {low.rule for low in res.lowered} == {"bias_gelu", "skip_layernorm"}
    got = ops(fused)
    assert f"{MS}::BiasGelu" in got and f"{MS}::SkipLayerNormalization" in got
    assert "Relu" not in got and {"Neg", "Exp"} <= set(got)  # the wrong rewrite is gone
    assert all(gaf.result.safety[low.key].passed for low in res.lowered)
    assert all(v["passed"] for v in res.end_to_end.values())
    assert_same_outputs(original, fused, gaf.feeds())
    assert to_onnx(original).SerializeToString() == before  # the input model is untouched
    skipped = res.skipped_by_reason()
    assert skipped["rolled-back:numerics"] == 1
    report = gaf.safe_fusion_report()
    data = json.loads(json.dumps(report.to_dict(), default=str))
    assert data["fused"] == 2 and data["rolled_back"][0]["code"] == "numerics"
    assert data["rolled_back"][0]["cosine"] < 0.9
    assert {f["rule"] for f in data["fusions"]} == {"bias_gelu", "skip_layernorm"}
    assert all(f["passed"] and f["cosine"] > 0.9999 for f in data["fusions"])
    text = report.to_text()
    assert "rolled back 1" in text and "neg_exp_wrong@exp: [numerics]" in text


def test_without_safe_mode_the_wrong_rule_stays_and_the_model_is_wrong():
    """The control for the test above: the same pipeline with safe mode off keeps the broken
    fusion, so it is safe mode that removes it."""
    original = parse_model(TRANSFORMER_BLOCK)
    gaf = GraphAutoFusion(original, rules=[WRONG], preset="all", hardware=PROFILE, safe_mode=False)
    fused = gaf.fuse()
    assert "neg_exp_wrong" in {low.rule for low in gaf.result.lowered}
    assert gaf.result.end_to_end is None and not gaf.result.rolled_back
    feeds = gaf.feeds()
    want = ort_outputs(to_onnx(original), feeds)["z"]
    got = ort_outputs(to_onnx(fused), feeds)["z"]
    assert not np.allclose(got, want, atol=1e-2)
    assert "safe mode off" in gaf.safe_fusion_report().to_text()


# float16 RMS whose x*x overflows float16 (the original upcasts to float32 first) next to an
# fp32 erf-GELU that fuses to com.microsoft::Gelu.
FP16_MODEL = """
model opset {"": 20}
graph g(%x: f16[4,64], %v: f32[4,64]) -> (%y, %h) {
  init %k: f16[] = [400.0]
  init %axes: i64[1] = [-1]
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %xs = Mul(%x, %k) @scale_up
  %xf = Cast<to=1>(%xs) @up
  %sq = Mul(%xf, %xf) @square
  %mu = ReduceMean<keepdims=1>(%sq, %axes) @mean
  %r = Sqrt(%mu) @root
  %y = Cast<to=10>(%r) @down
  %s = Div(%v, %c) @div
  %e = Erf(%s) @erf
  %a = Add(%e, %one) @add
  %m = Mul(%v, %a) @mul
  %h = Mul(%m, %half) @gelu_out
}
"""


def _rms_pattern():
    p = PatternBuilder()
    xf = p.Cast(p.var("x"), to=1)
    mean = p.ReduceMean(p.Mul(xf, xf), p.var("axes"))
    return p.Cast(p.Sqrt(mean), to=10)


def _rms_in_fp16(ctx):
    """The same math computed in float16 throughout (drops the upcast): x*x overflows."""
    x = ctx.value("x")
    sq = ctx.make_node("Mul", [x, x]).outputs[0]
    mean = ctx.make_node("ReduceMean", [sq, ctx.value("axes")], {"keepdims": 1}).outputs[0]
    return ctx.make_node("Sqrt", [mean]).outputs


RMS_HALF = FusionRule(
    "rms_fp16",
    pattern=_rms_pattern(),
    fuse_pattern="RmsHalf",
    priority=10_000,
    rewrite=_rms_in_fp16,
)


def test_fp16_overflow_is_rolled_back_and_the_gelu_stays():
    original = parse_model(FP16_MODEL)
    gaf = GraphAutoFusion(original, rules=[RMS_HALF], preset="all", hardware=PROFILE)
    fused = gaf.fuse(check_speed=False)
    res = gaf.result
    (bad,) = res.rolled_back
    assert (bad.rule, bad.code) == ("rms_fp16", "fp16-overflow"), bad
    assert bad.result.fp16_max > 65504 and "%sq" in bad.message
    assert [low.rule for low in res.lowered] == ["gelu_erf"]
    assert f"{MS}::Gelu" in ops(fused)
    assert ops(fused).count("Cast") == 2  # the upcast and the downcast are back
    feeds = gaf.feeds()
    assert feeds["x"].dtype == np.float16
    assert_same_outputs(original, fused, feeds, rtol=1e-3, atol=1e-3)
    assert np.isfinite(ort_outputs(to_onnx(fused), feeds)["y"]).all()


# A Relu -> Neg pair on [64, 512] next to an erf-GELU.
SLOW_MODEL = """
model opset {"": 18}
graph g(%x: f32[64,512], %v: f32[4,64]) -> (%y, %h) {
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %r = Relu(%x) @relu
  %y = Neg(%r) @neg
  %s = Div(%v, %c) @div
  %e = Erf(%s) @erf
  %a = Add(%e, %one) @add
  %m = Mul(%v, %a) @mul
  %h = Mul(%m, %half) @gelu_out
}
"""


def _relu_neg_via_identity_matmul(ctx):
    """Exact, but a 64x512x512 MatMul with the identity (~33 MFLOP) replaces two cheap
    elementwise ops: an order of magnitude slower in onnxruntime."""
    r = ctx.make_node("Relu", [ctx.label("op1").inputs[0]]).outputs[0]
    eye = ctx.add_constant("eye", np.eye(512, dtype=np.float32))
    mm = ctx.make_node("MatMul", [r, eye]).outputs[0]
    return ctx.make_node("Neg", [mm]).outputs


SLOW_RULE = FusionRule(
    "slow_relu_neg",
    op1="Relu",
    op2="Neg",
    fuse_pattern="ReluNeg",
    priority=10_000,
    rewrite=_relu_neg_via_identity_matmul,
)


def _slow_rewrites_timer(key, side, fn):
    """Safe mode's timer (``runtime.timing.use_timer``): the sessions run for real, the times
    are set: the slow_relu_neg fusion takes 10x its operators, every other fusion 0.8x."""
    fn()
    if side == "unfused":
        return 10e-6
    return 100e-6 if key.startswith("slow_relu_neg@") else 8e-6


def test_slower_fusion_is_rolled_back_and_the_gelu_stays():
    """The speed check's verdict drives the rollback: with a timer that makes one fusion
    slower (and no real timing at all), that one is rolled back with ``slower`` and the
    model rebuilt with the other, which keeps its measured times."""
    original = parse_model(SLOW_MODEL)
    rules = builtin_rules().preset("all") + SLOW_RULE
    with use_timer(_slow_rewrites_timer):
        res = fuse_model(
            original, rules, PROFILE, options=FuseOptions(check_speed=True, speed_margin=3.0)
        )
    (bad,) = res.rolled_back
    assert (bad.rule, bad.code) == ("slow_relu_neg", "slower"), bad
    assert bad.result.cosine > 0.99999  # the math is right: only the speed is wrong
    assert (bad.result.time_unfused_us, bad.result.time_fused_us) == pytest.approx((10, 100))
    assert bad.message == "fused 100.0 us > unfused 10.0 us x 3.0 on the real shapes"
    assert [low.rule for low in res.lowered] == ["gelu_erf"]
    good = res.safety[res.lowered[0].key]
    assert good.passed and (good.time_unfused_us, good.time_fused_us) == pytest.approx((10, 8))
    assert res.measured_improvement() is not None
    got = ops(res.model)
    assert "MatMul" not in got and f"{MS}::Gelu" in got
    assert_same_outputs(original, res.model, res.feeds)
    assert "[slower]" in SafeFusionReport(res, "slow").to_text()


def test_end_to_end_failure_rolls_back_everything():
    """If the whole fused model differs (here: an unreachable end-to-end floor), every fusion
    is rolled back and the original is returned."""
    original = parse_model(TRANSFORMER_BLOCK)
    res = fuse_model(
        original,
        builtin_rules().preset("all"),
        PROFILE,
        options=FuseOptions(check_speed=False, e2e_cosine_floor=1.01),
    )
    assert not res.lowered and len(res.rolled_back) == 2
    assert {b.code for b in res.rolled_back} == {"end-to-end"}
    assert any("end-to-end" in n for n in res.notes)
    assert ops(res.model) == ops(original)
    assert res.model is not original


def test_generic_only_rule_is_reported_no_native_form_and_left_unfused():
    """Without custom operators (the default; tests/test_ort_custom_ops.py has them)."""
    original = parse_model(TRANSFORMER_BLOCK)
    gaf = GraphAutoFusion(original, rules=[NEG_EXP_GENERIC], preset="all", hardware=PROFILE)
    fused = gaf.fuse(check_speed=False)
    mine = [n for n in gaf.result.not_lowered if n.rule == "neg_exp"]
    assert [n.code for n in mine] == ["no-native-form"]
    assert "no onnxruntime-native operator" in mine[0].message
    assert {"Neg", "Exp"} <= set(ops(fused))
    assert not any(n.domain.startswith("graph_autofusion") for n in fused.graph.nodes)
    assert "no onnxruntime-native form (left unfused): " in gaf.safe_fusion_report().to_text()
    assert_same_outputs(original, fused, gaf.feeds())


def _declines(ctx):
    raise RewriteError("this instance has no native form")


DECLINING = FusionRule(
    "neg_exp_declines",
    op1="Neg",
    op2="Exp",
    fuse_pattern="NegExp",
    priority=10_000,
    rewrite=_declines,
)


def test_declined_native_rewrite_is_reported_with_its_reason():
    gaf = GraphAutoFusion(
        parse_model(TRANSFORMER_BLOCK), rules=[DECLINING], preset="all", hardware=PROFILE
    )
    gaf.fuse(check_speed=False)
    mine = [n for n in gaf.result.not_lowered if n.rule == "neg_exp_declines"]
    assert [n.code for n in mine] == ["native-declined"]
    assert "this instance has no native form" in mine[0].message
    assert gaf.result.skipped_by_reason()["native-declined"] == 1


def test_report_no_native_form_line_lists_only_rules_without_a_native_form():
    gaf = GraphAutoFusion(
        parse_model(TRANSFORMER_BLOCK), rules=[DECLINING], preset="all", hardware=PROFILE
    )
    gaf.fuse(check_speed=False)
    line = next(ln for ln in gaf.safe_fusion_report().to_text().splitlines() if "native form" in ln)
    # neg_exp_declines HAS a native form; this instance was declined (its own reason code)
    assert "neg_exp_declines" not in line, line


def test_report_before_fuse_is_an_error():
    gaf = GraphAutoFusion(parse_model(TRANSFORMER_BLOCK))
    with pytest.raises(NotFusedYetError):
        gaf.safe_fusion_report()
    with pytest.raises(NotFusedYetError):
        gaf.save("unused.onnx")


# ----------------------------------------------------------------------------- the CLI
@pytest.fixture()
def small_model(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(to_onnx(parse_model(TRANSFORMER_BLOCK)), str(path))
    return path


def _stamp(path):
    st = os.stat(path)
    return path.read_bytes(), st.st_mtime_ns


def test_cli_fuse_writes_the_fused_model_and_never_touches_the_input(small_model, capsys):
    before = _stamp(small_model)
    out = small_model.parent / "fused.onnx"
    rc = main(["fuse", str(small_model), "-o", str(out), *FAST, "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    data = json.loads(captured.out)
    assert data["fused"] == 2 and data["safe_mode"] is True
    assert data["fused_ops"] == {f"{MS}::BiasGelu": 1, f"{MS}::SkipLayerNormalization": 1}
    assert all(v["passed"] for v in data["end_to_end"].values())
    assert "fused model written to" in captured.err
    assert _stamp(small_model) == before
    fused = onnx.load(str(out))
    onnx.checker.check_model(fused)
    feeds = generate_inputs(parse_model(TRANSFORMER_BLOCK))
    assert_same_outputs(onnx.load(str(small_model)), fused, feeds)
    assert sorted(p.name for p in small_model.parent.iterdir()) == ["fused.onnx", "m.onnx"]


def test_cli_fuse_text_report(small_model, capsys):
    out = small_model.parent / "fused.onnx"
    assert main(["fuse", str(small_model), "-o", str(out), *FAST]) == 0
    text = capsys.readouterr().out
    assert "fused 2, rolled back 0" in text
    assert "com.microsoft::BiasGelu x1" in text and "end to end %y: cosine" in text


def test_cli_fuse_progress_is_quiet_when_stderr_is_not_a_tty(small_model, capsys):
    out = small_model.parent / "fused.onnx"
    assert main(["fuse", str(small_model), "-o", str(out), *FAST]) == 0
    err = capsys.readouterr().err
    assert "fuse: verify" not in err, err


def _assert_refused(rc, capsys, small_model, before, *, words):
    err = capsys.readouterr().err
    assert rc == 2
    assert "graph-autofusion: error:" in err and words in err, err
    assert _stamp(small_model) == before


@pytest.mark.parametrize("where", ["missing-folder", "folder-is-a-file", "output-is-a-directory"])
def test_cli_fuse_unwritable_output_leaves_no_file(small_model, capsys, where):
    before = _stamp(small_model)
    folder = small_model.parent
    if where == "missing-folder":
        out = folder / "no" / "such" / "fused.onnx"
    elif where == "folder-is-a-file":
        (folder / "plain.txt").write_text("x")
        out = folder / "plain.txt" / "fused.onnx"
    else:
        (folder / "adir").mkdir()
        out = folder / "adir"
    files = sorted(folder.rglob("*"))
    rc = main(["fuse", str(small_model), "-o", str(out), *FAST])
    _assert_refused(rc, capsys, small_model, before, words=str(out))
    assert sorted(folder.rglob("*")) == files  # nothing written, no temporary left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_cli_fuse_read_only_folder_leaves_no_file(small_model, tmp_path, capsys):
    before = _stamp(small_model)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc = main(["fuse", str(small_model), "-o", str(ro / "fused.onnx"), *FAST])
        _assert_refused(rc, capsys, small_model, before, words="cannot write")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_cli_fuse_refuses_the_input_as_output(small_model, capsys, monkeypatch):
    before = _stamp(small_model)
    rc = main(["fuse", str(small_model), "-o", str(small_model), *FAST])
    _assert_refused(rc, capsys, small_model, before, words="--overwrite")
    monkeypatch.chdir(small_model.parent)  # the same file spelled differently
    rc = main(["fuse", str(small_model), "-o", "./m.onnx", *FAST])
    _assert_refused(rc, capsys, small_model, before, words="--overwrite")


def test_cli_fuse_refuses_a_link_to_the_input(small_model, capsys):
    before = _stamp(small_model)
    link = small_model.parent / "link.onnx"
    link.symlink_to(small_model)
    rc = main(["fuse", str(small_model), "-o", str(link), *FAST])
    _assert_refused(rc, capsys, small_model, before, words="overwrite")
    assert link.is_symlink()


def test_cli_fuse_overwrite_replaces_the_input(small_model, capsys):
    original = onnx.load(str(small_model))
    rc = main(["fuse", str(small_model), "-o", str(small_model), "--overwrite", *FAST])
    assert rc == 0, capsys.readouterr().err
    fused = onnx.load(str(small_model))
    assert {n.domain for n in fused.graph.node} >= {MS}
    assert_same_outputs(original, fused, generate_inputs(parse_model(TRANSFORMER_BLOCK)))
    assert sorted(p.name for p in small_model.parent.iterdir()) == ["m.onnx"]


@pytest.fixture()
def fused_pair(small_model):
    out = small_model.parent / "fused.onnx"
    assert main(["fuse", str(small_model), "-o", str(out), *FAST, "--json"]) == 0
    return small_model, out


def test_cli_verify_passes_on_the_fused_model(fused_pair, capsys):
    original, fused = fused_pair
    capsys.readouterr()
    assert main(["verify", str(original), str(fused)]) == 0
    text = capsys.readouterr().out
    assert "%y: cosine" in text and "%z: cosine" in text
    assert text.strip().splitlines()[-1].startswith("PASS: worst output cosine")


def test_cli_verify_refuses_a_model_of_another_interface(small_model, capsys):
    """A model with none of the original's outputs was compared on nothing and passed (the
    outputs neither has were skipped): it is refused, naming what differs; so is one taking an
    input the original has not."""
    proto = onnx.load(str(small_model))
    renamed = onnx.load(str(small_model))
    for node in renamed.graph.node:
        node.output[:] = [f"{o}_other" if o == "y" else o for o in node.output]
    renamed.graph.output[0].name = "y_other"
    path = small_model.parent / "other_outputs.onnx"
    onnx.save(renamed, str(path))
    capsys.readouterr()
    assert main(["verify", str(small_model), str(path)]) == 2
    err = capsys.readouterr().err
    assert "lacks outputs of the original (y;" in err and str(path) in err, err
    extra = onnx.load(str(small_model))
    extra.graph.input.append(onnx.helper.make_tensor_value_info("mask", 1, [1]))
    path = small_model.parent / "extra_input.onnx"
    onnx.save(extra, str(path))
    assert main(["verify", str(small_model), str(path)]) == 2
    assert "takes inputs the original has not (mask;" in capsys.readouterr().err
    assert [o.name for o in proto.graph.output] == ["y", "z"]  # the original's outputs


def test_cli_verify_fails_on_a_wrong_model(small_model, capsys):
    wrong = small_model.parent / "wrong.onnx"
    onnx.save(to_onnx(parse_model(TRANSFORMER_BLOCK.replace("Exp(%n)", "Relu(%n)"))), str(wrong))
    assert main(["verify", str(small_model), str(wrong)]) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("FAIL: worst output cosine")
    assert main(["verify", str(small_model), str(wrong), "--json"]) == 1


def test_cli_verify_json_parses(fused_pair, capsys):
    original, fused = fused_pair
    wrong = original.parent / "wrong.onnx"
    onnx.save(to_onnx(parse_model(TRANSFORMER_BLOCK.replace("Exp(%n)", "Relu(%n)"))), str(wrong))
    capsys.readouterr()
    assert main(["verify", str(original), str(fused), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cosine"] >= 0.9999 and data["max_abs"] < 1e-3
    assert set(data["outputs"]) == {"y", "z"}
    assert "h" in data["layers"]  # the BiasGelu output keeps its name: compared per layer
    assert main(["verify", str(original), str(wrong), "--json"]) == 1
    assert (
        json.loads(capsys.readouterr().out)["outputs"]["z"]["cosine"] < 0.9999
    )  # below the floor: FAIL


def test_cli_bench(fused_pair, capsys):
    original, fused = fused_pair
    capsys.readouterr()
    assert main(["bench", str(original), str(fused), "--runs", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for k in ("baseline", "fused"):
        assert data[k]["latency_ms"] > 0 and data[k]["throughput_per_s"] > 0
        assert data[k]["min_ms"] <= data[k]["latency_ms"] <= data[k]["max_ms"]
    assert isinstance(data["improvement"], float) and data["runs"] == 3
    assert main(["bench", str(original), str(fused), "--runs", "3"]) == 0
    assert "improvement" in capsys.readouterr().out
    # one model: its time alone, not an "improvement" of the model over itself
    assert main(["bench", str(original), "--runs", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["baseline"]["latency_ms"] > 0 and not {"fused", "improvement"} & set(data)
    assert main(["bench", str(original), "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "improvement" not in out and "no fused model" in out


def test_cli_missing_input_is_one_clear_error(tmp_path, capsys):
    rc = main(["fuse", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "out.onnx")])
    assert rc == 2 and "graph-autofusion: error:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- API names
def test_camelcase_aliases_are_the_methods():
    pairs = {
        "Fuse": "fuse",
        "FuseSafe": "fuse_safe",
        "AnalyzeFusionBenefit": "analyze",
        "EstimateFusionBenefit": "estimate_benefit",
        "GetSafeFusionReport": "safe_fusion_report",
        "VerifyPrecision": "verify_precision",
        "VerifyPerformance": "verify_performance",
        "AddFusionRule": "register_custom_fusion",
    }
    for alias, name in pairs.items():
        assert getattr(GraphAutoFusion, alias) is getattr(GraphAutoFusion, name), alias


def test_camelcase_api_end_to_end(small_model, tmp_path):
    gaf = GraphAutoFusion(str(small_model), preset="transformer", hardware=PROFILE)
    gaf.AddFusionRule(WRONG)
    assert "neg_exp_wrong" in {r.name for r in gaf.rules}
    plan = gaf.AnalyzeFusionBenefit()
    assert any(c.chosen for c in plan.candidates)
    benefit = gaf.EstimateFusionBenefit()
    assert "performance_improvement" in benefit and "hbm_access_reduction" in benefit
    fused = gaf.FuseSafe(check_speed=False)
    report = gaf.GetSafeFusionReport().to_dict()
    assert [b["code"] for b in report["rolled_back"]] == ["numerics"]
    assert report["fused"] == 2
    prec = gaf.VerifyPrecision()
    assert prec["cosine"] >= 0.9999 and set(prec["outputs"]) == {"y", "z"}
    assert prec["layers"]  # intermediate values compared by name
    perf = gaf.VerifyPerformance(runs=3, warmup=1)
    assert perf["fused"]["latency_ms"] > 0 and "improvement" in perf
    # an unsafe Fuse keeps the wrong rewrite; VerifyPrecision sees it
    unsafe = gaf.Fuse(safe_mode=False)
    assert "Relu" in ops(unsafe)
    assert gaf.VerifyPrecision(unsafe)["outputs"]["z"]["cosine"] < 0.9
    assert gaf.VerifyPrecision(fused)["cosine"] >= 0.9999
    # save: atomic, refuses the input file unless asked
    before = _stamp(small_model)
    with pytest.raises(ModelWriteError, match="overwrite"):
        gaf.save(small_model)
    assert _stamp(small_model) == before
    gaf.save(tmp_path / "out.onnx")
    onnx.checker.check_model(onnx.load(str(tmp_path / "out.onnx")))
