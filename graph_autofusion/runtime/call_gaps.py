"""What a process does between a compiled graph's calls, and the spinning mode that suits it.

The torch route's onnxruntime sessions serve under ``FuseOptions(spinning="auto")`` with a
short spinning tail (``"run"``: the workers spin for at most a millisecond after a call, then
block), so that torch code right after a call keeps both cores (onnxruntime's default spinning
goes on for ~30-40 ms, and an eager forward right after a call then took up to twice its
time). A process that does nothing between calls (a server waiting for requests, a loop that
sleeps) pays for the short tail instead: its next call finds the workers blocked, and on the
2-core VMs measured such a call took up to twice its time (Falcon at hidden 512: 2.7 ms a
call, p90 6.8, after a 50 ms pause, against 1.9, p90 2.1, with onnxruntime's default
spinning; ``docs/torch.md``). :class:`CallGaps` watches the gaps between one graph's calls and
says when to switch:

* a gap shorter than :data:`MIN_GAP_S` tells nothing (the tail covers it);
* a longer gap is *quiet* when the calling thread spent under :data:`QUIET_CPU_S` of CPU in
  the first :data:`LOOK_S` of it (onnxruntime's default spinning goes on for about that long;
  a Dynamo frame's return and its next call's guards took 0.7-1.6 ms of it on the zoo's text
  models), or in the whole gap when it is shorter: the work that spinning workers would share
  the cores with. One process-wide daemon thread (:class:`_Look`) reads the calling thread's
  CPU clock :data:`LOOK_S` (or, when it is delayed, a little more) after a call that no other
  call followed; a call only sets an event, and the thread wakes at most once per call and
  sleeps while calls come closer together than :data:`LOOK_S`. Other threads' work is not
  seen (the process's CPU clock counts our own workers' spinning);
* :data:`WINDOW` quiet gaps in a row: the sessions spin on after each call (onnxruntime's
  default, ``True``); from then on one gap that is not quiet switches back to the tail. A
  session's spinning is fixed when it is made, so each switch opens the sessions again, and
  a graph switches to spinning at most :data:`MAX_SPIN_SWITCHES` times.

Work that starts later than :data:`LOOK_S` after a call (a benchmark that times other engines
after a pause) finds the workers asleep again and does not count. ``FuseOptions(spinning=
"on")`` spins whatever the gaps; ``"run"`` keeps the tail.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

#: Gaps shorter than this (seconds) tell nothing: the ``"run"`` tail (1 ms) covers them.
MIN_GAP_S = 2e-3
#: A gap in which the calling thread spent less CPU time than this (seconds) is quiet.
QUIET_CPU_S = 2.5e-3
#: How long after a call its thread's work counts (seconds): onnxruntime's default spinning
#: burnt a core for ~30 ms after a call on the 2-core Xeon (``docs/torch.md``).
LOOK_S = 0.03
#: Quiet gaps in a row before the sessions spin on after each call.
WINDOW = 4
#: Switches to spinning one graph may make (each opens its sessions again).
MAX_SPIN_SWITCHES = 2


class CallGaps:
    """The gaps between one graph's calls (:meth:`start` at a call's start, :meth:`stop` at its
    end, on the same thread) and the spinning mode they call for. A call from another thread
    (by its kernel thread id: a new thread may reuse an ended one's ``pthread_t``) starts the
    count of quiet gaps again: its CPU clock is another thread's."""

    def __init__(self) -> None:
        self.spinning = False  # the mode the caller's sessions have now (True: spin on)
        self.switches = 0  # switches to spinning made
        self.gaps: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (gap, CPU counted) s
        self.why = ""  # the last switch's reason
        self._end: float | None = None
        self._cpu = 0.0
        self._thread = 0  # the calling thread's kernel id (threading.get_native_id)
        self._clock: int | None = None  # the calling thread's CPU clock (for _Look)
        self._seq = 0  # calls ended
        self._early: tuple[int, float] | None = None  # (seq, CPU in the LOOK_S after it)

    def start(self) -> bool | None:
        """At a call's start: the mode to switch to (``True``: spin on after each call,
        ``False``: the short tail), or ``None`` to keep the current one."""
        end, self._end = self._end, None
        if end is None or threading.get_native_id() != self._thread:
            return None
        gap = time.perf_counter() - end
        if gap < MIN_GAP_S:
            return None
        early = self._early
        if early is not None and early[0] == self._seq:
            busy = early[1]  # the LOOK_S after the call
        else:
            busy = max(0.0, time.thread_time() - self._cpu)  # the whole (shorter) gap
        quiet = busy < QUIET_CPU_S
        self.gaps.append((gap, busy))
        if self.spinning and not quiet:
            self.spinning = False
            self.gaps.clear()
            self.why = (
                f"back to a short spinning tail: the calling thread worked "
                f"{busy * 1e3:.1f} ms right after a call ({gap * 1e3:.1f} ms gap)"
            )
            return False
        if not quiet:
            self.gaps.clear()
            return None
        if not self.spinning and self.switches < MAX_SPIN_SWITCHES and len(self.gaps) == WINDOW:
            self.spinning = True
            self.switches += 1
            self.why = (
                f"workers spin on after each call: the last {WINDOW} gaps between calls were "
                f"quiet ({min(g for g, _ in self.gaps) * 1e3:.0f}-"
                f"{max(g for g, _ in self.gaps) * 1e3:.0f} ms, the calling thread working "
                f"{max(b for _, b in self.gaps) * 1e3:.2f} ms at most right after a call)"
            )
            return True
        return None

    def stop(self) -> None:
        """At a call's end."""
        native = threading.get_native_id()
        if native != self._thread:  # (a reused pthread_t comes with a new kernel id)
            self._thread = native
            self.gaps.clear()  # another thread's gaps: counted afresh
            self._clock = _thread_clock(threading.get_ident())
        self._seq += 1
        self._cpu = time.thread_time()
        self._end = time.perf_counter()
        if self._clock is not None:
            _LOOK.after(self)

    def look(self, now: float) -> None:
        """From :class:`_Look`'s thread, :data:`LOOK_S` or more after a call ended: the calling
        thread's CPU time since, if no call started or ended in between."""
        seq, end, cpu, clock = self._seq, self._end, self._cpu, self._clock
        if end is None or clock is None or now - end < LOOK_S:
            return  # a call runs, or ended too recently (the next look reads it)
        try:
            busy = max(0.0, time.clock_gettime(clock) - cpu)
        except OSError:  # the thread has ended
            return
        if seq == self._seq:
            self._early = (seq, busy)


def _thread_clock(ident: int) -> int | None:
    """The CPU clock of thread ``ident`` (``None`` where the platform has none)."""
    try:
        return time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):
        return None


