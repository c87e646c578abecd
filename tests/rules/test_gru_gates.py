"""gru_gates: a GRU cell's gate math written out; all three sources, numbers unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.patterns.library.gru_gates import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%gx: f32[2,48], %gh: f32[2,48], %h: f32[2,16], %other: f32[2,16]) -> ({outs}) {{
  init %one: f32[] = [1.0]
  init %s0: i64[1] = [0]
  init %s1: i64[1] = [16]
  init %s2: i64[1] = [32]
  init %s3: i64[1] = [48]
  init %ax: i64[1] = [-1]
  {chunk}
  %ar = Add(%xr, %hr)
  %r = Sigmoid(%ar)
  %az = Add({z_args})
  %z = Sigmoid(%az)
  %rh = Mul(%r, %hn)
  %an = Add(%xn, %rh)
  %n = Tanh(%an)
  {tail}
}}
"""
CHUNKS = {
    "split": "%xr, %xz, %xn = Split<axis=1, num_outputs=3>(%gx)\n"
    "  %hr, %hz, %hn = Split<axis=1, num_outputs=3>(%gh)",
    "slices": "\n  ".join(
        f"%{side}{g} = Slice(%g{side}, %s{k}, %s{k + 1}, %ax)"
        for side in "xh"
        for k, g in enumerate("rzn")
    ),
}
TAILS = {
    "lerp": "%omz = Sub(%one, %z)\n  %a = Mul(%omz, %n)\n  %b = Mul(%z, %h)\n  %y = Add(%a, %b)",
    "lerp_swapped": "%omz = Sub(%one, %z)\n  %a = Mul(%n, %omz)\n  %b = Mul(%h, %z)\n"
    "  %y = Add(%b, %a)",
    "update": "%d = Sub(%h, %n)\n  %zd = Mul(%z, %d)\n  %y = Add(%n, %zd)",
}


def graph(chunk="split", tail="lerp", *, z_args="%xz, %hz", outs="%y") -> str:
    return GRAPH.format(chunk=CHUNKS[chunk], tail=TAILS[tail], z_args=z_args, outs=outs)


@pytest.mark.parametrize("chunk", sorted(CHUNKS))
@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("z_args", ["%xz, %hz", "%hz, %xz"])
def test_every_variant_matches_and_rewrites(chunk, tail, z_args):
    model = check_rule(RULE, graph(chunk, tail, z_args=z_args), matches=1)
    assert [n.op_type for n in model.graph.nodes][-1].startswith("GRUCellGates")


def test_pieces_from_unrelated_tensors_are_rejected():
    check_no_match(RULE, graph(z_args="%xz, %other"), reason=Reason.CHECK_FAILED)


def test_two_instead_of_one_minus_z_is_rejected():
    text = graph().replace("init %one: f32[] = [1.0]", "init %one: f32[] = [2.0]")
    check_no_match(RULE, text, reason=Reason.VALUE_MISMATCH)


def test_reset_gate_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph(outs="%y, %r"), reason=Reason.EXTERNAL_USER)


# ------------------------------------------------------------------ the unrolled torch cell
@pytest.fixture(scope="module")
def gru_sources(tmp_path_factory):
    from graph_autofusion.testing.rnn_cells import SOURCES, cell_model, manual_gru

    module, args = manual_gru()
    directory = tmp_path_factory.mktemp("manual_gru")
    return module, args, {s: cell_model(module, args, s, directory) for s in SOURCES}


@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_manual_gru_matches_once_per_timestep(gru_sources, source):
    from graph_autofusion.patterns.candidates import match_rules
    from graph_autofusion.patterns.rules import RuleSet
    from graph_autofusion.testing.rnn_cells import STEPS

    _, _, models = gru_sources
    report = match_rules(models[source].graph, RuleSet((RULE,)))
    assert report.per_rule[RULE.name].kept == STEPS, report.per_rule[RULE.name].closest


@pytest.mark.parametrize("source", ["torch", "torchscript"])
def test_manual_gru_rewrite_keeps_the_numbers(gru_sources, source, tmp_path):
    import torch

    from graph_autofusion.ir.verify import verify
    from graph_autofusion.patterns.candidates import apply_matches, match_rules
    from graph_autofusion.patterns.rewrite import FUSED_DOMAIN
    from graph_autofusion.patterns.rules import RuleSet
    from graph_autofusion.runtime.interpreter import run_model
    from graph_autofusion.testing.rnn_cells import STEPS, cell_model

    module, args, _ = gru_sources
    model = cell_model(module, args, source, tmp_path)  # a fresh copy to rewrite
    feeds = {v.name: a.numpy() for v, a in zip(model.graph.inputs, args)}
    before = run_model(model, feeds)
    report = match_rules(model.graph, RuleSet((RULE,)))
    applied = apply_matches(model, report.kept, native=False)
    assert not [a.error for a in applied if a.error]
    verify(model)
    fused = [n.op_type for n in model.graph.nodes if n.domain == FUSED_DOMAIN]
    assert len(fused) == STEPS and all(f.startswith("GRUCellGates") for f in fused), fused
    after = run_model(model, feeds)
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        h = module(*args)
    (out,) = [after[v.name] for v in model.graph.outputs]
    np.testing.assert_allclose(out, h.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_lstm_has_no_gru_cells(source):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, "lstm", source) == 0
