"""Side-by-side timing: every configuration run in turn, so a machine whose speed drifts
(this one's memory bandwidth flips between ~37 and ~67 GB/s within minutes) slows them alike.

    times = round_robin({"eager": f, "fused": g}, runs=20, warmup=3)   # name -> seconds
    stats = summarize(times)                                           # name -> ms, p10, p90
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def round_robin(
    fns: Mapping[str, Callable[[], object]], runs: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Each function ``warmup`` times, then ``runs`` rounds of one call of each in turn;
    returns the seconds of every timed call by name."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(warmup):
            f()
    for _ in range(runs):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return times


def summarize(times: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    """Median, 10th and 90th percentile of each name's times, in milliseconds."""
    out = {}
    for k, ts in times.items():
        ts = sorted(ts)
        out[k] = {
            "ms": statistics.median(ts) * 1e3,
            "p10": ts[len(ts) // 10] * 1e3,
            "p90": ts[(9 * len(ts)) // 10] * 1e3,
        }
    return out
