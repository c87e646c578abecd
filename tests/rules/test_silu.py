"""silu: x * sigmoid(x) -> QuickGelu(alpha=1); the scaled QuickGELU form is not SiLU."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.silu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,8,16]) -> (%y) {{
  init %alpha: f32[] = [1.702]
  %s = Sigmoid({sig_in})
  %y = Mul({mul_args})
}}
"""


@pytest.mark.parametrize("mul_args", ["%x, %s", "%s, %x"])
@pytest.mark.parametrize("native", [False, True])
def test_matches_and_rewrites(mul_args, native):
    text = GRAPH.format(sig_in="%x", mul_args=mul_args)
    ops = ["com.microsoft::QuickGelu"] if native else ["graph_autofusion.fused::QuickGelu"]
    model = check_rule(RULE, text, matches=1, ops_after=ops, native=native)
    if native:
        assert model.graph.nodes[0].attrs["alpha"] == 1.0


def test_quick_gelu_form_is_not_silu():
    text = GRAPH.format(sig_in="%xa", mul_args="%x, %s").replace(
        "  %s = ", "  %xa = Mul(%x, %alpha)\n  %s = "
    )
    check_no_match(RULE, text, reason=Reason.BINDING_CONFLICT)  # Sigmoid reads 1.702 * x


def test_sigmoid_with_another_reader_is_rejected():
    text = GRAPH.format(sig_in="%x", mul_args="%x, %s").replace("-> (%y)", "-> (%y, %s)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


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
