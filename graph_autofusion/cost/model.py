"""Cost model (F8): roofline time per kernel, before/after costs of a fusion, verdicts.

Kernel time
    ``time = max(compute, memory) + overhead`` (roofline plus overhead), where
    ``compute = flops / (peak x efficiency)`` and ``memory = bytes x access factor / bandwidth``.
    The overhead is the profile's measured dispatch cost of the operator's type
    (``op_overhead_us``, see :func:`dispatch_overhead_s`), else its ``launch_overhead_us``.
    FLOPs come from :func:`graph_autofusion.catalog.cost.node_flops`; bytes from
    :func:`~graph_autofusion.catalog.cost.node_bytes` with these corrections, chosen after what
    onnxruntime's CPU kernels do:

    * views (``Reshape``, ``Squeeze``, ``Unsqueeze``, ``Flatten``, ``Identity``) alias their
      input and metadata ops (``Shape``, ``Size``) read no data: overhead only, no HBM access.
      ``Constant`` becomes an initializer at load: no kernel at all.
    * gathers and slices (``Gather``, ``GatherElements``, ``GatherND``, ``Slice``) read only the
      elements they return (plus indices), not the whole source tensor.
    * constants (initializers, e.g. weights) are bytes read like any input.

Compute efficiency (the same curve on every profile, not fitted per model)
    A contraction (``MatMul``, ``Gemm``, ``Conv`` and their fused forms, RNN cells) reaches
    ``e(F) = CONTRACTION_MAX_EFFICIENCY x F / (F + F_half)`` of peak, where
    ``F_half = peak x half_time`` and ``F`` is the work of one GEMM: a batched ``MatMul`` runs
    one GEMM per batch item, a ``Conv`` one per image and group, a recurrent cell one per time
    step and direction (:func:`gemm_count`), each paying the knee. A GEMM whose ideal compute
    time is ``half_time`` runs at half the sustainable efficiency (0.9); equivalently each GEMM
    costs ``F / (0.9 x peak) + half_time / 0.9``. Small GEMMs are dominated by packing, edge
    tiles and thread start; expressing the knee as a time makes it scale with the device.
    ``half_time`` is the profile's measured ``extra.contraction_half_time_us`` (host
    calibration) or ``CONTRACTION_HALF_TIME_S`` (4 us). Other operators run on the vector units at ``VECTOR_EFFICIENCY``
    (0.1) of the FMA peak: one FLOP per loaded element, no FMA pairing, and transcendental
    functions (``Exp``, ``Erf``, ``Pow``) that expand into many instructions.

Overlap of compute and memory traffic
    ``max(compute, memory)`` assumes the two overlap fully. A calibrated host profile may
    measure how far they do (``extra.compute_memory_overlap``, from a weight-streaming GEMM in
    onnxruntime); the kernel time is then ``max + (1 - overlap) x min``
    (:func:`roofline_time`). Shipped profiles: 1 (the plain roofline).

Cache-resident activations
    A tensor produced by a kernel of the same run (an activation, not a weight or a model
    input) and at most half the last-level cache (``extra.l3_kb`` for CPUs, ``l2_kb`` for
    GPUs/NPUs) is read and written at ``CACHE_BANDWIDTH_FACTOR`` (4) x the main-memory
    bandwidth. HBM bytes and accesses are still reported in full; only the time changes.

Strided or transposed access
    A ``Transpose`` that moves a non-unit axis reads with a stride: its input bytes cost
    ``STRIDED_ACCESS_FACTOR`` (3) times as much (onnxruntime's Transpose on the host runs 3-4x
    below its copy bandwidth). The same factor applies to the input of a reduction over a
    non-last axis, and, in a fused group, to an external input that reaches the group through
    a ``Transpose`` not feeding a contraction (a GEMM's packing absorbs a transposed operand).

Fusion (a candidate group of nodes)
    Before: every node is its own kernel. After: one kernel; bytes = external inputs (each read
    once) + outputs read outside the group (internal values stay in local memory), FLOPs = the
    sum, one launch overhead. HBM accesses = tensor reads + writes to main memory. The
    after-kernel's local-memory need comes from :func:`graph_autofusion.cost.tiling.plan_tiles`
    against ``profile.local_memory_bytes()``.

Verdicts
    ``fuse`` when the saving ``(t_before - t_after) / t_before >= benefit_threshold``;
    ``skip-low-benefit`` below it; ``skip-local-memory-overflow`` when no legal tile fits;
    ``maybe`` when sizes are unknown or the saving is within ``MAYBE_BAND`` of the threshold.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import defaults, reasons
from graph_autofusion.catalog.cost import node_bytes, node_flops
from graph_autofusion.cost.shapes import ShapeBinding
from graph_autofusion.cost.tiling import TilePlan, plan_tiles, reduced_axes
from graph_autofusion.ir.core import Node, Value
from graph_autofusion.ir.dtypes import DType

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
STRIDED_ACCESS_FACTOR = 3.0
CACHE_BANDWIDTH_FACTOR = 4.0

#: Inputs (by index) that are shape/axes/index metadata, not tensor data: a fused kernel takes
#: them as parameters (no HBM access, no bytes); a single kernel reads them (bytes) but they
#: are not counted as accesses.
META_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "Expand": (1,),
    "Slice": (1, 2, 3, 4),
    "Tile": (1,),
    "Pad": (1, 3),
    "Split": (1,),
    "Resize": (1, 2, 3),
    "TopK": (1,),
    "CumSum": (1,),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "ReduceMean": (1,),
    "ReduceSum": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL2": (1,),
    "ReduceSumSquare": (1,),
    "ReduceLogSumExp": (1,),
}


def is_meta_operand(node: Node, index: int) -> bool:
    """Whether input ``index`` of ``node`` is shape/axes metadata rather than tensor data."""
    return index in META_OPERANDS.get(node.op_type, ())


DEFAULT_BENEFIT_THRESHOLD = defaults.BENEFIT_THRESHOLD
MAYBE_BAND = 0.02


class Verdict(str, enum.Enum):
    FUSE = reasons.FUSE
    SKIP_LOW_BENEFIT = reasons.SKIP_LOW_BENEFIT
    SKIP_LOCAL_MEMORY_OVERFLOW = reasons.SKIP_LOCAL_MEMORY_OVERFLOW
    MAYBE = reasons.MAYBE


@dataclass(frozen=True)
class KernelCost:
    """Roofline cost of one kernel.

    Attributes:
        flops: Floating-point operations (``None``: unknown sizes).
        bytes_read / bytes_written: Main-memory bytes (before the access factor).
        hbm_accesses: Tensor reads + writes to main memory.
        compute_s / memory_s / overhead_s: The roofline terms (memory includes the factor).
        time_s: ``max(compute_s, memory_s) + overhead_s`` (``None`` when unknown).
        bound: ``"compute"``, ``"memory"`` or ``"overhead"`` (largest term).
        strided_factor: Access factor applied to (part of) the bytes read.
    """

    flops: int | None
    bytes_read: int | None
    bytes_written: int | None
    hbm_accesses: int
    compute_s: float | None
    memory_s: float | None
    overhead_s: float
    time_s: float | None
    bound: str
    strided_factor: float = 1.0

    @property
    def bytes(self) -> int | None:
        if self.bytes_read is None or self.bytes_written is None:
            return None
        return self.bytes_read + self.bytes_written

    @property
    def gflops(self) -> float | None:
        """Achieved GFLOP/s (``flops / time``)."""
        if self.flops is None or not self.time_s:
            return None
        return self.flops / self.time_s / 1e9


@dataclass
class FusionCost:
    """Before/after costs of fusing a group of nodes into one kernel, and the verdict."""

    ops: list[str]
    nodes: list[str]
    profile: str
    hbm_accesses_before: int
    hbm_accesses_after: int
    bytes_before: int | None
    bytes_after: int | None
    time_before_s: float | None
    time_after_s: float | None
    gflops_before: float | None
    gflops_after: float | None
    flops: int | None
    local_memory_bytes: int | None
    local_memory_capacity: int
    tile: TilePlan | None
    saving: float | None
    benefit_threshold: float
    verdict: Verdict
    reason: str
    kernels: list[KernelCost] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if not self.time_before_s or not self.time_after_s:
            return None
        return self.time_before_s / self.time_after_s

    @property
    def hbm_access_reduction(self) -> float:
        if not self.hbm_accesses_before:
            return 0.0
        return 1.0 - self.hbm_accesses_after / self.hbm_accesses_before

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "nodes": self.nodes,
            "profile": self.profile,
            "hbm_accesses": [self.hbm_accesses_before, self.hbm_accesses_after],
            "bytes": [self.bytes_before, self.bytes_after],
            "time_us": [_us(self.time_before_s), _us(self.time_after_s)],
            "gflops": [self.gflops_before, self.gflops_after],
            "flops": self.flops,
            "local_memory_bytes": self.local_memory_bytes,
            "local_memory_capacity": self.local_memory_capacity,
            "tile": list(self.tile.tile) if self.tile else None,
            "saving": self.saving,
            "verdict": self.verdict.value,
            "reason": self.reason,
        }


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6


def _dtype_key(node: Node) -> str:
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
        return max(1, _prod(shape[:-2]))
    if op in ("Conv", "FusedConv", "ConvTranspose") and shape:
        return max(1, int(shape[0]) * int(node.attr("group") or 1))
    if op in ("LSTM", "GRU", "RNN") and len(shape) >= 2:
        x = node.inputs[0] if node.inputs else None
        steps = x.shape[0] if x is not None and x.shape and isinstance(x.shape[0], int) else 1
        return max(1, int(steps) * int(shape[1]))
    return 1


def _prod(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _compute_time(
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


def _is_strided_reduction(node: Node) -> bool:
    x = node.inputs[0] if node.inputs else None
    axes = reduced_axes(node)
    if not axes or x is None or x.shape is None:
        return False
    rank = len(x.shape)
    # a reduction over the trailing axes reads contiguously; one that skips the last axis strides
    return (rank - 1) not in axes and node.op_type not in (
        "GlobalAveragePool",
        "GlobalMaxPool",
        "InstanceNormalization",
        "GroupNormalization",
    )


def _read_bytes(node: Node) -> tuple[int, int] | None:
    """(bytes read, tensors read) for one kernel, with the gather/slice correction."""
    seen: set[int] = set()
    total = 0
    count = 0
    for i, v in enumerate(node.inputs):
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        n = v.nbytes()
        if node.op_type in GATHER_OPS and i == 0:
            out = node.outputs[0].nbytes() if node.outputs else None
            if out is None:
                return None
            n = out if n is None else min(n, out)
        elif node.op_type == "Slice" and i > 0 and n is None:
            n = 0
        if n is None:
            return None
        total += n
        count += 1
    return total, count


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
"""Row length of the per-element curve's calibration tensors (``rows x 1024``): a row-wise
operator's per-row cost (``extra.op_ns_per_row``) is counted for rows beyond that."""


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


