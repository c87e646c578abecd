"""Matching benchmark: every built-in preset matched over 10,000- and 100,000-node graphs.

Run: ``.venv/bin/python benchmarks/match_scale.py`` (writes ``benchmarks/results/match_scale.json``
and prints a table). The graphs come from :mod:`graph_autofusion.testing.synthetic` (decomposed
LayerNorm, attention with scale and mask, erf-GELU, residuals). For each preset the time covers
``match_rules``: every rule's matches and rejections plus overlap resolution; the last row per
size is automatic clustering (F4c) with its default limits (raw = clusters found). Time per
node should stay about flat from 10k to 100k nodes (scaling exponent near 1.0).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.clustering import cluster
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import PRESETS
from graph_autofusion.testing.synthetic import synthetic_transformer

SIZES = (10_000, 100_000)
OUT = Path(__file__).parent / "results" / "match_scale.json"


def measure(num_nodes: int) -> list[dict]:
    model = synthetic_transformer(num_nodes)
    graph = model.graph
    rows = []
    for preset in (*PRESETS, "all"):
        rules = builtin_rules().preset(preset)
        t = time.perf_counter()
        report = match_rules(graph, rules)
        elapsed = time.perf_counter() - t
        rows.append(
            {
                "preset": preset,
                "nodes": len(graph),
                "rules": len(rules),
                "raw_matches": sum(len(r.matches) for r in report.per_rule.values()),
                "kept": len(report.kept),
                "match_s": elapsed,
                "us_per_node": 1e6 * elapsed / len(graph),
            }
        )
    t = time.perf_counter()
    clusters = cluster(graph)
    elapsed = time.perf_counter() - t
    rows.append(
        {
            "preset": "(clustering)",
            "nodes": len(graph),
            "rules": 0,
            "raw_matches": len(clusters.clusters),
            "kept": len(clusters.clusters),
            "match_s": elapsed,
            "us_per_node": 1e6 * elapsed / len(graph),
        }
    )
    return rows


def main() -> int:
    small, large = (measure(n) for n in SIZES)
    rows = small + large
    for a, b in zip(small, large):
        b["scaling_exponent"] = math.log(b["match_s"] / a["match_s"]) / math.log(
            b["nodes"] / a["nodes"]
        )
    result = {
        "benchmark": "match_scale",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "rows": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'preset':<12} {'nodes':>7} {'rules':>5} {'raw':>6} {'kept':>6} {'match s':>8} "
        f"{'us/node':>8} {'exponent':>8}"
    )
    for r in rows:
        exp = f"{r['scaling_exponent']:.2f}" if "scaling_exponent" in r else ""
        print(
            f"{r['preset']:<12} {r['nodes']:>7} {r['rules']:>5} {r['raw_matches']:>6} "
            f"{r['kept']:>6} {r['match_s']:>8.2f} {r['us_per_node']:>8.1f} {exp:>8}"
        )
    print(f"-> {OUT} (scaling exponent 1.0 = linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
