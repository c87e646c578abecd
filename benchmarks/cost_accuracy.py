"""Cost-model accuracy: predicted per-operator time (host profile) vs onnxruntime's own profile.

Run: ``.venv/bin/python benchmarks/cost_accuracy.py [--runs N] [--models a,b] [--profile host]``
(writes ``benchmarks/results/cost_accuracy.json`` and prints a table).

For every zoo model and both exporters (``graph_autofusion.testing.export_onnx``), on the example
inputs (``example_feeds``, batch 1, sequence 16):

* **predicted**: shapes bound by running the graph once
  (:func:`graph_autofusion.cost.shapes.bind_shapes`), then
  :func:`graph_autofusion.cost.model.kernel_cost` of every node with the ``host`` hardware
  profile (:func:`graph_autofusion.cost.hardware.load_profile`), unfused.
* **measured**: onnxruntime with ``enable_profiling``, ``ORT_DISABLE_ALL``,
  ``intra_op_num_threads=2``, 2 warm-up runs, median per-node kernel time over ``--runs`` runs
  (:func:`graph_autofusion.runtime.ort_profile.profile_nodes`).

Over the operators both sides know (ORT drops ``Constant`` nodes, which it turns into
initializers), the script reports the Spearman rank correlation of predicted vs measured
per-node time and the ratio of the predicted total to the measured total (sum of node medians).
Targets: Spearman >= 0.8 and the ratio within [1/1.5, 1.5].

ORT's profiler adds its own cost to every node it times (it records each tensor's type and
shape: ~1.7 us + 0.25 us per tensor here, while the unprofiled dispatch is 0.14-0.6 us by
operator type). The script measures that floor on chains of tiny ``Sum`` nodes
(:func:`profiler_floor`, the same profiler settings, less the profile's own prediction for
those nodes, which includes its measured ``Sum`` dispatch) and adds it to each prediction
(``--no-profiler-floor`` to compare raw); the JSON also holds the ratio without it.

ORT's profiler reports whole microseconds. Next to the per-node median the JSON holds the
figures against each node's trimmed mean over the runs (slowest fifth dropped), which keeps
the fraction a median of integers loses (``spearman_vs_trimmed_mean``).

Also recorded per model: ``spearman_measured_vs_itself`` (ORT's odd runs against its even runs,
the reproducibility ceiling), ``spearman_measured_vs_second_session`` (the per-node medians of
a second session of the same model: µs-level node costs move between sessions),
``spearman_ceiling_ties`` (the best any prediction without ties can reach against the
medians: ORT reports whole microseconds, so small nodes tie), ``spearman_work_ops`` (only operators whose predicted roofline
time is at least 1 us, i.e. not pure dispatch), the figures against each node's fastest run,
the CPU share the process got while ORT ran and the CPU other processes used meanwhile. The
machine is shared: when another process holds a core, ORT's two threads run at about half
speed. Before each measurement the script waits (``--wait-quiet`` seconds per model at most)
for other processes to use under half a core; a measurement during which they used more than
0.3 cores is repeated (``--attempts``) and the least disturbed one kept.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from graph_autofusion.cost.model import kernel_cost
from graph_autofusion.cost.shapes import bind_shapes
from graph_autofusion.frontend.onnx_import import load_onnx
from graph_autofusion.runtime.ort_profile import profile_nodes, trimmed_mean
from graph_autofusion.testing import example_feeds, export_onnx

MODELS = ("llama", "llama_gqa", "bert", "gpt2", "resnet50", "resnet50_bn", "minilm", "lstm")
EXPORTERS = ("dynamo", "torchscript")
OUT = Path(__file__).parent / "results" / "cost_accuracy.json"
SPEARMAN_TARGET = 0.8
TOTAL_FACTOR = 1.5


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation with average ranks for ties."""
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from ``/proc/stat``."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def others_cpu(interval: float = 0.5) -> float:
    """Cores' worth of CPU that other processes use right now (this one sleeps meanwhile)."""
    try:
        b0, t0 = _cpu_times()
        time.sleep(interval)
        b1, t1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return float("nan")
    cpus = os.cpu_count() or 1
    return cpus * (b1 - b0) / max(t1 - t0, 1e-9)


