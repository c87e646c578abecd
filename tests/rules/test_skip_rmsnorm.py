"""skip_rmsnorm: residual Add (+ bias) -> RMSNorm; sum (and its float32 Cast) exported; native
com.microsoft SkipSimplifiedLayerNormalization."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.skip_rmsnorm import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import check_no_match, check_rule, random_feeds

GRAPH = """
graph g(%a: f32[2,8,16], %b: f32[2,8,16]) -> ({outs}) {{
  init %w: f32[16] = randn(1)
  init %bias: f32[16] = randn(3)
  init %c: f32[16] = randn(4)
  init %two: f32[] = [2.0]
  init %eps: f32[] = [1e-06]
  init %one: f32[] = [1.0]
  init %axes: i64[1] = [{axis}]
  {sum}
  %xc: f32[2,8,16] = Cast<to=1>(%s)
  %sq = Pow(%xc, %two)
  %ms: f32[2,8,1] = ReduceMean<keepdims=1>(%sq, %axes)
  %ve = Add(%ms, %eps)
  %r = Sqrt(%ve)
  {inv}
  %n = Mul(%xc, %i)
  %nc = Cast<to=1>(%n)
  %y = Mul(%w, %nc)
  %z = Add(%s, %c)
  %z2 = Add(%xc, %c)
}}
"""
SUMS = {
    "plain": "%s: f32[2,8,16] = Add(%a, %b)",
    "swapped": "%s: f32[2,8,16] = Add(%b, %a)",
    "bias": "%t: f32[2,8,16] = Add(%a, %bias)\n  %s: f32[2,8,16] = Add(%t, %b)",
    "bias_swapped": "%t: f32[2,8,16] = Add(%bias, %b)\n  %s: f32[2,8,16] = Add(%a, %t)",
}
INVS = {"reciprocal": "%i = Reciprocal(%r)", "div_one": "%i = Div(%one, %r)"}
NATIVE = "com.microsoft::SkipSimplifiedLayerNormalization"
GENERIC = "graph_autofusion.fused::SkipSimplifiedLayerNormalization"


def graph(sum_="plain", inv="reciprocal", *, casts=True, later=(), axis=-1, outs=None) -> str:
    """``later``: which residual reads follow the norm: ``"sum"`` (%z reads the sum) and/or
    ``"cast"`` (%z2 reads the float32 copy of the sum, as torchscript's Llama does)."""
    names = ["%y"] + [{"sum": "%z", "cast": "%z2"}[k] for k in later]
    text = GRAPH.format(sum=SUMS[sum_], inv=INVS[inv], axis=axis, outs=outs or ", ".join(names))
    if "sum" not in later:
        text = text.replace("  %z = Add(%s, %c)\n", "")
    if "cast" not in later:
        text = text.replace("  %z2 = Add(%xc, %c)\n", "")
    if not casts:
        text = text.replace("  %xc: f32[2,8,16] = Cast<to=1>(%s)\n", "").replace("%xc", "%s")
        text = text.replace("  %nc = Cast<to=1>(%n)\n", "").replace("%nc", "%n")
    return text


def ops_after(native: bool, later=()) -> list[str]:
    ops = [NATIVE if native else GENERIC]
    if native and "cast" in later:
        ops.append("Cast")  # the float32 copy of the sum, redone on the exported sum
    return ops + ["Add"] * len(later)


@pytest.mark.parametrize("sum_", sorted(SUMS))
@pytest.mark.parametrize("inv", sorted(INVS))
@pytest.mark.parametrize("casts", [True, False], ids=["casts", "no_casts"])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(sum_, inv, casts, native):
    text = graph(sum_, inv, casts=casts)
    check_rule(RULE, text, matches=1, ops_after=ops_after(native), native=native, rtol=1e-4)


@pytest.mark.parametrize(
    ("later", "casts"),
    [(("sum",), True), (("sum",), False), (("cast",), True), (("sum", "cast"), True)],
)
@pytest.mark.parametrize("sum_", ["plain", "bias"])
@pytest.mark.parametrize("native", [False, True])
def test_sum_read_later_is_exported(later, casts, sum_, native):
    text = graph(sum_, casts=casts, later=later)
    model = check_rule(
        RULE, text, matches=1, ops_after=ops_after(native, later), native=native, rtol=1e-4
    )
    fused = model.graph.nodes[0]
    if native and "sum" in later:
        reader = model.graph.nodes[-len(later)]
        assert reader.inputs[0].producer is fused and reader.inputs[0].index == 3


def test_native_inputs_and_epsilon():
    model = check_rule(RULE, graph("bias"), matches=1, ops_after=ops_after(True), native=True)
    node = model.graph.nodes[0]
    assert [v.name for v in node.inputs] == ["a", "b", "w", "bias"]
    assert node.attrs["epsilon"] == pytest.approx(1e-6)


def test_reduction_over_another_axis_is_rejected():
    check_no_match(RULE, graph(axis=1), reason=Reason.CHECK_FAILED)


def test_internal_value_read_outside_blocks_the_match():
    check_no_match(RULE, graph(outs="%y, %ms"), reason=Reason.EXTERNAL_USER)


def test_difference_is_not_a_residual_sum():
    text = graph().replace("= Add(%a, %b)", "= Sub(%a, %b)")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_native_rewrite_runs_in_onnxruntime():
    pytest.importorskip("onnxruntime")

    text = graph("bias", "div_one", later=("sum", "cast"))
    original = parse_model(text)
    model = check_rule(
        RULE, text, matches=1, ops_after=ops_after(True, ("sum", "cast")), native=True, rtol=1e-4
    )
    feeds = random_feeds(original.graph, 7)
    want = run_model(original, feeds)
    sess = ort_session(model, "all")
    for out, value in zip(sess.get_outputs(), sess.run(None, feeds)):
        np.testing.assert_allclose(value, want[out.name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "count"),
    [
        # 4 layers x 2 residual adds, each feeding the next RMSNorm (post_attention_layernorm,
        # the next layer's input_layernorm, or the final norm); layer 0's input_layernorm reads
        # the embedding, not a sum, and stays with the plain rmsnorm rule
        ("llama", 8),
        ("llama_gqa", 8),
        ("bert", 0),
        ("gpt2", 0),
    ],
)
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript"])
def test_zoo_native_rewrite_applies_everywhere(source):
    from graph_autofusion.ir.verify import verify
    from graph_autofusion.testing.rules import zoo_model

    fresh = zoo_model.__wrapped__("llama", source)  # a private copy to mutate
    report = match_rules(fresh.graph, RuleSet((RULE,)))
    applied = apply_matches(fresh, report.kept, native=True)
    assert [a.error for a in applied if a.error] == []
    verify(fresh)
    ops = [n.op_type for n in fresh.graph.nodes]
    assert ops.count("SkipSimplifiedLayerNormalization") == 8