class _Look:
    """The process's one watcher: :data:`LOOK_S` after a call, reads the calling thread's CPU
    clock for each :class:`CallGaps` that no call has touched since (a daemon thread, started
    with the first call; a call sets an event, and the thread wakes at most once per call,
    sleeping while calls come closer together than :data:`LOOK_S`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, CallGaps] = {}
        self._event = threading.Event()
        self._thread: threading.Thread | None = None

    def after(self, gaps: CallGaps) -> None:
        with self._lock:
            self._due[id(gaps)] = gaps
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, name="autofusion-call-gaps", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had: gaps are judged whole
                    self._due.clear()
                    return
                self._thread = thread
        self._event.set()

    def _run(self) -> None:
        while True:
            self._event.wait()
            self._event.clear()
            while True:
                with self._lock:
                    due = list(self._due.items())
                if not due:
                    break
                now = time.perf_counter()
                wake = None
                for key, gaps in due:
                    end = gaps._end
                    if end is not None and now - end < LOOK_S:  # not yet: sleep until it is
                        wake = end + LOOK_S if wake is None else min(wake, end + LOOK_S)
                        continue
                    if end is not None:
                        gaps.look(now)
                    with self._lock:  # looked at, or a call runs (its end adds it again)
                        if self._due.get(key) is gaps and gaps._end == end:
                            del self._due[key]
                if wake is not None:
                    time.sleep(max(0.0, wake - time.perf_counter()))


_LOOK = _Look()


def _after_fork() -> None:
    """A forked child has no watcher thread (and maybe a lock held by it): a fresh one."""
    global _LOOK
    _LOOK = _Look()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
