"""Safe mode's one speed policy, for every target: is a fusion slower than the operators it
replaces?

    policy = SpeedPolicy(margin=options.speed_margin)
    unfused_us, fused_us, slower = policy.measure(run_unfused, run_fused, key="gelu@/mlp/Mul")

Both sides run interleaved (so a change of the machine's load hits both alike) after
:attr:`SpeedPolicy.warmup` warm-up calls each, up to :attr:`SpeedPolicy.runs` timed calls each,
stopping after :data:`~graph_autofusion.defaults.SPEED_EARLY_RUNS` when the verdict is already
clear (:meth:`SpeedPolicy.clear`). The fused side is slower when its median time is above
``margin`` times the unfused median; a slower verdict is confirmed by a second measurement of
twice the runs, by median and by best run alike, before it stands. Every call is timed through
:func:`graph_autofusion.runtime.timing.current_timer` (a test swaps it with ``use_timer``).

The onnxruntime target times two onnxruntime sessions of a fusion's subgraph
(:func:`graph_autofusion.verify.safety.check_fusion`); the cpu target a generated kernel against
its unfused operators on torch (``pipeline/cpu_kernels.py::check_kernel``).

Choosing among whole programs (engines) is the same rule over more than two sides::

    best, seconds = policy.choose({"onnxruntime": f, "torch": g, "eager": h}, "eager", key)

:meth:`SpeedPolicy.engine_times` times every side in rounds of a seeded shuffled order, each
side called once untimed right before its timed call; the fastest side other than the
baseline wins unless its median is above ``margin`` times the baseline's; that verdict
(every other side slower than the baseline) is confirmed, as :meth:`~SpeedPolicy.measure`
confirms a slower fusion, by a second measurement of the best side against the baseline, by
median and by best run alike (``torch_compile.CompiledGraph._choose``).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from graph_autofusion import defaults
from graph_autofusion.runtime.timing import Timer, current_timer


@dataclass(frozen=True)
class SpeedPolicy:
    """The speed check's rule: ``margin`` (``FuseOptions.speed_margin``), timed ``runs`` per
    side (twice as many to confirm a slower verdict), ``warmup`` untimed calls first."""

    margin: float = defaults.SPEED_MARGIN
    runs: int = 20
    warmup: int = 3

    def clear(self, unfused_us: list[float], fused_us: list[float]) -> bool:
        """Whether the runs so far decide already: the fused median well below the margin
        (``margin x SPEED_CLEAR``) or well above it (``margin / SPEED_CLEAR``)."""
        ratio = statistics.median(fused_us) / max(statistics.median(unfused_us), 1e-12)
        low, high = self.margin * defaults.SPEED_CLEAR, self.margin / defaults.SPEED_CLEAR
        return not low < ratio < high

    def times(
        self,
        unfused: Callable[[], object],
        fused: Callable[[], object],
        key: str,
        runs: int,
        timer: Timer,
        early: bool = True,
    ) -> tuple[list[float], list[float]]:
        """Per-call microseconds of each side, interleaved, after the warm-up calls;
        ``early``: stop once :meth:`clear` says the verdict is clear."""
        for _ in range(self.warmup):
            unfused()
            fused()
        ta: list[float] = []
        tb: list[float] = []
        for _ in range(max(1, runs)):
            ta.append(timer(key, "unfused", unfused) * 1e6)
            tb.append(timer(key, "fused", fused) * 1e6)
            if early and len(ta) >= defaults.SPEED_EARLY_RUNS and self.clear(ta, tb):
                break
        return ta, tb

    def measure(
        self,
        unfused: Callable[[], object],
        fused: Callable[[], object],
        key: str,
        *,
        timer: Timer | None = None,
    ) -> tuple[float, float, bool]:
        """Median microseconds of the unfused and the fused side of fusion ``key``, and
        whether the fused side is slower (see the module docstring)."""
        timer = timer or current_timer()
        ta, tb = self.times(unfused, fused, key, self.runs, timer)
        tu, tf = statistics.median(ta), statistics.median(tb)
        slower = tf > tu * self.margin
        if slower:  # confirm on a longer measurement, by median and by best run alike
            ta, tb = self.times(unfused, fused, key, 2 * self.runs, timer, early=False)
            tu, tf = statistics.median(ta), statistics.median(tb)
            slower = tf > tu * self.margin and min(tb) > min(ta) * self.margin
        return tu, tf, slower

    def engine_times(
        self,
        sides: Mapping[str, Callable[[], object]],
        key: str,
        *,
        rounds: int = defaults.ENGINE_TIMING_ROUNDS,
        timer: Timer | None = None,
        warmup: bool = True,
    ) -> dict[str, list[float]]:
        """Seconds of each side's timed calls, by name: one untimed call of each first
        (``warmup``: the first calls pack weights and fill caches), then ``rounds`` rounds,
        each in its own order (``random.Random(round).shuffle`` of the previous round's), in
        which each side is called once untimed right before its timed call (a side as it runs
        in steady state: the first call after another runtime pays for that one's
        still-spinning threads), unless its previous timed call took
        :data:`~graph_autofusion.defaults.ENGINE_STEADY_S` or more (such a call is in steady
        state by itself: its data outgrow the caches the other side touched; a BERT-base
        prefill's compile saves two seconds). Each side's calls follow a pause of
        :data:`~graph_autofusion.defaults.ENGINE_SETTLE_S`, so the threads another runtime left
        spinning (torch's OpenMP workers after eager) have stopped. Each timed call is
        ``timer(key, name, side)``."""
        timer = timer or current_timer()
        order = list(sides)
        if warmup:
            for name in order:
                sides[name]()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(max(1, rounds)):
            random.Random(r).shuffle(order)
            for name in order:
                fn = sides[name]
                time.sleep(defaults.ENGINE_SETTLE_S)
                if not times[name] or times[name][-1] < defaults.ENGINE_STEADY_S:
                    fn()
                times[name].append(timer(key, name, fn))
        return times

    def choose(
        self,
        sides: Mapping[str, Callable[[], object]],
        baseline: str,
        key: str,
        *,
        rounds: int = defaults.ENGINE_TIMING_ROUNDS,
        timer: Timer | None = None,
    ) -> tuple[str, dict[str, float]]:
        """The fastest of ``sides`` (``baseline`` among them) by median seconds over
        :meth:`engine_times`, and each side's median seconds. The fastest side other than
        ``baseline`` (the first in ``sides``' order on a tie) wins unless its median is above
        ``margin`` times the baseline's; then the baseline wins if a second measurement of
        ``rounds`` rounds, of the two alone, says so again by median and by best run alike
        (the medians returned for those two are the second measurement's)."""
        if baseline not in sides:
            raise ValueError(f"the baseline {baseline!r} is not one of the sides {list(sides)}")
        timer = timer or current_timer()
        times = self.engine_times(sides, key, rounds=rounds, timer=timer)
        medians = {k: statistics.median(v) for k, v in times.items()}
        others = [k for k in sides if k != baseline]
        if not others:
            return baseline, medians
        best = min(others, key=medians.__getitem__)
        if medians[best] <= medians[baseline] * self.margin:
            return best, medians
        # every other side slower than the baseline: confirm, the two alone, already warm
        pair = {baseline: sides[baseline], best: sides[best]}
        again = self.engine_times(pair, key, rounds=rounds, timer=timer, warmup=False)
        medians.update({k: statistics.median(v) for k, v in again.items()})
        slower = medians[best] > medians[baseline] * self.margin
        slower = slower and min(again[best]) > min(again[baseline]) * self.margin
        return (baseline if slower else best), medians
