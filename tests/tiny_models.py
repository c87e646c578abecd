"""Tiny ONNX models for the error, hostile-input and path tests (built in milliseconds)."""

from __future__ import annotations

import os

import numpy as np
import onnx

from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.ort_session import ort_session

#: shipped profile: no host calibration in these tests
PROFILE = "x86_avx2"
#: fuse options that keep a tiny model's fuse well under a second
FAST = ("--hardware", PROFILE, "--no-speed-check")

# MatMul + bias + erf-GELU: one bias_gelu fusion (BiasGelu) on the onnxruntime target.
BIAS_GELU = """
model opset {"": 18}
graph g(%x: f32[2,8]) -> (%y) {
  init %w: f32[8,8] = randn(0)
  init %b: f32[8] = randn(1)
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %h = MatMul(%x, %w)
  %hb = Add(%h, %b)
  %d = Div(%hb, %c)
  %e = Erf(%d)
  %e1 = Add(%e, %one)
  %m = Mul(%hb, %e1)
  %y = Mul(%m, %half)
}
"""


def write_model(path: str | os.PathLike[str]) -> str:
    """Write the tiny model to ``path``; returns the path as a string."""
    onnx.save(to_onnx(parse_model(BIAS_GELU)), os.fspath(path))
    return os.fspath(path)


def run(path: str | os.PathLike[str], x: np.ndarray | None = None) -> np.ndarray:
    """The model's output in onnxruntime on ``x`` (default: a fixed [2, 8] input)."""
    if x is None:
        x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    sess = ort_session(path, "all")
    return sess.run(None, {"x": x})[0]


def matmul_chain(
    weights: list[np.ndarray],
    *,
    bias: np.ndarray | None = None,
    x_shape: list | None = None,
    first: int = 1,
) -> onnx.ModelProto:
    """``x -> MatMul(w<i>) -> Relu -> ... -> MatMul(w<n>)``, then ``Add`` of ``bias`` (named
    ``b<n>``) where given, the result ``y``: nodes ``fc<i>``, products ``h<i>``, activations
    ``r<i>``, ``i`` counted from ``first``. ``x_shape``: ``x``'s (default ``[batch, seq, K]``)."""
    from onnx import TensorProto, helper, numpy_helper

    last = first + len(weights) - 1
    nodes, inits, x = [], [], "x"
    for i, w in enumerate(weights, start=first):
        out = "y" if i == last and bias is None else f"h{i}"
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [out], name=f"fc{i}"))
        if i < last:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            x = f"r{i}"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, f"b{last}"))
        nodes.append(helper.make_node("Add", [f"h{last}", f"b{last}"], ["y"]))
    x_shape = list(x_shape or ["batch", "seq", weights[0].shape[0]])
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [*x_shape[:-1], weights[-1].shape[1]]
            )
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