def wait_for_quiet(max_wait_s: float, threshold: float = 0.5) -> tuple[float, float]:
    """Wait (up to ``max_wait_s``) until other processes use under ``threshold`` cores.

    Returns (their CPU use when the wait ended, seconds waited).
    """
    start = time.perf_counter()
    busy = others_cpu()
    while not busy < threshold and time.perf_counter() - start < max_wait_s:
        time.sleep(1.5)
        busy = others_cpu()
    return busy, time.perf_counter() - start


def load_host(name: str, calibrate: bool = False):
    """The hardware profile ``name``; with ``calibrate``, measure this machine now instead
    (:func:`graph_autofusion.cost.calibrate.calibrate_host`, full mode, not saved), so the
    profile sees the same machine state as the measurement."""
    if calibrate:
        from graph_autofusion.cost.calibrate import calibrate_host

        return calibrate_host(quick=False)
    from graph_autofusion.cost.hardware import load_profile

    return load_profile(name)


def _sum_chain(k: int, chain: int, n_el: int = 16) -> bytes:
    """A chain of ``chain`` ``Sum`` nodes with ``k`` inputs each (the previous result and
    ``k - 1`` constants), 16 floats per tensor."""
    from onnx import TensorProto, helper

    nodes, prev = [], "x"
    consts = [f"c{j}" for j in range(k - 1)]
    for i in range(chain):
        nodes.append(helper.make_node("Sum", [prev, *consts], [f"y{i}"], name=f"sum{i}"))
        prev = f"y{i}"
    graph = helper.make_graph(
        nodes,
        f"profiler_floor_{k}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n_el])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [n_el])],
        [
            helper.make_tensor(c, TensorProto.FLOAT, [n_el], np.ones(n_el, np.float32))
            for c in consts
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def profiler_floor(profile, runs: int = 10, chain: int = 150) -> dict:
    """ORT's profiler cost per node: ``floor(tensors) = a + b x tensors`` (µs).

    onnxruntime's profiler times each kernel including its own instrumentation: it records
    every input's and output's type and shape in the event, about 3-10 µs per node on this
    machine while the unprofiled per-node dispatch is ~0.2 µs. That cost is part of every
    measured node time and of no kernel. It is measured here on chains of tiny ``Sum`` nodes
    with 1, 2, 4 and 8 inputs (same session settings), minus their predicted time (which
    includes the profile's unprofiled ``Sum`` dispatch), and fitted linearly in the number of
    tensors a node touches; the fit is added to each prediction.
    """
    import onnx

    from graph_autofusion.frontend.onnx_import import load_onnx as _load

    xs, ys = [], []
    for k in (1, 2, 4, 8):
        proto = _sum_chain(k, chain)
        prof = profile_nodes(proto, {"x": np.zeros(16, np.float32)}, runs=runs)
        # ORT reports whole microseconds (a timestamp difference: a 2.4 us interval reads 2
        # or 3 depending on where it starts), so the mean of many samples keeps the fraction
        # a median would round away; samples over twice the median (interference) are dropped
        every = np.array([t for v in prof.samples.values() for t in v], dtype=float)
        measured = float(every[every <= 2 * np.median(every)].mean())
        model = _load(onnx.load_from_string(proto))
        predicted = float(
            np.median([kernel_cost(n, profile).time_s * 1e6 for n in model.graph.nodes])
        )
        xs.append(k + 1)
        ys.append(measured - predicted)
    b, a = np.polyfit(xs, ys, 1)
    return {
        "per_node_us": round(float(a), 3),
        "per_tensor_us": round(float(max(b, 0.0)), 3),
        "points": {str(x): round(y, 3) for x, y in zip(xs, ys)},
    }


def _floor_us(node, floor: dict) -> float:
    tensors = sum(1 for v in node.inputs if v is not None) + len(node.outputs)
    return max(0.0, floor["per_node_us"] + floor["per_tensor_us"] * tensors)


def measure(
    name: str,
    exporter: str,
    profile,
    runs: int,
    floor: dict | None = None,
    attempts: int = 3,
    max_others_cpu: float = 0.3,
    wait_s: float = 0.0,
    second_session: bool = True,
) -> dict:
    path = export_onnx(name, exporter)
    feeds = example_feeds(name)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    model = load_onnx(path)
    binding = bind_shapes(model, feeds)
    predicted: dict[str, float] = {}
    ops: dict[str, str] = {}
    unknown = 0
    floors: dict[str, float] = {}
    dispatch: dict[str, float] = {}
    for node in model.graph.nodes:
        cost = kernel_cost(binding.node(node), profile)
        if cost.time_s is None:
            unknown += 1
            continue
        extra = _floor_us(node, floor) if floor else 0.0
        predicted[node.name] = cost.time_s * 1e6 + extra
        floors[node.name] = extra
        dispatch[node.name] = cost.overhead_s * 1e6
        ops[node.name] = node.qualified_op
    t_pred = time.perf_counter() - t0
    del model, binding
    gc.collect()
    # On a shared machine another process may hold a core; ORT's 2 threads then run at about
    # half speed. Two figures tell: the CPU share this process got while ORT ran (~2.0 = both
    # cores for GEMM-heavy graphs; ~1.3-1.5 for graphs of small sequential operators even on
    # an idle machine) and the CPU other processes used meanwhile (machine-wide busy time less
    # this process's). A measurement during which others used more than ``max_others_cpu``
    # cores is repeated (up to ``attempts``); the least disturbed one is kept.
    tries: list[tuple[float, float, object]] = []
    quiet: list[tuple[float, float]] = []
    for _ in range(attempts):
        left = wait_s - sum(q[1] for q in quiet)  # one waiting budget per model
        if wait_s > 0:
            quiet.append(wait_for_quiet(max(left, 0.0)))
        b0, j0 = _cpu_times()
        w0, c0 = time.perf_counter(), time.process_time()
        got = profile_nodes(path, feeds, runs=runs)
        wall = max(time.perf_counter() - w0, 1e-9)
        share = (time.process_time() - c0) / wall
        b1, j1 = _cpu_times()
        machine = (os.cpu_count() or 1) * (b1 - b0) / max(j1 - j0, 1e-9)
        others = max(machine - share, 0.0)
        tries.append((others, share, got))
        if others <= max_others_cpu:
            break
    others_cpu_during, cpu_share, prof = min(tries, key=lambda t: (round(t[0], 1), -t[1]))
    common = [k for k in prof.node_us if k in predicted]
    p = [predicted[k] for k in common]
    m = [prof.node_us[k] for k in common]
    rho = spearman(p, m)
    # the same against each node's trimmed mean (ORT's 1-us resolution keeps its fraction)
    m_mean = [trimmed_mean(prof.samples[k]) for k in common]
    rho_mean = spearman(p, m_mean)
    ratio_mean = float(sum(p)) / sum(m_mean) if sum(m_mean) else float("nan")
    # reproducibility ceiling: ORT against itself (medians of odd vs even timed runs)
    odd = [float(np.median(prof.samples[k][0::2])) for k in common]
    even = [float(np.median(prof.samples[k][1::2] or prof.samples[k])) for k in common]
    self_rho = spearman(odd, even)
    # ... and against a second session of the same model (same settings, a fresh process
    # state for the arena and kernels): µs-level per-node costs move with the session
    other = profile_nodes(path, feeds, runs=runs) if second_session else None
    shared = [i for i, k in enumerate(common) if other is not None and k in other.node_us]
    session_rho = (
        spearman([m[i] for i in shared], [other.node_us[common[i]] for i in shared])
        if other is not None
        else float("nan")
    )
    # the best any prediction without ties can reach against these medians: ORT reports
    # whole microseconds, so hundreds of small nodes tie (every tie order scores the same)
    ceiling = spearman(list(rankdata(m, method="ordinal")), m)
    # operators with real work: predicted roofline time at least 1 us (not overhead-only)
    work = [i for i, k in enumerate(common) if predicted[k] - floors[k] - dispatch[k] >= 1.0]
    rho_work = spearman([p[i] for i in work], [m[i] for i in work])
    total_p, total_m = float(sum(p)), float(sum(m))
    ratio = total_p / total_m if total_m else float("nan")
    raw_ratio = (total_p - sum(floors[k] for k in common)) / total_m if total_m else float("nan")
    # least-disturbed view: the fastest timed run of each node (interference only adds time)
    m_min = [float(min(prof.samples[k])) for k in common]
    rho_min = spearman(p, m_min)
    ratio_min = total_p / sum(m_min) if sum(m_min) else float("nan")
    by_op: dict[str, list[float]] = {}
    for k in common:
        agg = by_op.setdefault(ops[k], [0.0, 0.0, 0])
        agg[0] += predicted[k]
        agg[1] += prof.node_us[k]
        agg[2] += 1
    return {
        "model": name,
        "exporter": exporter,
        "operators": len(common),
        "unmatched_measured": len(prof.node_us) - len(common),
        "unknown_predicted": unknown,
        "spearman": round(rho, 4),
        "spearman_measured_vs_itself": round(self_rho, 4),
        "spearman_measured_vs_second_session": round(session_rho, 4),
        "spearman_ceiling_ties": round(ceiling, 4),
        "spearman_work_ops": round(rho_work, 4),
        "work_ops": len(work),
        "predicted_total_us": round(total_p, 1),
        "measured_total_us": round(total_m, 1),
        "measured_wall_us": round(prof.wall_us, 1),
        "total_ratio": round(ratio, 4),
        "total_ratio_without_profiler_floor": round(raw_ratio, 4),
        "spearman_vs_trimmed_mean": round(rho_mean, 4),
        "total_ratio_vs_trimmed_mean": round(ratio_mean, 4),
        "spearman_vs_min_run": round(rho_min, 4),
        "total_ratio_vs_min_run": round(ratio_min, 4),
        "ok": bool(rho >= SPEARMAN_TARGET and 1 / TOTAL_FACTOR <= ratio <= TOTAL_FACTOR),
        "ok_vs_trimmed_mean": bool(
            rho_mean >= SPEARMAN_TARGET and 1 / TOTAL_FACTOR <= ratio_mean <= TOTAL_FACTOR
        ),
        "load_average": round(load, 2),
        "cpu_share_during_ort": round(cpu_share, 2),
        "cpu_share_attempts": [round(t[1], 2) for t in tries],
        "others_cpu_during_ort": round(others_cpu_during, 2),
        "others_cpu_attempts": [round(t[0], 2) for t in tries],
        "others_cpu_before_attempts": [round(q[0], 2) for q in quiet],
        "waited_s": round(sum(q[1] for q in quiet), 1),
        "shape_method": "execute",
        "predict_seconds": round(t_pred, 2),
        "by_op_us": {
            k: {"predicted": round(v[0], 1), "measured": round(v[1], 1), "count": v[2]}
            for k, v in sorted(by_op.items(), key=lambda kv: -kv[1][1])
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--attempts", type=int, default=3, help="tries per model when CPU-starved")
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        help="per model (and before the calibration), wait up to this many seconds in all for "
        "other processes to use under half a core before measuring",
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--profile", default="host")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument(
        "--calibrate", action="store_true", help="calibrate the host now (full mode, not saved)"
    )
    ap.add_argument(
        "--no-profiler-floor",
        dest="profiler_floor",
        action="store_false",
        help="do not add ORT's measured per-node profiler cost to the predictions",
    )
    args = ap.parse_args(argv)
    calib_quiet = wait_for_quiet(args.wait_quiet) if args.calibrate and args.wait_quiet else None
    profile = load_host(args.profile, args.calibrate)
    floor = profiler_floor(profile) if args.profiler_floor else None
    print(f"profiler floor: {floor}", flush=True)
    rows = []
    start = time.perf_counter()
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            row = measure(
                name,
                exporter,
                profile,
                args.runs,
                floor,
                attempts=args.attempts,
                wait_s=args.wait_quiet,
            )
            rows.append(row)
            print(
                f"{name:12s} {exporter:11s} ops={row['operators']:4d} "
                f"spearman={row['spearman']:.3f} pred={row['predicted_total_us'] / 1e3:8.2f}ms "
                f"meas={row['measured_total_us'] / 1e3:8.2f}ms ratio={row['total_ratio']:.2f} "
                f"self={row['spearman_measured_vs_itself']:.3f} "
                f"2nd={row['spearman_measured_vs_second_session']:.3f} "
                f"ceiling={row['spearman_ceiling_ties']:.3f} "
                f"work={row['spearman_work_ops']:.3f} "
                f"{'ok' if row['ok'] else 'MISS'} (load {row['load_average']}, "
                f"cpu {row['cpu_share_during_ort']}, others {row['others_cpu_during_ort']})",
                flush=True,
            )
    elapsed = time.perf_counter() - start
    rhos = [r["spearman"] for r in rows]
    ratios = [r["total_ratio"] for r in rows]
    result = {
        "benchmark": "cost_accuracy",
        "command": "python benchmarks/cost_accuracy.py " + " ".join(argv or sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "profile": {
            "name": profile.name,
            "memory_bandwidth_gbs": profile.memory_bandwidth_gbs,
            "peak_gflops": dict(profile.peak_gflops),
            "launch_overhead_us": profile.launch_overhead_us,
            "local_memory_kb": profile.local_memory_kb,
            "op_overhead_us": dict(getattr(profile, "op_overhead_us", {}) or {}),
            "calibration": {
                k: profile.extra[k]
                for k in ("calibration", "calibrated_at")
                if k in (profile.extra or {})
            },
            "calibrated_now": bool(args.calibrate),
            "others_cpu_before_calibration": round(calib_quiet[0], 2) if calib_quiet else None,
            "sources": dict(profile.sources),
        },
        "settings": {
            "ort": "enable_profiling, ORT_DISABLE_ALL, intra_op_num_threads=2, 2 warm-up runs",
            "runs": args.runs,
            "profiler_floor": floor,
            "inputs": "example_feeds(name): batch 1, seq 16 (resnet50 1x3x224x224)",
            "targets": {"spearman": SPEARMAN_TARGET, "total_factor": TOTAL_FACTOR},
        },
        "summary": {
            "models": len(rows),
            "ok": sum(r["ok"] for r in rows),
            "ok_vs_trimmed_mean": sum(r["ok_vs_trimmed_mean"] for r in rows),
            "spearman_min": float(np.min(rhos)) if rhos else None,
            "spearman_median": float(np.median(rhos)) if rhos else None,
            "total_ratio_min": float(np.min(ratios)) if ratios else None,
            "total_ratio_max": float(np.max(ratios)) if ratios else None,
            "seconds": round(elapsed, 1),
        },
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(
        f"{'model':12s} {'exporter':11s} {'ops':>5s} {'spearman':>9s} {'ratio':>6s} "
        f"{'ORT-self':>9s} {'ORT-2nd':>8s} {'ceiling':>8s} {'work-ops':>9s} {'cpu':>5s} "
        f"{'others':>6s} {'sp-mean':>8s} "
        f"{'ratio-m':>7s}  ok  ok-mean"
    )
    for r in rows:
        print(
            f"{r['model']:12s} {r['exporter']:11s} {r['operators']:5d} {r['spearman']:9.3f} "
            f"{r['total_ratio']:6.2f} {r['spearman_measured_vs_itself']:9.3f} "
            f"{r['spearman_measured_vs_second_session']:8.3f} {r['spearman_ceiling_ties']:8.3f} "
            f"{r['spearman_work_ops']:9.3f} {r['cpu_share_during_ort']:5.2f} "
            f"{r['others_cpu_during_ort']:6.2f} {r['spearman_vs_trimmed_mean']:8.3f} "
            f"{r['total_ratio_vs_trimmed_mean']:7.2f}  {'yes' if r['ok'] else 'no ':3s} "
            f"{'yes' if r['ok_vs_trimmed_mean'] else 'no'}"
        )
    print(
        f"{result['summary']['ok']}/{len(rows)} within targets against the per-node medians, "
        f"{result['summary']['ok_vs_trimmed_mean']}/{len(rows)} against the trimmed means; "
        f"{elapsed:.0f} s; wrote {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
