"""conv_activation: act(Conv(x, W, b)); native: FusedConv(activation, activation_params)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.conv_activation import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import (
    check_no_match,
    check_rule,
    native_runs_in_onnxruntime,
)

GRAPH = """
graph g(%x: f32[2,3,8,8]{extra_in}) -> ({outs}) {{
  init %w: f32[4,3,3,3] = randn(1)
  init %b: f32[4] = randn(2)
  init %lo: f32[] = [-0.5]
  init %hi: f32[] = [0.75]
  %c = Conv<pads=[1, 1, 1, 1], strides=[1, 1]>({args})
  %y = {act}
}}
"""
ACTS = {
    "Relu": ("Relu(%c)", "Relu", None),
    "Sigmoid": ("Sigmoid(%c)", "Sigmoid", None),
    "Tanh": ("Tanh(%c)", "Tanh", None),
    "LeakyRelu": ("LeakyRelu<alpha=0.2>(%c)", "LeakyRelu", [0.2]),
    "LeakyRelu_default": ("LeakyRelu(%c)", "LeakyRelu", [0.01]),
    "HardSigmoid": ("HardSigmoid<alpha=0.3, beta=0.4>(%c)", "HardSigmoid", [0.3, 0.4]),
    "Clip": ("Clip(%c, %lo, %hi)", "Clip", [-0.5, 0.75]),
    "Clip_min_only": ("Clip(%c, %lo)", "Clip", [-0.5, 3.4028234663852886e38]),
    "Clip_max_only": ("Clip(%c, _, %hi)", "Clip", [-3.4028234663852886e38, 0.75]),
}


def graph(act: str, *, bias: bool = True, extra_in: str = "", outs: str = "%y") -> str:
    return GRAPH.format(
        act=act, args="%x, %w, %b" if bias else "%x, %w", extra_in=extra_in, outs=outs
    )


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(act, bias, native):
    text, name, params = ACTS[act]
    ops = ["com.microsoft::FusedConv"] if native else ["graph_autofusion.fused::FusedConv"]
    model = check_rule(RULE, graph(text, bias=bias), matches=1, ops_after=ops, native=native)
    if native:
        (node,) = model.graph.nodes
        assert node.attrs["activation"] == name
        assert node.attrs["pads"] == [1, 1, 1, 1]
        if params is None:
            assert "activation_params" not in node.attrs
        else:
            assert list(node.attrs["activation_params"]) == pytest.approx(params, rel=1e-6)


def test_runtime_clip_bound_is_rejected():
    text = graph("Clip(%c, %lo2, %hi)", extra_in=", %lo2: f32[]")
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


def test_conv_output_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph("Relu(%c)", outs="%y, %c"), reason=Reason.EXTERNAL_USER)


def test_activation_of_a_matmul_is_not_this_rule():
    text = (
        graph("Relu(%m)")
        .replace("%y = Relu(%m)", "%m = MatMul(%x, %x)\n  %y = Relu(%m)")
        .replace("-> (%y)", "-> (%y, %c)")
    )
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


@pytest.mark.parametrize("act", sorted(ACTS))
def test_native_form_runs_in_onnxruntime(act):
    native_runs_in_onnxruntime(RULE, expect_op="FusedConv", text=graph(ACTS[act][0]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("resnet50", "dynamo", 33),  # stem + two per bottleneck (BN folded by the exporter)
        ("resnet50", "torchscript", 33),
        ("resnet50", "torch", 0),  # BN kept: Relu reads BatchNormalization
        ("resnet50_bn", "dynamo", 0),
        ("resnet50_bn", "torchscript", 0),
        ("resnet50_bn", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


PADDED = """
graph g(%x: f32[1,3,8,8]) -> (%y) {{
  init %w: f32[4,3,3,3] = randn(1)
  init %b: f32[4] = randn(2)
  {pads}
  %p = Pad(%x, %pads)
  %c = Conv<pads=[1, 1, 1, 1], strides=[1, 1]>(%p, %w, %b)
  %y = Relu(%c)
}}
"""


def test_a_constant_zero_pad_folds_into_the_fused_conv():
    """onnxruntime folds a constant Pad into the Conv after it (not into FusedConv): the
    rewrite folds it into FusedConv's pads itself."""
    text = PADDED.format(pads="init %pads: i64[8] = [0, 0, 1, 2, 0, 0, 2, 0]")
    ops = ["Pad", "com.microsoft::FusedConv"]  # the Pad is left dead (the lowering prunes it)
    model = check_rule(RULE, text, matches=1, native=True, ops_after=ops)
    pad, node = model.graph.nodes
    assert node.attrs["pads"] == [2, 3, 3, 1]
    assert node.inputs[0] is model.graph.inputs[0] and not pad.outputs[0].users


def test_pads_computed_from_constants_fold_too():
    """TorchScript's TF-style padding computes the pads from constants by shape operators
    (ConstantOfShape, Concat, Reshape, Transpose, Cast ...): they fold like constant pads."""
    chain = (
        "init %two: i64[1] = [2]\n"
        "  init %pb: f32[2] = [1, 2]\n"
        "  init %pe: f32[2] = [2, 1]\n"
        "  init %shape: i64[2] = [4, 2]\n"
        "  init %eight: i64[1] = [8]\n"
        "  %zeros = ConstantOfShape(%two)\n"
        "  %all = Concat<axis=0>(%zeros, %pb, %zeros, %pe)\n"
        "  %grid = Reshape(%all, %shape)\n"
        "  %flat = Reshape(%grid, %eight)\n"
        "  %pads = Cast<to=7>(%flat)"
    )
    model = check_rule(RULE, PADDED.format(pads=chain), matches=1, native=True, ops_after=None)
    node = next(n for n in model.graph.nodes if n.op_type == "FusedConv")
    assert node.inputs[0] is model.graph.inputs[0]
    assert node.attrs["pads"] == [1 + 1, 1 + 2, 1 + 2, 1 + 1]


def test_a_pad_fed_at_run_time_keeps_the_conv_for_onnxruntime():
    """Pads fed at run time: FusedConv would hide the Conv from onnxruntime's pad fusion, so
    the rule refuses and says why."""
    text = PADDED.format(pads="").replace("(%x: f32[1,3,8,8])", "(%x: f32[1,3,8,8], %pads: i64[8])")
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)
