"""The kernel builder: instructions, loads of group inputs, and layout views (``Transpose``,
``Reshape``, ``Slice``, ... on group inputs become strided views; an elementwise producer
read through a view is recomputed under it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graph_autofusion.codegen.kernel_ir import (
    ELEM,
    FLOAT_ONLY,
    STORAGE_COMPUTE,
    Instr,
    KernelInput,
    View,
)
from graph_autofusion.codegen.lower.common import (
    VIEW_OPS,
    KernelReason,
    KernelRefused,
    axes_of,
    broadcast_shapes,
    ints_of,
    storage_of,
)
from graph_autofusion.codegen.views import apply_views
from graph_autofusion.ir.core import Node, Value, const_value
from graph_autofusion.ir.dtypes import DType


class Builder:
    def __init__(
        self, binding: Any, opset: int = 17, *, lower_node: Callable[[Builder, Node], None]
    ) -> None:
        #: lowers one node (``nodes.lower_node``; a view recomputes a producer with it)
        self.lower_node = lower_node
        self.binding = binding
        self.opset = opset
        self.reduce_extent: tuple[int, ...] = ()
        self.dropped: dict[int, int] = {}
        self.symbolic: dict[int, tuple | None] = {}  # load instr -> the value's declared shape
        self.input_values: list[Value] = []  # the (viewed) value each kernel input loads
        self.branch: tuple[int, int] | None = None  # lowering inside a Concat branch
        self.main_env: dict[int, int] = {}
        self.branch_nodes: dict[int, list[Node]] = {}  # id(concat input) -> its own nodes
        self.concat: tuple[int, tuple[int, ...]] | None = None
        #: while recomputing a producer under a layout view: (the view chain, the viewed value)
        self.view_ctx: tuple[tuple[View, ...], Value] | None = None
        self.venv: dict[tuple[int, tuple[View, ...]], int] = {}
        self.produced: set[int] = set()  # id() of values computed inside the group
        self.node_of: dict[int, Node] = {}  # id(value) -> the group node computing it
        self.body: list[Instr] = []
        self.env: dict[int, int] = {}  # id(Value) -> instr index
        self.inputs: list[KernelInput] = []
        self.input_index: dict[tuple, int] = {}
        self.shapes: dict[int, tuple[int, ...]] = {}  # instr -> shape (right-aligned)
        self.reduce_axes: tuple[int, ...] | None = None
        self.rank = 0
        self.shape_sources: list[tuple[int, ...]] = []
        self.views: dict[int, tuple[Value, tuple[View, ...]]] = {}  # id(view out) -> source

    # -------------------------------------------------------------- helpers
    def declared(self, v: Value) -> tuple[int, ...] | None:
        s = self.binding.shape(v) if self.binding is not None else v.shape
        if s is None or any(not isinstance(d, int | np.integer) for d in s):
            return None
        return tuple(int(d) for d in s)

    def shape(self, v: Value) -> tuple[int, ...]:
        s = self.declared(v)
        if s is None and id(v) in self.env:
            return self.shapes[self.env[id(v)]]
        if s is None:
            raise KernelRefused(KernelReason.UNKNOWN_SHAPE, f"value {v.name!r} has no static shape")
        return s

    def dtype(self, v: Value) -> DType | None:
        dt = self.binding.dtype(v) if self.binding is not None else v.dtype
        if dt is None and id(v) in self.env:
            return {"f32": DType.FLOAT, "i64": DType.INT64, "bool": DType.BOOL}[
                self.body[self.env[id(v)]].ctype
            ]
        return dt

    def emit(
        self, op: str, args: Sequence[int] = (), ctype: str | None = None, shape=None, **attrs: Any
    ) -> int:
        if ctype is None:
            src = args[1] if op == "where" else (args[0] if args else None)
            ctype = self.body[src].ctype if src is not None else "f32"
        if op in FLOAT_ONLY and ctype != "f32" and op not in ("isnan", "isinf"):
            raise KernelRefused(KernelReason.UNSUPPORTED_DTYPE, f"{op} on {ctype} values")
        if shape is None:
            shape = broadcast_shapes([self.shapes[a] for a in args]) if args else ()
        self.body.append(Instr(op, tuple(args), tuple(sorted(attrs.items())), ctype, ELEM))
        idx = len(self.body) - 1
        self.shapes[idx] = shape
        return idx

    def const(self, value: float | int | bool, ctype: str = "f32") -> int:
        if ctype == "f32":
            value = float(value)
        elif ctype == "i64":
            value = int(value)
        else:
            value = bool(value)
        return self.emit("const", (), ctype, (), value=value)

    def value(self, v: Value | None) -> int:
        """The instruction computing ``v`` (a load, an immediate, or an earlier result)."""
        if v is None:
            raise KernelRefused(KernelReason.UNSUPPORTED_OP, "an omitted input is read")
        if self.view_ctx is not None:
            chain, wide = self.view_ctx
            return viewed_value(self, v, adapt_chain(chain, v, wide))
        if id(v) in self.env:
            return self.env[id(v)]
        if self.branch is not None and id(v) in self.main_env:
            i = self.main_env[id(v)]
            if self.body[i].op == "const":
                return i
            raise KernelRefused(
                KernelReason.LAYOUT_INSIDE,
                f"a Concat branch reads {v.name!r}, computed outside the branch",
            )
        c = const_value(v)
        dt = self.dtype(v)
        if dt is None and id(v) in self.views:  # a view has its source's dtype
            dt = self.dtype(self.views[id(v)][0])
        storage = storage_of(dt, f"value {v.name!r}")
        ctype = STORAGE_COMPUTE[storage]
        if c is not None and np.asarray(c).size == 1:
            item = np.asarray(c).reshape(-1)[0]
            if storage in ("f16", "bf16"):  # the immediate carries its storage rounding
                item = float(np.float32(item))
            idx = self.const(item.item() if hasattr(item, "item") else item, ctype)
            self.shapes[idx] = tuple(np.asarray(c).shape)
            self.env[id(v)] = idx
            return idx
        source, views = self.views.get(id(v), (v, ()))
        shape = self.declared(v)
        if shape is None and views:  # the view's shape from its source's
            shape = self.view_shape(source, views)
        idx = self.load(v, source, views, storage, shape or self.shape(v))
        self.symbolic[idx] = v.shape
        self.env[id(v)] = idx
        return idx

    def load(
        self, v: Value, source: Value, views: tuple[View, ...], storage: str, shape: tuple
    ) -> int:
        """A load of group input ``source`` through ``views`` (one kernel input per source,
        views and Concat branch)."""
        key = (source.name, views, self.branch)
        if key not in self.input_index:
            self.input_index[key] = len(self.inputs)
            self.inputs.append(KernelInput(source.name, storage, views, self.branch))
            self.input_values.append(v)
        return self.emit("load", (), STORAGE_COMPUTE[storage], shape, input=self.input_index[key])

    def view_shape(self, source: Value, views: tuple[View, ...]) -> tuple[int, ...]:

        return tuple(apply_views(np.empty(self.shape(source), np.uint8), views).shape)

    def plain_value(self, v: Value) -> int:
        """:meth:`value` outside any view context (an immediate, a group input as it is)."""
        saved, self.view_ctx = self.view_ctx, None
        try:
            return self.value(v)
        finally:
            self.view_ctx = saved

    def shapes_of_input(self, i: int) -> tuple[int, ...]:
        """The (viewed) shape kernel input ``i`` is loaded with."""
        for j, ins in enumerate(self.body):
            if ins.op == "load" and ins.attr("input") == i:
                return self.shapes[j]
        return ()

    def set(self, v: Value, idx: int) -> None:
        if self.view_ctx is not None:
            self.venv[(id(v), self.view_ctx[0])] = idx
            return
        self.env[id(v)] = idx
        declared = self.declared(v)
        if declared is None:
            return
        if broadcast_shapes([declared, self.shapes[idx]]) != declared:
            # the value is wider than what computed it (an Expand): keep its own shape
            self.shapes[idx] = declared


def view_of(b: Builder, node: Node) -> View | None:
    """The node as a :class:`View` of its data input, or ``None`` if it is not a pure view."""
    op = node.op_type
    x = node.inputs[0]
    rank_in = len(b.shape(x))
    if op == "Transpose":
        perm = node.attr("perm") or list(range(rank_in))[::-1]
        return View("transpose", tuple(int(p) for p in perm))
    if op == "Reshape":
        shape = ints_of(node.inputs[1])
        if shape is None:
            return None
        if int(node.attr("allowzero", 0)) and 0 in shape:
            return None
        return View("reshape", tuple(shape))
    if op == "Flatten":  # axis in [-r, r]: r flattens everything into the first dim
        axis = int(node.attr("axis", 1))
        return View("flatten", (axis + rank_in if axis < 0 else axis,))
    if op == "Unsqueeze":
        given = node.attr("axes")
        if given is None and len(node.inputs) > 1:
            given = ints_of(node.inputs[1])
        if given is None:
            return None
        r = rank_in + len(given)
        return View("unsqueeze", tuple(sorted(int(a) % r for a in given)))
    if op == "Squeeze":
        axes = axes_of(node, rank_in)
        if axes is None:  # the dims that are 1: only when the declared shape proves it
            sym = x.shape
            if sym is None or any(not isinstance(d, int) for d in sym):
                return None
            axes = [i for i, d in enumerate(sym) if d == 1]
        return View("squeeze", tuple(axes))
    if op == "Slice":
        if len(node.inputs) < 3:  # opset < 10: attributes
            starts, ends = node.attr("starts"), node.attr("ends")
            axes = node.attr("axes") or list(range(len(starts)))
            steps = [1] * len(starts)
        else:
            starts, ends = ints_of(node.inputs[1]), ints_of(node.inputs[2])
            axes = (
                ints_of(node.inputs[3])
                if len(node.inputs) > 3 and node.inputs[3] is not None
                else None
            )
            steps = (
                ints_of(node.inputs[4])
                if len(node.inputs) > 4 and node.inputs[4] is not None
                else None
            )
            if (
                starts is None
                or ends is None
                or (len(node.inputs) > 3 and node.inputs[3] is not None and axes is None)
            ):
                return None
            axes = axes if axes is not None else list(range(len(starts)))
            steps = steps if steps is not None else [1] * len(starts)
        if any(s <= 0 for s in steps):
            return None
        return View(
            "slice",
            tuple(
                (int(a) % rank_in, int(s), int(e), int(t))
                for a, s, e, t in zip(axes, starts, ends, steps)
            ),
        )
    if op == "Gather":
        idx = node.inputs[1]
        c = const_value(idx) if idx is not None else None
        if c is None or np.asarray(c).ndim != 0:
            return None
        return View("select", (int(node.attr("axis", 0)) % rank_in, int(c)))
    return None


REDUCING = {
    "Softmax", "LogSoftmax", "LayerNormalization", "SimplifiedLayerNormalization",
    "RMSNormalization", "Concat",
}  # fmt: skip


def viewed_value(b: Builder, v: Value, chain: tuple[View, ...]) -> int:
    """The instruction computing ``v`` seen through ``chain`` (layout views): a load of a
    group input through the composed views, or ``v``'s elementwise producer recomputed on
    its inputs seen through the same views (index arithmetic instead of a copy)."""
    if not chain:
        return b.plain_value(v)
    key = (id(v), chain)
    if key in b.venv:
        return b.venv[key]
    c = const_value(v)
    if c is not None and np.asarray(c).size == 1:
        b.venv[key] = b.plain_value(v)
        return b.venv[key]
    node = b.node_of.get(id(v))
    if node is None or id(v) in b.views:  # a group input (or a view of one): a load
        source, views = b.views.get(id(v), (v, ()))
        storage = storage_of(b.dtype(v) or b.dtype(source), f"value {v.name!r}")
        full = (*views, *chain)
        b.venv[key] = b.load(v, source, full, storage, b.view_shape(source, full))
        return b.venv[key]
    if node.op_type in VIEW_OPS and node.op_type != "Gather":
        inner = view_of(b, node)
        if inner is None:
            raise KernelRefused(KernelReason.LAYOUT_INSIDE, f"{node.name}: not a view")
        idx = viewed_value(b, node.inputs[0], (inner, *chain))
        b.venv[key] = idx
        return idx
    if node.op_type.startswith("Reduce") or node.op_type in REDUCING or len(node.outputs) != 1:
        raise KernelRefused(
            KernelReason.LAYOUT_INSIDE,
            f"a layout operator reorders {v.name!r}, the result of {node.op_type} {node.name!r}",
        )
    saved, b.view_ctx = b.view_ctx, (chain, v)
    try:
        b.lower_node(b, node)
    finally:
        b.view_ctx = saved
    return b.venv[key]


def adapt_chain(chain: tuple[View, ...], u: Value, wide: Value) -> tuple[View, ...]:
    """``chain`` (views of the value ``wide``) for ``u``, an input ``wide`` was computed from:
    ``u`` broadcasts to ``wide`` from the right, so it first gets ``wide``'s rank, and every
    view then treats ``u``'s broadcast (size-1) axes as size 1. Decided on declared shapes."""
    us, ws = u.shape, wide.shape
    if us is None or ws is None:
        raise KernelRefused(KernelReason.LAYOUT_INSIDE, f"{u.name!r} has no declared shape")
    if tuple(us) == tuple(ws):
        return chain
    ru, rw = len(us), len(ws)
    if ru > rw:
        raise KernelRefused(KernelReason.LAYOUT_INSIDE, f"{u.name!r} is wider than its user")
    out: list[View] = [View("unsqueeze", tuple(range(rw - ru)))] if ru < rw else []
    ushape, wshape = [1] * (rw - ru) + list(us), list(ws)
    for view in chain:
        if view.op == "transpose":
            out.append(view)
            ushape = [ushape[p] for p in view.args]
            wshape = [wshape[p] for p in view.args]
        elif view.op == "unsqueeze":
            out.append(view)
            for a in sorted(view.args):
                ushape.insert(a, 1)
                wshape.insert(a, 1)
        elif view.op == "squeeze":
            out.append(view)
            ushape = [d for i, d in enumerate(ushape) if i not in view.args]
            wshape = [d for i, d in enumerate(wshape) if i not in view.args]
        elif view.op == "slice":
            keep = []
            for spec in view.args:
                axis = spec[0]
                if ushape[axis] == wshape[axis]:
                    keep.append(spec)
                elif ushape[axis] != 1 or not isinstance(ushape[axis], int):
                    raise KernelRefused(
                        KernelReason.LAYOUT_INSIDE, f"{u.name!r}: slice of a broadcast"
                    )
            if keep:
                out.append(View("slice", tuple(keep)))
        elif view.op == "select":
            axis, _ = view.args
            if ushape[axis] == wshape[axis]:
                out.append(view)
            elif ushape[axis] == 1:
                out.append(View("squeeze", (axis,)))
            else:
                raise KernelRefused(
                    KernelReason.LAYOUT_INSIDE, f"{u.name!r}: select of a broadcast"
                )
            ushape.pop(axis)
            wshape.pop(axis)
        else:  # reshape, flatten: only of a value with the full shape
            raise KernelRefused(
                KernelReason.LAYOUT_INSIDE,
                f"a {view.op} of {wide.name!r} reads {u.name!r}, which is broadcast",
            )
    return tuple(out)


