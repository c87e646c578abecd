"""layernorm_add: LayerNorm -> Add; generic form, native only when a constant bias folds into
the LayerNorm's beta."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.layernorm_add import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,8,16], %r: f32[2,8,16]) -> ({outs}) {{
  init %g: f32[16] = randn(1)
  init %be: f32[16] = randn(2)
  init %bias: {bias_t} = randn(3)
  %y: f32[2,8,16] = LayerNormalization<axis={axis}, epsilon=1e-05>(%x, %g{beta})
  %o: f32[2,8,16] = Add({args})
}}
"""
GENERIC = "graph_autofusion.fused::LayerNormAdd"


def graph(args="%y, %r", *, beta=", %be", axis=-1, bias_t="f32[16]", outs="%o") -> str:
    return GRAPH.format(args=args, beta=beta, axis=axis, bias_t=bias_t, outs=outs)


def native_errors(text: str) -> list[str]:
    model = parse_model(text)
    report = match_rules(model.graph, RuleSet((RULE,)))
    assert report.per_rule[RULE.name].kept == 1
    return [a.error for a in apply_matches(model, report.kept, native=True) if a.error]


@pytest.mark.parametrize("args", ["%y, %r", "%r, %y", "%y, %x", "%y, %bias", "%bias, %y"])
@pytest.mark.parametrize("beta", [", %be", ""], ids=["beta", "no_beta"])
@pytest.mark.parametrize("axis", [-1, 2])
def test_generic_form(args, beta, axis):
    check_rule(RULE, graph(args, beta=beta, axis=axis), matches=1, ops_after=[GENERIC])


@pytest.mark.parametrize("bias_t", ["f32[16]", "f32[1,1,16]", "f32[1]", "f32[]"])
@pytest.mark.parametrize("args", ["%y, %bias", "%bias, %y"])
@pytest.mark.parametrize("beta", [", %be", ""], ids=["beta", "no_beta"])
def test_constant_bias_folds_into_beta(bias_t, args, beta):
    model = check_rule(
        RULE,
        graph(args, beta=beta, bias_t=bias_t),
        matches=1,
        ops_after=["LayerNormalization"],
        native=True,
    )
    ln = model.graph.nodes[0]
    assert ln.inputs[2] is not None and ln.inputs[2].shape == (16,)
    assert ln.attrs["epsilon"] == pytest.approx(1e-5)


def test_residual_has_no_native_form():
    errors = native_errors(graph("%y, %r"))
    assert len(errors) == 1 and "not a constant bias" in errors[0]


def test_bias_varying_along_the_sequence_has_no_native_form():
    text = graph("%y, %bias", bias_t="f32[8,1]")
    errors = native_errors(text)
    assert len(errors) == 1 and "outside the last axis" in errors[0]
    check_rule(RULE, text, matches=1, ops_after=[GENERIC])


def test_layernorm_output_read_elsewhere_blocks_the_match():
    # BERT's post-LN stream: the norm's output also feeds the next block
    check_no_match(RULE, graph(outs="%o, %y"), reason=Reason.EXTERNAL_USER)


def test_layernorm_over_two_axes_is_rejected():
    check_no_match(RULE, graph(axis=1), reason=Reason.CHECK_FAILED)


def test_other_producer_is_not_a_layernorm():
    text = graph().replace("LayerNormalization<axis=-1, epsilon=1e-05>(%x, %g, %be)", "Relu(%x)")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert", "gpt2", "minilm", "llama"])
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_models(model, source):
    # No zoo graph adds to a LayerNorm output that nothing else reads: BERT/MiniLM's post-LN
    # outputs feed both the next block's projections and its residual add; GPT-2's pre-LN
    # outputs feed projections only; Llama has no LayerNormalization.
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == 0
