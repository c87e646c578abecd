"""Operator catalog registry (F3): fusion kind, cost formulas and NumPy reference per operator.

One :class:`OpSchema` per ``(domain, op_type)``. Operators register with the :func:`op`
decorator on their NumPy reference function::

    @op("Relu", FusionKind.ELEMENTWISE)
    def relu(ctx, x):
        return np.maximum(x, 0)

A reference function receives an :class:`OpContext` (attributes, node, output dtypes) and the
input arrays (``None`` for omitted optional inputs) and returns one array or a tuple of arrays.
Unknown operators resolve to an opaque schema: importing them is never an error, executing
them raises :class:`~graph_autofusion.errors.UnsupportedOperatorError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.ir.core import Node


class FusionKind(str, enum.Enum):
    """How an operator takes part in fusion (after TVM's op patterns)."""

    ELEMENTWISE = "elementwise"  # one output element from the same-index input elements
    BROADCAST = "broadcast"  # elementwise with numpy broadcasting across inputs
    INJECTIVE = "injective"  # layout: each output element reads one input element (Transpose)
    REDUCTION = "reduction"  # reduces one or more axes (ReduceMean, ArgMax)
    NORMALIZATION = "normalization"  # reduction + elementwise epilogue (LayerNorm, Softmax)
    CONTRACTION = "contraction"  # MatMul, Gemm, Conv: accepts elementwise epilogues
    DATA_MOVEMENT = "data_movement"  # Gather, Concat, Slice, Pad: moves data, no math
    OPAQUE = "opaque"  # control flow, RNN cells, unknown operators: never fused into


@dataclass
class OpContext:
    """What a reference function may read besides its input arrays."""

    attrs: dict[str, Any]
    node: Node | None = None
    output_dtypes: list[Any] = field(default_factory=list)
    opset: int | None = None  # version of the node's domain, when the caller knows it

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


Reference = Callable[..., Any]
CostFn = Callable[[Node], int]


@dataclass(frozen=True)
class OpSchema:
    """Everything the compiler knows about one operator.

    Attributes:
        op_type: Canonical operator name.
        domain: Operator-set domain (``""`` is ONNX's default domain).
        kind: Fusion kind.
        reference: NumPy reference implementation, or ``None`` if it cannot be executed.
        flops: FLOPs of one application, from the node's value shapes (``None``: the default,
            one FLOP per output element for elementwise-like kinds, zero for data movement).
        commutative: Binary operator whose two inputs may be swapped.
        doc: One line of semantics.
    """

    op_type: str
    domain: str
    kind: FusionKind
    reference: Reference | None = None
    flops: CostFn | None = None
    commutative: bool = False
    doc: str = ""
    known: bool = True


_REGISTRY: dict[tuple[str, str], OpSchema] = {}


def op(
    op_type: str,
    kind: FusionKind,
    *,
    domain: str = "",
    flops: CostFn | None = None,
    commutative: bool = False,
    aliases: tuple[str, ...] = (),
) -> Callable[[Reference], Reference]:
    """Decorator registering a NumPy reference as the schema of ``op_type`` (and ``aliases``)."""

    def deco(fn: Reference) -> Reference:
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        for name in (op_type, *aliases):
            _REGISTRY[(domain, name)] = OpSchema(name, domain, kind, fn, flops, commutative, doc)
        return fn

    return deco


def register(schema: OpSchema) -> None:
    """Register a schema built by hand (e.g. an operator with no reference)."""
    _REGISTRY[(schema.domain, schema.op_type)] = schema


def get_schema(op_type: str, domain: str = "") -> OpSchema:
    """Schema of an operator; unknown operators get an opaque schema (``known=False``)."""
    if domain == "ai.onnx":
        domain = ""
    schema = _REGISTRY.get((domain, op_type))
    if schema is None:
        return OpSchema(op_type, domain, FusionKind.OPAQUE, None, None, False, "", known=False)
    return schema


def schema_of(node: Node) -> OpSchema:
    return get_schema(node.op_type, node.domain)


def all_schemas() -> list[OpSchema]:
    return sorted(_REGISTRY.values(), key=lambda s: (s.domain, s.op_type))


def run_reference(node: Node, inputs: list[Any]) -> list[Any]:
    """Execute ``node`` on NumPy arrays with its reference implementation.

    Raises:
        UnsupportedOperatorError: the operator has no reference implementation.
    """
    schema = schema_of(node)
    if schema.reference is None:
        raise UnsupportedOperatorError(
            f"operator {node.qualified_op!r} (node {node.name!r}) has no NumPy reference "
            f"implementation; it is kept as an opaque node and cannot be executed by the "
            f"reference interpreter"
        )
    ctx = OpContext(node.attrs, node, [v.dtype for v in node.outputs])
    result = schema.reference(ctx, *inputs)
    if not isinstance(result, tuple | list):
        result = (result,)
    return list(result)
