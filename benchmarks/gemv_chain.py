"""One-row contractions as a decode step runs them: chains of the zoo Llama's weights.

``benchmarks/gemv_ort.py`` times one ``MatMul`` per session run, so onnxruntime's per-run cost
(tens of microseconds) hides the difference between kernels on the 1-3 MB layers of a small
decoder. Here one session runs a chain of ``--layers`` repeats of a group of weights, each
contraction fed by the previous one's output (one activation row, ``x [1, 1, K]``), as a
decode step chains its layers:

* ``attention``: 512x512 (a q/k/v/o projection of the zoo Llama);
* ``mlp``: 512x1376 then 1376x512 (its up and down projections);
* ``head``: 512x32000 then 32000x512 (the LM head and back, 65 MB each: streamed from memory
  on every machine);
* ``decoder``: a layer's four 512x512 projections, then 512x1376, 1376x512 twice (its MLP's
  three 2.8 MB matrices and one more): 15 MB a layer, the mix a decode step streams.

Configurations, timed interleaved in rotating order (2 threads, ``ORT_ENABLE_ALL``; the
sessions' workers spin inside a run and for 1 ms after it, as the package's serving sessions
do: ``--spinning run``, or ``off`` as in ``benchmarks/vs_ort_decode.py``), weights warm as a
decode step that fits the last-level cache finds them (a decoder that does not fit streams
them, as ``head`` does):

* ``torch``: the same chain of ``torch.nn.functional.linear`` (MKL / oneDNN, torch's own
  threads), what eager and the torch program run;
* ``MatMul``: onnxruntime's ``MatMul`` on ``W [K, N]``;
* ``Gemv``: the ``ai.graph_autofusion`` ``Gemv`` custom operator on ``Wt [N, K]``, as built
  now;
* ``Gemv (one row)``: the same source built with ``-DGAF_GV_ROWS=1 -DGAF_GV_SPLIT_MIN=0
  -DGAF_GV_EVEN=0``,
  the operator before 2026-12-06 (one weight row at a time, no prefetch, one thread for a
  matrix under 2 MB);
* ``GemvF16``: the fp16-weight operator (``weights="fp16"``) on the same weights in fp16
  panels, and ``GemvF16 (2M chunks)`` built with ``-DGAF_GH_CHUNK_MID=2097152`` (its chunking
  before 2026-12-05). Their GB/s count the fp16 bytes they read; their difference from torch's
  outputs is the weights' rounding to fp16.

Each chain's outputs are compared with torch's. GB/s is the chain's weight bytes over the
median time. Writes ``benchmarks/results/gemv_chain.json`` and ``.md`` with the CPU model and
ISA.

    .venv/bin/python benchmarks/gemv_chain.py [--runs 200] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GROUPS = {
    "attention": [(512, 512)],
    "mlp": [(512, 1376), (1376, 512)],
    "head": [(512, 32000), (32000, 512)],
    "decoder": [(512, 512)] * 4 + [(512, 1376), (1376, 512)] * 2,
}
#: the operator as built now, and as it was before 2026-12-06 (one weight row at a time, one
#: thread for a matrix under 2 MB)
VARIANTS = {"Gemv": "", "Gemv (one row)": "-DGAF_GV_ROWS=1 -DGAF_GV_SPLIT_MIN=0 -DGAF_GV_EVEN=0"}
#: ``GemvF16`` (fp16 weights) as built now and with its chunking before 2026-12-05 (2M
#: weight-products a chunk for every matrix)
HALF_VARIANTS = {"GemvF16": "", "GemvF16 (2M chunks)": "-DGAF_GH_CHUNK_MID=2097152"}
CONFIGS = ("torch", "MatMul", *VARIANTS, *HALF_VARIANTS)


def chain(
    shapes: list[tuple[int, int]], layers: int, gemv: bool, half: bool = False
) -> tuple[bytes, list]:
    """The chain's ONNX model and its weights as ``[N, K]`` arrays (nn.Linear's layout);
    ``half``: ``GemvF16`` on the weights in fp16 panels, as the compressed-weights stage
    writes them (``weights="fp16"``)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from graph_autofusion.codegen.ort_customop_c import DOMAIN
    from graph_autofusion.codegen.weights import to_half

    rng = np.random.default_rng(0)
    nodes, inits, ws, cur = [], [], [], "x"
    for i, (k, n) in enumerate(shapes * layers):
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        ws.append(w)
        arr = w if gemv else np.ascontiguousarray(w.T)
        if half:
            arr = to_half(np.ascontiguousarray(w.T), panels=True).b
        inits.append(onnx.numpy_helper.from_array(arr, f"w{i}"))
        if half:
            nodes.append(h.make_node("GemvF16", [cur, f"w{i}"], [f"y{i}"], domain=DOMAIN))
        elif gemv:
            nodes.append(h.make_node("Gemv", [cur, f"w{i}"], [f"y{i}"], domain=DOMAIN))
        else:
            nodes.append(h.make_node("MatMul", [cur, f"w{i}"], [f"y{i}"]))
        cur = f"y{i}"
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 1, shapes[0][0]])
    y = h.make_tensor_value_info(cur, T.FLOAT, None)
    graph = h.make_graph(nodes, "chain", [x], [y], inits)
    ops = [h.make_opsetid("", 18), h.make_opsetid(DOMAIN, 1)]
    return h.make_model(graph, opset_imports=ops).SerializeToString(), ws


