"""Issue-level checks of fusion candidates on the real model architectures, every source.

* The matches a user expects, per model and source (``dynamo`` and ``torchscript`` ONNX
  exports, and the PyTorch frontend's graph ``torch``), in one table.
* Every preset resolves its overlaps without a ``FusionRuleConflict`` on every model.
* Rewriting every selected match (native form where a rule has one and it applies, generic
  local function otherwise) gives a graph that passes ``onnx.checker`` and whose onnxruntime
  outputs match the original's.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx
from graph_autofusion.ir.verify import verify
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import PRESETS, RuleSet
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing import EXPORTERS, example_feeds, export_onnx
from graph_autofusion.testing.rules import SOURCES, zoo_model

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("models")]

ALL = SOURCES
ONNX = EXPORTERS
#: (model, sources, rule, expected raw matches of that rule alone)
EXPECTED = [
    ("bert", ALL, "attention", 12),
    ("bert", ALL, "skip_layernorm", 25),  # 24 residual + the embedding sum before its LN
    ("bert", ALL, "bias_gelu", 12),
    ("bert", ALL, "qkv_horizontal", 12),
    ("minilm", ALL, "attention", 6),
    ("minilm", ALL, "skip_layernorm", 13),
    ("minilm", ALL, "bias_gelu", 6),
    ("gpt2", ALL, "attention", 12),
    ("gpt2", ALL, "gelu_tanh", 12),
    ("gpt2", ALL, "skip_layernorm", 25),  # ln_1 and ln_2 of 12 blocks after residuals, ln_f
    ("gpt2", ("torchscript", "torch"), "bias_gelu", 12),
    ("gpt2", ("dynamo",), "bias_gelu", 0),  # the exporter folds away the all-zero c_fc bias
    ("llama", ALL, "attention", 4),
    ("llama", ALL, "rmsnorm", 9),
    ("llama", ALL, "rotary_embedding", 8),  # Q and K of 4 layers
    ("llama", ALL, "swiglu", 4),
    ("llama_gqa", ALL, "attention", 4),
    ("llama_gqa", ALL, "rmsnorm", 9),
    ("llama_gqa", ALL, "rotary_embedding", 8),
    ("llama_gqa", ALL, "swiglu", 4),
    ("resnet50", ("torch",), "conv_bn", 53),  # the PyTorch graph keeps BatchNorm
    ("resnet50", ("torch",), "conv_bn_relu", 33),
    ("resnet50", ALL, "add_relu", 16),
    ("resnet50", ONNX, "conv_add_relu", 16),  # exporters fold BatchNorm into the Conv
    ("resnet50_bn", ONNX, "conv_bn", 53),
    ("resnet50_bn", ONNX, "conv_bn_relu", 33),
    ("resnet50_bn", ONNX, "add_relu", 16),
    ("lstm", ALL, "lstm_gates", 0),  # nn.LSTM is one ONNX LSTM operator: already one kernel
]
CASES = [(m, s, r, n) for m, sources, r, n in EXPECTED for s in sources]


@pytest.mark.parametrize(
    ("model", "source", "rule", "count"), CASES, ids=[f"{m}-{s}-{r}" for m, s, r, _ in CASES]
)
def test_expected_matches(model, source, rule, count):
    graph = zoo_model(model, source).graph
    report = match_rules(graph, RuleSet((builtin_rules().get(rule),)))
    assert report.per_rule[rule].kept == count, report.per_rule[rule].closest


MODELS = ["bert", "minilm", "gpt2", "llama", "llama_gqa", "resnet50", "resnet50_bn", "lstm"]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("model", MODELS)
def test_every_preset_resolves_without_conflict(model, source):
    graph = zoo_model(model, source).graph
    for preset in (*PRESETS, "all"):
        report = match_rules(graph, builtin_rules().preset(preset))
        claimed = [n for k in report.kept for n in k.match.nodes]
        assert len(claimed) == len(set(claimed)), preset


def _ort(model_bytes, feeds):
    sess = ort_session(model_bytes, "disable", 2)
    wanted = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in wanted})


FUSE_CASES = [(m, e) for m in MODELS for e in EXPORTERS]


@pytest.mark.parametrize(("model", "exporter"), FUSE_CASES, ids=[f"{m}-{e}" for m, e in FUSE_CASES])
def test_rewriting_every_selected_match_keeps_onnxruntime_outputs(model, exporter):
    path = export_onnx(model, exporter)
    ir = load_onnx(path)
    report = match_rules(ir.graph, builtin_rules())
    applied = apply_matches(ir, report.kept, fallback_generic=True)
    # stale: an earlier native form (attention skipping a grouped-query repeat) read past it
    hard = [
        a.error
        for a in applied
        if a.error
        and not a.error.startswith("fallback:")
        and "no longer in the graph" not in a.error
    ]
    assert not hard, hard
    verify(ir)
    fused = to_onnx(ir)
    onnx.checker.check_model(fused)
    feeds = example_feeds("resnet50" if model == "resnet50_bn" else model)
    before = _ort(onnx.load(str(path)).SerializeToString(), feeds)
    after = _ort(fused.SerializeToString(), feeds)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        cos = a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64) + 1e-30)
        assert cos >= 0.9999, cos
        assert np.max(np.abs(a64 - b64)) <= 1e-4 * max(1.0, np.max(np.abs(b64)))
    fused_ops = sum(1 for n in ir.graph.nodes if n.domain not in ("", "ai.onnx"))
    assert fused_ops >= len([a for a in applied if not a.error]) // 2
