"""Whole zoo models on the cpu target, side by side with the peers in one process.

Run: ``.venv/bin/python benchmarks/cpu_target.py [--runs N] [--seq-len L] [MODEL ...]``
(writes ``benchmarks/results/cpu_target.json`` and ``cpu_target.md`` when run on every model,
and prints the table).

Per zoo model (the TorchScript export, batch 1, sequence ``--seq-len``), 2 threads, median of
``--runs`` round-robin runs after warm-up:

* ``eager``: the PyTorch module itself;
* ``ort_all``: the export in onnxruntime at ORT_ENABLE_ALL (onnxruntime's own fusions);
* ``ir_unfused``: the export run by the project's torch runner (every node a torch call),
  the base the cpu target fuses on;
* ``cpu_fused``: ``GraphAutoFusion(..., target="cpu").fuse()`` (safe mode, speed check on),
  run through ``result.program``.

Also recorded: kernels fused and distinct, rollbacks, the fused outputs' worst cosine against
onnxruntime's, and where the fused program's time goes (kernel steps vs other nodes, from one
profiled run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from graph_autofusion import GraphAutoFusion
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import round_robin, summarize
from graph_autofusion.runtime.torch_runtime import TorchRunner
from graph_autofusion.testing.models import MODEL_NAMES, build_model, example_feeds, export_onnx
from graph_autofusion.verify.compare import compare_tensors

OUT = Path(__file__).parent / "results"
THREADS = 2


def _median_round_robin(fns: dict, runs: int) -> dict[str, dict[str, float]]:
    return summarize(round_robin(fns, runs, warmup=3))


def _time_split(program, feeds) -> dict[str, float]:
    """One run of the fused program with every step timed: kernel steps vs other nodes."""
    steps = set(program.steps)
    kernel_s = other_s = 0.0
    env = dict(program.constants)
    env.update({k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()})
    with torch.no_grad():
        for node, impl, call in program._plan:
            args = [env[v.name] if v is not None else None for v in node.inputs]
            t = time.perf_counter()
            out = impl(call, *args)
            dt = time.perf_counter() - t
            if node.name in steps:
                kernel_s += dt
            else:
                other_s += dt
            outs = out if isinstance(out, tuple | list) else (out,)
            for v, o in zip(node.outputs, outs):
                env[v.name] = o
    return {"kernel_steps_ms": kernel_s * 1e3, "other_nodes_ms": other_s * 1e3}


def measure(name: str, runs: int, seq_len: int) -> dict:
    path = export_onnx(name, "torchscript", seq_len=seq_len)
    feeds = example_feeds(name, seq_len=seq_len)
    module, inputs = build_model(name, seq_len=seq_len)
    gaf = GraphAutoFusion(str(path), sample_inputs=feeds, target="cpu")
    t = time.perf_counter()
    gaf.fuse()
    fuse_s = time.perf_counter() - t
    r = gaf.result
    base = TorchRunner(r.original)
    sess = ort_session(str(path), "all", THREADS)
    names = {i.name for i in sess.get_inputs()}
    ort_feeds = {k: v for k, v in feeds.items() if k in names}
    tfeeds = {k: torch.from_numpy(v) for k, v in feeds.items()}
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, ort_feeds)))
    got = {k: v.float().numpy() for k, v in r.program.run(tfeeds).items()}
    cos = min(compare_tensors(got[k], w)["cosine"] for k, w in want.items())
    with torch.no_grad():
        t = _median_round_robin(
            {
                "eager": lambda: module(**inputs),
                "ort_all": lambda: sess.run(None, ort_feeds),
                "ir_unfused": lambda: base.run(tfeeds),
                "cpu_fused": lambda: r.program.run(tfeeds),
            },
            runs,
        )
    return {
        "model": name,
        "seq_len": seq_len,
        "times": t,
        "fused_vs_eager": t["cpu_fused"]["ms"] / t["eager"]["ms"],
        "fused_vs_ort_all": t["cpu_fused"]["ms"] / t["ort_all"]["ms"],
        "fused_vs_unfused": t["cpu_fused"]["ms"] / t["ir_unfused"]["ms"],
        "kernels": r.kernel_counts(),
        "rolled_back": [[b.key, b.code] for b in r.rolled_back],
        "cosine_vs_ort": cos,
        "fuse_s": fuse_s,
        "split": _time_split(r.program, feeds),
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Zoo models on the cpu target (`benchmarks/cpu_target.py`)",
        "",
        "TorchScript exports, batch 1, 2 threads, median ms of round-robin runs (p10-p90).",
        "",
        "| model | eager | onnxruntime ALL | IR unfused (torch runner) | cpu fused | fused/eager | fused/ort | fused/unfused | kernels (distinct) | rolled back | kernel steps / other nodes ms | cosine vs ort |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["times"]

        def cell(k, t=t):
            return f"{t[k]['ms']:.2f} ({t[k]['p10']:.2f}-{t[k]['p90']:.2f})"

        lines.append(
            f"| {r['model']} | {cell('eager')} | {cell('ort_all')} | {cell('ir_unfused')} | "
            f"{cell('cpu_fused')} | {r['fused_vs_eager']:.2f} | {r['fused_vs_ort_all']:.2f} | "
            f"{r['fused_vs_unfused']:.2f} | {r['kernels']['groups']} ({r['kernels']['functions']}) | "
            f"{len(r['rolled_back'])} | {r['split']['kernel_steps_ms']:.2f} / "
            f"{r['split']['other_nodes_ms']:.2f} | {r['cosine_vs_ort']:.6f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODEL_NAMES))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=16)
    args = ap.parse_args(argv)
    torch.set_num_threads(THREADS)
    rows = []
    for name in args.models:
        row = measure(name, args.runs, args.seq_len)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("model", "fused_vs_eager", "fused_vs_ort_all")}))
    md = markdown(rows)
    print(md)
    if set(args.models) == set(MODEL_NAMES):
        OUT.mkdir(exist_ok=True)
        (OUT / "cpu_target.json").write_text(json.dumps(rows, indent=1) + "\n")
        (OUT / "cpu_target.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
