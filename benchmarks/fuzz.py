"""The fuzz corpus (issue 15): the whole pipeline on N generated graphs and its invariants.

Run: ``nice -n 19 .venv/bin/python benchmarks/fuzz.py [--count 10000] [--start-seed 0]
[--jobs 1]`` (writes ``benchmarks/results/fuzz.md`` and ``fuzz.json`` and prints the table).

Each seed's graph (:func:`graph_autofusion.testing.fuzz.random_graph`, 5-40 nodes) goes
through :func:`graph_autofusion.testing.fuzz_check.run_graph`: the original checked and run
in onnxruntime and the reference interpreter; candidates; the plan with every strategy for the
cpu target and with the seed's strategy for onnxruntime (convex, no overlap, acyclic);
lowering for both targets without safe mode with the seed's strategy, then (every
``--safe-every``-th seed) with safe mode; each fused model through the IR verifier,
``onnx.checker``, the interpreter and onnxruntime, and the cpu target's program. To stay cheap
(10,000 graphs in well under an hour on one core) the cpu target compiles its kernels with
gcc on every ``--compile-every``-th seed only (25: about 400 compiles, most of them kernel
cache hits on a second run; those seeds also fuse for onnxruntime with generated custom
operators, one library build each) and runs the NumPy executor of the same kernel IR on the
others. ``--table`` rewrites ``fuzz.md`` from ``fuzz.json``.
It is not a timing benchmark: it may run on a loaded machine. The results file is rewritten
every ``--checkpoint`` graphs, so a run stopped early leaves the count it reached.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from graph_autofusion.testing.fuzz_check import INVARIANTS, run_graph

OUT = Path(__file__).parent / "results" / "fuzz"
FAILURES_KEPT = 50


def one(seed: int, compile_every: int, safe_every: int) -> dict[str, Any]:
    t = time.perf_counter()
    r = run_graph(seed, compile_every=compile_every, safe_every=safe_every)
    g = r.graph
    return {
        "seed": seed,
        "seconds": time.perf_counter() - t,
        "nodes": len(g.model.graph.node),
        "dtype": g.dtype,
        "symbolic": g.symbolic,
        "ops": g.ops,
        "patterns": g.patterns,
        "failures": [[f.invariant, f.stage, f.message] for f in r.failures],
        "refused": [x.split(":", 1)[0] + ": " + x.split(": ", 2)[1] for x in r.refused],
        "fused": r.fused,
        "compiled": r.compiled,
    }


class Tally:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.n = 0
        self.nodes = 0
        self.failures = collections.Counter({k: 0 for k in INVARIANTS})
        self.failing_seeds: dict[str, list[int]] = collections.defaultdict(list)
        self.examples: list[dict[str, Any]] = []
        self.ops: collections.Counter = collections.Counter()
        self.dtypes: collections.Counter = collections.Counter()
        self.patterns: collections.Counter = collections.Counter()
        self.refused: collections.Counter = collections.Counter()
        self.fused: collections.Counter = collections.Counter()
        self.graphs_fused: collections.Counter = collections.Counter()
        self.symbolic = 0
        self.compiled = 0
        self.cpu_seconds = 0.0
        self.start = time.perf_counter()

    def add(self, row: dict[str, Any]) -> None:
        self.n += 1
        self.nodes += row["nodes"]
        self.cpu_seconds += row["seconds"]
        self.symbolic += row["symbolic"]
        self.compiled += row["compiled"]
        self.dtypes[row["dtype"]] += 1
        self.ops.update(row["ops"])
        self.patterns.update(row["patterns"])
        self.refused.update(row["refused"])
        for stage, k in row["fused"].items():
            self.fused[stage] += k
            self.graphs_fused[stage] += k > 0
        for inv in sorted({f[0] for f in row["failures"]}):
            self.failures[inv] += 1
            self.failing_seeds[inv].append(row["seed"])
        for f in row["failures"]:
            if len(self.examples) < FAILURES_KEPT:
                self.examples.append(
                    {"seed": row["seed"], "invariant": f[0], "stage": f[1], "message": f[2]}
                )

    def summary(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.start
        return {
            "graphs": self.n,
            "start_seed": self.args.start_seed,
            "requested": self.args.count,
            "jobs": self.args.jobs,
            "compile_every": self.args.compile_every,
            "safe_every": self.args.safe_every,
            "wall_s": round(wall, 1),
            "graph_cpu_s": round(self.cpu_seconds, 1),
            "graphs_per_s": round(self.n / wall, 2) if wall else None,
            "mean_nodes": round(self.nodes / self.n, 1) if self.n else 0,
            "symbolic_graphs": self.symbolic,
            "compiled_graphs": self.compiled,
            "failures": dict(self.failures),
            "failing_seeds": {k: v[:200] for k, v in self.failing_seeds.items()},
            "failure_examples": self.examples,
            "dtypes": dict(self.dtypes.most_common()),
            "ops": dict(self.ops.most_common()),
            "patterns": dict(self.patterns.most_common()),
            "fused_groups": dict(self.fused),
            "graphs_with_fusions": dict(self.graphs_fused),
            "refused": dict(self.refused.most_common(20)),
            "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        }


def table(s: dict[str, Any]) -> str:
    lines = [
        "# Fuzz corpus (issue 15)",
        "",
        "`nice -n 19 .venv/bin/python benchmarks/fuzz.py "
        f"--count {s['requested']} --start-seed {s['start_seed']} --jobs {s['jobs']}` "
        f"(kernels compiled with gcc, and onnxruntime with generated custom operators, on 1 "
        f"seed in {s['compile_every']}; safe mode on 1 in {s['safe_every']}; not a timing "
        "benchmark: the machine was shared).",
        "",
        *(
            [
                f"**Stopped at {s['graphs']} of {s['requested']} graphs** (the results file is "
                "rewritten every 250 graphs; the run was ended there).",
                "",
            ]
            if s["graphs"] < s["requested"]
            else []
        ),
        "| graphs | mean nodes | symbolic | compiled | wall s | graphs/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {s['graphs']} | {s['mean_nodes']} | {s['symbolic_graphs']} | "
        f"{s['compiled_graphs']} | {s['wall_s']} | {s['graphs_per_s']} |",
        "",
        "| invariant | graphs failing |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in s["failures"].items()),
        "",
        "Element types: " + ", ".join(f"{k} {v}" for k, v in s["dtypes"].items()),
        "",
        "Fused groups (graphs with any): "
        + ", ".join(
            f"{k} {v} ({s['graphs_with_fusions'].get(k, 0)})" for k, v in s["fused_groups"].items()
        ),
        "",
        "Operators (graphs containing each): " + ", ".join(f"{k} {v}" for k, v in s["ops"].items()),
        "",
        "Rule patterns spelled out (graphs): "
        + ", ".join(f"{k} {v}" for k, v in s["patterns"].items()),
        "",
        "Clear refusals (GraphAutoFusionError, not failures): "
        + ("; ".join(f"{k} x{v}" for k, v in s["refused"].items()) or "none"),
    ]
    if s["failure_examples"]:
        lines += ["", "## Failures", ""]
        lines += [
            f"- seed {e['seed']} [{e['invariant']}] {e['stage']}: {e['message']}"
            for e in s["failure_examples"]
        ]
    return "\n".join(lines) + "\n"


def write(s: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in (
        (out.with_suffix(".json"), json.dumps(s, indent=1)),
        (out.with_suffix(".md"), table(s)),
    ):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", action="store_true", help="rewrite fuzz.md from fuzz.json")
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--start-seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--compile-every", type=int, default=25)
    p.add_argument("--safe-every", type=int, default=2)
    p.add_argument("--checkpoint", type=int, default=250)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.table:
        s = json.loads(args.out.with_suffix(".json").read_text())
        write(s, args.out)
        print(table(s))
        return 0
    tally = Tally(args)
    seeds = range(args.start_seed, args.start_seed + args.count)
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = pool.map(
                one,
                seeds,
                [args.compile_every] * len(seeds),
                [args.safe_every] * len(seeds),
                chunksize=8,
            )
            for row in rows:
                _take(tally, row, args)
    else:
        for seed in seeds:
            _take(tally, one(seed, args.compile_every, args.safe_every), args)
    s = tally.summary()
    write(s, args.out)
    print(table(s))
    return 0 if not any(s["failures"].values()) else 1


def _take(tally: Tally, row: dict[str, Any], args: argparse.Namespace) -> None:
    tally.add(row)
    for f in row["failures"]:
        print(f"seed {row['seed']}: [{f[0]}] {f[1]}: {f[2]}", flush=True)
    if tally.n % args.checkpoint == 0:
        write(tally.summary(), args.out)
        print(f"{tally.n} graphs, {sum(tally.failures.values())} failing", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
