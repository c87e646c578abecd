"""Where the time goes: our fused model in onnxruntime against OpenVINO, by class of operator.

``vs_ort_optimizer.py`` says *whether* ours leads each peer; this says *where* a gap is. For each
model (the cached zoo export, dynamo exporter), on one input shape:

* ``ours``: ``GraphAutoFusion(export).fuse()`` with the defaults ``vs_ort_optimizer.py`` uses,
  run in onnxruntime ALL (2 intra-op threads, spinning workers), opened as graph-autofusion
  serves it (``fused_session``: denormal floats flushed; since 2026-12-06);
* ``ORT ALL``: the export itself in onnxruntime ALL;
* ``OpenVINO``: the export on OpenVINO's CPU plugin (f32 precision hint, 2 threads, latency
  hint: ``peers.OV_CONFIG``).

Each engine is timed first without profiling (``round_robin(rotate=True)``, a pause and an
untimed call before each timed one, as in ``vs_ort_optimizer.py``), then profiled in a session
of its own: onnxruntime's profiler (each node's kernel time) and OpenVINO's per-layer counters
(``PERF_COUNT``). Node times are summed per operator class (:data:`CLASSES`: matrix products,
convolutions, attention, normalization, layout, elementwise, other) and divided by the number
of profiled runs. A matrix-product class also gets its rate: the FLOPs of every ``MatMul`` /
``Gemm`` of the export (from its shapes on this input) over the class's time, the same FLOPs for
every engine (they compute the same products, whatever their fused form).

A profiled run is slower than a plain one (each node is timed): compare classes within an
engine's profile and across engines, and take the totals from the plain timing.

    .venv/bin/python benchmarks/op_profile.py                       # writes results/op_profile.*
    .venv/bin/python benchmarks/op_profile.py --models bert --runs 10 --out /tmp/op
    .venv/bin/python benchmarks/op_profile.py --models convnext --custom-ops \
        --out benchmarks/results/epyc/op_profile_custom_ops     # ours with custom operators
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import (  # noqa: E402
    OV_CONFIG,
    PRE_CALLS,
    SPIN_SETTLE_S,
    OpenVINOSession,
    cpu_facts,
    openvino_version,
    timed_session,
    write_results,
)

#: model -> (shape, preset): the shapes where ``vs_ort_optimizer.md`` has OpenVINO ahead
DEFAULT_MODELS = {
    "bert": ("1x16", "transformer"),
    "gpt2": ("1x16", "transformer"),
    "minilm": ("1x128", "transformer"),
    "convnext": ("1x224", "all"),
    "mobilenet_v2": ("1x224", "all"),
}
#: operator class -> words that put an operator type (onnxruntime's op type, or OpenVINO's
#: layer type) in it; the first class with a word the type contains (case-insensitive) wins
CLASSES = {
    "matrix products": ("matmul", "gemm", "gemv", "fullyconnected"),
    "convolutions": ("conv",),
    "attention": ("attention", "softmax", "rotary"),
    "normalization": ("norm", "mvn", "rms"),
    "layout": (
        "reorder",
        "transpose",
        "reshape",
        "squeeze",
        "concat",
        "split",
        "slice",
        "gather",
        "expand",
        "shape",
        "flatten",
    ),
    "elementwise": (
        "add",
        "mul",
        "sub",
        "div",
        "gelu",
        "relu",
        "clip",
        "clamp",
        "sigmoid",
        "tanh",
        "erf",
        "pow",
        "sqrt",
        "subgraph",
        "eltwise",
        "power",
        "multiply",
        "where",
        "select",
        "cast",
        "convert",
        "swish",
        "silu",
    ),
}
ENGINES = ("ours", "ORT ALL", "OpenVINO")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def op_class(op_type: str) -> str:
    """The class of :data:`CLASSES` an operator (or OpenVINO layer) type belongs to."""
    low = op_type.lower()
    for name, words in CLASSES.items():
        if any(w in low for w in words):
            return name
    return "other"


def matmul_flops(path: str, feeds: dict[str, np.ndarray]) -> float:
    """The FLOPs (2 per multiply-add) of the export's ``MatMul`` and ``Gemm`` nodes by a
    constant weight at ``feeds``' shapes: twice each node's output size times its reduced
    dim, from onnxruntime's operand shapes in one profiled run of the unoptimized export
    (products of two activations, attention's, are left out: a fused engine runs them in its
    attention operator)."""
    import onnx

    from graph_autofusion.runtime.ort_session import ort_session

    proto = onnx.load(path, load_external_data=False)
    consts = {i.name for i in proto.graph.initializer}
    consts |= {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
    weighted = {
        n.name
        for n in proto.graph.node
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in consts
    }
    with tempfile.TemporaryDirectory(prefix="gaf_opprof_") as d:
        s = ort_session(path, "disable", 2, profile_prefix=os.path.join(d, "flops"))
        s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    flops = 0.0
    for e in events:
        a = e.get("args", {})
        node = e.get("name", "").removesuffix("_kernel_time")
        if e.get("cat") != "Node" or node not in weighted or not e["name"].endswith("_kernel_time"):
            continue
        x = list(a["input_type_shape"][0].values())[0]
        y = list(a["output_type_shape"][0].values())[0]
        if a["op_name"] == "MatMul":
            k = x[-1]
        else:  # Gemm: x is [M, K] or (transA) [K, M]
            k = x[1] if x[0] == y[0] else x[0]
        flops += 2.0 * float(np.prod(y)) * k
    return flops


def ort_profile(
    path: str, feeds: dict[str, np.ndarray], runs: int, ours: bool = False
) -> dict[str, float]:
    """Milliseconds per run by onnxruntime op type (kernel time of its nodes)."""
    with tempfile.TemporaryDirectory(prefix="gaf_opprof_") as d:
        s = timed_session(path, "all", ours=ours, profile_prefix=os.path.join(d, "p"))
        for _ in range(3):
            s.run(None, feeds)
        s.end_profiling()  # the warm-up's events go with the first file
        s = timed_session(path, "all", ours=ours, profile_prefix=os.path.join(d, "q"))
        for _ in range(3):
            s.run(None, feeds)
        for _ in range(runs):
            s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    by: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by[e["args"]["op_name"]] += e["dur"] / 1e3
    return {k: v / (runs + 3) for k, v in by.items()}


def ov_profile(path: str, feeds: dict[str, np.ndarray], runs: int) -> dict[str, float]:
    """Milliseconds per run by OpenVINO layer type (its ``PERF_COUNT`` counters, summed over
    the runs: the counters hold the last run's times)."""
    s = OpenVINOSession(path, {**OV_CONFIG, "PERF_COUNT": True})
    for _ in range(3):
        s.run(None, feeds)
    by: collections.Counter[str] = collections.Counter()
    for _ in range(runs):
        s.run(None, feeds)
        for p in s.request.profiling_info:
            by[p.node_type] += p.real_time.total_seconds() * 1e3
    return {k: v / runs for k, v in by.items()}


def plain_times(sessions: dict[str, Any], feeds: dict[str, np.ndarray], runs: int) -> dict:
    """Median ms (and p10/p90) of each engine, interleaved in shuffled rounds."""
    from graph_autofusion.runtime.timing import round_robin

    ins = {
        k: {i.name: feeds[i.name] for i in s.get_inputs() if i.name in feeds}
        for k, s in sessions.items()
    }
    fns = {k: (lambda k=k: sessions[k].run(None, ins[k])) for k in sessions}
    got = round_robin(fns, runs, warmup=3, rotate=True, settle_s=SPIN_SETTLE_S, pre_calls=PRE_CALLS)
    return {
        k: {
            "median": float(np.median(v) * 1e3),
            "p10": float(np.percentile(v, 10) * 1e3),
            "p90": float(np.percentile(v, 90) * 1e3),
        }
        for k, v in got.items()
    }


def classes(by_type: dict[str, float]) -> dict[str, float]:
    out: collections.Counter[str] = collections.Counter()
    for k, v in by_type.items():
        out[op_class(k)] += v
    return {c: out.get(c, 0.0) for c in (*CLASSES, "other")}


def profile_model(
    name: str, shape: str, preset: str, runs: int, custom_ops: bool = False
) -> dict[str, Any]:
    from graph_autofusion.api import GraphAutoFusion
    from graph_autofusion.testing import example_feeds, export_onnx

    batch, seq = (int(x) for x in shape.split("x"))
    path = str(export_onnx(name, "dynamo"))
    feeds = example_feeds(name, seq_len=seq, batch=batch)
    row: dict[str, Any] = {"model": name, "shape": shape, "preset": preset}
    if custom_ops:
        row["custom_ops"] = True
    with tempfile.TemporaryDirectory(prefix="gaf_opprof_") as d:
        ours = os.path.join(d, "ours.onnx")
        t = time.perf_counter()
        gaf = GraphAutoFusion(path, preset=preset, sample_inputs=feeds)
        if custom_ops:
            gaf.options = gaf.options.replace(custom_ops=True)
        gaf.fuse()
        gaf.save(ours)
        row["fuse_s"] = time.perf_counter() - t
        paths = {"ours": ours, "ORT ALL": path}
        log(f"{name} {shape}: plain timing")
        sessions = {k: timed_session(p, "all", ours=k == "ours") for k, p in paths.items()}
        try:
            sessions["OpenVINO"] = OpenVINOSession(path)
        except Exception as exc:  # noqa: BLE001 - a peer failure is a result
            row["openvino_error"] = f"{type(exc).__name__}: {exc}"
        row["plain"] = plain_times(sessions, feeds, runs)
        del sessions
        log(f"{name} {shape}: profiles")
        row["by_type"] = {k: ort_profile(p, feeds, runs, k == "ours") for k, p in paths.items()}
        if "openvino_error" not in row:
            row["by_type"]["OpenVINO"] = ov_profile(path, feeds, runs)
    row["classes"] = {k: classes(v) for k, v in row["by_type"].items()}
    row["matmul_gflop"] = matmul_flops(path, feeds) / 1e9
    return row


def markdown(data: dict[str, Any]) -> str:
    f = data["facts"]
    out = [
        "# Where the time goes: ours against onnxruntime ALL and OpenVINO, by operator class",
        "",
        f"Generated by `benchmarks/op_profile.py` on {data['created']} at {data['commit']} "
        f"({f['cpu']}, ISA {' '.join(f['isa'])}; {f['cpus']} CPUs; onnxruntime "
        f"{data['onnxruntime']}, OpenVINO {data['openvino']}; 2 threads). `plain`: median ms "
        f"[p10-p90] of {data['runs']} interleaved rounds without profiling. The class rows: ms "
        "per run from each engine's own profiler (onnxruntime's node kernel times, OpenVINO's "
        "`PERF_COUNT` layer times), which slows a run: compare classes, take totals from "
        "`plain`. `GFLOP/s`: the export's MatMul/Gemm FLOPs at this shape over the "
        "matrix-product class's time.",
        "",
    ]
    for row in data["rows"]:
        eng = [e for e in ENGINES if e in row["classes"]]
        how = ", with custom operators" if row.get("custom_ops") else ""
        out += [f"## {row['model']} {row['shape']} (ours fused in {row['fuse_s']:.1f} s{how})", ""]
        out.append("| | " + " | ".join(eng) + " |")
        out.append("|---|" + "---|" * len(eng))
        p = row["plain"]
        out.append(
            "| plain | "
            + " | ".join(f"{p[e]['median']:.2f} [{p[e]['p10']:.2f}-{p[e]['p90']:.2f}]" for e in eng)
            + " |"
        )
        for c in (*CLASSES, "other"):
            vals = [row["classes"][e][c] for e in eng]
            if max(vals) < 0.005:
                continue
            out.append(f"| {c} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
        mm = [row["classes"][e]["matrix products"] for e in eng]
        out.append(
            "| matrix products GFLOP/s | "
            + " | ".join(f"{row['matmul_gflop'] / (v / 1e3):.0f}" if v else "-" for v in mm)
            + " |"
        )
        out.append("")
        top = sorted(row["by_type"]["ours"].items(), key=lambda kv: -kv[1])[:6]
        out.append("Ours, largest op types: " + ", ".join(f"{k} {v:.2f}" for k, v in top) + ".")
        if "OpenVINO" in row["by_type"]:
            top = sorted(row["by_type"]["OpenVINO"].items(), key=lambda kv: -kv[1])[:6]
            out.append(
                "OpenVINO, largest layer types: " + ", ".join(f"{k} {v:.2f}" for k, v in top) + "."
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    import onnxruntime

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS / "op_profile"))
    ap.add_argument(
        "--custom-ops",
        action="store_true",
        help="ours with FuseOptions(custom_ops=True): generated kernels and our hand-written "
        "operators (GeluErf, GeluTanh, ...) in a custom-operator library",
    )
    a = ap.parse_args()
    from vs_ort_optimizer import _git_state

    git = _git_state()
    data: dict[str, Any] = {
        "benchmark": "op_profile",
        "created": time.strftime("%Y-%m-%d %H:%M"),
        "commit": git["head"][:10] + (" (library files modified)" if git["dirty"] else ""),
        "facts": cpu_facts(),
        "onnxruntime": onnxruntime.__version__,
        "openvino": openvino_version(),
        "runs": a.runs,
        "rows": [],
    }
    for name in a.models.split(","):
        shape, preset = DEFAULT_MODELS[name]
        log(f"{name} {shape}")
        data["rows"].append(profile_model(name, shape, preset, a.runs, a.custom_ops))
    print(write_results(a.out, data, markdown))


if __name__ == "__main__":
    main()
