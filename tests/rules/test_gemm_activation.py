"""gemm_activation: Gemm -> activation; native FusedGemm with the activation attributes."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.gemm_activation import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
model opset {{"": 20, "com.microsoft": 1}}
graph g(%a: f32[4,16]) -> (%y) {{
  init %w: f32[{wshape}] = randn(1)
  init %c: f32[8] = randn(2)
  %m = Gemm{attrs}(%a, %w{c})
  %y = {act}(%m)
}}
"""
ACTS = ["Relu", "Sigmoid", "Tanh", "LeakyRelu<alpha=0.2>", "HardSigmoid<alpha=0.3, beta=0.4>"]
GEMMS = {
    "plain": ("", "16,8", ""),
    "with_c": ("", "16,8", ", %c"),
    "trans_b_scaled": ("<transB=1, alpha=0.5, beta=2.0>", "8,16", ", %c"),
}


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("gemm", sorted(GEMMS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(act, gemm, native):
    attrs, wshape, c = GEMMS[gemm]
    text = GRAPH.format(attrs=attrs, wshape=wshape, c=c, act=act)
    ops = ["com.microsoft::FusedGemm"] if native else ["graph_autofusion.fused::FusedGemm"]
    model = check_rule(RULE, text, matches=1, ops_after=ops, native=native)
    if native:
        node = model.graph.nodes[0]
        assert node.attrs["activation"] == act.split("<")[0]
        if "alpha=0.2" in act:
            assert node.attrs["activation_alpha"] == pytest.approx(0.2)


def test_activation_of_a_matmul_is_not_this_rule():
    text = GRAPH.format(attrs="", wshape="16,8", c="", act="Relu").replace("Gemm(", "MatMul(")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_gemm_with_another_reader_is_rejected():
    text = GRAPH.format(attrs="", wshape="16,8", c="", act="Relu").replace("-> (%y)", "-> (%y, %m)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("bert", "dynamo", 1),  # the pooler: Gemm -> Tanh
        ("bert", "torchscript", 1),
        ("bert", "torch", 0),  # the frontend spells the pooler MatMul + Add
        ("resnet50", "dynamo", 0),  # the classifier Gemm has no activation
        ("gpt2", "torchscript", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
