"""Graph AutoFusion against onnxruntime's transformers optimizer, side by side in onnxruntime.

The peer a user would pick today for transformer graphs on onnxruntime is
``onnxruntime.transformers.optimizer.optimize_model`` (model types ``bert`` and ``gpt2``; for
the Llama models ``gpt2``, which fuses the same as ``qwen3`` there, see
``/work/shared/research/baselines.md``). For every zoo model, exporter and input shape this
script builds three models and times them in one process, interleaved round-robin:

* ``original``: the cached zoo export;
* ``peer``: ``optimize_model(path, model_type, num_heads, hidden_size)`` with its defaults
  (a failure is recorded with its error, never hidden);
* ``ours``: ``GraphAutoFusion(path, preset, sample_inputs=feeds).fuse()`` with its defaults
  (safe mode on), decided on the same inputs that are timed, then ``save()``; opened as
  graph-autofusion serves it (``fused_session``: denormal floats flushed, the default).

Each is run in onnxruntime (CPU, ``intra_op_num_threads=2``, ``inter_op_num_threads=1``) at
``ORT_ENABLE_BASIC`` and ``ORT_ENABLE_ALL``; at ``ORT_ENABLE_ALL`` a fourth variant,
``openvino``, runs the export on OpenVINO's CPU plugin (``peers.OpenVINOSession``: f32
``INFERENCE_PRECISION_HINT``, 2 threads, latency hint; recorded as unavailable when openvino
is not installed). Warm-up, then ``--runs`` rounds (``runtime.timing.round_robin`` with
``rotate=True``: each round runs every variant once, in its own seeded shuffled order).
Reported per variant: median, min, max, p10, p90 (ms); ratios ours/peer, ours/OpenVINO,
ours/original and ours/best peer of the medians, the best peer at ``ORT_ENABLE_ALL`` being the
fastest of ORT ALL (the export), the transformers optimizer and OpenVINO. The results files
record the CPU model and its ISA extensions. Fused operators are counted
by type in each model file (the operator types that are not in the original export's standard
set: ``com.microsoft`` contrib operators and ``SimplifiedLayerNormalization``), with the
peer's own ``get_fused_operator_statistics()`` and our safe-fusion report (fused, rolled back
by reason). A one-node kernel timing (``--kernels``) checks the claims safe mode makes when it
rolls a fusion back as slower.

ResNet-50 has no transformers-optimizer model type: its peer is onnxruntime's own
``ORT_ENABLE_ALL`` on the export (the ``original`` row at level ``all``), and ``ours/best`` is
ours over the fastest of the other variants. The KV-cache decoders (prefill at sequence 128 and
a 50-token greedy decode loop, ms/token) are measured by ``benchmarks/vs_ort_decode.py``, which
``--decode`` runs (other arguments are passed to it).

Run (the full run: every zoo model, both exporters, s16 and s128, 20+ rounds; about 30
minutes on a 2-vCPU machine; run it on a quiet machine)::

    .venv/bin/python benchmarks/vs_ort_optimizer.py
    .venv/bin/python benchmarks/vs_ort_optimizer.py --models bert --shapes 1x16 --runs 20
    .venv/bin/python benchmarks/vs_ort_optimizer.py --smoke    # MiniLM s16, 2 rounds, to a
                                                               # temporary folder: it works

Writes ``benchmarks/results/vs_ort_optimizer.json`` and ``vs_ort_optimizer.md``. Each
(model, exporter) runs in its own process (one model per process, as in the baselines).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
from peers import (  # noqa: E402
    PRE_CALLS,
    SPIN_SETTLE_S,
    OpenVINOSession,
    Unavailable,
    cpu_facts,
    openvino_version,
    timed_session,
)

# model -> (peer model_type, num_heads, hidden_size, our preset); no model type for a CNN: the
# transformers optimizer has none, so the best peer there is onnxruntime's own ORT_ENABLE_ALL
MODELS: dict[str, tuple[str | None, int, int, str]] = {
    "bert": ("bert", 12, 768, "transformer"),
    "gpt2": ("gpt2", 12, 768, "transformer"),
    "llama": ("gpt2", 8, 512, "llm"),
    "llama_gqa": ("gpt2", 8, 512, "llm"),
    "minilm": ("bert", 12, 384, "transformer"),
    "resnet50": (None, 0, 0, "cnn"),
    # CNNs outside the zoo (testing.specs.BENCH_NAMES), built from their default configs and
    # fused with the default preset, as a user would (ConvNeXt's blocks end in a Linear MLP)
    "mobilenet_v2": (None, 0, 0, "all"),
    "convnext": (None, 0, 0, "all"),
}
DEFAULT_MODELS = (
    "bert",
    "gpt2",
    "llama",
    "llama_gqa",
    "minilm",
    "resnet50",
    "mobilenet_v2",
    "convnext",
)
DEFAULT_SHAPES = ("1x16", "1x128")
# image models: one input shape (batch 1, 224x224)
ONLY_SHAPES = {n: ("1x224",) for n in ("resnet50", "mobilenet_v2", "convnext")}
EXTRA_SHAPES = {"bert": ("8x128",)}  # added with --extra
LEVELS = ("basic", "all")
VARIANTS = ("original", "peer", "openvino", "ours")
OPENVINO_LEVEL = "all"  # OpenVINO optimizes the export itself: timed once, beside ORT ALL
# standard operators that count as fused when a tool creates them
FUSED_STANDARD = {
    "SimplifiedLayerNormalization",
    "RMSNormalization",
    "Attention",
    "RotaryEmbedding",
}
ROUND_BUDGET_S = 4.0  # timed seconds per (shape, level) before more rounds stop being added
# fused operators that cover the same source pattern family (coverage is also checked per family)
FAMILIES = {
    "RMSNorm family (Skip + plain SimplifiedLayerNormalization)": (
        "SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
    ),
    "Gelu-with-bias family (BiasGelu, FastGelu)": ("BiasGelu", "FastGelu"),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- helpers
def op_counts(proto) -> dict[str, int]:
    """Node count by ``domain::op_type`` (plain op type for the ONNX domain)."""
    c: Counter[str] = Counter()
    for n in proto.graph.node:
        dom = n.domain if n.domain not in ("", "ai.onnx") else ""
        c[f"{dom}::{n.op_type}" if dom else n.op_type] += 1
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def fused_counts(counts: dict[str, int], original: dict[str, int]) -> dict[str, int]:
    """Fused operator types: non-ONNX-domain ops and fused standard ops, net of the original."""
    out = {}
    for k, v in counts.items():
        if "::" in k or k in FUSED_STANDARD:
            d = v - original.get(k, 0)
            if d > 0:
                out[k.split("::")[-1]] = d
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def stats_ms(ts: list[float]) -> dict[str, float]:
    a = np.asarray(ts) * 1e3
    return {
        "median": float(np.median(a)),
        "min": float(a.min()),
        "max": float(a.max()),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
        "n": int(a.size),
    }


#: Sessions per variant, used in turn and their samples pooled, so that no variant's result
#: hangs on one session's thread placement.
SESSIONS_PER_VARIANT = 2


def open_variant(name: str, path: str, level: str) -> Any:
    """A session of variant ``name`` (``openvino``: OpenVINO on the export, any level; ``ours``
    as graph-autofusion serves a fused model: ``fused_session``, denormal floats flushed,
    ``FuseOptions.denormals``' default, as ``vs_ort_decode.py`` and ``torch_e2e.py`` open it;
    the peers with onnxruntime's defaults)."""
    if name == "openvino":
        return OpenVINOSession(path)
    return timed_session(path, level, ours=name == "ours")


def time_side_by_side(
    paths: dict[str, str],
    feeds: dict[str, np.ndarray],
    level: str,
    warmup: int,
    runs: int,
    budget_s: float = ROUND_BUDGET_S,
) -> dict[str, Any]:
    """``SESSIONS_PER_VARIANT`` sessions of every variant loaded together; warm-up, then
    ``runs`` rounds (more, up to 5x, while they fit in ``budget_s``), each running every
    variant once in a seeded shuffled order (``round_robin(rotate=True)``), each variant's
    sessions used in turn."""
    import gc

    from graph_autofusion.runtime.timing import round_robin

    sessions: dict[str, list[Any]] = {}
    load_s = {}
    for k, p in paths.items():
        t = time.perf_counter()
        sessions[k] = [open_variant(k, p, level) for _ in range(SESSIONS_PER_VARIANT)]
        load_s[k] = (time.perf_counter() - t) / SESSIONS_PER_VARIANT
    ins = {
        k: {i.name: feeds[i.name] for i in s[0].get_inputs() if i.name in feeds}
        for k, s in sessions.items()
    }
    outs = {}
    t = time.perf_counter()
    for k, ss in sessions.items():
        for s in ss:
            outs[k] = s.run(None, ins[k])
    per_round = (time.perf_counter() - t) / SESSIONS_PER_VARIANT
    # at least ``runs`` rounds; more (up to 5x) while they fit in ``budget_s``
    per_round = per_round * (1 + PRE_CALLS) + SPIN_SETTLE_S * len(sessions)
    runs = max(runs, min(5 * runs, int(budget_s / max(per_round, 1e-6))))
    names = list(sessions)
    turn = 1 + PRE_CALLS  # a timed call and the untimed ones before it: one session
    calls = dict.fromkeys(names, -warmup)  # < 0: a warm-up call

    def call(k: str, sessions: dict[str, list[Any]] = sessions) -> Any:
        n = calls[k]
        calls[k] += 1
        # warm-ups use the sessions in turn; then timed call i (and its untimed ones) session
        # i % SESSIONS_PER_VARIANT
        j = (n if n < 0 else n // turn) % SESSIONS_PER_VARIANT
        return sessions[k][j].run(None, ins[k])

    gc.collect()
    gc.disable()
    try:
        fns = {k: (lambda k=k: call(k)) for k in names}
        times = round_robin(
            fns, runs, warmup, rotate=True, settle_s=SPIN_SETTLE_S, pre_calls=PRE_CALLS
        )
    finally:
        gc.enable()
    per_session: dict[str, list[list[float]]] = {
        k: [[] for _ in range(SESSIONS_PER_VARIANT)] for k in names
    }
    for k in names:
        for i, dt in enumerate(times[k]):
            per_session[k][i % SESSIONS_PER_VARIANT].append(dt)
    res: dict[str, Any] = {k: stats_ms(v) for k, v in times.items()}
    res["session_medians_ms"] = {
        k: [float(np.median(v) * 1e3) if v else None for v in per_session[k]] for k in names
    }
    res["session_load_s"] = load_s
    ref = outs.get("original")
    if ref is not None:
        res["max_abs_diff_vs_original"] = {
            k: float(
                max(
                    np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
                    for a, b in zip(o, ref, strict=False)
                    if np.shape(a) == np.shape(b)
                )
            )
            for k, o in outs.items()
            if k != "original"
        }
    del sessions
    gc.collect()
    return res


# ---------------------------------------------------------------------------- one model
def run_peer(path: Path, name: str, out_path: str, orig_counts: dict[str, int]) -> dict[str, Any]:
    from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

    model_type, heads, hidden, _ = MODELS[name]
    info: dict[str, Any] = {
        "model_type": model_type,
        "num_heads": heads,
        "hidden_size": hidden,
        "default_opt_level": MODEL_TYPES[model_type][2] if model_type else None,
    }
    t = time.perf_counter()
    if model_type is None:
        info.update(ok=False, error="the transformers optimizer has no model type for a CNN")
        info["optimize_s"] = 0.0
        return info
    try:
        opt = optimize_model(str(path), model_type=model_type, num_heads=heads, hidden_size=hidden)
        stats = opt.get_fused_operator_statistics()
        info["fused_operator_statistics"] = {k: int(v) for k, v in stats.items() if v}
        try:
            info["is_fully_optimized"] = bool(opt.is_fully_optimized())
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            info["is_fully_optimized"] = f"{type(exc).__name__}: {exc}"
        opt.save_model_to_file(out_path)
        import onnx

        proto = onnx.load(out_path)
        info["op_counts"] = op_counts(proto)
        info["fused_by_type"] = fused_counts(info["op_counts"], orig_counts)
        info["nodes"] = len(proto.graph.node)
        info["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a peer failure is a result
        info["ok"] = False
        info["error"] = f"{type(exc).__name__}: {exc}"
        info["traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
    info["optimize_s"] = time.perf_counter() - t
    return info


def run_ours(
    path: Path, name: str, feeds, out_path: str, orig_counts: dict[str, int]
) -> dict[str, Any]:
    import onnx

    from graph_autofusion.api import GraphAutoFusion

    preset = MODELS[name][3]
    t = time.perf_counter()
    gaf = GraphAutoFusion(str(path), preset=preset, sample_inputs=feeds)
    gaf.fuse()
    fuse_s = time.perf_counter() - t
    gaf.save(out_path)
    rep = gaf.safe_fusion_report().to_dict()
    patterns = {r.name: r.native_op or r.fuse_pattern for r in gaf.rules}
    rolled: Counter[str] = Counter()
    rolled_ops: Counter[str] = Counter()
    rolled_msgs: dict[str, str] = {}
    for b in rep["rolled_back"]:
        rolled[f"{b['rule']}:{b['code']}"] += 1
        rolled_ops[patterns.get(b["rule"], b["rule"])] += 1
        rolled_msgs.setdefault(f"{b['rule']}:{b['code']}", b["message"])
    proto = onnx.load(out_path)
    counts = op_counts(proto)
    # every rule candidate (matched at all) by the runtime operator its rule lowers to, and
    # why the ones not fused were left out
    native_of = {r.name: r.native_op for r in gaf.rules if r.rewrite is not None}
    lowered_as = {  # the contrib operator a lowering created (Gemm + Reshape + FastGelu: FastGelu)
        low.key: ([o for o in low.fused_ops if "::" in o] or low.fused_ops)[-1].split("::")[-1]
        for low in gaf.result.lowered
        if low.fused_ops
    }
    matched: Counter[str] = Counter()
    why_not: dict[str, Counter[str]] = {}
    why_msg: dict[str, str] = {}
    for c in gaf.result.analysis.candidates:
        rule = c.source.split(":", 1)[1] if c.source.startswith("rule:") else None
        if rule not in native_of:
            continue
        op = lowered_as.get(c.key, native_of[rule])  # bias_gelu lowers to FastGelu for tanh
        matched[op] += 1
        if not c.chosen:
            why_not.setdefault(op, Counter())[c.code] += 1
            why_msg.setdefault(f"{op}:{c.code}", c.message)
    # the same plan on a GPU profile (planning and lowering only: no GPU here to time it)
    gpu = GraphAutoFusion(str(path), preset=preset, sample_inputs=feeds, hardware="a100")
    gpu.fuse(safe_mode=False)
    gpu_ops: Counter[str] = Counter()
    for low in gpu.result.lowered:
        for op in low.fused_ops:
            gpu_ops[op.split("::")[-1]] += 1
    sf = gaf.result.shape_folding
    return {
        "preset": preset,
        "matched_by_native_op": dict(matched),
        "not_fused_by_native_op": {k: dict(v) for k, v in why_not.items()},
        "not_fused_example_message": why_msg,
        "a100_plan_fused_ops": dict(gpu_ops),
        "shape_folding": (
            {k: v for k, v in sf.to_dict().items() if k != "folded"} if sf is not None else None
        ),
        "fuse_s": fuse_s,
        "candidates": rep["candidates"],
        "planned": rep["planned"],
        "fused": rep["fused"],
        "fused_ops": rep["fused_ops"],
        "skipped": rep["skipped"],
        "rolled_back": len(rep["rolled_back"]),
        "rolled_back_by_rule_reason": dict(rolled),
        "rolled_back_fuse_patterns": dict(rolled_ops),
        "rolled_back_example_message": rolled_msgs,
        "estimated_improvement": rep["estimated_improvement"],
        "measured_improvement": rep["measured_improvement"],
        "end_to_end_passed": all(
            bool(v.get("passed", True))
            for v in (rep.get("end_to_end") or {}).values()
            if isinstance(v, dict)
        ),
        "timings_s": rep["timings_s"],
        "notes": rep["notes"],
        "op_counts": counts,
        "fused_by_type": fused_counts(counts, orig_counts),
        "nodes": len(proto.graph.node),
    }


def worker(
    name: str,
    exporter: str,
    shapes: list[str],
    warmup: int,
    runs: int,
    budget_s: float = ROUND_BUDGET_S,
) -> dict[str, Any]:
    import onnx

    from graph_autofusion.testing import example_feeds, export_onnx

    out: dict[str, Any] = {"model": name, "exporter": exporter, "load_start": os.getloadavg()}
    path = export_onnx(name, exporter)
    out["path"] = str(path)
    orig = onnx.load(str(path))
    orig_counts = op_counts(orig)
    out["original"] = {"nodes": len(orig.graph.node), "op_counts": orig_counts}
    del orig
    with tempfile.TemporaryDirectory(prefix="gaf_vs_ort_") as tmp:
        peer_path = os.path.join(tmp, "peer.onnx")
        log(f"{name}/{exporter}: peer optimize_model")
        out["peer"] = run_peer(path, name, peer_path, orig_counts)
        log(
            f"{name}/{exporter}: peer ok={out['peer']['ok']} "
            f"{out['peer'].get('fused_by_type') or out['peer'].get('error')}"
        )
        out["shapes"] = {}
        for shape in shapes:
            batch, seq = (int(x) for x in shape.split("x"))
            feeds = example_feeds(name, seq_len=seq, batch=batch)
            ours_path = os.path.join(tmp, f"ours_{shape}.onnx")
            log(f"{name}/{exporter}/{shape}: GraphAutoFusion.fuse")
            ours = run_ours(path, name, feeds, ours_path, orig_counts)
            log(f"{name}/{exporter}/{shape}: ours {ours['fused_by_type']} ({ours['fuse_s']:.1f}s)")
            paths = {"original": str(path), "ours": ours_path}
            if out["peer"]["ok"]:
                paths["peer"] = peer_path
            entry: dict[str, Any] = {"ours": ours, "levels": {}}
            for level in LEVELS:
                at = dict(paths)
                if level == OPENVINO_LEVEL and "openvino" not in out:
                    try:  # OpenVINO compiles the export itself: once per model is enough
                        OpenVINOSession(str(path))
                        out["openvino"] = {"ok": True, "version": openvino_version()}
                    except Unavailable as exc:
                        out["openvino"] = {"ok": False, "error": f"unavailable: {exc}"}
                    except Exception as exc:  # noqa: BLE001 - a peer failure is a result
                        out["openvino"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                if level == OPENVINO_LEVEL and out["openvino"]["ok"]:
                    at["openvino"] = str(path)
                at = {k: at[k] for k in VARIANTS if k in at}
                log(f"{name}/{exporter}/{shape}/{level}: timing {list(at)}")
                res = time_side_by_side(at, feeds, level, warmup, runs, budget_s)
                med = {k: res[k]["median"] for k in at}
                res["ratio_ours_over_original"] = med["ours"] / med["original"]
                # the best peer: ORT at this level (the export), the transformers optimizer,
                # and (at ORT_ENABLE_ALL) OpenVINO
                best = min((k for k in med if k != "ours"), key=med.get)
                res["best_peer"] = best
                res["ratio_ours_over_best_peer"] = med["ours"] / med[best]
                if "openvino" in med:
                    res["ratio_ours_over_openvino"] = med["ours"] / med["openvino"]
                res["ratio_min_ours_over_original"] = res["ours"]["min"] / res["original"]["min"]
                if "peer" in med:
                    res["ratio_ours_over_peer"] = med["ours"] / med["peer"]
                    res["ratio_peer_over_original"] = med["peer"] / med["original"]
                    res["ratio_min_ours_over_peer"] = res["ours"]["min"] / res["peer"]["min"]
                res["load_after"] = os.getloadavg()
                entry["levels"][level] = res
                log(
                    f"{name}/{exporter}/{shape}/{level}: "
                    + ", ".join(f"{k} {v:.2f}ms" for k, v in med.items())
                )
            out["shapes"][shape] = entry
    out["load_end"] = os.getloadavg()
    return out


# ---------------------------------------------------------------------------- kernel checks
def kernel_checks(runs: int = 400) -> list[dict[str, Any]]:
    """One-node onnxruntime timings of the fused operators against their unfused forms, on the
    zoo's shapes (checks safe mode's ``slower`` rollbacks independently)."""
    import onnxruntime  # noqa: F401
    from onnx import TensorProto, helper, numpy_helper

    def model(nodes, inputs, inits):
        g = helper.make_graph(
            nodes,
            "k",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, k) for k, v in inits.items()],
        )
        m = helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
        )
        return m.SerializeToString()

    ms = "com.microsoft"
    cases = []
    for b, s, h in ((1, 16, 768), (1, 128, 768), (8, 128, 768), (1, 16, 384), (1, 128, 384)):
        shp = [b, s, h]
        inits = {"g": np.ones(h, np.float32), "be": np.zeros(h, np.float32)}
        cases.append(
            (
                f"SkipLayerNormalization vs Add+LayerNormalization {b}x{s}x{h}",
                model(
                    [
                        helper.make_node("Add", ["x", "r"], ["t"]),
                        helper.make_node("LayerNormalization", ["t", "g", "be"], ["y"], axis=-1),
                    ],
                    [("x", shp), ("r", shp)],
                    inits,
                ),
                model(
                    [
                        helper.make_node(
                            "SkipLayerNormalization", ["x", "r", "g", "be"], ["y"], domain=ms
                        )
                    ],
                    [("x", shp), ("r", shp)],
                    inits,
                ),
                {"x": shp, "r": shp},
            )
        )
    for b, s in ((1, 16), (1, 128)):
        shp = [b, s, 512]
        inits = {"g": np.ones(512, np.float32)}
        cases.append(
            (
                f"SkipSimplifiedLayerNormalization vs Add+SimplifiedLayerNormalization {b}x{s}x512",
                model(
                    [
                        helper.make_node("Add", ["x", "r"], ["t"]),
                        helper.make_node(
                            "SimplifiedLayerNormalization", ["t", "g"], ["y"], axis=-1
                        ),
                    ],
                    [("x", shp), ("r", shp)],
                    inits,
                ),
                model(
                    [
                        helper.make_node(
                            "SkipSimplifiedLayerNormalization", ["x", "r", "g"], ["y"], domain=ms
                        )
                    ],
                    [("x", shp), ("r", shp)],
                    inits,
                ),
                {"x": shp, "r": shp},
            )
        )
    for b, s in ((1, 16), (1, 128)):
        shp = [b, s, 3072]
        inits = {"bias": np.full(3072, 0.1, np.float32)}
        cases.append(
            (
                f"BiasGelu vs Add+Gelu {b}x{s}x3072",
                model(
                    [
                        helper.make_node("Add", ["x", "bias"], ["t"]),
                        helper.make_node("Gelu", ["t"], ["y"]),
                    ],
                    [("x", shp)],
                    inits,
                ),
                model(
                    [helper.make_node("BiasGelu", ["x", "bias"], ["y"], domain=ms)],
                    [("x", shp)],
                    inits,
                ),
                {"x": shp},
            )
        )
    rng = np.random.default_rng(0)
    out = []
    for label, unfused, fused, shapes in cases:
        feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
        for threads in (2, 1):
            ss = {
                "unfused": session_bytes(unfused, threads),
                "fused": session_bytes(fused, threads),
            }
            ys = {k: s.run(None, feeds)[0] for k, s in ss.items()}
            n = runs if shapes["x"][0] * shapes["x"][1] <= 128 else max(50, runs // 4)
            ts: dict[str, list[float]] = {k: [] for k in ss}
            for _ in range(20):
                for s in ss.values():
                    s.run(None, feeds)
            for _ in range(n):
                for k, s in ss.items():
                    t = time.perf_counter()
                    s.run(None, feeds)
                    ts[k].append(time.perf_counter() - t)
            med = {k: 1e6 * statistics.median(v) for k, v in ts.items()}
            out.append(
                {
                    "case": label,
                    "threads": threads,
                    "level": "basic",
                    "unfused_us": med["unfused"],
                    "fused_us": med["fused"],
                    "fused_over_unfused": med["fused"] / med["unfused"],
                    "max_abs_diff": float(np.max(np.abs(ys["fused"] - ys["unfused"]))),
                }
            )
            log(
                f"kernel {label} t{threads}: unfused {med['unfused']:.1f}us "
                f"fused {med['fused']:.1f}us"
            )
    return out


def session_bytes(model: bytes, threads: int):
    from graph_autofusion.runtime.ort_session import ort_session

    # BASIC: ENABLE_ALL would itself fuse Add+LayerNormalization into SkipLayerNormalization;
    # onnxruntime's spinning workers, as before
    return ort_session(model, "basic", threads, spinning=True)


# ---------------------------------------------------------------------------- report
def coverage(peer: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Per fused type the peer creates: the peer's count, ours kept, ours matched (kept plus
    rolled back by safe mode)."""
    rows = {}
    rolled = {k.split("::")[-1]: v for k, v in ours.get("rolled_back_fuse_patterns", {}).items()}
    matched = ours.get("matched_by_native_op", {})
    gpu = ours.get("a100_plan_fused_ops", {})
    why = ours.get("not_fused_by_native_op", {})

    def row(n: int, ops: tuple[str, ...]) -> dict[str, Any]:
        reasons: Counter[str] = Counter()
        for o in ops:
            reasons.update(why.get(o, {}))
            reasons.update({f"rolled-back ({o})": rolled.get(o, 0)} if rolled.get(o) else {})
        return {
            "peer": n,
            "ours_kept": sum(ours["fused_by_type"].get(o, 0) for o in ops),
            "ours_matched": sum(matched.get(o, 0) for o in ops),
            "ours_a100_plan": sum(gpu.get(o, 0) for o in ops),
            "not_kept_because": dict(reasons),
        }

    for op, n in (peer.get("fused_by_type") or {}).items():
        rows[op] = row(n, (op,))
    for fam, ops in FAMILIES.items():
        n = sum((peer.get("fused_by_type") or {}).get(o, 0) for o in ops)
        if n and sum(1 for o in ops if (peer.get("fused_by_type") or {}).get(o)) > 0:
            rows[fam] = row(n, ops)
    return rows


def fmt_counts(d: dict[str, int] | None) -> str:
    if not d:
        return "none"
    return ", ".join(f"{k} {v}" for k, v in d.items())


def fmt_ms(s: dict[str, float] | None) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.2f} [{s['p10']:.2f}-{s['p90']:.2f}]"


def _run(data: dict[str, Any]) -> dict[str, Any]:
    env = data.get("environment", {})
    return {
        "date": data.get("date"),
        "commit": data.get("git", {}).get("head", "?")[:10],
        "cpu": env.get("cpu", "?"),
        "isa": env.get("isa", []),
    }


def _run_line(run: dict[str, Any]) -> str:
    return f"{run['date']} at {run['commit']} ({run['cpu']}, ISA {' '.join(run['isa']) or '?'})"


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with ``old``'s rows of the models ``new`` did not run (each row keeps its
    run's date, commit and CPU), and ``old``'s kernel checks when ``new`` has none."""
    rerun = {r["model"] for r in new["results"]}
    for r in new["results"]:
        r["run"] = _run(new)
    kept = [
        dict(r, run=r.get("run") or _run(old)) for r in old["results"] if r["model"] not in rerun
    ]
    order = {m: i for i, m in enumerate(DEFAULT_MODELS)}
    new["results"] = sorted(kept + new["results"], key=lambda r: order.get(r["model"], 99))
    if "kernels" not in new and "kernels" in old:
        new["kernels"] = old["kernels"]
    return new


def _merged(data: dict[str, Any]) -> bool:
    return len({_run_line(r["run"]) for r in data["results"] if "run" in r}) > 1


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "# Graph AutoFusion vs onnxruntime.transformers.optimizer (CPU)",
        "",
        f"Generated by `benchmarks/vs_ort_optimizer.py` on {data['date']}"
        f"{' (its last run: rows by run below)' if _merged(data) else ''} "
        f"({env.get('cpu', '?')}, ISA {' '.join(env.get('isa', [])) or '?'}; {env['cpus']} "
        f"CPUs, onnxruntime {env['onnxruntime']}, OpenVINO {env.get('openvino', '?')}, "
        f"{env['threads']} intra-op "
        f"threads, inter-op 1). Times in ms: median [p10-p90] of at least {data['runs']} runs "
        f"(more, up to 5x, for fast models; min/max and n in the JSON) after "
        f"{data['warmup']} warm-ups, the variants interleaved, each round in its own shuffled order, each over {SESSIONS_PER_VARIANT} sessions used in turn (onnxruntime's spinning workers, its default, with a {SPIN_SETTLE_S * 1e3:.0f} ms pause before every timed call so that one session's spinning ends before the next runs, then {PRE_CALLS} untimed call(s) of the same session so that the timed one finds its threads awake), in one process "
        f"per model. Ratios are of medians. Load average at start {data['load_start']}, at "
        f"end {data['load_end']} (other jobs shared the machine; differences under ~5% are "
        f"noise). Commit {data.get('git', {}).get('head', '?')[:10]}"
        f"{' with uncommitted library changes' if data.get('git', {}).get('dirty') else ''}.",
        "",
        "Fused counts are the operator types each tool's output file has that the export did "
        "not (contrib ops and SimplifiedLayerNormalization), before onnxruntime's own session "
        "fusions. Ours: safe mode on, default settings, decided on the timed shape, opened as "
        "graph-autofusion serves a fused model (`fused_session`: denormal floats flushed, "
        "`FuseOptions.denormals`' default, since 2026-12-06; `benchmarks/results/denormals.md` "
        "shows what the flag alone gives); the peers with onnxruntime's defaults.",
        "",
        "Ratios are of the medians (the JSON also has ratios of the minimums; on a shared "
        "machine single fast outliers make those unreliable).",
        "",
        "`peer` is the transformers optimizer's model in onnxruntime at that level; `OpenVINO` "
        "runs the export (f32 precision hint, 2 threads, latency hint), timed beside "
        "ORT_ENABLE_ALL; `ours/best` is ours over the fastest of the others at that level "
        "(at `all`: ORT ALL, the transformers optimizer and OpenVINO).",
        "",
    ]
    runs = {}
    for r in data["results"]:
        if "run" in r:
            runs.setdefault(_run_line(r["run"]), []).append(r["model"])
    if _merged(data):  # a --merge: rows from more than one run
        lines += ["Rows by run (`--merge` kept the other models' rows of an earlier run):", ""]
        lines += [f"* {', '.join(dict.fromkeys(ms))}: {line}" for line, ms in runs.items()]
        lines.append("")
    lines += [
        "| model | exporter | shape | level | original | peer | OpenVINO | ours | ours/peer | "
        "ours/original | ours/best | peer fused | ours fused | ours rolled back |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        if "error" in r and "shapes" not in r:
            lines.append(
                f"| {r['model']} | {r['exporter']} | | | worker failed: {r['error']} "
                "| | | | | | | | |"
            )
            continue
        peer = r["peer"]
        pf = fmt_counts(peer.get("fused_by_type")) if peer["ok"] else f"FAILED: {peer['error']}"
        for shape, e in r["shapes"].items():
            ours = e["ours"]
            rb = fmt_counts(ours["rolled_back_by_rule_reason"])
            for level, t in e["levels"].items():
                rop = t.get("ratio_ours_over_peer")
                lines.append(
                    f"| {r['model']} | {r['exporter']} | b{shape.replace('x', ' s')} | {level} "
                    f"| {fmt_ms(t.get('original'))} | {fmt_ms(t.get('peer'))} "
                    f"| {fmt_ms(t.get('openvino'))} | {fmt_ms(t.get('ours'))} | "
                    f"{'n/a' if rop is None else f'{rop:.3f}'} | "
                    f"{t['ratio_ours_over_original']:.3f} | "
                    f"{t.get('ratio_ours_over_best_peer', t['ratio_ours_over_original']):.3f} | {pf} | "
                    f"{fmt_counts(ours['fused_by_type'])} | {rb} |"
                )
    lines += ["", "## Pattern coverage (fused operators the peer creates)", ""]
    lines += [
        "`ours matched`: candidates our rules found for that operator (whether fused or not); "
        "`ours kept`: in the output on this host (cost model on the calibrated host profile, "
        "then safe mode); `a100 plan`: what the same tool lowers when planning for the a100 "
        "profile (no speed check: there is no GPU here); `why not kept`: reason codes of the "
        "candidates left out on the host (see docs/reasons.md; `skip-low-benefit` with a "
        "negative saving is a kernel measured slower than its pieces by calibration).",
        "",
        "| model | exporter | shape | fused op | peer | ours kept | ours matched | a100 plan "
        "| why not kept (host) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        if "shapes" not in r:
            continue
        for shape, e in r["shapes"].items():
            cov = e.get("coverage") or {}
            if not r["peer"]["ok"]:
                lines.append(
                    f"| {r['model']} | {r['exporter']} | {shape} | (peer failed) | | | | | |"
                )
            for op, c in cov.items():
                lines.append(
                    f"| {r['model']} | {r['exporter']} | {shape} | {op} | {c['peer']} | "
                    f"{c['ours_kept']} | {c.get('ours_matched', '')} | "
                    f"{c.get('ours_a100_plan', '')} | "
                    f"{fmt_counts(c.get('not_kept_because')) if c.get('not_kept_because') else ''} |"
                )
    lines += ["", "## Peer's own statistics (`get_fused_operator_statistics`)", ""]
    lines += [
        "| model | exporter | statistics | is_fully_optimized | optimize s |",
        "|---|---|---|---|---|",
    ]
    for r in data["results"]:
        if "peer" not in r:
            continue
        p = r["peer"]
        stats = fmt_counts(p.get("fused_operator_statistics")) if p["ok"] else p["error"]
        lines.append(
            f"| {r['model']} | {r['exporter']} | {stats} | {p.get('is_fully_optimized', '')} "
            f"| {p['optimize_s']:.1f} |"
        )
    if data.get("kernels"):
        lines += [
            "",
            "## One-node kernel timings (onnxruntime CPU, ORT_ENABLE_BASIC, µs, median)",
            "",
            "| case | threads | unfused | fused | fused/unfused |",
            "|---|---|---|---|---|",
        ]
        for k in data["kernels"]:
            lines.append(
                f"| {k['case']} | {k['threads']} | {k['unfused_us']:.1f} | {k['fused_us']:.1f} "
                f"| {k['fused_over_unfused']:.2f} |"
            )
    lines.append("")
    return "\n".join(lines)


def _git_state() -> dict[str, Any]:
    """The commit measured, and whether library files differed from it (read-only git)."""

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            return ""

    return {"head": git("rev-parse", "HEAD"), "dirty": git("status", "--short", "graph_autofusion")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--exporters", default="dynamo,torchscript")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="BxS list, e.g. 1x16")
    ap.add_argument("--extra", action="store_true", help="also BERT b8 s128")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-kernels", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="prove it runs: MiniLM torchscript s16, 2 rounds, no kernel checks, written to a "
        "temporary folder unless --out is given (not a measurement)",
    )
    ap.add_argument("--budget", type=float, default=ROUND_BUDGET_S, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=f"results folder (default {RESULTS})")
    ap.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the results file's rows of the models not in --models (each row says its run)",
    )
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    ap.add_argument("--kernels-json", help=argparse.SUPPRESS)
    ap.add_argument(
        "--decode",
        action="store_true",
        help="the KV-cache decoders instead (prefill + greedy decode loop): runs vs_ort_decode.py",
    )
    args, rest = ap.parse_known_args()
    if args.decode:
        sys.exit(
            subprocess.call([sys.executable, str(ROOT / "benchmarks" / "vs_ort_decode.py"), *rest])
        )
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.smoke:
        args.models, args.exporters, args.shapes = "minilm", "torchscript", "1x16"
        args.runs, args.warmup, args.no_kernels, args.budget = 2, 1, True, 0.0
        args.out = args.out or tempfile.mkdtemp(prefix="vs_ort_optimizer_smoke_")
    args.out = args.out or str(RESULTS)
    if args.runs < 20 and not args.smoke and not args.worker:
        log("note: fewer than 20 runs requested")

    if args.render:
        out = Path(args.out)
        data = json.loads((out / "vs_ort_optimizer.json").read_text())
        (out / "vs_ort_optimizer.md").write_text(markdown(data))
        return
    if args.kernels_json:
        Path(args.kernels_json).write_text(json.dumps(kernel_checks()))
        return
    if args.worker:
        name, exporter = args.worker
        shapes = args.shapes.split(",")
        data = worker(name, exporter, shapes, args.warmup, args.runs, args.budget)
        Path(args.worker_json).write_text(json.dumps(data, default=str))
        return

    import onnxruntime

    start = time.time()
    data: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "runs": args.runs,
        "warmup": args.warmup,
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "environment": {
            **cpu_facts(),  # the CPU model and its ISA extensions
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "openvino": openvino_version(),
            "threads": 2,
            "machine": platform.processor() or platform.machine(),
        },
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git": _git_state(),
        "results": [],
    }
    with tempfile.TemporaryDirectory(prefix="gaf_vs_ort_main_") as tmp:
        for name in args.models.split(","):
            shapes = list(ONLY_SHAPES.get(name, args.shapes.split(",")))
            if args.extra:
                shapes += [s for s in EXTRA_SHAPES.get(name, ()) if s not in shapes]
            for exporter in args.exporters.split(","):
                jpath = os.path.join(tmp, f"{name}-{exporter}.json")
                cmd = [
                    sys.executable, __file__, "--worker", name, exporter,
                    "--worker-json", jpath, "--shapes", ",".join(shapes),
                    "--runs", str(args.runs), "--warmup", str(args.warmup),
                    "--budget", str(args.budget),
                ]  # fmt: skip
                t = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, check=False)
                if proc.returncode == 0 and os.path.exists(jpath):
                    r = json.loads(Path(jpath).read_text())
                    for e in r["shapes"].values():
                        e["coverage"] = coverage(r["peer"], e["ours"]) if r["peer"]["ok"] else {}
                else:
                    r = {"model": name, "exporter": exporter, "error": f"rc {proc.returncode}"}
                r["wall_s"] = time.perf_counter() - t
                data["results"].append(r)
                log(f"{name}/{exporter} done in {r['wall_s']:.0f}s")
        if not args.no_kernels:
            kpath = os.path.join(tmp, "kernels.json")
            subprocess.run([sys.executable, __file__, "--kernels-json", kpath], check=False)
            if os.path.exists(kpath):
                data["kernels"] = json.loads(Path(kpath).read_text())
    data["load_end"] = [round(x, 2) for x in os.getloadavg()]
    data["wall_s"] = time.time() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge and (out / "vs_ort_optimizer.json").is_file():
        data = merge(json.loads((out / "vs_ort_optimizer.json").read_text()), data)
    (out / "vs_ort_optimizer.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "vs_ort_optimizer.md").write_text(markdown(data))
    log(f"wrote {out / 'vs_ort_optimizer.md'} in {data['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
