"""The fuse pipeline with its defaults on architectures no issue names, from both exporters.

Run: ``.venv/bin/python benchmarks/unseen_models.py [--models qwen2,vit]`` (35-60 s;
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

A row is ``ok`` when the saved file's outputs match the export's and PyTorch's within
``rtol=1e-4, atol=1e-5`` (PyTorch: 1e-3, 1e-4), else ``mismatch``; ``fused_any`` says whether
anything was fused at all (on the calibrated host, the cost model may plan nothing for a small
model). Without a cached host profile, the first fuse calibrates this machine quickly and
caches it (``~/.cache/graph-autofusion/hardware/host.yaml``), as it would for a user; the JSON
records the host profile used.
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
    same = set(after) == set(before) and all(
        after[k].shape == before[k].shape and np.allclose(after[k], before[k], rtol=1e-4, atol=1e-5)
        for k in before
    )
    diff = max(
        (float(np.max(np.abs(after[k] - before[k]))) for k in before if k in after), default=0.0
    )
    diff_torch = float(np.max(np.abs(after["out"] - expected)))
    same_torch = np.allclose(after["out"], expected, rtol=1e-3, atol=1e-4)
    analysis = GraphAutoFusion(
        str(path), preset="all", hardware="ascend910b", sample_inputs=feeds
    ).analyze()
    folding = result.shape_folding
    row.update(
        status="ok" if same and same_torch else "mismatch",
        nodes=[len(result.original.graph.nodes), len(fused.graph.nodes)],
        fused_any=bool(result.lowered),
        fused_ops=result.fused_op_counts(),
        rolled_back=[
            {"rule": r.rule, "code": r.code, "message": r.message} for r in result.rolled_back
        ],
        folded_reshapes=len(getattr(folding, "folded", None) or []) if folding else 0,
        notes=list(result.notes),
        max_abs_vs_export=diff,
        max_abs_vs_torch=diff_torch,
        max_abs_output=float(np.max(np.abs(expected))),
        end_to_end=result.end_to_end,
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
    ran = [r for r in rows if r["status"] in ("ok", "mismatch")]
    from graph_autofusion.cost.hardware import load_profile

    host = load_profile("host")
    result = {
        "benchmark": "unseen_models",
        "command": "python benchmarks/unseen_models.py " + " ".join(argv or sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "platform": platform.platform(),
            "host_profile": {
                "memory_bandwidth_gbs": host.memory_bandwidth_gbs,
                "peak_gflops_f32": host.peak_gflops["f32"],
                "calibration": (host.extra or {}).get("calibration"),
                "calibrated_at": (host.extra or {}).get("calibrated_at"),
            },
        },
        "settings": "preset all, defaults: host profile, safe mode with its speed check",
        "summary": {
            "exports": len(rows),
            "verified": len(ok),
            "mismatch": len(ran) - len(ok),
            "fused_something": sum(r["fused_any"] for r in ran),
            "export_failed_torch": len(rows) - len(ran),
            "max_abs_vs_export": max((r["max_abs_vs_export"] for r in ran), default=None),
            "rollbacks_by_code": _count(
                f"{c['rule']}:{c['code']}" for r in ran for c in r["rolled_back"]
            ),
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
        if r["status"] not in ("ok", "mismatch"):
            print(f"{r['model']:16s} {r['exporter']:11s} {r['status']}")
            continue
        rb = f"{len(r['rolled_back'])} ({r['rolled_back'][0]['rule']})" if r["rolled_back"] else "-"
        print(
            f"{r['model']:16s} {r['exporter']:11s} {r['nodes'][0]:5d}->{r['nodes'][1]:<5d} "
            f"{sum(r['fused_ops'].values()):5d} {rb[:24]:>24s} {r['max_abs_vs_export']:9.1e} "
            f"{r['ascend910b_planned']:4d}/{r['ascend910b_candidates']:<4d} {r['status']}"
        )
    print(
        f"{len(ok)}/{len(ran)} exports verified ({len(ran) - len(ok)} mismatches; "
        f"{sum(r['fused_any'] for r in ran)} with something fused; {len(rows) - len(ran)} the "
        f"torch exporter could not produce); {elapsed:.0f} s; wrote {out}"
    )
    return 0


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


if __name__ == "__main__":
    raise SystemExit(main())
