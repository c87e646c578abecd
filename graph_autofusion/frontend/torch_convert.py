"""Conversion of an ATen-level FX graph (from ``torch.export``) into the graph IR.

:class:`ConvertContext` walks the FX graph once. For each ``call_function`` node it either

* folds it: every tensor argument is a constant (a lifted parameter, buffer or constant, or an
  already folded value), so the ATen op runs eagerly and the result is a constant; or
* calls the converter registered for the ATen overload (or its overload packet) in
  :mod:`graph_autofusion.frontend.aten_ops`, which emits canonical (ONNX) nodes with
  :meth:`ConvertContext.op`; or
* emits an opaque node (domain ``"aten"``) that the torch runtime executes through
  ``torch.ops``; importing never fails on an unknown ATen operator.

Constants become initializers only when a non-folded node reads them; parameters keep their
state-dict names. Nodes whose inputs are all constant initializers are folded as well (this
is how ``linear``'s weight becomes a pre-transposed constant: for a parameter, a transposed view
of its memory, never a copy).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx

from graph_autofusion.errors import FrontendError, IRError
from graph_autofusion.ir.core import Graph, Node, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.runtime.torch_ops import (
    OpCall,
    from_torch_dtype,
    get_impl,
    tensor_version,
    to_torch_dtype,
)
from graph_autofusion.runtime.torch_ops_aten import ATEN_DOMAIN, encode_args
from graph_autofusion.runtime.torch_runtime import const_to_tensor, infer_node_types

Arg = Any  # Value | torch.Tensor (constant) | Python scalar | list of those
_NO_FOLD = {
    "rand",
    "randn",
    "randint",
    "rand_like",
    "randn_like",
    "randint_like",
    "bernoulli",
    "normal",
    "uniform",
    "native_dropout",
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "multinomial",
    "randperm",
}
_FOLD_LIMIT = 1 << 26  # never fold into a constant larger than 64M elements

#: Constants folded from one parameter (a cast, a reshape; a 2-D transpose is a view instead),
#: shared by every import of a graph reading that parameter: Dynamo compiles a ``generate()`` in three graphs, each of
#: which would otherwise hold its own copy. Keyed by the fold and the parameter's storage,
#: layout and version (an in-place update folds again); an entry holds the parameter (so its
#: address is not reused while the entry lives) and a weak reference to the folded array, and
#: goes when nothing holds that array any more.
_DERIVED: dict[tuple, tuple[Any, torch.Tensor, DType | None]] = {}


def dtype_of_torch(dt: torch.dtype) -> DType:
    return from_torch_dtype(dt)


def shape_of_val(val: Any) -> tuple[int | str, ...] | None:
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(int(d) if isinstance(d, int) or _is_static(d) else _dim_name(d) for d in val.shape)


def _dim_name(d: Any) -> str:
    """A symbolic size's name: its expression (``s23``, ``s23 + 1``), never its hint."""
    expr = getattr(getattr(d, "node", None), "expr", None)
    return str(expr) if expr is not None else str(d)


def _is_static(d: Any) -> bool:
    """True for a size known as a number; never guards (``int()`` of a ``SymInt`` would
    specialize the symbol it stands for)."""
    if not isinstance(d, torch.SymInt):
        return True
    return d.node.is_constant() or getattr(d.node.expr, "is_number", False)


