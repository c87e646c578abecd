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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import defaults, reasons
from graph_autofusion.cost.group import GroupIO, fused_kernel, group_io, native_rate_ns
from graph_autofusion.cost.kernel import (
    CACHE_BANDWIDTH_FACTOR,
    META_OPERANDS,
    STRIDED_ACCESS_FACTOR,
    KernelCost,
    is_meta_operand,
    is_strided_reduction,
    is_view,
    kernel_cost,
    last_level_cache_bytes,
    memory_time,
    node_reads,
    nontrivial_perm,
    same_dtype_cast,
)
from graph_autofusion.cost.rates import (
    CONTRACTION_HALF_TIME_S,
    CONTRACTION_MAX_EFFICIENCY,
    CONTRACTION_OPS,
    FREE_OPS,
    GATHER_OPS,
    ROW_CALIBRATION_LENGTH,
    VECTOR_EFFICIENCY,
    VIEW_OPS,
    compute_memory_overlap,
    compute_time,
    contraction_efficiency,
    contraction_half_time_s,
    dispatch_overhead_s,
    dtype_key,
    element_rate_ns,
    element_time_s,
    gemm_count,
    interpolate_rate,
    per_row_ns,
    prod_of,
    roofline_time,
    row_time_s,
    rows_beyond,
    to_us,
)
from graph_autofusion.cost.shapes import ShapeBinding
from graph_autofusion.cost.tiling import TilePlan, plan_tiles, reduced_axes
from graph_autofusion.ir.core import Node

__all__ = [
    "reduced_axes",
    "CACHE_BANDWIDTH_FACTOR",
    "CONTRACTION_HALF_TIME_S",
    "CONTRACTION_MAX_EFFICIENCY",
    "CONTRACTION_OPS",
    "DEFAULT_BENEFIT_THRESHOLD",
    "FREE_OPS",
    "FusionCost",
    "GATHER_OPS",
    "GroupIO",
    "KernelCost",
    "MAYBE_BAND",
    "META_OPERANDS",
    "ROW_CALIBRATION_LENGTH",
    "STRIDED_ACCESS_FACTOR",
    "VECTOR_EFFICIENCY",
    "VIEW_OPS",
    "Verdict",
    "compute_memory_overlap",
    "compute_time",
    "contraction_efficiency",
    "contraction_half_time_s",
    "dispatch_overhead_s",
    "dtype_key",
    "element_rate_ns",
    "element_time_s",
    "fused_kernel",
    "fusion_cost",
    "gemm_count",
    "group_io",
    "interpolate_rate",
    "is_meta_operand",
    "is_strided_reduction",
    "is_view",
    "kernel_cost",
    "last_level_cache_bytes",
    "memory_time",
    "model_costs",
    "native_rate_ns",
    "node_reads",
    "nontrivial_perm",
    "per_row_ns",
    "predicted_total_s",
    "prod_of",
    "roofline_time",
    "row_time_s",
    "rows_beyond",
    "same_dtype_cast",
    "to_us",
]


DEFAULT_BENEFIT_THRESHOLD = defaults.BENEFIT_THRESHOLD


MAYBE_BAND = 0.02


class Verdict(str, enum.Enum):
    FUSE = reasons.FUSE
    SKIP_LOW_BENEFIT = reasons.SKIP_LOW_BENEFIT
    SKIP_LOCAL_MEMORY_OVERFLOW = reasons.SKIP_LOCAL_MEMORY_OVERFLOW
    MAYBE = reasons.MAYBE


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
            "time_us": [to_us(self.time_before_s), to_us(self.time_after_s)],
            "gflops": [self.gflops_before, self.gflops_after],
            "flops": self.flops,
            "local_memory_bytes": self.local_memory_bytes,
            "local_memory_capacity": self.local_memory_capacity,
            "tile": list(self.tile.tile) if self.tile else None,
            "saving": self.saving,
            "verdict": self.verdict.value,
            "reason": self.reason,
        }


"""Row length of the per-element curve's calibration tensors (``rows x 1024``): a row-wise
operator's per-row cost (``extra.op_ns_per_row``) is counted for rows beyond that."""


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
    after, flops = fused_kernel(io, profile, native_op)
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
