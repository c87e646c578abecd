"""Measure the running machine and build its ``host`` :class:`HardwareProfile`.

Micro-benchmarks (each result's ``sources`` entry records how it was measured):

* **Main-memory bandwidth**: STREAM-style copy (``a[:] = b``, 2 arrays counted) and triad
  (``a = b + s*c`` in one pass, 3 arrays counted) on arrays far larger than the last-level
  cache, best of several passes. Triad uses PyTorch on all cores when it is installed (NumPy
  runs one thread); copy uses NumPy. The best rate is kept.
* **fp32 peak**: measured in onnxruntime itself, the runtime the models run in (its MLAS
  kernels reach a different rate than NumPy's or PyTorch's BLAS): a square ``MatMul``
  (1024^3 quick, 2048^3 full) and, in full mode, a ResNet-style 3x3 ``Conv``, with
  ``ORT_DISABLE_ALL`` and ``intra_op_num_threads`` = cores, best of several runs. Without
  onnxruntime: square ``float32`` matmuls in NumPy (and PyTorch when installed). The full mode
  also times a ``bfloat16`` matmul in PyTorch when the CPU has native bf16 instructions.
* **Per-operator dispatch overhead**: onnxruntime (the runtime fused ONNX models run in) on a
  chain of N tiny ``Add`` nodes against a chain of 1, ``ORT_DISABLE_ALL`` so nothing is fused,
  ``intra_op_num_threads`` = cores; the per-node slope is the overhead. Falls back to NumPy's
  per-call cost of a 16-element add when onnxruntime is not installed.
* **Per-operator-type dispatch overhead** (``op_overhead_us``): the same slope for each common
  operator type (``Shape``, ``Gather``, ``Concat``, ``Slice``, ``Where`` ...) on tiny tensors:
  the run time of a graph of N independent copies of the node minus a graph of a few copies,
  per copy, unprofiled (``enable_profiling`` off: the profiler adds its own per-node cost).
* **GEMM knee** (``extra.contraction_half_time_us``): the fixed cost one more small GEMM pays
  in onnxruntime beyond its flops, from a batched ``MatMul`` (32 vs 1 batch items of 16^3) and a
  line over unbatched 32^3-64^3 ``MatMul`` nodes (the cost model's contraction-efficiency curve
  uses it instead of its 4 us default).
* **Compute/memory overlap** (``extra.compute_memory_overlap``): a weight-streaming GEMM
  (``[16, 2048] x [2048, 8192]``, 64 MiB weight) in onnxruntime against the compute and memory
  times the calibrated peak and bandwidth give it: 1 = the roofline's ``max``, 0 = their sum.
* **Caches** from ``/sys/devices/system/cpu/cpu0/cache`` (``os.sysconf`` as fallback),
  **cores** from the scheduler affinity, **vector width** from ``/proc/cpuinfo`` flags.

The machine may be busy; numbers are best-of-N to reduce, not remove, that noise.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

import numpy as np

from graph_autofusion.cost.measure_host import (
    best_time,
    core_count,
    cpu_model_name,
    machine_fingerprint,
    measure_bandwidth,
    measure_matmul,
    read_caches,
    vector_width_bytes,
)
from graph_autofusion.cost.measure_ort import (
    copies_model,
    measure_contraction_knee,
    measure_dispatch_overhead,
    measure_gemm_overlap,
    measure_op_overheads,
    measure_ort_peak,
    ort_measure_session,
)
from graph_autofusion.cost.measure_rates import (
    NATIVE_OPS,
    ROW_OPS,
    SHORT_ROW,
    THROUGHPUT_OPS,
    THROUGHPUT_ROWS,
    measure_op_throughput,
)
from graph_autofusion.cost.profile import HardwareProfile
from graph_autofusion.report import progress

__all__ = [
    "NATIVE_OPS",
    "ROW_OPS",
    "SHORT_ROW",
    "THROUGHPUT_OPS",
    "THROUGHPUT_ROWS",
    "best_time",
    "calibrate_host",
    "copies_model",
    "core_count",
    "cpu_model_name",
    "measure_bandwidth",
    "measure_contraction_knee",
    "measure_dispatch_overhead",
    "measure_gemm_overlap",
    "measure_matmul",
    "measure_op_overheads",
    "measure_op_throughput",
    "measure_ort_peak",
    "ort_measure_session",
    "read_caches",
    "vector_width_bytes",
]


def calibrate_host(quick: bool = True) -> HardwareProfile:
    """Measure this machine and return its ``host`` profile (quick: a few seconds).

    Args:
        quick: smaller arrays, fewer sizes and repeats (a few seconds); otherwise about half a
            minute and a bf16 matmul where the CPU has bf16 instructions.
    """

    with progress.task("calibrate host", total=7) as tick:
        return _calibrate(quick, tick)


def _calibrate(quick: bool, tick: Callable[..., None]) -> HardwareProfile:
    t0 = time.perf_counter()
    bandwidth, bw_how = measure_bandwidth(quick)
    tick("memory bandwidth")
    ort_peak = measure_ort_peak(quick)
    if ort_peak is not None:
        peaks, peak_how = {"f32": round(ort_peak[0], 1)}, {"peak_gflops.f32": ort_peak[1]}
        peak_share = round(ort_peak[2], 2)
        if not quick:
            extra_peaks, extra_how = measure_matmul(quick, f32=False)
            peaks.update(extra_peaks)
            peak_how.update(extra_how)
    else:
        peaks, peak_how = measure_matmul(quick)
    tick("matmul peak")
    overhead, oh_how = measure_dispatch_overhead(quick)
    tick("dispatch overhead")
    per_op = measure_op_overheads(quick)
    tick("operator overheads")
    bw_samples = [bandwidth]
    if not quick:
        bw_samples.append(measure_bandwidth(quick)[0])
    knee = measure_contraction_knee(quick)
    tick("contraction knee")
    throughput = measure_op_throughput(quick)
    tick("operator throughput")
    if not quick:
        # three samples spread over the calibration, the median kept: this machine's 2-thread
        # triad has transient windows of ~12 s at ~1.7x its usual rate (docs/hardware.md)
        bw_samples.append(measure_bandwidth(quick)[0])
        bandwidth = float(np.median(bw_samples))
        span = time.perf_counter() - t0
        bw_how += (
            f"; the median of 3 such measurements over {span:.0f} s of calibration "
            f"({', '.join(f'{b:.1f}' for b in bw_samples)} GB/s)"
        )
    overlap = measure_gemm_overlap(float(peaks["f32"]), bandwidth, knee[0] if knee else None, quick)
    tick("compute/memory overlap")
    caches, cache_how = read_caches()
    width, width_how = vector_width_bytes()
    cores = core_count()
    l2 = caches.get("l2")
    local = l2 if l2 else 1024.0
    sources = {
        "memory_bandwidth_gbs": bw_how,
        **peak_how,
        "launch_overhead_us": oh_how,
        **({"op_overhead_us": per_op[1]} if per_op else {}),
        "local_memory_kb": (
            f"L2 per core from {cache_how}" if l2 else "default 1024 KiB: the OS reports no L2"
        ),
        "cores": "len(os.sched_getaffinity(0)): CPUs this process may run on",
        "vector_width_bytes": width_how,
    }
    extra: dict[str, float | str] = {
        "machine": platform.machine(),
        "processor": cpu_model_name() or platform.processor() or "unknown",
        "calibration": "quick" if quick else "full",
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "fingerprint": machine_fingerprint(),
    }
    if throughput is not None:
        extra["op_ns_per_element"] = throughput[0]
        extra["op_ns_per_element_curve"] = throughput[2]
        extra["op_ns_per_row"] = throughput[3]
        sources["extra.op_ns_per_element"] = throughput[1]
        for key in ("op_ns_per_element_curve", "op_ns_per_row"):
            sources[f"extra.{key}"] = "measured with extra.op_ns_per_element (see there)"
    if knee is not None:
        extra["contraction_half_time_us"] = knee[0]
        sources["extra.contraction_half_time_us"] = knee[1]
    if overlap is not None:
        extra["compute_memory_overlap"] = overlap[0]
        sources["extra.compute_memory_overlap"] = overlap[1]
    if ort_peak is not None:
        extra["peak_cpu_share"] = peak_share
        sources["extra.peak_cpu_share"] = (
            "CPU time / wall time of the best fp32 peak run (cores' worth of CPU it got; below "
            "the core count, other processes held part of the machine and the peak is low)"
        )
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
        op_overhead_us=per_op[0] if per_op else {},
    )
