"""NumPy reference interpreter: runs an IR graph with the catalog's reference implementations.

Used by numeric verification (safe mode) and by tests. Feeds are checked (missing input, wrong
dtype, wrong static dim), only the nodes the requested outputs depend on run, and every
intermediate is freed after its last reader unless ``keep_intermediates`` is set.

Control flow (If, Loop) and local functions (``Model.functions``) run at the ONNX-proto level
through :mod:`graph_autofusion.catalog.definitions.control`; subgraph bodies read outer-scope
values by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graph_autofusion.catalog.definitions.control import ExecScope, call_op
from graph_autofusion.errors import GraphAutoFusionError, UnsupportedOperatorError
from graph_autofusion.ir.core import Graph, Model, Node, RawAttribute, Value
from graph_autofusion.ir.dtypes import DType


class FeedError(GraphAutoFusionError, ValueError):
    """The feeds do not match the graph inputs (missing, unknown, wrong dtype or shape)."""


class InterpreterError(GraphAutoFusionError):
    """A reference implementation failed on a node; the message names the node."""


class ReferenceInterpreter:
    """Executes a graph (or a model's graph) node by node with NumPy.

    Args:
        graph: A :class:`Graph` or a :class:`Model` (whose opsets and functions are used).
        opset_imports: Opset versions by domain when ``graph`` is a bare graph
            (default: ONNX opset 20).
        functions: Local functions (``FunctionProto``) when ``graph`` is a bare graph.
    """

    def __init__(
        self,
        graph: Graph | Model,
        *,
        opset_imports: Mapping[str, int] | None = None,
        functions: Sequence[Any] = (),
    ) -> None:
        if isinstance(graph, Model):
            self.graph = graph.graph
            opsets = dict(graph.opset_imports)
            functions = list(graph.functions) + list(functions)
        else:
            self.graph = graph
            opsets = dict(opset_imports or {"": 20})
        opsets.setdefault("", 20)
        if "ai.onnx" in opsets:
            opsets[""] = opsets.pop("ai.onnx")
        self.opsets = opsets
        self.functions = {(f.domain, f.name): f for f in functions}
        #: Statistics of the last :meth:`run`: nodes executed, peak number of live values.
        self.last_run_stats: dict[str, int] = {}

    # ----- public --------------------------------------------------------------------------
    def run(
        self,
        feeds: Mapping[str, Any],
        *,
        outputs: Sequence[str] | None = None,
        keep_intermediates: bool = False,
    ) -> dict[str, np.ndarray]:
        """Run the graph.

        Args:
            feeds: Graph input name -> array.
            outputs: Names of the values to return (any value, not only graph outputs);
                default: the graph outputs.
            keep_intermediates: Return every computed value (nothing is freed).

        Returns:
            Name -> array for the requested outputs (plus every value computed when
            ``keep_intermediates`` is set).

        Raises:
            FeedError: a feed is missing, unknown, or of the wrong dtype/shape.
            UnsupportedOperatorError: a node's operator cannot be executed.
            InterpreterError: a reference implementation failed on a node.
        """
        g = self.graph
        env: dict[str, Any] = {k: v.const for k, v in g.initializers.items()}
        env.update(self._check_feeds(feeds))
        wanted = list(outputs) if outputs is not None else [v.name for v in g.outputs]
        values = g.value_map()
        missing = [n for n in wanted if n not in values]
        if missing:
            raise GraphAutoFusionError(f"requested outputs {missing} are not values of the graph")
        nodes = self._needed_nodes([values[n] for n in wanted])
        remaining = self._use_counts(nodes)
        keep = set(wanted)
        scope = ExecScope(self.opsets, self.functions, self._outer(env))
        peak = len(env)
        for node in nodes:
            self._execute(node, env, scope)
            peak = max(peak, len(env))
            if keep_intermediates:
                continue
            for name in self._read_names(node):
                remaining[name] -= 1
                if remaining[name] == 0 and name not in keep:
                    env.pop(name, None)
            for out in node.outputs:
                if remaining.get(out.name, 0) == 0 and out.name not in keep:
                    env.pop(out.name, None)
        self.last_run_stats = {"nodes_executed": len(nodes), "peak_live_values": peak}
        if keep_intermediates:
            return {k: v for k, v in env.items() if k not in g.initializers or k in keep}
        return {name: env[name] for name in wanted}

    # ----- helpers -------------------------------------------------------------------------
    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        g = self.graph
        names = {v.name for v in g.inputs}
        unknown = sorted(set(feeds) - names - set(g.initializers))
        if unknown:
            raise FeedError(
                f"feeds {unknown} are not inputs of graph {g.name!r}; inputs: {sorted(names)}"
            )
        out: dict[str, np.ndarray] = {}
        for v in g.inputs:
            if v.name not in feeds:
                if v.name in g.initializers:
                    continue
                raise FeedError(f"missing feed for graph input {v.name!r} ({v.type_str()})")
            arr = np.asarray(feeds[v.name])
            _check_value(v, arr)
            out[v.name] = arr
        for k in set(feeds) & set(g.initializers):
            out[k] = np.asarray(feeds[k])
        return out

    def _needed_nodes(self, targets: list[Value]) -> list[Node]:
        needed: set[Node] = set()
        stack = [v.producer for v in targets if v.producer is not None]
        by_name = {o.name: o.producer for n in self.graph.nodes for o in n.outputs}
        while stack:
            n = stack.pop()
            if n in needed:
                continue
            needed.add(n)
            preds = [v.producer for v in n.all_inputs() if v.producer is not None]
            preds += [by_name[c] for c in _capture_names(n) if c in by_name]
            stack.extend(p for p in preds if p is not None and p not in needed)
        return [n for n in self.graph.nodes if n in needed]

    def _read_names(self, node: Node) -> set[str]:
        return {v.name for v in node.all_inputs()} | set(_capture_names(node))

    def _use_counts(self, nodes: list[Node]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in nodes:
            for name in self._read_names(n):
                counts[name] = counts.get(name, 0) + 1
        return counts

    @staticmethod
    def _outer(env: dict[str, Any]) -> Any:
        def lookup(name: str) -> Any:
            if name in env:
                return env[name]
            raise GraphAutoFusionError(
                f"subgraph reads outer value {name!r}, which is not defined (or already freed)"
            )

        return lookup

    def _execute(self, node: Node, env: dict[str, Any], scope: ExecScope) -> None:
        inputs = []
        for v in node.inputs:
            if v is None:
                inputs.append(None)
                continue
            if v.name not in env:
                raise InterpreterError(
                    f"node {node.name!r} ({node.qualified_op}) reads %{v.name}, which has no value"
                )
            inputs.append(env[v.name])
        try:
            results = call_op(
                node.op_type,
                node.domain,
                node.attrs,
                inputs,
                len(node.outputs),
                scope,
                node=node,
                node_name=node.name,
            )
        except GraphAutoFusionError:
            raise
        except Exception as exc:  # a reference failed: say where
            shapes = [None if a is None else (str(a.dtype), a.shape) for a in inputs]
            raise InterpreterError(
                f"node {node.name!r} ({node.qualified_op}) failed on inputs {shapes}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if len(results) < len(node.outputs):
            raise InterpreterError(
                f"node {node.name!r} ({node.qualified_op}) produced {len(results)} outputs, "
                f"the graph declares {len(node.outputs)}"
            )
        for out, res in zip(node.outputs, results):
            env[out.name] = res


def _capture_names(node: Node) -> list[str]:
    names = [v.name for v in node.captures]
    for a in node.attrs.values():
        if isinstance(a, RawAttribute):
            names.extend(a.captures)
    return names


def _check_value(v: Value, arr: np.ndarray) -> None:
    if v.dtype is not None and v.dtype != DType.UNDEFINED:
        try:
            expected = v.dtype.to_numpy()
        except TypeError:
            expected = None
        if expected is not None and arr.dtype != expected:
            raise FeedError(
                f"feed {v.name!r} has dtype {arr.dtype}, graph input expects {v.dtype.name} "
                f"({expected})"
            )
    if v.shape is not None:
        if arr.ndim != len(v.shape):
            raise FeedError(
                f"feed {v.name!r} has shape {arr.shape}, graph input expects rank {len(v.shape)} "
                f"({v.type_str()})"
            )
        for i, (d, a) in enumerate(zip(v.shape, arr.shape)):
            if isinstance(d, int) and d != a:
                raise FeedError(
                    f"feed {v.name!r} has shape {arr.shape}; dim {i} must be {d} ({v.type_str()})"
                )


def run_model(
    model_or_graph: Model | Graph,
    feeds: Mapping[str, Any],
    *,
    outputs: list[str] | None = None,
    keep_intermediates: bool = False,
) -> dict[str, np.ndarray]:
    """Run a model or graph with the reference interpreter (see :class:`ReferenceInterpreter`)."""
    return ReferenceInterpreter(model_or_graph).run(
        feeds, outputs=outputs, keep_intermediates=keep_intermediates
    )


__all__ = [
    "FeedError",
    "InterpreterError",
    "ReferenceInterpreter",
    "UnsupportedOperatorError",
    "run_model",
]
