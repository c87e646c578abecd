"""Progress on long work (F16): one reporter for every step that can take more than a second.

Library code reports without knowing who listens::

    from graph_autofusion.report import progress

    with progress.task("calibrate host", total=9) as tick:
        for step in steps:
            run(step)
            tick(step.name)                  # one unit done, its label shown
    with progress.task("compile kernels"):   # no total: a spinner with the elapsed time
        compile()

Nothing is shown unless a front end installs a reporter: the CLI installs a ``rich``
progress display on stderr when stderr is a terminal and ``--quiet`` is not given
(:func:`reporting`); otherwise every call is a no-op costing a context-variable read. Tasks
nest (safe mode inside fuse); each shows as its own line, removed when done.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["callback", "reporting", "task"]

_REPORTER: contextvars.ContextVar[Any] = contextvars.ContextVar("gaf_progress", default=None)


class _Rich:
    """A ``rich.progress.Progress`` on stderr (transient lines, one per live task)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )

    def __enter__(self) -> _Rich:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def add(self, name: str, total: int | None) -> Any:
        return self.progress.add_task(name, total=total)

    def update(self, tid: Any, name: str, done: int, total: int | None, label: str) -> None:
        desc = f"{name}: {label}" if label else name
        self.progress.update(tid, completed=done, total=total, description=desc)

    def remove(self, tid: Any) -> None:
        self.progress.remove_task(tid)


@contextlib.contextmanager
def reporting(enabled: bool | None = None) -> Iterator[None]:
    """Show progress for the work inside (``enabled=None``: when stderr is a terminal)."""
    on = sys.stderr.isatty() if enabled is None else enabled
    if not on:
        yield
        return
    with _Rich() as rich:
        token = _REPORTER.set(rich)
        try:
            yield
        finally:
            _REPORTER.reset(token)


@contextlib.contextmanager
def task(name: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """One step of work; yields ``tick(label="", *, done=None, total=None)``: one unit done
    (or ``done`` units), optionally a new total and the current item's label."""
    rep = _REPORTER.get()
    if rep is None:
        yield _noop
        return
    tid = rep.add(name, total)
    state = {"done": 0, "total": total}

    def tick(label: str = "", *, done: int | None = None, total: int | None = None) -> None:
        state["done"] = state["done"] + 1 if done is None else done
        if total is not None:
            state["total"] = total
        rep.update(tid, name, state["done"], state["total"], label)

    try:
        yield tick
    finally:
        rep.remove(tid)


def callback(name: str) -> Callable[[str, int, int], None] | None:
    """A ``progress(stage, i, n)`` callback for the pipelines' per-item loops (safe mode's
    checks), or ``None`` when nobody listens."""
    rep = _REPORTER.get()
    if rep is None:
        return None
    tasks: dict[str, Any] = {}

    def update(stage: str, i: int, n: int) -> None:
        tid = tasks.get(stage)
        if tid is None:
            tid = tasks[stage] = rep.add(f"{name}: {stage}", n)
        rep.update(tid, f"{name}: {stage}", i + 1, n, "")
        if i + 1 >= n:
            rep.remove(tasks.pop(stage))

    return update


def _noop(*args: Any, **kwargs: Any) -> None:
    return None
