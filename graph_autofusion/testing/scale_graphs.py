"""Large hybrid CNN + transformer graphs for the whole-pipeline scale benchmark and its test.

:func:`hybrid_stack` builds a deep stack of stages until the graph holds about ``num_nodes``
nodes. Each stage (static shapes throughout, opset 18):

* a CNN block on ``[1, C, S, S]``: Conv + BatchNormalization + Relu, a depthwise Conv +
  BatchNormalization + SiLU (Sigmoid, Mul), a squeeze-and-excite gate (GlobalAveragePool,
  Conv, Relu, Conv, Sigmoid, Mul), a Conv + BatchNormalization, the residual Add and a Relu;
* the bridge to tokens: a Reshape by a constant shape ``[1, C, S*S]`` and a Transpose to
  ``[1, S*S, C]``;
* a transformer block on ``[1, S*S, C]``: LayerNorm decomposed (ReduceMean, Sub, Pow, Add,
  Sqrt, Div, Mul, Add), scaled and masked Softmax attention, MatMul + bias, erf-GELU,
  MatMul + bias and the residual Add;
* the bridge back: a Transpose and a Reshape to ``[1, C, S, S]``.

Every weight is its own initializer (small: ``C`` x ``C``), so a 100,000-node graph stays
well under a gigabyte. The rules that have an onnxruntime form find matches in every stage
(``conv_bn_relu``, ``depthwise_conv_bn``, ``silu``, ``layernorm_decomposed``, ``gelu_erf``,
``matmul_bias`` ...), the clustering finds the elementwise runs.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Graph, Model, Value
from graph_autofusion.ir.dtypes import DType

#: Nodes one stage adds (CNN block 17, bridges 4, transformer block 26).
NODES_PER_STAGE = 47


def hybrid_stack(num_nodes: int, channels: int = 16, side: int = 4, seed: int = 0) -> Model:
    """A valid, runnable, fully typed model of about ``num_nodes`` nodes (at least one
    stage)."""
    rng = np.random.default_rng(seed)
    c, s = channels, side
    g = Graph("hybrid_stack")
    x = g.add_input(Value("x", DType.FLOAT, (1, c, s, s)))
    mask = g.add_input(Value("mask", DType.FLOAT, (1, s * s, s * s)))

    def const(name: str, arr: np.ndarray) -> Value:
        return g.add_initializer(g.fresh_name(name), np.asarray(arr))

    def op(op_type: str, *ins: Value, **attrs) -> Value:
        return g.make_node(op_type, list(ins), attrs or None).outputs[0]

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def conv(h: Value, out_c: int, in_c: int, k: int, group: int = 1) -> Value:
        w = const("w", randn(out_c, in_c // group, k, k, scale=1.0 / (in_c * k)))
        b = const("b", randn(out_c, scale=0.1))
        return op("Conv", h, w, b, kernel_shape=[k, k], pads=[k // 2] * 4, group=group)

    def bn(h: Value) -> Value:
        gamma = const("bn_scale", 1.0 + randn(c, scale=0.1))
        beta = const("bn_bias", randn(c, scale=0.1))
        mean = const("bn_mean", randn(c, scale=0.1))
        var = const("bn_var", 1.0 + np.abs(randn(c, scale=0.1)))
        return op("BatchNormalization", h, gamma, beta, mean, var, epsilon=1e-5)

    axes = const("axes", np.array([-1], np.int64))
    two = const("two", np.array(2.0, np.float32))
    eps = const("eps", np.array(1e-5, np.float32))
    sqrt2 = const("sqrt2", np.array(np.sqrt(2.0), np.float32))
    one = const("one", np.array(1.0, np.float32))
    half = const("half", np.array(0.5, np.float32))
    scale = const("scale", np.array(np.sqrt(c), np.float32))
    to_tokens = const("to_tokens", np.array([1, c, s * s], np.int64))
    to_image = const("to_image", np.array([1, c, s, s], np.int64))
    h = x
    for _ in range(max(1, num_nodes // NODES_PER_STAGE)):
        # CNN block: 17 nodes
        y = op("Relu", bn(conv(h, c, c, 3)))
        y = bn(conv(y, c, c, 3, group=c))
        y = op("Mul", y, op("Sigmoid", y))
        gate = op("Sigmoid", conv(op("Relu", conv(op("GlobalAveragePool", y), c, c, 1)), c, c, 1))
        y = bn(conv(op("Mul", y, gate), c, c, 1))
        h = op("Relu", op("Add", y, h))
        # to tokens: 2 nodes
        t = op("Transpose", op("Reshape", h, to_tokens), perm=[0, 2, 1])
        # transformer block: 26 nodes (as synthetic.synthetic_transformer's)
        mean = op("ReduceMean", t, axes, keepdims=1)
        d = op("Sub", t, mean)
        var = op("ReduceMean", op("Pow", d, two), axes, keepdims=1)
        normed = op("Div", d, op("Sqrt", op("Add", var, eps)))
        ln = op("Add", op("Mul", normed, const("gamma", randn(c))), const("beta", randn(c)))
        q = op("MatMul", ln, const("wq", randn(c, c, scale=1.0 / c)))
        scores = op("MatMul", q, op("Transpose", ln, perm=[0, 2, 1]))
        probs = op("Softmax", op("Add", op("Div", scores, scale), mask), axis=-1)
        ctx = op("MatMul", probs, ln)
        a = op(
            "Add", op("MatMul", ctx, const("w1", randn(c, c, scale=1.0 / c))), const("b1", randn(c))
        )
        gelu = op("Mul", op("Mul", a, op("Add", op("Erf", op("Div", a, sqrt2)), one)), half)
        w2 = const("w2", randn(c, c, scale=1.0 / c))
        t = op("Add", op("Add", op("MatMul", gelu, w2), const("b2", randn(c))), t)
        # back to the image: 2 nodes
        h = op("Reshape", op("Transpose", t, perm=[0, 2, 1]), to_image)
    g.set_outputs([h])
    from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx

    return load_onnx(to_onnx(Model(g, {"": 18})))  # typed by onnx's shape inference


def hybrid_feeds(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for :func:`hybrid_stack`."""
    rng = np.random.default_rng(seed)
    x, mask = model.graph.inputs
    return {
        "x": rng.standard_normal(x.shape).astype(np.float32),
        "mask": np.zeros(mask.shape, np.float32),
    }
