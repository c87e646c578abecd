"""PyTorch models end to end: eager, torch.compile (Inductor, with and without freezing) and
``torch.compile(backend="autofusion")``, side by side in one process per model.

Run: ``.venv/bin/python benchmarks/torch_e2e.py [--runs N] [MODEL ...]`` (every zoo model by
default; each in its own process). Writes ``benchmarks/results/torch_e2e.json`` and
``torch_e2e.md`` when run on every model, and prints the table.

Per model, 2 threads, each configuration compiled first (its first-call time recorded), then
timed round-robin, median of ``--runs`` (>= 20) after warm-up, with p10-p90:

* **forward**: batch 1, sequence 128 (ResNet-50: 1x3x224x224; LSTM: 128 steps);
* **decode** (the Llamas): ``generate(max_new_tokens=50)`` greedy from a 16-token prompt with
  the dynamic cache: tokens/s over the whole call and ms/token of decode (the 50-token call
  minus the 1-token call, over 49). Also printed: the physical floor (bytes of weights read per
  token / the measured streaming bandwidth) and the GEMV-only floors (every linear layer as
  one matrix-vector product back to back, with torch's kernel and with ours).

Every configuration's outputs are compared with eager's (cosine; decode: same tokens).
Compiles are cold: each model's process gets a fresh Inductor cache
(``TORCHINDUCTOR_CACHE_DIR``) and a fresh kernel cache (``GRAPH_AUTOFUSION_CACHE``). The
forward's configurations compile first, so the decode's first-call times are warm for
Dynamo's and Inductor's in-process caches (read the forward's compile column for cold).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results"
THREADS = 2
MODELS = ("llama", "llama_gqa", "bert", "gpt2", "minilm", "resnet50", "lstm")
CONFIGS = ("eager", "inductor", "inductor_freezing", "autofusion")


def _round_robin(fns: dict, runs: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    from graph_autofusion.runtime.timing import round_robin, summarize

    return summarize(round_robin(fns, runs, warmup))


def _freezing_backend(gm, example_inputs):
    """Inductor with ``freezing=True`` (weights folded and prepacked), as its own backend
    object so Dynamo keeps its compiled code apart from the default Inductor's."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    with inductor_config.patch(freezing=True):
        return compile_fx(gm, example_inputs)


def _compile(fn, config: str):
    if config == "eager":
        return fn
    if config == "autofusion":
        return torch.compile(fn, backend="autofusion")
    if config == "inductor_freezing":
        return torch.compile(fn, backend=_freezing_backend)
    return torch.compile(fn)


def _first_call(call) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a @ b) / (a.norm() * b.norm() + 1e-300))


def _first(out):
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, tuple | list):
        return out[0]
    return out


def bench_forward(name: str, runs: int) -> dict:
    from graph_autofusion.testing.builders import build_model

    seq = 128
    module, inputs = build_model(name, seq_len=seq)
    module.eval()
    with torch.no_grad():
        want = _first(module(**inputs))
    fns, compile_s, cosine = {}, {}, {}
    for config in CONFIGS:
        f = _compile(module, config)
        with torch.no_grad():
            compile_s[config] = _first_call(lambda f=f: f(**inputs))
            cosine[config] = _cos(_first(f(**inputs)), want)
        fns[config] = f

    def runner(f):
        def run():
            with torch.no_grad():
                f(**inputs)

        return run

    times = _round_robin({k: runner(f) for k, f in fns.items()}, runs)
    return {"times": times, "compile_s": compile_s, "cosine": cosine}


def _stream_gbs() -> float:
    x = torch.ones(64 * 1024 * 1024)  # 256 MB
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        x.sum()
        ts.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(ts) / 1e9


def _gemv_floors(model) -> dict[str, float]:
    """Every linear layer once as a GEMV, back to back: torch's kernel and ours (ms)."""
    from graph_autofusion.codegen.gemv import load_gemv
    from graph_autofusion.runtime.gemv import GemvMatMul

    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = [torch.randn(1, w.shape[1]) for w in weights]
    loaded = load_gemv()
    ours = [GemvMatMul(w.t(), loaded, THREADS) for w in weights]

    def torch_all():
        for x, w in zip(xs, weights):
            torch.nn.functional.linear(x, w)

    def ours_all():
        for x, g, w in zip(xs, ours, weights):
            g(None, x, w.t())

    t = _round_robin({"torch": torch_all, "ours": ours_all}, 30, warmup=3)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    return {"torch_ms": t["torch"]["ms"], "ours_ms": t["ours"]["ms"], "linear_bytes": nbytes}