def _rows_beyond(elements: int, row: int) -> float:
    """Rows of ``row`` elements in ``elements`` beyond the ``elements / 1024`` rows the
    per-element curve's calibration tensors had (0 for rows of 1024 or longer: the curve's
    own per-row share then slightly overprices them)."""
    if row <= 0 or elements <= 0:
        return 0.0
    return max(elements / row - elements / ROW_CALIBRATION_LENGTH, 0.0)


def _per_row_ns(profile: Any, op_type: str | None) -> float:
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
    ns = _per_row_ns(profile, node.op_type)
    if not ns or not node.inputs or node.inputs[0] is None:
        return 0.0
    x = node.inputs[0]
    axes = reduced_axes(node, unknown_as_all=False)
    if x.shape is None or not axes or not all(isinstance(d, int) for d in x.shape):
        return 0.0
    rank = len(x.shape)
    if tuple(sorted(axes)) != tuple(range(rank - len(axes), rank)):
        return 0.0
    return _rows_beyond(_prod(x.shape), _prod([x.shape[a] for a in axes])) * ns * 1e-9


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


def _same_dtype_cast(node: Node) -> bool:
    """A ``Cast`` to the dtype its input already has (its ``to`` attribute, else its output's
    dtype): it changes no value. Exporters wrap every RMSNorm in such float -> float casts."""
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return False
    x = node.inputs[0]
    if x is None or x.dtype is None:
        return False
    to = node.attr("to")
    if to is not None:
        try:
            return DType(int(to)) == x.dtype
        except ValueError:
            return False
    return bool(node.outputs) and node.outputs[0].dtype == x.dtype


