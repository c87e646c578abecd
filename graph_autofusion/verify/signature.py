"""The signature of one fusion's computation: what safe mode's speed check depends on.

    sig = fusion_signature(record, activations)

Two fusions with one signature replace the same operators (types, attributes, wiring) by the
same new operators, on inputs of the same shapes and dtypes, with constants of the same
shapes and dtypes (and the same values where a constant is small enough to steer the
computation: an axis, a shape, a scale). A transformer's layers repeat their fusions; safe
mode times one of each signature and applies the verdict to the others, while every
fusion's numerics are still checked on its own activations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.ir.core import Node, Value, const_value

#: Constants with at most this many elements enter the signature by value (indices, shapes,
#: axes, epsilons); larger ones (weights) by shape and dtype only.
SMALL_CONST = 64


@dataclass
class Repeats:
    """What one fuse learned per signature, shared by its fusion checks: ``speed``: the
    verdict ``(unfused us, fused us, slower, key timed)``; ``mc``: the key whose Monte-Carlo
    check ran in full and passed."""

    speed: dict[str, tuple[float, float, bool, str]] = field(default_factory=dict)
    mc: dict[str, str] = field(default_factory=dict)


def fusion_signature(record: Any, activations: Mapping[str, Any]) -> str:
    """A digest of ``record``'s rule, its original and new nodes (operator, domain,
    attributes, which input each reads) and the shapes and dtypes of what they read."""
    parts: list[Any] = [record.rule]
    inputs = {name: i for i, name in enumerate(record.inputs)}
    for label, nodes in (("orig", record.original_nodes), ("new", record.new_nodes)):
        parts.append(label)
        parts.extend(_nodes(nodes, inputs))
    for name in record.inputs:
        a = activations.get(name)
        parts.append(("act", None if a is None else (tuple(np.shape(a)), str(np.asarray(a).dtype))))
    parts.append(("outs", len(record.outputs)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _nodes(nodes: Sequence[Node], inputs: Mapping[str, int]) -> list[Any]:
    made: dict[int, tuple[int, int]] = {}  # id(value) -> (node position, output index)
    for i, n in enumerate(nodes):
        for j, o in enumerate(n.outputs):
            made[id(o)] = (i, j)
    out = []
    for n in nodes:
        reads = tuple(_source(v, made, inputs) for v in (*n.inputs, *n.captures))
        attrs = tuple(sorted((k, _attr(v)) for k, v in n.attrs.items()))
        out.append((n.domain, n.op_type, attrs, reads, len(n.outputs)))
    return out


def _source(v: Value | None, made: Mapping[int, tuple[int, int]], inputs: Mapping[str, int]):
    if v is None:
        return None
    if id(v) in made:
        return ("node", *made[id(v)])
    if v.name in inputs:
        return ("in", inputs[v.name])
    c = const_value(v)  # an initializer or a Constant node's output
    if c is not None:
        return ("const", *_array(np.asarray(c)))
    return ("outer", v.name)  # neither read from outside nor constant: not shareable


def _array(a: np.ndarray) -> tuple:
    if a.size <= SMALL_CONST:
        return (a.shape, str(a.dtype), a.tobytes())
    return (a.shape, str(a.dtype))


def _attr(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("array", *_array(v))
    if isinstance(v, list | tuple):
        return tuple(_attr(x) for x in v)
    if isinstance(v, int | float | str | bytes | bool) or v is None:
        return v
    return ("object", id(v))  # subgraphs and raw attributes: never shared
