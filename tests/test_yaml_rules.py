"""Declarative YAML rule files: loading, matching, and errors naming file and line."""

from __future__ import annotations

import math

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.matcher import Match, match_at
from graph_autofusion.patterns.yaml_rules import RuleFileError, load_rule_file, load_rule_text

RULES = """
rules:
  - name: attention_scale_by_div
    fused_op: AttentionScaleMask
    pattern: "Softmax(Add(Div(x, const(scale, scalar=true)), mask), axis=-1)"
    priority: 10
    benefit_threshold: 0.1
    presets: [transformer, llm]
  - name: bias_activation
    fused_op: BiasActivation
    pattern: "(Relu|Gelu|Sigmoid)(Add(x, const(b)), label=\\"act\\")"
    presets: [transformer]
"""

G = f"""
graph g(%x: f32[1,2,4,4], %mask: f32[1,1,4,4]) -> (%y, %z) {{
  init %scale: f32[] = [{math.sqrt(4.0)}]
  init %b: f32[4] = ones
  %s = Div(%x, %scale) @div
  %m = Add(%mask, %s) @add
  %y = Softmax<axis=-1>(%m) @softmax
  %a = Add(%x, %b) @bias
  %z = Gelu(%a) @gelu
}}
"""


def test_rules_load_and_match(tmp_path):
    path = tmp_path / "my_rules.yaml"
    path.write_text(RULES)
    rules = load_rule_file(path)
    assert [r.name for r in rules] == ["attention_scale_by_div", "bias_activation"]
    attn, bias = rules.rules
    assert attn.priority == 10 and attn.benefit_threshold == 0.1
    assert attn.presets == ("transformer", "llm") and attn.fuse_pattern == "AttentionScaleMask"
    g = parse_model(G).graph
    by_name = {n.name: n for n in g.nodes}
    m = match_at(attn.pattern, by_name["softmax"])
    assert isinstance(m, Match) and [n.name for n in m.nodes] == ["div", "add", "softmax"]
    m2 = match_at(bias.pattern, by_name["gelu"])
    assert isinstance(m2, Match) and m2.labels["act"].name == "gelu"


@pytest.mark.parametrize(
    "text, message",
    [
        ("rules: [", "line 1: not valid YAML"),
        ("foo: 1", "must be a mapping with a 'rules' list"),
        (
            "rules:\n  - name: a\n    pattern: 'Relu(x)'\n",
            "line 2: rule is missing required key(s) ['fused_op']",
        ),
        (
            "rules:\n  - name: a\n    fused_op: A\n    pattern: 'Relu(x'\n",
            "line 2: rule 'a': pattern: syntax error",
        ),
        ("rules:\n  - name: a\n    fused_op: A\n    pattern: 'x'\n", "root must be an operator"),
        (
            "rules:\n  - name: a\n    fused_op: A\n    pattern: 'Relu(x)'\n    colour: red\n",
            "unknown key(s) ['colour']",
        ),
        (
            "rules:\n  - name: a\n    fused_op: A\n    pattern: 'Relu(x)'\n  - name: a\n    fused_op: B\n    pattern: 'Relu(x)'\n",
            "line 5: rule name 'a' already used on line 2",
        ),
        (
            "rules:\n  - name: a\n    fused_op: A\n    pattern: 'Relu(__import__(x))'\n",
            "unknown function",
        ),
        (
            "rules:\n  - name: a\n    fused_op: A\n    pattern: 'Relu(x)'\n    priority: high\n",
            "priority has the wrong type",
        ),
    ],
)
def test_malformed_files_name_file_line_and_problem(text, message):
    with pytest.raises(RuleFileError) as err:
        load_rule_text(text, "rules.yaml")
    assert str(err.value).startswith("rules.yaml")
    assert message in str(err.value)


def test_missing_file():
    with pytest.raises(RuleFileError, match="cannot read rule file"):
        load_rule_file("/nonexistent/rules.yaml")
