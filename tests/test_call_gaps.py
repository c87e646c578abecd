"""``runtime.call_gaps.CallGaps``: which gaps between a graph's calls count, and when it says
to switch the sessions' spinning (real clocks: sleeps and CPU work on the calling thread)."""

from __future__ import annotations

import threading
import time

from graph_autofusion.runtime import call_gaps
from graph_autofusion.runtime.call_gaps import CallGaps


def _burn(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def _quiet(gaps: CallGaps, n: int) -> list:
    said = []
    for _ in range(n):
        gaps.stop()
        time.sleep(call_gaps.MIN_GAP_S * 3)
        said.append(gaps.start())
    return said


def test_quiet_gaps_switch_to_spinning_and_work_switches_back():
    gaps = CallGaps()
    assert gaps.start() is None  # no call before
    said = _quiet(gaps, call_gaps.WINDOW)
    assert said == [None] * (call_gaps.WINDOW - 1) + [True]
    assert gaps.spinning and "quiet" in gaps.why
    assert _quiet(gaps, 2) == [None, None]  # stays
    gaps.stop()
    _burn(2 * call_gaps.QUIET_CPU_S)
    time.sleep(call_gaps.MIN_GAP_S)
    assert gaps.start() is False and not gaps.spinning
    assert "worked" in gaps.why


def test_short_gaps_and_a_busy_gap_do_not_count_as_quiet():
    gaps = CallGaps()
    for _ in range(3 * call_gaps.WINDOW):  # back to back: the tail covers these
        gaps.stop()
        assert gaps.start() is None
    assert not gaps.spinning
    gaps.gaps.clear()  # (a preempted loop may have made a quiet gap of one of them)
    _quiet(gaps, call_gaps.WINDOW - 1)
    gaps.stop()
    _burn(2 * call_gaps.QUIET_CPU_S)  # work in the gap: the count starts again
    time.sleep(call_gaps.MIN_GAP_S)
    assert gaps.start() is None and not gaps.gaps
    assert _quiet(gaps, call_gaps.WINDOW)[-1] is True


def test_spinning_is_chosen_a_bounded_number_of_times():
    gaps = CallGaps()
    switched = 0
    for _ in range(call_gaps.MAX_SPIN_SWITCHES + 2):
        switched += _quiet(gaps, call_gaps.WINDOW).count(True)
        gaps.stop()
        _burn(2 * call_gaps.QUIET_CPU_S)
        time.sleep(call_gaps.MIN_GAP_S)
        gaps.start()
    assert switched == call_gaps.MAX_SPIN_SWITCHES == gaps.switches
    assert not gaps.spinning


def test_a_call_from_another_thread_is_not_a_gap():
    gaps = CallGaps()
    gaps.stop()
    time.sleep(call_gaps.MIN_GAP_S * 3)
    got = []
    t = threading.Thread(target=lambda: got.append(gaps.start()))
    t.start()
    t.join()
    assert got == [None] and not gaps.gaps


def test_work_long_after_a_call_does_not_count_but_work_right_after_does():
    """A gap longer than ``LOOK_S`` counts the calling thread's CPU in the ``LOOK_S`` after the
    call (read by the process's watcher thread): work that starts later (another engine timed
    after a pause) leaves the gap quiet; work right after the call makes it busy."""
    gaps = CallGaps()
    said = []
    for _ in range(call_gaps.WINDOW):
        gaps.stop()
        time.sleep(call_gaps.LOOK_S * 5)
        _burn(3 * call_gaps.QUIET_CPU_S)
        said.append(gaps.start())
    assert said[-1] is True and gaps.spinning
    gaps.stop()
    _burn(3 * call_gaps.QUIET_CPU_S)
    time.sleep(call_gaps.LOOK_S * 2)
    assert gaps.start() is False and not gaps.spinning
    assert "right after a call" in gaps.why


def test_a_new_thread_starts_the_count_again():
    """Quiet gaps on one thread and then on another do not add up: the other thread's CPU
    clock is its own (told apart by kernel thread id)."""
    gaps = CallGaps()
    _quiet(gaps, call_gaps.WINDOW - 1)
    assert len(gaps.gaps) == call_gaps.WINDOW - 1
    said = []

    def other():
        gaps.stop()
        time.sleep(call_gaps.MIN_GAP_S * 3)
        said.append(gaps.start())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert said == [None] and len(gaps.gaps) == 1  # counted afresh on the new thread
