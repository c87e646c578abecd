"""Constraints between pattern variables: rule ``checks`` that read like the requirement.

    FusionRule(..., checks=(broadcastable("x", "bias"), same_shape("a", "b"), last_dim("x", 64)))

Each factory returns a callable ``(MatchContext) -> str | None`` (a rejection sentence, or
``None`` to accept). Unknown shapes never pass a shape constraint: a fusion is only proven
legal on what is known. YAML rule files name them under ``checks:`` with the same spelling.
"""

from __future__ import annotations

from collections.abc import Callable

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Value
from graph_autofusion.patterns.pattern import MatchContext

Check = Callable[[MatchContext], "str | None"]


class UnboundVariableError(GraphAutoFusionError, KeyError):
    """A constraint names a variable its rule's pattern does not bind."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def _get(ctx: MatchContext, name: str) -> Value:
    try:
        return ctx.values[name]
    except KeyError:
        raise UnboundVariableError(
            f"constraint names %{name}, which the pattern does not bind"
        ) from None


def _named(fn: Check, text: str) -> Check:
    fn.__name__ = fn.__qualname__ = text
    return fn


def same_shape(a: str, b: str) -> Check:
    """%a and %b have equal, known shapes."""

    def check(ctx: MatchContext) -> str | None:
        va, vb = _get(ctx, a), _get(ctx, b)
        if va.shape is None or vb.shape is None or va.shape != vb.shape:
            return f"%{va.name} {va.type_str()} and %{vb.name} {vb.type_str()} differ in shape"
        return None

    return _named(check, f"same_shape({a}, {b})")


def broadcastable(a: str, b: str) -> Check:
    """%b broadcasts onto %a without growing it (numpy rules, known ranks)."""

    def check(ctx: MatchContext) -> str | None:
        va, vb = _get(ctx, a), _get(ctx, b)
        if va.shape is None or vb.shape is None or len(vb.shape) > len(va.shape):
            return f"%{vb.name} {vb.type_str()} does not broadcast onto %{va.name} {va.type_str()}"
        for da, db in zip(reversed(va.shape), reversed(vb.shape)):
            if db != 1 and db != da:
                return (
                    f"%{vb.name} {vb.type_str()} does not broadcast onto %{va.name} {va.type_str()}"
                )
        return None

    return _named(check, f"broadcastable({a}, {b})")


def rank(name: str, r: int) -> Check:
    """%name has rank ``r``."""

    def check(ctx: MatchContext) -> str | None:
        v = _get(ctx, name)
        return None if v.rank == r else f"%{v.name} has rank {v.rank}, want {r}"

    return _named(check, f"rank({name}, {r})")


def last_dim(name: str, size: int | str) -> Check:
    """The last dim of %name is ``size`` (an int) or equals the last dim of %size (a name)."""

    def check(ctx: MatchContext) -> str | None:
        v = _get(ctx, name)
        want = (
            size
            if isinstance(size, int)
            else ((_get(ctx, size).shape or (None,))[-1] if _get(ctx, size).shape else None)
        )
        got = v.shape[-1] if v.shape else None
        if got is None or want is None or got != want:
            return f"%{v.name} has last dim {got}, want {want}"
        return None

    return _named(check, f"last_dim({name}, {size})")


def static(name: str) -> Check:
    """%name has a fully static shape."""

    def check(ctx: MatchContext) -> str | None:
        v = _get(ctx, name)
        return None if v.is_static else f"%{v.name} {v.type_str()} has no static shape"

    return _named(check, f"static({name})")


def same_dtype(a: str, b: str) -> Check:
    """%a and %b have the same element type."""

    def check(ctx: MatchContext) -> str | None:
        va, vb = _get(ctx, a), _get(ctx, b)
        if va.dtype is None or va.dtype != vb.dtype:
            return f"%{va.name} {va.type_str()} and %{vb.name} {vb.type_str()} differ in dtype"
        return None

    return _named(check, f"same_dtype({a}, {b})")


#: Constraint factories by name (the YAML ``checks:`` vocabulary).
CONSTRAINTS: dict[str, Callable[..., Check]] = {
    "same_shape": same_shape,
    "broadcastable": broadcastable,
    "rank": rank,
    "last_dim": last_dim,
    "static": static,
    "same_dtype": same_dtype,
}
