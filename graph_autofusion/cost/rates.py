"""How long compute and memory take on a hardware profile: the operator classes, contraction
efficiency, the roofline, dispatch overhead, and the measured per-element and per-row rates
(:mod:`graph_autofusion.cost.model` prices operators and groups with them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graph_autofusion.cost.tiling import reduced_axes
from graph_autofusion.ir.core import Node

#: Operators that alias their input (no data moved) or only read metadata.
VIEW_OPS = frozenset(
    {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Dropout"}
)


#: Operators that are not kernels at run time (turned into initializers at load).
FREE_OPS = frozenset({"Constant"})


#: Operators that read only the elements they return from their first input.
GATHER_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Slice"})


CONTRACTION_OPS = frozenset(
    {
        "MatMul",
        "FusedMatMul",
        "Gemm",
        "FusedGemm",
        "Conv",
        "FusedConv",
        "ConvTranspose",
        "LSTM",
        "GRU",
        "RNN",
        "MatMulInteger",
        "Attention",
        "MultiHeadAttention",
    }
)


CONTRACTION_MAX_EFFICIENCY = 0.9


CONTRACTION_HALF_TIME_S = 4e-6


VECTOR_EFFICIENCY = 0.1


def to_us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def dtype_key(node: Node) -> str:
    for v in (*node.inputs, *node.outputs):
        if v is not None and v.dtype is not None and v.dtype.is_float:
            return v.dtype.short
    return "f32"


def contraction_efficiency(
    flops: float, peak_flops_per_s: float, half_time_s: float | None = None
) -> float:
    """Fraction of peak one GEMM of ``flops`` reaches (see the module docstring).

    ``half_time_s``: the knee (default :data:`CONTRACTION_HALF_TIME_S`; a calibrated host
    profile measures its own, :func:`contraction_half_time_s`).
    """
    half = CONTRACTION_HALF_TIME_S if half_time_s is None else half_time_s
    f_half = peak_flops_per_s * half
    return CONTRACTION_MAX_EFFICIENCY * flops / (flops + f_half) if flops > 0 else 1.0


def contraction_half_time_s(profile: Any) -> float:
    """The efficiency curve's knee on ``profile``: its measured
    ``extra.contraction_half_time_us`` (host calibration) when present, else
    :data:`CONTRACTION_HALF_TIME_S`."""
    us = (getattr(profile, "extra", None) or {}).get("contraction_half_time_us")
    if isinstance(us, (int, float)) and not isinstance(us, bool) and us > 0:
        return float(us) * 1e-6
    return CONTRACTION_HALF_TIME_S


def gemm_count(node: Node) -> int:
    """How many separate GEMMs one contraction kernel runs: a batched ``MatMul`` one per
    batch item (the broadcast leading dims of its output), a ``Conv`` one per image and group,
    a recurrent cell one per time step and direction; otherwise 1."""
    op = node.op_type
    out = node.outputs[0] if node.outputs else None
    shape = out.shape if out is not None else None
    if shape is None or any(not isinstance(d, int) for d in shape):
        return 1
    if op in ("MatMul", "FusedMatMul", "MatMulInteger") and len(shape) > 2:
        return max(1, prod_of(shape[:-2]))
    if op in ("Conv", "FusedConv", "ConvTranspose") and shape:
        return max(1, int(shape[0]) * int(node.attr("group") or 1))
    if op in ("LSTM", "GRU", "RNN") and len(shape) >= 2:
        x = node.inputs[0] if node.inputs else None
        steps = x.shape[0] if x is not None and x.shape and isinstance(x.shape[0], int) else 1
        return max(1, int(steps) * int(shape[1]))
    return 1


def prod_of(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def compute_time(
    flops: int,
    contraction_flops: int,
    peak: float,
    gemms: int = 1,
    half_time_s: float | None = None,
) -> float:
    t = 0.0
    if contraction_flops:
        per_gemm = contraction_flops / max(gemms, 1)
        eff = contraction_efficiency(per_gemm, peak, half_time_s)
        t += contraction_flops / (peak * eff)
    rest = flops - contraction_flops
    if rest > 0:
        t += rest / (peak * VECTOR_EFFICIENCY)
    return t


def compute_memory_overlap(profile: Any) -> float:
    """How far a kernel's compute hides its memory traffic on ``profile``, in [0, 1]: the
    measured ``extra.compute_memory_overlap`` (host calibration), else 1 (perfect overlap,
    the plain roofline)."""
    v = (getattr(profile, "extra", None) or {}).get("compute_memory_overlap")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 <= v <= 1.0:
        return float(v)
    return 1.0


def roofline_time(compute: float, memory: float, profile: Any) -> float:
    """``max(compute, memory) + (1 - overlap) x min(compute, memory)``: the roofline when
    compute and memory traffic overlap fully (``overlap`` 1, every shipped profile), their
    sum when they do not (see :func:`compute_memory_overlap`)."""
    overlap = compute_memory_overlap(profile)
    return max(compute, memory) + (1.0 - overlap) * min(compute, memory)


def dispatch_overhead_s(profile: Any, op_type: str | None = None) -> float:
    """Fixed cost of dispatching one ``op_type`` kernel on ``profile``, seconds.

    The profile's measured per-type entry (``op_overhead_us``, host calibration) when it has
    one for ``op_type``, else its ``launch_overhead_us``. A fused kernel (``op_type`` None)
    pays ``launch_overhead_us``.
    """
    table = getattr(profile, "op_overhead_us", None) or {}
    us = table.get(op_type) if op_type else None
    if us is None:
        return profile.launch_overhead_s()
    return float(us) * 1e-6


def _elements(node: Node) -> int | None:
    """Elements a kernel computes: its output's, or a reduction's input's (the per-element
    rates are calibrated per output element, per input element for reductions)."""
    if node.op_type.startswith("Reduce") and node.inputs and node.inputs[0] is not None:
        return node.inputs[0].numel()
    return node.outputs[0].numel() if node.outputs else None


ROW_CALIBRATION_LENGTH = 1024


def interpolate_rate(points: Sequence[Sequence[float]], elements: float) -> float:
    """ns per element at ``elements`` from ``[elements, ns]`` pairs (elements increasing): the
    time ``elements x ns`` interpolated linearly between the two sizes around it, the nearest
    end's rate outside them."""
    if elements <= points[0][0]:
        return float(points[0][1])
    if elements >= points[-1][0]:
        return float(points[-1][1])
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        if n0 <= elements <= n1:
            t0, t1 = n0 * r0, n1 * r1
            return (t0 + (t1 - t0) * (elements - n0) / (n1 - n0)) / elements
    return float(points[-1][1])  # unreachable for increasing sizes