def _runs_in_place(node: Node) -> bool:
    """onnxruntime lets a node that may run in place (``Cast``) reuse its input's buffer only
    when the input dies there: an activation (not a graph input, initializer or graph output)
    that no other node reads. A shadow node (cost.shapes) is judged on the model node it
    shadows."""
    original = node.meta.get("original", node)
    v = original.inputs[0] if original.inputs else None
    if v is None or v.const is not None or v.producer is None:
        return False
    if original.graph is not None and original.graph.is_output(v):
        return False
    return v.user_nodes == [original]


def _is_view(node: Node) -> bool:
    """A kernel that moves no data: a view (reshape-like: the runtime aliases its input), or a
    ``Cast`` to its input's own dtype that runs in place (:func:`_runs_in_place`); dispatch
    only. A same-dtype ``Cast`` whose input lives on is a copy and is priced as a ``Cast``:
    onnxruntime copies the tensor then (64 MiB: ~4 ms, against ~7 us in place)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in VIEW_OPS:
        return True
    return _same_dtype_cast(node) and _runs_in_place(node)


def kernel_cost(node: Node, profile: Any) -> KernelCost:
    """Roofline cost of ``node`` run as its own kernel on ``profile``.

    ``node`` must carry concrete shapes (a shadow node from
    :class:`~graph_autofusion.cost.shapes.ShapeBinding`, or a graph with static shapes).
    """
    overhead = dispatch_overhead_s(profile, node.op_type)
    if node.op_type in FREE_OPS:
        return KernelCost(0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, "overhead")
    if _is_view(node):
        return KernelCost(0, 0, 0, 0, 0.0, 0.0, overhead, overhead, "overhead")
    flops = node_flops(node)
    rb = _read_bytes(node)
    written = None
    if node_bytes(node) is not None:
        written = sum(v.nbytes() or 0 for v in node.outputs)
    accesses = sum(
        1 for i, v in enumerate(node.inputs) if v is not None and not is_meta_operand(node, i)
    ) + len(node.outputs)
    if flops is None or rb is None or written is None:
        return KernelCost(flops, None, None, accesses, None, None, overhead, None, "unknown")
    read, _ = rb
    factor = 1.0
    if (node.op_type == "Transpose" and _nontrivial_perm(node)) or _is_strided_reduction(node):
        factor = STRIDED_ACCESS_FACTOR
    peak = profile.peak_flops_per_s(_dtype_key(node))
    contraction = flops if node.op_type in CONTRACTION_OPS else 0
    gemms = gemm_count(node) if contraction else 1
    compute = _compute_time(flops, contraction, peak, gemms, contraction_half_time_s(profile))
    measured = element_time_s(node, profile)
    if measured is not None:
        compute = measured
    memory = _memory_time(node_reads(node), list(node.outputs), factor, profile)
    time = roofline_time(compute, memory, profile) + overhead
    bound = max((compute, "compute"), (memory, "memory"), (overhead, "overhead"))[1]
    return KernelCost(
        flops, read, written, accesses, compute, memory, overhead, time, bound, factor
    )


def last_level_cache_bytes(profile: Any) -> int:
    """Shared last-level cache: ``extra.l3_kb`` (CPU), else ``l2_kb`` (GPU/NPU total L2)."""
    kb = (profile.extra or {}).get("l3_kb") or (profile.extra or {}).get("llc_kb")
    if kb is None:
        kb = profile.l2_kb if profile.kind != "cpu" else (profile.l2_kb or 0) * profile.cores
    return int(float(kb or 0) * 1024)


def _hot(v: Value, llc: int) -> bool:
    """Whether ``v`` is likely still in the last-level cache when read (or stays there when
    written): produced by a kernel of this run and at most half the cache."""
    n = v.nbytes()
    return v.producer is not None and n is not None and n <= llc // 2


def _memory_time(
    reads: list[tuple[Value, int]], writes: list[Value], factor: Any, profile: Any
) -> float:
    """Seconds to move ``reads`` (value, bytes) and ``writes``: values hot in the last-level
    cache at ``CACHE_BANDWIDTH_FACTOR`` x the main-memory bandwidth, the rest at main memory."""
    bw = profile.bandwidth_bytes_per_s()
    llc = last_level_cache_bytes(profile)
    t = 0.0
    for v, n in reads:
        f = factor(v) if callable(factor) else factor
        t += n * f / (bw * (CACHE_BANDWIDTH_FACTOR if _hot(v, llc) else 1.0))
    for v in writes:
        n = v.nbytes() or 0
        t += n / (bw * (CACHE_BANDWIDTH_FACTOR if _hot(v, llc) else 1.0))
    return t


def node_reads(node: Node) -> list[tuple[Value, int]]:
    """``(value, bytes read)`` per distinct input, with the gather/slice correction."""
    out: list[tuple[Value, int]] = []
    seen: set[int] = set()
    for i, v in enumerate(node.inputs):
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        n = v.nbytes()
        if node.op_type in GATHER_OPS and i == 0:
            o = node.outputs[0].nbytes() if node.outputs else None
            n = o if n is None else (n if o is None else min(n, o))
        out.append((v, n or 0))
    return out


def _nontrivial_perm(node: Node) -> bool:
    """A Transpose that moves a non-unit axis relative to another (a real strided copy)."""
    x = node.inputs[0] if node.inputs else None
    perm = node.attr("perm")
    if x is None or x.shape is None:
        return True
    if perm is None:
        perm = list(range(len(x.shape)))[::-1]
    kept = [p for p in perm if x.shape[p] != 1]
    return kept != sorted(kept)


# ----------------------------------------------------------------------------- groups
@dataclass
class GroupIO:
    """A candidate group's values, split by where they live after fusion (concrete types)."""

    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    intermediates: list[Value]
    strided_inputs: set[str] = field(default_factory=set)
    meta_inputs: set[str] = field(default_factory=set)


