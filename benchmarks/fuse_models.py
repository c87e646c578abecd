"""Fuse benchmark: every zoo model x both exporters through ``GraphAutoFusion(...).fuse()``.

Run: ``.venv/bin/python benchmarks/fuse_models.py [--speed] [--hardware P] [MODEL ...]``
(writes ``benchmarks/results/fuse_models.json`` when run on every model, and prints a table).

For each model and exporter: the ``all`` preset, safe mode on, the zoo's example inputs, the
``x86_avx2`` hardware profile (as ``tests/test_fuse_models.py``: ``host`` is calibrated per
machine, so the planner's choices would vary; ``--hardware host`` uses it anyway); the speed
check is off unless ``--speed`` (it is slow and noisy on a shared machine; numerics,
fp16 range and Monte-Carlo checks stay on). Recorded: fusions applied and the operators that
run them, rollbacks with their codes, reasons for what stayed unfused, the fused model's
onnx.checker verdict, and its onnxruntime outputs against the original's on the same inputs
(worst cosine, max abs diff), plus the pipeline's own stage timings. For ``minilm`` (real
all-MiniLM-L6-v2 weights) the sentence embeddings (mean pooling, L2 norm) of a few real
sentences are compared too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from graph_autofusion import GraphAutoFusion
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.testing import (
    ALL_NAMES,
    EXPORTERS,
    example_feeds,
    export_onnx,
    minilm_onnx_embeddings,
    ort_outputs,
)
from graph_autofusion.verify.compare import compare_tensors

OUT = Path(__file__).parent / "results" / "fuse_models.json"


def compare_outputs(orig: dict[str, np.ndarray], fused: dict[str, np.ndarray]) -> dict:
    per = {k: compare_tensors(fused[k], v) for k, v in orig.items()}
    return {
        "cosine": min(s["cosine"] for s in per.values()),
        "max_abs": max(s["max_abs"] for s in per.values()),
        "outputs": {k: {"cosine": s["cosine"], "max_abs": s["max_abs"]} for k, s in per.items()},
    }


def embedding_cosines(original: onnx.ModelProto, fused: onnx.ModelProto) -> list[float]:
    a, b = minilm_onnx_embeddings(original), minilm_onnx_embeddings(fused)
    return [float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]


def measure(name: str, exporter: str, *, check_speed: bool, hardware: str) -> dict:
    path = export_onnx(name, exporter)
    feeds = example_feeds(name)
    t = time.perf_counter()
    gaf = GraphAutoFusion(path, preset="all", hardware=hardware, sample_inputs=feeds)
    gaf.fuse(check_speed=check_speed)
    seconds = time.perf_counter() - t
    res = gaf.result
    original = onnx.load(str(path))
    fused = to_onnx(res.model)
    onnx.checker.check_model(fused)
    cmp = compare_outputs(
        ort_outputs(original, feeds, threads=2), ort_outputs(fused, feeds, threads=2)
    )
    row = {
        "model": name,
        "exporter": exporter,
        "nodes_before": len(original.graph.node),
        "nodes_after": len(fused.graph.node),
        "fused": len(res.lowered),
        "fused_ops": res.fused_op_counts(),
        "rolled_back": len(res.rolled_back),
        "rolled_back_codes": sorted({b.code for b in res.rolled_back}),
        "skipped": res.skipped_by_reason(),
        "checker": "pass",
        "cosine": cmp["cosine"],
        "max_abs": cmp["max_abs"],
        "outputs": cmp["outputs"],
        "seconds": round(seconds, 2),
        "timings_s": {k: round(v, 2) for k, v in res.timings.items()},
    }
    if name == "minilm":
        row["sentence_cosines"] = embedding_cosines(original, fused)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(ALL_NAMES))
    ap.add_argument("--speed", action="store_true", help="keep safe mode's speed check on")
    ap.add_argument("--hardware", default="x86_avx2", help="hardware profile for the planner")
    args = ap.parse_args(argv)
    ort.set_default_logger_severity(3)  # no warnings about unused initializers
    rows = []
    header = (
        f"{'model':<12} {'exporter':<12} {'fused':>5} {'rb':>3} {'cosine':>12} {'max abs':>9} "
        f"{'s':>6}  fused operators"
    )
    print(header)
    for name in args.models:
        for exporter in EXPORTERS:
            row = measure(name, exporter, check_speed=args.speed, hardware=args.hardware)
            rows.append(row)
            ops = ", ".join(f"{k.split('::')[-1]} x{v}" for k, v in row["fused_ops"].items())
            extra = ""
            if "sentence_cosines" in row:
                extra = f"  (sentence cosine min {min(row['sentence_cosines']):.9f})"
            print(
                f"{name:<12} {exporter:<12} {row['fused']:>5} {row['rolled_back']:>3} "
                f"{row['cosine']:>12.9f} {row['max_abs']:>9.2e} {row['seconds']:>6.1f}  "
                f"{ops or '-'}{extra}",
                flush=True,
            )
    if sorted(args.models) == sorted(ALL_NAMES):
        data = {
            "python": platform.python_version(),
            "onnxruntime": ort.__version__,
            "machine": platform.machine(),
            "check_speed": args.speed,
            "hardware": args.hardware,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "rows": rows,
        }
        OUT.write_text(json.dumps(data, indent=2, default=float) + "\n")
        print(f"written to {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
