"""conv_bn_relu: Conv -> BatchNormalization -> Relu; native: folded FusedConv(Relu)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.conv_bn_relu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import (
    check_no_match,
    check_rule,
    native_runs_in_onnxruntime,
    zoo_native_rewrite,
)

GRAPH = """
graph g(%x: {x_t}) -> ({outs}) {{
  init %w: {w_t} = randn(1)
  init %b: f32[4] = randn(2)
  init %g: f32[4] = [0.5, 1.5, -1.0, 2.0]
  init %beta: f32[4] = [0.1, -0.2, 0.3, 0.0]
  init %mean: f32[4] = [0.2, -0.1, 0.5, 0.0]
  init %var: f32[4] = [0.5, 1.0, 1.5, 2.0]
  %c = {conv}({args})
  %n = BatchNormalization(%c, %g, %beta, %mean, %var)
  %y = {act}(%n)
}}
"""
CONVS = {
    "2d_bias_pads": ("f32[1,3,8,8]", "f32[4,3,3,3]", "Conv<pads=[1, 1, 1, 1]>", "%x, %w, %b"),
    "2d_nobias_strides": ("f32[2,3,9,9]", "f32[4,3,3,3]", "Conv<strides=[2, 2]>", "%x, %w"),
    "1d_bias": ("f32[2,3,10]", "f32[4,3,3]", "Conv", "%x, %w, %b"),
    "grouped": ("f32[1,4,6,6]", "f32[4,2,3,3]", "Conv<group=2>", "%x, %w"),
}


def graph(kind: str, *, act: str = "Relu", outs: str = "%y") -> str:
    x_t, w_t, conv, args = CONVS[kind]
    return GRAPH.format(x_t=x_t, w_t=w_t, conv=conv, args=args, act=act, outs=outs)


@pytest.mark.parametrize("kind", sorted(CONVS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(kind, native):
    ops = ["com.microsoft::FusedConv"] if native else ["graph_autofusion.fused::FusedConv"]
    model = check_rule(RULE, graph(kind), matches=1, ops_after=ops, native=native, atol=1e-4)
    if native:
        (node,) = model.graph.nodes
        assert node.attrs["activation"] == "Relu"
        assert len(node.inputs) == 3 and node.inputs[1].name != "w"
        assert "w" in model.graph.initializers


def test_chained_blocks_rewrite_natively():
    # the second block reads the first block's output, which the first rewrite replaced
    text = (
        graph("2d_bias_pads")
        .replace(
            "%y = Relu(%n)",
            "%r = Relu(%n)\n  %c2 = Conv<pads=[1, 1, 1, 1]>(%r, %w4)\n"
            "  %n2 = BatchNormalization(%c2, %g, %beta, %mean, %var)\n  %y = Relu(%n2)",
        )
        .replace(
            "init %b: f32[4] = randn(2)",
            "init %b: f32[4] = randn(2)\n  init %w4: f32[4,4,3,3] = randn(5)",
        )
    )
    ops = ["com.microsoft::FusedConv"] * 2
    check_rule(RULE, text, matches=2, ops_after=ops, native=True, atol=1e-4)


def test_sigmoid_instead_of_relu_is_not_this_rule():
    check_no_match(RULE, graph("1d_bias", act="Sigmoid"))


def test_relu_without_batchnorm_is_not_this_rule():
    text = (
        graph("1d_bias").replace("%y = Relu(%n)", "%y = Relu(%c)").replace("-> (%y)", "-> (%y, %n)")
    )
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_bn_output_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph("1d_bias", outs="%y, %n"), reason=Reason.EXTERNAL_USER)


def test_non_constant_mean_is_rejected():
    text = graph("1d_bias").replace("init %mean: f32[4] = [0.2, -0.1, 0.5, 0.0]", "")
    text = text.replace("(%x: f32[2,3,10])", "(%x: f32[2,3,10], %mean: f32[4])")
    check_no_match(RULE, text, reason=Reason.NOT_CONST)


@pytest.mark.parametrize("kind", sorted(CONVS))
def test_native_form_runs_in_onnxruntime(kind):
    native_runs_in_onnxruntime(RULE, expect_op="FusedConv", text=graph(kind))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        # stem + two per bottleneck (the third Conv->BN feeds the residual Add)
        ("resnet50_bn", "dynamo", 33),
        ("resnet50_bn", "torchscript", 33),
        ("resnet50_bn", "torch", 33),
        ("resnet50", "torch", 33),  # our frontend keeps BatchNormalization
        ("resnet50", "dynamo", 0),  # BN folded by the exporter: conv_activation's territory
        ("resnet50", "torchscript", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript"])
def test_zoo_resnet50_bn_native_rewrite_runs_in_onnxruntime(source):
    # chained matches: each FusedConv reads the previous rewrite's output
    ops = zoo_native_rewrite("resnet50_bn", source, ("conv_bn_relu", "conv_bn"))
    assert ops["com.microsoft::FusedConv"] == 33 and ops["Conv"] == 20
    assert "BatchNormalization" not in ops
