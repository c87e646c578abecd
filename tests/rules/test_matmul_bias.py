"""matmul_bias: MatMul / bias-less Gemm + constant last-axis bias; native Gemm for 2-D."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.matmul_bias import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[{xshape}]) -> (%y) {{
  init %w: f32[16,8] = randn(1)
  init %b: f32[{bshape}] = randn(2)
  %bb = Identity(%b)
  %m = {mm}(%x, %w)
  %y = Add({add_args})
}}
"""


def graph(mm="MatMul", xshape="2,4,16", bshape="8", add_args="%m, %b"):
    return GRAPH.format(mm=mm, xshape=xshape, bshape=bshape, add_args=add_args)


@pytest.mark.parametrize("add_args", ["%m, %b", "%b, %m", "%bb, %m"])
@pytest.mark.parametrize("xshape", ["2,4,16", "4,16"])
def test_matmul_variants_generic(add_args, xshape):
    ops = ["Identity", "graph_autofusion.fused::MatMulBias"]
    check_rule(RULE, graph(xshape=xshape, add_args=add_args), matches=1, ops_after=ops)


@pytest.mark.parametrize("mm", ["MatMul", "Gemm"])
@pytest.mark.parametrize("bshape", ["8", "1,8"])
def test_two_d_becomes_gemm_natively(mm, bshape):
    text = graph(mm=mm, xshape="4,16", bshape=bshape)
    check_rule(RULE, text, matches=1, ops_after=["Identity", "Gemm"], native=True)


def test_transposed_gemm_keeps_its_attributes_natively():
    text = graph(mm="Gemm<transB=1>", xshape="4,16").replace("f32[16,8]", "f32[8,16]")
    text = text.replace("%m = Gemm", "%m: f32[4,8] = Gemm")
    model = check_rule(RULE, text, matches=1, ops_after=["Identity", "Gemm"], native=True)
    gemm = model.graph.nodes[-1]
    assert gemm.attrs["transB"] == 1 and len(gemm.inputs) == 3


def test_n_d_matmul_declines_the_native_rewrite():
    model = parse_model(graph())
    report = match_rules(model.graph, RuleSet((RULE,)))
    applied = apply_matches(model, report.kept, native=True)
    assert applied[0].error and "no exact Gemm form" in applied[0].error


def test_bias_over_two_axes_is_rejected():
    check_no_match(RULE, graph(bshape="4,8"), reason=Reason.CHECK_FAILED)


def test_non_constant_bias_is_rejected():
    check_no_match(RULE, graph(add_args="%m, %m"), reason=Reason.CHECK_FAILED)


def test_gemm_with_c_is_not_this_rule():
    text = graph(mm="Gemm", xshape="4,16").replace("Gemm(%x, %w)", "Gemm(%x, %w, %b)")
    check_no_match(RULE, text)  # the closest failure is the MatMul alternative's


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("bert", "dynamo", 72),  # Q, K, V, output, FFN up and down in each of 12 layers
        ("bert", "torchscript", 72),  # biases are Identity of shared initializers
        ("bert", "torch", 73),  # + the pooler (a Gemm with C in the exporters)
        ("minilm", "dynamo", 36),
        ("minilm", "torchscript", 36),
        ("minilm", "torch", 36),
        ("gpt2", "torch", 48),  # 2-D [batch*seq, hidden] linear layers
        ("gpt2", "dynamo", 0),  # bias-less Gemm and no bias add (zero biases folded)
        ("gpt2", "torchscript", 0),  # Gemm with C: already one operator
        ("llama", "dynamo", 0),  # no biases
        ("resnet50", "torch", 1),  # the classifier
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
