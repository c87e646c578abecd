"""Sample inputs and the shape binding an analysis prices with: feeds generated from the
model's input specs (token ids within the vocabulary, shapes bound), then every value's
concrete shape and dtype."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from graph_autofusion.cost.shapes import ShapeBinding, bind_shapes, bind_symbols
from graph_autofusion.ir.core import Model, Value
from graph_autofusion.samples.sample_inputs import check_input_size, derive_shape_inputs

#: Default value of a symbolic dim in position 0 (batch) and elsewhere (sequence ...).
DEFAULT_BATCH = 1


DEFAULT_DIM = 16


#: Generated integer inputs are ids in ``[0, INT_HIGH)``.
INT_HIGH = 100


def default_feeds(
    model: Model, *, symbols: Mapping[str, int] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Seeded example inputs from the graph's input specs (see the module docstring)."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    symbols = dict(symbols or {})
    feeds: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.name in graph.initializers or v.dtype is None or v.shape is None:
            continue
        shape = []
        for i, d in enumerate(v.shape):
            if isinstance(d, int) and d >= 0:
                shape.append(d)
            elif isinstance(d, str):  # one value per symbol, decided where it first appears
                shape.append(int(symbols.setdefault(d, DEFAULT_BATCH if i == 0 else DEFAULT_DIM)))
            else:
                shape.append(DEFAULT_BATCH if i == 0 else DEFAULT_DIM)
        np_dtype = v.dtype.to_numpy()
        check_input_size(model, v, tuple(shape), np_dtype)  # an absurd dim: a clear error
        if np.issubdtype(np_dtype, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype == np.bool_:
            feeds[v.name] = np.ones(shape, np.bool_)
        else:
            high = _index_bound(v)
            feeds[v.name] = rng.integers(0, high, shape).astype(np_dtype)
    # shapes, sizes and indices the model accepts (the binding runs the graph on them)
    derive_shape_inputs(model, feeds, seed=seed, seq_len=DEFAULT_DIM)
    return feeds


def _index_bound(v: Value) -> int:
    """``INT_HIGH``, or less when ``v`` indexes a constant table (an embedding ``Gather``) with
    fewer rows: ``token_type_ids`` index a 2-row table."""
    high = INT_HIGH
    for user, index in v.users:
        if user.op_type != "Gather" or index != 1 or user.inputs[0] is None:
            continue
        table = user.inputs[0]
        rows = None
        if table.const is not None:
            axis = int(user.attr("axis", 0))
            rows = table.const.shape[axis] if table.const.ndim else None
        elif table.shape and isinstance(table.shape[int(user.attr("axis", 0))], int):
            rows = table.shape[int(user.attr("axis", 0))]
        if rows:
            high = min(high, int(rows))
    return max(1, high)


def bind_shapes_for(
    model: Model,
    feeds: Mapping[str, Any] | None,
    input_shapes: Mapping[str, tuple[int, ...]] | None,
    symbols: Mapping[str, int] | None,
    activations: Mapping[str, Any] | None = None,
) -> ShapeBinding:
    if feeds is not None:
        return bind_shapes(model, feeds, symbols=symbols, activations=activations)
    if input_shapes is not None:
        shapes = dict(input_shapes)
        known = {**bind_symbols(model, shapes), **(symbols or {})}
        for v in model.graph.inputs:  # remaining inputs: bound symbols, else the defaults
            if v.name not in shapes and v.name not in model.graph.initializers and v.shape:
                shapes[v.name] = tuple(
                    d
                    if isinstance(d, int)
                    else int(known.setdefault(d, DEFAULT_BATCH if i == 0 else DEFAULT_DIM))
                    for i, d in enumerate(v.shape)
                )
        return bind_shapes(model, input_shapes=shapes, symbols=symbols, execute=False)
    return bind_shapes(model, default_feeds(model, symbols=symbols), symbols=symbols)


def bind_model(
    model: Model,
    *,
    feeds: Mapping[str, Any] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    symbols: Mapping[str, int] | None = None,
) -> ShapeBinding:
    """Stage 1: concrete shapes (feeds, else input shapes, else generated feeds)."""
    return bind_shapes_for(model, feeds, input_shapes, symbols)
