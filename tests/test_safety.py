"""Safe mode (F13): each check catches what it claims, on real onnxruntime runs.

Fusions are applied with the real rule machinery (``match_rules``/``apply_matches``) on one
copy of a text-form model; the other copy is the original. Deliberately broken rules (wrong
math, float16 where the original upcast, a slow rewrite, an exact-only-at-this-point rewrite)
must fail with their reason while the correct fusions in the same model pass; rebuilding the
model with only the passing fusions must match the original end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.frontend.onnx_export import to_onnx
from graph_autofusion.frontend.onnx_import import load_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.gelu_erf import RULE as GELU
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rules import FusionRule, RuleSet
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.verify.safety import (
    FusionRecord,
    capture_activations,
    check_fusion,
    compare_tensors,
    end_to_end,
    generate_inputs,
    record_from_applied,
    subgraph_model,
)

GELU_AND_NEGEXP = """
graph g(%x: f32[4,64], %u: f32[4,64]) -> (%y, %z) {
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %s = Div(%x, %c) @div
  %e = Erf(%s) @erf
  %a = Add(%e, %one) @add
  %m = Mul(%x, %a) @mul
  %y = Mul(%m, %half) @gelu_out
  %n = Neg(%u) @neg
  %z = Exp(%n) @exp
}
"""


def _relu_instead_of_exp_neg(ctx):
    """Deliberately wrong: exp(-u) is not relu(u)."""
    return ctx.make_node("Relu", [ctx.label("op1").inputs[0]]).outputs


WRONG = FusionRule("neg_exp_wrong", op1="Neg", op2="Exp", rewrite=_relu_instead_of_exp_neg)
NEG_EXP = FusionRule("neg_exp", op1="Neg", op2="Exp")  # generic: exact


def fuse(text: str, rules, *, native: bool = True, typed: bool = False):
    """(original, fused, records, feeds, activations) for ``rules`` applied to ``text``;
    ``typed``: every value's dtype known, as the pipeline's models have them (an ONNX round
    trip with shape inference; ``parse_model`` leaves intermediate dtypes unset)."""
    if typed:
        proto = to_onnx(parse_model(text))
        original, fused = load_onnx(proto), load_onnx(proto)
    else:
        original, fused = parse_model(text), parse_model(text)
    report = match_rules(fused.graph, RuleSet(tuple(rules)))
    applied = apply_matches(fused, report.kept, native=native)
    assert all(not a.error for a in applied), [a.error for a in applied]
    records = {a.rule.name: record_from_applied(original, a) for a in applied}
    feeds = generate_inputs(original, seed=0)
    acts = capture_activations(original, feeds)
    return original, fused, records, feeds, acts


def fuse_only(text: str, rules, keep: set[str], *, native: bool = True):
    """A fresh fused model with only the fusions of rules named in ``keep`` (the rollback)."""
    model = parse_model(text)
    report = match_rules(model.graph, RuleSet(tuple(rules)))
    apply_matches(model, [rm for rm in report.kept if rm.rule.name in keep], native=native)
    return model


def test_wrong_rewrite_fails_numerics_and_the_correct_one_passes():
    original, fused, records, feeds, acts = fuse(GELU_AND_NEGEXP, [GELU, WRONG])
    good = check_fusion(original, fused, records["gelu_erf"], acts, check_speed=False)
    bad = check_fusion(original, fused, records["neg_exp_wrong"], acts, check_speed=False)
    assert good.passed and good.code == "ok", good
    assert good.cosine > 0.99999 and good.max_abs < 1e-4
    assert not bad.passed and bad.code == "numerics", bad
    assert bad.cosine < 0.999 and "%z" in bad.message
    # the whole fused model is wrong; with the failing fusion rolled back it is right
    e2e = end_to_end(parse_model(GELU_AND_NEGEXP), fused, feeds)
    assert e2e["y"]["passed"] and not e2e["z"]["passed"]
    kept = {k for k, r in (("gelu_erf", good), ("neg_exp_wrong", bad)) if r.passed}
    rolled = fuse_only(GELU_AND_NEGEXP, [GELU, WRONG], kept)
    assert "com.microsoft" in {n.domain for n in rolled.graph.nodes}  # gelu stayed fused
    assert all(r["passed"] for r in end_to_end(original, rolled, feeds).values())


def test_cosine_floor_override():
    original, fused, records, _, acts = fuse(GELU_AND_NEGEXP, [GELU, NEG_EXP], native=False)
    rec = records["neg_exp"]
    assert check_fusion(original, fused, rec, acts, check_speed=False, mc_samples=0).passed
    # a floor no cosine can reach (rounding-level differences may give 1 - 1e-16)
    res = check_fusion(
        original, fused, rec, acts, check_speed=False, mc_samples=0, cosine_floor=1.01
    )
    assert res.code == "numerics"


# ----------------------------------------------------------------------------- fp16
RMS_FP16 = """
model opset {"": 20}
graph g(%x: f16[4,64], %v: f32[4,64]) -> (%y, %w) {
  init %k: f16[] = [400.0]
  init %axes: i64[1] = [-1]
  %xs = Mul(%x, %k) @scale_up
  %xf = Cast<to=1>(%xs) @up
  %sq = Mul(%xf, %xf) @square
  %mu = ReduceMean<keepdims=1>(%sq, %axes) @mean
  %r = Sqrt(%mu) @root
  %y = Cast<to=10>(%r) @down
  %nv = Neg(%v) @neg
  %w = Exp(%nv) @exp
}
"""


def _rms_pattern():
    p = PatternBuilder()
    xf = p.Cast(p.var("x"), to=1)
    mean = p.ReduceMean(p.Mul(xf, xf), p.var("axes"))
    return p.Cast(p.Sqrt(mean), to=10)


def _rms_in_fp16(ctx):
    """Numerically the same math, but in float16 throughout: x*x overflows."""
    x = ctx.value("x")
    sq = ctx.make_node("Mul", [x, x]).outputs[0]
    mean = ctx.make_node("ReduceMean", [sq, ctx.value("axes")], {"keepdims": 1}).outputs[0]
    return ctx.make_node("Sqrt", [mean]).outputs


RMS_HALF = FusionRule("rms_fp16", pattern=_rms_pattern(), rewrite=_rms_in_fp16)
RMS_GENERIC = FusionRule("rms_fp16", pattern=_rms_pattern())


def test_fp16_overflow_is_caught_and_the_other_fusion_stays():
    original, fused, records, feeds, acts = fuse(RMS_FP16, [RMS_HALF, NEG_EXP])
    bad = check_fusion(original, fused, records["rms_fp16"], acts, check_speed=False)
    good = check_fusion(original, fused, records["neg_exp"], acts, check_speed=False)
    assert not bad.passed and bad.code == "fp16-overflow", bad
    assert bad.fp16_max > 65504 and "%sq" in bad.message
    assert good.passed and good.fp16_max is None  # no float16 in that fusion
    assert np.isfinite(acts["y"]).all()  # the original itself is fine
    rolled = fuse_only(RMS_FP16, [RMS_HALF, NEG_EXP], {"neg_exp"})
    assert all(r["passed"] for r in end_to_end(original, rolled, feeds).values())


def test_fp16_generic_fusion_keeps_the_upcast_and_passes():
    original, fused, records, _, acts = fuse(RMS_FP16, [RMS_GENERIC], native=False)
    res = check_fusion(original, fused, records["rms_fp16"], acts, check_speed=False)
    assert res.passed, res
    assert res.fp16_max is not None and res.fp16_max < 65504  # only the fp16 values checked


# A Hugging Face style float16 mask: float16's lowest value where a key is masked. The
# original's own Add saturates (score - 65504 rounds to -65504 or to -inf), which Softmax
# turns into 0 either way; a fusion computing the same Add in float16 adds no overflow.
LO = "-65504.0"
MASK = ", ".join(["0.0"] * 5 + [LO] * 3 + ["0.0"] * 3 + [LO] * 5)
MASKED_FP16 = f"""
model opset {{"": 20}}
graph g(%x: f16[2,8]) -> (%y) {{
  init %k: f16[] = [60.0]
  init %m: f16[2,8] = [{MASK}]
  %xs = Mul(%x, %k) @scale
  %s = Add(%xs, %m) @mask
  %y = Softmax<axis=-1>(%s) @softmax
}}
"""
MASK_SOFTMAX = FusionRule("mask_softmax", op1="Add", op2="Softmax")


def test_fp16_mask_the_original_saturates_itself_is_not_an_overflow():
    original, fused, records, feeds, acts = fuse(MASKED_FP16, [MASK_SOFTMAX], native=False)
    s = acts["s"]
    assert s.dtype == np.float16 and np.isinf(s).any() and (s == -65504).any()  # both kinds
    res = check_fusion(original, fused, records["mask_softmax"], acts, check_speed=False)
    assert res.passed, res
    assert res.fp16_max > 65504  # reported, not failed: the original holds the same values
    assert np.isfinite(acts["y"]).all()


def test_fp16_overflow_the_original_does_not_have_still_fails():
    # the same mask, but the original adds it in float32: a fusion holding the sum in
    # float16 overflows where the original did not
    text = MASKED_FP16.replace(
        "%s = Add(%xs, %m) @mask",
        "%xf = Cast<to=1>(%xs) @up\n  %mf = Cast<to=1>(%m) @upm\n"
        "  %sf = Add(%xf, %mf) @mask\n  %s = Cast<to=10>(%sf) @down",
    )
    rule = FusionRule("mask_softmax_half", pattern=_cast_add_pattern(), rewrite=_add_in_fp16)
    original, fused, records, _, acts = fuse(text, [rule])
    res = check_fusion(original, fused, records["mask_softmax_half"], acts, check_speed=False)
    assert not res.passed and res.code == "fp16-overflow", res


def test_fp16_an_upcast_in_the_fused_op_does_not_vouch_for_a_saturated_value():
    # the original adds the mask and a bias in float32 and casts the sum to float16 (which
    # saturates where masked); the fused op adds both in float16 and upcasts only for the
    # Softmax: a float32 sum it now holds in float16 is checked nowhere, so the saturated
    # float16 value still fails the fusion (in true float16 arithmetic x - 65504 + 65504
    # is not x)
    bias = ", ".join(["0.0"] * 7 + ["65504.0"] + ["0.0"] * 8)
    text = f"""
