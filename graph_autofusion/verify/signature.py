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
    verdict ``(unfused us, fused us, slower, key timed)``; ``agreed``: the signatures whose
    "slower" verdict a second fusion's own measurement repeated (one noisy measurement does
    not roll back every layer of a model); ``mc``: the key whose Monte-Carlo check ran in
    full and passed."""

    speed: dict[str, tuple[float, float, bool, str]] = field(default_factory=dict)
    agreed: set[str] = field(default_factory=set)
    mc: dict[str, str] = field(default_factory=dict)


def signature_parts(record: Any, activations: Mapping[str, Any]) -> list[Any]:
    """What :func:`fusion_signature` digests: ``record``'s rule, its original and new nodes
    (operator, domain, attributes, which value each reads) and the shapes and dtypes of what
    they read.

    The form is free of names: each node list is taken in its graph's order (a match may list
    its nodes in another order from one layer to the next), a value read from outside the
    nodes is numbered by its first read (the record's inputs, and any other captured value the
    original nodes read, such as the attention mask every layer shares), and the fusion's
    outputs by the node and slot that writes them. A value read from outside that is neither
    captured nor constant keeps its name (never shared)."""
    parts: list[Any] = [record.rule]
    reads: dict[str, int] = {}  # value name -> its number, in order of first read
    for name in record.inputs:
        if name in activations:
            reads.setdefault(name, len(reads))
    for label, nodes in (("orig", record.original_nodes), ("new", record.new_nodes)):
        ordered = _in_graph_order(nodes)
        parts.append(label)
        parts.extend(_nodes(ordered, reads, activations))
        if label == "orig":
            writes = {
                o.name: (i, j) for i, n in enumerate(ordered) for j, o in enumerate(n.outputs)
            }
            parts.append(("outs", tuple(writes.get(name) for name in record.outputs)))
    for name in reads:
        a = activations.get(name)
        parts.append(("act", None if a is None else (tuple(np.shape(a)), str(np.asarray(a).dtype))))
    parts.append(("outs", len(record.outputs)))
    return parts


def fusion_signature(record: Any, activations: Mapping[str, Any]) -> str:
    """A digest of :func:`signature_parts`: equal for two fusions that safe mode may time
    once."""
    return hashlib.sha256(repr(signature_parts(record, activations)).encode()).hexdigest()[:32]


def _in_graph_order(nodes: Sequence[Node]) -> list[Node]:
    """``nodes`` in the order of the graph that holds them (as given when one is detached)."""
    graphs = {id(n.graph) for n in nodes}
    if len(graphs) != 1 or nodes[0].graph is None:
        return list(nodes)  # none, or detached: as given
    g = nodes[0].graph
    return sorted(nodes, key=g.order_key)


def _nodes(
    nodes: Sequence[Node], reads: dict[str, int], activations: Mapping[str, Any]
) -> list[Any]:
    made: dict[int, tuple[int, int]] = {}  # id(value) -> (node position, output index)
    for i, n in enumerate(nodes):
        for j, o in enumerate(n.outputs):
            made[id(o)] = (i, j)
    out = []
    for n in nodes:
        src = tuple(_source(v, made, reads, activations) for v in (*n.inputs, *n.captures))
        attrs = tuple(sorted((k, _attr(v)) for k, v in n.attrs.items()))
        out.append((n.domain, n.op_type, attrs, src, len(n.outputs)))
    return out


def _source(
    v: Value | None,
    made: Mapping[int, tuple[int, int]],
    reads: dict[str, int],
    activations: Mapping[str, Any],
):
    if v is None:
        return None
    if id(v) in made:
        return ("node", *made[id(v)])
    if v.name in reads:
        return ("in", reads[v.name])
    c = const_value(v)  # an initializer or a Constant node's output
    if c is not None:
        return ("const", *_array(np.asarray(c)))
    if v.name in activations:  # read from outside, captured: numbered like the inputs
        reads[v.name] = len(reads)
        return ("in", reads[v.name])
    return ("outer", v.name)  # neither captured nor constant: not shareable


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
