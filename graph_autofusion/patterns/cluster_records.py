"""What automatic clustering produces (:class:`Cluster`, :class:`MergeRejection`,
:class:`ClusterResult`) and which reductions may share one kernel
(:func:`reduction_signature`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graph_autofusion.ir.core import Node, Value
from graph_autofusion.patterns.matcher import Match, const_value

_NORM_AXIS_TAIL = {
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "RMSNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}


@dataclass
class Cluster:
    """One fused group of two or more nodes.

    Attributes:
        nodes: Members in topological order.
        kind: Summary such as ``elementwise``, ``reduction+epilogue``,
            ``prologue+reduction+epilogue``, ``matmul+epilogue``.
        inputs: External values the group reads, in first-use order.
        outputs: Values computed in the group and read outside it (or graph outputs).
        num_inputs: How many of ``inputs`` count toward ``max_inputs`` (one-element constants
            do not).
    """

    nodes: list[Node]
    kind: str
    inputs: list[Value]
    outputs: list[Value]
    num_inputs: int

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "nodes": [n.name for n in self.nodes],
            "ops": [n.op_type for n in self.nodes],
            "inputs": [v.name for v in self.inputs],
            "outputs": [v.name for v in self.outputs],
        }

    def match(self) -> Match:
        """The cluster as a :class:`Match` that :func:`~rewrite.fuse_match` can rewrite."""
        return Match(self.nodes[-1], list(self.nodes), {}, {}, list(self.outputs))


@dataclass(frozen=True)
class MergeRejection:
    """A refused merge across the edge ``producer -> consumer``.

    ``producer_group`` and ``consumer_group`` name the members of the two groups at the last
    attempt (just the node itself for a pair refused by kind).
    """

    producer: Node
    consumer: Node
    producer_group: tuple[str, ...]
    consumer_group: tuple[str, ...]
    code: str
    message: str


@dataclass
class ClusterResult:
    """Clusters found on a graph and every merge refused on the way."""

    clusters: list[Cluster]
    rejections: list[MergeRejection]
    _index: dict[Node, int] = field(default_factory=dict, repr=False)

    def cluster_of(self, node: Node) -> Cluster | None:
        """The cluster holding ``node``, or ``None`` when it stays alone."""
        if not self._index:
            self._index = {n: i for i, c in enumerate(self.clusters) for n in c.nodes}
        i = self._index.get(node)
        return None if i is None else self.clusters[i]

    def kinds(self) -> dict[str, int]:
        """Number of clusters per kind summary."""
        out: dict[str, int] = {}
        for c in self.clusters:
            out[c.kind] = out.get(c.kind, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def reasons(self) -> dict[str, int]:
        """Number of rejections per reason code."""
        out: dict[str, int] = {}
        for r in self.rejections:
            out[r.code] = out.get(r.code, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def reduction_signature(node: Node) -> tuple | None:
    """``("reduce", input shape, axes)`` of a reduction or normalization, ``None`` if unknown.

    Two reductions may share a group only when their signatures are equal and known.
    """
    x = node.inputs[0] if node.inputs else None
    if x is None or x.shape is None or any(d is None for d in x.shape):
        return None
    rank = len(x.shape)
    op = node.op_type
    axes: list[int] | None
    if op.startswith("Reduce"):
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            data = const_value(node.inputs[1])
            if data is None:
                return None
            axes = [int(a) for a in np.asarray(data).reshape(-1)]
        if not axes:
            if node.attrs.get("noop_with_empty_axes", 0):
                return None
            axes = list(range(rank))
    elif op in ("ArgMax", "ArgMin"):
        axes = [int(node.attrs.get("axis", 0))]
    elif op in ("Softmax", "LogSoftmax", "Hardmax"):
        axes = [int(node.attrs.get("axis", -1))]
    elif op in _NORM_AXIS_TAIL:
        axes = list(range(int(node.attrs.get("axis", -1)) % max(rank, 1), rank))
    elif op in ("GlobalAveragePool", "GlobalMaxPool"):
        axes = list(range(2, rank))
    else:
        return None
    if rank == 0:
        return None
    return ("reduce", tuple(x.shape), tuple(sorted({a % rank for a in axes})))