model opset {{"": 20}}
graph g(%x: f16[2,8]) -> (%y) {{
  init %m: f16[2,8] = [{MASK}]
  init %gb: f16[2,8] = [{bias}]
  %xf = Cast<to=1>(%x) @upx
  %mf = Cast<to=1>(%m) @upm
  %gf = Cast<to=1>(%gb) @upg
  %tf = Add(%xf, %mf) @mask
  %sf = Add(%tf, %gf) @bias
  %s = Cast<to=10>(%sf) @down
  %y = Softmax<axis=-1>(%s) @softmax
}}
"""
    p = PatternBuilder()
    t = p.Add(p.Cast(p.var("a"), to=1), p.Cast(p.var("b"), to=1))
    pattern = p.Softmax(p.Cast(p.Add(t, p.Cast(p.var("c"), to=1)), to=10), axis=-1)

    def rewrite(ctx):
        t = ctx.make_node("Add", [ctx.value("a"), ctx.value("b")]).outputs[0]
        s = ctx.make_node("Add", [t, ctx.value("c")]).outputs[0]
        sf = ctx.make_node("Cast", [s], {"to": 1}).outputs[0]
        y = ctx.make_node("Softmax", [sf], {"axis": -1}).outputs[0]
        return ctx.make_node("Cast", [y], {"to": 10}).outputs

    rule = FusionRule("mask_bias_softmax", pattern=pattern, rewrite=rewrite)
    original, fused, records, _, acts = fuse(text, [rule], typed=True)
    assert acts["s"].dtype == np.float16 and (acts["s"] == -65504).any()
    res = check_fusion(original, fused, records["mask_bias_softmax"], acts, check_speed=False)
    assert not res.passed and res.code == "fp16-overflow" and "%s" in res.message, res


def _cast_add_pattern():
    p = PatternBuilder()
    add = p.Add(p.Cast(p.var("a"), to=1), p.Cast(p.var("b"), to=1))
    return p.Cast(add, to=10)


def _add_in_fp16(ctx):
    return ctx.make_node("Add", [ctx.value("a"), ctx.value("b")]).outputs


# ----------------------------------------------------------------------------- speed
RELU_GELU = """
graph g(%x: f32[64,512], %g: f32[4,64]) -> (%y, %h) {
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %y = Relu(%x) @relu
  %s = Div(%g, %c) @div
  %e = Erf(%s) @erf
  %a = Add(%e, %one) @add
  %m = Mul(%g, %a) @mul
  %h = Mul(%m, %half) @gelu_out
}
"""


def _relu_via_identity_matmul(ctx):
    """Exact, but a 64x512x512 MatMul with the identity replaces one cheap Relu."""
    r = ctx.make_node("Relu", [ctx.value("x")]).outputs[0]
    eye = ctx.add_constant("eye", np.eye(512, dtype=np.float32))
    return ctx.make_node("MatMul", [r, eye]).outputs


def _slow_relu_rule():
    p = PatternBuilder()
    return FusionRule("slow_relu", pattern=p.Relu(p.var("x")), rewrite=_relu_via_identity_matmul)


class StubTimer:
    """Safe mode's timer boundary (``runtime.timing``) with set durations: every call still
    runs the session (the sessions are real), but the seconds are ``times[side]`` (a list is
    consumed call by call, its last entry repeating), so "slower" is decided, not measured."""

    def __init__(self, unfused, fused):
        self.times = {"unfused": unfused, "fused": fused}
        self.calls = {"unfused": 0, "fused": 0}

    def __call__(self, key, side, fn):
        assert fn() is not None  # the timed run really ran
        t = self.times[side]
        i = self.calls[side]
        self.calls[side] += 1
        return t[min(i, len(t) - 1)] if isinstance(t, list) else t


def test_slower_fusion_is_caught():
    """The fused subgraph is 3x slower by the timer: it fails ``slower`` after the second,
    longer measurement confirms it; the message carries both times and the margin."""
    original, fused, records, _, acts = fuse(RELU_GELU, [_slow_relu_rule(), GELU])
    timer = StubTimer(10e-6, 30e-6)
    slow = check_fusion(
        original, fused, records["slow_relu"], acts, speed_margin=1.5, time_runs=5, timer=timer
    )
    assert slow.cosine > 0.99999  # the math is right: only the speed is wrong
    assert not slow.passed and slow.code == "slower", slow
    assert (slow.time_unfused_us, slow.time_fused_us) == pytest.approx((10.0, 30.0))
    assert slow.message == "fused 30.0 us > unfused 10.0 us x 1.5 on the real shapes"
    assert timer.calls == {"unfused": 5 + 10, "fused": 5 + 10}  # confirmed on 2 x time_runs


def test_a_fusion_within_the_margin_or_not_confirmed_slower_passes():
    original, fused, records, _, acts = fuse(RELU_GELU, [_slow_relu_rule(), GELU])
    within = StubTimer(10e-6, 10.4e-6)  # 4% slower, margin 5%: no second measurement
    good = check_fusion(
        original, fused, records["gelu_erf"], acts, speed_margin=1.05, time_runs=5, timer=within
    )
    assert good.passed and good.code == "ok", good
    assert (good.time_unfused_us, good.time_fused_us) == pytest.approx((10.0, 10.4))
    assert within.calls == {"unfused": 5, "fused": 5}
    # slow in the first measurement only (a noisy neighbour): the longer one clears it
    noisy = StubTimer(10e-6, [30e-6] * 5 + [9e-6])
    res = check_fusion(
        original, fused, records["slow_relu"], acts, speed_margin=1.5, time_runs=5, timer=noisy
    )
    assert res.passed and res.code == "ok", res
    assert res.time_fused_us == pytest.approx(9.0) and noisy.calls["fused"] == 15
    # no speed check: the timer is never called
    untimed = StubTimer(10e-6, 30e-6)
    res = check_fusion(
        original, fused, records["slow_relu"], acts, check_speed=False, timer=untimed
    )
    assert res.passed and res.time_fused_us is None and untimed.calls["fused"] == 0


# ----------------------------------------------------------------------------- Monte-Carlo
FLOOR_OF_ROUND = """
graph g(%u: f32[8,64], %x: f32[4,64]) -> (%y, %h) {
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %k = Round(%u) @round
  %y = Floor(%k) @floor
  %s = Div(%x, %c) @div
  %e = Erf(%s) @erf
  %a = Add(%e, %one) @add
  %m = Mul(%x, %a) @mul
  %h = Mul(%m, %half) @gelu_out
}
"""


def _floor_as_identity(ctx):
    """Exact on integral inputs only: floor(k) == k at the captured point, not around it."""
    return ctx.make_node("Identity", [ctx.value("k")]).outputs


def _floor_rule():
    p = PatternBuilder()
    return FusionRule("floor_identity", pattern=p.Floor(p.var("k")), rewrite=_floor_as_identity)


def test_monte_carlo_spread_is_reported_and_catches_a_cliff():
    original, fused, records, _, acts = fuse(FLOOR_OF_ROUND, [_floor_rule(), GELU])
    good = check_fusion(original, fused, records["gelu_erf"], acts, check_speed=False)
    assert good.passed and good.mc_spread is not None and 0.0 <= good.mc_spread < 1e-3
    assert len(good.details["mc_cosines"]) == 8
    bad = check_fusion(original, fused, records["floor_identity"], acts, check_speed=False)
    assert bad.cosine == pytest.approx(1.0)  # exact on the captured activations
    assert not bad.passed and bad.code == "monte-carlo", bad
    assert bad.mc_spread is not None
    no_mc = check_fusion(
        original, fused, records["floor_identity"], acts, check_speed=False, mc_samples=0
    )
    assert no_mc.passed and no_mc.mc_spread is None


# ----------------------------------------------------------------------------- alias
def test_in_place_fused_op_is_refused():
    original = parse_model(
        "graph g(%x: f32[4], %b: f32[4]) -> (%y) {\n  %t = Add(%x, %b) @add\n"
        "  %y = Relu(%t) @relu\n}"
    )
    fused = parse_model(
        "graph g(%x: f32[4], %b: f32[4]) -> (%y) {\n  %y = aten::relu_(%x, %b) @fused\n}"
    )
    rec = FusionRecord(
        "add_relu@relu",
        "test",
        list(original.graph.nodes),
        list(fused.graph.nodes),
        ["x", "b"],
        ["y"],
    )
    res = check_fusion(original, fused, rec, {}, check_speed=False)
    assert not res.passed and res.code == "alias" and "in-place" in res.message


def test_moving_an_in_place_write_across_outside_readers_is_refused():
    text = (
        "graph g(%x: f32[4], %b: f32[4]) -> (%y, %z) {\n  %w = aten::add_(%x, %b) @inplace\n"
        "  %y = Relu(%w) @relu\n  %z = Neg(%x) @reader\n}"
    )
    original = parse_model(text)
    fused = parse_model(
        "graph g(%x: f32[4], %b: f32[4]) -> (%y, %z) {\n"
        "  %y = graph_autofusion.fused::AddRelu(%x, %b) @fused\n  %z = Neg(%x) @reader\n}"
    )
    nodes = [n for n in original.graph.nodes if n.name in ("inplace", "relu")]
    rec = FusionRecord("k", "test", nodes, fused.graph.nodes[:1], ["x", "b"], ["y"])
    res = check_fusion(original, fused, rec, {}, check_speed=False)
    assert res.code == "alias" and "%x" in res.message


# ----------------------------------------------------------------------------- plumbing
def test_capture_activations_equal_the_reference_interpreter():
    model = parse_model(RMS_FP16.replace("f16", "f32").replace("<to=10>", "<to=1>"))
    feeds = generate_inputs(model, seed=3)
    acts = capture_activations(model, feeds)
    ref = run_model(model, feeds, keep_intermediates=True)
    produced = [o.name for n in model.graph.nodes for o in n.outputs]
    assert set(produced) <= set(acts)
    for name in produced:
        np.testing.assert_allclose(acts[name], ref[name], rtol=1e-5, atol=1e-4, err_msg=name)
    assert set(feeds) <= set(acts)


def test_subgraph_model_runs_just_the_nodes():

    original = parse_model(GELU_AND_NEGEXP)
    feeds = generate_inputs(original)
    acts = capture_activations(original, feeds)
    nodes = [n for n in original.graph.nodes if n.name in ("erf", "add")]
    proto = subgraph_model(original, nodes, ["s"], ["a"], arrays=acts)
    assert [i.name for i in proto.graph.input] == ["s"]
    assert [t.name for t in proto.graph.initializer] == ["one"]
    sess = ort_session(proto, "all")
    (out,) = sess.run(None, {"s": acts["s"]})
    np.testing.assert_allclose(out, acts["a"], rtol=1e-6)


def test_end_to_end_reports_each_output():
    original, fused, _, feeds, _ = fuse(GELU_AND_NEGEXP, [GELU, NEG_EXP])
    res = end_to_end(original, fused, feeds)
    assert set(res) == {"y", "z"} and all(r["passed"] for r in res.values())
    assert res["y"]["max_abs"] < 1e-4
    wrong = fuse_only(GELU_AND_NEGEXP, [WRONG], {"neg_exp_wrong"})
    assert not end_to_end(original, wrong, feeds)["z"]["passed"]


def test_compare_tensors_edge_cases():
    a = np.array([1.0, 0.0, -2.0], np.float32)
    assert compare_tensors(a, a) == {
        "cosine": 1.0,
        "max_abs": 0.0,
        "max_rel": 0.0,
        "nonfinite": 0.0,
    }
    assert compare_tensors(np.zeros(3), np.zeros(3))["cosine"] == 1.0
    assert compare_tensors(np.zeros(3), a)["cosine"] == 0.0
    s = compare_tensors(np.array([1.0, np.inf, 0.0]), a)
    assert s["nonfinite"] == 1.0 and s["cosine"] == 0.0
    assert compare_tensors(a, a[:2])["cosine"] == 0.0
    rel = compare_tensors(np.array([1e-9, 1.0]), np.array([0.0, 1.0]))
    assert rel["max_rel"] == pytest.approx(1e-6)  # measured against 1e-3 * max|ref|


def test_compare_tensors_measures_float32_pairs_as_float64_does():
    """Two float32 tensors are compared in float32 with float64 dot products: the same
    statistics as widening both first, on close and on far tensors, masks and inf alike."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(100_000).astype(np.float32)
    for b in (
        a + rng.standard_normal(a.size).astype(np.float32) * 1e-5,
        a + rng.standard_normal(a.size).astype(np.float32),
        np.where(rng.random(a.size) < 0.1, np.float32(np.finfo(np.float32).min), a),
    ):
        got, wide = (
            compare_tensors(a, b),
            compare_tensors(a.astype(np.float64), b.astype(np.float64)),
        )
        assert got["cosine"] == pytest.approx(wide["cosine"], abs=1e-12)
        assert got["max_abs"] == pytest.approx(wide["max_abs"], rel=1e-6)
        assert got["max_rel"] == pytest.approx(wide["max_rel"], rel=1e-6)
    c = a.copy()
    c[7] = np.inf
    assert compare_tensors(c, a)["nonfinite"] == 1.0
    assert compare_tensors(c, c)["cosine"] == 1.0  # the same inf in the same place


