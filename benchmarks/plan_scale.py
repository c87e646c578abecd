"""Analysis and planning benchmark (F10/F14) on 10,000- and 100,000-node graphs.

Run: ``.venv/bin/python benchmarks/plan_scale.py [--sizes 10000,100000] [--hardware ascend910b]``
(writes ``benchmarks/results/plan_scale.json`` and prints a table). The graphs come from
:func:`graph_autofusion.testing.synthetic.synthetic_transformer` (decomposed LayerNorm, MatMul +
bias, erf-GELU, scaled and masked Softmax, residuals). Stages, timed once per size:

* ``bind``: concrete shapes (generated feeds, one execution of the graph);
* ``candidates``: every ``all``-preset rule's kept matches plus automatic clusters;
* ``cost``: :func:`~graph_autofusion.cost.model.fusion_cost` of every candidate;

then ``plan`` and ``report`` once per strategy (``greedy``, ``dp``, ``evolutionary``,
``auto``) on the same costed candidates, recording the chosen count and the total estimated
saving. The evolutionary search gets its default work budget (``EVOLUTION_WORK`` candidate decodes per
conflict component, never seconds). A size is skipped when the previous one's total time, scaled linearly,
would exceed ``MAX_TOTAL_S``; run it alone (``--sizes 100000``): rows of sizes not measured in a
run are kept from the existing results file.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.planner.analysis import (
    bind_model,
    build_report,
    cost_candidates,
    find_candidates,
)
from graph_autofusion.planner.plan import EVOLUTION_WORK, plan
from graph_autofusion.testing.synthetic import synthetic_transformer

OUT = Path(__file__).parent / "results" / "plan_scale.json"
STRATEGIES = ("greedy", "dp", "evolutionary", "auto")
MAX_TOTAL_S = 180.0


def measure(num_nodes: int, hardware: str) -> list[dict]:
    profile = load_profile(hardware)
    model = synthetic_transformer(num_nodes)
    graph = model.graph
    t = time.perf_counter()
    binding = bind_model(model)
    bind_s = time.perf_counter() - t
    t = time.perf_counter()
    found = find_candidates(graph, builtin_rules())
    cand_s = time.perf_counter() - t
    t = time.perf_counter()
    pcs = cost_candidates(found, profile, binding)
    cost_s = time.perf_counter() - t
    rows = []
    for strategy in STRATEGIES:
        t = time.perf_counter()
        result = plan(pcs, strategy)
        plan_s = time.perf_counter() - t
        t = time.perf_counter()
        report = build_report(
            model, profile, binding, pcs, result, strategy=strategy, benefit_threshold=0.2
        )
        report_s = time.perf_counter() - t
        rows.append(
            {
                "nodes": len(graph),
                "hardware": profile.name,
                "strategy": strategy,
                "strategy_used": result.strategy,
                "binding": binding.method,
                "candidates": len(pcs),
                "legal": sum(1 for c in pcs if c.legal),
                "chosen": len(result.chosen),
                "saving_us": result.total_saving_s * 1e6,
                "time_before_us": report.time_before_s * 1e6,
                "time_after_us": report.time_after_s * 1e6,
                "performance_improvement": report.performance_improvement,
                "hbm_access_reduction": report.hbm_access_reduction,
                "bind_s": bind_s,
                "candidates_s": cand_s,
                "cost_s": cost_s,
                "plan_s": plan_s,
                "report_s": report_s,
                "notes": list(result.notes),
            }
        )
    greedy = rows[0]["saving_us"]
    for r in rows:
        r["vs_greedy"] = r["saving_us"] / greedy if greedy else 1.0
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--hardware", default="ascend910b")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict] = []
    skipped: list[int] = []
    start = time.perf_counter()
    last: tuple[int, float] | None = None
    for n in sizes:
        if last is not None and last[1] * n / last[0] + (time.perf_counter() - start) > MAX_TOTAL_S:
            skipped.append(n)
            continue
        t = time.perf_counter()
        rows.extend(measure(n, args.hardware))
        last = (n, time.perf_counter() - t)
    measured = {r["nodes"] // 1000 for r in rows}
    if OUT.is_file():  # keep the rows of sizes not measured in this run
        old = json.loads(OUT.read_text(encoding="utf-8")).get("rows", [])
        rows = [r for r in old if r["nodes"] // 1000 not in measured] + rows
        rows.sort(key=lambda r: (r["nodes"], STRATEGIES.index(r["strategy"])))
    result = {
        "benchmark": "plan_scale",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "evolution_work": EVOLUTION_WORK,
        "skipped_sizes": skipped,
        "total_s": time.perf_counter() - start,
        "rows": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    head = (
        f"{'nodes':>7} {'strategy':<13} {'used':<13} {'cands':>6} {'legal':>6} {'chosen':>6} "
        f"{'saving us':>11} {'vs greedy':>9} {'perf +':>7} {'bind s':>7} {'cand s':>7} "
        f"{'cost s':>7} {'plan s':>7}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['nodes']:>7} {r['strategy']:<13} {r['strategy_used']:<13} {r['candidates']:>6} "
            f"{r['legal']:>6} {r['chosen']:>6} {r['saving_us']:>11.1f} {r['vs_greedy']:>9.4f} "
            f"{r['performance_improvement']:>7.1%} {r['bind_s']:>7.2f} {r['candidates_s']:>7.2f} "
            f"{r['cost_s']:>7.2f} {r['plan_s']:>7.2f}"
        )
    if skipped:
        print(f"skipped sizes (over the {MAX_TOTAL_S:.0f} s budget): {skipped}")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
