"""matmul_relu: MatMul -> Relu, no bias (generic form)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.matmul_relu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[{xshape}]) -> (%y) {{
  init %w: f32[16,8] = randn(1)
  %m = MatMul(%x, %w)
  %y = Relu(%m)
}}
"""


@pytest.mark.parametrize("xshape", ["4,16", "2,4,16"])
def test_matches_and_rewrites(xshape):
    check_rule(
        RULE,
        GRAPH.format(xshape=xshape),
        matches=1,
        ops_after=["graph_autofusion.fused::MatMulRelu"],
    )


def test_relu_of_a_non_matmul_is_not_this_rule():
    text = GRAPH.format(xshape="4,16").replace("MatMul(", "Add(").replace("16,8", "16")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_matmul_with_another_reader_is_rejected():
    text = GRAPH.format(xshape="4,16").replace("-> (%y)", "-> (%y, %m)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source"),
    [(m, s) for m in ("bert", "resnet50", "llama") for s in ("dynamo", "torchscript", "torch")],
)
def test_zoo_models(model, source):
    """No zoo model has a bias-less MatMul feeding a Relu."""
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == 0
