"""Concrete shapes for cost estimation, without touching the user's model.

Exported models have symbolic dims (``batch``, ``seq``, ``unk__2`` ...), so most per-node FLOP
and byte counts are unknown until the dims are bound. :func:`bind_shapes` binds them from
example inputs and re-derives every value's dtype and shape:

1. **Execution** (when feeds are given and every operator has a torch implementation): the
   graph runs once with the torch runtime and the dtype/shape of every value is recorded. This
   is exact, including shapes computed from data (``Shape -> Gather -> Concat -> Reshape``).
2. **Symbol substitution** otherwise (or for values the run did not reach): each symbol is
   bound from the example input shapes (``input_ids: [batch, seq]`` fed ``[1, 16]`` gives
   ``batch=1, seq=16``) or from ``symbols=``, and substituted in every annotated shape; values
   still unknown are inferred by running their node on ``meta`` tensors (shadow copies, see
   below).

The model is never mutated. The result, a :class:`ShapeBinding`, maps value names to concrete
``(dtype, shape)`` and builds *shadow nodes* on demand: detached copies of a node (same
op, domain, name and attributes; new :class:`Value` objects carrying the concrete types, the
same constant arrays) that :func:`graph_autofusion.catalog.cost.node_flops` and ``node_bytes``
can size. The cost model works on shadow nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.errors import InputShapeError
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.ir.dtypes import DType

ConcreteType = tuple[DType | None, tuple[int, ...] | None]


@dataclass
class ShapeBinding:
    """Concrete value types of one model under one set of input shapes.

    Attributes:
        types: Value name -> ``(dtype, shape)``; shape dims are ints (``None`` shape: unknown).
        symbols: Symbolic dim name -> the int bound to it.
        method: ``"execute"`` or ``"symbols"`` (how most shapes were found).
        opset: Default-domain opset of the model (used by meta inference).
    """

    types: dict[str, ConcreteType] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=dict)
    method: str = "symbols"
    opset: int = 20
    _shadow: dict[int, Node] = field(default_factory=dict, repr=False)
    _values: dict[str, Value] = field(default_factory=dict, repr=False)

    def shape(self, value: Value) -> tuple[int, ...] | None:
        """The concrete shape of ``value`` (``None`` if unknown)."""
        t = self.types.get(value.name)
        if t is not None and t[1] is not None:
            return t[1]
        return _substitute(value.shape, self.symbols)

    def dtype(self, value: Value) -> DType | None:
        t = self.types.get(value.name)
        if t is not None and t[0] is not None:
            return t[0]
        return value.dtype

    def value(self, v: Value) -> Value:
        """A detached copy of ``v`` with its concrete dtype/shape (same ``const`` array)."""
        got = self._values.get(v.name)
        if got is None:
            got = Value(v.name, self.dtype(v), self.shape(v), const=v.const)
            self._values[v.name] = got
        return got

    def node(self, node: Node) -> Node:
        """A shadow of ``node``: same op/attrs/name, values carrying concrete types.

        Shadow nodes are detached (no graph); their values are shared between shadows, so a
        value's producer and users among shadows mirror the model's.
        """
        got = self._shadow.get(id(node))
        if got is not None:
            return got
        ins = [self.value(v) if v is not None else None for v in node.inputs]
        outs = []
        for o in node.outputs:
            sv = self.value(o)
            if sv.producer is not None:  # a stale copy from another node of the same name
                sv = Value(o.name, self.dtype(o), self.shape(o))
                self._values[o.name] = sv
            outs.append(sv)
        shadow = Node(
            node.op_type, ins, node.attrs, domain=node.domain, name=node.name, outputs=outs
        )
        shadow.meta["original"] = node
        self._shadow[id(node)] = shadow
        if any(o.shape is None or o.dtype is None for o in outs):
            self._infer_meta(shadow)
        return shadow

    def nodes(self, nodes: Iterable[Node]) -> list[Node]:
        return [self.node(n) for n in nodes]

    def _infer_meta(self, shadow: Node) -> None:
        try:
            from graph_autofusion.runtime.torch_runtime import infer_node_types
        except Exception:  # noqa: BLE001 - torch missing: leave unknown
            return
        if infer_node_types(shadow, self.opset, overwrite=False):
            for o in shadow.outputs:
                if o.shape is not None and all(isinstance(d, int) for d in o.shape):
                    self.types[o.name] = (o.dtype, tuple(int(d) for d in o.shape))

    @property
    def unknown(self) -> list[str]:
        """Names of values whose shape is still not concrete."""
        return [k for k, (_, s) in self.types.items() if s is None]


def _substitute(
    shape: tuple[Any, ...] | None, symbols: Mapping[str, int]
) -> tuple[int, ...] | None:
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, int | np.integer):
            out.append(int(d))
        elif isinstance(d, str) and d in symbols:
            out.append(int(symbols[d]))
        else:
            return None
    return tuple(out)


def bind_symbols(model: Model, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Symbol -> int from the graph inputs' declared shapes and the given concrete shapes.

    Raises:
        InputShapeError: (a ValueError) a symbol would get two different values, or a static
            dim disagrees.
    """
    symbols: dict[str, int] = {}
    for v in model.graph.inputs:
        if v.name not in input_shapes or v.shape is None:
            continue
        concrete = tuple(int(d) for d in input_shapes[v.name])
        if len(concrete) != len(v.shape):
            raise InputShapeError(f"input {v.name!r} has rank {len(v.shape)}, got shape {concrete}")
        for declared, dim in zip(v.shape, concrete):
            if isinstance(declared, str):
                if symbols.setdefault(declared, dim) != dim:
                    raise InputShapeError(
                        f"symbol {declared!r} bound to {symbols[declared]} and to {dim}"
                    )
            elif isinstance(declared, int) and declared != dim:
                raise InputShapeError(f"input {v.name!r}: dim {declared} fed as {dim}")
    return symbols


