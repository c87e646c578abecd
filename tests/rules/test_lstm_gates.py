"""lstm_gates: an LSTM cell's gate math written out; all three sources, numbers unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.patterns.library.lstm_gates import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%gates: f32[2,64], %c: f32[2,16], %other: f32[2,16]) -> (%h2, %c2) {{
  init %sizes: i64[4] = [16, 16, 16, 16]
  init %s0: i64[1] = [0]
  init %s1: i64[1] = [16]
  init %s2: i64[1] = [32]
  init %s3: i64[1] = [48]
  init %s4: i64[1] = [64]
  init %ax: i64[1] = [1]
  {chunk}
  %si = Sigmoid(%i)
  %sf = Sigmoid(%f)
  %tg = Tanh(%gg)
  %so = Sigmoid(%o)
  {tail}
}}
"""
CHUNKS = {
    "split_sizes": "%i, %f, %gg, %o = Split<axis=-1>(%gates, %sizes)",
    "split_num_outputs": "%i, %f, %gg, %o = Split<axis=1, num_outputs=4>(%gates)",
    "slices": "%i = Slice(%gates, %s0, %s1, %ax)\n  %f = Slice(%gates, %s1, %s2, %ax)\n"
    "  %gg = Slice(%gates, %s2, %s3, %ax)\n  %o = Slice(%gates, %s3, %s4, %ax)",
}
TAILS = {
    "torch_order": "%fc = Mul(%sf, %c)\n  %ig = Mul(%si, %tg)\n  %c2 = Add(%fc, %ig)\n"
    "  %tc = Tanh(%c2)\n  %h2 = Mul(%so, %tc)",
    "swapped_operands": "%fc = Mul(%c, %sf)\n  %ig = Mul(%tg, %si)\n  %c2 = Add(%ig, %fc)\n"
    "  %tc = Tanh(%c2)\n  %h2 = Mul(%tc, %so)",
}


def graph(chunk: str = "split_sizes", tail: str = "torch_order") -> str:
    return GRAPH.format(chunk=CHUNKS[chunk], tail=TAILS[tail])


@pytest.mark.parametrize("chunk", sorted(CHUNKS))
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_every_variant_matches_and_rewrites(chunk, tail):
    model = check_rule(RULE, graph(chunk, tail), matches=1, ops_after=None)
    fused = [n for n in model.graph.nodes if n.op_type == "LSTMCellGates"]
    assert len(fused) == 1 and len(fused[0].outputs) == 2  # h' and the exported c'


def test_gates_from_different_tensors_are_rejected():
    text = graph().replace("%sf = Sigmoid(%f)", "%sf = Sigmoid(%other)")
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


def test_sigmoid_on_the_candidate_gate_is_not_this_rule():
    text = graph().replace("%tg = Tanh(%gg)", "%tg = Sigmoid(%gg)")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_gate_activation_read_elsewhere_blocks_the_match():
    text = graph().replace("-> (%h2, %c2)", "-> (%h2, %c2, %si)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


# ------------------------------------------------------------------ the unrolled torch cell
@pytest.fixture(scope="module")
def lstm_sources(tmp_path_factory):
    from graph_autofusion.testing.rnn_cells import SOURCES, cell_model, manual_lstm

    module, args = manual_lstm()
    directory = tmp_path_factory.mktemp("manual_lstm")
    return module, args, {s: cell_model(module, args, s, directory) for s in SOURCES}


@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_manual_lstm_matches_once_per_timestep(lstm_sources, source):
    from graph_autofusion.patterns.candidates import match_rules
    from graph_autofusion.patterns.rules import RuleSet
    from graph_autofusion.testing.rnn_cells import STEPS

    _, _, models = lstm_sources
    report = match_rules(models[source].graph, RuleSet((RULE,)))
    assert report.per_rule[RULE.name].kept == STEPS, report.per_rule[RULE.name].closest


@pytest.mark.parametrize("source", ["dynamo", "torchscript"])
def test_manual_lstm_rewrite_keeps_the_numbers(lstm_sources, source):
    import copy

    import torch

    from graph_autofusion.ir.verify import verify
    from graph_autofusion.patterns.candidates import apply_matches, match_rules
    from graph_autofusion.patterns.rewrite import FUSED_DOMAIN
    from graph_autofusion.patterns.rules import RuleSet
    from graph_autofusion.runtime.interpreter import run_model
    from graph_autofusion.testing.rnn_cells import STEPS

    module, args, models = lstm_sources
    model = copy.deepcopy(models[source])
    feeds = {v.name: a.numpy() for v, a in zip(model.graph.inputs, args)}
    before = run_model(model, feeds)
    report = match_rules(model.graph, RuleSet((RULE,)))
    applied = apply_matches(model, report.kept, native=False)
    assert not [a.error for a in applied if a.error]
    verify(model)
    fused = [n.op_type for n in model.graph.nodes if n.domain == FUSED_DOMAIN]
    assert len(fused) == STEPS and all(f.startswith("LSTMCellGates") for f in fused), fused
    assert "Sigmoid" not in [n.op_type for n in model.graph.nodes]
    after = run_model(model, feeds)
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        h, c = module(*args)
    outs = [after[v.name] for v in model.graph.outputs]
    np.testing.assert_allclose(outs[0], h.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[1], c.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_lstm_is_already_one_fused_operator(source):
    from graph_autofusion.testing.rules import zoo_matches, zoo_model

    # nn.LSTM becomes ONNX LSTM operators in every source: nothing to fuse
    assert zoo_model("lstm", source).graph.op_histogram().get("LSTM") == 2
    assert zoo_matches(RULE, "lstm", source) == 0
