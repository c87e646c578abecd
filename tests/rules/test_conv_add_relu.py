"""conv_add_relu: Relu(Conv(x, W, b) + residual); native: FusedConv(x, W, b, Z, Relu)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.conv_add_relu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import (
    check_no_match,
    check_rule,
    native_runs_in_onnxruntime,
    zoo_native_rewrite,
)

GRAPH = """
graph g(%x: f32[2,3,8,8], %r: {r_t}) -> ({outs}) {{
  init %w: f32[4,3,3,3] = randn(1)
  init %b: f32[4] = randn(2)
  init %w2: f32[4,3,1,1] = randn(3)
  %c: f32[2,4,8,8] = Conv<pads=[1, 1, 1, 1]>({args})
  {residual}
  %a = Add({add_args})
  %y = Relu(%a)
}}
"""
RESIDUALS = {
    # identity shortcut: a tensor computed elsewhere
    "identity": "%z: f32[2,4,8,8] = Relu(%r)",
    # downsample shortcut: another Conv (ResNet's first block of a stage)
    "projection": "%z: f32[2,4,8,8] = Conv(%x, %w2)",
}


def graph(residual="identity", *, bias=True, swapped=False, r_t="f32[2,4,8,8]", outs="%y"):
    add_args = "%z, %c" if swapped else "%c, %z"
    return GRAPH.format(
        r_t=r_t,
        outs=outs,
        args="%x, %w, %b" if bias else "%x, %w",
        residual=RESIDUALS[residual],
        add_args=add_args,
    )


@pytest.mark.parametrize("residual", sorted(RESIDUALS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(residual, bias, swapped, native):
    first = "Relu" if residual == "identity" else "Conv"
    fused = "com.microsoft::FusedConv" if native else "graph_autofusion.fused::FusedConv"
    text = graph(residual, bias=bias, swapped=swapped)
    # with a projection shortcut (Add(Conv, Conv)) one Conv is fused, the other becomes Z
    model = check_rule(RULE, text, matches=1, ops_after=[first, fused], native=native, atol=1e-4)
    if native:
        node = model.graph.nodes[-1]
        assert node.attrs["activation"] == "Relu"
        assert len(node.inputs) == 4
        if residual == "identity":
            assert node.inputs[3].name == "z" and (node.inputs[2] is not None) == bias


def test_broadcast_bias_add_is_not_a_residual():
    text = graph(r_t="f32[4,1,1]").replace(
        "%z: f32[2,4,8,8] = Relu(%r)", "%z: f32[4,1,1] = Relu(%r)"
    )
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


def test_sum_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph(outs="%y, %a"), reason=Reason.EXTERNAL_USER)


@pytest.mark.parametrize("residual", sorted(RESIDUALS))
@pytest.mark.parametrize("bias", [True, False])
def test_native_form_runs_in_onnxruntime(residual, bias):
    native_runs_in_onnxruntime(RULE, expect_op="FusedConv", text=graph(residual, bias=bias))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("resnet50", "dynamo", 16),  # one residual Add per bottleneck, BN folded
        ("resnet50", "torchscript", 16),
        ("resnet50", "torch", 0),  # BN kept: the Add reads BatchNormalization outputs
        ("resnet50_bn", "dynamo", 0),
        ("resnet50_bn", "torchscript", 0),
        ("resnet50_bn", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript"])
def test_zoo_resnet50_native_rewrite_runs_in_onnxruntime(source):
    # the residual Z of one FusedConv is the output of another rewrite
    ops = zoo_native_rewrite("resnet50", source, ("conv_add_relu", "conv_activation"))
    assert ops["com.microsoft::FusedConv"] == 49 and ops["Conv"] == 4  # 4 projection shortcuts
    assert "Relu" not in ops
