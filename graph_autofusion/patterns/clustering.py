"""Automatic clustering (F4c): grow fused groups over fusion kinds, no rule needed.

    result = cluster(model.graph, max_nodes=64, max_inputs=8)
    for c in result.clusters:
        print(c.kind, [n.name for n in c.nodes], [v.name for v in c.outputs])
    for r in result.rejections:          # every refused merge, with a reason code
        print(r.producer.name, "->", r.consumer.name, r.code, r.message)
    apply_clusters(model, result)        # each cluster becomes one fused node

Every node starts as its own group. The fusible producer -> consumer edges of
:func:`~graph_autofusion.patterns.pairs.operator_pairs` are tried in three phases: contraction
epilogues first (MatMul/Gemm/Conv take the elementwise ops after them, as onnxruntime's
FusedMatMul/FusedConv do), then loop fusion of elementwise, broadcast and layout chains, then
reduction prologues and epilogues. Inside a phase, edges go in graph order of the producer.
Phases repeat until a round merges nothing (a merge refused as a cycle may become legal once the
path's other nodes joined). A merge of the producer's group A with the consumer's group B is
legal when:

* the union holds at most ``max_nodes`` nodes and reads at most ``max_inputs`` distinct
  external values (a constant with one element is an immediate and does not count);
* at most one contraction, and then it is the group's first node: every other member is an
  elementwise or broadcast node reachable from it inside the group (no prologue);
* several reductions only when they reduce the same shape over the same axes (a decomposed
  LayerNorm or Softmax), and none reads another directly;
* the shapes A and B compute over broadcast together (:func:`loop_shape`): a kernel is one
  loop nest, so a group at one length cannot take a group at another (the levels of a traced
  associative scan, each half as long as the last, were one 57-node group no kernel could run);
* the union stays convex: no path leaves A and re-enters through B.

Convexity is checked without walking the graph: groups keep a topological numbering ``tau`` of
the contracted graph (dynamic topological order, after Pearce and Kelly). A path from A to B
through other groups can only pass groups numbered between them, so the search stays inside that
window; after a merge the window is renumbered (A's descendants after, B's ancestors before).
On transformer graphs the window is a few dozen groups, so clustering is linear in practice.
"""

from __future__ import annotations

import gc

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.ir.core import Graph, Model, Node, Value
from graph_autofusion.patterns.cluster_records import (
    Cluster,
    ClusterResult,
    MergeRejection,
    reduction_signature,
)
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pairs import (
    PairReason,
    class_verdict,
    graph_order,
    node_class,
    pair_verdict,
)
from graph_autofusion.patterns.rewrite import fuse_match

__all__ = [
    "Cluster",
    "ClusterResult",
    "MAX_ROUNDS",
    "MergeRejection",
    "PHASES",
    "apply_clusters",
    "cluster",
    "loop_shape",
    "reduction_signature",
]


#: Merge phases in order; a fusible pair's code decides its phase.
PHASES: dict[str, int] = {
    PairReason.CONTRACTION_EPILOGUE: 0,
    PairReason.LOOP_FUSION: 1,
    PairReason.REDUCTION_PROLOGUE: 2,
    PairReason.REDUCTION_EPILOGUE: 2,
}


MAX_ROUNDS = 4


def _counts_as_input(v: Value) -> bool:
    data = const_value(v)
    return data is None or np.asarray(data).size > 1


def _names(members: list[int], order: list[Node]) -> tuple[str, ...]:
    return tuple(order[i].name for i in members)


def _computed_shape(node: Node, cls: str) -> tuple | None:
    """The shape ``node`` computes over: a pointwise or contraction node's output, a
    reduction's input; ``None`` for layout and other nodes (a kernel reads those as views) or
    when the rank is unknown."""
    if cls in ("PW", "CON"):
        v = node.outputs[0] if node.outputs else None
    elif cls == "RED":
        v = node.inputs[0] if node.inputs else None
    else:
        return None
    shape = v.shape if v is not None else None
    return tuple(shape) if shape is not None else None


