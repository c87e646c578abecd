"""The configurations of ``benchmarks/torch_e2e.py`` and the facts it records.

Torch configurations compile a callable (``compile_torch``); ONNX configurations build a session
on an export of the same module (``onnx_engine``): every one answers ``run(None, feeds)``,
``get_inputs()`` and ``get_outputs()`` like an onnxruntime session, so the forward and the
greedy KV-cache loop of ``graph_autofusion.testing.kv_cache.greedy_decode_ort`` drive them all.
Every onnxruntime session is ``graph_autofusion.runtime.ort_session.ort_session(..., "all", 2,
spinning=True)`` (onnxruntime's default; ``peers.SPIN_SETTLE_S``);
OpenVINO's is ``peers.OpenVINOSession`` (shared with ``vs_ort_optimizer.py``, ``vs_ort_decode.py``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (  # noqa: E402, F401 - PRE_CALLS, SPIN_SETTLE_S: torch_e2e's
    PRE_CALLS,
    SPIN_SETTLE_S,
    THREADS,
    OpenVINOSession,
    Unavailable,
    cpu_facts,
    openvino_version,
)

ROOT = Path(__file__).resolve().parents[1]
TORCH_CONFIGS = ("eager", "inductor", "inductor_freezing", "ours")
ONNX_ENGINES = ("ort_all", "ort_opt", "openvino", "ours_onnx")
#: Every configuration, in table order; ``ours`` and ``ours_onnx`` are not peers.
CONFIGS = ("eager", "inductor", "inductor_freezing", "ort_all", "ort_opt", "openvino")
CONFIGS += ("ours_onnx", "ours", "ours_module")
OURS = ("ours", "ours_onnx", "ours_module")
LABELS = {
    "eager": "eager",
    "inductor": "Inductor",
    "inductor_freezing": "Inductor+freezing",
    "ort_all": "ORT ALL",
    "ort_opt": "ORT transformers optimizer",
    "openvino": "OpenVINO",
    "ours_onnx": "our ONNX route",
    "ours": "ours (torch.compile)",
    "ours_module": "ours (drop-in module)",
}
MEMORY_CONFIGS = ("eager", "inductor_freezing", "ours")
#: generate() settings: greedy, every token generated (no end-of-sequence stop).
GEN_KW = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}


# ---------------------------------------------------------------------------- torch
def _freezing_backend(gm: Any, example_inputs: Any) -> Any:
    """Inductor with ``freezing=True`` (weights folded and prepacked), as its own backend
    object so Dynamo keeps its compiled code apart from the default Inductor's."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    with inductor_config.patch(freezing=True):
        return compile_fx(gm, example_inputs)


def compile_torch(fn: Any, config: str) -> Any:
    if config == "eager":
        return fn
    if config == "ours":
        return torch.compile(fn, backend="autofusion")
    if config == "inductor_freezing":
        return torch.compile(fn, backend=_freezing_backend)
    return torch.compile(fn)


def graph_count() -> int:
    from graph_autofusion.torch_compile import default_graphs

    return len(default_graphs())


def graphs_since(n: int) -> list[dict[str, Any]]:
    """``summary()`` of each graph the ``autofusion`` backend compiled after the ``n``-th."""
    from graph_autofusion.torch_compile import default_graphs

    keep = ("graph", "engine", "engine_ms", "engine_notes", "compile_seconds", "fallback")
    keep += ("fused_groups", "calls", "eager_calls", "onnxruntime_failures")
    return [{k: g.summary()[k] for k in keep} for g in default_graphs()[n:]]


# ---------------------------------------------------------------------------- exports
@contextlib.contextmanager
def export_cache() -> Iterator[None]:
    """The zoo's persistent export cache (``$TORCH_E2E_EXPORTS``) while exporting: the worker's
    ``GRAPH_AUTOFUSION_CACHE`` is a fresh folder for cold kernel caches, and the exports
    (which are not what is measured) would otherwise be redone in it."""
    saved = os.environ.get("GRAPH_AUTOFUSION_CACHE")
    if os.environ.get("TORCH_E2E_EXPORTS"):
        os.environ["GRAPH_AUTOFUSION_CACHE"] = os.environ["TORCH_E2E_EXPORTS"]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("GRAPH_AUTOFUSION_CACHE", None)
        else:
            os.environ["GRAPH_AUTOFUSION_CACHE"] = saved


def export(name: str, exporter: str, decoder: bool) -> tuple[Path, float | None]:
    """The cached zoo export (``decoder``: the KV-cache decoder) and its export seconds."""
    import json

    from graph_autofusion.testing.export import export_onnx
    from graph_autofusion.testing.kv_cache import export_decoder

    with export_cache():
        path = export_decoder(name, exporter) if decoder else export_onnx(name, exporter)
    side = path.with_name(path.name + ".json")
    return path, json.loads(side.read_text()).get("export_seconds") if side.exists() else None


# ---------------------------------------------------------------------------- ONNX engines
_OPTIMIZED: dict[str, tuple[str, float]] = {}  # export path -> (optimizer's file, seconds)


