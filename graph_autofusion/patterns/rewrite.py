"""Rewrite matches into fused operators.

Two forms:

* **Native**: the rule's ``rewrite`` callback builds replacement nodes (a contrib operator, a
  folded Conv) through a :class:`RewriteContext` and returns the values that replace the
  match's outputs.
* **Generic**: the matched nodes move, unchanged, into an ONNX local function in the
  ``graph_autofusion.fused`` domain, and one node calls it. The function is runnable by the
  reference interpreter and by onnxruntime, so every rule is executable even before a target
  lowers it. Identical bodies share one function.

Either way the fused node's outputs take over the names of the values they replace (graph
output names never change), the matched nodes are removed, and the graph is re-sorted if an
exported value has a reader placed before the root. A rewrite that fails leaves the graph as it
was: nothing is mutated until the replacement is fully built.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.patterns.matcher import Match, const_value

#: Domain of generic fused operators (local functions).
FUSED_DOMAIN = "graph_autofusion.fused"


class RewriteError(GraphAutoFusionError):
    """A match could not be rewritten (the graph is left unchanged)."""


@dataclass
class RewriteContext:
    """What a native rewrite callback uses to build its replacement.

    Nodes made through :meth:`make_node` are inserted before the match's root, so they come
    after every value the match reads.
    """

    model: Model
    match: Match
    rule_name: str
    fused_op: str = ""
    created: list[Node] = field(default_factory=list)

    @property
    def graph(self):
        return self.model.graph

    def value(self, name: str) -> Value:
        """The value bound to pattern variable ``name`` (as it is now: if an earlier rewrite
        replaced the bound value, its replacement)."""
        return resolve(self.model, self.match.values[name])

    def label(self, name: str) -> Node:
        """The node matched under label ``name``."""
        return self.match.labels[name]

    def const(self, name: str) -> np.ndarray | None:
        """Constant data bound to variable ``name`` (``None`` if not constant)."""
        return const_value(self.value(name))

    def generic(self) -> list[Value]:
        """Fall back to the generic form (a local-function call) from inside a native rewrite;
        return its outputs."""
        node = _function_call(self.model, self.fused_op or self.rule_name, self.match)
        self.created.append(node)
        return list(node.outputs)

    def make_node(
        self,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        domain: str = "",
        num_outputs: int = 1,
    ) -> Node:
        node = self.graph.make_node(
            op_type,
            inputs,
            attrs,
            domain=domain,
            name=f"{self.rule_name}/{op_type}",
            num_outputs=num_outputs,
            before=self.match.root,
        )
        self.created.append(node)
        if domain and domain not in self.model.opset_imports:
            self.model.opset_imports[domain] = 1
        return node

    def add_constant(self, hint: str, array: np.ndarray, dtype: Any = None) -> Value:
        """A new initializer holding ``array``; ``dtype`` (a :class:`DType`): its element
        type when NumPy holds it in another one (a bfloat16 constant is a float32 array)."""
        value = self.graph.add_initializer(self.graph.fresh_name(hint), np.asarray(array))
        if dtype is not None:
            value.dtype = dtype
        return value

    def expand_to(self, value: Value, axis: int, source: Value, source_axis: int) -> Value:
        """``value`` (a dim of 1 at ``axis``) broadcast there to ``source``'s dim
        ``source_axis``, read at run time: ``Expand(value, [1, ..., Shape(source)[source_axis],
        ..., 1])``, for a native operator that does not broadcast as its pieces did."""
        rank = value.rank
        axis %= rank
        i64 = np.int64
        dims = self.make_node("Shape", [source]).outputs[0]
        at = self.add_constant("expand_axis", np.array([source_axis], i64))
        parts = [self.make_node("Gather", [dims, at], {"axis": 0}).outputs[0]]
        if axis:
            parts.insert(0, self.add_constant("expand_ones", np.ones(axis, i64)))
        if rank - axis - 1:
            parts.append(self.add_constant("expand_ones", np.ones(rank - axis - 1, i64)))
        shape = self.make_node("Concat", parts, {"axis": 0}).outputs[0]
        out = self.make_node("Expand", [value, shape]).outputs[0]
        out.dtype = value.dtype
        out.shape = tuple(
            source.shape[source_axis] if i == axis else d for i, d in enumerate(value.shape)
        )
        return out


def resolve(model: Model, value: Value) -> Value:
    """``value``, or what replaced it in an earlier rewrite of this model (followed to the end)."""
    replaced = model.meta.get("replaced_values")
    if not replaced:
        return value
    seen = 0
    while value in replaced and seen < 10_000:
        value = replaced[value]
        seen += 1
    return value


def _function_body(model: Model, match: Match, name: str) -> tuple[Any, str]:
    """A FunctionProto holding the matched nodes with canonical value names, and its digest."""
    import onnx
    from onnx import helper

    from graph_autofusion.frontend.onnx_export import node_to_proto

    inputs = match.inputs()
    canon: dict[str, str] = {v.name: f"in{i}" for i, v in enumerate(inputs)}
    for i, v in enumerate(match.outputs):
        canon[v.name] = f"out{i}"
    k = 0
    for n in match.nodes:
        for o in n.outputs:
            if o.name not in canon:
                canon[o.name] = f"t{k}"
                k += 1
    body = []
    for n in match.nodes:
        if n.captures:
            raise RewriteError(f"node {n.name!r} has a subgraph; it cannot move into a function")
        proto = node_to_proto(n, set(canon))
        for f in ("name", "doc_string", "metadata_props"):
            proto.ClearField(f)
        for field_name in ("input", "output"):
            names = [canon.get(x, x) if x else "" for x in getattr(proto, field_name)]
            del getattr(proto, field_name)[:]
            getattr(proto, field_name).extend(names)
        body.append(proto)
    domains = {n.domain for n in match.nodes}
    opsets = [
        helper.make_opsetid(d, v)
        for d, v in sorted(model.opset_imports.items())
        if d in domains or d == ""
    ]
    fn = helper.make_function(
        FUSED_DOMAIN,
        name,
        [f"in{i}" for i in range(len(inputs))],
        [f"out{i}" for i in range(len(match.outputs))],
        body,
        opsets,
    )
    digest = hashlib.sha1(
        b"".join(p.SerializeToString(deterministic=True) for p in body)
    ).hexdigest()[:10]
    assert isinstance(fn, onnx.FunctionProto)
    return fn, digest


def _function_call(model: Model, fused_op: str, match: Match) -> Node:
    fn, digest = _function_body(model, match, fused_op)
    known = model.meta.setdefault("fused_functions", {})
    fname = known.get((fused_op, digest))
    if fname is None:
        taken = {f.name for f in model.functions if f.domain == FUSED_DOMAIN}
        fname, k = fused_op, 1
        while fname in taken:
            k += 1
            fname = f"{fused_op}_{k}"
        fn.name = fname
        model.functions.append(fn)
        known[(fused_op, digest)] = fname
    model.opset_imports.setdefault(FUSED_DOMAIN, 1)
    return model.graph.make_node(
        fname,
        match.inputs(),
        domain=FUSED_DOMAIN,
        name=fused_op,
        num_outputs=len(match.outputs),
        before=match.root,
    )


def fuse_match(
    model: Model, match: Match, fused_op: str, *, rewrite: Any = None, rule_name: str = ""
) -> list[Node]:
    """Replace ``match`` in ``model.graph`` by its fused form; returns the new nodes.

    Raises:
        RewriteError: the match is stale (a node already removed) or the rewrite failed; the
            graph is unchanged.
    """
    graph = model.graph
    stale = [n.name for n in match.nodes if n.graph is not graph]
    if stale:
        raise RewriteError(f"{fused_op}: nodes {stale} are no longer in the graph")
    members = set(match.nodes)
    exported = {id(v) for v in match.outputs}
    for n in match.nodes:  # an earlier native form may read past its own match's inputs
        for o in n.outputs:
            if id(o) not in exported and any(u not in members for u, _ in o.users):
                raise RewriteError(
                    f"{fused_op}: %{o.name} inside the match is now read outside it (by an "
                    f"earlier rewrite); the match is no longer in the graph as it was matched"
                )
    if rewrite is not None:
        ctx = RewriteContext(model, match, rule_name or fused_op, fused_op)
        try:
            new_values = list(rewrite(ctx))
            if len(new_values) != len(match.outputs):
                raise RewriteError(
                    f"{fused_op}: rewrite returned {len(new_values)} values for "
                    f"{len(match.outputs)} outputs"
                )
        except Exception:
            for node in reversed(ctx.created):
                node._detach()
                graph.remove_node(node, force=True)
            raise
        new_nodes = ctx.created
    else:
        node = _function_call(model, fused_op, match)
        new_values = list(node.outputs)
        new_nodes = [node]
    for old, new in zip(match.outputs, new_values):
        if new.dtype is None:
            new.dtype = old.dtype
        if new.shape is None:
            new.shape = old.shape
    # One value cannot carry two names: a value that replaces a second output (or a value from
    # outside the rewrite that replaces a read output) gets an Identity carrying the old name.
    own = {id(o) for n in new_nodes for o in n.outputs}
    seen: set[int] = set()
    for i, (old, new) in enumerate(zip(match.outputs, new_values)):
        if new is old:
            continue
        if (id(new) in seen or id(new) not in own) and (old.users or graph.is_output(old)):
            ident = graph.make_node(
                "Identity", [new], name=f"{rule_name or fused_op}/Identity", before=match.root
            )
            ident.outputs[0].dtype, ident.outputs[0].shape = old.dtype, old.shape
            new_nodes.append(ident)
            new_values[i] = ident.outputs[0]
        seen.add(id(new))
    replaced = model.meta.setdefault("replaced_values", {})
    for old, new in zip(match.outputs, new_values):
        graph.replace_all_uses_with(old, new)
        if new is not old:
            replaced[old] = new
    names = [v.name for v in match.outputs]
    graph.remove_nodes(match.nodes)
    for new, name in zip(new_values, names):
        if (
            new.producer is not None
            and new.producer in new_nodes
            and not graph.has_value_name(name)
        ):
            graph.rename_value(new, name)
    if not _still_sorted(graph, new_nodes):
        graph.topological_sort()
    return new_nodes


def _still_sorted(graph, new_nodes: list[Node]) -> bool:
    key = graph.order_key  # O(1) after insertions; position() would renumber every node
    for node in new_nodes:
        pos = key(node)
        for out in node.outputs:
            if any(key(u) < pos for u in out.user_nodes if u.graph is graph):
                return False
    return True
