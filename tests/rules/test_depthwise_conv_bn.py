"""depthwise_conv_bn: depthwise Conv (group == C_in == C_out) -> BatchNormalization."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.depthwise_conv_bn import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[{n},4,{hw}]) -> ({outs}) {{
  init %w: f32[4,{cin_g},{k}] = randn(1)
  init %b: f32[4] = randn(2)
  init %g: f32[4] = [0.5, 1.5, -1.0, 2.0]
  init %beta: f32[4] = [0.1, -0.2, 0.3, 0.0]
  init %mean: f32[4] = [0.2, -0.1, 0.5, 0.0]
  init %var: f32[4] = [0.5, 1.0, 1.5, 2.0]
  %c = Conv<group={group}{attrs}>({args})
  %y = BatchNormalization<epsilon=1e-05>(%c, %g, %beta, %mean, %var)
}}
"""
VARIANTS = {
    "3x3_bias_pads": dict(n=1, hw="8,8", k="3,3", args="%x, %w, %b", attrs=", pads=[1, 1, 1, 1]"),
    "3x3_nobias_stride2": dict(n=2, hw="9,9", k="3,3", args="%x, %w", attrs=", strides=[2, 2]"),
    "1d_bias": dict(n=2, hw="10", k="5", args="%x, %w, %b", attrs=""),
}


def graph(variant: str, *, group: int = 4, cin_g: int = 1, outs: str = "%y") -> str:
    return GRAPH.format(group=group, cin_g=cin_g, outs=outs, **VARIANTS[variant])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(variant, native):
    ops = ["Conv"] if native else ["graph_autofusion.fused::DepthwiseConvBatchNorm"]
    model = check_rule(RULE, graph(variant), matches=1, ops_after=ops, native=native, atol=1e-4)
    if native:
        (conv,) = model.graph.nodes
        assert conv.attrs["group"] == 4 and conv.inputs[1].name != "w"


def test_ordinary_conv_is_not_depthwise():
    check_no_match(RULE, graph("1d_bias", group=1, cin_g=4), reason=Reason.ATTR_MISMATCH)


def test_grouped_but_not_depthwise_is_rejected():
    check_no_match(RULE, graph("1d_bias", group=2, cin_g=2), reason=Reason.CHECK_FAILED)


def test_conv_output_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph("1d_bias", outs="%y, %c"), reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_resnet_has_no_depthwise_convolutions(source):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, "resnet50_bn", source) == 0
