"""Candidates through the API and the command line: match, rules validate, rules list."""

from __future__ import annotations

import json

import pytest

from graph_autofusion import FusionRule, FusionRuleConflict, GraphAutoFusion
from graph_autofusion.cli import main
from graph_autofusion.frontend.onnx_frontend import save_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.pattern import PatternBuilder

TEXT = """
model opset {"": 18}
graph g(%x: f32[2,4,8], %res: f32[2,4,8]) -> (%y) {
  init %w: f32[8,8] = randn(0)
  init %b: f32[8] = randn(1)
  init %g: f32[8] = ones
  init %be: f32[8] = zeros
  %m: f32[2,4,8] = MatMul(%x, %w)
  %a: f32[2,4,8] = Add(%m, %b)
  %s: f32[2,4,8] = Add(%a, %res)
  %n: f32[2,4,8] = LayerNormalization<axis=-1, epsilon=1e-5>(%s, %g, %be)
  %t: f32[2,4,8] = Tanh(%n)
  %u: f32[2,4,8] = Mul(%t, %n)
  %y: f32[2,4,8] = Exp(%u)
}
"""

RULES_YAML = """
rules:
  - name: tanh_mul
    fused_op: TanhMul
    pattern: "Mul(Tanh(x), x)"
    priority: 7
    presets: [transformer]
"""


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "m.onnx"
    save_onnx(parse_model(TEXT), path)
    return path


def test_api_candidates_with_a_rule_file(model_path, tmp_path):
    rules = tmp_path / "r.yaml"
    rules.write_text(RULES_YAML)
    report = GraphAutoFusion(model_path, preset="transformer", rule_files=[rules]).candidates()
    counts = report.rules.counts()
    assert counts["skip_layernorm"] == 1 and counts["tanh_mul"] == 1
    assert report.clusters is not None and report.pairs
    data = report.to_dict()
    never = {r["rule"]: r for r in data["rules"] if r["matches"] == 0}
    assert "closest" in never["gelu_erf"] or never["gelu_erf"]["roots"] == []
    text = report.to_text()
    assert "skip_layernorm" in text and "automatic clusters" in text and "operator pairs" in text


def test_register_custom_fusion_and_conflict(model_path):
    p = PatternBuilder()
    gaf = GraphAutoFusion(model_path, preset="transformer")
    clash = FusionRule(
        "ln_again",
        pattern=p.LayerNormalization(p.var("s"), p.var("g"), p.var("b")),
        fuse_pattern="LN",
        priority=builtin_rules().get("skip_layernorm").priority,
    )
    gaf.register_custom_fusion(clash)
    with pytest.raises(
        FusionRuleConflict, match="skip_layernorm.*ln_again|ln_again.*skip_layernorm"
    ):
        gaf.candidates()
    higher = FusionRule(
        "ln_higher",
        pattern=p.LayerNormalization(p.var("s"), p.var("g"), p.var("b")),
        fuse_pattern="LN",
        priority=10_000,
    )
    gaf2 = GraphAutoFusion(model_path, preset="transformer", rules=[higher])
    report = gaf2.candidates()
    assert report.rules.counts()["ln_higher"] == 1
    assert report.rules.counts()["skip_layernorm"] == 0


def test_cli_match_text_and_json(model_path, capsys):
    assert main(["match", str(model_path), "--preset", "transformer"]) == 0
    out = capsys.readouterr().out
    assert "skip_layernorm" in out and "never fired; closest" in out
    assert main(["match", str(model_path), "--preset", "all", "--json", "--no-clusters"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["preset"] == "all" and "clusters" not in data
    assert any(r["rule"] == "skip_layernorm" and r["kept"] == 1 for r in data["rules"])


def test_cli_unknown_preset_and_missing_model(model_path, tmp_path, capsys):
    assert main(["match", str(model_path), "--preset", "vision"]) == 2
    assert "unknown preset 'vision'" in capsys.readouterr().err
    assert main(["match", str(tmp_path / "nope.onnx")]) == 2


def test_cli_rules_validate(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(RULES_YAML)
    assert main(["rules", "validate", str(good)]) == 0
    assert "1 rule(s) OK: tanh_mul" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(RULES_YAML.replace("    fused_op: TanhMul\n", ""))
    assert main(["rules", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml, line 3" in err and "fused_op" in err


def test_cli_rules_list(capsys):
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{len(builtin_rules())} rules" in out and "attention" in out
    assert main(["rules", "list", "--preset", "cnn", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in data} >= {"conv_bn", "conv_bn_relu", "add_relu"}
    assert all("cnn" in r["presets"] for r in data)


def test_library_has_24_rules_in_four_presets_with_docs():
    rules = builtin_rules()
    assert len(rules) >= 24
    for preset in ("transformer", "llm", "cnn", "rnn"):
        assert len(rules.preset(preset)) >= 2, preset
    assert len({r.priority for r in rules}) == len(rules), "built-in priorities must be distinct"
    for r in rules:
        assert r.doc, r.name
