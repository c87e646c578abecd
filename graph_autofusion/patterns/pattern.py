"""Pattern language (F5): patterns that read like the computation.

    p = PatternBuilder()
    x, mask = p.var("x"), p.var("mask")
    scale = p.const("scale", scalar=True)
    pattern = p.Softmax(p.Add(p.Div(x, scale), mask), axis=-1)

A pattern is a tree of :class:`OpPattern` (an operator application: one or several op types,
input patterns, attribute constraints, checks) and :class:`VarPattern` leaves (any value,
optionally constrained by dtype, rank, static shape or constant data). A variable name used
twice must bind the same value both times. ``a | b`` is an alternative; ``p.optional(op, x)``
matches an operator that may be absent (then its input stands in its place). Commutative
operators (per the catalog) match with their two operands in either order: patterns never
spell out the swapped variant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.ir.core import Node, Value, const_value
from graph_autofusion.ir.dtypes import DType

#: ONNX attribute defaults, used when a node omits an attribute a pattern constrains.
ATTR_DEFAULTS: dict[tuple[str, str], Any] = {
    ("Softmax", "axis"): -1,
    ("LogSoftmax", "axis"): -1,
    ("LayerNormalization", "axis"): -1,
    ("LayerNormalization", "epsilon"): 1e-5,
    ("Gemm", "alpha"): 1.0,
    ("Gemm", "beta"): 1.0,
    ("Gemm", "transA"): 0,
    ("Gemm", "transB"): 0,
    ("Conv", "group"): 1,
    ("Gelu", "approximate"): "none",
    ("ReduceMean", "keepdims"): 1,
    ("ReduceSum", "keepdims"): 1,
    ("BatchNormalization", "epsilon"): 1e-5,
}

AttrSpec = Any  # a value (equality), a callable predicate, or ANY


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()

Check = Callable[["MatchContext"], "str | None"]


class Pattern:
    """Base class: patterns combine with ``|`` into alternatives."""

    def __or__(self, other: Pattern) -> AltPattern:
        left = self.options if isinstance(self, AltPattern) else (self,)
        right = other.options if isinstance(other, AltPattern) else (other,)
        return AltPattern((*left, *right))

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class VarPattern(Pattern):
    """Any value, bound under ``name``; optional constraints on it.

    Attributes:
        dtypes: Accepted element types (empty: any).
        rank: Required rank, or ``None``.
        last_dim: Required static size of the last dimension, or ``None``.
        static: Require a fully static shape.
        const: Require constant data (an initializer or a ``Constant`` node's output).
        scalar: Require a constant with exactly one element.
        value: Required constant value (all elements), compared with ``rtol``/``atol``.
        check: Extra predicate on the value, returning a rejection sentence or ``None``.
    """

    name: str
    dtypes: tuple[DType, ...] = ()
    rank: int | None = None
    last_dim: int | None = None
    static: bool = False
    const: bool = False
    scalar: bool = False
    value: float | Callable[[Value], float] | None = None
    rtol: float = 1e-3
    atol: float = 1e-6
    check: Callable[[Value], str | None] | None = None

    def describe(self) -> str:
        return ("const " if self.const else "") + "%" + self.name


@dataclass(frozen=True, eq=False)
class OpPattern(Pattern):
    """An operator application.

    Attributes:
        op_types: Accepted operator names (several = alternatives).
        inputs: Input patterns, in order (``None`` = this input may be anything, unbound).
        attrs: Attribute constraints: value (equality; floats with tolerance), predicate, ANY.
        domain: Operator domain (``""`` = ONNX).
        label: Name under which the matched node is recorded in the match.
        exact_inputs: When False, the node may have more inputs than the pattern lists.
        output_index: Which output of the node the consumer reads.
    """

    op_types: tuple[str, ...]
    inputs: tuple[Pattern | None, ...] = ()
    attrs: dict[str, AttrSpec] = field(default_factory=dict)
    domain: str = ""
    label: str = ""
    exact_inputs: bool = True
    output_index: int = 0

    def describe(self) -> str:
        op = "|".join(self.op_types)
        args = ", ".join(p.describe() if p is not None else "*" for p in self.inputs)
        return f"{op}({args})"


@dataclass(frozen=True, eq=False)
class OptionalPattern(Pattern):
    """An operator that may be absent: matches ``op(inner)`` or just ``inner``."""

    op: OpPattern
    inner: Pattern

    def describe(self) -> str:
        return f"{self.op.describe()}?"


@dataclass(frozen=True, eq=False)
class AltPattern(Pattern):
    """The first of ``options`` that matches."""

    options: tuple[Pattern, ...]

    def describe(self) -> str:
        return " | ".join(o.describe() for o in self.options)


@dataclass
class MatchContext:
    """What a check callback sees: the bindings so far and the matched nodes."""

    values: dict[str, Value]
    nodes: dict[str, Node]

    def const(self, name: str) -> np.ndarray | None:
        """Constant data bound to variable ``name``, if it is constant."""
        v = self.values.get(name)
        return None if v is None else const_value(v)


class _OpFactory:
    def __init__(self, builder: PatternBuilder, op_types: tuple[str, ...], domain: str) -> None:
        self._b = builder
        self._ops = op_types
        self._domain = domain

    def __call__(
        self,
        *inputs: Pattern | None,
        _label: str = "",
        _exact: bool = True,
        _output: int = 0,
        **attrs: AttrSpec,
    ) -> OpPattern:
        return OpPattern(
            self._ops,
            tuple(inputs),
            dict(attrs),
            self._domain,
            _label,
            _exact,
            _output,
        )


class PatternBuilder:
    """Builds patterns: ``p.MatMul(x, w)``, ``p.var("x")``, ``p.const("c", scalar=True)``.

    Any attribute access with a capitalized name is an operator factory; keyword arguments
    are attribute constraints, ``_label=`` names the node in the match.
    """

    def __init__(self, domain: str = "") -> None:
        self._domain = domain

    def __getattr__(self, name: str) -> _OpFactory:
        if not name[:1].isupper():
            raise AttributeError(name)
        return _OpFactory(self, (name,), self._domain)

    def op(self, *op_types: str, domain: str | None = None) -> _OpFactory:
        """Factory accepting any of ``op_types`` (alternatives: ``p.op("Relu", "Gelu")(x)``)."""
        return _OpFactory(self, tuple(op_types), self._domain if domain is None else domain)

    def var(self, name: str, **constraints: Any) -> VarPattern:
        """A variable; constraints as in :class:`VarPattern`."""
        if "dtypes" in constraints:
            constraints["dtypes"] = tuple(constraints["dtypes"])
        return VarPattern(name, **constraints)

    def const(self, name: str, **constraints: Any) -> VarPattern:
        """A constant variable (initializer or ``Constant`` output)."""
        return self.var(name, const=True, **constraints)

    def optional(
        self, op_type: str | Sequence[str] | OpPattern, inner: Pattern, **attrs: AttrSpec
    ) -> Pattern:
        """An operator that may or may not sit on top of ``inner``.

        ``p.optional("Cast", x)`` is a one-input operator (a Cast, a Reshape);
        ``p.optional(p.Add(inner, p.var("b")), inner)`` is any operator pattern that reads
        ``inner`` (a bias that may be absent). When absent, ``inner`` stands in its place.
        """
        if isinstance(op_type, OpPattern):
            return OptionalPattern(op_type, inner)
        types = (op_type,) if isinstance(op_type, str) else tuple(op_type)
        return OptionalPattern(OpPattern(types, (inner,), dict(attrs), self._domain), inner)
