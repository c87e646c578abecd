"""Side-by-side timing: every configuration run in turn, so a machine whose speed drifts
(this one's memory bandwidth flips between ~37 and ~67 GB/s within minutes) slows them alike.

    times = round_robin({"eager": f, "fused": g}, runs=20, warmup=3)   # name -> seconds
    stats = summarize(times)                                           # name -> ms, p10, p90

Safe mode's speed check (the onnxruntime target's per-fusion timing and the cpu target's
per-kernel timing) reads every duration through one boundary, :func:`current_timer`: a
:data:`Timer` called as ``timer(key, side, fn)`` runs ``fn`` once and returns its seconds;
``key`` is the fusion's key (``"gelu_erf@/mlp/Mul_1"``) and ``side`` is ``"unfused"`` or
``"fused"``. The default, :func:`wall_timer`, reads
``time.perf_counter``; :func:`use_timer` swaps it for the duration of a ``with`` block, so a
test can make the fused side slower (or faster) deterministically and assert what safe mode
does with that, instead of deciding from the machine's real, load-dependent speed::

    with use_timer(lambda key, side, fn: (fn(), 5e-5 if side == "fused" else 1e-5)[1]):
        result = fuse_model(model, rules, profile)      # every timed fusion is "slower"
"""

from __future__ import annotations

import contextlib
import contextvars
import statistics
import time
from collections.abc import Callable, Iterator, Mapping

#: ``timer(key, side, fn) -> seconds``: run ``fn`` once, return how long it took; ``key`` names
#: the fusion timed, ``side`` is ``"unfused"`` or ``"fused"`` (what a stub needs to tell them
#: apart).
Timer = Callable[[str, str, Callable[[], object]], float]


def wall_timer(key: str, side: str, fn: Callable[[], object]) -> float:
    """The real timer: ``fn``'s wall time by ``time.perf_counter`` (``key``, ``side`` unused)."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


_TIMER: contextvars.ContextVar[Timer] = contextvars.ContextVar("gaf_timer", default=wall_timer)


def current_timer() -> Timer:
    """The timer safe mode's speed check uses now (:func:`wall_timer` unless swapped)."""
    return _TIMER.get()


@contextlib.contextmanager
def use_timer(timer: Timer) -> Iterator[Timer]:
    """Make ``timer`` the one :func:`current_timer` returns inside the ``with`` block."""
    token = _TIMER.set(timer)
    try:
        yield timer
    finally:
        _TIMER.reset(token)


def median_us(
    fn: Callable[[], object],
    runs: int = 7,
    *,
    key: str = "",
    side: str = "",
    timer: Timer | None = None,
) -> float:
    """Median microseconds of ``runs`` calls of ``fn`` after one warm-up call, each timed by
    ``timer`` (default: :func:`current_timer`) as ``key``'s ``side``."""
    timer = timer or current_timer()
    fn()
    return statistics.median([timer(key, side, fn) for _ in range(max(1, runs))]) * 1e6


def round_robin(
    fns: Mapping[str, Callable[[], object]],
    runs: int,
    warmup: int = 3,
    *,
    rotate: bool = False,
    settle_s: float = 0.0,
    pre_calls: int = 0,
) -> dict[str, list[float]]:
    """Each function ``warmup`` times, then ``runs`` rounds of one call of each in turn;
    returns the seconds of every timed call by name.

    ``rotate``: each round runs them in its own order, a permutation seeded by the round's
    number, so no function always runs first, last or right after the same neighbour (a cache,
    a frequency state or another runtime's still-spinning threads one leaves behind are shared
    out; a plain rotation ``a b c``, ``b c a`` keeps every function's predecessor); off, every
    round runs them in the mapping's order. ``settle_s``: a pause, not timed, before each
    timed call (an onnxruntime session with spinning workers keeps a core busy for tens of
    milliseconds after its run; the pause lets that end before the next function runs).
    ``pre_calls``: untimed calls of the same function right before each timed one, after the
    pause: the timed call then finds its engine's threads awake, as in a stream of calls
    (after 50 ms idle, torch's and onnxruntime's workers sleep and the next call pays for
    waking them: eager MiniLM s16 took 15 ms instead of 9)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for f in fns.values():
        for _ in range(warmup):
            f()
    for r in range(runs):
        order = list(names)
        if rotate:
            import random

            random.Random(r).shuffle(order)
        for k in order:
            f = fns[k]
            if settle_s:
                time.sleep(settle_s)
            for _ in range(pre_calls):
                f()
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
