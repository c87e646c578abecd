"""Analytic per-node cost: FLOPs and bytes moved, from the node's value shapes and dtypes.

Unknown sizes: when a shape the formula needs has a ``None`` or symbolic dim (or an unknown
dtype), the functions return ``None``, never a guess. Callers treat ``None`` as "unknown" (the
cost model may substitute a hint for symbolic dims before asking again).
"""

from __future__ import annotations

from graph_autofusion.catalog.registry import FusionKind, schema_of
from graph_autofusion.ir.core import Node, Value

#: FLOPs per input element charged to a normalization with no formula of its own.
NORMALIZATION_FLOPS_PER_ELEMENT = 6


def _present(values: tuple[Value | None, ...]) -> list[Value]:
    return [v for v in values if v is not None]


def default_flops(node: Node, kind: FusionKind) -> int | None:
    """FLOPs by fusion kind when the schema gives no formula.

    elementwise/broadcast: numel(Y) * max(1, inputs - 1); reduction: numel(X);
    normalization: 6 * numel(X); contraction: 2 * numel(Y) (a lower bound);
    injective, data movement and opaque: 0.
    """
    if kind in (FusionKind.INJECTIVE, FusionKind.DATA_MOVEMENT, FusionKind.OPAQUE):
        return 0
    if not node.outputs:
        return 0
    out = node.outputs[0].numel()
    inputs = _present(node.inputs)
    if kind in (FusionKind.ELEMENTWISE, FusionKind.BROADCAST):
        return None if out is None else out * max(1, len(inputs) - 1)
    first = inputs[0].numel() if inputs else None
    if kind == FusionKind.REDUCTION:
        return first
    if kind == FusionKind.NORMALIZATION:
        return None if first is None else NORMALIZATION_FLOPS_PER_ELEMENT * first
    return None if out is None else 2 * out


def node_flops(node: Node) -> int | None:
    """Floating-point operations of one execution of ``node`` (``None`` if sizes unknown).

    The schema's ``flops`` formula wins; otherwise :func:`default_flops` by fusion kind.
    """
    schema = schema_of(node)
    if schema.flops is not None:
        value = schema.flops(node)
        return None if value is None else int(value)
    return default_flops(node, schema.kind)


def node_bytes(node: Node) -> tuple[int, int] | None:
    """``(bytes_read, bytes_written)``: every distinct input read once, every output written once.

    Returns ``None`` when any input or output size is unknown.
    """
    read = 0
    seen: set[int] = set()
    for v in _present(node.inputs):
        if id(v) in seen:
            continue
        seen.add(id(v))
        n = v.nbytes()
        if n is None:
            return None
        read += n
    written = 0
    for v in node.outputs:
        n = v.nbytes()
        if n is None:
            return None
        written += n
    return read, written
