"""Few-row ``MatMul`` by a constant weight in onnxruntime: its own ``MatMul`` against the
``ai.graph_autofusion`` ``Gemv`` custom operator (:mod:`graph_autofusion.codegen.ort_gemv`).

For every weight shape of the zoo Llama decoder (``[K, N]``: 512x512, 512x1376, 1376x512 and
the 512x32000 LM head), one-node models on an input ``x [1, M, K]`` with a dynamic ``M``:

* ``matmul``: onnxruntime's ``MatMul(x, W)``, ``W`` a constant initializer (prepacked);
* ``gemv``: ``Gemv(x, Wt)`` (``Wt = W.T``, ``[N, K]``), the custom operator alone;
* ``if_fusedmatmul``: what the few-row lowering writes
  (:mod:`graph_autofusion.codegen.ort_matmul`): ``If(Size(x) <= 8 K)``, then ``Gemv``, else
  ``com.microsoft.FusedMatMul(x, Wt, transB=1)``, ``Wt`` read from the outer scope;
* ``if_gemm``: the same with ``Reshape``, ``Gemm(transB=1)``, ``Reshape`` as the else-branch
  (the alternative measured for prefill).

Timed interleaved round-robin (CPU, 2 intra-op threads, ``ORT_ENABLE_ALL``, workers not
spinning as in ``benchmarks/vs_ort_decode.py``, ``--spinning`` as in safe mode), median of
``--runs`` runs at each ``--rows`` M (1, 3: the ``Gemv`` branch; 128: a prefill, the GEMM
branch). By default a 64 MB buffer is read before every run: a decode step reads ~115 MB of
weights, more than the 32 MB L3, so each MatMul finds its weight in memory, not in cache
(``--warm``: the weight stays cached, as safe mode times it). GB/s is the weight's bytes over
the median time. Writes ``benchmarks/results/gemv_ort.json`` and ``.md``.

    .venv/bin/python benchmarks/gemv_ort.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHAPES = [(512, 512), (512, 1376), (1376, 512), (512, 32000)]
VARIANTS = ("matmul", "gemv", "if_fusedmatmul", "if_gemm")


def models(k: int, n: int, seed: int = 0) -> dict[str, bytes]:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from graph_autofusion.codegen.ort_customop_c import DOMAIN

    w = (np.random.default_rng(seed).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    wt = np.ascontiguousarray(w.T)
    xin = [h.make_tensor_value_info("x", T.FLOAT, [1, "m", k])]
    yout = [h.make_tensor_value_info("y", T.FLOAT, None)]
    ops = [h.make_opsetid("", 18), h.make_opsetid(DOMAIN, 1), h.make_opsetid("com.microsoft", 1)]

    def model(nodes: list, weight: np.ndarray, extra: list | None = None) -> bytes:
        init = [onnx.numpy_helper.from_array(weight, "w")] + (extra or [])
        g = h.make_graph(nodes, "g", xin, yout, init)
        return h.make_model(g, opset_imports=ops).SerializeToString()

    def branch(nodes: list, out: str) -> object:
        return h.make_graph(nodes, "b", [], [h.make_tensor_value_info(out, T.FLOAT, None)])

    then_g = branch([h.make_node("Gemv", ["x", "w"], ["y_t"], domain=DOMAIN)], "y_t")
    else_fmm = branch(
        [h.make_node("FusedMatMul", ["x", "w"], ["y_e"], domain="com.microsoft", transB=1)], "y_e"
    )
    else_gemm = branch(
        [
            h.make_node("Reshape", ["x", "rows"], ["x2"]),
            h.make_node("Gemm", ["x2", "w"], ["y2"], transB=1),
            h.make_node("Shape", ["x"], ["lead"], end=-1),
            h.make_node("Concat", ["lead", "ncol"], ["yshape"], axis=0),
            h.make_node("Reshape", ["y2", "yshape"], ["y_e"]),
        ],
        "y_e",
    )
    consts = [
        onnx.numpy_helper.from_array(np.array(8 * k, np.int64), "limit"),
        onnx.numpy_helper.from_array(np.array([-1, k], np.int64), "rows"),
        onnx.numpy_helper.from_array(np.array([n], np.int64), "ncol"),
    ]

    def lowered(else_g: object) -> bytes:
        nodes = [
            h.make_node("Size", ["x"], ["size"]),
            h.make_node("LessOrEqual", ["size", "limit"], ["few"]),
            h.make_node("If", ["few"], ["y"], then_branch=then_g, else_branch=else_g),
        ]
        return model(nodes, wt, consts)

    return {
        "matmul": model([h.make_node("MatMul", ["x", "w"], ["y"])], w),
        "gemv": model([h.make_node("Gemv", ["x", "w"], ["y"], domain=DOMAIN)], wt),
        "if_fusedmatmul": lowered(else_fmm),
        "if_gemm": lowered(else_gemm),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rows", default="1,3,128", help="the M values (comma-separated)")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="leave the weights in cache between runs (default: read a 64 MB buffer before "
        "every run, as a decode step's ~115 MB of weights evict each other from the 32 MB L3)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--spinning",
        action="store_true",
        help="onnxruntime's workers spin (its default, what safe mode times with; default: "
        "not spinning, as benchmarks/vs_ort_decode.py)",
    )
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN,...")
    ap.add_argument("--out", default=str(RESULTS / "gemv_ort"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from graph_autofusion.codegen.ort_customop import build_library
    from graph_autofusion.runtime.ort_session import ort_session

    lib = build_library([], gemv=True)
    flush = None if args.warm else np.ones(16 << 20, np.float32)
    load_before = os.getloadavg()
    rows = []
    for k, n in [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]:
        sess = {
            v: ort_session_bytes(b, lib.path, args.threads, ort_session, args.spinning)
            for v, b in models(k, n).items()
        }
        for m in [int(r) for r in args.rows.split(",")]:
            x = np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)
            ref = sess["matmul"].run(None, {"x": x})[0]
            err = {
                v: float(np.abs(s.run(None, {"x": x})[0] - ref).max())
                for v, s in sess.items()
                if v != "matmul"
            }
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for _ in range(10):
                for s in sess.values():
                    s.run(None, {"x": x})
            for _ in range(args.runs):
                for v in VARIANTS:
                    if flush is not None:
                        flush.sum()
                    t = time.perf_counter()
                    sess[v].run(None, {"x": x})
                    times[v].append(time.perf_counter() - t)
            med = {v: statistics.median(ts) * 1e3 for v, ts in times.items()}
            row = {
                "K": k,
                "N": n,
                "M": m,
                "ms": med,
                "GBps": {v: k * n * 4 / (t * 1e-3) / 1e9 for v, t in med.items()},
                "speedup": {v: med["matmul"] / t for v, t in med.items()},
                "max_abs_diff": err,
            }
            rows.append(row)
            print(
                f"{k}x{n} M={m}: "
                + "  ".join(f"{v} {med[v]:.4f} ms ({row['GBps'][v]:.1f} GB/s)" for v in VARIANTS)
                + f"  if_fusedmatmul x{row['speedup']['if_fusedmatmul']:.2f}",
                flush=True,
            )
    data = {
        "what": "onnxruntime MatMul vs the Gemv custom operator, x [1, M, K] @ W [K, N]",
        "threads": args.threads,
        "weights": "warm (in cache)" if args.warm else "cold (64 MB read before every run)",
        "spinning": args.spinning,
        "runs": args.runs,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "onnxruntime": __import__("onnxruntime").__version__,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    md = [
        "# onnxruntime MatMul vs the Gemv custom operator (benchmarks/gemv_ort.py)",
        "",
        f"{args.threads} threads, ORT_ENABLE_ALL, "
        f"{'spinning' if args.spinning else 'not spinning'}, weights {data['weights']}, "
        f"median of {args.runs} "
        f"interleaved runs; load average before {load_before[0]:.2f}, after "
        f"{data['machine']['loadavg_after'][0]:.2f} ({os.cpu_count()} cores).",
        "",
        "`MatMul`: onnxruntime's, on the constant `W [K, N]`; `Gemv`: the custom operator on "
        "`Wt [N, K]`; `If+FusedMatMul`: `If(Size(x) <= 8K)`, then `Gemv`, else "
        "`com.microsoft.FusedMatMul(x, Wt, transB=1)`; `If+Gemm`: else `Reshape`, "
        "`Gemm(transB=1)`, `Reshape`. ms (GB/s of the weight), x: MatMul / If+FusedMatMul.",
        "",
        "| K x N | M | MatMul | Gemv | If+FusedMatMul | If+Gemm | x |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [f"{r['ms'][v]:.4f} ({r['GBps'][v]:.1f})" for v in VARIANTS]
        md.append(
            f"| {r['K']}x{r['N']} | {r['M']} | {' | '.join(cells)} "
            f"| {r['speedup']['if_fusedmatmul']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out.with_suffix('.json')} and .md")
    return 0


def ort_session_bytes(model: bytes, lib: str, threads: int, make: object, spin: bool) -> object:
    import onnx

    return make(onnx.load_from_string(model), "all", threads, custom_ops_library=lib, spinning=spin)


if __name__ == "__main__":
    raise SystemExit(main())