def _escapes(v: Value, members: set[int]) -> bool:
    """Whether an original value is read outside the group (or is a graph output)."""
    producer = v.producer
    graph = producer.graph if producer is not None else None
    if graph is not None and graph.is_output(v):
        return True
    return any(id(u) not in members for u in v.user_nodes)


def group_io(nodes: Sequence[Node], binding: ShapeBinding | None = None) -> GroupIO:
    """Split a group's values into external inputs, escaping outputs and intermediates.

    ``nodes`` are original model nodes (their users decide what escapes); with ``binding`` the
    returned values and nodes are concrete shadows, else the originals.
    """
    members = {id(n) for n in nodes}
    produced: dict[str, Value] = {}
    for n in nodes:
        for o in n.outputs:
            produced[o.name] = o
    inputs: dict[str, Value] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.name not in produced and v.name not in inputs:
                inputs[v.name] = v
    outputs = [v for v in produced.values() if _escapes(v, members)]
    out_names = {v.name for v in outputs}
    inter = [v for v in produced.values() if v.name not in out_names and v.user_nodes]
    strided: set[str] = set()
    for n in nodes:
        if n.op_type != "Transpose" or not _nontrivial_perm(n):
            continue
        feeds_gemm = any(
            id(u) in members and u.op_type in CONTRACTION_OPS for u in n.outputs[0].user_nodes
        )
        src = n.inputs[0]
        # look through views (Reshape, Squeeze ...) inside the group to the external tensor
        while src is not None and src.name in produced and src.producer is not None:
            prod = src.producer
            if (prod.op_type not in VIEW_OPS and not _same_dtype_cast(prod)) or not prod.inputs:
                break
            src = prod.inputs[0]
        if src is not None and src.name in inputs and not feeds_gemm:
            strided.add(src.name)
    for n in nodes:
        if _is_strided_reduction(n) and n.inputs[0] is not None and n.inputs[0].name in inputs:
            strided.add(n.inputs[0].name)
    # an input is a meta operand when every member slot reading it is one (read from the
    # members' side: a shared constant has a user in every layer of the model)
    data_read = {
        v.name
        for n in nodes
        for i, v in enumerate(n.inputs)
        if v is not None and v.name in inputs and not is_meta_operand(n, i)
    }
    meta = {name for name in inputs if name not in data_read}
    if binding is not None:
        shadow_nodes = binding.nodes(nodes)
        conv = binding.value
        return GroupIO(
            shadow_nodes,
            [conv(v) for v in inputs.values()],
            [conv(v) for v in outputs],
            [conv(v) for v in inter],
            strided,
            meta,
        )
    return GroupIO(list(nodes), list(inputs.values()), outputs, inter, strided, meta)


