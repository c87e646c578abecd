"""swiglu: silu(gate) * up, with the gate/up MatMuls of one x when present (generic form)."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.library.swiglu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,8,16], %x2: f32[2,8,16]) -> (%y) {{
  init %wg: f32[16,32] = randn(1)
  init %wu: f32[16,32] = randn(2)
  %g = MatMul(%x, %wg)
  %u = MatMul({up_in}, %wu)
  %s = Sigmoid(%g)
  %a = Mul({silu_args})
  %y = Mul({mul_args})
}}
"""


def graph(up_in="%x", silu_args="%g, %s", mul_args="%a, %u"):
    return GRAPH.format(up_in=up_in, silu_args=silu_args, mul_args=mul_args)


@pytest.mark.parametrize("silu_args", ["%g, %s", "%s, %g"])
@pytest.mark.parametrize("mul_args", ["%a, %u", "%u, %a"])
def test_gated_projection_matches_with_both_matmuls(silu_args, mul_args):
    text = graph(silu_args=silu_args, mul_args=mul_args)
    model = parse_model(text)
    match = match_rules(model.graph, RuleSet((RULE,))).kept[0].match
    assert sorted(n.op_type for n in match.nodes) == ["MatMul", "MatMul", "Mul", "Mul", "Sigmoid"]
    check_rule(RULE, text, matches=1, ops_after=["graph_autofusion.fused::SwiGLU"])


def test_up_from_another_input_fuses_the_elementwise_part():
    check_rule(
        RULE,
        graph(up_in="%x2"),
        matches=1,
        ops_after=["MatMul", "MatMul", "graph_autofusion.fused::SwiGLU"],
    )


def test_gate_sigmoid_of_another_value_is_rejected():
    text = graph().replace("Sigmoid(%g)", "Sigmoid(%u)")
    check_no_match(RULE, text, reason=Reason.BINDING_CONFLICT)


def test_silu_with_another_reader_is_rejected():
    check_no_match(RULE, graph().replace("-> (%y)", "-> (%y, %a)"), reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        *[("llama", s, 4) for s in ("dynamo", "torchscript", "torch")],  # one per layer
        *[("llama_gqa", s, 4) for s in ("dynamo", "torchscript", "torch")],
        ("bert", "dynamo", 0),
        ("gpt2", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


@pytest.mark.slow
def test_llama_matches_take_in_both_projections():
    from graph_autofusion.testing.rules import zoo_model

    graph_ = zoo_model("llama", "dynamo").graph
    for rm in match_rules(graph_, RuleSet((RULE,))).kept:
        assert {"gate", "up"} <= set(rm.match.labels)
