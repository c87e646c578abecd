"""The stages of a fuse, named, timed and dumped by one runner.

    stages = Stages(dump_dir, label="cpu target")
    with stages("plan"):
        ...
    stages.dump("plan.json", lambda: to_json(plan))
    result.timings = stages.timings

:data:`STAGES` is the order every target's pipeline runs them in (a target skips the ones it
has nothing for: onnxruntime compiles nothing without custom operators; ``capture``,
``verify`` and ``end_to_end`` are safe mode's, run by :mod:`.safe_mode` for every target);
``result.timings`` uses these names.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from graph_autofusion.pipeline.result import dump_artifact
from graph_autofusion.report import progress

STAGES = ("plan", "lower", "compile", "rewrite", "capture", "verify", "end_to_end", "weights")


class Stages:
    """Named, timed stages: ``with stages("plan"): ...``; ``stages.timings``."""

    def __init__(
        self, dump_dir: str | os.PathLike[str] | None = None, label: str = "cpu target"
    ) -> None:
        self.timings: dict[str, float] = {}
        self.dump_dir = os.fspath(dump_dir) if dump_dir is not None else None
        self.label = label

    @contextmanager
    def __call__(self, name: str, task: str | None = None) -> Iterator[None]:
        """Time stage ``name``; ``task``: what the progress display says (default
        ``"<label>: <name>"``)."""
        t = time.perf_counter()
        try:
            with progress.task(task or f"{self.label}: {name}"):
                yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t

    def dump(self, name: str, make: Callable[[], Any]) -> None:
        """Write a stage's artifact (``make()`` runs only when there is a ``dump_dir``)."""
        dump_artifact(self.dump_dir, name, make)
