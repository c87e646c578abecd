"""Safe mode's one speed policy choosing among engines (``SpeedPolicy.choose``): fake sides and
a fake timer that returns fixed costs per side, so the choice, the margin and the confirming
second measurement are decided by the test, never by the machine's speed."""

from __future__ import annotations

import itertools

import pytest

from graph_autofusion.runtime.timing import use_timer
from graph_autofusion.verify.speed import SpeedPolicy

KEY = "engine@graph0"


class Sides:
    """Three engines that log every call; ``timer`` logs each timed call and returns the cost
    ``costs[side]`` gives (a number, or an iterator of numbers: one per timed call)."""

    def __init__(self, costs: dict, names=("onnxruntime", "torch", "eager")) -> None:
        self.log: list[tuple[str, str]] = []
        self.costs = {k: v if isinstance(v, float) else iter(v) for k, v in costs.items()}
        self.fns = {n: (lambda n=n: self.log.append(("call", n))) for n in names}
        self.keys: set[str] = set()

    def timer(self, key, side, fn):
        self.keys.add(key)
        self.log.append(("timed", side))
        fn()
        cost = self.costs[side]
        return cost if isinstance(cost, float) else next(cost)

    def timed(self) -> list[str]:
        return [n for what, n in self.log if what == "timed"]


def _choose(sides: Sides, margin=1.10, rounds=5):
    return SpeedPolicy(margin).choose(sides.fns, "eager", KEY, rounds=rounds, timer=sides.timer)


@pytest.mark.parametrize("fastest", ["onnxruntime", "torch", "eager"])
def test_the_fastest_side_is_chosen_with_its_median_seconds(fastest):
    sides = Sides({"onnxruntime": 3e-3, "torch": 2e-3, "eager": 4e-3, fastest: 1e-3})
    best, seconds = _choose(sides)
    assert best == fastest
    assert seconds[fastest] == 1e-3 and set(seconds) == {"onnxruntime", "torch", "eager"}
    assert sides.keys == {KEY}


def test_warm_up_then_shuffled_rounds_each_timed_call_right_after_an_untimed_one():
    sides = Sides({"onnxruntime": 1e-3, "torch": 2e-3, "eager": 3e-3})
    _choose(sides, rounds=5)
    log = sides.log
    assert log[:3] == [("call", "onnxruntime"), ("call", "torch"), ("call", "eager")]
    rounds = [log[3 + 9 * r : 3 + 9 * (r + 1)] for r in range(5)]
    assert len(log) == 3 + 9 * 5  # a faster engine: no second measurement
    orders = []
    for rnd in rounds:
        # each side: an untimed call, then its timed call (which calls it once more)
        steps = [rnd[i : i + 3] for i in range(0, 9, 3)]
        for (a, n1), (b, n2), (c, n3) in steps:
            assert (a, b, c) == ("call", "timed", "call") and n1 == n2 == n3
        orders.append(tuple(s[0][1] for s in steps))
        assert sorted(orders[-1]) == ["eager", "onnxruntime", "torch"]
    assert len(set(orders)) > 1  # the order changes between rounds
    again = Sides({"onnxruntime": 1e-3, "torch": 2e-3, "eager": 3e-3})
    _choose(again, rounds=5)
    assert again.log == log  # seeded: the same orders every time


def test_a_side_whose_timed_call_is_long_is_not_called_untimed_before_the_next():
    """A 50 ms eager prefill is in steady state by itself: after its first timed call it is
    timed without the untimed call before; the 1 ms engine keeps its untimed calls."""
    sides = Sides({"onnxruntime": 1e-3, "eager": 50e-3}, names=("onnxruntime", "eager"))
    _choose(sides, rounds=5)
    log = sides.log[2:]  # after the warm-up calls
    for name, untimed in (("onnxruntime", 5), ("eager", 1)):
        calls = sum(1 for entry in log if entry == ("call", name))
        timed = sum(1 for entry in log if entry == ("timed", name))
        # a timed call logs "timed" and then its own "call"; an untimed one logs "call" only
        assert timed == 5 and calls - timed == untimed, (name, log)


