"""add_relu: Relu(a + b) with two computed operands (residual join), generic form."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.add_relu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,4,8,8], %r: {r_t}) -> ({outs}) {{
  init %c: f32[4,1,1] = randn(3)
  %t = Tanh(%x)
  %a = Add({args})
  %y = Relu(%a)
}}
"""


def graph(args="%t, %r", *, r_t="f32[2,4,8,8]", outs="%y") -> str:
    return GRAPH.format(args=args, r_t=r_t, outs=outs)


@pytest.mark.parametrize(
    ("args", "r_t"),
    [
        ("%t, %r", "f32[2,4,8,8]"),
        ("%r, %t", "f32[2,4,8,8]"),
        ("%t, %r", "f32[4,1,1]"),  # broadcasting operand, still computed at run time
        ("%t, %t", "f32[2,4,8,8]"),
    ],
)
def test_every_variant_matches_and_rewrites(args, r_t):
    check_rule(
        RULE, graph(args, r_t=r_t), matches=1, ops_after=["Tanh", "graph_autofusion.fused::AddRelu"]
    )


def test_constant_bias_is_not_a_residual():
    check_no_match(RULE, graph("%t, %c"), reason=Reason.CHECK_FAILED)


def test_sum_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph(outs="%y, %a"), reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet50", "resnet50_bn"])
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_models(model, source):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == 16  # one per bottleneck


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_transformer_has_none(source):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, "bert", source) == 0
