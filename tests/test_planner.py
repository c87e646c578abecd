"""Fusion planner: overlap-free, jointly acyclic selections; dp and evolutionary >= greedy."""

from __future__ import annotations

import random

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.planner.plan import PlanCandidate, PlanReason, plan

CHAIN = """
graph g(%x: f32[4]) -> (%y) {
  %a = Neg(%x) @n1
  %b = Neg(%a) @n2
  %c = Neg(%b) @n3
  %d = Neg(%c) @n4
  %y = Neg(%d) @n5
}
"""


def nodes(model):
    return {n.name: n for n in model.graph.nodes}


def cand(key, ns, saving, **kw):
    return PlanCandidate(key, tuple(ns), saving, **kw)


def test_dp_beats_greedy_where_greedy_is_myopic():
    n = nodes(parse_model(CHAIN))
    cands = [
        cand("big", [n["n2"], n["n3"]], 5.0),
        cand("left", [n["n1"], n["n2"]], 3.0),
        cand("right", [n["n3"], n["n4"]], 3.0),
    ]
    greedy = plan(cands, "greedy")
    dp = plan(cands, "dp")
    evo = plan(cands, "evolutionary", seed=1)
    assert [c.key for c in greedy.chosen] == ["big"] and greedy.total_saving_s == 5.0
    assert sorted(c.key for c in dp.chosen) == ["left", "right"] and dp.total_saving_s == 6.0
    assert evo.total_saving_s >= greedy.total_saving_s
    lost = {r.candidate.key: r.code for r in dp.rejected}
    assert lost == {"big": PlanReason.OVERLAP}


def test_illegal_and_useless_candidates_keep_their_reasons():
    n = nodes(parse_model(CHAIN))
    cands = [
        cand("ok", [n["n1"], n["n2"]], 1.0),
        cand(
            "overflow",
            [n["n3"], n["n4"]],
            9.0,
            legal=False,
            code="skip-local-memory-overflow",
            message="tile needs 300 KB, 192 KB available",
        ),
        cand("slower", [n["n4"], n["n5"]], -0.5),
    ]
    p = plan(cands, "auto")
    assert [c.key for c in p.chosen] == ["ok"]
    codes = {r.candidate.key: (r.code, r.message) for r in p.rejected}
    assert codes["overflow"] == (
        "skip-local-memory-overflow",
        "tile needs 300 KB, 192 KB available",
    )
    assert codes["slower"][0] == PlanReason.NO_SAVING


def test_two_convex_groups_that_form_a_cycle_together_are_not_both_taken():
    text = """
    graph g(%x: f32[4], %y: f32[4]) -> (%b, %c) {
      %a = Neg(%x) @a
      %d = Neg(%y) @d
      %b = Neg(%a) @b
      %c = Neg(%d) @c
    }
    """
    n = nodes(parse_model(text))
    # {a, c} is convex, {d, b} is convex, but a->b and d->c make the pair a cycle
    g1 = cand("g1", [n["a"], n["c"]], 2.0)
    g2 = cand("g2", [n["d"], n["b"]], 1.0)
    for strategy in ("greedy", "dp", "evolutionary"):
        p = plan([g1, g2], strategy)
        assert [c.key for c in p.chosen] == ["g1"], strategy
        assert [(r.candidate.key, r.code) for r in p.rejected] == [("g2", PlanReason.CYCLE)]


def test_searches_are_never_below_greedy_on_random_conflicts():
    from graph_autofusion.testing.synthetic import synthetic_transformer

    graph = synthetic_transformer(600).graph
    order = graph.nodes
    rng = random.Random(0)
    cands = []
    for k in range(300):
        start = rng.randrange(len(order) - 6)
        size = rng.randint(2, 5)
        cands.append(cand(f"c{k}", order[start : start + size], rng.uniform(0.1, 5.0)))
    totals = {s: plan(cands, s, seed=3).total_saving_s for s in ("greedy", "dp", "evolutionary")}
    assert totals["dp"] >= totals["greedy"] - 1e-12
    assert totals["evolutionary"] >= totals["greedy"] - 1e-12
    for s in ("greedy", "dp", "evolutionary", "auto"):
        p = plan(cands, s, seed=3)
        claimed = [n for c in p.chosen for n in c.nodes]
        assert len(claimed) == len(set(claimed)), s
        assert len(p.chosen) + len(p.rejected) == len(cands), s


def test_unknown_strategy():
    with pytest.raises(ValueError, match="known: \\['auto', 'greedy', 'dp', 'evolutionary'\\]"):
        plan([], "simulated-annealing")
