"""Lower a planned group (a rule match or an automatic cluster) into one :class:`Kernel`.

    lowering = lower_group(nodes, outputs, binding, name="k0")
    lowering.kernel              # the kernel IR
    lowering.prologue            # a contraction the runtime's own GEMM computes first, or None

What a group may hold (everything else is refused with a :class:`KernelReason` code, at
planning time, so the planner never plans what this target cannot execute):

* elementwise and broadcast operators (arithmetic, comparisons, ``Where``, ``Cast``,
  activations with their attributes, ``Clip``, ``PRelu``, ``Dropout`` at inference, ``Expand``);
* reductions (``ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2``) over any axes, and the
  normalizations ``Softmax``, ``LogSoftmax``, ``LayerNormalization``,
  ``SimplifiedLayerNormalization`` / ``RMSNormalization``, decomposed into reductions with
  their prologue and epilogue; every reduction of a group reduces the same axes;
* layout operators on a group input (``Transpose``, ``Reshape``, ``Flatten``, ``Unsqueeze``,
  ``Squeeze``, ``Slice``, ``Gather`` of one constant index), which become strided views, and
  leading-1 reshapes anywhere (a no-op under broadcasting);
* a first ``MatMul``/``Gemm``/``Conv`` whose output feeds the rest: the runtime's GEMM
  computes it, the kernel is its epilogue (one pass over the product).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion import reasons
from graph_autofusion.codegen.kernel_ir import (
    ELEM,
    FLOAT_ONLY,
    ROW,
    STORAGE_COMPUTE,
    Instr,
    Kernel,
    KernelInput,
    KernelOutput,
    View,
)
from graph_autofusion.codegen.views import apply_views
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Node, Value, const_value
from graph_autofusion.ir.dtypes import DType


class KernelReason:
    """Why a group cannot become a generated kernel (reason codes, docs/reasons.md)."""

    UNSUPPORTED_OP = reasons.CODEGEN_UNSUPPORTED_OP
    UNSUPPORTED_DTYPE = reasons.CODEGEN_UNSUPPORTED_DTYPE
    UNKNOWN_SHAPE = reasons.CODEGEN_UNKNOWN_SHAPE
    LAYOUT_INSIDE = reasons.CODEGEN_LAYOUT_INSIDE
    REDUCTION_MISMATCH = reasons.CODEGEN_REDUCTION_MISMATCH
    BROADCAST = reasons.CODEGEN_BROADCAST
    OUTPUT_SHAPE = reasons.CODEGEN_OUTPUT_SHAPE
    CONTRACTION = reasons.CODEGEN_CONTRACTION_NOT_FIRST
    COMPILE_FAILED = reasons.CODEGEN_COMPILE_FAILED


class KernelRefused(GraphAutoFusionError):
    """A group cannot be lowered; ``code`` is a :class:`KernelReason`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_STORAGE = {
    DType.FLOAT: "f32",
    DType.FLOAT16: "f16",
    DType.BFLOAT16: "bf16",
    DType.INT64: "i64",
    DType.INT32: "i32",
    DType.BOOL: "bool",
}

CONTRACTIONS = {"MatMul", "Gemm", "Conv", "FusedMatMul"}
_VIEW_OPS = {"Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Slice", "Gather"}
_PASS = {"Identity", "Dropout"}


def storage_of(dtype: DType | None, where: str) -> str:
    """The kernel storage name of an IR dtype (refused when the kernel cannot hold it)."""
    s = _STORAGE.get(dtype) if dtype is not None else None
    if s is None:
        name = dtype.name if dtype is not None else "unknown"
        raise KernelRefused(KernelReason.UNSUPPORTED_DTYPE, f"{where} has dtype {name}")
    return s


@dataclass
class GroupLowering:
    """A group lowered: its kernel, and the nodes torch computes before it (a first
    contraction, whose output the kernel reads once; ``Reshape`` of a group input to a shape
    known only at run time, a zero-copy view of a contiguous tensor)."""

    kernel: Kernel
    prologue: list[Node] = field(default_factory=list)


