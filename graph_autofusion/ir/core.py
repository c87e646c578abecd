"""The graph IR: values, nodes, graphs and models.

Design (after onnx-ir): a :class:`Value` knows its producer and its users; a :class:`Node` owns its
outputs; use-def links change only through the mutation methods of :class:`Graph` and
:class:`Node` (``set_input``, ``replace_all_uses_with``, ``remove_node`` ...), so they are always
consistent. Iterating ``graph.nodes`` returns a snapshot, so a graph is safe to edit while you
iterate over it.

Shapes are tuples whose dims are ``int`` (static), ``str`` (symbolic, e.g. ``"batch"``) or
``None`` (unknown); a value whose rank is unknown has ``shape = None``.

Canonical operator vocabulary: ONNX operator names (domain ``""``) plus contrib domains such as
``com.microsoft``. Both frontends produce this vocabulary, so one rule serves both.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from graph_autofusion.errors import CycleError, IRError
from graph_autofusion.ir.node import Dim, Node, RawAttribute, Shape, Value, const_value, producer_of

__all__ = [
    "Dim",
    "Graph",
    "Model",
    "Node",
    "RawAttribute",
    "Shape",
    "Value",
    "const_value",
    "is_convex",
    "producer_of",
    "topological_order",
]


#: Offset of an inserted node's last key component: above every counter value (see add_node).
_AFTER = 1 << 62


class Graph:
    """A computation graph: inputs, initializers, nodes (kept in a topological order), outputs."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self._nodes: dict[Node, None] = {}
        self._names: set[str] = set()
        self._node_names: set[str] = set()
        self._counter = itertools.count()
        self._name_seq: dict[str, int] = {}
        self.doc = ""
        self.value_info: dict[str, Value] = {}
        self.meta: dict[str, Any] = {}
        self._positions: dict[Node, int] | None = None
        self._sorted = True  # False once an edit may have broken topological order
        # Order keys: tuples that sort the nodes in graph order. An appended node gets
        # ``(seq,)``; a node inserted before X gets a key just below X's (see ``add_node``),
        # so an insertion is O(1) and ``_nodes``' own order is restored lazily (``_order``).
        self._keys: dict[Node, tuple[int, ...]] = {}
        self._seq = itertools.count()
        self._unordered = False  # True while _nodes' dict order lags the order keys

    @property
    def is_sorted(self) -> bool:
        """True when the node order is known to be topological (edits since may break it)."""
        return self._sorted

    def position(self, node: Node) -> int:
        """Index of ``node`` in the current order (cached until the graph changes)."""
        if self._positions is None:
            self._positions = {n: i for i, n in enumerate(self._order())}
        return self._positions[node]

    def order_key(self, node: Node) -> tuple[int, ...]:
        """A key that sorts this graph's nodes in their current order, valid until the graph
        is reordered (unlike :meth:`position`, kept up to date in O(1) by insertions)."""
        return self._keys[node]

    def _order(self) -> dict[Node, None]:
        """``_nodes`` in graph order (sorted by the order keys after insertions)."""
        if self._unordered:
            keys = self._keys
            self._nodes = dict.fromkeys(sorted(self._nodes, key=keys.__getitem__))
            self._unordered = False
        return self._nodes

    def _renumber(self, order: Iterable[Node]) -> None:
        """Make ``order`` the node order, with fresh keys."""
        self._nodes = dict.fromkeys(order)
        self._keys = {n: (i,) for i, n in enumerate(self._nodes)}
        self._seq = itertools.count(len(self._nodes))
        self._unordered = False
        self._positions = None

    # ----- read access -------------------------------------------------------------------
    @property
    def nodes(self) -> list[Node]:
        """Snapshot of the nodes in order; safe to mutate the graph while iterating."""
        return list(self._order())

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node: Node) -> bool:
        return node in self._nodes

    def values(self) -> Iterator[Value]:
        """Every value: inputs, initializers, node outputs."""
        yield from self.inputs
        yield from self.initializers.values()
        for n in self._order():
            yield from n._outputs

    def value_map(self) -> dict[str, Value]:
        return {v.name: v for v in self.values()}

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self._order():
            hist[n.qualified_op] = hist.get(n.qualified_op, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def is_output(self, value: Value) -> bool:
        return any(v is value for v in self.outputs)

    # ----- naming --------------------------------------------------------------------------
    def fresh_name(self, prefix: str = "v") -> str:
        while True:
            name = f"{prefix}_{next(self._counter)}"
            if name not in self._names:
                return name

    def _claim_value_name(self, value: Value) -> None:
        if not value.name:
            value.name = self.fresh_name("v")
        if value.name in self._names:
            raise IRError(f"duplicate value name %{value.name} in graph {self.name!r}")
        self._names.add(value.name)

    def _claim_node_name(self, node: Node) -> None:
        if not node.name or node.name in self._node_names:
            base = node.name or node.op_type
            if node.name or base in self._node_names:
                k = self._name_seq.get(base, 0)
                while True:
                    k += 1
                    if f"{base}_{k}" not in self._node_names:
                        break
                self._name_seq[base] = k
                node.name = f"{base}_{k}"
            else:
                node.name = base
        self._node_names.add(node.name)

    def has_value_name(self, name: str) -> bool:
        """True when a value of this graph is called ``name``."""
        return name in self._names

    def rename_value(self, value: Value, new_name: str) -> None:
        """Give ``value`` a new unique name."""
        if new_name == value.name:
            return
        if new_name in self._names:
            raise IRError(f"cannot rename %{value.name} to %{new_name}: name already used")
        self._names.discard(value.name)
        if value.name in self.initializers:
            del self.initializers[value.name]
            self.initializers[new_name] = value
        value.name = new_name
        self._names.add(new_name)

    # ----- building ------------------------------------------------------------------------
    def add_input(self, value: Value) -> Value:
        self._claim_value_name(value)
        self.inputs.append(value)
        return value

    def add_initializer(self, name: str, array: np.ndarray) -> Value:
        """Add a constant initializer value holding ``array``."""
        value = Value(name, const=np.asarray(array))
        self._claim_value_name(value)
        self.initializers[value.name] = value
        return value

    def add_node(self, node: Node, *, before: Node | None = None) -> Node:
        """Insert ``node`` at the end (or before ``before``); claims its output names."""
        if node.graph is not None:
            raise IRError(f"node {node.name!r} already belongs to a graph")
        if before is not None and before not in self._nodes:
            node._detach()
            raise IRError(f"cannot insert before node {before.name!r}: it is not in the graph")
        names = [out.name for out in node._outputs if out.name]
        clash = [n for n in names if n in self._names] or ([n for n in names if names.count(n) > 1])
        if clash:
            node._detach()
            raise IRError(f"duplicate value name %{clash[0]} in graph {self.name!r}")
        for out in node._outputs:
            self._claim_value_name(out)
        self._claim_node_name(node)
        node.graph = self
        self._positions = None
        self._nodes[node] = None
        if before is None:
            self._keys[node] = (next(self._seq),)  # above every key: last in order
        else:
            # Just below ``before``'s key and above every key now below it (the last
            # component lowered by one, then a component larger than any used so far):
            # ``node`` sits right before ``before``, after earlier insertions there.
            self._sorted = False
            k = self._keys[before]
            self._keys[node] = (*k[:-1], k[-1] - 1, _AFTER + next(self._seq))
            self._unordered = True
        return node

    def make_node(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = "",
        name: str = "",
        num_outputs: int = 1,
        output_names: Sequence[str] | None = None,
        before: Node | None = None,
    ) -> Node:
        """Create, insert and return a node with fresh output values."""
        names = list(output_names) if output_names else [""] * num_outputs
        outs = [Value(n or self.fresh_name((name or op_type).lower())) for n in names]
        node = Node(op_type, inputs, attrs, domain=domain, name=name, outputs=outs)
        return self.add_node(node, before=before)

    def set_outputs(self, values: Sequence[Value]) -> None:
        self.outputs = list(values)

    # ----- mutation ------------------------------------------------------------------------
    def replace_all_uses_with(self, old: Value, new: Value) -> None:
        """Redirect every reader of ``old`` (including graph outputs) to ``new``.

        The node that computes ``new`` keeps reading ``old`` (so inserting a node after a
        value is ``replace_all_uses_with(old, make_node(..., [old]).outputs[0])``).
        """
        if old is new:
            return
        for node, idx in list(old._users):
            if node is new.producer:
                continue  # "insert after old": the new node keeps reading old
            if idx >= 0:
                node.set_input(idx, new)
            else:
                caps = list(node._captures)
                caps[-1 - idx] = new
                node.set_captures(caps)
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove_node(self, node: Node, *, force: bool = False) -> None:
        """Remove ``node``. Its outputs must be unused unless ``force`` is set."""
        if node not in self._nodes:
            raise IRError(f"node {node.name!r} is not in graph {self.name!r}")
        if not force:
            for out in node._outputs:
                readers = [n.name for n, _ in out._users]
                if readers or self.is_output(out):
                    raise IRError(
                        f"cannot remove node {node.name!r}: its output %{out.name} is still "
                        f"used by {readers or ['graph output']}"
                    )
        node._detach()
        self._positions = None
        del self._nodes[node]
        del self._keys[node]
        self._node_names.discard(node.name)
        for out in node._outputs:
            self._names.discard(out.name)
        node.graph = None

    def remove_nodes(self, nodes: Iterable[Node]) -> None:
        """Remove a set of nodes whose outputs are used only inside the set (or not at all)."""
        nodes = list(dict.fromkeys(nodes))
        members = set(nodes)
        stray = [n.name for n in nodes if n not in self._nodes]
        if stray:
            raise IRError(f"cannot remove nodes {stray}: not in graph {self.name!r}")
        for node in nodes:
            for out in node._outputs:
                outside = [n.name for n, _ in out._users if n not in members]
                if outside or self.is_output(out):
                    raise IRError(
                        f"cannot remove node {node.name!r}: %{out.name} is read by "
                        f"{outside or ['graph output']}"
                    )
        for node in nodes:
            node._detach()
        for node in nodes:
            self.remove_node(node, force=True)

    def remove_initializer(self, name: str) -> None:
        value = self.initializers[name]
        if value._users or self.is_output(value):
            raise IRError(f"initializer %{name} is still used")
        del self.initializers[name]
        self._names.discard(name)

    def remove_unused(self) -> int:
        """Delete nodes and initializers that no graph output depends on. Returns the count."""
        live = self._live_nodes()
        dead = [n for n in self._order() if n not in live]
        for n in dead:
            n._detach()
        for n in dead:
            self.remove_node(n, force=True)
        unused = [k for k, v in self.initializers.items() if not v._users and not self.is_output(v)]
        for k in unused:
            self.remove_initializer(k)
        return len(dead) + len(unused)

    def _live_nodes(self) -> set[Node]:
        live: set[Node] = set()
        stack = [v.producer for v in self.outputs if v.producer is not None]
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(p for p in n.predecessors() if p not in live)
        return live

    # ----- order and structure -------------------------------------------------------------
    def topological_sort(self) -> None:
        """Reorder nodes topologically (stable: keeps the current order where legal).

        Raises:
            CycleError: if the graph has a cycle; the message names nodes on it.
        """
        order = topological_order(list(self._order()))
        self._renumber(order)
        self._sorted = True

    def is_convex(self, nodes: Iterable[Node]) -> bool:
        """True when replacing ``nodes`` by one node would create no cycle.

        A set is convex when no path leaves the set and comes back into it.
        """
        return is_convex(nodes)


def topological_order(nodes: Sequence[Node]) -> list[Node]:
    """Kahn's algorithm over ``nodes``, stable with respect to their given order."""
    index = {n: i for i, n in enumerate(nodes)}
    indeg = dict.fromkeys(nodes, 0)
    for n in nodes:
        indeg[n] = sum(1 for p in n.predecessors() if p in index)
    import heapq

    ready = [index[n] for n in nodes if indeg[n] == 0]
    heapq.heapify(ready)
    order: list[Node] = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for s in n.successors():
            if s in indeg:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, index[s])
    if len(order) != len(nodes):
        stuck = [n.name for n in nodes if indeg[n] > 0][:8]
        raise CycleError(f"graph has a cycle through nodes {stuck}")
    return order