def test_each_side_s_calls_follow_a_pause_so_another_runtime_s_threads_stop(monkeypatch):
    """torch's OpenMP workers spin on for milliseconds after eager; an onnxruntime side timed
    inside that window competes with them for the cores. Every side's untimed call, and its
    timed call where none precedes it, comes after a pause of ``ENGINE_SETTLE_S``."""
    from graph_autofusion import defaults
    from graph_autofusion.verify import speed

    sides = Sides({"onnxruntime": 1e-3, "eager": 50e-3}, names=("onnxruntime", "eager"))
    monkeypatch.setattr(speed.time, "sleep", lambda s: sides.log.append(("sleep", s)))
    _choose(sides, rounds=4)
    log = sides.log[2:]  # after the warm-up calls (no pause: nothing was timed yet)
    assert defaults.ENGINE_SETTLE_S > 0
    turns, i = [], 0
    while i < len(log):
        assert log[i] == ("sleep", defaults.ENGINE_SETTLE_S), log[i:]
        j = i + 1
        while j < len(log) and log[j][0] != "sleep":
            j += 1
        turns.append([n for _, n in log[i + 1 : j]])
        i = j
    # one pause per side per round, before its calls (untimed and timed, or timed alone)
    assert len(turns) == 8 and all(t and len(set(t)) == 1 for t in turns)


def test_a_side_slower_than_the_baseline_within_the_margin_is_kept():
    sides = Sides({"onnxruntime": 1.08e-3, "torch": 1.2e-3, "eager": 1e-3})
    best, _ = _choose(sides, margin=1.10)
    assert best == "onnxruntime"
    assert len(sides.timed()) == 3 * 5  # no second measurement


def test_every_side_slower_than_the_baseline_by_the_margin_is_confirmed_then_the_baseline():
    sides = Sides({"onnxruntime": 1.3e-3, "torch": 1.2e-3, "eager": 1e-3})
    best, seconds = _choose(sides, margin=1.10)
    assert best == "eager" and seconds == {"onnxruntime": 1.3e-3, "torch": 1.2e-3, "eager": 1e-3}
    timed = sides.timed()
    # the first measurement (3 sides x 5 rounds), then the best engine and eager alone, 5 rounds
    assert len(timed) == 3 * 5 + 2 * 5
    assert sorted(timed[15:]) == ["eager"] * 5 + ["torch"] * 5


def test_a_slower_verdict_the_second_measurement_does_not_confirm_keeps_the_engine():
    # torch looks slow in the first measurement (a noisy neighbour), not in the second
    sides = Sides(
        {
            "onnxruntime": 2e-3,
            "torch": itertools.chain([1.5e-3] * 5, itertools.repeat(1e-3)),
            "eager": 1e-3,
        }
    )
    best, seconds = _choose(sides, margin=1.10)
    assert best == "torch" and seconds["torch"] == 1e-3  # the second measurement's median


def test_the_confirmation_needs_the_best_run_slower_too():
    # the second measurement: torch's median slower by the margin, its best run not
    torch_costs = [1.5e-3] * 5 + [1.5e-3, 1.5e-3, 1.5e-3, 1.5e-3, 0.9e-3]
    sides = Sides({"onnxruntime": 2e-3, "torch": torch_costs, "eager": 1e-3})
    best, _ = _choose(sides, margin=1.10)
    assert best == "torch"


def test_the_baseline_alone_and_a_missing_baseline():
    sides = Sides({"eager": 1e-3}, names=("eager",))
    assert _choose(sides) == ("eager", {"eager": 1e-3})
    with pytest.raises(ValueError, match="baseline"):
        SpeedPolicy().choose({"torch": lambda: None}, "eager", KEY, timer=sides.timer)


def test_choose_reads_the_current_timer():
    sides = Sides({"onnxruntime": 3e-3, "torch": 1e-3, "eager": 2e-3})
    with use_timer(sides.timer):
        best, _ = SpeedPolicy().choose(sides.fns, "eager", KEY, rounds=2)
    assert best == "torch" and len(sides.timed()) == 3 * 2


def test_round_robin_pauses_before_every_timed_call_only(monkeypatch):
    """``settle_s``: one untimed pause before each timed call (benchmarks let a spinning
    onnxruntime session's workers go idle before the next configuration runs)."""
    import graph_autofusion.runtime.timing as timing

    events: list[str] = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(f"sleep {s}"))
    fns = {k: (lambda k=k: events.append(k)) for k in ("a", "b")}
    times = timing.round_robin(fns, 3, warmup=1, rotate=True, settle_s=0.05)
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert events[:2] == ["a", "b"]  # the warm-up calls: no pause
    timed = events[2:]
    assert len(timed) == 12 and timed[0::2] == ["sleep 0.05"] * 6
    assert sorted(timed[1::2]) == ["a"] * 3 + ["b"] * 3
    events.clear()
    timing.round_robin(fns, 2, warmup=0)
    assert not any(e.startswith("sleep") for e in events)  # no pause unless asked
    events.clear()  # pre_calls: after the pause, the same function untimed, then timed
    times = timing.round_robin(fns, 2, warmup=0, settle_s=0.05, pre_calls=1)
    assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}
    turns = [events[i : i + 3] for i in range(0, len(events), 3)]
    assert len(turns) == 4 and all(t[0] == "sleep 0.05" and t[1] == t[2] for t in turns)
