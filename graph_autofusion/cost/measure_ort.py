"""The host profile's measurements through onnxruntime: dispatch overhead, the contraction
peak, per-operator overheads, the contraction knee and the GEMM/memory overlap."""

from __future__ import annotations

import time

import numpy as np

from graph_autofusion.cost.measure_host import best_time, core_count
from graph_autofusion.cost.model import (
    CONTRACTION_HALF_TIME_S,
    CONTRACTION_MAX_EFFICIENCY,
)
from graph_autofusion.runtime.ort_core import open_session


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
        t = best_time(lambda: [np.add(x, x) for _ in range(calls)], 5) / calls
        return t * 1e6, (
            "measured: NumPy per-call cost of a 16-element add (onnxruntime not installed)"
        )
    feed = {"x": np.zeros(16, dtype=np.float32)}
    times = {}
    for n in (1, chain):  # onnxruntime's spinning workers, as deployed
        sess = open_session(_ort_chain(n), "disable", core_count(), spinning=True)
        times[n] = best_time(lambda sess=sess: sess.run(None, feed), repeats)
    slope = max((times[chain] - times[1]) / (chain - 1), 1e-9)
    return slope * 1e6, (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={core_count()}; best-of-{repeats} run time of a chain of {chain} "
        f"16-element Add nodes minus a chain of 1, divided by {chain - 1}"
    )


def ort_measure_session(model: bytes, threads: int | None = None):
    # onnxruntime's spinning workers, as deployed
    return open_session(model, "disable", threads or core_count(), spinning=True)


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
    sessions = [
        (what, ort_measure_session(model), feed, flops) for what, model, feed, flops in cases
    ]
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
                    # The process clock adds a thread running on another CPU only up to its
                    # last scheduler tick, so one run's CPU time may include part of the time
                    # before it: a 20 ms run read 2.61 cores on a 2-core machine. Capped.
                    share = (time.process_time() - c0) / wall
                    found[what] = (rate, min(share, float(core_count())))
        if max(sh for _, sh in found.values()) >= 0.8 * core_count():
            break
        time.sleep(1.0)
    del sessions
    how, (best, share) = max(found.items(), key=lambda kv: kv[1][0])
    others = "; ".join(f"{k} {v[0]:.1f}" for k, v in found.items() if k != how)
    how = (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={core_count()}, best of {repeats} runs x {rounds} round(s); best "
        f"was fp32 {how} (2 x MACs flops) at a CPU share of {share:.2f} of {core_count()} cores"
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


def copies_model(op: str, inputs: list[np.ndarray], attrs: dict, copies: int) -> bytes:
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
            sess = ort_measure_session(copies_model(op, inputs, attrs, n))
            times[n] = best_time(lambda sess=sess: sess.run(None, feed), repeats)
        out[op] = round(max((times[copies] - times[base]) / (copies - base) * 1e6, 0.001), 3)
    return out, (
        f"measured: onnxruntime {ort.__version__} CPUExecutionProvider, ORT_DISABLE_ALL, "
        f"intra_op_num_threads={core_count()}, profiling off; per operator type, best-of-{repeats} "
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
            sess = ort_measure_session(copies_model("MatMul", [a, a], {}, c))
            times[c] = best_time(lambda sess=sess: sess.run(None, feed), repeats)
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
        f"{core_count()}, per-copy times (independent copies, best of {repeats}): batched MatMul "
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
    sess = ort_measure_session(_single_node_model("MatMul", x.shape, w, {}, (m_, n_)))
    repeats = 5 if quick else 10
    t = best_time(lambda: sess.run(None, {"x": x}), repeats)
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
        f"{core_count()}: MatMul [{m_},{k_}] x [{k_},{n_}] (64 MiB weight) best of {repeats} "
        f"{t * 1e6:.0f} us vs compute {compute * 1e6:.0f} us (calibrated peak) and memory "
        f"{memory * 1e6:.0f} us (calibrated bandwidth): overlap = (c + m - t) / min(c, m), "
        f"clamped to [0, 1]"
    )
