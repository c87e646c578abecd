"""matmul_bias_activation: linear layer + any supported activation (generic form)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.matmul_bias_activation import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
model opset {{"": 20, "com.microsoft": 1}}
graph g(%x: f32[2,4,16]) -> (%y) {{
  init %w: f32[16,8] = randn(1)
  init %b: f32[8] = randn(2)
  init %sqrt2: f32[] = [1.4142135381698608]
  init %three: f32[] = [3.0]
  init %cubic: f32[] = [0.044714998453855515]
  init %k: f32[] = [0.7978845834732056]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %m = MatMul(%x, %w)
  %h = Add(%m, %b)
  {act}
}}
"""
ACTS = {
    "relu": "%y = Relu(%h)",
    "sigmoid": "%y = Sigmoid(%h)",
    "tanh": "%y = Tanh(%h)",
    "leaky_relu": "%y = LeakyRelu<alpha=0.1>(%h)",
    "gelu_op": "%y = Gelu(%h)",
    "gelu_op_tanh": '%y = Gelu<approximate="tanh">(%h)',
    "ms_gelu": "%y = com.microsoft::Gelu(%h)",
    "gelu_erf": "%s = Div(%h, %sqrt2)\n  %e = Erf(%s)\n  %a = Add(%one, %e)\n"
    "  %q = Mul(%h, %half)\n  %y = Mul(%q, %a)",
    "gelu_tanh": "%c = Pow(%h, %three)\n  %cm = Mul(%c, %cubic)\n  %i = Add(%h, %cm)\n"
    "  %s = Mul(%i, %k)\n  %t = Tanh(%s)\n  %a = Add(%t, %one)\n  %q = Mul(%h, %a)\n"
    "  %y = Mul(%q, %half)",
    "silu": "%sg = Sigmoid(%h)\n  %y = Mul(%sg, %h)",
}


@pytest.mark.parametrize("act", sorted(ACTS))
def test_every_activation_matches_and_rewrites(act):
    text = GRAPH.format(act=ACTS[act])
    check_rule(RULE, text, matches=1, ops_after=["graph_autofusion.fused::MatMulBiasActivation"])


def test_reshape_between_bias_and_activation():
    text = GRAPH.format(act="%r = Reshape(%h, %shape)\n  %y = Relu(%r)").replace(
        "init %half", "init %shape: i64[2] = [8, 8]\n  init %half"
    )
    check_rule(RULE, text, matches=1)


def test_bias_less_gemm_with_bias_add():
    text = GRAPH.format(act=ACTS["relu"]).replace("f32[2,4,16]", "f32[4,16]")
    check_rule(RULE, text.replace("MatMul(", "Gemm("), matches=1)


def test_a_subtracted_bias_is_not_this_rule():
    text = GRAPH.format(act=ACTS["relu"]).replace("Add(%m, %b)", "Sub(%m, %b)")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_non_constant_bias_is_rejected():
    text = GRAPH.format(act=ACTS["relu"]).replace("Add(%m, %b)", "Add(%m, %m)")
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("bert", "dynamo", 12),  # FFN up projection + GELU
        ("bert", "torchscript", 12),
        ("bert", "torch", 13),  # + the pooler's MatMul + Add + Tanh
        ("minilm", "dynamo", 6),
        ("minilm", "torchscript", 6),
        ("minilm", "torch", 6),
        ("gpt2", "torch", 12),  # 2-D linear, Reshape, tanh GELU
        ("gpt2", "dynamo", 0),  # no bias add
        ("gpt2", "torchscript", 0),  # bias inside Gemm
        ("lstm", "dynamo", 1),  # the input projection + Tanh
        ("llama", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
