"""Where a ``torch.compile(model, backend="autofusion")`` call spends its time besides our graph.

Run: ``.venv/bin/python benchmarks/dynamo_call_overhead.py [--rounds 30] [--seq 16] [--out DIR]
[models...]`` (about 2 minutes a model; writes ``dynamo_call_overhead.{json,md}`` under
``benchmarks/results/`` or ``DIR`` and prints the table).

At short sequences the compiled module is slower than our ONNX route on the export by more
than the graph's own time explains (issue 21's s16 rows). Each call of the compiled module is
split, by timestamps taken where our backend's graph object is entered and left, into

* *before the graph*: Dynamo's work before it hands the arguments over (evaluating the
  frame's guards, gathering the parameters, the Python of the model outside the graph);
* *graph*: our compiled graph (the onnxruntime session and our wrapper around it);
* *after the graph*: the model's Python after it (building the output object).

Two configurations of each zoo model, in one process, each its own ``torch.compile(...,
isolate_recompiles=True)`` so that neither reuses the other's compiled entries, timed in
rounds of a rotating order (one call per configuration per round, medians reported):

* ``default guards``: as a user compiles it;
* ``no nn.Module guards``: ``options={"guard_filter_fn":
  torch.compiler.skip_guard_on_all_nn_modules_unsafe}``, torch's own filter that drops the
  guards on modules' attributes (unsafe in torch's words: a module attribute changed after the
  compile is not noticed). Our backend takes the same ``options`` dict.

Both configurations' outputs are compared with eager's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from peers import SPIN_SETTLE_S, cosine, first_output, run_facts, write_results

from graph_autofusion import torch_compile
from graph_autofusion.runtime.timing import round_robin
from graph_autofusion.testing.builders import build_model

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("minilm", "llama", "bert", "gpt2")
CONFIGS = ("default guards", "no nn.Module guards")


def bench(name: str, seq: int, rounds: int) -> dict[str, Any]:
    torch._dynamo.reset()
    module, inputs = build_model(name, seq_len=seq)
    with torch.no_grad():
        want = first_output(module(**inputs)).detach().clone()
    marks: list[tuple[float, float]] = []
    original = torch_compile.CompiledGraph._call

    def timed(self: Any, args: tuple) -> Any:
        t0 = time.perf_counter()
        out = original(self, args)
        marks.append((t0, time.perf_counter()))
        return out

    torch_compile.CompiledGraph._call = timed  # type: ignore[method-assign]
    try:
        fns = {}
        for cfg in CONFIGS:
            opts: dict[str, Any] = {}
            if cfg == "no nn.Module guards":
                opts["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
            fns[cfg] = torch.compile(
                module, backend="autofusion", options=opts, isolate_recompiles=True
            )
        row: dict[str, Any] = {"model": name, "shape": f"s{seq}", "configs": {}}
        parts: dict[str, dict[str, list[float]]] = {
            c: {"call": [], "before": [], "graph": [], "after": []} for c in CONFIGS
        }

        def split(cfg: str) -> None:
            """One call of ``cfg``, its parts recorded (a call with a graph break is not)."""
            marks.clear()
            t = time.perf_counter()
            fns[cfg](**inputs)
            e = time.perf_counter()
            if len(marks) == 1:
                a, b = marks[0]
                p = parts[cfg]
                p["call"].append(e - t)
                p["before"].append(a - t)
                p["graph"].append(b - a)
                p["after"].append(e - b)

        with torch.no_grad():
            for cfg, f in fns.items():
                for _ in range(3):  # compile, then the first calls (packing, spinning)
                    out = first_output(f(**inputs))
                row["configs"][cfg] = {"cosine": round(cosine(out, want), 6)}
            # the project's rounds: a shuffled order each, a pause before each call in which
            # the other session's spinning tail ends (its own times are not used: split's are)
            round_robin(
                {cfg: (lambda cfg=cfg: split(cfg)) for cfg in CONFIGS},
                rounds,
                warmup=0,
                rotate=True,
                settle_s=SPIN_SETTLE_S,
            )
    finally:
        torch_compile.CompiledGraph._call = original  # type: ignore[method-assign]
    for cfg in CONFIGS:
        p = parts[cfg]
        row["configs"][cfg].update(
            {k: round(statistics.median(v) * 1e3, 3) if v else None for k, v in p.items()},
            timed_calls=len(p["call"]),
        )
    return row


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        '# torch.compile(backend="autofusion"): a call\'s time outside our graph',
        "",
        f"Generated by `benchmarks/dynamo_call_overhead.py` on {data['date']} at "
        f"{data['commit']}. CPU: {m.get('cpu', '?')} (ISA {', '.join(m.get('isa', []))}), "
        f"2 threads; torch {torch.__version__}. {data['rounds']} rounds, the two "
        "configurations in a shuffled order each; median ms of a call and of its parts: before our "
        "graph is entered (Dynamo's guards and arguments, the model's Python before the graph), "
        "the graph, after it. `no nn.Module guards`: torch's "
        "`skip_guard_on_all_nn_modules_unsafe` as the `guard_filter_fn` option.",
        "",
        "| model | shape | configuration | call | before the graph | graph | after | cosine vs eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        for cfg, c in row["configs"].items():
            lines.append(
                f"| {row['model']} | {row['shape']} | {cfg} | {c['call']} | {c['before']} | "
                f"{c['graph']} | {c['after']} | {c['cosine']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("models", nargs="*", default=list(MODELS))
    a = ap.parse_args()
    torch.set_num_threads(2)
    rows = [bench(name, a.seq, a.rounds) for name in a.models]
    data = {**run_facts(), "rounds": a.rounds, "rows": rows}
    print(write_results(a.out / "dynamo_call_overhead", data, markdown))


if __name__ == "__main__":
    main()
