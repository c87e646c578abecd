"""bias_gelu: a bias add before GELU in every spelling; native BiasGelu / FastGelu."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.bias_gelu import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
model opset {{"": 20, "com.microsoft": 1}}
graph g(%x: f32[{xshape}]) -> (%y) {{
  init %b: f32[{bshape}] = randn(1)
  init %sqrt2: f32[] = [1.4142135381698608]
  init %three: f32[] = [3.0]
  init %cubic: f32[] = [0.044714998453855515]
  init %k: f32[] = [0.7978845834732056]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %bb = Identity(%b)
  %z = Add({add_args})
  {reshape}
  {gelu}
}}
"""
GELUS = {
    "onnx_erf": ('%y = Gelu<approximate="none">(%h)', "erf"),
    "onnx_default": ("%y = Gelu(%h)", "erf"),
    "onnx_tanh": ('%y = Gelu<approximate="tanh">(%h)', "tanh"),
    "ms_gelu": ("%y = com.microsoft::Gelu(%h)", "erf"),
    "erf_decomposed": (
        "%s = Div(%h, %sqrt2)\n  %e = Erf(%s)\n  %a = Add(%e, %one)\n  %m = Mul(%h, %a)\n"
        "  %y = Mul(%m, %half)",
        "erf",
    ),
    "tanh_decomposed": (
        "%c = Pow(%h, %three)\n  %m = Mul(%c, %cubic)\n  %i = Add(%h, %m)\n  %s = Mul(%i, %k)\n"
        "  %t = Tanh(%s)\n  %a = Add(%t, %one)\n  %hh = Mul(%h, %half)\n  %y = Mul(%hh, %a)",
        "tanh",
    ),
}
NATIVE = {"erf": "com.microsoft::BiasGelu", "tanh": "com.microsoft::FastGelu"}


def graph(gelu="onnx_erf", add_args="%x, %b", reshape=False, bshape="16"):
    if reshape:  # the PyTorch frontend's GPT-2: bias on a 2-D view, then back to 3-D
        xshape, rs = "16,16", "init %shape: i64[3] = [2, 8, 16]\n  %h = Reshape(%z, %shape)"
    else:
        xshape, rs = "2,8,16", "%h = Identity(%z)"
    text = GRAPH.format(
        xshape=xshape, bshape=bshape, add_args=add_args, reshape=rs, gelu=GELUS[gelu][0]
    )
    if not reshape:  # no Identity between the add and the GELU
        text = text.replace("%h = Identity(%z)\n", "").replace("%h", "%z")
    return text


@pytest.mark.parametrize("gelu", sorted(GELUS))
@pytest.mark.parametrize("add_args", ["%x, %b", "%b, %x", "%x, %bb"])
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(gelu, add_args, native):
    text = graph(gelu, add_args)
    ops = ["Identity"] if "%bb" not in add_args else []
    ops += [NATIVE[GELUS[gelu][1]]] if native else ["graph_autofusion.fused::BiasGelu"]
    if "%bb" in add_args:  # the Identity of the bias stays outside the match
        ops = ["Identity", *ops]
    check_rule(RULE, text, matches=1, ops_after=ops, native=native, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gelu", ["onnx_tanh", "tanh_decomposed", "erf_decomposed"])
@pytest.mark.parametrize("native", [False, True])
def test_reshape_between_bias_and_gelu(gelu, native):
    text = graph(gelu, reshape=True)
    if native:
        ops = ["Identity", "Reshape", NATIVE[GELUS[gelu][1]]]
    else:
        ops = ["Identity", "graph_autofusion.fused::BiasGelu"]
    check_rule(RULE, text, matches=1, ops_after=ops, native=native)


def test_bias_of_shape_1_1_n_is_flattened_for_the_native_op():
    check_rule(
        RULE,
        graph("erf_decomposed", bshape="1,1,16"),
        matches=1,
        ops_after=["Identity", "com.microsoft::BiasGelu"],
        native=True,
    )


def test_bias_over_two_axes_stays_unfused_natively():
    model = parse_model(graph("onnx_erf", bshape="8,16"))
    report = match_rules(model.graph, RuleSet((RULE,)))
    assert report.per_rule["bias_gelu"].kept == 1  # the generic form is fine
    applied = apply_matches(model, report.kept, native=True)
    assert applied[0].error and "last axis" in applied[0].error
    assert [n.op_type for n in model.graph.nodes] == ["Identity", "Add", "Gelu"]


def test_a_non_constant_bias_is_rejected():
    text = graph("onnx_erf").replace("Add(%x, %b)", "Add(%x, %x)")
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


def test_a_bias_add_with_another_reader_is_rejected():
    text = graph("onnx_erf").replace("-> (%y)", "-> (%y, %z)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


def test_gelu_without_bias_is_not_this_rule():
    text = graph("onnx_erf").replace('%y = Gelu<approximate="none">(%z)', "%y = Gelu(%x)")
    check_no_match(RULE, text, reason=Reason.NO_PRODUCER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        ("bert", "dynamo", 12),  # Gelu operator
        ("bert", "torchscript", 12),  # erf form; biases are Identity of one initializer
        ("bert", "torch", 12),
        ("minilm", "dynamo", 6),
        ("minilm", "torchscript", 6),
        ("minilm", "torch", 6),
        ("gpt2", "torch", 12),  # tanh form after a Reshape of the 2-D bias add
        ("gpt2", "dynamo", 0),  # no bias add at all: zero biases folded away
        ("gpt2", "torchscript", 12),  # the bias is Gemm's C input: the Gemm joins the match
        ("llama", "dynamo", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


GEMM_TANH = """
graph g(%x: f32[6,8]) -> (%y) {
  init %w: f32[8,16] = randn(1)
  init %c: f32[16] = randn(2)
  init %k: f32[] = [0.7978845834732056]
  init %a: f32[] = [0.044714998453855515]
  init %three: f32[] = [3.0]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  init %shape: i64[3] = [2, 3, 16]
  %g = Gemm(%x, %w, %c)
  %h: f32[2,3,16] = Reshape(%g, %shape)
  %p = Pow(%h, %three)
  %m = Mul(%p, %a)
  %s = Add(%h, %m)
  %t = Mul(%s, %k)
  %th = Tanh(%t)
  %o = Add(%th, %one)
  %hh = Mul(%h, %half)
  %y = Mul(%hh, %o)
}
"""


@pytest.mark.parametrize("native", [False, True])
def test_gemm_bias_then_tanh_gelu_as_torchscript_exports_gpt2(native):
    ops = (
        ["Gemm", "Reshape", "com.microsoft::FastGelu"]
        if native
        else ["graph_autofusion.fused::BiasGelu"]
    )
    check_rule(RULE, GEMM_TANH, matches=1, ops_after=ops, native=native, rtol=1e-4, atol=1e-5)