def native_rate_ns(profile: Any, op_type: str | None, elements: int | None = None) -> float | None:
    """The profile's calibrated per-element rate of the runtime operator ``op_type`` (ns) at
    ``elements`` (:func:`element_rate_ns`), or ``None`` (no calibration for it, or a
    contraction, whose cost the roofline prices)."""
    return element_rate_ns(profile, op_type, elements)


def _fused_kernel(
    io: GroupIO, profile: Any, native_op: str | None = None
) -> tuple[KernelCost, int | None]:
    """One kernel for the whole group; returns its cost and the group's FLOPs.

    With ``native_op`` (the runtime operator a native rewrite turns the group into) and a
    calibrated rate for it, the group's non-contraction compute is that operator's measured
    time on the group's largest output instead of the sum of its members' rates.
    """
    flops = 0
    contraction = 0
    gemms = 0
    measured_s = 0.0  # calibrated per-element time of nodes the profile has a rate for
    measured_flops = 0
    for n in io.nodes:
        if n.op_type in FREE_OPS or _is_view(n) or _same_dtype_cast(n):
            continue
        f = node_flops(n)
        if f is None:
            flops = None
            break
        flops += f
        if n.op_type in CONTRACTION_OPS:
            contraction += f
            gemms += gemm_count(n)
        else:
            t = element_time_s(n, profile)
            if t is not None:
                measured_s += t
                measured_flops += f
    read = 0
    factor_read = 0.0
    reads: list[tuple[Value, int]] = []
    for v in io.inputs:
        if v.name in io.meta_inputs:
            continue
        n = v.nbytes()
        in_group = [u for u in io.nodes if any(x is v for x in u.inputs)]
        if in_group and all(
            u.op_type in GATHER_OPS and u.inputs[0] is v and all(x is not v for x in u.inputs[1:])
            for u in in_group
        ):
            outs = [u.outputs[0].nbytes() for u in in_group]
            if any(o is None for o in outs):
                n = None
            else:
                n = min(n, sum(outs)) if n is not None else sum(outs)
        if n is None:
            read = None
            break
        read += n
        reads.append((v, n))
        f = STRIDED_ACCESS_FACTOR if v.name in io.strided_inputs else 1.0
        factor_read += n * f
    written = 0
    for v in io.outputs:
        n = v.nbytes()
        if n is None:
            written = None
            break
        written += n
    accesses = sum(1 for v in io.inputs if v.name not in io.meta_inputs) + len(io.outputs)
    overhead = profile.launch_overhead_s()
    if flops is None or read is None or written is None:
        return KernelCost(
            flops, read, written, accesses, None, None, overhead, None, "unknown"
        ), flops
    dt = _dtype_key(io.nodes[0]) if io.nodes else "f32"
    peak = profile.peak_flops_per_s(dt)
    out_elements = [v.numel() for v in io.outputs]
    if native_op and out_elements and all(e is not None for e in out_elements):
        largest = max(range(len(out_elements)), key=lambda i: out_elements[i])
        rate = native_rate_ns(profile, native_op, out_elements[largest])
        if rate is not None:
            measured_s = out_elements[largest] * rate * 1e-9
            measured_flops = flops - contraction
            # a row-wise native kernel (SkipLayerNormalization ...) pays its per-row cost
            # like its unfused pieces do: rows along the largest output's last axis
            shape = io.outputs[largest].shape
            ns_row = _per_row_ns(profile, native_op)
            if ns_row and shape and all(isinstance(d, int) for d in shape):
                measured_s += _rows_beyond(_prod(shape), int(shape[-1])) * ns_row * 1e-9
    compute = measured_s + _compute_time(
        flops - measured_flops, contraction, peak, max(gemms, 1), contraction_half_time_s(profile)
    )
    strided = io.strided_inputs
    memory = _memory_time(
        reads,
        list(io.outputs),
        lambda v: STRIDED_ACCESS_FACTOR if v.name in strided else 1.0,
        profile,
    )
    time = roofline_time(compute, memory, profile) + overhead
    bound = max((compute, "compute"), (memory, "memory"), (overhead, "overhead"))[1]
    factor = factor_read / read if read else 1.0
    return (
        KernelCost(flops, read, written, accesses, compute, memory, overhead, time, bound, factor),
        flops,
    )