def test_generate_inputs_ranges():
    model = parse_model(
        "graph g(%input_ids: i64[B,S], %attention_mask: i64[B,S], %token_type_ids: i64[B,S], "
        "%position_ids: i64[B,S], %pixel: f16[B,3,8,8]) -> (%e) {\n"
        "  init %table: f32[50,4] = randn(0)\n"
        "  %e = Gather<axis=0>(%table, %input_ids)\n}"
    )
    f = generate_inputs(model, batch=2, seq_len=5)
    assert f["input_ids"].shape == (2, 5) and f["input_ids"].max() < 50
    assert (f["attention_mask"] == 1).all() and (f["token_type_ids"] == 0).all()
    assert (f["position_ids"] == np.arange(5)).all()
    assert f["pixel"].dtype == np.float16 and f["pixel"].shape == (2, 3, 8, 8)


@pytest.mark.slow
def test_generate_inputs_on_bert_token_ids_within_vocab():
    from graph_autofusion.testing.rules import zoo_model

    model = zoo_model("bert", "dynamo")
    f = generate_inputs(model, seq_len=32)
    ids = f["input_ids"]
    assert ids.shape == (1, 32) and ids.dtype == np.int64
    assert 0 <= ids.min() and ids.max() < 30522 and ids.max() > 512  # the vocab, not a guess
    assert (f["attention_mask"] == 1).all() and (f["token_type_ids"] == 0).all()
    acts = capture_activations(model, f)
    assert len(acts) > len(model.graph.nodes)  # every intermediate, plus the feeds
    e2e = end_to_end(model, model, f)
    assert all(r["passed"] for r in e2e.values())


def test_missing_activation_is_an_error_not_a_pass():
    original, fused, records, _, acts = fuse(GELU_AND_NEGEXP, [GELU])
    partial = {k: v for k, v in acts.items() if k != "x"}
    res = check_fusion(original, fused, records["gelu_erf"], partial, check_speed=False)
    assert not res.passed and res.code == "error" and "%x" in res.message
