"""Shape and dtype constraints between pattern variables, in Python and in YAML rule files."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.constraints import (
    broadcastable,
    last_dim,
    rank,
    same_dtype,
    same_shape,
    static,
)
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rules import FusionRule, RuleSet
from graph_autofusion.patterns.yaml_rules import RuleFileError, load_rule_text

p = PatternBuilder()
G = """
graph g(%x: f32[2,4,8], %b: f32[{bshape}], %d: f32[B,8]) -> (%y, %z) {{
  %a = Add(%x, %b)
  %y = Relu(%a)
  %c = Add(%d, %d)
  %z = Relu(%c)
}}
"""


def count(rule, bshape="8"):
    report = match_rules(parse_model(G.format(bshape=bshape)).graph, RuleSet((rule,)))
    rr = report.per_rule[rule.name]
    return len(rr.matches), rr.closest


def rule_with(*checks):
    return FusionRule(
        "t", pattern=p.Relu(p.Add(p.var("x"), p.var("b"))), fuse_pattern="T", checks=checks
    )


@pytest.mark.parametrize(
    ("bshape", "ok"), [("8", True), ("1,8", True), ("4,1", True), ("3", False), ("1,2,4,8", True)]
)
def test_broadcastable(bshape, ok):
    n, closest = count(rule_with(broadcastable("x", "b")), bshape)
    # the second Add(%d, %d) also broadcasts; only the first graph's bias varies
    assert (n == 2) is ok
    if not ok:
        assert closest.code == "check-failed" and "does not broadcast" in closest.message


def test_same_shape_rank_last_dim_static_dtype():
    assert count(rule_with(same_shape("x", "b")), "2,4,8")[0] == 2
    n, closest = count(rule_with(same_shape("x", "b")), "8")
    assert n == 1 and "differ in shape" in closest.message
    assert count(rule_with(rank("x", 3)))[0] == 1
    assert count(rule_with(last_dim("x", 8)))[0] == 2
    assert count(rule_with(last_dim("x", "b")))[0] == 2
    assert count(rule_with(last_dim("x", 4)))[0] == 0
    n, closest = count(rule_with(static("x")))
    assert n == 1 and "no static shape" in closest.message
    assert count(rule_with(same_dtype("x", "b")))[0] == 2


def test_var_last_dim_constraint():
    rule = FusionRule(
        "t2", pattern=p.Relu(p.Add(p.var("x", last_dim=8), p.var("b"))), fuse_pattern="T"
    )
    assert count(rule)[0] == 2


YAML = """
rules:
  - name: bias_relu
    fused_op: BiasRelu
    pattern: "Relu(Add(x, var(b, last_dim=8)))"
    checks: ["broadcastable(x, b)", "rank(x, 3)"]
"""


def test_yaml_checks():
    (rule,) = load_rule_text(YAML)
    assert count(rule)[0] == 1
    assert count(rule, "3")[0] == 0


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ("nonsense(x)", "unknown constraint"),
        ("rank(x", "syntax error"),
        ("rank(x, 1, 2)", "rank(x, 1, 2)"),
    ],
)
def test_yaml_bad_checks_name_the_line(check, message):
    text = YAML.replace('"rank(x, 3)"', f'"{check}"')
    with pytest.raises(RuleFileError, match=r"<string>, line 3.*") as e:
        load_rule_text(text)
    assert message in str(e.value)


def test_constraint_on_unbound_variable_says_so():
    with pytest.raises(KeyError, match="does not bind"):
        count(rule_with(rank("nope", 3)))
