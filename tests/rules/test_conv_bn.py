"""conv_bn: Conv -> inference BatchNormalization; native form folds BN into the Conv weights."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.patterns.library.conv_bn import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

# Moderate statistics: the fold rescales weights by gamma / sqrt(var + eps).
BN_PARAMS = """
  init %g: f32[4] = [0.5, 1.5, -1.0, 2.0]
  init %beta: f32[4] = [0.1, -0.2, 0.3, 0.0]
  init %mean: f32[4] = [0.2, -0.1, 0.5, 0.0]
  init %var: f32[4] = [0.5, 1.0, 1.5, 2.0]
"""
CONVS = {
    "2d_bias_pads": ("f32[1,3,8,8]", "f32[4,3,3,3]", "Conv<pads=[1, 1, 1, 1]>", True),
    "2d_nobias_strides": ("f32[2,3,9,9]", "f32[4,3,3,3]", "Conv<strides=[2, 2]>", False),
    "2d_autopad": ("f32[1,3,8,8]", "f32[4,3,3,3]", 'Conv<auto_pad="SAME_UPPER">', True),
    "2d_dilated": (
        "f32[1,3,8,8]",
        "f32[4,3,3,3]",
        "Conv<dilations=[2, 2], pads=[2, 2, 2, 2]>",
        True,
    ),
    "1d_bias": ("f32[2,3,10]", "f32[4,3,3]", "Conv", True),
    "grouped_nobias": ("f32[1,4,6,6]", "f32[4,2,3,3]", "Conv<group=2>", False),
}


def graph(kind: str, *, bn_attrs: str = "<epsilon=0.001>", extra: str = "", outs: str = "%y"):
    x_t, w_t, conv, bias = CONVS[kind]
    args = "%x, %w, %b" if bias else "%x, %w"
    return f"""
graph g(%x: {x_t}) -> ({outs}) {{
  init %w: {w_t} = randn(1)
  init %b: f32[4] = randn(2)
  {BN_PARAMS}
  %c = {conv}({args})
  %y = BatchNormalization{bn_attrs}(%c, %g, %beta, %mean, %var)
  {extra}
}}
"""


@pytest.mark.parametrize("kind", sorted(CONVS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(kind, native):
    ops = ["Conv"] if native else ["graph_autofusion.fused::ConvBatchNorm"]
    model = check_rule(RULE, graph(kind), matches=1, ops_after=ops, native=native, atol=1e-4)
    if native:
        (conv,) = model.graph.nodes
        w_new = conv.inputs[1]
        assert w_new.name != "w" and conv.inputs[2] is not None
        assert "w" in model.graph.initializers  # a new initializer; the original stays
        assert not np.allclose(w_new.const, model.graph.initializers["w"].const)


def test_fold_arithmetic():
    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.patterns.candidates import apply_matches, match_rules
    from graph_autofusion.patterns.rules import RuleSet

    model = parse_model(graph("2d_bias_pads"))
    w = model.graph.initializers["w"].const.copy()
    b = model.graph.initializers["b"].const.copy()
    report = match_rules(model.graph, RuleSet((RULE,)))
    apply_matches(model, report.kept, native=True)
    (conv,) = model.graph.nodes
    g = np.array([0.5, 1.5, -1.0, 2.0])
    s = g / np.sqrt(np.array([0.5, 1.0, 1.5, 2.0]) + 1e-3)
    np.testing.assert_allclose(conv.inputs[1].const, w * s[:, None, None, None], rtol=1e-6)
    expect_b = (b - np.array([0.2, -0.1, 0.5, 0.0])) * s + np.array([0.1, -0.2, 0.3, 0.0])
    np.testing.assert_allclose(conv.inputs[2].const, expect_b, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(model.graph.initializers["w"].const, w)  # untouched
    np.testing.assert_array_equal(model.graph.initializers["b"].const, b)


def test_runtime_statistics_are_not_folded():
    text = graph("1d_bias").replace("init %var: f32[4] = [0.5, 1.0, 1.5, 2.0]", "")
    text = text.replace("(%x: f32[2,3,10])", "(%x: f32[2,3,10], %var: f32[4])")
    check_no_match(RULE, text, reason=Reason.NOT_CONST)


def test_conv_output_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph("1d_bias", outs="%y, %c"), reason=Reason.EXTERNAL_USER)


def test_training_mode_is_not_folded():
    text = graph("1d_bias", bn_attrs="<training_mode=1>")
    check_no_match(RULE, text, reason=Reason.ATTR_MISMATCH)


def test_dynamic_weight_is_not_folded():
    text = graph("1d_bias").replace("init %w: f32[4,3,3] = randn(1)", "")
    text = text.replace("(%x: f32[2,3,10])", "(%x: f32[2,3,10], %w: f32[4,3,3])")
    check_no_match(RULE, text, reason=Reason.NOT_CONST)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("resnet50_bn", "dynamo", 53),  # every Conv -> BatchNormalization
        ("resnet50_bn", "torchscript", 53),
        ("resnet50_bn", "torch", 53),
        ("resnet50", "torch", 53),  # our frontend keeps BatchNormalization
        ("resnet50", "dynamo", 0),  # the exporters fold it already
        ("resnet50", "torchscript", 0),
        ("bert", "dynamo", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
