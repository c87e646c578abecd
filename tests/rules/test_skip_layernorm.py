"""skip_layernorm: residual Add (+ bias) -> LayerNorm; sum exported; native SkipLayerNormalization."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.skip_layernorm import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import check_no_match, check_rule, random_feeds

GRAPH = """
graph g(%a: f32[2,8,16], %b: {b_t}) -> ({outs}) {{
  init %g: f32[16] = randn(1)
  init %be: f32[16] = randn(2)
  init %bias: f32[16] = randn(3)
  init %c: f32[16] = randn(4)
  {sum}
  %y = LayerNormalization<axis={axis}, epsilon=1e-05>(%s, %g{beta})
  %z = Add(%s, %c)
}}
"""
SUMS = {
    "plain": "%s: f32[2,8,16] = Add(%a, %b)",
    "swapped": "%s: f32[2,8,16] = Add(%b, %a)",
    "bias": "%t: f32[2,8,16] = Add(%a, %bias)\n  %s: f32[2,8,16] = Add(%t, %b)",
    "bias_swapped": "%t: f32[2,8,16] = Add(%bias, %b)\n  %s: f32[2,8,16] = Add(%a, %t)",
}
MS_SKIP = "com.microsoft::SkipLayerNormalization"
GENERIC = "graph_autofusion.fused::SkipLayerNormalization"


def graph(sum_="plain", *, beta=", %be", axis=-1, outs="%y", b_t="f32[2,8,16]") -> str:
    text = GRAPH.format(sum=SUMS[sum_], beta=beta, axis=axis, outs=outs, b_t=b_t)
    return text if "%z" in outs else text.replace("  %z = Add(%s, %c)\n", "")


@pytest.mark.parametrize("sum_", sorted(SUMS))
@pytest.mark.parametrize("beta", [", %be", ""], ids=["beta", "no_beta"])
@pytest.mark.parametrize("axis", [-1, 2])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(sum_, beta, axis, native):
    ops = [MS_SKIP] if native else [GENERIC]
    check_rule(RULE, graph(sum_, beta=beta, axis=axis), matches=1, ops_after=ops, native=native)


@pytest.mark.parametrize("sum_", sorted(SUMS))
@pytest.mark.parametrize("native", [False, True])
def test_sum_read_later_is_exported(sum_, native):
    # the next residual add (%z) reads the sum: the fused op outputs it (4th output natively)
    ops = [MS_SKIP if native else GENERIC, "Add"]
    model = check_rule(
        RULE, graph(sum_, outs="%y, %z"), matches=1, ops_after=ops, native=native, atol=1e-5
    )
    fused = model.graph.nodes[0]
    reader = model.graph.nodes[1]
    assert reader.inputs[0].producer is fused
    if native:
        assert reader.inputs[0].index == 3  # input_skip_bias_sum
        assert [v is not None for v in fused.inputs] == (
            [True] * 5 if "bias" in sum_ else [True] * 4
        )


@pytest.mark.parametrize("native", [False, True])
def test_broadcast_skip_operand(native):
    # a (1, S, H) skip, e.g. BERT's position embedding, is valid for the contrib op
    ops = [MS_SKIP] if native else [GENERIC]
    check_rule(RULE, graph("swapped", b_t="f32[1,8,16]"), matches=1, ops_after=ops, native=native)


def test_bias_read_elsewhere_stays_outside():
    # the biased value has another reader: the rule fuses only input + skip, the bias add stays
    text = graph("bias", outs="%y, %t")
    model = check_rule(RULE, text, matches=1, ops_after=["Add", MS_SKIP], native=True)
    fused = model.graph.nodes[1]
    assert len([v for v in fused.inputs if v is not None]) == 4


def test_layernorm_over_two_axes_is_rejected():
    check_no_match(RULE, graph("bias", axis=1), reason=Reason.CHECK_FAILED)


def test_sub_is_not_a_residual_add():
    check_no_match(RULE, graph().replace("Add(%a, %b)", "Sub(%a, %b)"), reason=Reason.OP_MISMATCH)


def test_layernorm_of_a_graph_input_is_not_this_rule():
    text = graph().replace("1e-05>(%s", "1e-05>(%a").replace("  %s = Add(%a, %b)\n", "")
    check_no_match(RULE, text, reason=Reason.NO_PRODUCER)


def _native_errors(text: str) -> list[str]:
    model = parse_model(text)
    report = match_rules(model.graph, RuleSet((RULE,)))
    assert report.per_rule[RULE.name].kept == 1
    return [a.error for a in apply_matches(model, report.kept, native=True) if a.error]


def test_native_declines_a_skip_broadcast_over_the_sequence():
    # (B, 1, H) is not a skip shape the contrib op accepts: generic form only
    text = graph(b_t="f32[2,1,16]")
    errors = _native_errors(text)
    assert len(errors) == 1 and "Skip*LayerNormalization" in errors[0]
    check_rule(RULE, text, matches=1, ops_after=[GENERIC])


def test_native_declines_when_mean_output_is_read():
    text = graph().replace("%y = LayerNormalization", "%y, %mean = LayerNormalization")
    text = text.replace("-> (%y)", "-> (%y, %mean)")
    errors = _native_errors(text)
    assert len(errors) == 1 and "Mean/InvStdDev" in errors[0]


def test_native_rewrite_runs_in_onnxruntime():
    pytest.importorskip("onnxruntime")

    text = graph("bias", beta="", outs="%y, %z")
    original = parse_model(text)
    model = check_rule(RULE, text, matches=1, ops_after=[MS_SKIP, "Add"], native=True)
    feeds = random_feeds(original.graph, 3)
    want = run_model(original, feeds)
    sess = ort_session(model, "all")
    got = sess.run(None, feeds)
    for name, value in zip([o.name for o in sess.get_outputs()], got):
        np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "count"),
    [
        # 12 layers x 2 (attention and FFN residuals) + the embedding sum (word + token type
        # + position) -> embeddings.LayerNorm, which is a 25th Add -> LayerNorm and counts
        ("bert", 25),
        ("minilm", 13),  # 6 layers x 2 + the embedding sum
        # pre-LN: 12 x (ln_1, ln_2) + ln_f all read a residual sum (ln_1 of layer 0 reads
        # wte + wpe); 24 of those sums are also read by the next residual add (exported)
        ("gpt2", 25),
        ("llama", 0),  # RMSNorm, not LayerNorm
        ("resnet50", 0),
    ],
)
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


@pytest.mark.slow
@pytest.mark.parametrize(("model", "source"), [("gpt2", "torchscript"), ("bert", "dynamo")])
def test_zoo_native_rewrite_applies_everywhere(model, source):
    from graph_autofusion.ir.verify import verify
    from graph_autofusion.testing.rules import zoo_model

    fresh = zoo_model.__wrapped__(model, source)  # a private copy to mutate
    report = match_rules(fresh.graph, RuleSet((RULE,)))
    applied = apply_matches(fresh, report.kept, native=True)
    assert [a.error for a in applied if a.error] == []
    verify(fresh)
    ops = [n.op_type for n in fresh.graph.nodes]
    assert ops.count("SkipLayerNormalization") == 25 and "LayerNormalization" not in ops
