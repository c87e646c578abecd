"""A group of operators as one fused kernel: what it reads and writes (:class:`GroupIO`),
and its cost (:func:`fused_kernel`: bytes once, compute summed, the tile plan's local memory)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion.catalog.cost import node_flops
from graph_autofusion.cost.kernel import (
    STRIDED_ACCESS_FACTOR,
    KernelCost,
    is_meta_operand,
    is_strided_reduction,
    is_view,
    memory_time,
    nontrivial_perm,
    same_dtype_cast,
)
from graph_autofusion.cost.rates import (
    CONTRACTION_OPS,
    FREE_OPS,
    GATHER_OPS,
    VIEW_OPS,
    compute_time,
    contraction_half_time_s,
    dtype_key,
    element_rate_ns,
    element_time_s,
    gemm_count,
    per_row_ns,
    prod_of,
    roofline_time,
    rows_beyond,
)
from graph_autofusion.cost.shapes import ShapeBinding
from graph_autofusion.ir.core import Node, Value


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
        if n.op_type != "Transpose" or not nontrivial_perm(n):
            continue
        feeds_gemm = any(
            id(u) in members and u.op_type in CONTRACTION_OPS for u in n.outputs[0].user_nodes
        )
        src = n.inputs[0]
        # look through views (Reshape, Squeeze ...) inside the group to the external tensor
        while src is not None and src.name in produced and src.producer is not None:
            prod = src.producer
            if (prod.op_type not in VIEW_OPS and not same_dtype_cast(prod)) or not prod.inputs:
                break
            src = prod.inputs[0]
        if src is not None and src.name in inputs and not feeds_gemm:
            strided.add(src.name)
    for n in nodes:
        if is_strided_reduction(n) and n.inputs[0] is not None and n.inputs[0].name in inputs:
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


def fused_kernel(
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
        if n.op_type in FREE_OPS or is_view(n) or same_dtype_cast(n):
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
    dt = dtype_key(io.nodes[0]) if io.nodes else "f32"
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
            ns_row = per_row_ns(profile, native_op)
            if ns_row and shape and all(isinstance(d, int) for d in shape):
                measured_s += rows_beyond(prod_of(shape), int(shape[-1])) * ns_row * 1e-9
    compute = measured_s + compute_time(
        flops - measured_flops, contraction, peak, max(gemms, 1), contraction_half_time_s(profile)
    )
    strided = io.strided_inputs
    memory = memory_time(
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
