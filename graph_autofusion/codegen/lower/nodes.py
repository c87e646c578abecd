"""One node at a time: elementwise and broadcast operators, ``Pow`` by small constants,
``Concat`` branches, and the dispatch to activations, reductions and views."""

from __future__ import annotations

import numpy as np

from graph_autofusion.codegen.kernel_ir import (
    ELEM,
    STORAGE_COMPUTE,
    Instr,
    KernelInput,
)
from graph_autofusion.codegen.lower.activations import ACTIVATIONS
from graph_autofusion.codegen.lower.builder import (
    Builder,
    leading_ones_only,
    leading_reshape,
    view_of,
    viewed_value,
)
from graph_autofusion.codegen.lower.common import (
    PASS_THROUGH,
    VIEW_OPS,
    KernelReason,
    KernelRefused,
    broadcast_shapes,
    graph_outputs,
    ints_of,
    storage_of,
)
from graph_autofusion.codegen.lower.reductions import lower_layer_norm, lower_reduce, lower_softmax
from graph_autofusion.ir.core import Node, const_value

#: ``Pow`` by these constant exponents becomes multiplications, a square root or a
#: reciprocal (the vector ``powf`` is a log and an exp: ~10x the time of a multiply).
_SMALL_POWERS = (1.0, 2.0, 3.0, 4.0, 0.5, -1.0, -0.5)


def _lower_small_pow(b: Builder, node: Node) -> bool:
    e_val = node.inputs[1]
    c = const_value(e_val) if e_val is not None else None
    if c is None or c.size != 1 or not np.issubdtype(c.dtype, np.number):
        return False
    e = float(np.asarray(c).reshape(-1)[0])
    if e not in _SMALL_POWERS:
        return False
    a = b.value(node.inputs[0])
    if b.body[a].ctype != "f32":
        return False
    if e == 1.0:
        r = b.emit("id", (a,))
    elif e == 2.0:
        r = b.emit("mul", (a, a))
    elif e == 3.0:
        r = b.emit("mul", (b.emit("mul", (a, a)), a))
    elif e == 4.0:
        sq = b.emit("mul", (a, a))
        r = b.emit("mul", (sq, sq))
    elif e == 0.5:
        r = b.emit("sqrt", (a,))
    elif e == -1.0:
        r = b.emit("recip", (a,))
    else:
        r = b.emit("recip", (b.emit("sqrt", (a,)),))
    b.set(node.outputs[0], r)
    return True


