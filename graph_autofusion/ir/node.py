"""The IR's values and nodes: :class:`Value` (a tensor edge with its producer and users),
:class:`RawAttribute`, :class:`Node` (an operator application), and the small queries on
them (:func:`producer_of`, :func:`const_value`). :mod:`graph_autofusion.ir.core` holds the
graph and the model built from them."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from graph_autofusion.errors import IRError
from graph_autofusion.ir.dtypes import DType

if TYPE_CHECKING:  # pragma: no cover - the graph a node belongs to (ir.core imports this)
    from graph_autofusion.ir.core import Graph


Dim = int | str | None


Shape = tuple[Dim, ...]


class Value:
    """An SSA value: a graph input, an initializer (``const`` set) or a node output.

    Attributes:
        name: Unique name within its graph.
        dtype: Element type, or ``None`` if unknown.
        shape: Tuple of dims, or ``None`` if the rank is unknown.
        producer: The node that computes it (``None`` for inputs and initializers).
        index: Output index in the producer.
        const: The constant data of an initializer, else ``None``.
    """

    __slots__ = ("name", "dtype", "shape", "producer", "index", "const", "_users", "meta", "doc")

    def __init__(
        self,
        name: str,
        dtype: DType | None = None,
        shape: Shape | None = None,
        const: np.ndarray | None = None,
    ) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape) if shape is not None else None
        self.producer: Node | None = None
        self.index = 0
        self.const = const
        self._users: dict[tuple[Node, int], None] = {}
        self.meta: dict[str, Any] = {}
        self.doc = ""
        if const is not None:
            if self.dtype is None:
                self.dtype = DType.from_numpy(const.dtype)
            if self.shape is None:
                self.shape = tuple(int(d) for d in const.shape)

    @property
    def users(self) -> list[tuple[Node, int]]:
        """``(node, input_index)`` pairs that read this value, in insertion order."""
        return list(self._users)

    @property
    def user_nodes(self) -> list[Node]:
        """Distinct nodes that read this value."""
        return list(dict.fromkeys(n for n, _ in self._users))

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dim is a known integer."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int | None:
        """Number of elements if the shape is static, else ``None``."""
        if not self.is_static:
            return None
        return math.prod(self.shape)  # exact ints (the dims are ints: is_static)

    def nbytes(self) -> int | None:
        n = self.numel()
        if n is None or self.dtype is None:
            return None
        return n * self.dtype.itemsize

    def type_str(self) -> str:
        dt = self.dtype.short if self.dtype is not None else "?"
        if self.shape is None:
            return f"{dt}[...]"
        return f"{dt}[{','.join('?' if d is None else str(d) for d in self.shape)}]"

    def __repr__(self) -> str:
        return f"Value(%{self.name}: {self.type_str()})"


class RawAttribute:
    """An attribute kept exactly as the frontend delivered it (e.g. an If/Loop body).

    ``captures`` lists the outer-scope value names the attribute reads (subgraph bodies), so
    the IR accounts for those reads in use-def analysis.
    """

    __slots__ = ("proto", "captures")

    def __init__(self, proto: Any, captures: Sequence[str] = ()) -> None:
        self.proto = proto
        self.captures = tuple(captures)

    def __repr__(self) -> str:
        return f"RawAttribute({type(self.proto).__name__}, captures={list(self.captures)})"


class Node:
    """One operator application.

    Attributes:
        op_type: Operator name in the canonical vocabulary (ONNX names).
        domain: Operator set domain, ``""`` for the ONNX default domain.
        name: Node name (unique within a graph when assigned by the graph).
        attrs: Attribute name -> Python value (int, float, str, lists, ndarray, RawAttribute).
        meta: Free-form metadata (source location, aten target, rule that created it ...).
    """

    __slots__ = (
        "op_type",
        "domain",
        "name",
        "attrs",
        "attr_types",
        "_inputs",
        "_outputs",
        "_captures",
        "graph",
        "meta",
        "doc",
        "overload",
    )

    def __init__(
        self,
        op_type: str,
        inputs: Sequence[Value | None] = (),
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = "",
        name: str = "",
        outputs: Sequence[Value] = (),
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.name = name
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.attr_types: dict[str, int] = {}
        self._inputs: list[Value | None] = []
        self._outputs: list[Value] = []
        self._captures: list[Value] = []
        self.graph: Graph | None = None
        self.meta: dict[str, Any] = {}
        self.doc = ""
        self.overload = ""
        for v in inputs:
            self._append_input(v)
        for i, out in enumerate(outputs):
            if out.producer is not None:
                raise IRError(f"value %{out.name} already has producer {out.producer.name!r}")
            out.producer = self
            out.index = i
            self._outputs.append(out)

    # ----- read access -------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return tuple(self._outputs)

    @property
    def captures(self) -> tuple[Value, ...]:
        """Outer-scope values read implicitly by subgraph attributes."""
        return tuple(self._captures)

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def all_inputs(self) -> Iterator[Value]:
        """Explicit inputs (omitted ones skipped) and captures."""
        for v in self._inputs:
            if v is not None:
                yield v
        yield from self._captures

    def predecessors(self) -> list[Node]:
        return list(dict.fromkeys(v.producer for v in self.all_inputs() if v.producer))

    def successors(self) -> list[Node]:
        out: dict[Node, None] = {}
        for v in self._outputs:
            for n, _ in v._users:
                out[n] = None
        return list(out)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    # ----- mutation ------------------------------------------------------------------------
    def _append_input(self, v: Value | None) -> None:
        idx = len(self._inputs)
        self._inputs.append(v)
        if v is not None:
            v._users[(self, idx)] = None

    def set_input(self, index: int, value: Value | None) -> None:
        """Replace input ``index`` (use-def kept consistent)."""
        old = self._inputs[index]
        if old is not None:
            old._users.pop((self, index), None)
        self._inputs[index] = value
        if value is not None:
            value._users[(self, index)] = None
        if self.graph is not None:
            self.graph._sorted = False

    def set_inputs(self, values: Sequence[Value | None]) -> None:
        for i, old in enumerate(self._inputs):
            if old is not None:
                old._users.pop((self, i), None)
        self._inputs = []
        for v in values:
            self._append_input(v)

    def set_captures(self, values: Sequence[Value]) -> None:
        for i, old in enumerate(self._captures):
            old._users.pop((self, -1 - i), None)
        self._captures = []
        for i, v in enumerate(values):
            self._captures.append(v)
            v._users[(self, -1 - i)] = None
        if self.graph is not None:
            self.graph._sorted = False

    def _detach(self) -> None:
        for i, v in enumerate(self._inputs):
            if v is not None:
                v._users.pop((self, i), None)
        for i, v in enumerate(self._captures):
            v._users.pop((self, -1 - i), None)
        self._inputs = []
        self._captures = []

    def __repr__(self) -> str:
        ins = ", ".join("%" + v.name if v is not None else "_" for v in self._inputs)
        outs = ", ".join("%" + v.name for v in self._outputs)
        return f"Node({self.name!r}: {outs} = {self.qualified_op}({ins}))"


def producer_of(value: Value | None, op_type: str) -> Node | None:
    """The ONNX-domain ``op_type`` node that computes ``value``, else ``None``."""
    node = value.producer if value is not None else None
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        return None
    return node


#: ``Value.meta`` key of an initializer also listed as a graph input from ONNX IR version 4 on
#: (``keep_initializers_as_inputs``): a feed may replace its data, so no rule may read it as a
#: constant (fold it, concatenate it, check its value); it stays an input of the fused model.
OVERRIDABLE = "onnx_overridable"


def const_value(value: Value) -> np.ndarray | None:
    """Constant data of ``value``: an initializer, the output of a ``Constant`` node, or either
    seen through ``Identity`` nodes (TorchScript shares equal biases through Identity); not an
    initializer a feed may override (:data:`OVERRIDABLE`)."""
    for _ in range(64):
        if value.const is not None:
            return None if value.meta.get(OVERRIDABLE) else value.const
        p = value.producer
        if p is None or p.domain not in ("", "ai.onnx"):
            return None
        if p.op_type == "Constant":
            for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
                if key in p.attrs:
                    return np.asarray(p.attrs[key])
            return None
        if p.op_type != "Identity" or not p.inputs or p.inputs[0] is None:
            return None
        value = p.inputs[0]
    return None


def from_constants(v: Value, depth: int = 8) -> bool:
    """Whether ``v`` is data, not an activation: constant data (:func:`const_value`) or a
    value computed from such values alone, within ``depth`` producers (a ``Transpose`` or
    ``Cast`` of a weight)."""
    if const_value(v) is not None:
        return True
    p = v.producer
    if p is None or depth == 0 or p.captures:
        return False
    ins = [x for x in p.inputs if x is not None]
    return bool(ins) and all(from_constants(x, depth - 1) for x in ins)


def float_dtype(v: Value | None, depth: int = 16) -> DType | None:
    """``v``'s element type; an untyped value computed by a node takes the first float type
    among its producer's inputs (what elementwise operators and reductions keep)."""
    while v is not None and depth > 0:
        if v.dtype is not None or v.producer is None:
            return v.dtype
        ins = [u for u in v.producer.inputs if u is not None]
        typed = [float_dtype(u, depth - 1) for u in ins[:1]]
        if typed and typed[0] is not None and typed[0].is_float:
            return typed[0]
        return None
    return None
