"""Rule records, rule sets and overlap resolution by priority."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rules import (
    FusionRule,
    FusionRuleConflict,
    RuleMatch,
    RuleSet,
    resolve_overlaps,
)

G = """
graph g(%x: f32[2,8], %r: f32[2,8]) -> (%y) {
  init %s: f32[8] = ones
  init %b: f32[8] = zeros
  %a = Add(%x, %r) @residual
  %y = LayerNormalization<axis=-1, epsilon=1e-05>(%a, %s, %b) @ln
}
"""


def all_matches(graph, rules):
    out = []
    for rule in rules:
        matches, _ = rule.match(graph)
        out += [RuleMatch(rule, m) for m in matches]
    return out


def test_article_simple_form_matches_producer_consumer_pair():
    rule = FusionRule("ln_add", op1="Add", op2="LayerNorm", benefit_threshold=0.2, priority=1)
    assert rule.fuse_pattern == "AddLayerNorm"
    matches, _ = rule.match(parse_model(G).graph)
    assert [[n.name for n in m.nodes] for m in matches] == [["residual", "ln"]]


def test_rule_sets_compose_and_filter_by_preset():
    a = FusionRule("a", op1="Add", op2="LayerNorm", presets=("transformer",))
    b = FusionRule("b", op1="MatMul", op2="Add", presets=("transformer", "llm"))
    rs = a + b
    assert isinstance(rs, RuleSet) and [r.name for r in rs] == ["a", "b"]
    assert [r.name for r in rs.preset("llm")] == ["b"]
    with pytest.raises(ValueError, match="appear twice"):
        rs + a


def test_equal_priority_overlap_raises_naming_both_rules():
    g = parse_model(G).graph
    r1 = FusionRule("skip_ln", op1="Add", op2="LayerNorm", priority=1)
    p = PatternBuilder()
    r2 = FusionRule(
        "ln_only", pattern=p.LayerNormalization(p.var("x"), p.var("s"), p.var("b")), priority=1
    )
    with pytest.raises(
        FusionRuleConflict, match=r"'skip_ln' and 'ln_only'.*\['ln'\]|'ln_only' and 'skip_ln'"
    ):
        resolve_overlaps(all_matches(g, [r1, r2]))


def test_higher_priority_wins():
    g = parse_model(G).graph
    p = PatternBuilder()
    r1 = FusionRule("skip_ln", op1="Add", op2="LayerNorm", priority=2)
    r2 = FusionRule(
        "ln_only", pattern=p.LayerNormalization(p.var("x"), p.var("s"), p.var("b")), priority=1
    )
    kept, dropped = resolve_overlaps(all_matches(g, [r2, r1]))
    assert [k.rule.name for k in kept] == ["skip_ln"]
    assert [(d.rule.name, w.rule.name) for d, w in dropped] == [("ln_only", "skip_ln")]
