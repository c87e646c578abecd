"""Synthetic graphs of any size, for scaling benchmarks and tests.

:func:`synthetic_transformer` stacks transformer-like blocks written out in primitive ONNX
operators (LayerNorm decomposed into ReduceMean/Sub/Pow/Sqrt/Div, MatMul + bias, erf-GELU,
scaled and masked Softmax, residual Adds) until the graph holds about ``num_nodes`` nodes.
Weights are small (``hidden`` x ``hidden``) so a 100,000-node graph stays in memory.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Graph, Model, Value
from graph_autofusion.ir.dtypes import DType

NODES_PER_BLOCK = 26


def synthetic_transformer(num_nodes: int, hidden: int = 16, seq: int = 8, seed: int = 0) -> Model:
    """Build a valid, runnable model of about ``num_nodes`` nodes (opset 18)."""
    rng = np.random.default_rng(seed)
    g = Graph("synthetic")
    x = g.add_input(Value("x", DType.FLOAT, (1, seq, hidden)))
    mask = g.add_input(Value("mask", DType.FLOAT, (1, seq, seq)))

    def const(name: str, arr: np.ndarray) -> Value:
        return g.add_initializer(g.fresh_name(name), np.asarray(arr))

    def op(op_type: str, *ins: Value, **attrs) -> Value:
        return g.make_node(op_type, list(ins), attrs or None).outputs[0]

    axes = const("axes", np.array([-1], np.int64))
    two = const("two", np.array(2.0, np.float32))
    eps = const("eps", np.array(1e-5, np.float32))
    sqrt2 = const("sqrt2", np.array(np.sqrt(2.0), np.float32))
    one = const("one", np.array(1.0, np.float32))
    half = const("half", np.array(0.5, np.float32))
    scale = const("scale", np.array(np.sqrt(hidden), np.float32))
    h = x
    blocks = max(1, num_nodes // NODES_PER_BLOCK)
    for _ in range(blocks):
        # LayerNorm, decomposed: 9 nodes
        mean = op("ReduceMean", h, axes, keepdims=1)
        d = op("Sub", h, mean)
        var = op("ReduceMean", op("Pow", d, two), axes, keepdims=1)
        normed = op("Div", d, op("Sqrt", op("Add", var, eps)))
        gamma = const("gamma", rng.standard_normal(hidden).astype(np.float32))
        beta = const("beta", rng.standard_normal(hidden).astype(np.float32))
        ln = op("Add", op("Mul", normed, gamma), beta)
        # attention scores: 6 nodes
        wq = const("wq", (rng.standard_normal((hidden, hidden)) / hidden).astype(np.float32))
        q = op("MatMul", ln, wq)
        scores = op("MatMul", q, op("Transpose", ln, perm=[0, 2, 1]))
        probs = op("Softmax", op("Add", op("Div", scores, scale), mask), axis=-1)
        ctx = op("MatMul", probs, ln)
        # MatMul + bias + erf-GELU + MatMul + bias + residual: 10 nodes
        w1 = const("w1", (rng.standard_normal((hidden, hidden)) / hidden).astype(np.float32))
        b1 = const("b1", rng.standard_normal(hidden).astype(np.float32))
        a = op("Add", op("MatMul", ctx, w1), b1)
        gelu = op("Mul", op("Mul", a, op("Add", op("Erf", op("Div", a, sqrt2)), one)), half)
        w2 = const("w2", (rng.standard_normal((hidden, hidden)) / hidden).astype(np.float32))
        b2 = const("b2", rng.standard_normal(hidden).astype(np.float32))
        h = op("Add", op("Add", op("MatMul", gelu, w2), b2), h)
    g.set_outputs([h])
    return Model(g, {"": 18})


def synthetic_feeds(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for :func:`synthetic_transformer`."""
    rng = np.random.default_rng(seed)
    x, mask = model.graph.inputs
    return {
        "x": rng.standard_normal(x.shape).astype(np.float32),
        "mask": np.zeros(mask.shape, np.float32),
    }
