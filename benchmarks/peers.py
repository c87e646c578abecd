"""The peers every side-by-side benchmark shares, and the facts a results file records.

    sess = OpenVINOSession(path)        # raises Unavailable when openvino is not installed
    outs = sess.run(None, feeds)        # like an onnxruntime session
    facts = cpu_facts()                 # {"cpu": model name, "isa": [...], "cpus": n}

OpenVINO runs the ONNX export directly on its CPU plugin with ``OV_CONFIG``: float32
(``INFERENCE_PRECISION_HINT`` f32: without it OpenVINO computes in bf16 on CPUs with AMX or
AVX-512 BF16), ``THREADS`` inference threads and the latency hint (one stream), the settings
our onnxruntime sessions run with; the one wrapper is the package's
:mod:`graph_autofusion.runtime.peer_engines` (the demo uses it too). Used by
``torch_e2e_engines.py`` (``torch_e2e.py``), ``vs_ort_optimizer.py`` and ``vs_ort_decode.py``;
OpenVINO is a benchmark dependency only.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graph_autofusion.runtime.peer_engines import (  # noqa: F401 - the benchmarks' names
    ISA_FLAGS,
    OV_CONFIG,
    THREADS,
    OpenVINOSession,
    PeerUnavailable,
    cpu_facts,
    openvino_version,
)

#: A configuration that does not apply or is not installed (recorded, not a failure).
Unavailable = PeerUnavailable

#: Every onnxruntime session of a side-by-side benchmark keeps onnxruntime's default spinning
#: workers, as a user's session has them: without them each parallel operator waits for
#: sleeping workers to wake (BERT-base s16 in ORT ALL ran 1.4-1.7x slower on a 2-core VM).
#: They go on spinning after a run, burning about 35 ms of a core in the next ~40 ms (process
#: CPU time over a sleep), which would take a core from whatever is timed next; so every
#: timed call is preceded by this untimed pause (``round_robin(settle_s=...)``), for every
#: configuration alike. After the pause every engine's threads sleep (torch's too: eager
#: MiniLM s16 took 15 ms after 50 ms idle against 9 ms right after another call), so each
#: timed call follows ``PRE_CALLS`` untimed calls of its own configuration
#: (``round_robin(pre_calls=...)``): what is timed is a call in a stream of calls.
SPIN_SETTLE_S = 0.05
PRE_CALLS = 1


def timed_session(path: Any, level: str, threads: int = 2, *, ours: bool = False, **kw: Any) -> Any:
    """An onnxruntime session as the benchmarks time it: onnxruntime's default spinning
    workers (each timed call after ``SPIN_SETTLE_S``); ``ours``: a fused model opened as
    graph-autofusion serves it (``fused_session``: denormal floats flushed, the
    ``FuseOptions.denormals`` its metadata records), a peer's file with onnxruntime's defaults.
    ``kw``: more of ``ort_session``'s options (``profile_prefix``)."""
    from graph_autofusion.runtime.ort_session import fused_session, ort_session

    open_ = fused_session if ours else ort_session
    return open_(path, level, threads, spinning=True, **kw)


def head_commit() -> str:
    """The checkout's commit, 10 hex digits ("" outside a git checkout)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return ""


def run_facts() -> dict[str, Any]:
    """What a results file records of its run: ``date`` (to the minute), ``commit``
    (:func:`head_commit`) and ``machine`` (:func:`cpu_facts`)."""
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": head_commit(),
        "machine": cpu_facts(),
    }


def write_results(stem: str | Path, data: Any, markdown: Callable[[Any], str]) -> str:
    """``stem``.json (``data``, everything) and ``stem``.md (``markdown(data)``, the table),
    the folder made if needed; returns the markdown text."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
    text = markdown(data)
    stem.with_suffix(".md").write_text(text)
    return text


def first_output(out: Any) -> Any:
    """The tensor a model's call returns: its ``logits``, else its first output."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, tuple | list):
        return out[0]
    return out


def cosine(a: Any, b: Any) -> float:
    """Cosine of two tensors (or arrays) flattened, in float64."""
    import numpy as np
    import torch

    a, b = (torch.as_tensor(v if isinstance(v, torch.Tensor) else np.asarray(v)) for v in (a, b))
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a @ b) / (a.norm() * b.norm() + 1e-300))
