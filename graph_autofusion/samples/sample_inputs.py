"""Sample inputs the model accepts: values of inputs that carry shapes, sizes or indices.

:func:`~graph_autofusion.samples.inputs.generate_inputs` draws every input from its name and
type; an integer input that an operator reads as a shape, a split, a slice bound or indices
then usually makes the model fail (an ``Expand`` whose target shape is a graph input, a
``SplitToSequence`` whose split sizes are). This module is the one place that knows those
operators: :func:`derive_shape_inputs` finds each graph input that such an operand reads
(directly or through ``Cast``/``Identity``) and gives it a value consistent with the concrete
shapes of the model on the other inputs (ONNX shape inference with data propagation, rerun
as values get fixed, so a derived ``Reshape`` shape feeds the ``Expand`` after it). A generated
value already valid (token ids within the embedding table) is kept as drawn. A KV-cache
decoder's inputs are first made to agree (:func:`graph_autofusion.samples.kv_inputs.conform`:
the mask over past + new tokens, the positions after the past); those values are kept.

When the original model still fails on the sample inputs, :func:`run_failure` turns the
runtime's exception into one :class:`~graph_autofusion.errors.SampleInputError` naming the
failing node and the inputs that reach it, and pointing to ``--inputs``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graph_autofusion.errors import SampleInputError
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.samples import kv_inputs
from graph_autofusion.samples.input_roles import ROLES, RoleContext
from graph_autofusion.samples.run_failure import run_failure, source_of

__all__ = [
    "MAX_INPUT_BYTES",
    "ROLES",
    "RoleContext",
    "SampleInputs",
    "check_input_size",
    "derive_shape_inputs",
    "find_roles",
    "is_generated",
    "own_copy",
    "run_failure",
    "source_of",
]


#: One sample input larger than this is refused (an absurd declared dim, e.g. 2**40).
MAX_INPUT_BYTES = 1 << 30


_PASS = {"Cast", "Identity"}


_ROUNDS = 4


_STANDARD = ("", "ai.onnx")


class SampleInputs(dict):
    """Generated sample feeds (a plain dict to every user) that remember how they were made:
    ``derived`` maps an input name to the operand it was derived for; ``notes`` say what could
    not be derived (added to the error when the model fails on them)."""

    generated = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.derived: dict[str, str] = {}
        self.notes: list[str] = []


def own_copy(feeds: Mapping[str, Any]) -> dict[str, Any]:
    """A pipeline's own copy of ``feeds``; generated ones stay :class:`SampleInputs`."""
    if isinstance(feeds, SampleInputs):
        copy = SampleInputs(feeds)
        copy.derived = dict(feeds.derived)
        copy.notes = list(getattr(feeds, "notes", ()))
        return copy
    return dict(feeds)


def is_generated(feeds: Any) -> bool:
    """True for feeds made by :func:`~graph_autofusion.samples.inputs.generate_inputs`."""
    return bool(getattr(feeds, "generated", False))


