"""GELU operators side by side: onnxruntime's ``BiasGelu`` / ``Gelu`` / ``FastGelu`` against our
one-pass ``GeluErf`` / ``GeluTanh`` (:mod:`graph_autofusion.codegen.ort_gelu`), each a one-node
onnxruntime session (ALL, 1 and 2 intra-op threads), on the activation shapes the GELU sees
after the 4x-wide linear layer of the zoo's and a few other models.

    .venv/bin/python benchmarks/gelu_kernels.py [--rounds 7] [--out benchmarks/results/epyc]

Each round times every variant (median of 30 runs, the input reused: warm in cache, as after
the GEMM that writes it), variants in rotating order; a variant's time is the median over
rounds. Writes ``gelu_kernels.json`` / ``.md`` with the CPU model and ISA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (label, rows, width): activation [rows, width] after the wide linear layer
SHAPES = (
    ("BERT-base / GPT-2 s128", 128, 3072),
    ("MiniLM s128", 128, 1536),
    ("ViT-B/16 (197 tokens)", 197, 3072),
    ("ConvNeXt-T stage 1 (56x56)", 3136, 384),
    ("BERT-base s16", 16, 3072),
    ("decode step", 1, 3072),
)
#: (variant, operator, domain, bias)
VARIANTS = (
    ("onnxruntime BiasGelu", "BiasGelu", "com.microsoft", True),
    ("ours GeluErf + bias", "GeluErf", "ai.graph_autofusion", True),
    ("onnxruntime FastGelu", "FastGelu", "com.microsoft", True),
    ("ours GeluTanh + bias", "GeluTanh", "ai.graph_autofusion", True),
    ("onnxruntime Gelu", "Gelu", "com.microsoft", False),
    ("ours GeluErf", "GeluErf", "ai.graph_autofusion", False),
)
#: ours -> the onnxruntime operator it replaces
PAIRS = {
    "ours GeluErf + bias": "onnxruntime BiasGelu",
    "ours GeluTanh + bias": "onnxruntime FastGelu",
    "ours GeluErf": "onnxruntime Gelu",
}


def _median_us(sess, feeds: dict, runs: int = 30) -> float:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def main(argv: list[str] | None = None) -> int:
    from torch_e2e_engines import machine

    from graph_autofusion.testing.gelu_models import gelu_session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for label, m, n in SHAPES:
        x = (2 * rng.standard_normal((m, n))).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        for threads in (1, 2):
            sessions = {
                v: gelu_session(op, dom, (m, n), bias if b else None, threads)
                for v, op, dom, b in VARIANTS
            }
            outs = {v: s.run(None, {"x": x})[0] for v, s in sessions.items()}
            times: dict[str, list[float]] = {v: [] for v in sessions}
            names = list(sessions)
            for r in range(args.rounds):
                for v in names[r % len(names) :] + names[: r % len(names)]:
                    sessions[v].run(None, {"x": x})
                    times[v].append(_median_us(sessions[v], {"x": x}))
            med = {v: float(np.median(t)) for v, t in times.items()}
            for ours, theirs in PAIRS.items():
                rows.append(
                    {
                        "shape": label, "rows": m, "width": n, "threads": threads,
                        "ours": ours, "theirs": theirs,
                        "ours_us": round(med[ours], 1), "theirs_us": round(med[theirs], 1),
                        "ratio": round(med[ours] / med[theirs], 3),
                        "ours_gelem_s": round(m * n / med[ours] / 1e3, 2),
                        "theirs_gelem_s": round(m * n / med[theirs] / 1e3, 2),
                        "max_abs_diff": float(np.abs(outs[ours] - outs[theirs]).max()),
                    }
                )  # fmt: skip
            print(
                f"{label} threads {threads}: "
                + ", ".join(f"{v} {t:.1f} us" for v, t in med.items())
            )
    data = {"machine": machine(), "rounds": args.rounds, "rows": rows}
    mc = data["machine"]
    lines = [
        "# GELU: onnxruntime's operators against our one-pass ones",
        "",
        f"{mc['cpu']} ({', '.join(mc['isa'])}); onnxruntime {mc['onnxruntime']}; "
        f"{mc['date']}, commit {mc['commit']}{' (dirty)' if mc['dirty'] else ''}; load "
        f"{mc['load']}. `benchmarks/gelu_kernels.py`: one-node sessions (ALL), the input warm, "
        f"median of 30 runs per round, {args.rounds} rounds in rotating order, median over "
        "rounds. `ours / theirs` below 1: ours faster.",
        "",
        "| activation | rows x width | threads | ours | onnxruntime | ours us | onnxruntime us "
        "| ours / theirs | ours G elem/s | theirs G elem/s | max abs diff |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['rows']} x {r['width']} | {r['threads']} | {r['ours']} | "
            f"{r['theirs']} | {r['ours_us']} | {r['theirs_us']} | {r['ratio']:.3f} | "
            f"{r['ours_gelem_s']} | {r['theirs_gelem_s']} | {r['max_abs_diff']:.1e} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gelu_kernels.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "gelu_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