def lower_node(b: Builder, node: Node) -> None:
    op, ins, outs = node.op_type, node.inputs, node.outputs
    val = b.value
    if node.domain not in ("", "ai.onnx"):
        raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"{node.qualified_op} ({node.name})")
    simple = {
        "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
        "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge",
        "And": "and", "Or": "or", "Xor": "xor",
    }  # fmt: skip
    unary = {
        "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
        "Reciprocal": "recip", "Tanh": "tanh", "Erf": "erf", "Sigmoid": "sigmoid",
        "Relu": "relu", "Sin": "sin", "Cos": "cos", "Floor": "floor", "Ceil": "ceil",
        "Round": "round", "Sign": "sign", "Not": "not", "IsNaN": "isnan", "IsInf": "isinf",
        "Softplus": "softplus",
    }  # fmt: skip
    if op == "Pow" and _lower_small_pow(b, node):
        return
    if op in simple:
        a, c = val(ins[0]), val(ins[1])
        if op == "Div" and b.body[a].ctype != "f32":
            raise KernelRefused(KernelReason.UNSUPPORTED_DTYPE, f"integer Div ({node.name})")
        ctype = "bool" if simple[op] in ("eq", "lt", "le", "gt", "ge") else None
        b.set(outs[0], b.emit(simple[op], (a, c), ctype))
        return
    if op in unary:
        a = val(ins[0])
        if op == "IsInf":
            detect_neg = int(node.attr("detect_negative", 1))
            detect_pos = int(node.attr("detect_positive", 1))
            r = b.emit("isinf", (a,), "bool")
            if not (detect_neg and detect_pos):
                zero = b.const(0.0)
                side = b.emit("gt" if detect_pos else "lt", (a, zero), "bool")
                r = b.emit("and", (r, side), "bool")
            b.set(outs[0], r)
            return
        ctype = "bool" if op in ("Not", "IsNaN") else None
        b.set(outs[0], b.emit(unary[op], (a,), ctype))
        return
    if op in ("Min", "Max", "Sum", "Mean"):
        parts = [val(v) for v in ins if v is not None]
        kind = {"Min": "min", "Max": "max"}.get(op, "add")
        r = parts[0]
        for p in parts[1:]:
            r = b.emit(kind, (r, p))
        if op == "Mean":
            r = b.emit("mul", (r, b.const(1.0 / len(parts))))
        b.set(outs[0], r)
        return
    if op == "Where":
        b.set(
            outs[0],
            b.emit("where", (val(ins[0]), val(ins[1]), val(ins[2])), b.body[val(ins[1])].ctype),
        )
        return
    if op in PASS_THROUGH:
        if (
            op == "Dropout"
            and len(outs) > 1
            and (outs[1].users or outs[1].name in graph_outputs(node))
        ):
            raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"Dropout mask is read ({node.name})")
        b.set(outs[0], val(ins[0]))
        return
    if op in ("Cast", "CastLike"):
        to = b.dtype(outs[0])
        storage = storage_of(to, f"{node.name} output")
        a = val(ins[0])
        rnd = storage if storage in ("f16", "bf16", "i32") else ""
        b.set(
            outs[0],
            b.emit("cast", (a,), STORAGE_COMPUTE[storage], to=STORAGE_COMPUTE[storage], round=rnd),
        )
        return
    if op in ("Expand",):
        shape = ints_of(ins[1])
        if shape is None:
            raise KernelRefused(
                KernelReason.UNSUPPORTED_OP, f"{node.name}: Expand shape known only at run time"
            )
        b.shape_sources.append(tuple(shape))
        a = val(ins[0])
        wide = broadcast_shapes([b.shapes[a], tuple(shape)])
        b.set(outs[0], b.emit("id", (a,), shape=wide))  # its own shape: the source keeps its
        return
    if op in ACTIVATIONS:
        b.set(outs[0], ACTIVATIONS[op](b, node, val(ins[0])))
        return
    if op == "Clip":
        x = val(ins[0])
        lo = node.attr("min") if len(ins) < 2 else None
        hi = node.attr("max") if len(ins) < 2 else None
        r = x
        lo_i = (
            val(ins[1])
            if len(ins) > 1 and ins[1] is not None
            else (b.const(lo) if lo is not None else None)
        )
        hi_i = (
            val(ins[2])
            if len(ins) > 2 and ins[2] is not None
            else (b.const(hi) if hi is not None else None)
        )
        if lo_i is not None:
            r = b.emit("max", (r, lo_i))
        if hi_i is not None:
            r = b.emit("min", (r, hi_i))
        b.set(outs[0], r)
        return
    if op == "PRelu":
        x, s = val(ins[0]), val(ins[1])
        neg = b.emit("lt", (x, b.const(0.0)), "bool")
        b.set(outs[0], b.emit("where", (neg, b.emit("mul", (x, s)), x)))
        return
    if op.startswith("Reduce"):
        lower_reduce(b, node)
        return
    if op in ("Softmax", "LogSoftmax"):
        lower_softmax(b, node)
        return
    if op in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"):
        lower_layer_norm(b, node)
        return
    if op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten") and leading_ones_only(b, node):
        a = val(ins[0])
        shape = b.declared(outs[0]) or leading_reshape(node, b.shapes[a])
        b.set(outs[0], b.emit("id", (a,), shape=shape))  # the output's own rank
        return
    if op == "Concat":
        lower_concat(b, node)
        return
    if op in VIEW_OPS and b.branch is None:
        view = view_of(b, node)
        if view is not None:  # pushed down to the loads: the producers are recomputed there
            b.set(outs[0], viewed_value(b, ins[0], (view,)))
            return
    if op in VIEW_OPS:
        raise KernelRefused(
            KernelReason.LAYOUT_INSIDE,
            f"{op} {node.name!r} reorders a value computed inside the group (only group inputs "
            f"can be viewed)",
        )
    raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"{op} ({node.name}) has no kernel lowering")


def lower_concat(b: Builder, node: Node) -> None:
    """``Concat`` along the last axis: each branch (the input and the nodes only it needs) is
    lowered on its own, its loads tagged, so the C kernel can run one inner loop per branch."""
    out = node.outputs[0]
    rank = len(b.shape(node.inputs[0]))
    axis = int(node.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if axis != rank - 1:
        raise KernelRefused(KernelReason.LAYOUT_INSIDE, f"{node.name}: Concat on an inner axis")
    if b.concat is not None or b.branch is not None:
        raise KernelRefused(KernelReason.LAYOUT_INSIDE, f"{node.name}: a second Concat")
    args, shapes = [], []
    b.main_env = b.env
    for k, u in enumerate(node.inputs):
        b.branch, b.env = (-1, k), {}
        try:
            for n in b.branch_nodes.get(id(u), []):
                lower_node(b, n)
            idx = b.value(u)
        finally:
            b.branch, b.env = None, b.main_env
        args.append(idx)
        shapes.append(b.shapes[idx])
    shape = b.declared(out)
    if shape is None:
        lead = broadcast_shapes([s[:-1] for s in shapes])
        shape = (*lead, sum(s[-1] for s in shapes))
    b.body.append(Instr("concat", tuple(args), (("axis", -1),), b.body[args[0]].ctype, ELEM))
    cid = len(b.body) - 1
    b.shapes[cid] = shape
    # each branch's length along the axis comes from one of its inputs at run time
    reps = []
    for k in range(len(args)):
        rep = next(
            (
                i
                for i, inp in enumerate(b.inputs)
                if inp.branch == (-1, k) and b.shapes_of_input(i)[-1:] == shapes[k][-1:] != (1,)
            ),
            None,
        )
        if rep is None:
            raise KernelRefused(
                KernelReason.LAYOUT_INSIDE, f"{node.name}: branch {k} reads no input of its length"
            )
        reps.append(rep)
    b.inputs = [
        KernelInput(i.name, i.dtype, i.views, (cid, i.branch[1])) if i.branch else i
        for i in b.inputs
    ]
    b.concat = (cid, tuple(reps))
    b.set(out, cid)
