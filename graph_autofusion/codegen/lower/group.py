"""A planned group into one kernel: the contraction prologue, run-time reshapes, the order of
the nodes, the outputs, pruning and the loop levels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graph_autofusion.codegen.kernel_ir import (
    ELEM,
    ROW,
    STORAGE_COMPUTE,
    Instr,
    Kernel,
    KernelInput,
    KernelOutput,
    View,
)
from graph_autofusion.codegen.lower.builder import Builder, leading_ones_only, view_of
from graph_autofusion.codegen.lower.common import (
    CONTRACTIONS,
    VIEW_OPS,
    GroupLowering,
    KernelReason,
    KernelRefused,
    broadcast_shapes,
    ints_of,
    storage_of,
)
from graph_autofusion.codegen.lower.nodes import lower_node
from graph_autofusion.ir.core import Node, Value


def lower_group(
    nodes: Sequence[Node],
    outputs: Sequence[Value],
    binding: Any,
    *,
    name: str = "kernel",
    opset: int = 17,
) -> GroupLowering:
    """Lower ``nodes`` (topological order) whose ``outputs`` are read outside the group.

    ``binding`` gives concrete shapes and dtypes (a :class:`~graph_autofusion.cost.shapes.
    ShapeBinding`, or ``None`` to use the values' own static shapes).

    Raises:
        KernelRefused: the group holds something the kernel IR cannot express.
    """
    nodes = list(nodes)
    prologue: list[Node] = []
    if nodes and nodes[0].op_type in CONTRACTIONS:
        prologue.append(nodes.pop(0))
        if not nodes:
            raise KernelRefused(KernelReason.CONTRACTION, "a contraction alone is no kernel")
    inside_ids = {id(n) for n in nodes}
    made_outside = {id(o) for n in prologue for o in n.outputs}
    produced_all = {id(o) for n in nodes for o in n.outputs}
    for n in list(nodes):  # run-time-shaped Reshapes of group inputs: torch views, before
        x = n.inputs[0] if n.inputs else None
        if (
            n.op_type == "Reshape"
            and x is not None
            and (id(x) not in produced_all or id(x) in made_outside)
            and ints_of(n.inputs[1]) is None
            and all(id(u) in inside_ids for u in n.outputs[0].user_nodes)
            and n.outputs[0] not in outputs
        ):
            prologue.append(n)
            nodes.remove(n)
            made_outside.add(id(n.outputs[0]))
    # views of group inputs (through other views) that the group also outputs: nothing for
    # the kernel to compute, so the runtime's own nodes make them, before it
    out_set = {id(v) for v in outputs}
    chain: dict[int, list[Node]] = {}  # output id -> the view nodes from a group input to it
    for n in nodes:
        x = n.inputs[0] if n.inputs else None
        if n.op_type not in VIEW_OPS or x is None or not n.outputs:
            continue
        # its other inputs (a Slice's bounds, a Reshape's shape) must come from outside too:
        # a moved node still reads them after the group's other nodes are gone
        rest = [v for v in n.inputs[1:] if v is not None]
        if any(id(v) in produced_all and id(v) not in made_outside for v in rest):
            continue
        if id(x) not in produced_all or id(x) in made_outside:
            chain[id(n.outputs[0])] = [n]
        elif id(x) in chain:
            chain[id(n.outputs[0])] = [*chain[id(x)], n]
    moved: set[int] = set()  # the outputs of the views moved before the kernel
    for key, path in chain.items():
        if key in out_set:
            for n in path:
                if n in nodes:
                    prologue.append(n)
                    nodes.remove(n)
                    moved.update(id(o) for o in n.outputs)
    made_outside |= moved
    outputs = [v for v in outputs if id(v) not in moved]
    for n in nodes:
        if n.op_type in CONTRACTIONS:
            raise KernelRefused(
                KernelReason.CONTRACTION, f"{n.op_type} {n.name!r} is not the group's first node"
            )
        if n.captures:
            raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"{n.name} carries a subgraph")
    _fill_types([*prologue, *nodes], binding, opset)
    b = Builder(binding, opset, lower_node=lower_node)
    inside = {id(n) for n in nodes}
    produced = {id(o) for n in nodes for o in n.outputs}
    # layout ops reading a group input (directly or through other views) become views;
    # Identity of a group input is an alias; a reshape whose result only leaves the group is
    # a view of the output (the call reshapes the output tensor it wrote)
    body_nodes: list[Node] = []
    out_views: dict[int, tuple[Value, tuple[View, ...]]] = {}
    out_ids = {id(v) for v in outputs}
    for n in nodes:
        x = n.inputs[0] if n.inputs else None
        out = n.outputs[0] if n.outputs else None
        only_inside = out is not None and all(id(u) in inside for u in out.user_nodes)
        external = x is not None and (id(x) not in produced or id(x) in b.views)
        if n.op_type == "Identity" and external and only_inside and id(out) not in out_ids:
            b.views[id(out)] = b.views.get(id(x), (x, ()))
            continue
        if (
            n.op_type in VIEW_OPS
            and external
            and not (
                n.op_type in ("Unsqueeze", "Squeeze", "Reshape", "Flatten")
                and leading_ones_only(b, n)
            )
        ):
            view = view_of(b, n)
            if view is not None and only_inside and id(out) not in out_ids:
                src, chain = b.views.get(id(x), (x, ()))
                b.views[id(out)] = (src, (*chain, view))
                continue
        if (
            n.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
            and x is not None
            and id(x) in produced
            and id(x) not in b.views
            and id(out) in out_ids
            and not any(id(u) in inside for u in out.user_nodes)
        ):
            view = view_of(b, n)
            if view is not None:
                src, chain = out_views.get(id(x), (x, ()))
                out_views[id(out)] = (src, (*chain, view))
                continue
        body_nodes.append(n)
    for n in body_nodes:
        for o in n.outputs:
            b.produced.add(id(o))
            b.node_of[id(o)] = n
    b.branch_nodes = branch_nodes(body_nodes, outputs)
    in_branch = {id(n) for ns in b.branch_nodes.values() for n in ns}
    for n in body_nodes:
        if id(n) not in in_branch:
            lower_node(b, n)
    outs: list[KernelOutput] = []
    dropped = b.dropped
    for v in outputs:
        views: tuple[View, ...] = ()
        if id(v) in out_views:
            v_out = v
            v, views = out_views[id(v)]
        else:
            v_out = v
        if id(v) not in b.env:
            raise KernelRefused(
                KernelReason.OUTPUT_SHAPE, f"output {v.name!r} is not computed by the group"
            )
        idx = b.env[id(v)]
        if b.body[idx].op in ("load", "const"):
            raise KernelRefused(
                KernelReason.OUTPUT_SHAPE,
                f"output {v.name!r} is a group input or a view of one: nothing to compute",
            )
        storage = storage_of(b.dtype(v), f"output {v.name!r}")
        if STORAGE_COMPUTE[storage] != b.body[idx].ctype:
            raise KernelRefused(
                KernelReason.UNSUPPORTED_DTYPE,
                f"output {v.name!r}: {storage} from {b.body[idx].ctype}",
            )
        declared = b.declared(v)
        if declared is not None:
            out_rank = len(declared)
        elif id(v) in dropped:
            out_rank = len(b.shapes[idx]) - len(b.reduce_axes or ())
        else:
            out_rank = len(b.shapes[idx])
        outs.append(
            KernelOutput(v_out.name, storage, idx, ELEM, id(v) not in dropped, out_rank, views)
        )
    # the loop shape: every value broadcasts to it
    outs = _prune(b, outs)  # values only a pushed-down view read are dead at their own index
    in_branches = {
        j for j, ins in enumerate(b.body) if ins.op == "load" and b.inputs[ins.attr("input")].branch
    }
    branch_instrs = _branch_instrs(b, in_branches)
    shapes = [s for j, s in b.shapes.items() if j not in branch_instrs] + list(b.shape_sources)
    loop = broadcast_shapes(shapes)
    widest = max(1, max((o.rank for o in outs), default=0))  # rank 0 runs as rank 1
    loop = (1,) * (widest - len(loop)) + tuple(loop)
    rank = len(loop)
    reduce_axes: tuple[int, ...] = ()
    if b.reduce_axes is not None:
        reduce_axes = tuple(a + rank for a in b.reduce_axes)
        if any(loop[a] != e for a, e in zip(reduce_axes, b.reduce_extent)):
            raise KernelRefused(
                KernelReason.BROADCAST, "a reduced axis is broadcast by another value"
            )
    # levels: a value with size 1 on every reduced axis, computed from such values, is row-level
    body = _levels(b, rank, reduce_axes)
    for i, o in enumerate(outs):
        ins = body[o.instr]
        shape = (1,) * (rank - len(b.shapes[o.instr])) + tuple(b.shapes[o.instr])
        want_elem = tuple(loop)
        if ins.level == ROW:
            want_row = tuple(1 if a in reduce_axes else d for a, d in enumerate(loop))
            if shape != want_row:
                raise KernelRefused(
                    KernelReason.OUTPUT_SHAPE, f"output {o.name!r} {shape} is not one value per row"
                )
            outs[i] = KernelOutput(o.name, o.dtype, o.instr, ROW, o.keepdims, o.rank, o.views)
        elif shape != want_elem:
            raise KernelRefused(
                KernelReason.OUTPUT_SHAPE,
                f"output {o.name!r} of shape {list(shape)} is narrower than the loop {list(loop)}",
            )
        elif not o.keepdims:
            raise KernelRefused(
                KernelReason.OUTPUT_SHAPE, f"output {o.name!r} drops axes it does not reduce"
            )
    for n in body_nodes:  # a keepdims=0 reduction read inside the group changes alignment
        for v in n.all_inputs():
            if id(v) in dropped:
                raise KernelRefused(
                    KernelReason.REDUCTION_MISMATCH,
                    f"{n.name} reads {v.name!r}, a reduction without keepdims, inside the group",
                )
    if b.concat is not None and (reduce_axes or b.shapes[b.concat[0]][-1:] != loop[-1:]):
        raise KernelRefused(
            KernelReason.LAYOUT_INSIDE,
            "a Concat only along the last axis of an elementwise kernel's loop",
        )
    kernel = Kernel(
        name,
        rank,
        reduce_axes,
        tuple(b.inputs),
        tuple(outs),
        tuple(body),
        tuple(n.op_type for n in prologue + nodes),
        tuple(n.name for n in prologue + nodes),
        tuple(b.shape_sources),
        concat=b.concat,
    )
    return GroupLowering(kernel, prologue)


def _prune(b: Builder, outs: list[KernelOutput]) -> list[KernelOutput]:
    """Drop the instructions no output needs (and the inputs only they read); renumber."""
    live: set[int] = set()
    stack = [o.instr for o in outs]
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(b.body[i].args)
    if len(live) == len(b.body):
        return outs
    order = sorted(live)
    remap = {old: new for new, old in enumerate(order)}
    used = sorted({b.body[i].attr("input") for i in order if b.body[i].op == "load"})
    in_remap = {old: new for new, old in enumerate(used)}
    body = []
    for i in order:
        ins = b.body[i]
        attrs = ins.attrs
        if ins.op == "load":
            attrs = tuple((k, in_remap[v] if k == "input" else v) for k, v in attrs)
        body.append(Instr(ins.op, tuple(remap[a] for a in ins.args), attrs, ins.ctype, ins.level))
    b.body = body
    b.shapes = {remap[i]: sh for i, sh in b.shapes.items() if i in remap}
    b.symbolic = {remap[i]: sh for i, sh in b.symbolic.items() if i in remap}
    inputs = []
    for old in used:
        inp = b.inputs[old]
        if inp.branch is not None:
            inp = KernelInput(inp.name, inp.dtype, inp.views, (remap[inp.branch[0]], inp.branch[1]))
        inputs.append(inp)
    b.inputs = inputs
    b.input_values = [b.input_values[old] for old in used]
    if b.concat is not None:
        cid, reps = b.concat
        b.concat = (remap[cid], tuple(in_remap[r] for r in reps)) if cid in remap else None
    if not any(ins.op == "reduce" for ins in body):
        b.reduce_axes = None
    return [
        KernelOutput(o.name, o.dtype, remap[o.instr], o.level, o.keepdims, o.rank, o.views)
        for o in outs
    ]


def _branch_instrs(b: Builder, seeds: set[int]) -> set[int]:
    """Instructions computed inside a Concat branch (from its loads, up to the concat)."""
    inside = set(seeds)
    for j, ins in enumerate(b.body):
        if (
            ins.op != "concat"
            and ins.args
            and all(a in inside or b.body[a].op == "const" for a in ins.args)
            and any(a in inside for a in ins.args)
        ):
            inside.add(j)
    return inside


def _fill_types(nodes: Sequence[Node], binding: Any, opset: int) -> None:
    """Type the outputs the model left untyped (static shapes only; best effort)."""
    from graph_autofusion.runtime.torch_runtime import infer_node_types

    for n in nodes:
        if any((binding.dtype(v) if binding is not None else v.dtype) is None for v in n.outputs):
            infer_node_types(n, opset)


def _levels(b: Builder, rank: int, reduce_axes: tuple[int, ...]) -> list[Instr]:
    out: list[Instr] = []
    for i, ins in enumerate(b.body):
        if not reduce_axes:
            out.append(ins)
            continue
        if ins.op == "reduce":
            level = ROW
        elif ins.op in ("const", "rowlen"):
            level = ROW
        elif ins.op == "load":
            sym = b.symbolic.get(i)
            if sym is not None and len(sym) == len(b.shapes[i]):
                sym = (1,) * (rank - len(sym)) + tuple(sym)
                ones = all(sym[a] == 1 and isinstance(sym[a], int) for a in reduce_axes)
            else:  # no declared shape: a sample 1 may be a symbol; elem is always correct
                ones = False
            level = ROW if ones else ELEM
        else:
            level = ROW if all(out[a].level == ROW for a in ins.args) else ELEM
        out.append(Instr(ins.op, ins.args, ins.attrs, ins.ctype, level))
    return out


def branch_nodes(nodes: Sequence[Node], outputs: Sequence[Value]) -> dict[int, list[Node]]:
    """Per ``Concat`` input: the group nodes whose results reach only that input (they are
    lowered inside the branch, at its own index)."""
    out_ids = {id(v) for v in outputs}
    pos = {id(n): i for i, n in enumerate(nodes)}
    found: dict[int, list[Node]] = {}
    for c in nodes:
        if c.op_type != "Concat":
            continue
        for u in c.inputs:
            if u is None:
                continue
            mine: set[int] = set()
            frontier = [u]
            while frontier:
                v = frontier.pop()
                n = v.producer
                if n is None or id(n) not in pos or id(n) in mine:
                    continue
                ok = all(
                    id(o) not in out_ids
                    and all((user is c and o is u) or id(user) in mine for user in o.user_nodes)
                    for o in n.outputs
                )
                if not ok:
                    continue
                mine.add(id(n))
                frontier.extend(x for x in n.inputs if x is not None)
            found[id(u)] = sorted((n for n in nodes if id(n) in mine), key=lambda n: pos[id(n)])
    return found
