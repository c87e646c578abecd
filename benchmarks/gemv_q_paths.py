"""GemvQ's paths side by side on this CPU: the custom-operator library built for each ISA level
the host can run, with the library's own compiler flags (this machine's own ``-march=native``, AVX-512 without VNNI, AVX2 with int8
digits, AVX2 with fp32 products, plain C), its one-thread entry point ``gaf_gemv_q`` timed on
the same weights, in rotating order. What a CPU of another level would run, measured here (a
machine's memory and clocks are its own: the ratios between paths are the result).

    .venv/bin/python benchmarks/gemv_q_paths.py [--runs 7] [--out benchmarks/results/epyc]

Weights 4096 x 1024 (int8 4.2 MB, int4 2.1 MB with scales: in L2/L3 once warm, so the kernels'
arithmetic decides, not memory), one and two activation rows; best of ``--runs`` rounds of 20
calls each. Writes ``gemv_q_paths.json`` / ``.md`` (CPU model and ISA recorded).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (label, gcc flags, CPU flags it needs)
BUILDS = (
    ("native", ["-march=native"], set()),
    ("x86-64-v4 (AVX-512, no VNNI)", ["-march=x86-64-v4"], {"avx512f", "avx512bw"}),
    ("x86-64-v4, GAF_GQ_NO_I2", ["-march=x86-64-v4", "-DGAF_GQ_NO_I2"], {"avx512f", "avx512bw"}),
    ("x86-64-v3 (AVX2)", ["-march=x86-64-v3"], {"avx2", "fma"}),
    ("x86-64-v3, GAF_GQ_NO_I2", ["-march=x86-64-v3", "-DGAF_GQ_NO_I2"], {"avx2", "fma"}),
    ("plain C", ["-march=x86-64"], set()),
)
PATHS = {2: "int8 digits (VNNI)", 1: "int8 digits (vpmaddubsw)", 0: "fp32 products"}
K, N = 4096, 1024


def _flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(ln.split(":", 1)[1].split()) for ln in f if ln.startswith("flags")), set())


def main(argv: list[str] | None = None) -> int:
    from torch_e2e_engines import machine

    from graph_autofusion.codegen.compiler import CodegenOptions
    from graph_autofusion.codegen.ort_customop import ort_include_dir
    from graph_autofusion.codegen.ort_customop_c import customop_library_source
    from graph_autofusion.codegen.ort_gemv_q import to_panels
    from graph_autofusion.codegen.weights import quantize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    opts = CodegenOptions(march="")
    host, tmp = _flags(), Path(tempfile.mkdtemp(prefix="gemv_q_paths-"))
    (tmp / "k.c").write_text(customop_library_source([], gemv=True))
    fns, paths = {}, {}
    for label, flags, needs in BUILDS:
        if needs - host:
            continue
        so = tmp / f"k{len(fns)}.so"
        cmd = [opts.compiler, *opts.flags(), *flags]  # the library's own flags, then the level
        subprocess.run(
            [*cmd, f"-I{ort_include_dir()}", str(tmp / "k.c"), "-o", str(so)], check=True
        )
        lib = ctypes.CDLL(str(so))
        fn = lib.gaf_gemv_q
        p, i = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [p, p, p, p, ctypes.c_int, p, i, i, i, i, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        fns[label], paths[label] = fn, PATHS[lib.gaf_gemv_q_vnni()]
    rows = []
    rng = np.random.default_rng(0)
    for bits in (8, 4):
        pk = quantize(rng.standard_normal((K, N)).astype(np.float32), bits, 32, bits == 4)
        wq, s, z = to_panels(pk.b, pk.scales, pk.zero_points, bits, K, N)
        for m in (1, 2):
            x = rng.standard_normal((m, K)).astype(np.float32)
            y = np.zeros((m, N), np.float32)
            call = [a.ctypes.data for a in (x, wq, s, z)]
            half = int(s.dtype == np.float16)  # S fp16 where it holds the scales exactly
            call += [int(z.size > 1), y.ctypes.data, m, N, K, s.shape[1], bits, half]
            best = {label: float("inf") for label in fns}
            for r in range(args.runs):
                order = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
                for label in order:
                    fns[label](*call)  # warm
                    t = time.perf_counter()
                    for _ in range(20):
                        fns[label](*call)
                    best[label] = min(best[label], (time.perf_counter() - t) / 20)
            for label, sec in best.items():
                rows.append({"bits": bits, "rows": m, "build": label, "path": paths[label],
                             "us": round(sec * 1e6, 1),
                             "gweights_per_s": round(K * N * m / sec / 1e9, 1)})  # fmt: skip
    data = {"machine": machine(), "k": K, "n": N, "runs": args.runs, "rows": rows}
    lines = [
        "# GemvQ's paths on one CPU (one thread, weights warm)",
        "",
        f"{data['machine']['cpu']} ({', '.join(data['machine']['isa'])}); "
        f"{data['machine']['date']}, commit {data['machine']['commit']}. "
        f"`benchmarks/gemv_q_paths.py`: {K} x {N} weights, best of {args.runs} rounds of 20 "
        "calls, builds in rotating order.",
        "",
        "| bits | rows | build | path | us | G weight-products/s |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['bits']} | {r['rows']} | {r['build']} | {r['path']} | {r['us']} | "
            f"{r['gweights_per_s']} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemv_q_paths.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "gemv_q_paths.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