def leading_ones_only(b: Builder, node: Node) -> bool:
    """A reshape that only adds or removes leading 1s: a no-op under right-aligned
    broadcasting. Decided on the declared (symbolic) shapes and axes, never on sample sizes:
    a symbolic dim that happens to be 1 in the sample is not a 1."""
    op = node.op_type
    x, y = node.inputs[0], node.outputs[0]
    if op in ("Unsqueeze", "Squeeze"):
        rank = len(x.shape) if x.shape is not None else None
        if op == "Unsqueeze":
            axes = node.attr("axes")
            if axes is None and len(node.inputs) > 1:
                axes = ints_of(node.inputs[1])
            if axes is None or rank is None:
                return False
            k = len(axes)
            return sorted(int(a) % (rank + k) for a in axes) == list(range(k))
        if rank is None:
            return False
        axes = node.attr("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = ints_of(node.inputs[1])
        if axes is None:
            return False
        return sorted(int(a) % rank for a in axes) == list(range(len(axes))) and all(
            x.shape[i] == 1 for i in range(len(axes))
        )
    if x.shape is None or y.shape is None:
        return False

    def strip(s):
        s = list(s)
        while s and s[0] == 1 and isinstance(s[0], int):
            s.pop(0)
        return s

    a, c = strip(x.shape), strip(y.shape)
    return a == c and all(d is not None for d in a)


def leading_reshape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape after a leading-ones Unsqueeze/Squeeze (its rank is what reductions see)."""
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = ints_of(node.inputs[1])
    k = len(axes or ())
    if node.op_type == "Unsqueeze":
        return (1,) * k + tuple(shape)
    if node.op_type == "Squeeze":
        return tuple(shape[k:])
    return tuple(shape)
