"""Measure the running machine and build its ``host`` :class:`HardwareProfile`.

Micro-benchmarks (each result's ``sources`` entry records how it was measured):

* **Main-memory bandwidth**: STREAM-style copy (``a[:] = b``, 2 arrays counted) and triad
  (``a = b + s*c`` in one pass, 3 arrays counted) on arrays far larger than the last-level
  cache, best of several passes. Triad uses PyTorch on all cores when it is installed (NumPy
  runs one thread); copy uses NumPy. The best rate is kept.
* **fp32 matmul peak**: square ``float32`` matmuls (NumPy's BLAS, and PyTorch when installed),
  a few sizes, best GFLOP/s (``2*n^3`` flops). The full mode also times a ``bfloat16`` matmul
  in PyTorch when the CPU has native bf16 instructions.
* **Per-operator dispatch overhead**: onnxruntime (the runtime fused ONNX models run in) on a
  chain of N tiny ``Add`` nodes against a chain of 1, ``ORT_DISABLE_ALL`` so nothing is fused,
  ``intra_op_num_threads`` = cores; the per-node slope is the overhead. Falls back to NumPy's
  per-call cost of a 16-element add when onnxruntime is not installed.
* **Caches** from ``/sys/devices/system/cpu/cpu0/cache`` (``os.sysconf`` as fallback),
  **cores** from the scheduler affinity, **vector width** from ``/proc/cpuinfo`` flags.

The machine may be busy; numbers are best-of-N to reduce, not remove, that noise.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from graph_autofusion.cost.hardware import HardwareProfile

__all__ = [
    "calibrate_host",
    "measure_bandwidth",
    "measure_dispatch_overhead",
    "measure_matmul",
    "read_caches",
    "vector_width_bytes",
]

_MIB = 1 << 20


def _best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (page faults, thread pools)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure_bandwidth(quick: bool = True) -> tuple[float, str]:
    """Best streaming main-memory bandwidth in GB/s and a sentence on how it was measured."""
    mib = 128 if quick else 256
    repeats = 4 if quick else 10
    n = mib * _MIB // 4
    b = np.ones(n, dtype=np.float32)
    c = np.full(n, 2.0, dtype=np.float32)
    a = np.empty_like(b)
    a.fill(0.0)
    results: dict[str, float] = {}
    t = _best_time(lambda: np.copyto(a, b), repeats)
    results["numpy copy (1 thread, 2 arrays counted)"] = 2 * a.nbytes / t / 1e9
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(_cores())
            t = _best_time(lambda: torch.add(tb, tc, alpha=3.0, out=ta), repeats)
        finally:
            torch.set_num_threads(threads)
        results[f"torch triad a=b+s*c ({_cores()} threads, 1 pass, 3 arrays counted)"] = (
            3 * a.nbytes / t / 1e9
        )
    else:
        t = _best_time(lambda: np.add(b, c, out=a), repeats)
        results["numpy add a=b+c (1 thread, 3 arrays counted)"] = 3 * a.nbytes / t / 1e9
    how, best = max(results.items(), key=lambda kv: kv[1])
    others = "; ".join(f"{k} {v:.1f} GB/s" for k, v in results.items() if k != how)
    l3 = read_caches()[0].get("l3")
    l3_note = f"OS-reported L3 {l3 / 1024:g} MiB" if l3 else "no L3 reported"
    return best, (
        f"measured: best of {repeats} passes of {how} on {mib} MiB float32 arrays "
        f"({l3_note}); also {others}"
    )


def measure_matmul(quick: bool = True) -> tuple[dict[str, float], dict[str, str]]:
    """Best matmul GFLOP/s per dtype and how each was measured."""
    sizes = (512, 1024, 1536) if quick else (1024, 2048, 4096)
    repeats = 3 if quick else 5
    peaks: dict[str, float] = {}
    how: dict[str, str] = {}
    best, where = 0.0, ""
    rng = np.random.default_rng(0)
    for n in sizes:
        x = rng.standard_normal((n, n), dtype=np.float32)
        y = rng.standard_normal((n, n), dtype=np.float32)
        gf = 2 * n**3 / _best_time(lambda x=x, y=y: x @ y, repeats) / 1e9
        if gf > best:
            best, where = gf, f"numpy float32 {n}x{n}"
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        threads = torch.get_num_threads()
        torch.set_num_threads(_cores())
        try:
            for n in sizes:
                x = torch.randn(n, n)
                y = torch.randn(n, n)
                gf = 2 * n**3 / _best_time(lambda x=x, y=y: torch.mm(x, y), repeats) / 1e9
                if gf > best:
                    best, where = gf, f"torch float32 {n}x{n} ({_cores()} threads)"
            if not quick and "bf16" in _cpu_flags_text():
                n = sizes[-1]
                x = torch.randn(n, n, dtype=torch.bfloat16)
                y = torch.randn(n, n, dtype=torch.bfloat16)
                t = _best_time(lambda: torch.mm(x, y), repeats)
                peaks["bf16"] = round(2 * n**3 / t / 1e9, 1)
                how["peak_gflops.bf16"] = (
                    f"measured: best of {repeats} torch bfloat16 {n}x{n} matmuls, 2*n^3 flops"
                )
        finally:
            torch.set_num_threads(threads)
    peaks = {"f32": round(best, 1), **peaks}
    how["peak_gflops.f32"] = (
        f"measured: best of {repeats} square matmuls at sizes {', '.join(map(str, sizes))} "
        f"(numpy{' and torch' if torch is not None else ''}); best was {where}, 2*n^3 flops"
    )
    return peaks, how


def _ort_chain(n_nodes: int):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])
    y = helper.make_tensor_value_info(f"t{n_nodes}", TensorProto.FLOAT, [16])
    one = helper.make_tensor("one", TensorProto.FLOAT, [16], [1.0] * 16)
    nodes = [
        helper.make_node("Add", ["x" if i == 0 else f"t{i}", "one"], [f"t{i + 1}"])
        for i in range(n_nodes)
    ]
    graph = helper.make_graph(nodes, "chain", [x], [y], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def measure_dispatch_overhead(quick: bool = True) -> tuple[float, str]:
    """Per-operator dispatch overhead in microseconds and how it was measured."""
    chain = 200 if quick else 500
    repeats = 30 if quick else 100
    try:
        import onnxruntime as ort
    except ImportError:
        x = np.ones(16, dtype=np.float32)
        calls = 2000
        t = _best_time(lambda: [np.add(x, x) for _ in range(calls)], 5) / calls
        return t * 1e6, (
            "measured: NumPy per-call cost of a 16-element add (onnxruntime not installed)"
        )
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = _cores()
    opts.inter_op_num_threads = 1
    feed = {"x": np.zeros(16, dtype=np.float32)}
    times = {}
    for n in (1, chain):
        sess = ort.InferenceSession(
            _ort_chain(n), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        times[n] = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
    slope = max((times[chain] - times[1]) / (chain - 1), 1e-9)
    return slope * 1e6, (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={_cores()}; best-of-{repeats} run time of a chain of {chain} "
        f"16-element Add nodes minus a chain of 1, divided by {chain - 1}"
    )


def _cpu_flags_text() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            return line.split(":", 1)[-1]
    return ""


def vector_width_bytes() -> tuple[int, str]:
    """SIMD width from /proc/cpuinfo flags: avx512f 64, avx2 32, otherwise 16 (SSE/NEON)."""
    flags = set(_cpu_flags_text().split())
    if "avx512f" in flags:
        return 64, "/proc/cpuinfo flag avx512f (512-bit zmm registers)"
    if "avx2" in flags:
        return 32, "/proc/cpuinfo flag avx2 (256-bit ymm registers)"
    what = "asimd (NEON)" if "asimd" in flags else "none of avx512f/avx2"
    return 16, f"/proc/cpuinfo flags: {what}; 128-bit vectors assumed"


def _parse_size_kb(text: str) -> float | None:
    text = text.strip().upper()
    mult = {"K": 1, "M": 1024, "G": 1024 * 1024}
    try:
        if text and text[-1] in mult:
            return float(text[:-1]) * mult[text[-1]]
        return float(text) / 1024
    except ValueError:
        return None


def read_caches() -> tuple[dict[str, float], str]:
    """Cache sizes in KiB per core (``l1d``, ``l2``) and total (``l3``) as the OS reports them."""
    found: dict[str, float] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.is_dir() else ():
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = _parse_size_kb((idx / "size").read_text())
        except OSError:
            continue
        if size is None or kind == "Instruction":
            continue
        found[{"1": "l1d", "2": "l2", "3": "l3"}.get(level, f"l{level}")] = size
    if found:
        return found, f"{base}/index*/size"
    names = {
        "l1d": "SC_LEVEL1_DCACHE_SIZE",
        "l2": "SC_LEVEL2_CACHE_SIZE",
        "l3": "SC_LEVEL3_CACHE_SIZE",
    }
    for key, name in names.items():
        try:
            value = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            continue
        if value and value > 0:
            found[key] = value / 1024
    return found, "os.sysconf(SC_LEVEL*_CACHE_SIZE)"


def calibrate_host(quick: bool = True) -> HardwareProfile:
    """Measure this machine and return its ``host`` profile (quick: a few seconds).

    Args:
        quick: smaller arrays, fewer sizes and repeats (a few seconds); otherwise about half a
            minute and a bf16 matmul where the CPU has bf16 instructions.
    """
    t0 = time.perf_counter()
    bandwidth, bw_how = measure_bandwidth(quick)
    peaks, peak_how = measure_matmul(quick)
    overhead, oh_how = measure_dispatch_overhead(quick)
    caches, cache_how = read_caches()
    width, width_how = vector_width_bytes()
    cores = _cores()
    l2 = caches.get("l2")
    local = l2 if l2 else 1024.0
    sources = {
        "memory_bandwidth_gbs": bw_how,
        **peak_how,
        "launch_overhead_us": oh_how,
        "local_memory_kb": (
            f"L2 per core from {cache_how}" if l2 else "default 1024 KiB: the OS reports no L2"
        ),
        "cores": "len(os.sched_getaffinity(0)): CPUs this process may run on",
        "vector_width_bytes": width_how,
    }
    extra: dict[str, float | str] = {
        "machine": platform.machine(),
        "processor": _cpu_model() or platform.processor() or "unknown",
        "calibration": "quick" if quick else "full",
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if "l3" in caches:
        extra["l3_kb"] = caches["l3"]
        sources["extra.l3_kb"] = cache_how
    if "l1d" in caches:
        sources["l1_kb"] = f"L1 data per core from {cache_how}"
    if l2:
        sources["l2_kb"] = f"L2 per core from {cache_how}"
    extra["calibration_seconds"] = round(time.perf_counter() - t0, 2)
    return HardwareProfile(
        name="host",
        description=f"this machine, calibrated ({extra['processor']}, {cores} cores)",
        kind="cpu",
        memory_bandwidth_gbs=round(bandwidth, 2),
        peak_gflops=peaks,
        launch_overhead_us=round(max(overhead, 0.001), 3),
        local_memory_kb=local,
        cores=cores,
        vector_width_bytes=width,
        l1_kb=caches.get("l1d"),
        l2_kb=l2,
        extra=extra,
        sources=sources,
    )


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[-1].strip()
    return ""
