"""Per-node kernel times measured by onnxruntime's own profiler.

:func:`profile_nodes` runs a model in an ``InferenceSession`` with ``enable_profiling`` and
graph optimizations off (``ORT_DISABLE_ALL``, so the nodes ORT runs are the nodes of the file,
minus ``Constant`` nodes that ORT turns into initializers at load), ``intra_op_num_threads=2`` by
default, a few warm-up runs, then several timed runs. The profile JSON (Chrome trace format)
holds one ``"cat": "Node"`` event named ``<node name>_kernel_time`` per node per run, with
``dur`` in microseconds and ``args.op_name``. The result is the median over the timed runs of
each node's kernel time, keyed by node name, plus the median wall time of a whole run.

Warm-up runs are profiled too (ORT cannot switch profiling on later); they are told apart by
counting: a node's events are in run order, so the first ``warmup`` events of every node are
dropped.

Example::

    prof = profile_nodes("model.onnx", feeds, runs=5)
    prof.node_us["/encoder/MatMul"], prof.total_us, prof.wall_us
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graph_autofusion.runtime.ort_session import ort_session

_SUFFIX = "_kernel_time"


@dataclass
class OrtProfile:
    """Median per-node kernel times of one model.

    Attributes:
        node_us: Node name -> median kernel time (µs) over the timed runs.
        op_type: Node name -> operator name as ORT reports it (``op_name``).
        runs: Number of timed runs the medians are over.
        wall_us: Median wall-clock time of one ``session.run`` (µs), measured around the call.
        samples: Node name -> every timed-run kernel time (µs), in run order.
    """

    node_us: dict[str, float]
    op_type: dict[str, str]
    runs: int
    wall_us: float
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        """Sum of the per-node medians (time inside kernels, no framework overhead between)."""
        return float(sum(self.node_us.values()))

    def node_trimmed_mean_us(self, drop: float = 0.2) -> dict[str, float]:
        """Node name -> mean of its timed runs without the slowest ``drop`` fraction (µs).

        ORT's profiler reports whole microseconds, so a tiny operator's median is an integer
        (3 or 4 µs) and ties with many others; the mean of the samples keeps the fraction
        (a kernel of 3.4 µs reads 4 in some runs). Dropping the slowest runs removes
        interference from other processes, which only adds time.
        """
        return {k: trimmed_mean(v, drop) for k, v in self.samples.items() if v}


def trimmed_mean(values: list[float], drop: float = 0.2) -> float:
    """Mean of ``values`` without the largest ``drop`` fraction (at least one value kept)."""
    ordered = sorted(values)
    keep = max(1, len(ordered) - int(len(ordered) * drop))
    return float(sum(ordered[:keep]) / keep)


def parse_profile(
    events: list[dict[str, Any]] | str | os.PathLike[str], *, warmup: int = 0
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per-node kernel-time samples (µs) from an ORT profile (a path or the parsed event list).

    Returns ``(samples, op_type)``: ``samples[name]`` lists that node's kernel times in run
    order with the first ``warmup`` of each node dropped; ``op_type[name]`` its ``op_name``.
    """
    if not isinstance(events, list):
        events = json.loads(Path(events).read_text())
    samples: dict[str, list[float]] = defaultdict(list)
    op_type: dict[str, str] = {}
    for ev in events:
        if ev.get("cat") != "Node":
            continue
        name = str(ev.get("name", ""))
        if not name.endswith(_SUFFIX):
            continue
        node = name[: -len(_SUFFIX)]
        samples[node].append(float(ev.get("dur", 0.0)))
        args = ev.get("args") or {}
        if "op_name" in args:
            op_type[node] = str(args["op_name"])
    out = {k: v[warmup:] for k, v in samples.items() if len(v) > warmup}
    return out, {k: v for k, v in op_type.items() if k in out}


def profile_nodes(
    model: str | os.PathLike[str] | bytes,
    feeds: Mapping[str, np.ndarray],
    *,
    runs: int = 5,
    warmup: int = 2,
    threads: int = 2,
    optimization: str = "disable_all",
) -> OrtProfile:
    """Run ``model`` in onnxruntime with profiling; median per-node kernel times (µs).

    Args:
        model: Path of an ONNX file, or its serialized bytes.
        feeds: Input name -> array.
        runs: Timed runs (medians are over these).
        warmup: Untimed runs first (their profile events are dropped).
        threads: ``intra_op_num_threads`` (``inter_op_num_threads`` is 1, sequential mode).
        optimization: ``disable_all`` (default), ``basic``, ``extended`` or ``all``.
    """

    level = {"disable_all": "disable", "basic": "basic", "extended": "extended", "all": "all"}
    with tempfile.TemporaryDirectory(prefix="ga_ortprof_") as tmp:
        src = model if isinstance(model, bytes) else str(model)
        sess = ort_session(  # onnxruntime's spinning workers, as before
            src,
            level[optimization],
            threads,
            spinning=True,
            profile_prefix=os.path.join(tmp, "ort_profile"),
        )
        names = {i.name for i in sess.get_inputs()}
        run_feeds = {k: np.asarray(v) for k, v in feeds.items() if k in names}
        for _ in range(warmup):
            sess.run(None, run_feeds)
        walls: list[float] = []
        for _ in range(runs):
            start = time.perf_counter()
            sess.run(None, run_feeds)
            walls.append((time.perf_counter() - start) * 1e6)
        path = sess.end_profiling()
        samples, op_type = parse_profile(path, warmup=warmup)
        del sess
    node_us = {k: float(statistics.median(v)) for k, v in samples.items() if v}
    return OrtProfile(
        node_us=node_us,
        op_type=op_type,
        runs=runs,
        wall_us=float(statistics.median(walls)) if walls else 0.0,
        samples=dict(samples),
    )
