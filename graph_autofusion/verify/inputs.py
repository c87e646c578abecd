"""Sample inputs for safe mode, generated from a model's input specs with realistic ranges.

* integer inputs named like ``*ids*`` (``input_ids``, ``decoder_input_ids``): token ids in
  ``[0, vocab)``; the vocabulary is the row count of the embedding table the input is gathered
  from (found by following the input through Cast/Reshape/... to a ``Gather`` on a constant
  table), else ``vocab_size``, else the largest 2-D gathered table, else 100;
* ``*token_type*`` / ``*segment*``: zeros; ``*mask*``: ones; ``*position*``: ``arange`` along the
  last axis; other integers: ``[0, min(vocab, seq_len))``; booleans: ``True``;
* floating inputs (images included): ``N(0, 1)``, cast to the input's dtype.

Symbolic or unknown dims become ``batch`` (the first axis, or a dim named like ``batch``) or
``seq_len`` (every other one).
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Model, Node, Value

_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


def generate_inputs(
    model: Model,
    *,
    seed: int = 0,
    batch: int = 1,
    seq_len: int = 16,
    vocab_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Seeded sample feeds for every graph input of ``model`` (initializers excluded)."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    fallback_vocab = vocab_size or _largest_table(model) or 100
    feeds: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        shape = _concrete_shape(v, batch, seq_len)
        dtype = v.dtype.to_numpy() if v.dtype is not None else np.dtype(np.float32)
        name = v.name.lower()
        if np.issubdtype(dtype, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[v.name] = np.ones(shape, dtype=np.bool_)
        elif "token_type" in name or "segment" in name:
            feeds[v.name] = np.zeros(shape, dtype=dtype)
        elif "mask" in name:
            feeds[v.name] = np.ones(shape, dtype=dtype)
        elif "position" in name:
            last = shape[-1] if shape else 1
            feeds[v.name] = np.broadcast_to(np.arange(last), shape).astype(dtype).copy()
        elif "ids" in name or "token" in name:
            vocab = vocab_size or _gathered_table_rows(v) or fallback_vocab
            feeds[v.name] = rng.integers(0, vocab, shape).astype(dtype)
        else:
            high = max(1, min(fallback_vocab, seq_len))
            feeds[v.name] = rng.integers(0, high, shape).astype(dtype)
    return feeds


def _concrete_shape(v: Value, batch: int, seq_len: int) -> tuple[int, ...]:
    if v.shape is None:
        return (batch, seq_len)
    out = []
    for i, d in enumerate(v.shape):
        if isinstance(d, int):
            out.append(d)
        elif i == 0 or (isinstance(d, str) and "batch" in d.lower()):
            out.append(batch)
        else:
            out.append(seq_len)
    return tuple(out)


def _gathered_table_rows(v: Value, depth: int = 6) -> int | None:
    """Rows of the constant table a ``Gather`` indexes with ``v`` (followed through casts and
    reshapes), or ``None``."""
    frontier: list[Value] = [v]
    for _ in range(depth):
        nxt: list[Value] = []
        for value in frontier:
            for node, idx in value.users:
                rows = _table_rows(node, idx)
                if rows is not None:
                    return rows
                if node.op_type in _PASS_THROUGH and idx == 0:
                    nxt.extend(node.outputs)
        frontier = nxt
    return None


def _table_rows(node: Node, idx: int) -> int | None:
    if node.op_type != "Gather" or idx != 1 or int(node.attr("axis", 0) or 0) != 0:
        return None
    table = node.inputs[0]
    if table is None or table.shape is None or len(table.shape) != 2:
        return None
    rows = table.shape[0]
    return rows if isinstance(rows, int) and table.is_const else None


def _largest_table(model: Model) -> int | None:
    best = None
    for node in model.graph.nodes:
        rows = _table_rows(node, 1)
        if rows is not None and (best is None or rows > best):
            best = rows
    return best


__all__ = ["generate_inputs"]
