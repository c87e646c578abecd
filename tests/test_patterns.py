"""Pattern language and matcher: every feature, with positive and negative cases."""

from __future__ import annotations

import math

import pytest

from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.matcher import Match, Reason, Rejection, find_matches, match_at
from graph_autofusion.patterns.pattern import PatternBuilder

p = PatternBuilder()

ATTN = """
graph g(%x: f32[1,4,8,8], %mask: f32[1,1,8,8]) -> (%y) {{
  init %scale: f32[] = [{scale}]
  %s = Div(%x, %scale) @div
  %m = Add({add_args}) @add
  %y = Softmax<axis={axis}>(%m) @softmax
}}
"""


def graph_of(text: str):
    return parse_model(text).graph


def attention_scale_mask():
    x, mask = p.var("x"), p.var("mask")
    scale = p.const("scale", scalar=True, value=math.sqrt(8.0))
    return p.Softmax(p.Add(p.Div(x, scale, _label="div"), mask), axis=-1)


def root(graph, op_type):
    return next(n for n in graph.nodes if n.op_type == op_type)


@pytest.mark.parametrize("add_args", ["%s, %mask", "%mask, %s"])
def test_commuted_operands_match_without_a_second_pattern(add_args):
    g = graph_of(ATTN.format(scale=math.sqrt(8.0), add_args=add_args, axis=-1))
    m = match_at(attention_scale_mask(), root(g, "Softmax"))
    assert isinstance(m, Match), m
    assert [n.name for n in m.nodes] == ["div", "add", "softmax"]
    assert m.values["mask"].name == "mask" and m.values["x"].name == "x"
    assert m.labels["div"].name == "div"
    assert [v.name for v in m.inputs()] == ["x", "scale", "mask"]


def test_attribute_constraint_rejects_with_reason():
    g = graph_of(ATTN.format(scale=math.sqrt(8.0), add_args="%s, %mask", axis=2))
    r = match_at(attention_scale_mask(), root(g, "Softmax"))
    assert isinstance(r, Rejection)
    assert r.code == Reason.ATTR_MISMATCH and "axis=2" in r.message


def test_constant_value_constraint():
    g = graph_of(ATTN.format(scale=3.0, add_args="%s, %mask", axis=-1))
    r = match_at(attention_scale_mask(), root(g, "Softmax"))
    assert isinstance(r, Rejection) and r.code == Reason.VALUE_MISMATCH
    # the closest partial match got past Softmax and Add before failing
    assert r.depth >= 3


def test_external_user_blocks_unless_exported():
    text = """
    graph g(%x: f32[4], %b: f32[4]) -> (%y, %z) {
      %a = Add(%x, %b) @add
      %y = Relu(%a) @relu
      %z = Neg(%a) @neg
    }
    """
    g = graph_of(text)
    pat = p.Relu(p.Add(p.var("x"), p.var("b"), _label="add"))
    r = match_at(pat, root(g, "Relu"))
    assert isinstance(r, Rejection) and r.code == Reason.EXTERNAL_USER and "neg" in r.message
    assert isinstance(match_at(pat, root(g, "Relu"), exported=("add",)), Match)


def test_alternatives_and_op_alternatives():
    text = """
    graph g(%x: f32[4], %w: f32[4]) -> (%y, %z) {
      %a = Add(%x, %w) @a1
      %y = Sigmoid(%a) @sig
      %c = Add(%w, %x) @a2
      %z = Tanh(%c) @tanh
    }
    """
    g = graph_of(text)
    act = p.op("Relu", "Sigmoid", "Tanh")(p.Add(p.var("x"), p.var("w")))
    matches, _ = find_matches(g, act)
    assert [m.root.name for m in matches] == ["sig", "tanh"]
    alt = p.Sigmoid(p.Add(p.var("x"), p.var("w"))) | p.Tanh(p.Add(p.var("x"), p.var("w")))
    matches, _ = find_matches(g, alt.options[0])
    assert len(matches) == 1


def test_optional_cast():
    with_cast = """
    graph g(%x: f16[4]) -> (%y) {
      %c = Cast<to=1>(%x) @cast
      %y = Relu(%c) @relu
    }
    """
    without = """
    graph g(%x: f32[4]) -> (%y) {
      %y = Relu(%x) @relu
    }
    """
    pat = p.Relu(p.optional("Cast", p.var("x")))
    m1 = match_at(pat, root(graph_of(with_cast), "Relu"))
    m2 = match_at(pat, root(graph_of(without), "Relu"))
    assert isinstance(m1, Match) and [n.name for n in m1.nodes] == ["cast", "relu"]
    assert isinstance(m2, Match) and [n.name for n in m2.nodes] == ["relu"]


