"""PyTorch models end to end on CPU, against the peers a CPU user would pick (issue 21).

Run: ``.venv/bin/python benchmarks/torch_e2e.py [--models a,b] [--shapes 16,128,decode,memory]
[--runs N] [--exporters dynamo[,torchscript]]`` (every zoo model and shape by default; each
model in its own process). Writes ``benchmarks/results/torch_e2e.json`` and ``torch_e2e.md``
after every model, merged into what is there by model and shape (other rows kept), and prints
the rows of this run.

Configurations, all in one process per model, every one built first (its first call timed,
compile included), then timed in ``--runs`` rounds whose order rotates every round (one call of
each per round, after warm-up); median with p10-p90; 2 threads everywhere:

* ``eager``; ``inductor`` (``torch.compile(m)``); ``inductor_freezing`` (Inductor with
  ``freezing=True``); ``ours``: ``torch.compile(m, backend="autofusion")``, which builds an
  onnxruntime program and a torch program per Dynamo graph and keeps the faster (each graph's
  ``engine`` and ``engine_ms`` are recorded);
* on the zoo's cached ONNX export of the same module (``--exporters``; with two, each engine
  is timed on both and its faster export is reported, named in the cell): ``ort_all``
  (onnxruntime ``ORT_ENABLE_ALL``), ``ort_opt`` (``onnxruntime.transformers.optimizer.
  optimize_model`` as ``vs_ort_optimizer.py`` calls it, then ORT ALL; none for ResNet-50),
  ``openvino`` (``compile_model(path, "CPU", f32, 2 threads, LATENCY)``; "not installed"
  without the ``bench`` extra) and ``ours_onnx`` (``GraphAutoFusion(path).fuse()`` decided on
  the timed inputs, then ORT ALL). Every onnxruntime session is
  ``runtime.ort_session.ort_session(..., "all", threads=2, spinning=True)`` (onnxruntime's
  default spinning workers; our torch route's own sessions spin inside a run and 1 ms after it,
  ``runtime.ort_session.SERVING_SPINNING``); a first call of an ONNX engine excludes the
  export (recorded apart). Every timed call follows an untimed ``peers.SPIN_SETTLE_S`` pause,
  so a spinning session's workers are idle when the next runs, then ``peers.PRE_CALLS``
  untimed calls of its own configuration, so its threads are awake.

Shapes: batch 1 at sequence 16 and 128 (ResNet-50: one 1x3x224x224 row); ``decode`` (the
Llamas): ms/token of greedy decoding, ``(t(N tokens) - t(1 token)) / (N - 1)`` paired per
round, N = ``--tokens`` (32) from a 16-token prompt: ``generate()`` for the torch
configurations, ``kv_cache.greedy_decode_ort`` on the KV-cache decoder export for the ONNX
engines (the optimizer and our route as ``vs_ort_decode.py`` build them); ``memory`` (the
Llamas): peak RSS of a 20-token ``generate()`` for eager, Inductor+freezing and ours, each in a
fresh process (``ru_maxrss`` after imports and model build, and at the end).

Every configuration is compared with eager (cosine of the first output; decode: the same
tokens). Compiles are cold: each model's process gets a fresh Inductor cache and kernel cache;
the exports come from the zoo's persistent cache. Each shape resets Dynamo, so every shape's
first calls compile afresh (Inductor's on-disk cache then holds the earlier shapes' kernels).
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
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import cosine, first_output  # noqa: E402
from torch_e2e_engines import (  # noqa: E402
    CONFIGS,
    GEN_KW,
    LABELS,
    MEMORY_CONFIGS,
    ONNX_ENGINES,
    OURS,
    PRE_CALLS,
    ROOT,
    SPIN_SETTLE_S,
    THREADS,
    TORCH_CONFIGS,
    Unavailable,
    compile_torch,
    export,
    graph_count,
    graphs_since,
    llama_prompt,
    machine,
    measure_memory,
    onnx_engine,
    run_forward,
    run_memory,
)

OUT = ROOT / "benchmarks" / "results"
MODELS = ("llama", "llama_gqa", "bert", "gpt2", "minilm", "resnet50")
DECODERS = ("llama", "llama_gqa")
SHAPES = ("16", "128", "decode", "memory")
SHAPE_ORDER = ("s16", "s128", "224", "decode", "memory")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _build(rec: dict, key: str, make: Any, first_args: tuple, check: Any) -> Any:
    """Build one configuration (``make()`` returns its call) and call it once: the first-call
    seconds (build included) and ``check(output)`` go to ``rec[key]``; a configuration that
    does not apply or fails gets a ``status`` instead, and None is returned."""
    t = time.perf_counter()
    try:
        call, info = make()
        out = call(*first_args)
        rec[key] = {"first_s": time.perf_counter() - t + info.pop("earlier_s", 0.0)}
        rec[key].update(check(out))
        if info:
            rec[key]["info"] = info
        return call
    except Unavailable as exc:
        rec[key] = {"status": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a configuration failing is a result
        traceback.print_exc()
        rec[key] = {"status": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    log(f"  {key}: {rec[key]['status']}")
    return None


def _export(rec: dict, row: dict, name: str, exporter: str, decoder: bool) -> Path | None:
    """The cached export (its seconds in ``row``); None, with every ONNX engine's status
    saying why, when exporting fails."""
    try:
        path, row["export_s"][exporter] = export(name, exporter, decoder)
        return path
    except Exception as exc:  # noqa: BLE001 - recorded for every engine on this export
        traceback.print_exc()
        why = f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        row["export_s"][exporter] = None
        rec.update({f"{e}@{exporter}": {"status": why} for e in ONNX_ENGINES})
        return None


def _pick_exports(rec: dict, exporters: list[str]) -> dict:
    """``engine@exporter`` entries folded into ``engine``: the export it ran fastest on."""
    out = {k: v for k, v in rec.items() if "@" not in k}
    for engine in ONNX_ENGINES:
        tried = {e: rec[f"{engine}@{e}"] for e in exporters if f"{engine}@{e}" in rec}
        timed = {e: r for e, r in tried.items() if "ms" in r}
        best = min(timed, key=lambda e: timed[e]["ms"]) if timed else exporters[0]
        out[engine] = {**tried[best], "exporter": best}
        if len(tried) > 1:
            out[engine]["exports"] = tried
    return out


def bench_forward(name: str, seq: int, args: argparse.Namespace, tmp: str) -> dict:
    from graph_autofusion.runtime.timing import round_robin, summarize
    from graph_autofusion.testing.builders import build_model

    torch._dynamo.reset()
    module, inputs = build_model(name, seq_len=seq)
    feeds = {k: v.numpy() for k, v in inputs.items()}
    with torch.no_grad():
        want = first_output(module(**inputs)).detach().clone()
    shape = "224" if name == "resnet50" else f"s{seq}"
    row: dict[str, Any] = {"model": name, "shape": shape, "kind": "forward", "export_s": {}}
    rec: dict[str, Any] = {}
    calls: dict[str, Any] = {}
    n0 = graph_count()

    def check(out: Any) -> dict:
        return {"cosine": cosine(out, want)}

    for cfg in TORCH_CONFIGS:
        log(f"{name}/{shape}: build {cfg}")

        def make(cfg: str = cfg) -> tuple:
            f = compile_torch(module, cfg)

            def call() -> Any:
                with torch.no_grad():
                    return first_output(f(**inputs))

            return call, {}

        calls[cfg] = _build(rec, cfg, make, (), check)
    for exporter in args.exporters:
        path = _export(rec, row, name, exporter, decoder=False)
        for engine in ONNX_ENGINES if path else ():
            log(f"{name}/{shape}: build {engine} on the {exporter} export")

            def make(engine: str = engine, path: Path = path) -> tuple:
                sess, info = onnx_engine(engine, path, name, feeds, tmp)
                return (lambda: run_forward(sess, feeds)), info

            calls[f"{engine}@{exporter}"] = _build(rec, f"{engine}@{exporter}", make, (), check)
    fns = {k: c for k, c in calls.items() if c is not None}
    log(f"{name}/{shape}: timing {len(fns)} configurations, {args.runs} rounds")
    for k, s in summarize(
        round_robin(
            fns, args.runs, warmup=2, rotate=True, settle_s=SPIN_SETTLE_S, pre_calls=PRE_CALLS
        )
    ).items():
        rec[k].update(s)
    row["graphs"] = graphs_since(n0)  # after the timing: their call counts include it
    row["configs"] = _pick_exports(rec, args.exporters)
    return row


def bench_decode(name: str, args: argparse.Namespace, tmp: str) -> dict:
    from graph_autofusion.runtime.timing import round_robin, summarize
    from graph_autofusion.testing.builders import build_model
    from graph_autofusion.testing.kv_cache import greedy_decode_ort

    torch._dynamo.reset()
    n = args.tokens
    model = build_model(name)[0].model.eval()
    ids = llama_prompt(model)
    prompt, plen = ids.numpy(), ids.shape[1]
    base_forward = model.forward
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=n, **GEN_KW)[0, plen:].tolist()
    row: dict[str, Any] = {"model": name, "shape": "decode", "kind": "decode", "tokens": n}
    row["export_s"] = {}
    rec: dict[str, Any] = {}
    calls: dict[str, Any] = {}
    n0 = graph_count()

    def check(tokens: list[int]) -> dict:
        return {"same_tokens": tokens == want}

    for cfg in TORCH_CONFIGS:
        log(f"{name}/decode: build {cfg}")

        def make(cfg: str = cfg) -> tuple:
            f = compile_torch(base_forward, cfg)

            def gen(k: int) -> list[int]:
                model.forward = f
                with torch.no_grad():
                    return model.generate(ids, max_new_tokens=k, **GEN_KW)[0, plen:].tolist()

            return gen, {}

        calls[cfg] = _build(rec, cfg, make, (n,), check)
    log(f"{name}/decode: build the drop-in module")

    def make_module() -> tuple:
        from graph_autofusion import GraphAutoFusion

        model.forward = base_forward
        fused = GraphAutoFusion(model).fuse()  # its generate() finishes with our decode loop

        def gen(k: int) -> list[int]:
            return fused.generate(ids, max_new_tokens=k, **GEN_KW)[0, plen:].tolist()

        return gen, {}

    calls["ours_module"] = _build(rec, "ours_module", make_module, (n,), check)
    for exporter in args.exporters:
        path = _export(rec, row, name, exporter, decoder=True)
        for engine in ONNX_ENGINES if path else ():
            log(f"{name}/decode: build {engine} on the {exporter} KV-cache decoder export")

            def make(engine: str = engine, path: Path = path) -> tuple:
                sess, info = onnx_engine(engine, path, name, {}, tmp, decoder=True)
                return (lambda k: greedy_decode_ort(sess, name, prompt, k - 1)[0]), info

            calls[f"{engine}@{exporter}"] = _build(rec, f"{engine}@{exporter}", make, (n,), check)
    fns = {}
    for k, c in calls.items():
        if c is not None:
            fns[f"{k}:{n}"] = lambda c=c: c(n)
            fns[f"{k}:1"] = lambda c=c: c(1)
    log(f"{name}/decode: timing {len(fns)} calls, {args.runs} rounds")
    raw = round_robin(
        fns, args.runs, warmup=1, rotate=True, settle_s=SPIN_SETTLE_S, pre_calls=PRE_CALLS
    )
    for k in calls:
        if calls[k] is None:
            continue
        per_token = [(a - b) / (n - 1) for a, b in zip(raw[f"{k}:{n}"], raw[f"{k}:1"])]
        rec[k].update(summarize({k: per_token})[k])
        rec[k]["ms_generate_n"] = statistics.median(raw[f"{k}:{n}"]) * 1e3
    row["graphs"] = graphs_since(n0)  # after the timing: their call counts include it
    row["configs"] = _pick_exports(rec, args.exporters)
    return row


def worker(name: str, args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(THREADS)
    rows = []
    tmp = tempfile.mkdtemp(prefix=f"torch_e2e_{name}_work_")
    try:
        seqs = [int(s) for s in args.shapes if s.isdigit()]
        for seq in seqs[:1] if name == "resnet50" else seqs:
            rows.append(bench_forward(name, seq, args, tmp))
        if "decode" in args.shapes and name in DECODERS:
            rows.append(bench_decode(name, args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


# ---------------------------------------------------------------------------- results
def _cell(r: dict) -> str:
    if "ms" not in r:
        return r.get("status", "-")
    ex = f" [{r['exporter']}]" if "exports" in r else ""
    return f"{r['ms']:.2f} ({r['p10']:.2f}-{r['p90']:.2f}){ex}"


def _ratios(cfgs: dict, key: str = "ours") -> tuple[str, str]:
    ours = cfgs.get(key, {}).get("ms")
    route = cfgs.get("ours_onnx", {}).get("ms")
    peers = {k: r["ms"] for k, r in cfgs.items() if k not in OURS and "ms" in r}
    vs_route = f"{ours / route:.2f}" if ours and route else "-"
    if not ours or not peers:
        return vs_route, "-"
    best = min(peers, key=peers.get)
    return vs_route, f"{ours / peers[best]:.2f} ({LABELS[best]})"


def _engines(graphs: list[dict]) -> str:
    parts = []
    for g in graphs:
        ms = ", ".join(f"{k} {v:.2f}" for k, v in g["engine_ms"].items())
        parts.append(f"g{g['graph']} {g['engine']}" + (f" ({ms} ms)" if ms else ""))
    return "; ".join(parts) or "-"


def _first_cell(r: dict) -> str:
    if "first_s" not in r:
        return r.get("status", "-")
    if "cosine" in r:
        return f"{r['first_s']:.1f} s, cos {r['cosine']:.6f}"
    return f"{r['first_s']:.1f} s, {'same tokens' if r['same_tokens'] else 'TOKENS DIFFER'}"


def _export_label(row: dict) -> str:
    kind = "KV-cache decoder " if row["kind"] == "decode" else ""
    secs = ", ".join(f"{e} {s:.0f} s" if s is not None else e for e, s in row["export_s"].items())
    best = "best of " if len(row["export_s"]) > 1 else ""
    return f"{best}{kind}{secs}"


def _cpu(run: dict) -> str:
    isa = ", ".join(run.get("isa") or []) or "none of the listed"
    return f"{run['cpu']} ({run['cpus']} CPUs; ISA {isa})"


def markdown(data: dict) -> str:
    rows = [r for r in data["rows"].values() if r["kind"] != "memory"]
    mem = [r for r in data["rows"].values() if r["kind"] == "memory"]
    env = data["environment"]
    runs = sorted(
        {(r["run"]["date"], r["run"]["commit"], r["run"]["dirty"]) for r in data["rows"].values()}
    )
    head = " | ".join(LABELS[c] for c in CONFIGS)
    bar = "|---" * (len(CONFIGS) + 2)
    cpus = sorted({_cpu(r["run"]) for r in data["rows"].values()})
    cpu_text = (
        f"CPU: {cpus[0]}"
        if len(cpus) == 1
        else "CPUs (each row's in the first-call table's run column): " + "; ".join(cpus)
    )
    lines = [
        "# PyTorch models end to end on CPU: eager, Inductor, onnxruntime, OpenVINO, ours",
        "",
        f"Generated by `benchmarks/torch_e2e.py`. {cpu_text}, {env['threads']} threads everywhere; "
        f"torch {env['torch']}, onnxruntime {env['onnxruntime']}, OpenVINO {env['openvino']}, "
        f"transformers {env['transformers']}. Rows from the runs "
        + "; ".join(f"{d} at {c}{' (dirty)' if dirty else ''}" for d, c, dirty in runs)
        + " (each row's run, load average and round count are in the JSON).",
        "",
        "ms: median (p10-p90) of rounds in which every configuration ran once, the order "
        "rotating each round; decode rows: ms/token, (t(N tokens) - t(1 token)) / (N - 1) per "
        'round. `ours` is `torch.compile(m, backend="autofusion")` (decode: its forward in '
        "Hugging Face's `generate()`); `drop-in module` (decode rows) is "
        "`GraphAutoFusion(m).fuse().generate()`, whose greedy decoding is finished by our "
        "decode loop after 5 tokens of Hugging Face's; `our ONNX route` is "
        "`GraphAutoFusion(export).fuse()` in onnxruntime ALL; the best peer is the fastest "
        "configuration other than those. ONNX engines run the zoo's export (column "
        "`export`, with its export seconds, which no first call includes). Both of ours "
        "flush denormal floats to zero (`FuseOptions.denormals`'s default; from 2026-12-06 "
        "03:40 on, rows before that kept them); the peers run with their own defaults "
        "(IEEE denormals): `benchmarks/results/denormals.md` shows the flag alone on our "
        "fused model and on onnxruntime ALL.",
        "",
        f"| model | shape | {head} | ours / our ONNX route | ours / best peer "
        "| drop-in module / best peer |",
        f"{bar}|---|---|---|",
    ]
    for r in rows:
        cells = " | ".join(_cell(r["configs"].get(c, {})) for c in CONFIGS)
        vs_route, vs_peer = _ratios(r["configs"])
        module = _ratios(r["configs"], "ours_module")[1]
        lines.append(
            f"| {r['model']} | {r['shape']} | {cells} | {vs_route} | {vs_peer} | {module} |"
        )
    lines += [
        "",
        "## First call (s, compile or optimize included) and agreement with eager",
        "",
        f"| model | shape | export | {head} | run |",
        f"{bar}|---|---|",
    ]
    for r in rows:
        cells = " | ".join(_first_cell(r["configs"].get(c, {})) for c in CONFIGS)
        run = f"{r['run']['date']} {r['run']['commit']}, {r['run']['runs']} rounds"
        if len(cpus) > 1:
            run += f", {r['run']['cpu']}"
        lines.append(f"| {r['model']} | {r['shape']} | {_export_label(r)} | {cells} | {run} |")
    lines += [
        "",
        "## Engines of ours: each Dynamo graph's engine and each engine's ms on its first call",
        "",
        "| model | shape | graphs |",
        "|---|---|---|",
    ]
    lines += [f"| {r['model']} | {r['shape']} | {_engines(r.get('graphs', []))} |" for r in rows]
    if mem:
        lines += [
            "",
            "## Peak RSS of a 20-token Llama `generate()`, each in a fresh process (MB)",
            "",
            "| model | config | after imports and build | peak | peak - after build | run |",
            "|---|---|---|---|---|---|",
        ]
        for r in mem:
            for c, m in r["configs"].items():
                if "peak_mb" not in m:
                    lines.append(f"| {r['model']} | {LABELS[c]} | {m['status']} | | | |")
                    continue
                lines.append(
                    f"| {r['model']} | {LABELS[c]} | {m['baseline_mb']:.0f} | {m['peak_mb']:.0f} "
                    f"| {m['delta_mb']:.0f} | {r['run']['date']} {r['run']['commit']}"
                    + (f", {r['run']['cpu']}" if len(cpus) > 1 else "")
                    + " |"
                )
    return "\n".join(lines) + "\n"


def save(rows: list[dict], meta: dict, out: Path = OUT) -> dict:
    """Merge ``rows`` into the results in ``out`` by model and shape (other rows kept) and
    rewrite both files."""
    path = out / "torch_e2e.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or "rows" not in data:
        data = {"rows": {}}  # the old list format: replaced
    for r in rows:
        data["rows"][f"{r['model']}/{r['shape']}"] = {**r, "run": meta}
    order = {m: i for i, m in enumerate(MODELS)}
    data["rows"] = dict(
        sorted(
            data["rows"].items(),
            key=lambda kv: (order.get(kv[1]["model"], 99), SHAPE_ORDER.index(kv[1]["shape"])),
        )
    )
    data["environment"] = meta
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "torch_e2e.md").write_text(markdown(data))
    return data


def _cold_env(tag: str, exports: str) -> tuple[dict[str, str], str]:
    cold = tempfile.mkdtemp(prefix=f"torch_e2e_{tag}_")
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(THREADS),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cold, "inductor"),
        GRAPH_AUTOFUSION_CACHE=os.path.join(cold, "autofusion"),
        TORCH_E2E_EXPORTS=exports,
    )
    return env, cold


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--shapes", default=",".join(SHAPES), help="of 16, 128, decode, memory")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32, help="decode: N of ms/token")
    ap.add_argument("--exporters", default="dynamo", help="dynamo and/or torchscript")
    ap.add_argument(
        "--out",
        type=Path,
        default=OUT,
        help="results folder (another machine's rows in a folder of their own, e.g. "
        "benchmarks/results/epyc, so one table never mixes CPUs)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one model, JSON to --json
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--memory", nargs=2, help=argparse.SUPPRESS)  # internal: MODEL CONFIG
    args = ap.parse_args(argv)
    args.shapes, args.exporters = args.shapes.split(","), args.exporters.split(",")
    if args.memory:
        print("MEMORY " + json.dumps(measure_memory(*args.memory)))
        return 0
    if args.worker:
        Path(args.json).write_text(json.dumps(worker(args.worker, args), default=str))
        return 0
    from graph_autofusion.testing.export import cache_dir

    exports = str(cache_dir())  # the persistent export cache, whatever the worker's env says
    meta = {**machine(), "runs": args.runs, "command": " ".join(sys.argv[1:])}
    done: list[dict] = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        rows: list[dict] = []
        if any(s != "memory" for s in args.shapes):
            env, cold = _cold_env(name, exports)
            out = os.path.join(cold, "rows.json")
            cmd = [sys.executable, __file__, "--worker", name, "--json", out]
            cmd += ["--shapes", ",".join(args.shapes), "--runs", str(args.runs)]
            cmd += ["--tokens", str(args.tokens), "--exporters", ",".join(args.exporters)]
            proc = subprocess.run(cmd, env=env, cwd=ROOT)
            if proc.returncode == 0 and os.path.exists(out):
                rows += json.loads(Path(out).read_text())
            else:
                log(f"{name}: worker failed (rc {proc.returncode})")
            shutil.rmtree(cold, ignore_errors=True)
        if "memory" in args.shapes and name in DECODERS:
            mem: dict[str, Any] = {}
            for cfg in MEMORY_CONFIGS:
                log(f"{name}/memory: {cfg} in a fresh process")
                env, cold = _cold_env(f"{name}_mem", exports)
                mem[cfg] = run_memory(__file__, name, cfg, env)
                shutil.rmtree(cold, ignore_errors=True)
            rows.append({"model": name, "shape": "memory", "kind": "memory", "configs": mem})
        wall = time.perf_counter() - t0
        for r in rows:
            r["model_wall_s"] = round(wall, 1)
        log(f"{name}: {len(rows)} rows in {wall:.0f} s")
        done += rows
        if rows:
            save(rows, meta, args.out)
    data = {"rows": {f"{r['model']}/{r['shape']}": {**r, "run": meta} for r in done}}
    print(markdown({**data, "environment": meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
