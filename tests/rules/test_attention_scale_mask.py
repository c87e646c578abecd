"""attention_scale_mask: every scale and mask spelling matches; near misses do not."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.attention_scale_mask import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

FUSED = "graph_autofusion.fused::AttentionScaleMaskSoftmax"

GRAPH = """
graph g(%s: f32[1,2,4,4], %q: f32[1,2,4,8], %kt: f32[1,2,8,4], %mask: f32[1,1,4,4], {cond}) -> (%y) {{
  init %c: f32[] = [{c}]
  init %qc: f32[] = [0.4204482]
  init %kc: f32[1] = [0.4204482]
  init %fill: f32[] = [-10000.0]
  init %zero: f32[1] = [0.0]
  {scale}
  {mask}
  %p = Softmax<axis={axis}>(%m)
  {tail}
}}
"""
SCALES = {
    "div": ("%t = Div(%s, %c)", 2.8284271),
    "mul": ("%t = Mul(%s, %c)", 0.35355339),
    "mul_swapped": ("%t = Mul(%c, %s)", 0.35355339),
    "prescaled_q_and_k": (
        "%qs = Mul(%q, %qc)\n  %ks = Mul(%kt, %kc)\n  %t = MatMul(%qs, %ks)",
        1.0,
    ),
    "prescaled_q_only": ("%qs = Mul(%q, %qc)\n  %t = MatMul(%qs, %kt)", 1.0),
    "prescaled_k_only": ("%ks = Mul(%kc, %kt)\n  %t = MatMul(%q, %ks)", 1.0),
}
MASKS = {
    "add": "%m = Add(%t, %mask)",
    "add_swapped": "%m = Add(%mask, %t)",
    "where": "%m = Where(%cond, %t, %fill)",
    "where_then_add": "%w = Where(%cond, %t, %fill)\n  %m = Add(%w, %mask)",
    "none": "%m = Identity(%t)",
}
TAILS = {
    "plain": "%y = Identity(%p)",
    "nan_guard": "%n = IsNaN(%p)\n  %y = Where(%n, %zero, %p)",
}


def _text(scale="div", mask="add", tail="plain", axis=-1):
    body, c = SCALES[scale]
    text = GRAPH.format(
        c=c, scale=body, mask=MASKS[mask], axis=axis, tail=TAILS[tail], cond="%cond: bool[1,1,4,4]"
    )
    if mask == "none":  # no mask operator at all: the softmax reads the scaled scores
        text = text.replace("  %m = Identity(%t)\n", "").replace(
            "Softmax<axis=-1>(%m)", "Softmax<axis=-1>(%t)"
        )
    return text


def _expected_ops(tail):
    return [FUSED] if tail == "nan_guard" else [FUSED, "Identity"]


@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("scale", sorted(SCALES))
def test_every_variant_matches_and_rewrites(scale, mask, tail):
    check_rule(RULE, _text(scale, mask, tail), matches=1, ops_after=_expected_ops(tail))


def test_softmax_axis_given_as_last_index_matches():
    check_rule(RULE, _text(axis=3), matches=1, ops_after=[FUSED, "Identity"])


def test_softmax_over_another_axis_is_rejected():
    check_no_match(RULE, _text(axis=1), reason=Reason.CHECK_FAILED)


def test_vector_scale_is_not_a_scalar_scale():
    text = _text("mul").replace(
        "init %c: f32[] = [0.35355339]", "init %c: f32[4] = [1.0, 2.0, 3.0, 4.0]"
    )
    check_no_match(RULE, text, reason=Reason.VALUE_MISMATCH)


def test_softmax_without_any_scale_is_not_this_rule():
    text = _text("div").replace("%t = Div(%s, %c)", "%t = Relu(%s)")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_masked_scores_read_elsewhere_block_the_match():
    text = _text("div", "add").replace("-> (%y)", "-> (%y, %m)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
@pytest.mark.parametrize(
    ("model", "count"),
    [("bert", 12), ("minilm", 6), ("gpt2", 12), ("llama", 4), ("llama_gqa", 4), ("resnet50", 0)],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
