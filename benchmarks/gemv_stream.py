"""Compressed weights (issue 22): the one-token GEMV of each weight form against the machine's
streaming bandwidth, measured in one process.

``benchmarks/compressed_weights.py`` divides a whole decode step's weight bytes by its time, a
lower bound of the contractions' rate (the step also runs attention, norms and the rest). This
times the contractions alone: for each form the compressed-weights stage writes (``fp32``: a
plain ``MatMul``; ``fp16``: our ``GemvF16`` custom operator; ``int8`` / ``int4``:
``com.microsoft.MatMulNBits`` with the block size, zero
points and ``accuracy_level`` of ``graph_autofusion.defaults``), one onnxruntime session (CPU,
2 intra-op threads, ``ORT_ENABLE_ALL``) holds enough independent layers of one shape that their
weights are at least ``--cache-multiple`` times the last-level cache, all fed by one activation
row (one decode token). A run of the session therefore streams every weight from memory once.
The rate is the bytes the kernels read (packed weights, scales, zero points; fp32 weights) over
the run's time; the STREAM triad is timed in the same rounds
(its median is the bandwidth the shares are of), and ``measure_bandwidth``'s best-of-10 before
and after is recorded beside it.

The packed weights are random bytes: a kernel's speed does not depend on the values, and no
accuracy is judged here (``compressed_accuracy.py`` does that). Every form and shape is timed in
rounds in a shuffled order (``round_robin(rotate=True)``).

    .venv/bin/python benchmarks/gemv_stream.py              # writes results/gemv_stream.*
    .venv/bin/python benchmarks/gemv_stream.py --runs 3 --out /tmp/gs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (label, K, N): the zoo Llama's projections (hidden 512, MLP 1376) and a 7B-class model's.
SHAPES = (
    ("zoo Llama up/gate", 512, 1376),
    ("zoo Llama down", 1376, 512),
    ("7B-class attention", 4096, 4096),
    ("7B-class MLP up", 4096, 11008),
)
FORMS = ("fp32", "fp16", "int8", "int4", "int8 GemvQ", "int4 GemvQ")
#: the STREAM triad timed beside them: a = b + 3 c over three arrays of this many MiB
TRIAD_MIB = 256
TRIAD = "stream triad"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def random_packed(form: str, k: int, n: int, rng: np.random.Generator) -> Any:
    """A :class:`~graph_autofusion.codegen.weights.Packed` of ``form``'s layout (the stage's
    block size and zero points) filled with random bytes."""
    from graph_autofusion import defaults
    from graph_autofusion.codegen.weights import BITS, Packed

    form = form.split()[0]
    bits, block = BITS[form], defaults.WEIGHTS_BLOCK_SIZE[form]
    nb = -(-k // block)
    b = rng.integers(0, 256, (n, nb, block * bits // 8), dtype=np.uint8)
    scales = (rng.random((n, nb), dtype=np.float32) * 0.01).astype(np.float32)
    zp = None
    if defaults.WEIGHTS_ZERO_POINT[form]:
        zp = rng.integers(0, 256, (n, -(-nb * bits // 8)), dtype=np.uint8)
    empty = np.empty((0, 0), np.float32)
    return Packed(bits, block, k, n, b, scales, zp, empty)


def layers_model(form: str, k: int, n: int, count: int, rng: np.random.Generator) -> bytes:
    """``count`` independent contractions ``y<i> = a @ W<i>`` of ``form``, one input ``a``."""
    from onnx import TensorProto, helper, numpy_helper

    from graph_autofusion import defaults
    from graph_autofusion.codegen.ort_customop_c import DOMAIN
    from graph_autofusion.codegen.ort_gemv_f16 import OP as F16_OP
    from graph_autofusion.codegen.ort_gemv_q import OP as Q_OP
    from graph_autofusion.codegen.ort_gemv_q import to_panels
    from graph_autofusion.codegen.weights import nbits_attrs, to_half

    nodes, inits = [], []
    for i in range(count):
        if form == "fp32":
            w = rng.standard_normal((k, n), dtype=np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", ["a", f"w{i}"], [f"y{i}"]))
            continue
        if form == "fp16":  # the stage's fp16 form: GemvF16 over its fp16 layout (panels)
            w = to_half(rng.standard_normal((k, n), dtype=np.float32), panels=True).b
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node(F16_OP, ["a", f"w{i}"], [f"y{i}"], domain=DOMAIN))
            continue
        p = random_packed(form, k, n, rng)
        if form.endswith("GemvQ"):
            arrays = to_panels(p.b, p.scales, p.zero_points, p.bits, k, n)
            ins = [f"b{i}", f"s{i}", f"z{i}"]
            inits += [numpy_helper.from_array(v, name) for v, name in zip(arrays, ins)]
            nodes.append(helper.make_node(Q_OP, ["a", *ins], [f"y{i}"], domain=DOMAIN))
            continue
        ins = [f"b{i}", f"s{i}"]
        inits += [numpy_helper.from_array(p.b, ins[0]), numpy_helper.from_array(p.scales, ins[1])]
        if p.zero_points is not None:
            ins.append(f"z{i}")
            inits.append(numpy_helper.from_array(p.zero_points, f"z{i}"))
        attrs = nbits_attrs(p, defaults.WEIGHTS_ACCURACY_LEVEL)
        nodes.append(
            helper.make_node("MatMulNBits", ["a", *ins], [f"y{i}"], domain="com.microsoft", **attrs)
        )
    outs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(count)]
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, k])
    graph = helper.make_graph(nodes, f"gemv_{form}", [a], outs, inits)
    opsets = [
        helper.make_opsetid("", 17),
        helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1),
    ]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model.SerializeToString()


def layer_bytes(form: str, k: int, n: int) -> int:
    """The bytes one layer's kernel reads for its weight."""
    if form in ("fp32", "fp16"):
        return (4 if form == "fp32" else 2) * k * n
    p = random_packed(form, k, n, np.random.default_rng(0))
    if form.endswith("GemvQ"):
        from graph_autofusion.codegen.ort_gemv_q import to_panels

        return sum(a.nbytes for a in to_panels(p.b, p.scales, p.zero_points, p.bits, k, n))
    return p.nbytes


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch_e2e_engines import machine

    from graph_autofusion.cost.measure_host import measure_bandwidth, read_caches
    from graph_autofusion.runtime.ort_session import ort_session
    from graph_autofusion.runtime.timing import round_robin, summarize

    caches, _ = read_caches()
    llc_kb = caches.get("l3") or caches.get("l2") or 32768.0
    target = args.cache_multiple * llc_kb * 1024
    data: dict[str, Any] = {"machine": machine(), "llc_kb": llc_kb, "runs": args.runs}
    from graph_autofusion.codegen.ort_customop import build_library, register_library

    lib = build_library([], gemv=True)  # GemvF16, found by ort_session for the fp16 models
    register_library(lib.path, lib.ops)
    rng = np.random.default_rng(0)
    sessions, rows = {}, {}
    for label, k, n in SHAPES:
        for form in FORMS:
            per = layer_bytes(form, k, n)
            count = max(2, int(-(-target // per)))
            key = f"{label} | {form}"
            log(f"{key}: {count} layers, {count * per / 2**20:.0f} MiB")
            sessions[key] = ort_session(
                layers_model(form, k, n, count, rng), "all", 2, spinning=args.spinning
            )
            rows[key] = {
                "shape": label,
                "k": k,
                "n": n,
                "form": form,
                "layers": count,
                "bytes": count * per,
            }
    feeds = {key: {"a": rng.standard_normal((1, rows[key]["k"]), dtype=np.float32)} for key in rows}
    fns = {key: (lambda s=s, f=feeds[key]: s.run(None, f)) for key, s in sessions.items()}
    # the triad is timed in the same rounds as the kernels: this machine's bandwidth moves
    # by up to 1.7x within seconds, so a share is only fair against the same statistic
    torch.set_num_threads(2)
    ta, tb, tc = (torch.full((TRIAD_MIB << 18,), 1.0) for _ in range(3))
    fns[TRIAD] = lambda: torch.add(tb, tc, alpha=3.0, out=ta)
    data["bandwidth_before"] = measure_bandwidth(quick=False)
    log(f"bandwidth {data['bandwidth_before'][0]:.1f} GB/s; timing {len(fns)} sessions")
    stats = summarize(round_robin(fns, args.runs, warmup=2, rotate=True))
    data["bandwidth_after"] = measure_bandwidth(quick=False)
    triad = stats.pop(TRIAD)
    stream = 3 * ta.nbytes / (triad["ms"] * 1e-3) / 1e9
    data["stream_gbs"] = round(stream, 1)
    data["stream_p10_p90_gbs"] = [
        round(3 * ta.nbytes / (triad[q] * 1e-3) / 1e9, 1) for q in ("p90", "p10")
    ]
    for key, row in rows.items():
        st = stats[key]
        row.update({k: round(v, 3) for k, v in st.items()})
        row["gbs"] = round(row["bytes"] / (st["ms"] * 1e-3) / 1e9, 1)
        row["of_stream"] = round(row["gbs"] / stream, 3)
        fp32 = rows[f"{row['shape']} | fp32"]
        per_layer_fp32 = stats[f"{row['shape']} | fp32"]["ms"] / fp32["layers"]
        row["vs_fp32"] = round(st["ms"] / row["layers"] / per_layer_fp32, 3)
        # weights per second: what decode speed follows (bytes per weight differ by form)
        row["gweights_per_s"] = round(row["k"] * row["n"] * row["layers"] / (st["ms"] * 1e6), 1)
    data["rows"] = rows
    return data


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    b0, b1 = data["bandwidth_before"], data["bandwidth_after"]
    lines = [
        "# One-token GEMV by weight form, against streaming bandwidth",
        "",
        f"{m['cpu']} ({', '.join(m['isa']) or 'none of the listed ISA flags'}), "
        f"{m['threads']} threads; onnxruntime {m['onnxruntime']}; {m['date']}, commit "
        f"{m['commit']}{' (dirty)' if m['dirty'] else ''}; load {m['load']}.",
        f"Streaming bandwidth: the STREAM triad (2 threads, three {TRIAD_MIB} MiB arrays "
        f"counted) timed in the same shuffled rounds as the kernels, median "
        f"{data['stream_gbs']} GB/s (p10-p90 {data['stream_p10_p90_gbs'][0]}-"
        f"{data['stream_p10_p90_gbs'][1]}); shares are of that median. Best-of-10 before "
        f"and after the rounds: {b0[0]:.1f} and {b1[0]:.1f} GB/s ({b0[1]}).",
        f"Each session: independent layers of one shape, at least "
        f"{data['llc_kb'] / 1024:.0f} MiB (last-level cache) x the cache multiple, one "
        f"activation row; {data['runs']} rounds in a shuffled order, median (p10-p90).",
        "",
        "| shape (K x N) | form | layers | MiB read | ms per run | GB/s | of stream "
        "| G weights/s | time per layer vs fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"].values():
        lines.append(
            f"| {r['shape']} ({r['k']}x{r['n']}) | {r['form']} | {r['layers']} | "
            f"{r['bytes'] / 2**20:.0f} | {r['ms']:.2f} ({r['p10']:.2f}-{r['p90']:.2f}) | "
            f"{r['gbs']} | {r['of_stream']} | {r['gweights_per_s']} | {r['vs_fp32']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--cache-multiple", type=float, default=4.0)
    p.add_argument(
        "--spinning",
        default="run",
        type=lambda v: {"run": "run", "on": True, "off": False}[v],
        help="the sessions' worker threads: spin inside a run (run, how graph-autofusion "
        "serves a decoder), always (on, onnxruntime's default) or sleep (off)",
    )
    p.add_argument("--out", default=str(RESULTS / "gemv_stream"), help="path stem")
    args = p.parse_args(argv)
    from peers import write_results

    print(write_results(args.out, run(args), markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