def fusion_cost(
    nodes: Iterable[Node],
    profile: Any,
    *,
    binding: ShapeBinding | None = None,
    benefit_threshold: float = DEFAULT_BENEFIT_THRESHOLD,
    native_op: str | None = None,
) -> FusionCost:
    """Cost of fusing ``nodes`` (a rule match's ``match.nodes`` or a cluster) into one kernel.

    Args:
        nodes: The group, original model nodes (any order).
        profile: A :class:`~graph_autofusion.cost.hardware.HardwareProfile`.
        binding: Concrete shapes (:func:`~graph_autofusion.cost.shapes.bind_shapes`); without
            it the nodes' own shapes are used and must be static.
        benefit_threshold: Minimum relative saving for ``fuse``.
        native_op: The runtime operator the group becomes (a rule's
            :attr:`~graph_autofusion.patterns.rules.FusionRule.native_op`): its calibrated
            per-element rate, when the profile has one, prices the fused kernel.
    """
    nodes = list(dict.fromkeys(nodes))
    if nodes and all(n.graph is not None and n.graph is nodes[0].graph for n in nodes):
        graph = nodes[0].graph
        nodes.sort(key=graph.position)
    io = group_io(nodes, binding)
    kernels = [kernel_cost(n, profile) for n in io.nodes]
    after, flops = _fused_kernel(io, profile, native_op)
    capacity = profile.local_memory_bytes()
    before_known = all(k.time_s is not None for k in kernels)
    t_before = sum(k.time_s for k in kernels) if before_known else None
    b_before = sum(k.bytes for k in kernels) if all(k.bytes is not None for k in kernels) else None
    acc_before = sum(k.hbm_accesses for k in kernels)
    plan = plan_tiles(
        io.nodes, capacity, inputs=io.inputs, outputs=io.outputs, intermediates=io.intermediates
    )
    t_after = after.time_s
    gf_before = flops / t_before / 1e9 if (flops is not None and t_before) else None
    gf_after = flops / t_after / 1e9 if (flops is not None and t_after) else None
    saving = None
    if t_before and t_after is not None:
        saving = (t_before - t_after) / t_before
    ops = [n.qualified_op for n in nodes]
    if saving is None or plan is None:
        verdict = Verdict.MAYBE
        reason = "sizes unknown: bind concrete shapes (example inputs) to estimate this fusion"
    elif not plan.fits:
        verdict = Verdict.SKIP_LOCAL_MEMORY_OVERFLOW
        reason = (
            f"the smallest legal tile {list(plan.tile)} needs {_kib(plan.minimal_bytes)} of "
            f"local memory, more than the {_kib(capacity)} of {profile.name}"
        )
    elif abs(saving - benefit_threshold) < MAYBE_BAND:
        verdict = Verdict.MAYBE
        reason = (
            f"estimated saving {saving:.1%} is within {MAYBE_BAND:.0%} of the "
            f"{benefit_threshold:.0%} threshold on {profile.name}"
        )
    elif saving >= benefit_threshold:
        verdict = Verdict.FUSE
        reason = (
            f"saves {saving:.1%} ({_fmt_t(t_before)} -> {_fmt_t(t_after)}), HBM accesses "
            f"{acc_before} -> {after.hbm_accesses}, tile {list(plan.tile)} uses "
            f"{_kib(plan.working_set_bytes)} of {_kib(capacity)} on {profile.name}"
        )
    elif saving < 0:
        verdict = Verdict.SKIP_LOW_BENEFIT
        how = f"the measured {native_op} kernel" if native_rate_ns(profile, native_op) else "it"
        reason = (
            f"fused, {how} is estimated slower than its pieces ({_fmt_t(t_before)} -> "
            f"{_fmt_t(t_after)}, {-saving:.1%} more) on {profile.name}"
        )
    else:
        verdict = Verdict.SKIP_LOW_BENEFIT
        reason = (
            f"saves only {saving:.1%} ({_fmt_t(t_before)} -> {_fmt_t(t_after)}), below the "
            f"{benefit_threshold:.0%} threshold on {profile.name}"
        )
    return FusionCost(
        ops=ops,
        nodes=[n.name for n in nodes],
        profile=profile.name,
        hbm_accesses_before=acc_before,
        hbm_accesses_after=after.hbm_accesses,
        bytes_before=b_before,
        bytes_after=after.bytes,
        time_before_s=t_before,
        time_after_s=t_after,
        gflops_before=gf_before,
        gflops_after=gf_after,
        flops=flops,
        local_memory_bytes=plan.working_set_bytes if plan else None,
        local_memory_capacity=capacity,
        tile=plan,
        saving=saving,
        benefit_threshold=benefit_threshold,
        verdict=verdict,
        reason=reason,
        kernels=kernels + [after],
    )


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def _fmt_t(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s * 1e6:.2f} us"


