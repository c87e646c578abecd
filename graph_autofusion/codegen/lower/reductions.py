"""Reductions (``Reduce*``) and the normalizations decomposed into them (``Softmax``,
``LogSoftmax``, ``LayerNormalization``, RMS normalization)."""

from __future__ import annotations

from graph_autofusion.codegen.kernel_ir import (
    ROW,
    Instr,
)
from graph_autofusion.codegen.lower.builder import Builder
from graph_autofusion.codegen.lower.common import (
    KernelReason,
    KernelRefused,
    axes_of,
    graph_outputs,
)
from graph_autofusion.ir.core import Node


def set_reduce_axes(b: Builder, x: int, axes_in: list[int], node: Node) -> tuple[int, ...]:
    """Reduced axes of the input instr ``x`` (its own coordinates) in loop coordinates; checks
    that every reduction of the group reduces the same axes."""
    xs = b.shapes[x]
    # loop coordinates are right-aligned: position p in a rank-r shape is p + (R - r)
    key = tuple(a - len(xs) for a in axes_in)  # negative, right-aligned
    if b.reduce_axes is None:
        b.reduce_axes = key
        b.reduce_extent = tuple(xs[a] for a in axes_in)
    elif b.reduce_axes != key or b.reduce_extent != tuple(xs[a] for a in axes_in):
        raise KernelRefused(
            KernelReason.REDUCTION_MISMATCH,
            f"{node.name} reduces axes {axes_in} of {list(xs)}; the group already reduces another set",
        )
    return key


def reduce_to(b: Builder, kind: str, x: int, axes: list[int], node: Node) -> int:
    set_reduce_axes(b, x, axes, node)
    shape = tuple(1 if i in axes else d for i, d in enumerate(b.shapes[x]))
    b.body.append(Instr("reduce", (x,), (("kind", kind),), b.body[x].ctype, ROW))
    idx = len(b.body) - 1
    b.shapes[idx] = shape
    return idx


def mean_of(b: Builder, x: int, axes: list[int], node: Node) -> int:
    s = reduce_to(b, "sum", x, axes, node)
    n = b.emit("rowlen", (), "f32", ())
    return b.emit("div", (s, n))


def lower_reduce(b: Builder, node: Node) -> None:
    op = node.op_type
    x = b.value(node.inputs[0])
    rank = len(b.shape(node.inputs[0]))
    axes = axes_of(node, rank)
    if axes is None:
        if int(node.attr("noop_with_empty_axes", 0)):
            if op == "ReduceSumSquare":
                x = b.emit("mul", (x, x))
            elif op in ("ReduceL1", "ReduceL2"):
                x = b.emit("abs", (x,))
            elif op not in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"):
                raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"{op} ({node.name})")
            b.set(node.outputs[0], b.emit("id", (x,)))
            return
        axes = list(range(rank))
    keep = int(node.attr("keepdims", 1))
    if op == "ReduceMean":
        r = mean_of(b, x, axes, node)
    elif op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
        r = reduce_to(b, op[6:].lower(), x, axes, node)
    elif op in ("ReduceSumSquare", "ReduceL2"):
        r = reduce_to(b, "sum", b.emit("mul", (x, x)), axes, node)
        if op == "ReduceL2":
            r = b.emit("sqrt", (r,))
    elif op == "ReduceL1":
        r = reduce_to(b, "sum", b.emit("abs", (x,)), axes, node)
    else:
        raise KernelRefused(
            KernelReason.UNSUPPORTED_OP, f"{op} ({node.name}) has no kernel lowering"
        )
    b.set(node.outputs[0], r)
    if not keep:
        b.dropped[id(node.outputs[0])] = r


def tail_axes(node: Node, rank: int, default: int) -> list[int]:
    axis = int(node.attr("axis", default)) % max(rank, 1)
    return list(range(axis, rank))


def lower_softmax(b: Builder, node: Node) -> None:
    x = b.value(node.inputs[0])
    rank = len(b.shape(node.inputs[0]))
    if b.opset >= 13:
        axis = int(node.attr("axis", -1)) % max(rank, 1)
        axes = [axis]
    else:
        axes = tail_axes(node, rank, 1)
    m = reduce_to(b, "max", x, axes, node)
    s = b.emit("sub", (x, m))
    e = b.emit("exp", (s,))
    total = reduce_to(b, "sum", e, axes, node)
    if node.op_type == "Softmax":
        # one reciprocal per row, a multiply per element (within an ulp of the division)
        b.set(node.outputs[0], b.emit("mul", (e, b.emit("recip", (total,)))))
    else:
        b.set(node.outputs[0], b.emit("sub", (s, b.emit("log", (total,)))))


def lower_layer_norm(b: Builder, node: Node) -> None:
    for extra in node.outputs[1:]:
        if extra.users or extra.name in graph_outputs(node):
            raise KernelRefused(
                KernelReason.UNSUPPORTED_OP, f"{node.name}: mean/inv-std outputs are read"
            )
    x = b.value(node.inputs[0])
    rank = len(b.shape(node.inputs[0]))
    axes = tail_axes(node, rank, -1)
    eps = b.const(float(node.attr("epsilon", 1e-5)))
    if node.op_type == "LayerNormalization":
        mean = mean_of(b, x, axes, node)
        d = b.emit("sub", (x, mean))
        var = mean_of(b, b.emit("mul", (d, d)), axes, node)
    else:
        d = x
        var = mean_of(b, b.emit("mul", (x, x)), axes, node)
    inv = b.emit("div", (b.const(1.0), b.emit("sqrt", (b.emit("add", (var, eps)),))))
    y = b.emit("mul", (d, inv))
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        y = b.emit("mul", (y, b.value(node.inputs[1])))
    if node.op_type == "LayerNormalization" and len(node.inputs) > 2 and node.inputs[2] is not None:
        y = b.emit("add", (y, b.value(node.inputs[2])))
    b.set(node.outputs[0], y)
