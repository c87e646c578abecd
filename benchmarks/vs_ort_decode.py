"""KV-cache decoders: Graph AutoFusion against onnxruntime's transformers optimizer, side by side.

The decoder half of ``benchmarks/vs_ort_optimizer.py`` (``--decode`` there runs this script).
For every KV-cache decoder export of the zoo (``graph_autofusion.testing.kv_cache``: Llama MHA
and GQA, GPT-2, Qwen2; both torch exporters) three models run in onnxruntime (CPU, 2 intra-op
threads, ``ORT_ENABLE_ALL``, onnxruntime's default spinning workers, every timed call after an
untimed ``peers.SPIN_SETTLE_S`` pause; a prefill also after ``peers.PRE_CALLS`` untimed ones)
in one process:

* ``original``: the export;
* ``peer``: ``onnxruntime.transformers.optimizer.optimize_model(path, "gpt2", heads, hidden)``
  (its decoder model type; a failure is recorded, never hidden);
* ``ours``: ``GraphAutoFusion(path, preset="llm" or "transformer").fuse()`` with its defaults
  (safe mode on) and no hand-made inputs (as a user runs it: the sample inputs it generates for
  a KV-cache decoder, a past of ``P`` tokens and ``S`` new ones that agree, recorded as
  ``sample_shapes``), then ``save()``;
* ``ours+kernels``: the same with ``fuse(custom_ops=True)`` (generated kernels and the few-row
  ``Gemv`` as onnxruntime custom operators), saved with its kernel folder;
  both of ours opened with ``graph_autofusion.runtime.ort_session.fused_session`` (same
  session settings, and denormal floats flushed as our sessions serve a fused model by
  default, ``FuseOptions.denormals``; the peers run with their own defaults);
* ``openvino``: the export on OpenVINO's CPU plugin (``peers.OpenVINOSession``: f32
  ``INFERENCE_PRECISION_HINT``, 2 threads, latency hint; recorded as unavailable when openvino
  is not installed).

Measured, variants interleaved, each round in its own seeded shuffled order
(``runtime.timing.round_robin(rotate=True)``); the best peer is the fastest of the original in
onnxruntime (ORT ALL), the transformers optimizer and OpenVINO:

* **prefill** at sequence ``--prefill`` (128) with an empty cache: median ms of ``--runs``
  rounds;
* **decode**: a greedy loop of ``--steps`` (50) tokens after a 16-token prompt, run
  ``--loops`` times per variant (loops interleaved); ms/token is the mean step time of a loop,
  reported as the median over loops;
* the greedy tokens of every variant against PyTorch's own cached generation (exact equality),
  and the prefill logits' cosine and max difference against the original.

Fused operator counts by type for the peer and for ours (types the export does not have), and
what each of ours replaced (safe-mode report). Writes ``benchmarks/results/vs_ort_decode.json``
and ``.md`` (with the CPU model and its ISA extensions).

The full run (every zoo decoder, both exporters; ~20 min; on a quiet machine)::

    .venv/bin/python benchmarks/vs_ort_decode.py
    .venv/bin/python benchmarks/vs_ort_decode.py --models llama --exporters dynamo
    .venv/bin/python benchmarks/vs_ort_decode.py --smoke   # Llama torchscript, prefill 16,
                                                           # 4 tokens, 1 loop, to a temporary
                                                           # folder: it works (not a measurement)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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
from vs_ort_optimizer import fused_counts, log, op_counts  # noqa: E402

# decoder -> (peer num_heads, hidden_size, our preset)
DECODERS: dict[str, tuple[int, int, str]] = {
    "llama": (8, 512, "llm"),
    "llama_gqa": (8, 512, "llm"),
    "gpt2": (12, 768, "transformer"),
    "qwen2": (8, 512, "llm"),
}
VARIANTS = ("original", "peer", "openvino", "ours", "ours+kernels")
OURS = ("ours", "ours+kernels")
PROMPT = 16
#: What ours decided on, in the report (results before this change: one hand-built decode step)
OURS_SAMPLES = "the sample inputs it generates (no hand-made inputs)"
SAMPLE_PAST = 64


def decode_feeds(name: str, past: int, seq: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """One hand-built decode step at past ``past``: for the benchmarks that study that step
    (``gemv_decode.py``, ``compressed_weights.py``); ``run_ours`` fuses with none."""
    from graph_autofusion.testing.kv_cache import decoder_dims, past_names

    _, kv, hd = decoder_dims(name)
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": rng.integers(0, 1000, (1, seq)).astype(np.int64),
        "attention_mask": np.ones((1, past + seq), np.int64),
        "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
    }
    for n in past_names(name):
        feeds[n] = (rng.standard_normal((1, kv, past, hd)) * 0.5).astype(np.float32)
    return feeds


def run_peer(path: Path, name: str, out: str, orig: dict[str, int]) -> dict[str, Any]:
    from onnxruntime.transformers.optimizer import optimize_model

    heads, hidden, _ = DECODERS[name]
    info: dict[str, Any] = {"model_type": "gpt2", "num_heads": heads, "hidden_size": hidden}
    t = time.perf_counter()
    try:
        opt = optimize_model(str(path), model_type="gpt2", num_heads=heads, hidden_size=hidden)
        opt.save_model_to_file(out)
        import onnx

        counts = op_counts(onnx.load(out, load_external_data=False))
        info.update(ok=True, fused_by_type=fused_counts(counts, orig), nodes=sum(counts.values()))
    except Exception as exc:  # noqa: BLE001 - a peer failure is a result
        info.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        info["traceback_tail"] = traceback.format_exc().strip().splitlines()[-4:]
    info["optimize_s"] = time.perf_counter() - t
    return info


def run_ours(
    path: Path, name: str, out: str, orig: dict[str, int], custom_ops: bool = False
) -> dict[str, Any]:
    import onnx

    from graph_autofusion.api import GraphAutoFusion

    preset = DECODERS[name][2]
    t = time.perf_counter()
    gaf = GraphAutoFusion(str(path), preset=preset)  # no sample inputs: it generates them
    gaf.fuse(custom_ops=custom_ops)
    fuse_s = time.perf_counter() - t
    sample_shapes = {k: list(np.shape(v)) for k, v in gaf.feeds().items()}
    gaf.save(out)
    rep = gaf.safe_fusion_report().to_dict()
    replaced: dict[str, Counter[str]] = {}
    for low in gaf.result.lowered:
        main = ([o for o in low.fused_ops if o not in ("Slice", "Squeeze", "Where", "Add")] or
                low.fused_ops)[-1].split("::")[-1]  # fmt: skip
        replaced.setdefault(main, Counter())[
            f"{low.rule} ({len(low.original_node_names)} nodes)"
        ] += 1
    counts = op_counts(onnx.load(out, load_external_data=False))
    rolled = Counter(f"{b['rule']}:{b['code']}" for b in rep["rolled_back"])
    return {
        "preset": preset,
        "custom_ops": custom_ops,
        "kernel_dir": getattr(gaf, "kernel_dir", None) or None,
        "notes": list(gaf.result.notes),
        "fuse_s": fuse_s,
        "sample_shapes": sample_shapes,
        "fused": rep["fused"],
        "fused_ops": rep["fused_ops"],
        "replaced": {k: dict(v) for k, v in replaced.items()},
        "rolled_back": dict(rolled),
        "skipped": rep["skipped"],
        "end_to_end": rep.get("end_to_end"),
        "opset": int(
            dict(
                (o.domain, o.version) for o in onnx.load(out, load_external_data=False).opset_import
            )[""]
        ),
        "fused_by_type": fused_counts(counts, orig),
        "nodes": sum(counts.values()),
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def worker(name: str, exporter: str, args: argparse.Namespace) -> dict[str, Any]:
    import gc

    import onnx

    from graph_autofusion.testing.kv_cache import (
        decoder_module,
        empty_past,
        export_decoder,
        greedy_decode_ort,
        greedy_decode_torch,
    )

    res: dict[str, Any] = {"model": name, "exporter": exporter, "load_start": os.getloadavg()}
    path = export_decoder(name, exporter)
    orig = op_counts(onnx.load(str(path), load_external_data=False))
    res["original_nodes"] = sum(orig.values())
    tmp = tempfile.mkdtemp(prefix="gaf_decode_")
    paths = {"original": str(path)}
    log(f"{name}/{exporter}: peer")
    res["peer"] = run_peer(path, name, os.path.join(tmp, "peer.onnx"), orig)
    if res["peer"]["ok"]:
        paths["peer"] = os.path.join(tmp, "peer.onnx")
    log(f"{name}/{exporter}: ours")
    res["ours"] = run_ours(path, name, os.path.join(tmp, "ours.onnx"), orig)
    paths["ours"] = os.path.join(tmp, "ours.onnx")
    log(f"{name}/{exporter}: ours+kernels")
    res["ours+kernels"] = run_ours(path, name, os.path.join(tmp, "ours_k.onnx"), orig, True)
    paths["ours+kernels"] = os.path.join(tmp, "ours_k.onnx")

    from graph_autofusion.runtime.timing import round_robin

    # ours as graph-autofusion serves a fused model (denormals flushed, the FuseOptions default
    # its metadata records); every peer with its own defaults
    sessions = {k: timed_session(p, "all", ours=k.startswith("ours")) for k, p in paths.items()}
    try:  # OpenVINO on the export
        sessions["openvino"] = OpenVINOSession(str(path))
        res["openvino"] = {"ok": True, "version": openvino_version()}
    except Unavailable as exc:
        res["openvino"] = {"ok": False, "error": f"unavailable: {exc}"}
    except Exception as exc:  # noqa: BLE001 - a peer failure is a result
        res["openvino"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    sessions = {k: sessions[k] for k in VARIANTS if k in sessions}
    names = list(sessions)
    # greedy tokens: every variant against PyTorch
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 1000, (1, PROMPT)).astype(np.int64)
    module = decoder_module(name)
    res["torch_tokens"] = greedy_decode_torch(module, prompt, args.steps)
    del module
    gc.collect()
    # prefill
    pre = {
        "input_ids": rng.integers(0, 1000, (1, args.prefill)).astype(np.int64),
        "attention_mask": np.ones((1, args.prefill), np.int64),
        "position_ids": np.arange(args.prefill, dtype=np.int64)[None],
        **empty_past(name),
    }
    declared = {k: {i.name for i in s.get_inputs()} for k, s in sessions.items()}
    outs = {}
    for k, s in sessions.items():
        for _ in range(args.warmup):
            outs[k] = s.run(None, {n: v for n, v in pre.items() if n in declared[k]})[0]
    prefill_feeds = {k: {n: v for n, v in pre.items() if n in declared[k]} for k in names}
    times = round_robin(
        {k: (lambda s=sessions[k], f=prefill_feeds[k]: s.run(None, f)) for k in names},
        args.runs,
        warmup=0,  # warmed up above
        rotate=True,
        settle_s=SPIN_SETTLE_S,
        pre_calls=PRE_CALLS,
    )
    res["prefill_ms"] = {k: float(np.median(v) * 1e3) for k, v in times.items()}
    res["prefill_p10_p90_ms"] = {
        k: [float(np.percentile(v, 10) * 1e3), float(np.percentile(v, 90) * 1e3)]
        for k, v in times.items()
    }
    res["prefill_vs_original"] = {
        k: {
            "cosine": _cosine(o, outs["original"]),
            "max_abs": float(np.abs(o - outs["original"]).max()),
        }
        for k, o in outs.items()
        if k != "original"
    }
    # decode loops
    loops: dict[str, list[float]] = {k: [] for k in names}
    tokens: dict[str, list[int]] = {}
    for k, s in sessions.items():  # warm-up loop (also the tokens)
        tokens[k] = greedy_decode_ort(s, name, prompt, args.steps)[0]

    def loop(k: str, sess: Any) -> None:  # the loop's own step times, not the call's wall time
        _, steps, _ = greedy_decode_ort(sess, name, prompt, args.steps)
        loops[k].append(statistics.fmean(steps) * 1e3)

    fns = {k: (lambda k=k, s=sessions[k]: loop(k, s)) for k in names}
    # a loop is a stream of steps already: no untimed call before it
    round_robin(fns, args.loops, warmup=0, rotate=True, settle_s=SPIN_SETTLE_S)
    del fns
    res["decode_ms_per_token"] = {k: float(np.median(v)) for k, v in loops.items()}
    res["decode_loops_ms_per_token"] = loops
    res["tokens"] = tokens
    res["tokens_equal_torch"] = {k: t == res["torch_tokens"] for k, t in tokens.items()}
    res["load_end"] = os.getloadavg()
    del sessions
    gc.collect()
    shutil.rmtree(tmp, ignore_errors=True)  # three copies of the weights
    return res


def _best_peer(d: dict[str, float]) -> tuple[str, float]:
    peers = {k: v for k, v in d.items() if k not in OURS}
    k = min(peers, key=peers.get)
    return k, peers[k]


def _fmt(d: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (d or {}).items()) or "none"


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "# KV-cache decoders: Graph AutoFusion vs onnxruntime.transformers.optimizer (CPU)",
        "",
        f"Generated by `benchmarks/vs_ort_decode.py` on {data['date']} ({env.get('cpu', '?')}, "
        f"ISA {' '.join(env.get('isa', [])) or '?'}; {env['cpus']} "
        f"CPUs, onnxruntime {env['onnxruntime']}, 2 intra-op threads, "
        f"ORT_ENABLE_ALL; OpenVINO {env.get('openvino', '?')} on the export, f32 precision hint, "
        f"2 threads, latency hint). Prefill: sequence {data['prefill']} with an empty cache, median of "
        f"{data['runs']} interleaved runs (each round in its own shuffled order). Decode: greedy loops of {data['steps']} tokens after a "
        f"{PROMPT}-token prompt, ms/token = mean step time of a loop, median of {data['loops']} "
        f"interleaved loops. Ours: safe mode on, decided on "
        f"{data.get('ours_samples', 'one hand-built decode step at past 64')}. "
        f"Load average at start {data['load_start']}, at end {data['load_end']}. "
        f"Commit {data['git'].get('head', '?')[:10]}{' with uncommitted library changes' if data['git'].get('dirty') else ''}.",
        "",
        "The best peer is the fastest of the original (ORT ALL), the transformers optimizer "
        "(peer) and OpenVINO. Ours run as graph-autofusion serves a fused model "
        f"({data.get('ours_serving', 'denormals as onnxruntime leaves them')}); the peers with "
        "their own defaults.",
        "",
        "| model | exporter | prefill original | peer | OpenVINO | ours | ours/best peer | ours+kernels | +kernels/best peer | decode ms/token original | peer | OpenVINO | ours | ours/best peer | ours+kernels | +kernels/best peer | tokens = torch (orig/peer/OpenVINO/ours/+kernels) | prefill cosine ours / +kernels |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['exporter']} | FAILED: {r['error']} |||||||||")
            continue
        p, d = r["prefill_ms"], r["decode_ms_per_token"]
        _, bp = _best_peer(p)
        _, bd = _best_peer(d)
        eq = "/".join(
            "yes"
            if r["tokens_equal_torch"].get(k)
            else ("n/a" if k not in r["tokens_equal_torch"] else "NO")
            for k in VARIANTS
        )
        cos = r["prefill_vs_original"].get("ours", {}).get("cosine")
        cosk = r["prefill_vs_original"].get("ours+kernels", {}).get("cosine", float("nan"))
        nan = float("nan")
        pk, dk = p.get("ours+kernels", nan), d.get("ours+kernels", nan)
        lines.append(
            f"| {r['model']} | {r['exporter']} | {p['original']:.2f} | {p.get('peer', nan):.2f} | "
            f"{p.get('openvino', nan):.2f} | "
            f"{p['ours']:.2f} | {p['ours'] / bp:.3f} | {pk:.2f} | {pk / bp:.3f} | {d['original']:.3f} | "
            f"{d.get('peer', nan):.3f} | {d.get('openvino', nan):.3f} | {d['ours']:.3f} | {d['ours'] / bd:.3f} | "
            f"{dk:.3f} | {dk / bd:.3f} | {eq} | {cos:.6f} / {cosk:.6f} |"
        )
    lines += ["", "## Fused operators", "",
              "| model | exporter | nodes original / peer / ours | peer fused | ours fused | ours: what each replaced | rolled back |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in data["results"]:
        if "error" in r:
            continue
        peer = r["peer"]
        pf = _fmt(peer.get("fused_by_type")) if peer["ok"] else f"FAILED: {peer['error'][:80]}"
        for v in OURS:
            if v not in r:
                continue
            rep = "; ".join(f"{op}: {_fmt(c)}" for op, c in r[v]["replaced"].items())
            lines.append(
                f"| {r['model']} | {r['exporter']}{' (+kernels)' if v != 'ours' else ''} | "
                f"{r['original_nodes']} / {peer.get('nodes', '-')} / "
                f"{r[v]['nodes']} | {pf} | {_fmt(r[v]['fused_by_type'])} | {rep} | "
                f"{_fmt(r[v]['rolled_back'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DECODERS))
    ap.add_argument("--exporters", default="dynamo,torchscript")
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--loops", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None, help=f"results folder (default {RESULTS})")
    ap.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="prove it runs: Llama torchscript, prefill 16, 4 tokens, 1 loop, 2 rounds, "
        "written to a temporary folder unless --out is given (not a measurement)",
    )
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "EXPORTER"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.models, args.exporters, args.prefill, args.steps = "llama", "torchscript", 16, 4
        args.loops, args.runs, args.warmup = 1, 2, 1
        args.out = args.out or tempfile.mkdtemp(prefix="vs_ort_decode_smoke_")
    out = Path(args.out or RESULTS)
    if args.render:
        data = json.loads((out / "vs_ort_decode.json").read_text())
        (out / "vs_ort_decode.md").write_text(markdown(data))
        return
    if args.worker:
        data = worker(*args.worker, args)
        Path(args.worker_json).write_text(json.dumps(data, default=str))
        return
    import onnxruntime
    from vs_ort_optimizer import _git_state

    start = time.time()
    data: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "prefill": args.prefill,
        "steps": args.steps,
        "loops": args.loops,
        "runs": args.runs,
        "ours_samples": OURS_SAMPLES,
        "ours_serving": "fused_session: denormal floats flushed, FuseOptions.denormals' default",
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "environment": {
            **cpu_facts(),  # the CPU model and its ISA extensions
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "openvino": openvino_version(),
        },
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git": _git_state(),
        "results": [],
    }
    with tempfile.TemporaryDirectory(prefix="gaf_decode_main_") as tmp:
        for name in args.models.split(","):
            for exporter in args.exporters.split(","):
                jpath = os.path.join(tmp, f"{name}-{exporter}.json")
                cmd = [sys.executable, __file__, "--worker", name, exporter, "--worker-json", jpath,
                       "--prefill", str(args.prefill), "--steps", str(args.steps),
                       "--loops", str(args.loops), "--runs", str(args.runs),
                       "--warmup", str(args.warmup)]  # fmt: skip
                t = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, check=False)
                if proc.returncode == 0 and os.path.exists(jpath):
                    r = json.loads(Path(jpath).read_text())
                else:
                    r = {"model": name, "exporter": exporter, "error": f"rc {proc.returncode}"}
                r["wall_s"] = time.perf_counter() - t
                data["results"].append(r)
                log(f"{name}/{exporter} done in {r['wall_s']:.0f}s")
                out.mkdir(parents=True, exist_ok=True)  # partial results survive a cut-off
                data["load_end"] = [round(x, 2) for x in os.getloadavg()]
                (out / "vs_ort_decode.json").write_text(
                    json.dumps(data, indent=1, default=str) + "\n"
                )
                (out / "vs_ort_decode.md").write_text(markdown(data))
    data["wall_s"] = time.time() - start
    (out / "vs_ort_decode.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "vs_ort_decode.md").write_text(markdown(data))
    print((out / "vs_ort_decode.md").read_text())


if __name__ == "__main__":
    main()