def check_input_size(model: Model, v: Value, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse a sample input too large to allocate (before anything allocates it)."""
    n = math.prod(shape)
    size = n * max(dtype.itemsize, 1)
    if size > MAX_INPUT_BYTES:
        raise SampleInputError(
            f"{source_of(model)}: graph input {v.name!r} declares shape {v.shape} "
            f"({n} elements, {size / 2**30:.1f} GiB): too large for a generated sample input; "
            f"pass inputs with --inputs FILE.npz (API: sample_inputs={{...}})"
        )


@dataclass
class _Role:
    value: Value
    node: Node
    index: int


def find_roles(model: Model) -> list[_Role]:
    """Graph inputs an operator reads as a shape, sizes, bounds or indices (through
    ``Cast``/``Identity``), each with the first such operand."""
    graph = model.graph
    roles = []
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        frontier, seen = [v], {id(v)}
        while frontier:
            cur = frontier.pop()
            for node, idx in cur.users:
                if idx < 0 or node.domain not in _STANDARD:
                    continue
                if (node.op_type, idx) in ROLES:
                    roles.append(_Role(v, node, idx))
                elif node.op_type in _PASS:
                    for out in node.outputs:
                        if id(out) not in seen:
                            seen.add(id(out))
                            frontier.append(out)
    return roles


class _Shapes:
    """Concrete shapes of the model's values on the current feeds (and fixed values)."""

    def __init__(self, model: Model, feeds: Mapping[str, Any], fixed: Mapping[str, np.ndarray]):
        self.model, self.feeds, self.fixed = model, feeds, fixed
        self._inferred: dict[str, tuple[int, ...]] | None = None

    def shape(self, v: Value | None) -> tuple[int, ...] | None:
        if v is None:
            return None
        if v.const is not None:
            return tuple(np.shape(v.const))
        if v.name in self.feeds and v.producer is None:
            return tuple(np.shape(self.feeds[v.name]))
        if v.shape is not None and all(isinstance(d, int) and d >= 0 for d in v.shape):
            return tuple(v.shape)
        if self._inferred is None:
            self._inferred = _infer(self.model, self.feeds, self.fixed)
        return self._inferred.get(v.name)

    def const(self, v: Value | None) -> np.ndarray | None:
        if v is None:
            return None
        if v.const is not None:
            return np.asarray(v.const)
        if v.producer is None and v.name in self.fixed:
            return self.fixed[v.name]
        return None


def _infer(
    model: Model, feeds: Mapping[str, Any], fixed: Mapping[str, np.ndarray]
) -> dict[str, tuple[int, ...]]:
    """ONNX shape inference (data propagation on) with the feeds' shapes and the fixed values
    as constants; only fully known shapes are returned."""
    import onnx
    from onnx import numpy_helper

    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.frontend.onnx_read import inference_skeleton

    try:
        skel = inference_skeleton(to_onnx(model))
        inputs = list(skel.graph.input)
        del skel.graph.input[:]
        for vi in inputs:
            if vi.name in fixed:
                skel.graph.initializer.append(numpy_helper.from_array(fixed[vi.name], vi.name))
                continue
            arr = feeds.get(vi.name)
            if isinstance(arr, np.ndarray) and vi.type.HasField("tensor_type"):
                shp = vi.type.tensor_type.shape
                shp.Clear()
                shp.SetInParent()
                for d in arr.shape:
                    shp.dim.add().dim_value = int(d)
            skel.graph.input.append(vi)
        inferred = onnx.shape_inference.infer_shapes(
            skel, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception:  # noqa: BLE001 - no inference: nothing is derived from it
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if all(d is not None and d >= 0 for d in dims):
                out[vi.name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
    return out


def derive_shape_inputs(
    model: Model, feeds: dict[str, Any], *, seed: int = 0, seq_len: int = 16
) -> dict[str, str]:
    """Give every shape-, size- or index-carrying graph input (see :data:`ROLES`) a value the
    model accepts, in place in ``feeds``; a drawn value already valid is kept. Returns what
    was derived: input name -> ``"<op> 'node' <operand>"`` (or what a KV-cache decoder's input
    is). A KV-cache decoder whose relations cannot be derived adds a note to ``feeds.notes``
    (:class:`SampleInputs`)."""

    derived: dict[str, str] = {}
    kv = kv_inputs.plan(model)
    if isinstance(kv, kv_inputs.KVPlan):
        derived.update(kv_inputs.conform(model, feeds, kv))
    elif isinstance(kv, kv_inputs.KVRefusal):
        notes = getattr(feeds, "notes", None)
        if isinstance(notes, list) and kv.note not in notes:
            notes.append(kv.note)
    keep = set(derived)
    roles = find_roles(model)
    if not roles:
        return derived
    rng = np.random.default_rng([seed, 7919])
    fixed: dict[str, np.ndarray] = {}
    pending = roles
    for _ in range(_ROUNDS):
        shapes = _Shapes(model, feeds, fixed)
        rest: list[_Role] = []
        for r in pending:
            name = r.value.name
            if name in fixed or name not in feeds:
                continue
            if name in keep:  # a KV-cache decoder's mask, positions or lengths: as made
                fixed[name] = np.asarray(feeds[name])
                continue
            derive, valid, what = ROLES[(r.node.op_type, r.index)]
            cur = np.asarray(feeds[name])
            dtype = cur.dtype
            c = RoleContext(
                r.node, r.index, r.value, dtype, cur, shapes.shape, shapes.const, rng, seq_len
            )
            verdict = valid(c, cur) if valid is not None else False
            if verdict:
                fixed[name] = cur
                continue
            new = derive(c)
            if new is None:
                rest.append(r)
                continue
            feeds[name] = fixed[name] = np.asarray(new, dtype=dtype)
            derived[name] = f"{r.node.op_type} {r.node.name!r} {what}"
        if not rest or len(rest) == len(pending):
            break
        pending = rest
    return derived
