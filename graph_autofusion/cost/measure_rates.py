"""Per-operator throughput on this machine (elements per ns by size, per row for the row
operators): the rates the cost model interpolates."""

from __future__ import annotations

import numpy as np

from graph_autofusion.cost.measure_host import best_time, core_count
from graph_autofusion.cost.measure_ort import copies_model, ort_measure_session
from graph_autofusion.cost.model import (
    ROW_CALIBRATION_LENGTH,
    interpolate_rate,
)

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

    Per operator and size: the faster of two passes over every operator (in opposite
    orders, so that a busy window of the machine hits one operator's two measurements
    apart) of the best-of-R time of 12 independent copies on a ``rows x 1024``
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
    cols = ROW_CALIBRATION_LENGTH
    try:
        import onnxruntime as ort
    except ImportError:
        return None

    copies = 12
    repeats = 7 if quick else 25
    tiny = _throughput_specs(2, 16)
    sized = {rows: _throughput_specs(rows, cols) for rows in THROUGHPUT_ROWS}
    short = _throughput_specs(512, SHORT_ROW)
    rates: dict[str, float] = {}
    curve: dict[str, list[list[float]]] = {}
    per_row: dict[str, float] = {}
    # two passes in opposite orders, each point the faster of the two: a best-of-R within one
    # pass does not survive a busy window that spans it (a cached calibration of 2026-12-04
    # had SkipSimplifiedLayerNormalization at 1.04 ns per element at 64 Ki elements, 0.53 in
    # two calibrations the next day, and the planner refused 7 of the zoo Llama's 8)
    for order in (THROUGHPUT_OPS, THROUGHPUT_OPS[::-1]):
        for op in order:
            got = _op_curve(op, tiny, sized, short, copies, repeats)
            if got is None:
                continue
            points, row = got
            if op in curve:
                points = [[n, min(ns, old)] for (n, ns), (_n, old) in zip(points, curve[op])]
            curve[op] = points
            rates[op] = points[-1][1]
            if row is not None:
                per_row[op] = min(row, per_row.get(op, row))
    sizes = ", ".join(f"{r}x{cols}" for r in THROUGHPUT_ROWS)
    return (
        rates,
        f"measured: onnxruntime {ort.__version__}, ORT_DISABLE_ALL, intra_op_num_threads="
        f"{core_count()}; per operator, the faster of two passes (in opposite orders) of "
        f"best-of-{repeats} time of {copies} copies on a float32 tensor of {sizes} minus {copies} copies on a 2x16 one, per copy and element "
        f"(op_ns_per_element: the largest size; op_ns_per_element_curve: every size); the "
        f"com.microsoft fused operators ({', '.join(NATIVE_OPS)}) alike; op_ns_per_row: "
        f"{', '.join(ROW_OPS)} on 512x{SHORT_ROW} less the curve's time for as many elements, "
        f"per row beyond {512 * SHORT_ROW // cols} rows of {cols}",
        curve,
        per_row,
    )


def _op_curve(
    op: str, tiny: dict, sized: dict, short: dict, copies: int, repeats: int
) -> tuple[list[list[float]], float | None] | None:
    """One operator's ``[elements, ns per element]`` points and its per-row cost (the
    :data:`ROW_OPS`; else ``None``), as :func:`measure_op_throughput` describes; ``None`` for
    a fused operator this onnxruntime build lacks."""
    cols = ROW_CALIBRATION_LENGTH
    feed = {"x": np.zeros(1, dtype=np.float32)}
    inputs, attrs = tiny[op]
    try:
        sess = ort_measure_session(copies_model(op, inputs, attrs, copies))
    except Exception:  # an onnxruntime build without this contrib operator
        if op in NATIVE_OPS:
            return None
        raise
    t_tiny = best_time(lambda sess=sess: sess.run(None, feed), repeats)
    points = []
    for rows in THROUGHPUT_ROWS:
        inputs, attrs = sized[rows][op]
        sess = ort_measure_session(copies_model(op, inputs, attrs, copies))
        t = best_time(lambda sess=sess: sess.run(None, feed), repeats)
        # elements as the cost model counts them (model._elements): a reduction's input,
        # every other operator's first output (half the input for Slice and Split here)
        n = rows * cols // (2 if op in _HALF_OUTPUT_OPS else 1)
        ns = max((t - t_tiny) / copies / n * 1e9, 0.001)
        points.append([n, round(ns, 4)])
    if op not in ROW_OPS:
        return points, None
    inputs, attrs = short[op]
    sess = ort_measure_session(copies_model(op, inputs, attrs, copies))
    t = best_time(lambda sess=sess: sess.run(None, feed), repeats)
    n = 512 * SHORT_ROW
    t_curve = n * interpolate_rate(points, n) * 1e-9
    beyond = 512 - n / cols
    return points, round(max(((t - t_tiny) / copies - t_curve) / beyond * 1e9, 0.0), 3)
