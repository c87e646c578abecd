"""quick_gelu: x * sigmoid(1.702 * x) -> QuickGelu(alpha=1.702)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.quick_gelu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,8,16]) -> (%y) {{
  init %alpha: f32[] = [{alpha}]
  %xa = Mul({scale_args})
  %s = Sigmoid(%xa)
  %y = Mul({mul_args})
}}
"""


def graph(alpha=1.702, scale_args="%x, %alpha", mul_args="%x, %s"):
    return GRAPH.format(alpha=alpha, scale_args=scale_args, mul_args=mul_args)


@pytest.mark.parametrize("scale_args", ["%x, %alpha", "%alpha, %x"])
@pytest.mark.parametrize("mul_args", ["%x, %s", "%s, %x"])
@pytest.mark.parametrize("native", [False, True])
def test_matches_and_rewrites(scale_args, mul_args, native):
    ops = ["com.microsoft::QuickGelu"] if native else ["graph_autofusion.fused::QuickGelu"]
    model = check_rule(
        RULE, graph(1.702, scale_args, mul_args), matches=1, ops_after=ops, native=native
    )
    if native:
        assert model.graph.nodes[0].attrs["alpha"] == pytest.approx(1.702)


def test_other_scale_is_rejected():
    check_no_match(RULE, graph(alpha=1.0), reason=Reason.VALUE_MISMATCH)


def test_plain_silu_is_not_quick_gelu():
    text = graph().replace("  %xa = Mul(%x, %alpha)\n", "").replace("Sigmoid(%xa)", "Sigmoid(%x)")
    check_no_match(RULE, text, reason=Reason.NO_PRODUCER)


def test_scaled_value_with_another_reader_is_rejected():
    check_no_match(RULE, graph().replace("-> (%y)", "-> (%y, %xa)"), reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source"),
    [(m, s) for m in ("llama", "bert", "gpt2") for s in ("dynamo", "torchscript", "torch")],
)
def test_zoo_models(model, source):
    """No zoo model uses QuickGELU (Llama's SiLU must not count)."""
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == 0
