"""gelu_erf: every exporter spelling matches; near misses do not; rewrite keeps the numbers."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.gelu_erf import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,8,16]) -> (%y) {{
  init %c: f32[] = [{c}]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %s = {scale_op}(%x, %c)
  %e = Erf(%s)
  %a = Add({add_args})
  {tail}
}}
"""
TAILS = {
    "half_last": "%m = Mul(%x, %a)\n  %y = Mul(%m, %half)",
    "half_first": "%h = Mul(%x, %half)\n  %y = Mul(%h, %a)",
    "half_first_swapped": "%h = Mul(%half, %x)\n  %y = Mul(%a, %h)",
}
SCALES = {"Div": 1.4142135381698608, "Mul": 0.7071067811865476}


@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("scale_op", sorted(SCALES))
@pytest.mark.parametrize("add_args", ["%e, %one", "%one, %e"])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(tail, scale_op, add_args, native):
    text = GRAPH.format(c=SCALES[scale_op], scale_op=scale_op, add_args=add_args, tail=TAILS[tail])
    ops = ["com.microsoft::Gelu"] if native else ["graph_autofusion.fused::Gelu"]
    check_rule(RULE, text, matches=1, ops_after=ops, native=native)


def test_wrong_constant_is_rejected():
    text = GRAPH.format(c=2.0, scale_op="Div", add_args="%e, %one", tail=TAILS["half_last"])
    check_no_match(RULE, text, reason=Reason.VALUE_MISMATCH)


def test_external_reader_of_an_internal_value_blocks_the_match():
    text = GRAPH.format(
        c=1.4142135381698608, scale_op="Div", add_args="%e, %one", tail=TAILS["half_last"]
    ).replace("-> (%y)", "-> (%y, %e)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


def test_tanh_instead_of_erf_is_not_this_rule():
    text = GRAPH.format(
        c=1.4142135381698608, scale_op="Div", add_args="%e, %one", tail=TAILS["half_last"]
    ).replace("Erf(", "Tanh(")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("bert", "torchscript", 12),  # the exporter spells GELU out
        ("minilm", "torchscript", 6),
        ("bert", "dynamo", 0),  # dynamo and the torch frontend keep one Gelu operator
        ("bert", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
