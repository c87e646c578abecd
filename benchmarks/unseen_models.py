"""The fuse pipeline with its defaults on architectures no issue names, from both exporters.

Run: ``.venv/bin/python benchmarks/unseen_models.py [--models qwen2,vit]`` (about 1 minute;
writes ``benchmarks/results/unseen_models.json`` and prints a table).

For each small random-weight model of :mod:`graph_autofusion.testing.small_hf` and each
exporter: export, then ``GraphAutoFusion(path, preset="all", sample_inputs=feeds).fuse()``
with its defaults (the calibrated ``host`` profile, safe mode with its speed check), save, and
compare the fused file with the original export and with PyTorch in onnxruntime (CPU, default
graph optimizations). Recorded: node counts, fused operators, rollbacks with their reasons,
shape-plumbing folds, the largest output difference to each, and the number of candidates and
planned fusions an analysis on the ``ascend910b`` profile finds. The tests
(``tests/test_unseen_architectures.py``) assert correctness on the fixed ``x86_avx2`` profile
without the speed check; this script shows what a user gets by default, where the speed check
on this shared machine may roll a fusion back as ``slower``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from graph_autofusion import GraphAutoFusion
from graph_autofusion.testing import ort_outputs
from graph_autofusion.testing.small_hf import SMALL_HF, KnownExportFailure, export_small_hf

OUT = Path(__file__).parent / "results" / "unseen_models.json"
EXPORTERS = ("dynamo", "torchscript")


def run_one(name: str, exporter: str, workdir: Path) -> dict:
    path = workdir / f"{name}-{exporter}.onnx"
    row: dict = {"model": name, "exporter": exporter}
    t0 = time.perf_counter()
    try:
        feeds, expected = export_small_hf(name, exporter, str(path))
    except KnownExportFailure as e:
        row.update(status="export-failed (torch)", error=str(e)[:300])
        return row
    t1 = time.perf_counter()
    gaf = GraphAutoFusion(str(path), preset="all", sample_inputs=feeds)
    fused = gaf.fuse()
    result = gaf.result
    fused_path = workdir / f"{name}-{exporter}-fused.onnx"
    gaf.save(fused_path)
    t2 = time.perf_counter()
    before = ort_outputs(path, feeds)
    after = ort_outputs(fused_path, feeds)
    diff = max(float(np.max(np.abs(after[k] - before[k]))) for k in before)
    diff_torch = float(np.max(np.abs(after["out"] - expected)))
    analysis = GraphAutoFusion(
        str(path), preset="all", hardware="ascend910b", sample_inputs=feeds
    ).analyze()
    folding = result.shape_folding
    row.update(
        status="ok",
        nodes=[len(result.original.graph.nodes), len(fused.graph.nodes)],
        fused_ops=result.fused_op_counts(),
        rolled_back=[
            {"rule": r.rule, "code": r.code, "message": r.message} for r in result.rolled_back
        ],
        folded_reshapes=len(getattr(folding, "folded", None) or []) if folding else 0,
        notes=list(result.notes),
        max_abs_vs_export=diff,
        max_abs_vs_torch=diff_torch,
        ascend910b_candidates=len(analysis.candidates),
        ascend910b_planned=len(analysis.chosen),
        export_s=round(t1 - t0, 2),
        fuse_s=round(t2 - t1, 2),
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SMALL_HF))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="unseen-") as tmp:
        for name in args.models.split(","):
            for exporter in args.exporters.split(","):
                row = run_one(name, exporter, Path(tmp))
                rows.append(row)
                print(json.dumps(row)[:300], flush=True)
    elapsed = time.perf_counter() - start
    ok = [r for r in rows if r["status"] == "ok"]
    result = {
        "benchmark": "unseen_models",
        "command": "python benchmarks/unseen_models.py " + " ".join(argv or sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"platform": platform.platform()},
        "settings": "preset all, defaults: host profile, safe mode with its speed check",
        "summary": {
            "exports": len(rows),
            "fused_and_verified": len(ok),
            "export_failed_torch": len(rows) - len(ok),
            "max_abs_vs_export": max((r["max_abs_vs_export"] for r in ok), default=None),
            "rollbacks_by_code": _count(c["code"] for r in ok for c in r["rolled_back"]),
            "seconds": round(elapsed, 1),
        },
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(
        f"{'model':16s} {'exporter':11s} {'nodes':>11s} {'fused':>5s} {'rolled back':>24s} "
        f"{'max abs':>9s} {'910b plan':>9s}"
    )
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['model']:16s} {r['exporter']:11s} {r['status']}")
            continue
        rb = ", ".join(f"{c['rule']}:{c['code']}" for c in r["rolled_back"]) or "-"
        print(
            f"{r['model']:16s} {r['exporter']:11s} {r['nodes'][0]:5d}->{r['nodes'][1]:<5d} "
            f"{sum(r['fused_ops'].values()):5d} {rb[:24]:>24s} {r['max_abs_vs_export']:9.1e} "
            f"{r['ascend910b_planned']:4d}/{r['ascend910b_candidates']:<4d}"
        )
    print(
        f"{len(ok)}/{len(rows)} exports fused and verified ({len(rows) - len(ok)} the torch "
        f"exporter could not produce); {elapsed:.0f} s; wrote {out}"
    )
    return 0


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


if __name__ == "__main__":
    raise SystemExit(main())
