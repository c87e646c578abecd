"""The onnxruntime target: native forms applied, everything else left unfused with a reason."""

from __future__ import annotations

import numpy as np
import onnx

from graph_autofusion.codegen.onnxruntime import LowerReason, lower_onnxruntime
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.clustering import cluster
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import random_feeds

TEXT = """
model opset {"": 18}
graph g(%x: f32[2,4,8], %res: f32[2,4,8]) -> (%y) {
  init %w: f32[8,8] = randn(0)
  init %b: f32[8] = randn(1)
  init %g: f32[8] = ones
  init %be: f32[8] = zeros
  init %w2: f32[8,8] = randn(2)
  %m: f32[2,4,8] = MatMul(%x, %w)
  %a: f32[2,4,8] = Add(%m, %b)
  %s: f32[2,4,8] = Add(%a, %res)
  %n: f32[2,4,8] = LayerNormalization<axis=-1, epsilon=1e-5>(%s, %g, %be)
  %m2: f32[2,4,8] = MatMul(%n, %w2)
  %q: f32[2,4,8] = Mul(%m2, %m2)
  %y: f32[2,4,8] = Tanh(%q)
}
"""


def run(proto, feeds):
    return ort_session(proto, "all").run(None, feeds)[0]


def test_native_forms_are_applied_and_the_rest_reported():
    original = parse_model(TEXT)
    work = parse_model(TEXT)
    rules = RuleSet((builtin_rules().get("skip_layernorm"), builtin_rules().get("swiglu")))
    report = match_rules(work.graph, rules)
    clusters = cluster(work.graph).clusters
    tail = [c for c in clusters if not any(n.op_type == "LayerNormalization" for n in c.nodes)]
    lowering = lower_onnxruntime(work, [*report.kept, *tail[-1:]])
    (done,) = lowering.lowered
    assert done.rule == "skip_layernorm"
    assert done.fused_ops == ["com.microsoft::SkipLayerNormalization"]
    assert done.outputs[0] == "n" and set(done.inputs) == {"m", "res"}
    assert set(done.original_node_names) == {
        n.name for n in original.graph.nodes if n.op_type in ("Add", "LayerNormalization")
    }
    codes = {n.code for n in lowering.not_lowered}
    assert codes == {LowerReason.CLUSTER}
    proto = to_onnx(work)
    onnx.checker.check_model(proto)
    feeds = random_feeds(original.graph)
    np.testing.assert_allclose(
        run(proto, feeds), run(to_onnx(original), feeds), rtol=1e-4, atol=1e-5
    )


def test_rule_without_native_form_stays_unfused():
    work = parse_model(TEXT)
    rule = builtin_rules().get("matmul_relu")
    assert rule.rewrite is None
    text = TEXT.replace("Tanh(%q)", "Relu(%m2)").replace("  %q: f32[2,4,8] = Mul(%m2, %m2)\n", "")
    work = parse_model(text)
    report = match_rules(work.graph, RuleSet((rule,)))
    lowering = lower_onnxruntime(work, report.kept)
    assert not lowering.lowered
    (nl,) = lowering.not_lowered
    assert nl.code == LowerReason.NO_NATIVE_RULE and "no onnxruntime-native operator" in nl.message
    assert [n.op_type for n in work.graph.nodes].count("Relu") == 1