def model_costs(
    nodes: Iterable[Node], profile: Any, binding: ShapeBinding | None = None
) -> dict[str, KernelCost]:
    """Per-node kernel costs (node name -> cost) of a whole graph, unfused."""
    out: dict[str, KernelCost] = {}
    for n in nodes:
        c = binding.node(n) if binding is not None else n
        out[n.name] = kernel_cost(c, profile)
    return out


def predicted_total_s(costs: dict[str, KernelCost]) -> float | None:
    """Sum of the kernel times (``None`` if any is unknown)."""
    if any(c.time_s is None for c in costs.values()):
        return None
    return float(sum(c.time_s for c in costs.values()))


__all__ = [
    "CACHE_BANDWIDTH_FACTOR",
    "CONTRACTION_HALF_TIME_S",
    "CONTRACTION_MAX_EFFICIENCY",
    "DEFAULT_BENEFIT_THRESHOLD",
    "FusionCost",
    "GroupIO",
    "KernelCost",
    "STRIDED_ACCESS_FACTOR",
    "VECTOR_EFFICIENCY",
    "Verdict",
    "compute_memory_overlap",
    "contraction_efficiency",
    "contraction_half_time_s",
    "dispatch_overhead_s",
    "gemm_count",
    "fusion_cost",
    "group_io",
    "kernel_cost",
    "last_level_cache_bytes",
    "model_costs",
    "node_reads",
    "predicted_total_s",
    "roofline_time",
]