def bench_decode(name: str, runs: int) -> dict:
    from graph_autofusion.testing.builders import build_model

    wrapper, _ = build_model(name, seq_len=16)
    model = wrapper.model.eval()
    ids = torch.randint(
        0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)
    )
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    base_forward = model.forward
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=50, **kw)
    forwards, compile_s, same = {}, {}, {}
    for config in CONFIGS:
        f = _compile(base_forward, config)
        model.forward = f
        with torch.no_grad():
            compile_s[config] = _first_call(lambda: model.generate(ids, max_new_tokens=50, **kw))
            same[config] = bool(torch.equal(model.generate(ids, max_new_tokens=50, **kw), want))
        forwards[config] = f

    def gen(config, n):
        def run():
            model.forward = forwards[config]
            with torch.no_grad():
                model.generate(ids, max_new_tokens=n, **kw)

        return run

    fns = {}
    for config in CONFIGS:
        fns[f"{config}:50"] = gen(config, 50)
        fns[f"{config}:1"] = gen(config, 1)
    t = _round_robin(fns, runs)
    rows = {}
    for config in CONFIGS:
        t50, t1 = t[f"{config}:50"], t[f"{config}:1"]
        rows[config] = {
            "tokens_per_s": 50 / (t50["ms"] / 1e3),
            "ms_per_token": (t50["ms"] - t1["ms"]) / 49,
            "p10_p90_50_tokens_ms": [t50["p10"], t50["p90"]],
            "same_tokens": same[config],
            "compile_s": compile_s[config],
        }
    gbs = _stream_gbs()
    floors = _gemv_floors(model)
    weight_bytes = floors["linear_bytes"]  # the embedding reads one row per token
    return {
        "rows": rows,
        "stream_gbs": gbs,
        "physical_floor_ms": weight_bytes / gbs / 1e6,
        "gemv_floor_torch_ms": floors["torch_ms"],
        "gemv_floor_ours_ms": floors["ours_ms"],
        "weight_bytes": weight_bytes,
    }


def run_one(name: str, runs: int) -> dict:
    torch.set_num_threads(THREADS)
    out = {"model": name, "forward": bench_forward(name, runs)}
    if name in ("llama", "llama_gqa"):
        torch._dynamo.reset()
        out["decode"] = bench_decode(name, runs)
    return out


def _table(results: list[dict]) -> str:
    lines = [
        "## Forward latency, batch 1, sequence 128 (ms, median; p10-p90; first-call compile s)",
        "",
        "| model | " + " | ".join(CONFIGS) + " | ours vs best peer |",
        "|---|" + "---|" * (len(CONFIGS) + 1),
    ]
    for r in results:
        f = r["forward"]
        cells = []
        for c in CONFIGS:
            t = f["times"][c]
            cells.append(
                f"{t['ms']:.2f} ({t['p10']:.1f}-{t['p90']:.1f}; {f['compile_s'][c]:.1f} s; cos {f['cosine'][c]:.6f})"
            )
        best = min(f["times"][c]["ms"] for c in CONFIGS if c != "autofusion")
        ratio = f["times"]["autofusion"]["ms"] / best
        lines.append(f"| {r['model']} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    dec = [r for r in results if "decode" in r]
    if dec:
        lines += [
            "",
            "## Decode: generate(max_new_tokens=50), 16-token prompt, dynamic cache",
            "",
            "tokens/s of the whole call; ms/token of decode (50-token call minus 1-token call, /49); "
            "first-call time of the 50-token generate (compile included); x floor = ms/token over "
            "the GEMV-only floor with torch's kernel",
            "",
            "| model | config | tokens/s | ms/token | x physical floor | x GEMV floor (torch) | "
            "x GEMV floor (ours) | same tokens | first call s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in dec:
            d = r["decode"]
            for c in CONFIGS:
                row = d["rows"][c]
                lines.append(
                    f"| {r['model']} | {c} | {row['tokens_per_s']:.0f} | {row['ms_per_token']:.2f} | "
                    f"{row['ms_per_token'] / d['physical_floor_ms']:.2f} | "
                    f"{row['ms_per_token'] / d['gemv_floor_torch_ms']:.2f} | "
                    f"{row['ms_per_token'] / d['gemv_floor_ours_ms']:.2f} | {row['same_tokens']} | "
                    f"{row['compile_s']:.1f} |"
                )
            lines.append(
                f"| {r['model']} | floors | | physical {d['physical_floor_ms']:.2f} "
                f"({d['weight_bytes'] / 1e6:.0f} MB at {d['stream_gbs']:.1f} GB/s); GEMV torch "
                f"{d['gemv_floor_torch_ms']:.2f}; GEMV ours {d['gemv_floor_ours_ms']:.2f} | | | | | |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one model, print JSON
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.runs)))
        return 0
    results = []
    for name in args.models:
        # cold compiles for every compiler: a fresh Inductor cache and a fresh kernel cache
        cold = tempfile.mkdtemp(prefix=f"torch_e2e_{name}_")
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(THREADS),
            TORCHINDUCTOR_CACHE_DIR=os.path.join(cold, "inductor"),
            GRAPH_AUTOFUSION_CACHE=os.path.join(cold, "autofusion"),
        )
        proc = subprocess.run(
            [sys.executable, __file__, "--one", name, "--runs", str(args.runs)],
            capture_output=True,
            text=True,
            env=env,
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(json.loads(line[len("RESULT ") :]))
        shutil.rmtree(cold, ignore_errors=True)
        print(f"{name}: done", file=sys.stderr)
    table = _table(results)
    print(table)
    if set(args.models) == set(MODELS):
        OUT.mkdir(exist_ok=True)
        (OUT / "torch_e2e.json").write_text(json.dumps(results, indent=1))
        (OUT / "torch_e2e.md").write_text("# torch_e2e\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