def element_rate_ns(profile: Any, op_type: str | None, elements: int | None = None) -> float | None:
    """The profile's calibrated compute cost per element of ``op_type`` (ns), at ``elements``.

    With a measured size curve (``extra.op_ns_per_element_curve[op_type]``: ``[elements, ns]``
    pairs, host calibration) and a known size, :func:`interpolate_rate` on it: the runtime
    runs small tensors on one thread and splits large ones over its pool, so the rate changes
    with size. Otherwise the flat ``extra.op_ns_per_element[op_type]``. ``None`` when the
    profile has neither, or for a contraction (the roofline prices those). Without a size, the
    flat rate, else the curve's rate at its largest size.
    """
    if not op_type or op_type in CONTRACTION_OPS:
        return None
    extra = getattr(profile, "extra", None) or {}
    points = (extra.get("op_ns_per_element_curve") or {}).get(op_type)
    if points and elements is not None and elements > 0:
        return interpolate_rate(points, elements)
    ns = (extra.get("op_ns_per_element") or {}).get(op_type)
    if ns is None and points:
        return float(points[-1][1])  # no size known: the rate at the largest measured size
    return None if ns is None else float(ns)


def rows_beyond(elements: int, row: int) -> float:
    """Rows of ``row`` elements in ``elements`` beyond the ``elements / 1024`` rows the
    per-element curve's calibration tensors had (0 for rows of 1024 or longer: the curve's
    own per-row share then slightly overprices them)."""
    if row <= 0 or elements <= 0:
        return 0.0
    return max(elements / row - elements / ROW_CALIBRATION_LENGTH, 0.0)


def per_row_ns(profile: Any, op_type: str | None) -> float:
    table = (getattr(profile, "extra", None) or {}).get("op_ns_per_row") or {}
    return float(table.get(op_type) or 0.0) if op_type else 0.0


def row_time_s(node: Node, profile: Any) -> float:
    """What a row-wise node's rows cost beyond the per-element curve, seconds.

    A node that works along trailing axes (softmax, layer norm, a reduction over the last
    axes) pays the profile's ``extra.op_ns_per_row[op_type]`` for each row beyond the
    ``elements / 1024`` rows the curve's calibration tensors had: short rows cost more per
    element than the 1024-long ones the curve was measured on. 0 without an entry, when the
    reduced axes are not the trailing ones, or when they are only known at run time.
    """
    ns = per_row_ns(profile, node.op_type)
    if not ns or not node.inputs or node.inputs[0] is None:
        return 0.0
    x = node.inputs[0]
    axes = reduced_axes(node, unknown_as_all=False)
    if x.shape is None or not axes or not all(isinstance(d, int) for d in x.shape):
        return 0.0
    rank = len(x.shape)
    if tuple(sorted(axes)) != tuple(range(rank - len(axes), rank)):
        return 0.0
    return rows_beyond(prod_of(x.shape), prod_of([x.shape[a] for a in axes])) * ns * 1e-9


def element_time_s(node: Node, profile: Any) -> float | None:
    """Measured compute time of a non-contraction node: its element count times the profile's
    calibrated rate for its type at that size (:func:`element_rate_ns`), plus a row-wise
    node's per-row cost (:func:`row_time_s`); ``None`` when the profile has no rate for it
    (the roofline's FLOP rate applies then)."""
    if node.op_type in CONTRACTION_OPS:
        return None
    n = _elements(node)
    if n is None:
        return None
    ns = element_rate_ns(profile, node.op_type, n)
    return None if ns is None else n * ns * 1e-9 + row_time_s(node, profile)
