"""The rewrite step: generic local-function form, native callbacks, names, order, failure."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.ir.verify import verify
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import FUSED_DOMAIN, RewriteError
from graph_autofusion.patterns.rules import FusionRule, RuleSet
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import random_feeds

p = PatternBuilder()
ADD_RELU = FusionRule(
    "add_relu_t", pattern=p.Relu(p.Add(p.var("a"), p.var("b"), _label="add")), fuse_pattern="AR"
)

TWO_BLOCKS = """
graph g(%x: f32[2,8], %y: f32[2,8]) -> (%out) {
  %a1 = Add(%x, %y)
  %r1 = Relu(%a1)
  %a2 = Add(%r1, %x)
  %r2 = Relu(%a2)
  %out: f32[2,8] = Mul(%r2, %r1)
}
"""


def fuse_all(text, rules, native=True):
    model = parse_model(text)
    report = match_rules(model.graph, RuleSet(tuple(rules)))
    applied = apply_matches(model, report.kept, native=native)
    return model, applied


def test_generic_form_shares_one_function_and_keeps_numbers():
    original = parse_model(TWO_BLOCKS)
    model, applied = fuse_all(TWO_BLOCKS, [ADD_RELU])
    assert [a.error for a in applied] == ["", ""]
    verify(model)
    assert [n.qualified_op for n in model.graph.nodes].count(f"{FUSED_DOMAIN}::AR") == 2
    assert len(model.functions) == 1  # identical bodies share one function
    feeds = random_feeds(original.graph)
    np.testing.assert_array_equal(run_model(model, feeds)["out"], run_model(original, feeds)["out"])


def test_generic_form_runs_in_onnxruntime():
    original = parse_model(TWO_BLOCKS)
    model, _ = fuse_all(TWO_BLOCKS, [ADD_RELU])
    proto = to_onnx(model)
    onnx.checker.check_model(proto)
    feeds = random_feeds(original.graph)
    for level in ("disable", "all"):
        sess = ort_session(proto, level)
        (out,) = sess.run(None, feeds)
        np.testing.assert_allclose(out, run_model(original, feeds)["out"], rtol=1e-6)


def test_graph_output_names_survive_the_rewrite():
    text = """
    graph g(%x: f32[4], %y: f32[4]) -> (%r) {
      %a = Add(%x, %y)
      %r = Relu(%a)
    }
    """
    model, _ = fuse_all(text, [ADD_RELU])
    assert [v.name for v in model.graph.outputs] == ["r"]
    assert model.graph.outputs[0].producer.op_type == "AR"


def test_exported_internal_value_becomes_a_second_output_and_order_is_repaired():
    # %a is read by Neg, which sits between the Add and the Relu in node order
    text = """
    graph g(%x: f32[4], %y: f32[4]) -> (%r, %n) {
      %a = Add(%x, %y) @add
      %n = Neg(%a)
      %r = Relu(%a)
    }
    """
    rule = FusionRule(
        "ar_export",
        pattern=p.Relu(p.Add(p.var("a"), p.var("b"), _label="add")),
        fuse_pattern="ARX",
        exported=("add",),
    )
    original = parse_model(text)
    model, applied = fuse_all(text, [rule])
    assert not applied[0].error
    verify(model)
    assert [n.op_type for n in model.graph.nodes] == ["ARX", "Neg"]
    feeds = random_feeds(original.graph)
    before, after = run_model(original, feeds), run_model(model, feeds)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_failing_native_rewrite_leaves_the_graph_unchanged():
    def bad(ctx):
        ctx.make_node("Neg", [ctx.value("a")])
        raise RewriteError("no native form for this shape")

    rule = FusionRule(
        "ar_bad", pattern=p.Relu(p.Add(p.var("a"), p.var("b"))), fuse_pattern="X", rewrite=bad
    )
    model, applied = fuse_all(TWO_BLOCKS, [rule])
    assert all("no native form" in a.error for a in applied)
    assert [n.op_type for n in model.graph.nodes] == ["Add", "Relu", "Add", "Relu", "Mul"]
    verify(model)


def test_native_rewrite_with_the_wrong_number_of_values_is_refused():
    rule = FusionRule(
        "ar_short",
        pattern=p.Relu(p.Add(p.var("a"), p.var("b"))),
        fuse_pattern="X",
        rewrite=lambda ctx: [],
    )
    _, applied = fuse_all(TWO_BLOCKS, [rule])
    assert all("returned 0 values for 1 outputs" in a.error for a in applied)


def test_stale_match_is_refused():
    model = parse_model(TWO_BLOCKS)
    report = match_rules(model.graph, RuleSet((ADD_RELU,)))
    apply_matches(model, report.kept)
    again = apply_matches(model, report.kept)
    assert all("no longer in the graph" in a.error for a in again)


QKV = """
graph g(%x: f32[2,4,8]) -> (%q, %k, %v) {
  init %wq: f32[8,8] = randn(1)
  init %wk: f32[8,4] = randn(2)
  init %wv: f32[8,4] = randn(3)
  init %bq: f32[8] = randn(4)
  %mq = MatMul(%x, %wq)
  %q = Add(%mq, %bq)
  %k = MatMul(%x, %wk)
  %v = MatMul(%x, %wv)
}
"""


def test_horizontal_siblings_fuse_into_one_multi_output_node():
    branch = p.Add(p.MatMul(p.var("x"), p.const("w")), p.const("b")) | p.MatMul(
        p.var("x"), p.const("w")
    )
    rule = FusionRule("qkv_t", pattern=branch, fuse_pattern="QKV", horizontal="x")
    original = parse_model(QKV)
    model, applied = fuse_all(QKV, [rule])
    assert [len(a.match.nodes) for a in applied] == [4]  # Q's MatMul+Add, K, V
    (node,) = model.graph.nodes
    assert node.op_type == "QKV" and len(node.outputs) == 3
    assert [v.name for v in model.graph.outputs] == ["q", "k", "v"]
    feeds = random_feeds(original.graph)
    before, after = run_model(original, feeds), run_model(model, feeds)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_horizontal_needs_enough_siblings():
    branch = p.MatMul(p.var("x"), p.const("w"))
    rule = FusionRule("qkv4", pattern=branch, fuse_pattern="QKV", horizontal="x", min_branches=4)
    report = match_rules(parse_model(QKV).graph, RuleSet((rule,)))
    rr = report.per_rule["qkv4"]
    assert not rr.matches and rr.closest.code == "too-few-siblings"
    assert "3 branch(es)" in rr.closest.message


def test_horizontal_variable_must_be_bound():
    rule = FusionRule("bad_h", pattern=p.Relu(p.var("a")), fuse_pattern="X", horizontal="zz")
    with pytest.raises(ValueError, match="not bound"):
        match_rules(parse_model(TWO_BLOCKS).graph, RuleSet((rule,)))


def test_native_rewrite_sees_values_replaced_by_an_earlier_rewrite():
    # the second block reads %r1, which the first rewrite replaces
    def native(ctx):
        s = ctx.make_node("Add", [ctx.value("a"), ctx.value("b")]).outputs[0]
        return ctx.make_node("Relu", [s]).outputs

    rule = FusionRule(
        "ar_native",
        pattern=p.Relu(p.Add(p.var("a"), p.var("b"))),
        fuse_pattern="AR",
        rewrite=native,
    )
    original = parse_model(TWO_BLOCKS)
    model, applied = fuse_all(TWO_BLOCKS, [rule])
    assert [a.error for a in applied] == ["", ""]
    verify(model)
    feeds = random_feeds(original.graph)
    np.testing.assert_array_equal(run_model(model, feeds)["out"], run_model(original, feeds)["out"])


def test_declined_native_rewrite_can_fall_back_to_the_generic_form():
    def decline(ctx):
        raise RewriteError("no native form")

    rule = FusionRule(
        "ar_fb", pattern=p.Relu(p.Add(p.var("a"), p.var("b"))), fuse_pattern="AR", rewrite=decline
    )
    model = parse_model(TWO_BLOCKS)
    report = match_rules(model.graph, RuleSet((rule,)))
    applied = apply_matches(model, report.kept, fallback_generic=True)
    assert [a.error for a in applied] == ["fallback: no native form"] * 2
    assert [n.op_type for n in model.graph.nodes] == ["AR", "AR", "Mul"]
