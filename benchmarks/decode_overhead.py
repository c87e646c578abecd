"""Where the PyTorch route's decode time goes: the onnxruntime session step against the whole
token (issue 21's decode gap).

Run: ``.venv/bin/python benchmarks/decode_overhead.py [--runs 15] [--tokens 32]``

One process, 2 threads, the zoo Llama, greedy, a 16-token prompt:

* ``torch-route session step``: the decode graph's own onnxruntime session
  (``torch.compile(backend="autofusion")``'s program for the dynamic decode graph), called
  with the arguments of the last decode step of a generate (past length prompt + tokens - 2);
* ``onnx-route session step``: our ONNX route's fused KV-cache decoder export (Llama, dynamo
  exporter, ``GraphAutoFusion(path).fuse()``) at the same past length;
* ``... (spinning)``: the same two sessions with onnxruntime's spinning worker threads
  (its default; the package's sessions do not spin);
* ``torch-route ms/token``: ``(generate(N) - generate(1)) / (N - 1)``, HF ``generate()`` on the
  compiled forward; ``onnx-route ms/token``: the same with ``testing.kv_cache.greedy_decode_ort``
  (a plain Python loop of session runs); ``eager ms/token``: ``generate()`` in eager;
  ``drop-in module``: ``GraphAutoFusion(model).fuse().generate()``, Hugging Face's generate()
  for the first tokens, then our decode loop (``graph_autofusion/torch_decode.py``).

* ``where a torch-route token goes``: the same generate with timers around the compiled
  forward (Dynamo's frame), the graph's call (``CompiledGraph.__call__``) and the session
  run: Hugging Face ``generate()`` outside the forward, Dynamo, our call path, onnxruntime
  (paired differences of ``generate(N)`` and ``generate(1)``, medians; the timers add ~1 us);
* ``static cache``: ``generate(cache_implementation="static")``, Hugging Face's recipe for
  compiled generation (the graphs write into the cache tensors), compiled and in eager.

The difference between a route's ms/token and its session step is the per-token cost outside
onnxruntime (HF ``generate()``'s Python, Dynamo's guards and frame, our call path). Every
configuration is timed in rounds in a seeded shuffled order (``runtime.timing.round_robin``).
Writes ``benchmarks/results/decode_overhead.{json,md}`` with the CPU model and ISA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from graph_autofusion import GraphAutoFusion
from graph_autofusion.runtime.ort_session import model_weights, ort_session
from graph_autofusion.runtime.peer_engines import cpu_facts
from graph_autofusion.runtime.timing import round_robin
from graph_autofusion.testing.builders import build_model
from graph_autofusion.testing.kv_cache import export_decoder, greedy_decode_ort
from graph_autofusion.torch_decode import KNOWN_PROBE_TOKENS, PROBE_TOKENS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_ort_decode import decode_feeds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GEN = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


def _tokens(model, ids, n: int, kw: dict) -> list[int]:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, **kw)[0].tolist()


def _capture_decode_program(model, ids, tokens: int):
    """Generate through the compiled forward; the decode graph's onnxruntime program and the
    feeds of its last call."""
    import graph_autofusion.torch_ort as torch_ort

    seen: dict = {}
    original = torch_ort.OrtGraphProgram.__call__

    def spy(self, *args):
        seen["program"] = self
        seen["feeds"] = {
            n: torch_ort._as_numpy(args[i]).copy()
            for n, i in zip(self.input_names, self.user_inputs, strict=True)
        }
        return original(self, *args)

    torch_ort.OrtGraphProgram.__call__ = spy
    try:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=tokens, **GEN)
    finally:
        torch_ort.OrtGraphProgram.__call__ = original
    return seen["program"], seen["feeds"]


def _token_split(model, ids, n: int, rounds: int) -> dict[str, float]:
    """ms per token of a compiled ``generate()`` in: Hugging Face outside the forward, Dynamo's
    frame, our call path, the onnxruntime session run (see the module docstring)."""
    import time

    import graph_autofusion.torch_compile as tc
    import graph_autofusion.torch_ort as to

    acc = {"fwd": 0.0, "graph": 0.0, "run": 0.0}
    compiled = model.forward

    def fwd(*a, **k):
        t = time.perf_counter()
        try:
            return compiled(*a, **k)
        finally:
            acc["fwd"] += time.perf_counter() - t

    graph_call, session_call = tc.CompiledGraph.__call__, to.OrtGraphProgram.__call__

    def gcall(self, *a):
        t = time.perf_counter()
        try:
            return graph_call(self, *a)
        finally:
            acc["graph"] += time.perf_counter() - t

    def pcall(self, *a):  # OrtGraphProgram.__call__ with the run timed apart
        feeds = {n: to._as_numpy(a[i]) for n, i in zip(self.input_names, self.user_inputs)}
        t = time.perf_counter()
        outs = self.session.run(self.output_names, feeds)
        acc["run"] += time.perf_counter() - t
        return tuple(torch.from_numpy(np.asarray(o)) for o in outs)

    model.forward, tc.CompiledGraph.__call__, to.OrtGraphProgram.__call__ = fwd, gcall, pcall
    per: dict[str, list[float]] = {k: [] for k in ("gen", "fwd", "graph", "run")}
    try:
        with torch.no_grad():
            for _ in range(rounds):
                row = {}
                for k in (n, 1):
                    acc.update(fwd=0.0, graph=0.0, run=0.0)
                    t = time.perf_counter()
                    model.generate(ids, max_new_tokens=k, **GEN)
                    row[k] = (time.perf_counter() - t, dict(acc))
                per["gen"].append((row[n][0] - row[1][0]) / (n - 1) * 1e3)
                for k in ("fwd", "graph", "run"):
                    per[k].append((row[n][1][k] - row[1][1][k]) / (n - 1) * 1e3)
    finally:
        model.forward, tc.CompiledGraph.__call__, to.OrtGraphProgram.__call__ = (
            compiled,
            graph_call,
            session_call,
        )
    m = {k: statistics.median(v) for k, v in per.items()}
    return {
        "Hugging Face generate() outside the forward": m["gen"] - m["fwd"],
        "Dynamo's frame (guards, argument gathering, outputs)": m["fwd"] - m["graph"],
        "our call path (argument checks, numpy views, outputs)": m["graph"] - m["run"],
        "onnxruntime session run": m["run"],
        "token": m["gen"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(2)
    n = args.tokens

    model = build_model("llama")[0].model.eval()
    ids = torch.randint(
        0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)
    )
    base = model.forward
    eager_tokens = _tokens(model, ids, n, GEN)
    module = GraphAutoFusion(model).fuse()  # the drop-in module: generate() ends in our loop
    model.forward = torch.compile(base, backend="autofusion")
    program, tfeeds = _capture_decode_program(model, ids, n)
    past = next(v for v in tfeeds.values() if v.ndim == 4).shape[2]

    with tempfile.TemporaryDirectory() as tmp:
        fused = Path(tmp) / "llama_kv_fused.onnx"
        gaf = GraphAutoFusion(str(export_decoder("llama", "dynamo")))
        gaf.fuse()
        gaf.save(str(fused))
        osess = ort_session(str(fused), "all", 2)
        osess_spin = ort_session(str(fused), "all", 2, spinning=True)
    tsess = program.session
    tsess_spin = ort_session(
        program.model, level="all", threads=2, in_place=model_weights(program.model), spinning=True
    )
    ofeeds = decode_feeds("llama", past)  # the decode step vs_ort_decode.py studies
    declared = {i.name for i in osess.get_inputs()}
    ofeeds = {k: v for k, v in ofeeds.items() if k in declared}
    prompt = ids.numpy()

    def gen(k: int) -> None:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=k, **GEN)

    def gen_module(k: int) -> list[int]:
        return module.generate(ids, max_new_tokens=k, **GEN)[0].tolist()

    same_module = gen_module(n) == eager_tokens

    steps = 20  # session steps per timed call (one step is a few ms)
    fns = {
        "torch-route session step": lambda: [tsess.run(None, tfeeds) for _ in range(steps)],
        "torch-route session step (spinning)": lambda: [
            tsess_spin.run(None, tfeeds) for _ in range(steps)
        ],
        "onnx-route session step": lambda: [osess.run(None, ofeeds) for _ in range(steps)],
        "onnx-route session step (spinning)": lambda: [
            osess_spin.run(None, ofeeds) for _ in range(steps)
        ],
        f"torch-route generate {n}": lambda: gen(n),
        "torch-route generate 1": lambda: gen(1),
        f"drop-in module generate {n}": lambda: gen_module(n),
        "drop-in module generate 1": lambda: gen_module(1),
        f"onnx-route greedy {n}": lambda: greedy_decode_ort(osess, "llama", prompt, n - 1),
        "onnx-route greedy 1": lambda: greedy_decode_ort(osess, "llama", prompt, 0),
    }
    times = round_robin(fns, args.runs, warmup=1, rotate=True)
    ms = {k: statistics.median(v) * 1e3 / (steps if "step" in k else 1) for k, v in times.items()}
    split = _token_split(model, ids, n, max(5, args.runs // 2))

    static = dict(GEN, cache_implementation="static")

    def gen_static(k: int) -> None:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=k, **static)

    compiled = model.forward
    gen_static(n)  # compiles the static-cache graphs
    model.forward = base
    same_static = _tokens(model, ids, n, static)
    model.forward = compiled
    same_static = same_static == _tokens(model, ids, n, static)
    fns_static = {"ours n": lambda: gen_static(n), "ours 1": lambda: gen_static(1)}
    times_static = round_robin(fns_static, max(5, args.runs // 2), warmup=1, rotate=True)
    model.forward = base
    eager = round_robin({"n": lambda: gen(n), "1": lambda: gen(1)}, max(3, args.runs // 3), 1)
    eager_static = round_robin(
        {"n": lambda: gen_static(n), "1": lambda: gen_static(1)}, max(3, args.runs // 3), 1
    )
    per_token = {
        "torch route": (ms[f"torch-route generate {n}"] - ms["torch-route generate 1"]) / (n - 1),
        "drop-in module": (ms[f"drop-in module generate {n}"] - ms["drop-in module generate 1"])
        / (n - 1),
        "onnx route": (ms[f"onnx-route greedy {n}"] - ms["onnx-route greedy 1"]) / (n - 1),
        "eager": (statistics.median(eager["n"]) - statistics.median(eager["1"])) * 1e3 / (n - 1),
        "torch route, static cache": (
            statistics.median(times_static["ours n"]) - statistics.median(times_static["ours 1"])
        )
        * 1e3
        / (n - 1),
        "eager, static cache": (
            statistics.median(eager_static["n"]) - statistics.median(eager_static["1"])
        )
        * 1e3
        / (n - 1),
    }
    data = {
        "cpu": cpu_facts(),
        "torch": torch.__version__,
        "tokens": n,
        "past_length_of_the_step": past,
        "runs": args.runs,
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "ms_per_token": {k: round(v, 3) for k, v in per_token.items()},
        "torch_route_token_split_ms": {k: round(v, 3) for k, v in split.items()},
        "static_cache_same_tokens_as_eager": same_static,
        "drop_in_module_same_tokens_as_eager": same_module,
        "drop_in_module_loop_tokens": module.autofusion.decode.loop_tokens,
        "outside_onnxruntime_ms_per_token": {
            "torch route": round(per_token["torch route"] - ms["torch-route session step"], 3),
            "drop-in module": round(
                per_token["drop-in module"] - ms["torch-route session step"], 3
            ),
            "onnx route": round(per_token["onnx route"] - ms["onnx-route session step"], 3),
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "decode_overhead.json").write_text(json.dumps(data, indent=2) + "\n")
    cpu = data["cpu"]
    lines = [
        "# Decode: the onnxruntime step against the whole token (zoo Llama, greedy, 2 threads)",
        "",
        f"CPU: {cpu.get('cpu')} ({', '.join(cpu.get('isa', []))}); torch {torch.__version__}; "
        f"{args.runs} rounds, shuffled order; `benchmarks/decode_overhead.py`",
        "",
        "| what | ms |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in ms.items()],
        "",
        "| route | ms/token | of which outside onnxruntime |",
        "|---|---|---|",
        f"| torch.compile(backend='autofusion') + generate() | {per_token['torch route']:.2f} | "
        f"{data['outside_onnxruntime_ms_per_token']['torch route']:.2f} |",
        f"| GraphAutoFusion(model).fuse().generate() (decode loop after {PROBE_TOKENS} tokens, "
        f"{KNOWN_PROBE_TOKENS} once learnt) "
        f"| {per_token['drop-in module']:.2f} | "
        f"{data['outside_onnxruntime_ms_per_token']['drop-in module']:.2f} |",
        f"| our ONNX route, Python loop of session runs | {per_token['onnx route']:.2f} | "
        f"{data['outside_onnxruntime_ms_per_token']['onnx route']:.2f} |",
        f"| eager generate() | {per_token['eager']:.2f} | |",
        f"| torch.compile(backend='autofusion') + generate(cache_implementation='static') | "
        f"{per_token['torch route, static cache']:.2f} | |",
        f"| eager generate(cache_implementation='static') | "
        f"{per_token['eager, static cache']:.2f} | |",
        "",
        f"Static cache: the compiled generate gives eager's tokens: {same_static}. The drop-in "
        f"module's generate() gives eager's tokens: {same_module}.",
        "",
        "Where a torch-route token goes (the same generate with timers around the compiled "
        "forward, the graph's call and the session run; medians of paired differences):",
        "",
        "| part | ms/token |",
        "|---|---|",
        *[f"| {k} | {v:.3f} |" for k, v in split.items()],
        "",
    ]
    (RESULTS / "decode_overhead.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
