"""rmsnorm: every exporter spelling of weight * x / sqrt(mean(x^2) + eps) matches; near misses do
not; the native SimplifiedLayerNormalization keeps the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.rmsnorm import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import check_no_match, check_rule, random_feeds

GRAPH = """
model opset {{"": {opset}}}
graph g(%x: f32[2,8,16]) -> ({outs}) {{
  init %w: f32[16] = randn(1)
  init %two: f32[] = [{two}]
  init %eps: f32[] = [1e-06]
  init %one: f32[] = [1.0]
  init %nh: f32[] = [-0.5]
  init %axes: i64[1] = [{axis}]
  {cast_in}
  %sq = {square}
  %ms: f32[2,8,1] = {reduce}
  %ve = Add(%ms, %eps)
  {norm}
  {cast_out}
  %y = {weight}
}}
"""
SQUARES = {"pow": "Pow(%xc, %two)", "mul": "Mul(%xc, %xc)"}
REDUCES = {  # (opset, text): axes as an input (opset 18) or an attribute (opset 17)
    "input": (18, "ReduceMean<keepdims=1>(%sq, %axes)"),
    "attr": (17, "ReduceMean<axes=[{axis}], keepdims=1>(%sq)"),
    "default_keepdims": (18, "ReduceMean(%sq, %axes)"),
}
NORMS = {
    "div": "%r = Sqrt(%ve)\n  %n = Div(%xc, %r)",
    "reciprocal": "%r = Sqrt(%ve)\n  %i = Reciprocal(%r)\n  %n = Mul(%xc, %i)",
    "div_one": "%r = Sqrt(%ve)\n  %i = Div(%one, %r)\n  %n = Mul(%i, %xc)",
    "pow_half": "%i = Pow(%ve, %nh)\n  %n = Mul(%xc, %i)",
}
CASTS = {  # Llama: compute in float32, cast back before the weight
    "none": ("%xc = Identity(%x)", "%nc = Identity(%n)"),
    "both": ("%xc = Cast<to=1>(%x)", "%nc = Cast<to=1>(%n)"),
    "in_only": ("%xc = Cast<to=1>(%x)", "%nc = Identity(%n)"),
}
NATIVE = "com.microsoft::SkipSimplifiedLayerNormalization"  # below opset 18: no upgrade to 23
STANDARD = "RMSNormalization"  # opset 18-22 models are raised to 23 for it
GENERIC = "graph_autofusion.fused::RMSNorm"


def graph(
    square="pow",
    reduce="input",
    norm="div",
    casts="none",
    *,
    weight="Mul(%nc, %w)",
    axis=-1,
    two=2.0,
    outs="%y",
) -> str:
    opset, red = REDUCES[reduce]
    cast_in, cast_out = CASTS[casts]
    text = GRAPH.format(
        opset=opset,
        outs=outs,
        two=two,
        axis=axis,
        cast_in=cast_in,
        square=SQUARES[square],
        reduce=red.format(axis=axis),
        norm=NORMS[norm],
        cast_out=cast_out,
        weight=weight,
    )
    # "no cast" is spelled by deleting the Identity placeholders
    text = text.replace("  %xc = Identity(%x)\n", "").replace("  %nc = Identity(%n)\n", "")
    if "%xc = " not in text:
        text = text.replace("%xc", "%x")
    if "%nc = " not in text:
        text = text.replace("%nc", "%n")
    return text


@pytest.mark.parametrize("square", sorted(SQUARES))
@pytest.mark.parametrize("reduce", sorted(REDUCES))
@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("native", [False, True])
def test_every_spelling_matches_and_rewrites(square, reduce, norm, native):
    ops = [(STANDARD if REDUCES[reduce][0] >= 18 else NATIVE) if native else GENERIC]
    check_rule(
        RULE, graph(square, reduce, norm), matches=1, ops_after=ops, native=native, rtol=1e-4
    )


@pytest.mark.parametrize("casts", sorted(CASTS))
@pytest.mark.parametrize("weight", ["Mul(%nc, %w)", "Mul(%w, %nc)"])
@pytest.mark.parametrize("axis", [-1, 2])
@pytest.mark.parametrize("native", [False, True])
def test_casts_weight_order_and_axis(casts, weight, axis, native):
    ops = [STANDARD] if native else [GENERIC]
    text = graph(casts=casts, weight=weight, axis=axis)
    check_rule(RULE, text, matches=1, ops_after=ops, native=native, rtol=1e-4)


def test_native_attributes():
    text = graph(casts="both", reduce="attr")  # opset 17: not raised to 23, the skip form
    model = check_rule(RULE, text, matches=1, ops_after=[NATIVE], native=True)
    assert model.opset_imports[""] == 17
    node = model.graph.nodes[0]
    # RMSNorm(x + x, 4 eps) == RMSNorm(x, eps): the skip form with the input as its own skip
    assert node.attrs["epsilon"] == pytest.approx(4e-6)
    assert [v.name for v in node.inputs] == ["x", "x", "w"]


def test_native_at_opset_23_is_the_standard_operator():
    text = graph(casts="both")
    text = text.replace('model opset {"": 18}', 'model opset {"": 23}')
    model = check_rule(RULE, text, matches=1, ops_after=["RMSNormalization"], native=True)
    node = model.graph.nodes[0]
    assert node.attrs["axis"] == -1 and node.attrs["epsilon"] == pytest.approx(1e-6)


def test_opset_18_is_raised_to_23_for_the_standard_operator():
    model = check_rule(RULE, graph(casts="both"), matches=1, ops_after=[STANDARD], native=True)
    assert model.opset_imports[""] == 23 and model.ir_version >= 11


def test_reduction_over_another_axis_is_rejected():
    check_no_match(RULE, graph(axis=1), reason=Reason.CHECK_FAILED)


def test_cube_is_not_a_square():
    check_no_match(RULE, graph(casts="both", two=3.0), reason=Reason.VALUE_MISMATCH)


def test_keepdims_zero_is_rejected():
    text = graph().replace("ReduceMean<keepdims=1>", "ReduceMean<keepdims=0>")
    check_no_match(RULE, text, reason=Reason.ATTR_MISMATCH)


def test_external_reader_of_an_internal_value_blocks_the_match():
    check_no_match(RULE, graph(outs="%y, %ms"), reason=Reason.EXTERNAL_USER)


def test_native_declines_a_narrowing_cast():
    # computing the norm in float16 is not what SimplifiedLayerNormalization does
    text = graph(casts="both").replace("Cast<to=1>(%x)", "Cast<to=10>(%x)")
    text = text.replace("%ms: f32[2,8,1]", "%ms: f16[2,8,1]").replace("%eps)", "%eps16)")
    text = text.replace("%sq = Pow(%xc, %two)", "%sq = Pow(%xc, %two16)")
    text = text.replace(
        "  init %one", "  init %eps16: f16[] = [1e-06]\n  init %two16: f16[] = [2.0]\n  init %one"
    )
    model = parse_model(text)
    report = match_rules(model.graph, RuleSet((RULE,)))
    assert report.per_rule[RULE.name].kept == 1
    errors = [a.error for a in apply_matches(model, report.kept, native=True) if a.error]
    assert len(errors) == 1 and "not float32" in errors[0]
    check_rule(RULE, text, matches=1, ops_after=[GENERIC])


def test_native_rewrite_runs_in_onnxruntime():
    pytest.importorskip("onnxruntime")

    for reduce, op in (("input", STANDARD), ("attr", NATIVE)):  # raised to opset 23, or not
        text = graph("mul", reduce, "reciprocal", "both")
        original = parse_model(text)
        model = check_rule(RULE, text, matches=1, ops_after=[op], native=True, rtol=1e-4)
        feeds = random_feeds(original.graph, 5)
        want = run_model(original, feeds)["y"]
        sess = ort_session(model, "all")
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)


def test_a_per_head_norm_is_reshaped_around_the_skip_form():
    """Qwen3's and Gemma3's q/k norms are over [B, S, H, D]; SkipSimplifiedLayerNormalization
    takes 2-D or 3-D inputs only (onnxruntime refused the fused model: safe mode rolled the
    norm back), so a 4-D input is reshaped to [-1, D] around it."""
    text = graph("mul", "attr", "reciprocal").replace("f32[2,8,16]", "f32[2,8,4,16]")
    text = text.replace("f32[2,8,1]", "f32[2,8,4,1]")
    original = parse_model(text)
    model = check_rule(RULE, text, matches=1, native=True, rtol=1e-4,
                       ops_after=["Reshape", NATIVE, "Shape", "Reshape"])  # fmt: skip
    feeds = random_feeds(original.graph, 5)
    want = run_model(original, feeds)["y"]
    got = ort_session(model, "all").run(None, feeds)[0]
    assert got.shape == (2, 8, 4, 16)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "count"),
    [
        ("llama", 9),  # 4 layers x (input_layernorm, post_attention_layernorm) + final norm
        ("llama_gqa", 9),
        ("bert", 0),  # LayerNormalization operators, no RMSNorm
        ("gpt2", 0),
    ],
)
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_models(model, source, count):
    # dynamo: Pow, ReduceMean(axes input), Add, Sqrt, Reciprocal, Mul, Mul(weight);
    # torchscript: Cast, Pow, ReduceMean, Add, Sqrt, Div(1, .), Mul, Cast, Mul(weight);
    # torch frontend: like dynamo
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