def loop_shape(a: tuple, b: tuple) -> tuple | None:
    """The shape ``a`` and ``b`` broadcast to (aligned from the right), or ``None`` when two
    known sizes differ and neither is 1. A symbolic or unknown size is taken to match any
    size (a known one wins); the kernel's lowering checks the sizes again."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif isinstance(x, int) and isinstance(y, int):
            return None
        else:
            out.append(x if isinstance(x, int) else y)
    return tuple(out)


def _fmt(shape: tuple) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class _Clusterer:
    def __init__(self, graph: Graph, max_nodes: int, max_inputs: int) -> None:
        self.graph = graph
        self.max_nodes = max_nodes
        self.max_inputs = max_inputs
        self.order = order = graph_order(graph)
        self.idx = idx = {n: i for i, n in enumerate(order)}
        self.cls = [node_class(n) for n in order]
        n = len(order)
        succ: list[list[int]] = [[] for _ in range(n)]
        pred: list[list[int]] = [[] for _ in range(n)]
        ins: list[set[Value]] = []
        for i, nd in enumerate(order):
            reads = set(nd.all_inputs())
            ins.append(reads)
            for p in {v.producer for v in reads}:
                j = idx.get(p) if p is not None else None
                if j is not None:
                    pred[i].append(j)
                    succ[j].append(i)
        for lst in pred:
            lst.sort()
        self.succ, self.pred, self.ins = succ, pred, ins  # succ is sorted by construction
        self.group = list(range(n))
        self.members: list[list[int]] = [[i] for i in range(n)]
        self.tau = list(range(n))
        self.counted: dict[Value, bool] = {}
        self.sigs: dict[int, list[tuple | None]] = {}
        self.contraction: dict[int, int] = {}
        self.loop: dict[int, tuple] = {}  # group -> the shape its computing nodes broadcast to
        for i, c in enumerate(self.cls):
            if c == "RED":
                self.sigs[i] = [reduction_signature(order[i])]
            elif c == "CON":
                self.contraction[i] = i
            shape = _computed_shape(order[i], c)
            if shape is not None:
                self.loop[i] = shape

    # ----- group graph ---------------------------------------------------------------------
    def _gsucc(self, g: int) -> set[int]:
        grp = self.group
        return {grp[s] for m in self.members[g] for s in self.succ[m]} - {g}

    def _gpred(self, g: int) -> set[int]:
        grp = self.group
        return {grp[p] for m in self.members[g] for p in self.pred[m]} - {g}

    def _window_descendants(self, a: int, b: int) -> set[int] | None:
        """Groups reachable from ``a`` (not through ``b``) numbered before ``b``; ``None`` when a
        path from ``a`` reaches ``b`` through another group (the merge would make a cycle)."""
        tau, tb = self.tau, self.tau[b]
        stack = [x for x in self._gsucc(a) if x != b and tau[x] < tb]
        seen = set(stack)
        while stack:
            for y in self._gsucc(stack.pop()):
                if y == b:
                    return None
                if tau[y] < tb and y not in seen:
                    seen.add(y)
                    stack.append(y)
        return seen

    def _window_ancestors(self, a: int, b: int) -> set[int]:
        tau, ta = self.tau, self.tau[a]
        stack = [x for x in self._gpred(b) if x != a and tau[x] > ta]
        seen = set(stack)
        while stack:
            for y in self._gpred(stack.pop()):
                if tau[y] > ta and y not in seen:
                    seen.add(y)
                    stack.append(y)
        return seen

    # ----- legality ------------------------------------------------------------------------
    def _kind_problem(self, a: int, b: int, union: list[int]) -> tuple[str, str] | None:
        ca, cb = self.contraction.get(a), self.contraction.get(b)
        if ca is not None and cb is not None:
            return PairReason.TWO_CONTRACTIONS, (
                f"both groups hold a contraction ({self.order[ca].name!r} and "
                f"{self.order[cb].name!r}); a group holds at most one"
            )
        c = ca if ca is not None else cb
        if c is not None:
            bad = [i for i in union if i != c and self.cls[i] != "PW"]
            if bad:
                nd = self.order[bad[0]]
                return PairReason.NOT_ELEMENTWISE_EPILOGUE, (
                    f"the contraction {self.order[c].name!r} accepts only an elementwise "
                    f"epilogue, and {nd.op_type} {nd.name!r} is not elementwise"
                )
            inside = set(union)
            reached = {c}
            stack = [c]
            while stack:
                for s in self.succ[stack.pop()]:
                    if s in inside and s not in reached:
                        reached.add(s)
                        stack.append(s)
            if len(reached) != len(inside):
                first = min(inside - reached)
                return PairReason.CONTRACTION_PROLOGUE, (
                    f"{self.order[first].op_type} {self.order[first].name!r} would not follow "
                    f"the contraction {self.order[c].name!r} in the group (no prologue is fused "
                    f"into a contraction)"
                )
        sa, sb = self.sigs.get(a, []), self.sigs.get(b, [])
        if sa and sb:
            sigs = sa + sb
            if None in sigs or len(set(sigs)) > 1:
                return PairReason.REDUCTION_MISMATCH, (
                    "the groups' reductions do not reduce the same shape over the same axes"
                )
            reds_b = {i for i in self.members[b] if self.cls[i] == "RED"}
            reds_a = {i for i in self.members[a] if self.cls[i] == "RED"}
            if any(p in reds_a for r in reds_b for p in self.pred[r]):
                return PairReason.REDUCE_AFTER_REDUCE, (
                    "a reduction would read another reduction's output inside the group"
                )
        return None

    def _narrowing(self, c: int, a: int) -> tuple[str, str] | None:
        """A ``Slice`` or ``Gather`` after a computing group joins it only when it keeps the
        group's loop shape: a kernel cannot output a part of its loop. (The part stays a
        layout node, free to join its consumers as a view of their input: the next level of a
        traced associative scan.)"""
        node, loop = self.order[c], self.loop.get(a)
        if loop is None or node.op_type not in ("Slice", "Gather"):
            return None
        out = node.outputs[0].shape if node.outputs else None
        if out is None or len(out) != len(loop):
            return None
        if any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(out, loop)):
            return PairReason.LOOP_SHAPE, (
                f"{node.op_type} {node.name!r} takes {_fmt(tuple(out))} of the group's loop "
                f"{_fmt(loop)}: a kernel cannot output a part of its loop"
            )
        return None

    def _counts(self, v: Value) -> bool:
        hit = self.counted.get(v)
        if hit is None:
            hit = self.counted[v] = _counts_as_input(v)
        return hit

    def _union_inputs(self, a: int, b: int) -> set[Value]:
        grp, idx = self.group, self.idx
        out = set()
        for v in self.ins[a] | self.ins[b]:
            p = v.producer
            if p is not None:
                i = idx.get(p)
                if i is not None and grp[i] in (a, b):
                    continue
            out.add(v)
        return out

    def try_merge(self, p: int, c: int) -> tuple[str, str] | None:
        """Merge the groups of ``p`` and ``c``; returns ``(code, sentence)`` when refused."""
        a, b = self.group[p], self.group[c]
        if a == b:
            return None
        size = len(self.members[a]) + len(self.members[b])
        if size > self.max_nodes:
            return PairReason.MAX_NODES, (
                f"the merged group would hold {size} nodes, more than max_nodes={self.max_nodes}"
            )
        union = self.members[a] + self.members[b]
        problem = self._kind_problem(a, b, union)
        if problem is not None:
            return problem
        narrowed = self._narrowing(c, a)
        if narrowed is not None:
            return narrowed
        la, lb = self.loop.get(a), self.loop.get(b)
        loop = la if lb is None else lb if la is None else loop_shape(la, lb)
        if loop is None and la is not None:
            return PairReason.LOOP_SHAPE, (
                f"the groups compute over shapes {_fmt(la)} and {_fmt(lb)}, which do not "
                f"broadcast together: one loop nest cannot run both"
            )
        ins = self._union_inputs(a, b)
        n_in = sum(1 for v in ins if self._counts(v))
        if n_in > self.max_inputs:
            return PairReason.MAX_INPUTS, (
                f"the merged group would read {n_in} external values, more than "
                f"max_inputs={self.max_inputs}"
            )
        desc = self._window_descendants(a, b)
        if desc is None:
            return PairReason.NOT_CONVEX, (
                "a path leaves the producer's group and re-enters the consumer's group through "
                "other nodes, so fusing them would create a cycle"
            )
        anc = self._window_ancestors(a, b)
        self._commit(a, b, union, ins, anc, desc, loop)
        return None

    def _commit(
        self,
        a: int,
        b: int,
        union: list[int],
        ins: set[Value],
        anc: set[int],
        desc: set[int],
        loop: tuple | None,
    ) -> None:
        tau = self.tau
        pool = sorted([tau[g] for g in anc] + [tau[g] for g in desc] + [tau[a], tau[b]])
        k = 0
        for g in sorted(anc, key=tau.__getitem__):
            tau[g] = pool[k]
            k += 1
        tau[a] = pool[k]
        k += 1
        for g in sorted(desc, key=tau.__getitem__):
            tau[g] = pool[k]
            k += 1
        for i in self.members[b]:
            self.group[i] = a
        self.members[a] = sorted(union)
        self.members[b] = []
        self.ins[a] = ins
        self.ins[b] = set()
        if b in self.sigs:
            self.sigs.setdefault(a, []).extend(self.sigs.pop(b))
        if b in self.contraction:
            self.contraction[a] = self.contraction.pop(b)
        self.loop.pop(b, None)
        if loop is not None:
            self.loop[a] = loop

    # ----- result --------------------------------------------------------------------------
    def kind_of(self, members: list[int]) -> str:
        cls = [self.cls[i] for i in members]
        order = self.order
        if "CON" in cls:
            c = members[cls.index("CON")]
            return f"{order[c].op_type.lower()}+epilogue"
        if "RED" in cls:
            reds = [i for i, k in zip(members, cls) if k == "RED"]
            inside = set(members)
            after: set[int] = set()
            stack = list(reds)
            while stack:
                for s in self.succ[stack.pop()]:
                    if s in inside and s not in after:
                        after.add(s)
                        stack.append(s)
            rest = [i for i in members if self.cls[i] != "RED"]
            pro = any(i not in after for i in rest)
            epi = any(i in after for i in rest)
            return "+".join(
                [
                    x
                    for x, keep in (("prologue", pro), ("reduction", True), ("epilogue", epi))
                    if keep
                ]
            )
        if "INJ" in cls and "PW" in cls:
            return "elementwise+layout"
        return "layout" if "INJ" in cls else "elementwise"

    def cluster_of(self, members: list[int]) -> Cluster:
        order = self.order
        nodes = [order[i] for i in members]
        inside = set(members)
        outs_g = {id(v) for v in self.graph.outputs}
        inputs: dict[Value, None] = {}
        outputs: list[Value] = []
        for nd in nodes:
            for v in nd.all_inputs():
                p = v.producer
                if p is None or self.idx.get(p) not in inside:
                    inputs.setdefault(v, None)
            for v in nd.outputs:
                if id(v) in outs_g or any(self.idx.get(u) not in inside for u, _ in v._users):
                    outputs.append(v)
        ins = list(inputs)
        n_in = sum(1 for v in ins if self._counts(v))
        return Cluster(nodes, self.kind_of(members), ins, outputs, n_in)


def cluster(
    graph: Graph,
    *,
    max_nodes: int = defaults.MAX_CLUSTER_NODES,
    max_inputs: int = defaults.MAX_CLUSTER_INPUTS,
) -> ClusterResult:
    """Group the graph's fusible nodes into clusters (see the module docstring).

    Args:
        graph: The graph; it is not modified.
        max_nodes: Most nodes in one cluster.
        max_inputs: Most distinct external values one cluster reads (one-element constants are
            immediates and do not count).

    Returns:
        The clusters (two or more nodes each, in order of their first node) and every refused
        merge: pairs refused by kind, and fusible edges whose groups could not merge.
    """
    # The pass allocates many small containers and frees no cycles: pausing the cyclic garbage
    # collector halves its time on large graphs.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _cluster(graph, max_nodes, max_inputs)
    finally:
        if paused:
            gc.enable()


def _cluster(graph: Graph, max_nodes: int, max_inputs: int) -> ClusterResult:
    cl = _Clusterer(graph, max_nodes, max_inputs)
    order, idx = cl.order, cl.idx
    classes = {n: cl.cls[i] for i, n in enumerate(order)}
    edges: list[tuple[int, int, int]] = []  # (phase, producer, consumer)
    refused: list[MergeRejection] = []
    for p, producer in enumerate(order):
        for c in cl.succ[p]:
            fusible, code = class_verdict(cl.cls[p], cl.cls[c])
            if fusible:
                edges.append((PHASES[code], p, c))
            else:
                v = pair_verdict(producer, order[c], classes=classes, graph=graph)
                refused.append(
                    MergeRejection(
                        producer, order[c], (producer.name,), (order[c].name,), v.code, v.message
                    )
                )
    edges.sort(key=lambda e: e[0])
    last: dict[tuple[int, int], MergeRejection] = {}
    for _ in range(MAX_ROUNDS):
        merged = False
        for _phase, p, c in edges:
            if cl.group[p] == cl.group[c]:
                continue
            ga, gb = list(cl.members[cl.group[p]]), list(cl.members[cl.group[c]])
            problem = cl.try_merge(p, c)
            if problem is None:
                merged = True
                last.pop((p, c), None)
                continue
            code, why = problem
            msg = (
                f"cannot merge {order[p].op_type} {order[p].name!r} -> {order[c].op_type} "
                f"{order[c].name!r}: {why}."
            )
            last[(p, c)] = MergeRejection(
                order[p], order[c], _names(ga, order), _names(gb, order), code, msg
            )
        if not merged:
            break
    final = [r for (p, c), r in last.items() if cl.group[p] != cl.group[c]]
    rejections = sorted(refused + final, key=lambda r: (idx[r.producer], idx[r.consumer]))
    groups = [m for m in cl.members if len(m) >= 2]
    groups.sort(key=lambda m: m[0])
    return ClusterResult([cl.cluster_of(m) for m in groups], rejections)


def apply_clusters(model: Model, result: ClusterResult, *, prefix: str = "Cluster") -> list[Node]:
    """Rewrite every cluster into one call of a local function; returns the fused nodes.

    The function is named after the cluster's kind (``Cluster_elementwise``,
    ``Cluster_matmul_epilogue`` ...); identical bodies share one function.
    """

    fused: list[Node] = []
    for c in result.clusters:
        name = f"{prefix}_{c.kind.replace('+', '_')}"
        fused.extend(fuse_match(model, c.match(), name, rule_name=name))
    return fused
