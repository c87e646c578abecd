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

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from graph_autofusion.cost.hardware import HardwareProfile
from graph_autofusion.cost.model import (
    CONTRACTION_HALF_TIME_S,
    CONTRACTION_MAX_EFFICIENCY,
    interpolate_rate,
)
from graph_autofusion.cost.model import ROW_CALIBRATION_LENGTH as cols
from graph_autofusion.report import progress

__all__ = [
    "calibrate_host",
    "measure_bandwidth",
    "measure_contraction_knee",
    "measure_gemm_overlap",
    "measure_dispatch_overhead",
    "measure_matmul",
    "measure_op_overheads",
    "measure_ort_peak",
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


def measure_matmul(quick: bool = True, f32: bool = True) -> tuple[dict[str, float], dict[str, str]]:
    """Best matmul GFLOP/s per dtype (NumPy / PyTorch) and how each was measured.

    With ``f32=False`` only the other dtypes (``bf16``, full mode) are measured: the fp32 peak
    then comes from :func:`measure_ort_peak`.
    """
    sizes = (512, 1024, 1536) if quick else (1024, 2048, 4096)
    repeats = 3 if quick else 5
    peaks: dict[str, float] = {}
    how: dict[str, str] = {}
    best, where = 0.0, ""
    rng = np.random.default_rng(0)
    for n in sizes if f32 else ():
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
            for n in sizes if f32 else ():
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
    if not f32:
        return peaks, how
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
    from graph_autofusion.runtime.ort_session import ort_session

    feed = {"x": np.zeros(16, dtype=np.float32)}
    times = {}
    for n in (1, chain):  # onnxruntime's spinning workers, as deployed
        sess = ort_session(_ort_chain(n), "disable", _cores(), spinning=True)
        times[n] = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
    slope = max((times[chain] - times[1]) / (chain - 1), 1e-9)
    return slope * 1e6, (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={_cores()}; best-of-{repeats} run time of a chain of {chain} "
        f"16-element Add nodes minus a chain of 1, divided by {chain - 1}"
    )


def _ort_session(model: bytes, threads: int | None = None):
    from graph_autofusion.runtime.ort_session import ort_session

    # onnxruntime's spinning workers, as deployed
    return ort_session(model, "disable", threads or _cores(), spinning=True)


def _single_node_model(op: str, x_shape, w: np.ndarray, attrs: dict, out_shape) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        f"peak_{op}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def measure_ort_peak(quick: bool = True) -> tuple[float, str, float] | None:
    """Best fp32 GFLOP/s onnxruntime reaches on large contractions, how it was measured, and
    the CPU share (cores' worth of CPU time) the best run got; ``None`` without onnxruntime.

    Quick: a 1024^3 ``MatMul``; full: a 2048^3 ``MatMul`` and a ResNet-style ``Conv``
    (1x256x56x56 input, 256 3x3 filters, pad 1). ``ORT_DISABLE_ALL``,
    ``intra_op_num_threads`` = cores, best of several runs, ``2 x MACs`` flops.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    repeats = 5 if quick else 8
    attempts = 3 if quick else 6
    cases: list[tuple[str, bytes, np.ndarray, float]] = []
    n = 1024 if quick else 2048
    w = rng.standard_normal((n, n), dtype=np.float32)
    x = rng.standard_normal((n, n), dtype=np.float32)
    cases.append(
        (f"MatMul {n}x{n}x{n}", _single_node_model("MatMul", x.shape, w, {}, (n, n)), x, 2 * n**3)
    )
    if not quick:
        c, hw_, k = 256, 56, 256
        wc = rng.standard_normal((k, c, 3, 3), dtype=np.float32) * 0.05
        xc = rng.standard_normal((1, c, hw_, hw_), dtype=np.float32)
        model = _single_node_model(
            "Conv", xc.shape, wc, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1, k, hw_, hw_)
        )
        cases.append((f"Conv 1x{c}x{hw_}x{hw_} * {k}x{c}x3x3", model, xc, 2 * k * c * 9 * hw_**2))
    # On a shared machine another process may hold a core: ORT's threads then run at about
    # 1/cores of the speed. Each run's CPU share (process CPU time / wall time) tells; rounds
    # are repeated (a short pause between) until the best run had nearly all cores.
    found: dict[str, tuple[float, float]] = {}
    sessions = [(what, _ort_session(model), feed, flops) for what, model, feed, flops in cases]
    rounds = 0
    while rounds < attempts:
        rounds += 1
        for what, sess, feed, flops in sessions:
            sess.run(None, {"x": feed})
            for _ in range(repeats):
                w0, c0 = time.perf_counter(), time.process_time()
                sess.run(None, {"x": feed})
                wall = time.perf_counter() - w0
                rate = flops / wall / 1e9
                if rate > found.get(what, (0.0, 0.0))[0]:
                    found[what] = (rate, (time.process_time() - c0) / wall)
        if max(sh for _, sh in found.values()) >= 0.8 * _cores():
            break
        time.sleep(1.0)
    del sessions
    how, (best, share) = max(found.items(), key=lambda kv: kv[1][0])
    others = "; ".join(f"{k} {v[0]:.1f}" for k, v in found.items() if k != how)
    how = (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={_cores()}, best of {repeats} runs x {rounds} round(s); best "
        f"was fp32 {how} (2 x MACs flops) at a CPU share of {share:.2f} of {_cores()} cores"
        f"{'; also ' + others + ' GFLOP/s' if others else ''}"
    )
    return best, how, share


def _overhead_specs() -> dict[str, tuple[list[np.ndarray], dict]]:
    """Operator type -> (inputs, attributes): one tiny instance of each, shaped like the
    shape-plumbing and small elementwise work of exported transformer graphs."""
    from onnx import TensorProto

    f32, i64 = np.float32, np.int64
    x3 = np.ones((1, 16, 64), f32)
    v16 = np.ones(16, f32)
    dims = np.array([1, 16, 64], i64)
    return {
        "Shape": ([x3], {}),
        "Gather": ([dims, np.array(1, i64)], {"axis": 0}),
        "Concat": ([np.array([1], i64)] * 3, {"axis": 0}),
        "Unsqueeze": ([np.array(16, i64), np.array([0], i64)], {}),
        "Squeeze": ([np.ones((1, 16), f32), np.array([0], i64)], {}),
        "Reshape": ([x3, np.array([1, 16, 8, 8], i64)], {}),
        "Flatten": ([np.ones((1, 4, 4), f32)], {"axis": 1}),
        "Identity": ([v16], {}),
        "Slice": ([x3, *(np.array([v], i64) for v in (0, 8, 1, 1))], {}),
        "Cast": ([dims], {"to": TensorProto.FLOAT}),
        "Add": ([v16, v16], {}),
        "Sub": ([v16, v16], {}),
        "Mul": ([v16, v16], {}),
        "Div": ([v16, v16], {}),
        "Pow": ([v16, np.array(2.0, f32)], {}),
        "Sqrt": ([v16], {}),
        "Reciprocal": ([v16], {}),
        "Neg": ([v16], {}),
        "Tanh": ([v16], {}),
        "Sigmoid": ([v16], {}),
        "Erf": ([v16], {}),
        "Relu": ([v16], {}),
        "Sin": ([v16], {}),
        "Max": ([v16, v16], {}),
        "Where": ([np.ones(16, bool), v16, v16], {}),
        "Equal": ([dims, dims], {}),
        "Less": ([dims, dims], {}),
        "And": ([np.ones(16, bool)] * 2, {}),
        "IsNaN": ([v16], {}),
        "Expand": ([np.ones((1, 16), f32), np.array([4, 16], i64)], {}),
        "Transpose": ([np.ones((1, 4, 4, 4), f32)], {"perm": [0, 2, 1, 3]}),
        "Softmax": ([np.ones((1, 16), f32)], {"axis": -1}),
        "ReduceMean": ([np.ones((4, 16), f32), np.array([-1], i64)], {"keepdims": 1}),
        "ReduceSum": ([np.ones((4, 16), f32), np.array([-1], i64)], {"keepdims": 1}),
        "MatMul": ([np.ones((4, 4), f32)] * 2, {}),
        "Gemm": ([np.ones((4, 4), f32)] * 3, {}),
        "Range": ([np.array(v, i64) for v in (0, 16, 1)], {}),
        "ConstantOfShape": ([np.array([16], i64)], {}),
        "Split": ([np.ones((1, 16), f32), np.array([8, 8], i64)], {"axis": 1, "_outputs": 2}),
        "Sum": ([v16, v16], {}),
    }


def _copies_model(op: str, inputs: list[np.ndarray], attrs: dict, copies: int) -> bytes:
    """``copies`` independent ``op`` nodes on the same constant inputs (ORT runs every node,
    used or not), plus an ``Identity`` carrying the graph's input to its output."""
    from onnx import TensorProto, helper, numpy_helper

    attrs = dict(attrs)
    n_out = attrs.pop("_outputs", 1)
    domain = attrs.pop("_domain", "")
    names = [f"c{j}" for j in range(len(inputs))]
    inits = [numpy_helper.from_array(np.asarray(a), nm) for nm, a in zip(names, inputs)]
    nodes = [
        helper.make_node(
            op, names, [f"y{i}_{j}" for j in range(n_out)], name=f"n{i}", domain=domain, **attrs
        )
        for i in range(copies)
    ]
    nodes.append(helper.make_node("Identity", ["x"], ["out"], name="keep"))
    graph = helper.make_graph(
        nodes,
        f"overhead_{op}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])],
        inits,
    )
    opsets = [helper.make_opsetid("", 18)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def measure_op_overheads(quick: bool = True) -> tuple[dict[str, float], str] | None:
    """Dispatch overhead per operator type in onnxruntime, microseconds (``None`` without ORT).

    For each operator of :func:`_overhead_specs`: best-of-R run time of a graph of N copies of
    the node on tiny tensors minus a graph of 8 copies, divided by N - 8. Unprofiled,
    ``ORT_DISABLE_ALL``, sequential, ``intra_op_num_threads`` = cores.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    copies = 150 if quick else 400
    base = 8
    repeats = 15 if quick else 60
    feed = {"x": np.zeros(1, dtype=np.float32)}
    out: dict[str, float] = {}
    for op, (inputs, attrs) in _overhead_specs().items():
        times = {}
        for n in (base, copies):
            sess = _ort_session(_copies_model(op, inputs, attrs, n))
            times[n] = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
        out[op] = round(max((times[copies] - times[base]) / (copies - base) * 1e6, 0.001), 3)
    return out, (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={_cores()}, profiling off; per operator type, best-of-{repeats} "
        f"run time of {copies} independent copies of one node on tiny tensors (16-element "
        f"vectors, 3-element shapes, a 1x16x64 tensor) minus {base} copies, per copy"
    )


def measure_contraction_knee(quick: bool = True) -> tuple[float, str] | None:
    """The GEMM efficiency curve's knee in onnxruntime, microseconds (``None`` without ORT).

    What one more small GEMM costs beyond its flops, without the per-node dispatch: a batched
    ``MatMul`` runs one GEMM per batch item, so the per-copy time of ``[32,16,16] x [32,16,16]``
    minus that of ``[1,16,16] x [1,16,16]`` (many independent copies in one graph, best of R),
    divided by 31, is one 16^3 GEMM's cost ``c``; its flops' share at the rate of a line fit
    over unbatched 32^3 to 64^3 ``MatMul`` copies is subtracted. In the cost model's curve a
    GEMM costs ``F / (0.9 peak) + h / 0.9``, so ``h = 0.9 x (c - F / rate)`` (at least
    0.01 us).
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    feed = {"x": np.zeros(1, dtype=np.float32)}
    repeats = 10 if quick else 30
    copies = 100 if quick else 200

    def per_copy(a: np.ndarray) -> float:
        times = {}
        for c in (4, copies):
            sess = _ort_session(_copies_model("MatMul", [a, a], {}, c))
            times[c] = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
        return (times[copies] - times[4]) / (copies - 4)

    sizes = (32, 48, 64)
    flops = [2.0 * n**3 for n in sizes]
    line = [per_copy(rng.standard_normal((n, n), dtype=np.float32)) for n in sizes]
    slope = max(float(np.polyfit(flops, line, 1)[0]), 1e-15)
    batch, n = 32, 16
    one = per_copy(rng.standard_normal((1, n, n), dtype=np.float32))
    many = per_copy(rng.standard_normal((batch, n, n), dtype=np.float32))
    item = (many - one) / (batch - 1)
    fixed_us = (item - 2.0 * n**3 * slope) * 1e6
    half_us = round(max(0.9 * fixed_us, 0.01), 3)
    pts = ", ".join(f"{m}^3 {t * 1e6:.2f}" for m, t in zip(sizes, line))
    return half_us, (
        f"measured: onnxruntime {ort.__version__}, ORT_DISABLE_ALL, intra_op_num_threads="
        f"{_cores()}, per-copy times (independent copies, best of {repeats}): batched MatMul "
        f"[{batch},{n},{n}]^2 {many * 1e6:.2f} us vs [1,{n},{n}]^2 {one * 1e6:.2f} us -> "
        f"{item * 1e6:.3f} us per {n}^3 GEMM, of which {fixed_us:.3f} us beyond its flops at "
        f"{1e-9 / slope:.0f} GFLOP/s (line over unbatched {pts} us); knee = 0.9 x that"
    )


def measure_gemm_overlap(
    peak_gflops: float, bandwidth_gbs: float, half_time_us: float | None, quick: bool = True
) -> tuple[float, str] | None:
    """How far onnxruntime's GEMM hides weight streaming behind compute, in [0, 1].

    A ``[16, 2048] x [2048, 8192]`` ``MatMul`` with a 64 MiB weight (beyond the last-level
    cache; about as long to stream as to compute here) is timed (best of R); with the
    cost model's compute time ``c = F / (0.9 peak) + h / 0.9`` and memory time
    ``m = bytes / bandwidth`` from the other calibrated numbers, the measured time
    ``t = max(c, m) + (1 - overlap) x min(c, m)`` gives ``overlap``. ``None`` without ORT.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None

    rng = np.random.default_rng(0)
    m_, k_, n_ = 16, 2048, 8192
    w = rng.standard_normal((k_, n_), dtype=np.float32)
    x = rng.standard_normal((m_, k_), dtype=np.float32)
    sess = _ort_session(_single_node_model("MatMul", x.shape, w, {}, (m_, n_)))
    repeats = 5 if quick else 10
    t = _best_time(lambda: sess.run(None, {"x": x}), repeats)
    flops = 2.0 * m_ * k_ * n_
    half = CONTRACTION_HALF_TIME_S if half_time_us is None else half_time_us * 1e-6
    compute = flops / (CONTRACTION_MAX_EFFICIENCY * peak_gflops * 1e9) + (
        half / CONTRACTION_MAX_EFFICIENCY
    )
    memory = (w.nbytes + x.nbytes + m_ * n_ * 4) / (bandwidth_gbs * 1e9)
    overlap = (compute + memory - t) / min(compute, memory)
    overlap = round(min(max(overlap, 0.0), 1.0), 3)
    return overlap, (
        f"measured: onnxruntime {ort.__version__}, ORT_DISABLE_ALL, intra_op_num_threads="
        f"{_cores()}: MatMul [{m_},{k_}] x [{k_},{n_}] (64 MiB weight) best of {repeats} "
        f"{t * 1e6:.0f} us vs compute {compute * 1e6:.0f} us (calibrated peak) and memory "
        f"{memory * 1e6:.0f} us (calibrated bandwidth): overlap = (c + m - t) / min(c, m), "
        f"clamped to [0, 1]"
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


#: Operators whose per-element compute cost is measured (the roofline's single FLOP rate
#: prices Sin, Erf or Softmax like Add; onnxruntime's kernels differ several-fold).
_BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal")
_UNARY_OPS = ("Sqrt", "Reciprocal", "Neg", "Tanh", "Sigmoid", "Erf", "Relu", "Sin", "Cos", "Exp")
_UNARY_OPS += ("Log", "IsNaN")
_OTHER_OPS = ("Pow", "Where", "Cast", "Softmax", "ReduceMean", "ReduceSum", "ReduceMax")
_OTHER_OPS += ("LayerNormalization", "Transpose", "Expand", "Concat", "Gather", "Slice", "Split")
#: onnxruntime's fused (``com.microsoft``) operators the native rewrites emit: their measured
#: rate prices a fused candidate whose rule lowers to them (a fused kernel is not always faster
#: than its pieces: onnxruntime 1.32's CPU SkipLayerNormalization is several times slower than
#: Add + Add + LayerNormalization).
NATIVE_OPS = (
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "QuickGelu",
)
THROUGHPUT_OPS = (*_BINARY_OPS, *_UNARY_OPS, *_OTHER_OPS, *NATIVE_OPS)


def _throughput_specs(rows: int, cols: int) -> dict[str, tuple[list[np.ndarray], dict]]:
    """One instance per operator of :data:`THROUGHPUT_OPS` on a ``rows x cols`` float tensor."""
    from onnx import TensorProto

    f32, i64 = np.float32, np.int64
    rng = np.random.default_rng(0)
    x = (rng.random((rows, cols), dtype=f32) + 0.5).astype(f32)
    y = (rng.random((rows, cols), dtype=f32) + 0.5).astype(f32)
    last = np.array([-1], i64)
    specs: dict[str, tuple[list[np.ndarray], dict]] = {}
    for op in _BINARY_OPS:
        specs[op] = ([x, y], {})
    for op in _UNARY_OPS:
        specs[op] = ([x], {})
    specs["Pow"] = ([x, np.array(2.0, f32)], {})
    specs["Where"] = ([x > 1.0, x, y], {})
    specs["Cast"] = ([x], {"to": TensorProto.FLOAT16})
    specs["Softmax"] = ([x], {"axis": -1})
    for op in ("ReduceMean", "ReduceSum"):
        specs[op] = ([x, last], {"keepdims": 1})
    specs["ReduceMax"] = ([x, last], {"keepdims": 1})
    specs["LayerNormalization"] = ([x, np.ones(cols, f32), np.zeros(cols, f32)], {"axis": -1})
    specs["Transpose"] = ([x], {"perm": [1, 0]})
    specs["Expand"] = ([x[:1], np.array([rows, cols], i64)], {})
    specs["Concat"] = ([x[: rows // 2], x[rows // 2 :]], {"axis": 0})
    specs["Gather"] = ([x, np.arange(rows, dtype=i64)], {"axis": 0})
    specs["Slice"] = ([x, *(np.array([v], i64) for v in (0, cols // 2, 1, 1))], {})
    specs["Split"] = ([x, np.array([cols // 2, cols // 2], i64)], {"axis": 1, "_outputs": 2})
    ms = {"_domain": "com.microsoft"}
    vec = np.full(cols, 0.5, f32)
    specs["SkipLayerNormalization"] = ([x, y, vec, vec, vec], {**ms, "epsilon": 1e-5})
    specs["SkipSimplifiedLayerNormalization"] = ([x, y, vec], {**ms, "epsilon": 1e-5})
    specs["BiasGelu"] = ([x, vec], ms)
    specs["FastGelu"] = ([x], ms)
    specs["Gelu"] = ([x], ms)
    specs["QuickGelu"] = ([x], {**ms, "alpha": 1.702})
    return specs


ROW_OPS = (
    "Softmax",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "LayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
)
"""Row-wise operators (they work along the last axis): besides the per-element curve on
1024-long rows, calibration measures what each further row costs (``extra.op_ns_per_row``)."""

SHORT_ROW = 16
"""Row length of the per-row measurement (512 rows x 16: attention's softmax over 16 keys)."""

_HALF_OUTPUT_OPS = ("Slice", "Split")
"""Throughput specs whose (first) output holds half the input's elements."""

THROUGHPUT_ROWS = (2, 4, 16, 32, 64)
"""Row counts of the ``rows x 1024`` float32 inputs each operator's rate is measured on (2 Ki
to 64 Ki elements: below, inside and above onnxruntime's threading cut-offs)."""


def measure_op_throughput(
    quick: bool = True,
) -> tuple[dict[str, float], str, dict[str, list[list[float]]], dict[str, float]] | None:
    """Compute cost per output element of each operator type in onnxruntime, nanoseconds.

    Per operator and size: best-of-R time of 12 independent copies on a ``rows x 1024``
    float32 tensor (``rows`` in :data:`THROUGHPUT_ROWS`, 8 KiB to 256 KiB, cache resident, so
    the rate is the kernel's and not DRAM's) minus 12 copies on a 2 x 16 tensor (the dispatch
    part), per copy and element as the cost model counts them (a reduction's input elements,
    every other operator's first output: half the input for ``Slice`` and ``Split`` here).

    Returns ``(rate at 64 Ki elements, how, curve, per_row)``: ``curve[op]`` lists
    ``[elements, ns per element]`` at every size; ``per_row[op]`` (the :data:`ROW_OPS`) is
    what one more row costs beyond the curve: the time on 512 rows of 16 elements less the
    curve's time for 8 Ki elements, per row beyond the curve's 8 rows of 1024 (a softmax over
    16 keys pays ~8 ns per row that the per-element rate on 1024-long rows does not show).

    The rate is not constant: onnxruntime runs a small tensor on one thread and splits a large
    one over the pool (``Sigmoid`` here: ~0.23 ns up to 16-32 Ki elements, 0.13 at 64 Ki), and
    some kernels change algorithm with size (``Where``: 0.6 ns at 2-4 Ki, 6-7 ns at 64 Ki); the
    cost model interpolates the curve
    (:func:`graph_autofusion.cost.model.element_rate_ns`).
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None

    copies = 12
    repeats = 7 if quick else 25
    feed = {"x": np.zeros(1, dtype=np.float32)}
    tiny = _throughput_specs(2, 16)
    sized = {rows: _throughput_specs(rows, cols) for rows in THROUGHPUT_ROWS}
    short = _throughput_specs(512, SHORT_ROW)
    rates: dict[str, float] = {}
    curve: dict[str, list[list[float]]] = {}
    per_row: dict[str, float] = {}
    for op in THROUGHPUT_OPS:
        inputs, attrs = tiny[op]
        try:
            sess = _ort_session(_copies_model(op, inputs, attrs, copies))
        except Exception:  # an onnxruntime build without this contrib operator
            if op in NATIVE_OPS:
                continue
            raise
        t_tiny = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
        points = []
        for rows in THROUGHPUT_ROWS:
            inputs, attrs = sized[rows][op]
            sess = _ort_session(_copies_model(op, inputs, attrs, copies))
            t = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
            # elements as the cost model counts them (model._elements): a reduction's input,
            # every other operator's first output (half the input for Slice and Split here)
            n = rows * cols // (2 if op in _HALF_OUTPUT_OPS else 1)
            ns = max((t - t_tiny) / copies / n * 1e9, 0.001)
            points.append([n, round(ns, 4)])
        curve[op] = points
        rates[op] = points[-1][1]
        if op in ROW_OPS:
            inputs, attrs = short[op]
            sess = _ort_session(_copies_model(op, inputs, attrs, copies))
            t = _best_time(lambda sess=sess: sess.run(None, feed), repeats)
            n = 512 * SHORT_ROW
            t_curve = n * interpolate_rate(points, n) * 1e-9
            beyond = 512 - n / cols
            per_row[op] = round(max(((t - t_tiny) / copies - t_curve) / beyond * 1e9, 0.0), 3)
    sizes = ", ".join(f"{r}x{cols}" for r in THROUGHPUT_ROWS)
    return (
        rates,
        f"measured: onnxruntime {ort.__version__}, ORT_DISABLE_ALL, intra_op_num_threads="
        f"{_cores()}; per operator, best-of-{repeats} time of {copies} copies on a float32 "
        f"tensor of {sizes} minus {copies} copies on a 2x16 one, per copy and element "
        f"(op_ns_per_element: the largest size; op_ns_per_element_curve: every size); the "
        f"com.microsoft fused operators ({', '.join(NATIVE_OPS)}) alike; op_ns_per_row: "
        f"{', '.join(ROW_OPS)} on 512x{SHORT_ROW} less the curve's time for as many elements, "
        f"per row beyond {512 * SHORT_ROW // cols} rows of {cols}",
        curve,
        per_row,
    )


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
    cores = _cores()
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
        "processor": _cpu_model() or platform.processor() or "unknown",
        "calibration": "quick" if quick else "full",
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[-1].strip()
    return ""
