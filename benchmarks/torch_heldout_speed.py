"""The PyTorch route's speed on the held-out architectures: ours against eager and Inductor.

The models are ``benchmarks/torch_route_sweep.py``'s (the unseen-architecture set, more Hugging
Face families from configs with random weights, plain torch modules; their tiny sizes). Each
model runs in its own process: eager, ``torch.compile(model)`` (Inductor) and
``torch.compile(model, backend="autofusion")`` (ours, its defaults) are built and checked on
the first call (sequence models at length ``--seq``, image models at their sweep size), then
timed in ``--runs`` rounds whose order is shuffled each round
(``runtime.timing.round_robin(rotate=True)``), under ``torch.no_grad()``, 2 threads. Since
2026-12-04 each timed call follows a ``peers.SPIN_SETTLE_S`` pause and ``peers.PRE_CALLS``
untimed calls of its own configuration, as ``torch_e2e.py`` times them: timed back to back,
one configuration's still-spinning threads ran into the next one's call (the torch route's
sessions spin for up to 1 ms after a run, torch's OpenMP workers for milliseconds after eager
and Inductor), which widened every configuration's p90 2-3x and made ours bimodal in about a
third of the processes on the tiniest models.

``--hidden N`` (e.g. 512) runs the Hugging Face models of the set at width ``N`` instead of
their tiny sizes: each model's config with every width (hidden size, intermediate and
expert sizes, head and rank dimensions: :data:`WIDTHS`) multiplied by ``N // hidden``, the
numbers of layers and heads kept, rebuilt with random weights (:func:`widen`); plain torch
modules and the image models whose width is not one hidden size are left out. It writes
``torch_heldout_speed_h<N>.{json,md}``.

Run on a quiet machine (one timing job at a time)::

    .venv/bin/python benchmarks/torch_heldout_speed.py                  # every model
    .venv/bin/python benchmarks/torch_heldout_speed.py --models qwen2,vit --runs 20
    .venv/bin/python benchmarks/torch_heldout_speed.py --hidden 512     # text models, wide

Writes ``benchmarks/results/torch_heldout_speed.{json,md}`` (or ``--out DIR``; CPU model and ISA recorded) and
prints the table and the shares of models where ours beats eager and Inductor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
THREADS = 2
CONFIGS = ("eager", "inductor", "ours")
#: Config entries that are widths, scaled together by ``--hidden`` (heads and layers kept).
WIDTHS = (
    "hidden_size", "n_embd", "d_model", "dim", "hidden_dim", "intermediate_size", "ffn_dim",
    "n_inner", "d_ff",
    "d_kv", "head_dim", "word_embed_proj_dim", "embedding_size", "moe_intermediate_size",
    "shared_expert_intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "kv_lora_rank",
    "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
)  # fmt: skip


def widen(model: Any, hidden: int) -> Any:
    """``model`` (a Hugging Face model) rebuilt at width ``hidden``: every :data:`WIDTHS` entry
    of its config multiplied by ``hidden // <its hidden size>``, random weights (seeded).

    Raises:
        ValueError: the model has no config with one integer hidden size.
    """
    import torch

    config = getattr(model, "config", None)
    d = config.to_dict() if config is not None else {}
    base = next(
        (d[k] for k in ("hidden_size", "n_embd", "d_model", "dim") if isinstance(d.get(k), int)), 0
    )
    if not base:
        raise ValueError("no config with one integer hidden size")
    f = max(1, hidden // base)
    for k in WIDTHS:
        if isinstance(d.get(k), int) and not isinstance(d[k], bool):
            d[k] *= f
    torch.manual_seed(0)
    return type(model)(type(config).from_dict(d)).eval()


def wide_models() -> list[str]:
    """The set's models ``--hidden`` applies to: the Hugging Face sequence models."""
    import torch_route_sweep as sweep

    return [
        n for n, (src, _b, _m, kind) in sweep.MODELS.items() if src != "torch" and kind != "fixed"
    ]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def worker(name: str, seq: int, runs: int, hidden: int = 0) -> dict[str, Any]:
    import torch
    import torch_route_sweep as sweep

    import graph_autofusion.torch_compile as tc
    from graph_autofusion.runtime.timing import round_robin, summarize

    torch.set_num_threads(THREADS)
    source, build, make_inputs, kind = sweep.MODELS[name]
    model = build().eval()
    if hidden:
        model = widen(model, hidden)
    inputs = make_inputs(seq if kind != "fixed" else 0, 0)
    row: dict[str, Any] = {"model": name, "source": source, "kind": kind, "configs": {}}
    row["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    with torch.no_grad():
        want = sweep._tensors(model(**inputs))
    fns = {}
    for cfg in CONFIGS:
        if cfg == "eager":
            f = model
        elif cfg == "inductor":
            f = torch.compile(model)
        else:
            f = torch.compile(model, backend="autofusion")
        t = time.perf_counter()
        try:
            with torch.no_grad():
                got = sweep._tensors(f(**inputs))
        except Exception as exc:  # noqa: BLE001 - recorded, the others still run
            row["configs"][cfg] = {"status": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        cmp = sweep._compare(got, want)
        row["configs"][cfg] = {"first_call_s": time.perf_counter() - t, "compare": cmp}

        def call(f: Any = f) -> None:
            with torch.no_grad():
                f(**inputs)

        fns[cfg] = call
    from peers import PRE_CALLS, SPIN_SETTLE_S

    # as torch_e2e.py times them: each timed call after a pause and one untimed call of its
    # own, so no configuration's still-spinning threads (torch's OpenMP workers after eager or
    # Inductor, onnxruntime's after ours) run into the next one's timed call
    timed = round_robin(
        fns, runs, warmup=2, rotate=True, settle_s=SPIN_SETTLE_S, pre_calls=PRE_CALLS
    )
    for k, s in summarize(timed).items():
        row["configs"][k].update(s)
    row["engines"] = [g.summary().get("engine") for g in tc.default_graphs()]
    return row


def run_worker(name: str, seq: int, runs: int, timeout: float, hidden: int = 0) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix=f"heldout_{name}_")
    out = os.path.join(tmp, "row.json")
    cmd = [sys.executable, __file__, "--worker", name, "--json", out]
    cmd += ["--seq", str(seq), "--runs", str(runs), "--hidden", str(hidden)]
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"model": name, "status": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0 or not os.path.exists(out):
        return {"model": name, "status": f"failed (rc {proc.returncode}): {proc.stderr[-300:]}"}
    return json.loads(Path(out).read_text())


def _ms(c: dict) -> float | None:
    return c.get("ms") if isinstance(c, dict) else None


def markdown(data: dict) -> str:
    import torch_route_sweep as sweep

    m = data["machine"]
    rows = data["rows"]
    lines = [
        "# The PyTorch route on held-out architectures: ours against eager and Inductor",
        "",
        f"Generated by `benchmarks/torch_heldout_speed.py` on {m['date']} at {m['commit']}"
        f"{' (dirty)' if m['dirty'] else ''}. CPU: {m['cpu']} ({m['cpus']} CPUs; ISA "
        f"{', '.join(m['isa'])}), {THREADS} threads; torch {m['torch']}, onnxruntime "
        f"{m['onnxruntime']}. Load average at start {m['load']}. Sequence models at length "
        f"{data['seq']}, image models at the sweep's size; median ms of {data['runs']} rounds "
        f"(p10-p90), each round in a shuffled order. "
        + (
            f"The Hugging Face sequence models widened to hidden {data['hidden']} (every width "
            f"of the config scaled together, layers and heads kept: `--hidden`; parameters in "
            f"millions in the model column)."
            if data.get("hidden")
            else "The models' tiny sizes (hidden 64-256)."
        ),
        "",
        "| model | source | eager | Inductor | ours | ours / eager | ours / Inductor | engines "
        "| ours matches eager |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    beat_e = beat_i = n = 0
    for r in rows:
        if "configs" not in r:
            lines.append(f"| {r['model']} | | {r.get('status', '')} | | | | | | |")
            continue
        c = r["configs"]
        e, i, o = (_ms(c.get(k, {})) for k in CONFIGS)

        def cell(k: str, c: dict = c) -> str:
            x = c.get(k, {})
            if _ms(x) is None:
                return x.get("status", "-")[:60]
            return f"{x['ms']:.2f} ({x['p10']:.2f}-{x['p90']:.2f})"

        re_ = f"{o / e:.2f}" if o and e else "-"
        ri = f"{o / i:.2f}" if o and i else "-"
        if o and e:
            n += 1
            beat_e += o < e
            beat_i += bool(i) and o < i
        ok = c.get("ours", {}).get("compare")
        size = f" ({r['params_m']} M)" if data.get("hidden") and "params_m" in r else ""
        lines.append(
            f"| {r['model']}{size} | {r['source']} | {cell('eager')} | {cell('inductor')} | "
            f"{cell('ours')} | {re_} | {ri} | {' '.join(e or '-' for e in r['engines'])} | "
            f"{'yes' if ok and sweep._call_ok(ok) else 'NO' if ok else '-'} |"
        )
    lines += ["", f"Ours faster than eager on {beat_e} of {n}, faster than Inductor on "
              f"{beat_i} of {n}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch_route_sweep as sweep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="default: the set (--hidden: its text models)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=0, help="widen the HF models to this width")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="results folder (another machine's rows in a folder of their own, e.g. "
        "benchmarks/results/epyc)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        row = worker(args.worker, args.seq, args.runs, args.hidden)
        Path(args.json).write_text(json.dumps(row, default=str))
        return 0
    from torch_e2e_engines import machine

    models = args.models.split(",") if args.models else None
    models = models or (wide_models() if args.hidden else list(sweep.MODELS))
    data = {"machine": machine(), "seq": args.seq, "runs": args.runs, "rows": []}
    data["hidden"] = args.hidden
    for name in models:
        log(f"{name}")
        data["rows"].append(run_worker(name, args.seq, args.runs, args.timeout, args.hidden))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"torch_heldout_speed_h{args.hidden}" if args.hidden else "torch_heldout_speed"
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str))
    text = markdown(data)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