class ConvertContext:
    """State of one FX-graph conversion; converters use its ``op``/``v``/``const`` helpers."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.env: dict[str, Arg] = {}
        self.node: torch.fx.Node | None = None
        self._materialized: dict[int, Value] = {}
        self._params: set[int] = set()  # ids of the graph's parameters and buffers
        self._sources: dict[int, torch.Tensor] = {}  # id(initializer value) -> its parameter
        self._const_names: dict[int, str] = {}
        self._scalars: dict[tuple[Any, DType], Value] = {}
        self._keepalive: list[torch.Tensor] = []  # objects whose id() keys the caches

    # ----- facts about the node being converted -------------------------------------------
    @property
    def val(self) -> Any:
        """The example value (FakeTensor or tuple) of the current FX node."""
        return self.node.meta.get("val") if self.node is not None else None

    @property
    def out_dtype(self) -> DType:
        val = self.val
        if isinstance(val, list | tuple):
            val = val[0]
        return dtype_of_torch(val.dtype)

    @property
    def out_shape(self) -> tuple[int | str, ...]:
        val = self.val
        if isinstance(val, list | tuple):
            val = val[0]
        return shape_of_val(val)

    def arg_val(self, index: int) -> Any:
        """Example value of positional argument ``index`` of the current FX node."""
        a = self.node.args[index]
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    def promoted(self, i: int = 0, j: int = 1) -> DType:
        """Dtype both operands ``i``, ``j`` are promoted to (torch type promotion)."""
        a, b = self.arg_val(i), self.arg_val(j)
        return dtype_of_torch(torch.result_type(a, b))

    # ----- values ---------------------------------------------------------------------------
    def name_constant(self, tensor: torch.Tensor, name: str) -> None:
        """Give the initializer that ``tensor`` may become a stable name (state-dict FQN)."""
        self._const_names[id(tensor)] = name
        self._params.add(id(tensor))

    def dtype(self, x: Arg) -> DType:
        if isinstance(x, Value):
            return x.dtype
        if isinstance(x, torch.Tensor):
            return dtype_of_torch(x.dtype)
        if isinstance(x, bool):
            return DType.BOOL
        return DType.INT64 if isinstance(x, int) else DType.FLOAT

    def shape(self, x: Arg) -> tuple[int | str | None, ...] | None:
        if isinstance(x, Value):
            return x.shape
        if isinstance(x, torch.Tensor):
            return tuple(x.shape)
        return ()

    def v(self, x: Arg, dtype: DType | None = None) -> Value:
        """IR value for ``x`` (constants become initializers), cast to ``dtype`` if given."""
        if isinstance(x, Value):
            if dtype is not None and x.dtype is not None and x.dtype != dtype:
                return self.op("Cast", [x], {"to": int(dtype)})
            return x
        if isinstance(x, torch.Tensor):
            if dtype is not None and dtype_of_torch(x.dtype) != dtype:
                x = x.to(to_torch_dtype(dtype))
            return self._materialize(x)
        if isinstance(x, bool | int | float):
            dt = dtype or self.dtype(x)
            return self.scalar(x, dt)
        raise FrontendError(f"cannot use {x!r} ({type(x).__name__}) as a tensor operand")

    def _materialize(self, t: torch.Tensor, view: bool = False) -> Value:
        """``t`` as an initializer (a C-contiguous array; ``view``: an array over ``t``'s own
        memory in ``t``'s layout, a transposed parameter, see :meth:`_try_fold`)."""
        key = id(t)
        if key in self._materialized:
            return self._materialized[key]
        # The cache is keyed by id(): keep the keyed object itself alive for the whole
        # conversion, or a temporary's id could be reused by another tensor and hit the cache.
        self._keepalive.append(t)
        t = t.detach()
        dt = dtype_of_torch(t.dtype)
        base = self._const_names.get(key, "const")
        if view:
            arr = t.numpy()
        else:
            arr = t.float().numpy() if t.dtype == torch.bfloat16 else t.contiguous().numpy()
            arr = np.require(arr, requirements="C")  # ascontiguousarray makes a 0-d array 1-d
        try:
            if base == "const":
                raise IRError("generic name")
            val = self.graph.add_initializer(base, arr)
        except IRError:
            val = self.graph.add_initializer(self.graph.fresh_name(base), arr)
        val.dtype = dt
        self._materialized[key] = val
        self._keepalive.append(t)
        if key in self._params:
            self._sources[id(val)] = t
        return val

    def scalar(self, value: float | int | bool, dtype: DType) -> Value:
        """A shared 0-d initializer holding ``value`` as ``dtype``."""
        key = (float(value) if not isinstance(value, bool) else value, dtype)
        if key not in self._scalars:
            arr = np.array(value, dtype=dtype.to_numpy())
            name = self.graph.fresh_name("scalar")
            v = self.graph.add_initializer(name, arr)
            v.dtype = dtype
            self._scalars[key] = v
        return self._scalars[key]

    def const(self, data: Any, dtype: DType = DType.INT64, name: str = "const") -> Value:
        """A new initializer from a list/array."""
        arr = np.asarray(data, dtype=dtype.to_numpy())
        v = self.graph.add_initializer(self.graph.fresh_name(name), arr)
        v.dtype = dtype
        return v

    def ints(self, values: Sequence[Any]) -> Value:
        """A 1-D int64 tensor from ints and/or int64 scalar values (symbolic sizes)."""
        if all(isinstance(x, int) for x in values):
            return self.const(list(values), DType.INT64, "shape")
        parts = []
        for x in values:
            if isinstance(x, int):
                parts.append(self.const([x], DType.INT64, "shape"))
            else:
                parts.append(self.op("Reshape", [self.v(x, DType.INT64), self.const([1])]))
        return self.op("Concat", parts, {"axis": 0})

    # ----- nodes ----------------------------------------------------------------------------
    def op(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = "",
        num_outputs: int = 1,
    ) -> Any:
        """Emit a node (or fold it when every input is a constant); returns its output(s)."""
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        folded = self._try_fold(op_type, inputs, attrs, domain, num_outputs)
        if folded is not None:
            return folded[0] if num_outputs == 1 else folded
        node = self.graph.make_node(
            op_type, list(inputs), attrs, domain=domain, num_outputs=num_outputs
        )
        self._annotate(node)
        infer_node_types(node)
        if op_type == "Shape" and node.outputs[0].dtype is None and not attrs:
            # a symbolic shape stops meta inference, yet a Shape is int64 of the input's
            # rank; typed, what reads it (the Gather of a size) infers too, so a size never
            # enters arithmetic untyped (a Div(float, size) would miss its Cast)
            rank = len(inputs[0].shape) if inputs[0].shape is not None else None
            node.outputs[0].dtype = DType.INT64
            node.outputs[0].shape = (rank,) if rank is not None else None
        return node.outputs[0] if num_outputs == 1 else list(node.outputs)

    def _annotate(self, node: Node) -> None:
        n = self.node
        if n is None:
            return
        node.meta["aten"] = str(n.target)
        stack = n.meta.get("nn_module_stack") or {}
        if stack:
            path, typ = list(stack.values())[-1]
            node.meta["source"] = path
            node.meta["module_type"] = getattr(typ, "__name__", str(typ))
        trace = n.meta.get("stack_trace")
        if trace:
            lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
            node.meta["stack_trace"] = " | ".join(lines[-2:])
        node.meta["fx_node"] = n.name

    def _try_fold(self, op_type, inputs, attrs, domain, num_outputs) -> list[Value] | None:
        if not inputs or any(v is None or v.const is None for v in inputs):
            return None
        impl = get_impl(op_type, domain)
        if impl is None:
            return None
        src = self._sources.get(id(inputs[0])) if len(inputs) == 1 and num_outputs == 1 else None
        if src is not None and _is_matrix_transpose(op_type, domain, attrs, src):
            # a linear weight's transpose: a view of the parameter (its memory, read as [K, N]),
            # not a copy; engines read it in place (onnxruntime through transB, torch as the
            # transposed view nn.Linear hands its GEMM), and an in-place update is seen
            t = src.t()
            self._const_names[id(t)] = f"{inputs[0].name}_{op_type.lower()}"
            return [self._materialize(t, view=True)]
        key = None
        if src is not None:
            key = (op_type, domain, repr(sorted(attrs.items())), src.data_ptr(), tuple(src.shape))
            key += (tuple(src.stride()), str(src.dtype), tensor_version(src))
            hit = _DERIVED.get(key)
            arr = hit[0]() if hit is not None else None
            if arr is not None:
                t = torch.from_numpy(arr)
                if hit[2] == DType.BFLOAT16:  # the IR holds bfloat16 as float32 arrays
                    t = t.to(torch.bfloat16)
                self._const_names[id(t)] = f"{inputs[0].name}_{op_type.lower()}"
                return [self._materialize(t)]
        probe = Node(
            op_type, [], attrs, domain=domain, outputs=[Value(f"_p{i}") for i in range(num_outputs)]
        )
        out = impl(OpCall(probe, 20), *[const_to_tensor(v) for v in inputs])
        outs = out if isinstance(out, tuple | list) else (out,)
        if sum(t.numel() for t in outs) > _FOLD_LIMIT:
            return None
        base = inputs[0].name if len(inputs) == 1 else "folded"
        res = []
        for t in outs:
            self._const_names[id(t)] = f"{base}_{op_type.lower()}"
            res.append(self._materialize(t.contiguous()))
        if key is not None and isinstance(res[0].const, np.ndarray):
            import weakref

            def forget(_ref: Any, key: tuple = key) -> None:
                _DERIVED.pop(key, None)

            _DERIVED[key] = (weakref.ref(res[0].const, forget), src, res[0].dtype)
        return res

    def opaque(self, target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Emit an ``aten``-domain node that the torch runtime runs through ``torch.ops``."""
        inputs: list[Value] = []

        def index(a: Any) -> dict[str, int] | None:
            if isinstance(a, _Number):  # read back as a Python number at run time
                inputs.append(self.v(a.value))
                return {"s": len(inputs) - 1}
            if isinstance(a, Value | torch.Tensor):
                inputs.append(self.v(a))
                return {"t": len(inputs) - 1}
            return None

        args, kwargs = _mark_numbers(target, args, kwargs)
        spec = encode_args(args, kwargs, index)
        val = self.val
        vals = list(val) if isinstance(val, list | tuple) else [val]
        # the packet's qualified name (``aten::div``) and the overload (``Tensor_mode``):
        # ``target.name()`` already ends with the overload, except the default one
        op_type = f"{target._schema.name}.{target._overloadname}"
        node = self.graph.make_node(
            op_type, inputs, {"args": spec}, domain=ATEN_DOMAIN, num_outputs=len(vals)
        )
        self._annotate(node)
        for v, fake in zip(node.outputs, vals):
            self.annotate_value(v, fake)
        return node.outputs[0] if not isinstance(val, list | tuple) else list(node.outputs)

    def annotate_value(self, v: Value, fake: Any) -> None:
        if isinstance(fake, torch.Tensor):
            if v.dtype is None:
                v.dtype = dtype_of_torch(fake.dtype)
            if v.shape is None:
                v.shape = shape_of_val(fake)


def _is_matrix_transpose(op_type: str, domain: str, attrs: dict, src: torch.Tensor) -> bool:
    """Whether the node transposes the 2-D floating-point parameter ``src`` (not bfloat16,
    which the IR stores as fp32: a converted copy)."""
    return (
        op_type == "Transpose"
        and domain in ("", "ai.onnx")
        and src.dim() == 2
        and list(attrs.get("perm", [1, 0])) == [1, 0]
        and src.dtype in (torch.float32, torch.float64, torch.float16)
    )


class _Number:
    """An IR value standing where the schema wants a number (a symbolic size or scalar)."""

    __slots__ = ("value",)

    def __init__(self, value: Value) -> None:
        self.value = value


def _mark_numbers(
    target: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """``args``/``kwargs`` with each IR value in a non-tensor parameter (``SymInt``,
    ``SymInt[]``, ``Scalar``) wrapped as a :class:`_Number`."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return list(args), dict(kwargs)
    numeric = {a.name: "Tensor" not in str(a.type) for a in schema.arguments}
    names = [a.name for a in schema.arguments]

    def mark(a: Any) -> Any:
        if isinstance(a, Value):
            return _Number(a)
        if isinstance(a, list | tuple):
            return type(a)(mark(x) for x in a)
        return a

    out = [mark(a) if i < len(names) and numeric[names[i]] else a for i, a in enumerate(args)]
    return out, {k: mark(a) if numeric.get(k, False) else a for k, a in kwargs.items()}


def fold_call(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``target`` eagerly on constant arguments."""
    with torch.no_grad():
        return target(*args, **kwargs)


def is_foldable(target: Any, flat_args: Sequence[Any]) -> bool:
    """True when no argument is an IR value and the op is deterministic."""
    if any(isinstance(a, Value) for a in flat_args):
        return False
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1] not in _NO_FOLD
    return target in (
        operator.getitem,
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.truediv,
        operator.mod,
        operator.neg,
    )
