"""gelu_tanh: every exporter spelling matches; near misses do not; rewrite keeps the numbers."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.gelu_tanh import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,8,16]) -> (%y) {{
  init %three: f32[] = [3.0]
  init %cubic: f32[] = [{cubic}]
  init %k: f32[] = [0.7978845834732056]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  {inner}
  %s = Mul({s_args})
  %t = Tanh(%s)
  %a = Add(%t, %one)
  {tail}
}}
"""
INNERS = {
    # x + 0.044715 * x^3 (GPT-2 through every exporter)
    "pow": "%c = Pow(%x, %three)\n  %m = Mul(%c, %cubic)\n  %i = Add(%x, %m)",
    "mul_cube": "%q = Mul(%x, %x)\n  %c = Mul(%q, %x)\n  %m = Mul(%cubic, %c)\n  %i = Add(%m, %x)",
    "mul_cube_swapped": "%q = Mul(%x, %x)\n  %c = Mul(%x, %q)\n  %m = Mul(%c, %cubic)\n"
    "  %i = Add(%x, %m)",
    # x * (1 + 0.044715 * x * x)
    "factored": "%q = Mul(%x, %x)\n  %m = Mul(%q, %cubic)\n  %f = Add(%one, %m)\n"
    "  %i = Mul(%x, %f)",
}
TAILS = {
    "half_first": "%h = Mul(%x, %half)\n  %y = Mul(%h, %a)",
    "half_last": "%h = Mul(%x, %a)\n  %y = Mul(%half, %h)",
    "half_on_add": "%h = Mul(%a, %half)\n  %y = Mul(%x, %h)",
}


def graph(inner="pow", tail="half_first", s_args="%i, %k", cubic=0.044714998453855515):
    return GRAPH.format(inner=INNERS[inner], tail=TAILS[tail], s_args=s_args, cubic=cubic)


@pytest.mark.parametrize("inner", sorted(INNERS))
@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("s_args", ["%i, %k", "%k, %i"])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(inner, tail, s_args, native):
    ops = ["com.microsoft::FastGelu"] if native else ["graph_autofusion.fused::FastGelu"]
    check_rule(RULE, graph(inner, tail, s_args), matches=1, ops_after=ops, native=native)


#: BLOOM's bloom_gelu: x * 0.5 * (1.0 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
BLOOM = """
graph g(%x: f32[2,8,16]) -> (%y) {
  init %cubic: f32[] = [0.044714998453855515]
  init %k: f32[] = [0.7978845834732056]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %h = Mul(%x, %half)
  %kx = Mul(%k, %x)
  %cx = Mul(%cubic, %x)
  %q = Mul(%cx, %x)
  %f = Add(%one, %q)
  %s = Mul(%kx, %f)
  %t = Tanh(%s)
  %a = Add(%one, %t)
  %y = Mul(%h, %a)
}
"""


@pytest.mark.parametrize("native", [False, True])
def test_blooms_spelling_matches_and_rewrites(native):
    ops = ["com.microsoft::FastGelu"] if native else ["graph_autofusion.fused::FastGelu"]
    check_rule(RULE, BLOOM, matches=1, ops_after=ops, native=native)


def test_wrong_cubic_coefficient_is_rejected():
    check_no_match(RULE, graph(cubic=0.05), reason=Reason.VALUE_MISMATCH)


def test_external_reader_of_the_tanh_blocks_the_match():
    text = graph().replace("-> (%y)", "-> (%y, %t)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


def test_erf_instead_of_tanh_is_not_this_rule():
    check_no_match(RULE, graph().replace("Tanh(", "Erf("), reason=Reason.OP_MISMATCH)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("gpt2", "dynamo", 12),  # GPT-2's gelu_new, spelled with Pow(x, 3) by every source
        ("gpt2", "torchscript", 12),
        ("gpt2", "torch", 12),
        ("bert", "torchscript", 0),  # BERT's GELU is the erf form
        ("bert", "dynamo", 0),
        ("llama", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
