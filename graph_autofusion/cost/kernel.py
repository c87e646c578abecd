"""One operator's cost as its own kernel (:class:`KernelCost`): bytes read and written,
strided access, operators that run in place or are views, what stays in the last-level
cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graph_autofusion.catalog.cost import node_bytes, node_flops
from graph_autofusion.cost.rates import (
    CONTRACTION_OPS,
    FREE_OPS,
    GATHER_OPS,
    VIEW_OPS,
    compute_time,
    contraction_half_time_s,
    dispatch_overhead_s,
    dtype_key,
    element_time_s,
    gemm_count,
    roofline_time,
)
from graph_autofusion.cost.tiling import reduced_axes
from graph_autofusion.ir.core import Node, Value
from graph_autofusion.ir.dtypes import DType

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


def is_strided_reduction(node: Node) -> bool:
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


def same_dtype_cast(node: Node) -> bool:
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


def is_view(node: Node) -> bool:
    """A kernel that moves no data: a view (reshape-like: the runtime aliases its input), or a
    ``Cast`` to its input's own dtype that runs in place (:func:`_runs_in_place`); dispatch
    only. A same-dtype ``Cast`` whose input lives on is a copy and is priced as a ``Cast``:
    onnxruntime copies the tensor then (64 MiB: ~4 ms, against ~7 us in place)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in VIEW_OPS:
        return True
    return same_dtype_cast(node) and _runs_in_place(node)


def kernel_cost(node: Node, profile: Any) -> KernelCost:
    """Roofline cost of ``node`` run as its own kernel on ``profile``.

    ``node`` must carry concrete shapes (a shadow node from
    :class:`~graph_autofusion.cost.shapes.ShapeBinding`, or a graph with static shapes).
    """
    overhead = dispatch_overhead_s(profile, node.op_type)
    if node.op_type in FREE_OPS:
        return KernelCost(0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, "overhead")
    if is_view(node):
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
    if (node.op_type == "Transpose" and nontrivial_perm(node)) or is_strided_reduction(node):
        factor = STRIDED_ACCESS_FACTOR
    peak = profile.peak_flops_per_s(dtype_key(node))
    contraction = flops if node.op_type in CONTRACTION_OPS else 0
    gemms = gemm_count(node) if contraction else 1
    compute = compute_time(flops, contraction, peak, gemms, contraction_half_time_s(profile))
    measured = element_time_s(node, profile)
    if measured is not None:
        compute = measured
    memory = memory_time(node_reads(node), list(node.outputs), factor, profile)
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


def memory_time(
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


def nontrivial_perm(node: Node) -> bool:
    """A Transpose that moves a non-unit axis relative to another (a real strided copy)."""
    x = node.inputs[0] if node.inputs else None
    perm = node.attr("perm")
    if x is None or x.shape is None:
        return True
    if perm is None:
        perm = list(range(len(x.shape)))[::-1]
    kept = [p for p in perm if x.shape[p] != 1]
    return kept != sorted(kept)
