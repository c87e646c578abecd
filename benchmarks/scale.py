"""Whole-pipeline scale benchmark (issue 15): 10,000-, 30,000- and 100,000-node graphs.

Run: ``.venv/bin/python benchmarks/scale.py [--sizes 10000,30000,100000] [--repeat 1]``
(writes ``benchmarks/results/scale.md`` and ``scale.json`` and prints the table).

The graphs come from :func:`graph_autofusion.testing.scale_graphs.hybrid_stack`: a deep stack
of CNN blocks (Conv + BatchNormalization + Relu, depthwise Conv, SiLU, squeeze-and-excite,
residual) and transformer blocks (decomposed LayerNorm, masked Softmax attention, MatMul +
bias, erf-GELU, residual) with static shapes. Each size runs in its own subprocess (so its
peak memory, ``ru_maxrss``, is its own) and goes through the pipeline ``graph-autofusion fuse``
runs for the onnxruntime target, with every built-in rule:

* ``import``: :func:`~graph_autofusion.frontend.loader.load_model` of the ``.onnx`` file;
* :func:`graph_autofusion.pipeline.fuse_model` with **safe mode off** (safe mode runs
  onnxruntime on every fusion and the whole model; at 100,000 nodes that measures onnxruntime,
  not the compiler), timed by its own stages: ``prepare`` (the working copy and the ``Reshape``
  shape folding), then the analysis' ``bind`` (one execution of the graph for concrete shapes),
  ``candidates`` (rule matches and automatic clusters), ``cost`` (the cost model on every
  candidate), ``plan`` (``auto`` strategy), ``report``, then ``lower`` (the native rewrites)
  and ``finish`` (shared constants, layout clean-ups);
* ``export``: :func:`~graph_autofusion.frontend.onnx_frontend.save_onnx` of the fused model.

The fused model is then checked (not timed): ``onnx.checker`` (full) and the IR verifier.
The torch runtime that binds the shapes is kept to one thread (``torch.set_num_threads(1)``):
on a shared, loaded machine, tiny operators on two OpenMP threads take milliseconds each.

``--repeat R`` runs each size R times and keeps each stage's fastest time (the machine is
noisy); the growth exponent of a stage is the log-log slope of its time between two sizes
(1.0 = linear; n log n from 10k to 100k reads about 1.1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
OUT_JSON = RESULTS / "scale.json"
OUT_MD = RESULTS / "scale.md"
STAGES = (
    "import",
    "prepare",
    "bind",
    "candidates",
    "cost",
    "plan",
    "report",
    "lower",
    "finish",
    "export",
)
ANALYSIS_STAGES = ("bind", "candidates", "cost", "plan", "report")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def measure(num_nodes: int, hardware: str = "ascend910b") -> dict:
    """One size, in this process: build, then time every stage."""
    import onnx
    import torch

    from graph_autofusion.cost.hardware import load_profile
    from graph_autofusion.frontend.loader import load_model
    from graph_autofusion.frontend.onnx_frontend import save_onnx, to_onnx
    from graph_autofusion.ir.verify import verify
    from graph_autofusion.options import FuseOptions
    from graph_autofusion.patterns.library import builtin_rules
    from graph_autofusion.pipeline import fuse_model
    from graph_autofusion.testing.scale_graphs import hybrid_feeds, hybrid_stack

    torch.set_num_threads(1)
    profile = load_profile(hardware)
    rules = builtin_rules()
    unsafe = FuseOptions(safe_mode=False)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "fused.onnx")
        t = time.perf_counter()
        save_onnx(to_onnx(hybrid_stack(num_nodes)), src)
        build_s = time.perf_counter() - t
        rss_built = _rss_mib()
        times: dict[str, float] = {}
        cpu0 = time.process_time()
        t = time.perf_counter()
        model = load_model(src)
        times["import"] = time.perf_counter() - t
        feeds = hybrid_feeds(model)
        t = time.perf_counter()
        result = fuse_model(model, rules, profile, options=unsafe, feeds=feeds)
        fuse_s = time.perf_counter() - t
        sub = result.analysis.timings
        for k in ANALYSIS_STAGES:
            times[k] = sub[k]
        times["prepare"] = result.timings["analyze"] - sum(sub[k] for k in ANALYSIS_STAGES)
        times["lower"] = result.timings["lower"]
        times["finish"] = fuse_s - result.timings["analyze"] - result.timings["lower"]
        t = time.perf_counter()
        save_onnx(result.model, dst)
        times["export"] = time.perf_counter() - t
        cpu_s = time.process_time() - cpu0
        onnx.checker.check_model(dst, full_check=True)
        verify(result.model)
        fused_bytes = os.path.getsize(dst)
    analysis = result.analysis
    return {
        "target_nodes": num_nodes,
        "nodes": len(model.graph),
        "fused_nodes": len(result.model.graph),
        "candidates": len(analysis.candidates),
        "chosen": len(analysis.chosen),
        "lowered": len(result.lowered),
        "not_lowered": len(result.not_lowered),
        "fused_onnx_bytes": fused_bytes,
        "build_s": build_s,
        "times_s": {k: times[k] for k in STAGES},
        "total_s": sum(times.values()),
        "cpu_s": cpu_s,
        "load_average_1min": os.getloadavg()[0],
        "peak_rss_mib": _rss_mib(),
        "rss_after_build_mib": rss_built,
        "valid": True,
    }


def _child(n: int, hardware: str) -> dict:
    cmd = [sys.executable, __file__, "--one", str(n), "--hardware", hardware]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"size {n} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exponents(rows: list[dict]) -> list[dict]:
    """Log-log slope of every stage (and the total) between consecutive sizes."""
    out = []
    for a, b in zip(rows, rows[1:]):
        ratio = math.log(b["nodes"] / a["nodes"])
        slopes = {}
        for k in (*STAGES, "total"):
            ta = a["total_s"] if k == "total" else a["times_s"][k]
            tb = b["total_s"] if k == "total" else b["times_s"][k]
            slopes[k] = math.log(tb / ta) / ratio if ta > 0 and tb > 0 else None
        out.append({"from": a["nodes"], "to": b["nodes"], "slopes": slopes})
    return out


def render(result: dict) -> str:
    rows, exps = result["rows"], result["exponents"]
    head = ["stage", *[f"{r['nodes']:,} nodes (s)" for r in rows]]
    head += [f"exponent {round(e['from'] / 1000)}k->{round(e['to'] / 1000)}k" for e in exps]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in (*STAGES, "total"):
        cells = [k]
        cells += [f"{(r['total_s'] if k == 'total' else r['times_s'][k]):.2f}" for r in rows]
        cells += ["-" if e["slopes"][k] is None else f"{e['slopes'][k]:.2f}" for e in exps]
        lines.append("| " + " | ".join(cells) + " |")
    facts = ["| size | " + " | ".join(f"{r['nodes']:,}" for r in rows) + " |"]
    facts.append("|" + "---|" * (len(rows) + 1))
    for key, label in (
        ("candidates", "candidates"),
        ("chosen", "planned"),
        ("lowered", "lowered"),
        ("fused_nodes", "fused model nodes"),
        ("cpu_s", "CPU time, import to export (s; total above is wall)"),
        ("peak_rss_mib", "peak memory (MiB, ru_maxrss)"),
        ("load_average_1min", "machine load average at the end (1 min)"),
        ("build_s", "graph build (s, not a stage)"),
    ):
        vals = [f"{r[key]:.1f}" if isinstance(r[key], float) else f"{r[key]:,}" for r in rows]
        facts.append(f"| {label} | " + " | ".join(vals) + " |")
    return "\n".join(
        [
            "# Whole-pipeline scale benchmark",
            "",
            f"`{result['command']}` on {result['machine']}, Python {result['python']}, "
            f"{result['cpus']} CPUs (shared), fastest of {result['repeat']} run(s) per stage. "
            "Pipeline: import, `fuse_model` for the onnxruntime target with every built-in rule "
            "and safe mode off (its stages as timed by the pipeline), export with `save_onnx`; "
            "the fused model passes `onnx.checker` (full) and the IR verifier. Graphs: "
            "`testing.scale_graphs.hybrid_stack` (CNN and transformer blocks, static shapes). "
            "Exponent: log-log slope of the stage's time between two sizes (1.0 = linear).",
            "",
            *lines,
            "",
            *facts,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,30000,100000")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--hardware", default="ascend910b")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:  # the child: one size, JSON on the last line of stdout
        print(json.dumps(measure(args.one, args.hardware)))
        return 0
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        runs = [_child(n, args.hardware) for _ in range(max(1, args.repeat))]
        best = dict(runs[0])
        best["times_s"] = {k: min(r["times_s"][k] for r in runs) for k in STAGES}
        best["total_s"] = sum(best["times_s"].values())
        best["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
        best["cpu_s"] = min(r["cpu_s"] for r in runs)
        best["runs_total_s"] = [r["total_s"] for r in runs]
        rows.append(best)
        print(f"{best['nodes']:>7} nodes: {best['total_s']:.1f} s", file=sys.stderr)
    result = {
        "benchmark": "scale",
        "command": "benchmarks/scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "hardware": args.hardware,
        "rows": rows,
        "exponents": exponents(rows),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    text = render(result)
    OUT_MD.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