class _Builder:
    def __init__(self, binding: Any, opset: int = 17) -> None:
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
            shape = _broadcast([self.shapes[a] for a in args]) if args else ()
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
            return _viewed(self, v, _adapt(chain, v, wide))
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
        if _broadcast([declared, self.shapes[idx]]) != declared:
            # the value is wider than what computed it (an Expand): keep its own shape
            self.shapes[idx] = declared


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes)) if shapes else ()
    except ValueError as exc:
        raise KernelRefused(
            KernelReason.BROADCAST, f"shapes {list(shapes)} do not broadcast"
        ) from exc


def _ints(v: Value | None) -> list[int] | None:
    if v is None:
        return None
    c = const_value(v)
    return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]


def _axes(node: Node, rank: int, *, input_index: int = 1, attr: str = "axes") -> list[int] | None:
    axes = node.attr(attr)
    if axes is None and len(node.inputs) > input_index and node.inputs[input_index] is not None:
        axes = _ints(node.inputs[input_index])
        if axes is None:
            raise KernelRefused(
                KernelReason.UNSUPPORTED_OP, f"{node.name}: axes known only at run time"
            )
    if axes is None:
        return None
    return sorted(int(a) % rank if rank else 0 for a in np.asarray(axes).reshape(-1))


# ------------------------------------------------------------------ views on inputs
def _view_of(b: _Builder, node: Node) -> View | None:
    """The node as a :class:`View` of its data input, or ``None`` if it is not a pure view."""
    op = node.op_type
    x = node.inputs[0]
    rank_in = len(b.shape(x))
    if op == "Transpose":
        perm = node.attr("perm") or list(range(rank_in))[::-1]
        return View("transpose", tuple(int(p) for p in perm))
    if op == "Reshape":
        shape = _ints(node.inputs[1])
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
            given = _ints(node.inputs[1])
        if given is None:
            return None
        r = rank_in + len(given)
        return View("unsqueeze", tuple(sorted(int(a) % r for a in given)))
    if op == "Squeeze":
        axes = _axes(node, rank_in)
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
            starts, ends = _ints(node.inputs[1]), _ints(node.inputs[2])
            axes = (
                _ints(node.inputs[3])
                if len(node.inputs) > 3 and node.inputs[3] is not None
                else None
            )
            steps = (
                _ints(node.inputs[4])
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


# ------------------------------------------------------------------ operators
#: ``Pow`` by these constant exponents becomes multiplications, a square root or a
#: reciprocal (the vector ``powf`` is a log and an exp: ~10x the time of a multiply).
_SMALL_POWERS = (1.0, 2.0, 3.0, 4.0, 0.5, -1.0, -0.5)


def _lower_small_pow(b: _Builder, node: Node) -> bool:
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


def _lower_node(b: _Builder, node: Node) -> None:
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
    if op in _PASS:
        if (
            op == "Dropout"
            and len(outs) > 1
            and (outs[1].users or outs[1].name in _graph_outputs(node))
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
        shape = _ints(ins[1])
        if shape is None:
            raise KernelRefused(
                KernelReason.UNSUPPORTED_OP, f"{node.name}: Expand shape known only at run time"
            )
        b.shape_sources.append(tuple(shape))
        a = val(ins[0])
        wide = _broadcast([b.shapes[a], tuple(shape)])
        b.set(outs[0], b.emit("id", (a,), shape=wide))  # its own shape: the source keeps its
        return
    if op in _ACTIVATIONS:
        b.set(outs[0], _ACTIVATIONS[op](b, node, val(ins[0])))
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
        _reduce(b, node)
        return
    if op in ("Softmax", "LogSoftmax"):
        _softmax(b, node)
        return
    if op in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"):
        _layer_norm(b, node)
        return
    if op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten") and _leading_ones_only(b, node):
        a = val(ins[0])
        shape = b.declared(outs[0]) or _leading_reshape(node, b.shapes[a])
        b.set(outs[0], b.emit("id", (a,), shape=shape))  # the output's own rank
        return
    if op == "Concat":
        _concat(b, node)
        return
    if op in _VIEW_OPS and b.branch is None:
        view = _view_of(b, node)
        if view is not None:  # pushed down to the loads: the producers are recomputed there
            b.set(outs[0], _viewed(b, ins[0], (view,)))
            return
    if op in _VIEW_OPS:
        raise KernelRefused(
            KernelReason.LAYOUT_INSIDE,
            f"{op} {node.name!r} reorders a value computed inside the group (only group inputs "
            f"can be viewed)",
        )
    raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"{op} ({node.name}) has no kernel lowering")


_REDUCING = {
    "Softmax", "LogSoftmax", "LayerNormalization", "SimplifiedLayerNormalization",
    "RMSNormalization", "Concat",
}  # fmt: skip


def _viewed(b: _Builder, v: Value, chain: tuple[View, ...]) -> int:
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
    if node.op_type in _VIEW_OPS and node.op_type != "Gather":
        inner = _view_of(b, node)
        if inner is None:
            raise KernelRefused(KernelReason.LAYOUT_INSIDE, f"{node.name}: not a view")
        idx = _viewed(b, node.inputs[0], (inner, *chain))
        b.venv[key] = idx
        return idx
    if node.op_type.startswith("Reduce") or node.op_type in _REDUCING or len(node.outputs) != 1:
        raise KernelRefused(
            KernelReason.LAYOUT_INSIDE,
            f"a layout operator reorders {v.name!r}, the result of {node.op_type} {node.name!r}",
        )
    saved, b.view_ctx = b.view_ctx, (chain, v)
    try:
        _lower_node(b, node)
    finally:
        b.view_ctx = saved
    return b.venv[key]


def _adapt(chain: tuple[View, ...], u: Value, wide: Value) -> tuple[View, ...]:
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


def _concat(b: _Builder, node: Node) -> None:
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
                _lower_node(b, n)
            idx = b.value(u)
        finally:
            b.branch, b.env = None, b.main_env
        args.append(idx)
        shapes.append(b.shapes[idx])
    shape = b.declared(out)
    if shape is None:
        lead = _broadcast([s[:-1] for s in shapes])
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


def _branch_nodes(nodes: Sequence[Node], outputs: Sequence[Value]) -> dict[int, list[Node]]:
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


def _graph_outputs(node: Node) -> set[str]:
    g = node.graph
    return {v.name for v in g.outputs} if g is not None else set()


def _leading_ones_only(b: _Builder, node: Node) -> bool:
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
                axes = _ints(node.inputs[1])
            if axes is None or rank is None:
                return False
            k = len(axes)
            return sorted(int(a) % (rank + k) for a in axes) == list(range(k))
        if rank is None:
            return False
        axes = node.attr("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = _ints(node.inputs[1])
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


def _leading_reshape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape after a leading-ones Unsqueeze/Squeeze (its rank is what reductions see)."""
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = _ints(node.inputs[1])
    k = len(axes or ())
    if node.op_type == "Unsqueeze":
        return (1,) * k + tuple(shape)
    if node.op_type == "Squeeze":
        return tuple(shape[k:])
    return tuple(shape)


def _act_gelu(b: _Builder, node: Node, x: int) -> int:
    if node.attr("approximate", "none") == "tanh":
        inner = b.emit(
            "mul",
            (
                b.const(0.7978845608028654),
                b.emit(
                    "add",
                    (
                        x,
                        b.emit(
                            "mul", (b.const(0.044715), b.emit("mul", (x, b.emit("mul", (x, x)))))
                        ),
                    ),
                ),
            ),
        )
        t = b.emit("tanh", (inner,))
    else:
        t = b.emit("erf", (b.emit("mul", (x, b.const(0.7071067811865476))),))
    return b.emit("mul", (b.emit("mul", (x, b.const(0.5))), b.emit("add", (t, b.const(1.0)))))


def _act_leaky(b: _Builder, node: Node, x: int) -> int:
    neg = b.emit("lt", (x, b.const(0.0)), "bool")
    return b.emit("where", (neg, b.emit("mul", (x, b.const(node.attr("alpha", 0.01)))), x))


def _act_elu(
    b: _Builder, node: Node, x: int, alpha: float | None = None, scale: float = 1.0
) -> int:
    alpha = node.attr("alpha", 1.0) if alpha is None else alpha
    neg = b.emit("lt", (x, b.const(0.0)), "bool")
    em1 = b.emit("sub", (b.emit("exp", (x,)), b.const(1.0)))
    r = b.emit("where", (neg, b.emit("mul", (em1, b.const(alpha))), x))
    return r if scale == 1.0 else b.emit("mul", (r, b.const(scale)))


def _act_selu(b: _Builder, node: Node, x: int) -> int:
    return _act_elu(
        b,
        node,
        x,
        node.attr("alpha", 1.67326319217681884765625),
        node.attr("gamma", 1.05070102214813232421875),
    )


def _act_celu(b: _Builder, node: Node, x: int) -> int:
    alpha = float(node.attr("alpha", 1.0))
    em1 = b.emit("sub", (b.emit("exp", (b.emit("div", (x, b.const(alpha))),)), b.const(1.0)))
    neg = b.emit("min", (b.const(0.0), b.emit("mul", (em1, b.const(alpha)))))
    return b.emit("add", (b.emit("max", (b.const(0.0), x)), neg))


def _act_hsig(
    b: _Builder, node: Node, x: int, alpha: float | None = None, beta: float | None = None
) -> int:
    alpha = node.attr("alpha", 0.2) if alpha is None else alpha
    beta = node.attr("beta", 0.5) if beta is None else beta
    y = b.emit("add", (b.emit("mul", (x, b.const(alpha))), b.const(beta)))
    return b.emit("max", (b.const(0.0), b.emit("min", (b.const(1.0), y))))


def _act_hswish(b: _Builder, node: Node, x: int) -> int:
    return b.emit("mul", (x, _act_hsig(b, node, x, 1.0 / 6.0, 0.5)))


def _act_thresholded(b: _Builder, node: Node, x: int) -> int:
    keep = b.emit("gt", (x, b.const(node.attr("alpha", 1.0))), "bool")
    return b.emit("where", (keep, x, b.const(0.0)))


def _act_mish(b: _Builder, node: Node, x: int) -> int:
    return b.emit("mul", (x, b.emit("tanh", (b.emit("softplus", (x,)),))))


def _act_softsign(b: _Builder, node: Node, x: int) -> int:
    return b.emit("div", (x, b.emit("add", (b.const(1.0), b.emit("abs", (x,))))))


_ACTIVATIONS = {
    "Gelu": _act_gelu,
    "LeakyRelu": _act_leaky,
    "Elu": _act_elu,
    "Selu": _act_selu,
    "Celu": _act_celu,
    "HardSigmoid": _act_hsig,
    "HardSwish": _act_hswish,
    "ThresholdedRelu": _act_thresholded,
    "Mish": _act_mish,
    "Softsign": _act_softsign,
}


# ------------------------------------------------------------------ reductions
def _set_reduce_axes(b: _Builder, x: int, axes_in: list[int], node: Node) -> tuple[int, ...]:
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


def _reduction(b: _Builder, kind: str, x: int, axes: list[int], node: Node) -> int:
    _set_reduce_axes(b, x, axes, node)
    shape = tuple(1 if i in axes else d for i, d in enumerate(b.shapes[x]))
    b.body.append(Instr("reduce", (x,), (("kind", kind),), b.body[x].ctype, ROW))
    idx = len(b.body) - 1
    b.shapes[idx] = shape
    return idx


def _mean(b: _Builder, x: int, axes: list[int], node: Node) -> int:
    s = _reduction(b, "sum", x, axes, node)
    n = b.emit("rowlen", (), "f32", ())
    return b.emit("div", (s, n))


def _reduce(b: _Builder, node: Node) -> None:
    op = node.op_type
    x = b.value(node.inputs[0])
    rank = len(b.shape(node.inputs[0]))
    axes = _axes(node, rank)
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
        r = _mean(b, x, axes, node)
    elif op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
        r = _reduction(b, op[6:].lower(), x, axes, node)
    elif op in ("ReduceSumSquare", "ReduceL2"):
        r = _reduction(b, "sum", b.emit("mul", (x, x)), axes, node)
        if op == "ReduceL2":
            r = b.emit("sqrt", (r,))
    elif op == "ReduceL1":
        r = _reduction(b, "sum", b.emit("abs", (x,)), axes, node)
    else:
        raise KernelRefused(
            KernelReason.UNSUPPORTED_OP, f"{op} ({node.name}) has no kernel lowering"
        )
    b.set(node.outputs[0], r)
    if not keep:
        b.dropped[id(node.outputs[0])] = r


def _tail_axes(node: Node, rank: int, default: int) -> list[int]:
    axis = int(node.attr("axis", default)) % max(rank, 1)
    return list(range(axis, rank))


def _softmax(b: _Builder, node: Node) -> None:
    x = b.value(node.inputs[0])
    rank = len(b.shape(node.inputs[0]))
    if b.opset >= 13:
        axis = int(node.attr("axis", -1)) % max(rank, 1)
        axes = [axis]
    else:
        axes = _tail_axes(node, rank, 1)
    m = _reduction(b, "max", x, axes, node)
    s = b.emit("sub", (x, m))
    e = b.emit("exp", (s,))
    total = _reduction(b, "sum", e, axes, node)
    if node.op_type == "Softmax":
        # one reciprocal per row, a multiply per element (within an ulp of the division)
        b.set(node.outputs[0], b.emit("mul", (e, b.emit("recip", (total,)))))
    else:
        b.set(node.outputs[0], b.emit("sub", (s, b.emit("log", (total,)))))


def _layer_norm(b: _Builder, node: Node) -> None:
    for extra in node.outputs[1:]:
        if extra.users or extra.name in _graph_outputs(node):
            raise KernelRefused(
                KernelReason.UNSUPPORTED_OP, f"{node.name}: mean/inv-std outputs are read"
            )
    x = b.value(node.inputs[0])
    rank = len(b.shape(node.inputs[0]))
    axes = _tail_axes(node, rank, -1)
    eps = b.const(float(node.attr("epsilon", 1e-5)))
    if node.op_type == "LayerNormalization":
        mean = _mean(b, x, axes, node)
        d = b.emit("sub", (x, mean))
        var = _mean(b, b.emit("mul", (d, d)), axes, node)
    else:
        d = x
        var = _mean(b, b.emit("mul", (x, x)), axes, node)
    inv = b.emit("div", (b.const(1.0), b.emit("sqrt", (b.emit("add", (var, eps)),))))
    y = b.emit("mul", (d, inv))
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        y = b.emit("mul", (y, b.value(node.inputs[1])))
    if node.op_type == "LayerNormalization" and len(node.inputs) > 2 and node.inputs[2] is not None:
        y = b.emit("add", (y, b.value(node.inputs[2])))
    b.set(node.outputs[0], y)


# ------------------------------------------------------------------ the group
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
            and _ints(n.inputs[1]) is None
            and all(id(u) in inside_ids for u in n.outputs[0].user_nodes)
            and n.outputs[0] not in outputs
        ):
            prologue.append(n)
            nodes.remove(n)
            made_outside.add(id(n.outputs[0]))
    for n in nodes:
        if n.op_type in CONTRACTIONS:
            raise KernelRefused(
                KernelReason.CONTRACTION, f"{n.op_type} {n.name!r} is not the group's first node"
            )
        if n.captures:
            raise KernelRefused(KernelReason.UNSUPPORTED_OP, f"{n.name} carries a subgraph")
    _fill_types([*prologue, *nodes], binding, opset)
    b = _Builder(binding, opset)
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
            n.op_type in _VIEW_OPS
            and external
            and not (
                n.op_type in ("Unsqueeze", "Squeeze", "Reshape", "Flatten")
                and _leading_ones_only(b, n)
            )
        ):
            view = _view_of(b, n)
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
            view = _view_of(b, n)
            if view is not None:
                src, chain = out_views.get(id(x), (x, ()))
                out_views[id(out)] = (src, (*chain, view))
                continue
        body_nodes.append(n)
    for n in body_nodes:
        for o in n.outputs:
            b.produced.add(id(o))
            b.node_of[id(o)] = n
    b.branch_nodes = _branch_nodes(body_nodes, outputs)
    in_branch = {id(n) for ns in b.branch_nodes.values() for n in ns}
    for n in body_nodes:
        if id(n) not in in_branch:
            _lower_node(b, n)
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
    loop = _broadcast(shapes)
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


def _prune(b: _Builder, outs: list[KernelOutput]) -> list[KernelOutput]:
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


def _branch_instrs(b: _Builder, seeds: set[int]) -> set[int]:
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


def _levels(b: _Builder, rank: int, reduce_axes: tuple[int, ...]) -> list[Instr]:
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
