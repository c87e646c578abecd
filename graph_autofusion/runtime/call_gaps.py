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
  it (a Dynamo frame's return and its next call's guards took 0.7-1.6 ms of it on the zoo's
  text models): whatever followed the call on that thread, spinning workers could take at
  most that much work's core. Other threads' work is not seen (the process's CPU clock counts
  our own workers' spinning);
* :data:`WINDOW` quiet gaps in a row: the sessions spin on after each call (onnxruntime's
  default, ``True``); from then on one gap that is not quiet switches back to the tail. A
  session's spinning is fixed when it is made, so each switch opens the sessions again, and a graph switches to
  spinning at most :data:`MAX_SPIN_SWITCHES` times.

A gap with work anywhere in it is not quiet, even when the work came long after the call
(a benchmark that times other engines after a pause): the watch cannot see when in the gap
the work ran, and errs on the side of the work. ``FuseOptions(spinning="on")`` spins whatever
the gaps; ``"run"`` keeps the tail.
"""

from __future__ import annotations

import threading
import time
from collections import deque

#: Gaps shorter than this (seconds) tell nothing: the ``"run"`` tail (1 ms) covers them.
MIN_GAP_S = 2e-3
#: A gap in which the calling thread spent less CPU time than this (seconds) is quiet.
QUIET_CPU_S = 2.5e-3
#: Quiet gaps in a row before the sessions spin on after each call.
WINDOW = 4
#: Switches to spinning one graph may make (each opens its sessions again).
MAX_SPIN_SWITCHES = 2


class CallGaps:
    """The gaps between one graph's calls (:meth:`start` at a call's start, :meth:`stop` at its
    end, on the same thread) and the spinning mode they call for. Not thread-safe by design:
    calls from another thread reset the watch (its CPU clock is another thread's)."""

    def __init__(self) -> None:
        self.spinning = False  # the mode the caller's sessions have now (True: spin on)
        self.switches = 0  # switches to spinning made
        self.gaps: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (gap, thread CPU) s
        self.why = ""  # the last switch's reason
        self._end: float | None = None
        self._cpu = 0.0
        self._thread = 0

    def start(self) -> bool | None:
        """At a call's start: the mode to switch to (``True``: spin on after each call,
        ``False``: the short tail), or ``None`` to keep the current one."""
        end, self._end = self._end, None
        if end is None or threading.get_ident() != self._thread:
            return None
        gap = time.perf_counter() - end
        if gap < MIN_GAP_S:
            return None
        busy = max(0.0, time.thread_time() - self._cpu)
        quiet = busy < QUIET_CPU_S
        self.gaps.append((gap, busy))
        if self.spinning and not quiet:
            self.spinning = False
            self.gaps.clear()
            self.why = (
                f"back to a short spinning tail: the calling thread worked "
                f"{busy * 1e3:.1f} ms in a {gap * 1e3:.1f} ms gap between calls"
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
                f"{max(b for _, b in self.gaps) * 1e3:.2f} ms at most)"
            )
            return True
        return None

    def stop(self) -> None:
        """At a call's end."""
        self._thread = threading.get_ident()
        self._cpu = time.thread_time()
        self._end = time.perf_counter()