def test_shared_variable_must_bind_same_value():
    # gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2))): x appears twice
    text = """
    graph g(%x: f32[4], %q: f32[4]) -> (%y) {{
      init %r2: f32[] = [1.4142135]
      init %one: f32[] = [1.0]
      init %half: f32[] = [0.5]
      %d = Div(%x, %r2) @div
      %e = Erf(%d) @erf
      %a = Add(%e, %one) @add
      %m = Mul({first}, %a) @mul1
      %y = Mul(%m, %half) @mul2
    }}
    """
    x = p.var("x")
    pat = p.Mul(
        p.Mul(x, p.Add(p.Erf(p.Div(x, p.const("r2"))), p.const("one", value=1.0))),
        p.const("half", value=0.5),
    )
    g_ok = graph_of(text.format(first="%x"))
    ok = match_at(pat, next(n for n in g_ok.nodes if n.name == "mul2"))
    assert isinstance(ok, Match) and len(ok.nodes) == 5
    g = graph_of(text.format(first="%q"))
    bad = match_at(pat, next(n for n in g.nodes if n.name == "mul2"))
    assert isinstance(bad, Rejection) and bad.code == Reason.BINDING_CONFLICT


def test_dtype_rank_static_constraints():
    text = """
    graph g(%x: f16[B,4], %w: f32[4,4]) -> (%y) {
      %y = MatMul(%x, %w) @mm
    }
    """
    g = graph_of(text)
    mm = root(g, "MatMul")
    assert match_at(p.MatMul(p.var("x", dtypes=[DType.FLOAT]), p.var("w")), mm).code == Reason.DTYPE
    assert match_at(p.MatMul(p.var("x", rank=3), p.var("w")), mm).code == Reason.RANK
    assert match_at(p.MatMul(p.var("x", static=True), p.var("w")), mm).code == Reason.DYNAMIC_SHAPE
    assert match_at(p.MatMul(p.var("x"), p.const("w")), mm).code == Reason.NOT_CONST


def test_custom_check_rejects_with_its_sentence():
    g = graph_of(ATTN.format(scale=math.sqrt(8.0), add_args="%s, %mask", axis=-1))

    def mask_is_4d(ctx):
        return None if ctx.values["mask"].rank == 4 else "mask must be 4-D"

    def never(ctx):
        return "the user said no"

    assert isinstance(
        match_at(attention_scale_mask(), root(g, "Softmax"), checks=(mask_is_4d,)), Match
    )
    r = match_at(attention_scale_mask(), root(g, "Softmax"), checks=(never,))
    assert r.code == Reason.CHECK_FAILED and r.message == "the user said no"


def test_non_convex_match_rejected():
    # a -> b -> c and a -> ext -> c: {a, c} without ext would make a cycle
    text = """
    graph g(%x: f32[4]) -> (%y) {
      %a = Relu(%x) @a
      %e = Neg(%a) @ext
      %y = Add(%a, %e) @c
    }
    """
    g = graph_of(text)
    pat = p.Add(p.Relu(p.var("x"), _label="a"), p.var("other"))
    r = match_at(pat, root(g, "Add"), exported=("a",))
    assert isinstance(r, Rejection) and r.code == Reason.NOT_CONVEX


def test_alternative_at_the_root_and_output_index_reason():
    text = """
    graph g(%x: f32[4]) -> (%y, %z) {
      %y = Relu(%x) @relu
      %a, %b = Split<axis=0>(%x) @split
      %z = Neg(%b) @neg
    }
    """
    g = graph_of(text)
    x = p.var("x")
    matches, _ = find_matches(g, p.Relu(x) | p.Sigmoid(x))
    assert [m.root.name for m in matches] == ["relu"]
    r = match_at(p.Neg(p.Split(p.var("x"), _exact=False)), root(g, "Neg"))
    assert isinstance(r, Rejection) and r.code == Reason.OUTPUT_INDEX
    assert isinstance(
        match_at(p.Neg(p.Split(p.var("x"), _exact=False, _output=1)), root(g, "Neg")), Match
    )