def libraries() -> dict[str, str]:
    """The Gemv library as built now and with the old flags (``$GRAPH_AUTOFUSION_CUSTOM_OP_
    CFLAGS``), each registered for this process's sessions."""
    from graph_autofusion import env
    from graph_autofusion.codegen.ort_customop import build_library, register_library

    out = {}
    for name, flags in {**VARIANTS, **HALF_VARIANTS}.items():
        old = os.environ.get(env.CUSTOM_OP_CFLAGS)
        os.environ[env.CUSTOM_OP_CFLAGS] = flags
        try:
            lib = build_library([], gemv=True)
        finally:
            if old is None:
                os.environ.pop(env.CUSTOM_OP_CFLAGS, None)
            else:
                os.environ[env.CUSTOM_OP_CFLAGS] = old
        register_library(lib.path, lib.ops)
        out[name] = lib.path
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spinning", choices=("run", "off"), default="run")
    ap.add_argument("--out", default=str(RESULTS / "gemv_chain"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import onnx
    import torch

    from graph_autofusion.cost.measure_host import cpu_model_name, machine_fingerprint
    from graph_autofusion.runtime.ort_session import ort_session

    torch.set_num_threads(args.threads)
    libs = libraries()
    load_before = os.getloadavg()
    rows = []
    for group, shapes in GROUPS.items():
        plain, ws = chain(shapes, args.layers, gemv=False)
        gemv, _ = chain(shapes, args.layers, gemv=True)
        half, _ = chain(shapes, args.layers, gemv=True, half=True)
        tw = [torch.from_numpy(w) for w in ws]
        x = np.random.default_rng(1).standard_normal((1, 1, shapes[0][0])).astype(np.float32)
        xt = torch.from_numpy(x)

        def linear_chain(tw=tw, xt=xt) -> object:
            y = xt
            for w in tw:
                y = torch.nn.functional.linear(y, w)
            return y

        spin = "run" if args.spinning == "run" else False
        sessions = {"MatMul": ort_session(onnx.load_from_string(plain), "all", args.threads, spin)}
        for name, path in libs.items():
            sessions[name] = ort_session(
                onnx.load_from_string(half if name in HALF_VARIANTS else gemv), "all",
                args.threads, spin, custom_ops_library=path, find_library=False,
            )  # fmt: skip
        calls = {"torch": linear_chain}
        calls.update({k: (lambda s=s, x=x: s.run(None, {"x": x})[0]) for k, s in sessions.items()})
        with torch.no_grad():
            ref = linear_chain().numpy()
            scale = float(np.abs(ref).max()) or 1.0
            err = {k: float(np.abs(np.asarray(f()) - ref).max()) / scale for k, f in calls.items()}
            times: dict[str, list[float]] = {k: [] for k in calls}
            for r in range(args.runs + 10):
                order = list(calls)[r % len(calls) :] + list(calls)[: r % len(calls)]
                for k in order:
                    t = time.perf_counter()
                    calls[k]()
                    if r >= 10:
                        times[k].append(time.perf_counter() - t)
        nbytes = sum(w.nbytes for w in ws)
        read = {k: nbytes // 2 if k in HALF_VARIANTS else nbytes for k in times}
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        p10p90 = {k: [float(np.percentile(v, 10)) * 1e3, float(np.percentile(v, 90)) * 1e3]
                  for k, v in times.items()}  # fmt: skip
        row = {
            "group": group,
            "shapes": [f"{k}x{n}" for k, n in shapes],
            "layers": args.layers,
            "weight_mb": nbytes / 1e6,
            "ms": med,
            "p10_p90_ms": p10p90,
            "GBps": {k: read[k] / (t * 1e-3) / 1e9 for k, t in med.items()},
            "max_rel_diff_vs_torch": err,
        }
        rows.append(row)
        print(
            f"{group} ({row['weight_mb']:.0f} MB): "
            + "  ".join(f"{k} {med[k]:.3f} ms ({row['GBps'][k]:.0f} GB/s)" for k in CONFIGS),
            flush=True,
        )
    data = {
        "what": "chains of one-row contractions: torch linear, onnxruntime MatMul, Gemv",
        "threads": args.threads,
        "spinning": args.spinning,
        "runs": args.runs,
        "machine": {
            "cpu": cpu_model_name(),
            "fingerprint": machine_fingerprint(),
            "cores": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "torch": torch.__version__,
        "onnxruntime": __import__("onnxruntime").__version__,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    md = [
        "# One-row contractions in chains (benchmarks/gemv_chain.py)",
        "",
        f"CPU: {data['machine']['cpu']} ({data['machine']['fingerprint']}); {args.threads} "
        f"threads, ORT_ENABLE_ALL, spinning {args.spinning}, weights warm; {args.layers} "
        "repeats of each "
        f"group; median (p10-p90) of {args.runs} rounds in rotating order; load average "
        f"before {load_before[0]:.2f}, after {data['machine']['loadavg_after'][0]:.2f}.",
        "",
        "ms (p10-p90; GB/s of the chain's weights). `Gemv (one row)`: the same operator "
        f"built with `{VARIANTS['Gemv (one row)']}` (as it was before 2026-12-06: one weight "
        "row at a time, one thread under 2 MB); `GemvF16`: fp16 weights in "
        "panels (GB/s of the fp16 bytes), `GemvF16 (2M chunks)` built with "
        f"`{HALF_VARIANTS['GemvF16 (2M chunks)']}` (its chunking before 2026-12-05).",
        "",
        "| group | MB | " + " | ".join(CONFIGS) + " |",
        "|---|---:|" + "---:|" * len(CONFIGS),
    ]
    for r in rows:
        cells = [
            f"{r['ms'][k]:.3f} ({r['p10_p90_ms'][k][0]:.3f}-{r['p10_p90_ms'][k][1]:.3f}; "
            f"{r['GBps'][k]:.0f})"
            for k in CONFIGS
        ]
        md.append(f"| {r['group']} {'+'.join(r['shapes'])} | {r['weight_mb']:.0f} | "
                  + " | ".join(cells) + " |")  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out.with_suffix('.json')} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