def _transformers_optimizer(path: Path, name: str, out: str, decoder: bool) -> tuple[str, float]:
    """``optimize_model`` on the export, called as ``benchmarks/vs_ort_optimizer.py`` (forward)
    or ``vs_ort_decode.py`` (decoder) call it; once per export and process."""
    import onnx
    import vs_ort_decode
    import vs_ort_optimizer as vso

    if str(path) in _OPTIMIZED:  # made for an earlier shape: its seconds count again
        return _OPTIMIZED[str(path)]
    if not decoder and vso.MODELS[name][0] is None:
        raise Unavailable("n/a: the transformers optimizer has no model type for a CNN")
    counts = vso.op_counts(onnx.load(str(path), load_external_data=False))
    peer = vs_ort_decode.run_peer if decoder else vso.run_peer
    info = peer(path, name, out, counts)
    if not info["ok"]:
        raise RuntimeError(info["error"])
    _OPTIMIZED[str(path)] = (out, info["optimize_s"])
    return _OPTIMIZED[str(path)]


def _our_onnx_route(
    path: Path, name: str, feeds: dict[str, Any], out: str, decoder: bool
) -> tuple[Any, dict[str, Any]]:
    """``GraphAutoFusion(path).fuse()`` (safe mode, decided on ``feeds``; the decoder: as
    ``vs_ort_decode.run_ours``, on the sample inputs it generates) and its fused model."""
    if decoder:
        import onnx
        import vs_ort_decode
        import vs_ort_optimizer as vso

        counts = vso.op_counts(onnx.load(str(path), load_external_data=False))
        info = vs_ort_decode.run_ours(path, name, out, counts)
        return out, {"fused": info["fused_by_type"], "rolled_back": info["rolled_back"]}
    import vs_ort_optimizer as vso

    from graph_autofusion.api import GraphAutoFusion

    gaf = GraphAutoFusion(str(path), preset=vso.MODELS[name][3], sample_inputs=feeds)
    fused = gaf.fuse()
    res = gaf.result
    return fused, {
        "fused": dict(Counter(low.rule for low in res.lowered)),
        "rolled_back": dict(Counter(f"{b.rule}:{b.code}" for b in res.rolled_back)),
    }


def onnx_engine(
    engine: str, path: Path, name: str, feeds: dict[str, Any], tmp: str, decoder: bool = False
) -> tuple[Any, dict[str, Any]]:
    """A session of ``engine`` on the export ``path``, and what building it did.

    Raises:
        Unavailable: the engine does not apply (no optimizer model type) or is not installed.
    """
    from graph_autofusion.runtime.ort_session import ort_session

    if engine == "ort_all":
        return ort_session(path, "all", THREADS, spinning=True), {}
    if engine == "openvino":  # raises Unavailable when openvino is not installed
        return OpenVINOSession(path), {}
    stem = os.path.join(tmp, f"{engine}-{Path(path).stem}")
    if engine == "ort_opt":
        again = str(path) in _OPTIMIZED
        out, seconds = _transformers_optimizer(path, name, stem + ".onnx", decoder)
        info = {"optimize_s": seconds, "earlier_s": seconds if again else 0.0}
        return ort_session(out, "all", THREADS, spinning=True), info
    model, info = _our_onnx_route(path, name, feeds, stem + ".onnx", decoder)
    # ours as it serves (denormals flushed, FuseOptions.denormals's default); peers as shipped
    return ort_session(model, "all", THREADS, spinning=True, flush_denormals=True), info


def run_forward(session: Any, feeds: dict[str, Any]) -> Any:
    """The first output of ``session`` on ``feeds`` (only the inputs it declares)."""
    declared = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in declared})[0]


# ---------------------------------------------------------------------------- machine facts
def machine() -> dict[str, Any]:
    """CPU model, ISA flags, library versions, date, commit: what a row was measured on."""
    import onnxruntime
    import transformers
    from vs_ort_optimizer import _git_state

    facts = cpu_facts()
    git = _git_state()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": git["head"][:10],
        "dirty": bool(git["dirty"]),
        **facts,
        "threads": THREADS,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "openvino": openvino_version(),
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------- memory
def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def llama_prompt(model: Any, length: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=gen)


def measure_memory(name: str, config: str, tokens: int = 20) -> dict[str, Any]:
    """Peak RSS of one ``generate(max_new_tokens=tokens)`` under ``config``, in this (fresh)
    process: ``ru_maxrss`` after the imports and the model build, and at the end."""
    import torch._inductor.compile_fx  # noqa: F401 - every config pays the same imports

    import graph_autofusion.torch_compile  # noqa: F401
    from graph_autofusion.testing.builders import build_model

    torch.set_num_threads(THREADS)
    model = build_model(name)[0].model.eval()
    ids = llama_prompt(model)
    baseline = _maxrss_mb()
    model.forward = compile_torch(model.forward, config)
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=tokens, **GEN_KW)
    seconds = time.perf_counter() - t
    peak = _maxrss_mb()
    return {"baseline_mb": baseline, "peak_mb": peak, "delta_mb": peak - baseline,
            "generate_s": seconds, "tokens": tokens}  # fmt: skip


def run_memory(script: str, name: str, config: str, env: dict[str, str]) -> dict[str, Any]:
    """:func:`measure_memory` in a fresh subprocess (``script --memory NAME CONFIG``)."""
    import json

    proc = subprocess.run(
        [sys.executable, script, "--memory", name, config],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MEMORY ")), None)
    if line is None:
        return {"status": f"failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"}
    return json.loads(line[len("MEMORY ") :])
