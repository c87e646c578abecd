"""layernorm_decomposed: the spelled-out LayerNorm becomes one ONNX LayerNormalization."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.library.layernorm_decomposed import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import check_no_match, check_rule, random_feeds

GRAPH = """
model opset {{"": {opset}}}
graph g(%x: f32[2,8,16], %x2: f32[2,8,16]) -> ({outs}) {{
  init %g: f32[16] = randn(1)
  init %be: f32[16] = randn(2)
  init %two: f32[] = [{two}]
  init %eps: f32[] = [1e-05]
  init %one: f32[] = [1.0]
  init %nh: f32[] = [-0.5]
  init %axes: i64[1] = [{axis}]
  %m: f32[2,8,1] = {reduce_x}
  %d = Sub(%x, %m)
  %sq = {square}
  %v: f32[2,8,1] = {reduce_sq}
  %ve = Add(%v, %eps)
  {norm}
  {affine}
}}
"""
REDUCES = {  # axes as an input (opset 18) or an attribute (opset 17)
    "input": (18, "ReduceMean<keepdims=1>({x}, %axes)"),
    "attr": (17, "ReduceMean<axes=[{axis}], keepdims=1>({x})"),
}
SQUARES = {"pow": "Pow(%d, %two)", "mul": "Mul(%d, %d)"}
NORMS = {
    "div": "%r = Sqrt(%ve)\n  %n = Div(%d, %r)",
    "reciprocal": "%r = Sqrt(%ve)\n  %i = Reciprocal(%r)\n  %n = Mul(%d, %i)",
    "div_one": "%r = Sqrt(%ve)\n  %i = Div(%one, %r)\n  %n = Mul(%i, %d)",
    "pow_half": "%i = Pow(%ve, %nh)\n  %n = Mul(%d, %i)",
}
AFFINES = {
    "beta": "%gm = Mul(%n, %g)\n  %y = Add(%gm, %be)",
    "beta_swapped": "%gm = Mul(%g, %n)\n  %y = Add(%be, %gm)",
    "no_beta": "%y = Mul(%n, %g)",
}
GENERIC = "graph_autofusion.fused::LayerNormalization"


def graph(
    reduce="input",
    square="pow",
    norm="div",
    affine="beta",
    *,
    axis=-1,
    two=2.0,
    mean_of="%x",
    outs="%y",
) -> str:
    opset, red = REDUCES[reduce]
    return GRAPH.format(
        opset=opset,
        outs=outs,
        two=two,
        axis=axis,
        reduce_x=red.format(x=mean_of, axis=axis),
        square=SQUARES[square],
        reduce_sq=red.format(x="%sq", axis=axis),
        norm=NORMS[norm],
        affine=AFFINES[affine],
    )


@pytest.mark.parametrize("reduce", sorted(REDUCES))
@pytest.mark.parametrize("square", sorted(SQUARES))
@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("native", [False, True])
def test_every_spelling_matches_and_rewrites(reduce, square, norm, native):
    ops = ["LayerNormalization"] if native else [GENERIC]
    text = graph(reduce, square, norm)
    check_rule(RULE, text, matches=1, ops_after=ops, native=native, rtol=1e-4)


@pytest.mark.parametrize("affine", sorted(AFFINES))
@pytest.mark.parametrize("axis", [-1, 2])
@pytest.mark.parametrize("native", [False, True])
def test_affine_forms_and_axis(affine, axis, native):
    ops = ["LayerNormalization"] if native else [GENERIC]
    text = graph(affine=affine, axis=axis)
    model = check_rule(RULE, text, matches=1, ops_after=ops, native=native, rtol=1e-4)
    if native:
        ln = model.graph.nodes[0]
        assert ln.attrs == {"axis": -1, "epsilon": pytest.approx(1e-5)}
        assert len([v for v in ln.inputs if v is not None]) == (2 if affine == "no_beta" else 3)


def test_reduction_over_another_axis_is_rejected():
    check_no_match(RULE, graph(axis=1), reason=Reason.CHECK_FAILED)


def test_cube_is_not_a_variance():
    check_no_match(RULE, graph(two=3.0), reason=Reason.VALUE_MISMATCH)


def test_mean_of_another_tensor_is_rejected():
    check_no_match(RULE, graph(mean_of="%x2"), reason=Reason.BINDING_CONFLICT)


def test_centered_value_read_outside_blocks_the_match():
    check_no_match(RULE, graph(outs="%y, %d"), reason=Reason.EXTERNAL_USER)


def test_native_rewrite_runs_in_onnxruntime():
    pytest.importorskip("onnxruntime")

    text = graph("attr", "mul", "reciprocal")
    original = parse_model(text)
    model = check_rule(
        RULE, text, matches=1, ops_after=["LayerNormalization"], native=True, rtol=1e-4
    )
    feeds = random_feeds(original.graph, 9)
    want = run_model(original, feeds)["y"]
    sess = ort_session(model, "all")
    got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert", "gpt2", "minilm", "llama"])
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_models(model, source):
    # every exporter (opset 18/20) and the torch frontend keep LayerNormalization operators,
    # so nothing is spelled out; Llama's RMSNorm has no mean subtraction
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == 0