def is_convex(nodes: Iterable[Node]) -> bool:
    """True when no path leaves ``nodes`` and re-enters it (fusing them creates no cycle).

    When the nodes belong to a topologically ordered graph, the walk stops at nodes placed
    after the last member (they cannot lead back), so the cost is local to the set.
    """
    members = set(nodes)
    if len(members) <= 1:
        return True
    graph = next(iter(members)).graph
    limit = None
    if graph is not None and graph.is_sorted and all(n.graph is graph for n in members):
        key = graph.order_key  # valid while the graph is edited (position() would renumber)
        limit = max(key(n) for n in members)
    # Walk forward from every successor outside the set; if we reach a member, not convex.
    frontier = [s for n in members for s in n.successors() if s not in members]
    seen: set[Node] = set()
    while frontier:
        n = frontier.pop()
        if n in seen:
            continue
        seen.add(n)
        if limit is not None and n.graph is graph and key(n) > limit:
            continue
        for s in n.successors():
            if s in members:
                return False
            if s not in seen:
                frontier.append(s)
    return True


class Model:
    """A graph plus model-level data: opset imports, metadata, local functions."""

    def __init__(self, graph: Graph, opset_imports: dict[str, int] | None = None) -> None:
        self.graph = graph
        self.opset_imports: dict[str, int] = dict(opset_imports or {"": 20})
        self.ir_version: int = 10
        self.producer_name = "graph-autofusion"
        self.producer_version = ""
        self.domain = ""
        self.model_version = 0
        self.doc = ""
        self.metadata_props: dict[str, str] = {}
        self.functions: list[Any] = []  # local functions, kept as frontend objects (FunctionProto)
        self.meta: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Model({self.graph.name!r}, {len(self.graph)} nodes, opsets={self.opset_imports})"