def _execute(model: Model, feeds: Mapping[str, Any]) -> dict[str, ConcreteType] | None:
    """Run the graph once with the torch runtime and record every value's dtype and shape."""
    try:
        import torch

        from graph_autofusion.runtime.torch_ops import OpCall, from_torch_dtype
        from graph_autofusion.runtime.torch_runtime import const_to_tensor, impl_for
    except Exception:  # noqa: BLE001 - no torch: fall back to symbols
        return None
    graph = model.graph
    if any(impl_for(n) is None for n in graph.nodes):
        return None
    opset = int(model.opset_imports.get("", 20))
    env: dict[str, Any] = {}
    types: dict[str, ConcreteType] = {}
    last_use: dict[str, int] = {}
    nodes = graph.nodes
    for i, n in enumerate(nodes):
        for v in n.all_inputs():
            last_use[v.name] = i
    for v in graph.inputs:
        if v.name in feeds:
            arr = feeds[v.name]
            if not isinstance(arr, torch.Tensor) and (
                isinstance(arr, list) or np.asarray(arr).dtype.kind not in "biufc"
            ):
                return None  # a sequence or strings: no tensor for torch, symbols only
            t = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(np.asarray(arr))
            env[v.name] = t
            types[v.name] = (from_torch_dtype(t.dtype), tuple(int(d) for d in t.shape))
    consts = graph.initializers
    try:
        with torch.no_grad():
            for i, node in enumerate(nodes):
                args = []
                for v in node.inputs:
                    if v is None:
                        args.append(None)
                    elif v.name in env:
                        args.append(env[v.name])
                    elif v.name in consts:
                        args.append(const_to_tensor(consts[v.name]))
                    else:
                        return None
                out = impl_for(node)(OpCall(node, opset), *args)
                outs = out if isinstance(out, tuple | list) else (out,)
                for v, t in zip(node.outputs, outs):
                    if isinstance(t, torch.Tensor):
                        env[v.name] = t
                        types[v.name] = (from_torch_dtype(t.dtype), tuple(int(d) for d in t.shape))
                for v in node.all_inputs():
                    if last_use.get(v.name) == i and v.name not in consts:
                        env.pop(v.name, None)
    except Exception:  # noqa: BLE001 - a node that does not run: fall back to symbols
        return None
    return types


def _from_arrays(
    model: Model, feeds: Mapping[str, Any], arrays: Mapping[str, Any]
) -> dict[str, ConcreteType] | None:
    """What :func:`_execute` records, read from the arrays of a run that already happened
    (safe mode's captured activations of the same feeds): the graph inputs fed and every node
    output. ``None`` when one node output is not an array there (then the graph runs)."""
    types: dict[str, ConcreteType] = {}
    try:
        for v in model.graph.inputs:
            if v.name in feeds and isinstance(feeds[v.name], np.ndarray):
                a = feeds[v.name]
                types[v.name] = (DType.from_numpy(a.dtype), tuple(int(d) for d in a.shape))
        for n in model.graph.nodes:
            for o in n.outputs:
                a = arrays.get(o.name)
                if not isinstance(a, np.ndarray):
                    return None
                types[o.name] = (DType.from_numpy(a.dtype), tuple(int(d) for d in a.shape))
    except TypeError:  # a dtype the IR has no name for: let the graph run
        return None
    return types


def bind_shapes(
    model: Model,
    feeds: Mapping[str, Any] | None = None,
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    symbols: Mapping[str, int] | None = None,
    execute: bool = True,
    activations: Mapping[str, Any] | None = None,
) -> ShapeBinding:
    """Concrete dtype/shape of every value of ``model`` for the given inputs (model unchanged).

    Args:
        model: The model (not modified).
        feeds: Example inputs (name -> array or tensor). Their shapes bind the symbols; with
            ``execute`` the graph also runs once on them (exact shapes everywhere).
        input_shapes: Input shapes without data (symbol binding only).
        symbols: Explicit symbol values; override those bound from inputs.
        execute: Run the graph when ``feeds`` are given.
        activations: Every node output of a run of ``model`` (or of a model whose values
            have the same names) on ``feeds``, by name (safe mode's captured activations):
            read instead of running the graph again when they cover every node output.
    """
    shapes = dict(input_shapes or {})
    if feeds:
        shapes.update({k: tuple(np.shape(v)) for k, v in feeds.items()})
    bound = bind_symbols(model, shapes)
    bound.update(symbols or {})
    binding = ShapeBinding(symbols=bound, opset=int(model.opset_imports.get("", 20)))
    executed = None
    if feeds and execute and activations is not None:
        executed = _from_arrays(model, feeds, activations)
    if executed is None and feeds and execute:
        executed = _execute(model, feeds)
    for v in model.graph.values():
        binding.types[v.name] = (v.dtype, _substitute(v.shape, bound))
    if executed is not None:
        binding.types.update(executed)
        binding.method = "execute"
    return binding


def concrete_nodes(
    model: Model, feeds: Mapping[str, Any] | None = None, **kwargs: Any
) -> tuple[ShapeBinding, list[Node]]:
    """:func:`bind_shapes` plus shadow copies of all nodes, in graph order."""
    binding = bind_shapes(model, feeds, **kwargs)
    return binding, binding.nodes(model.graph.nodes)
