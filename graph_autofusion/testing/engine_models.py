"""Small ONNX models the torch runner cannot run (GRU, If, Loop) or can (LSTM), each with an
elementwise chain onnxruntime has no fused operator for: what the cpu target's onnxruntime
engine runs with a generated kernel as a custom operator (``tests/test_cpu_engines.py``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

SEQ, BATCH, IN, HIDDEN = 6, 2, 16, 32


def _chain(x: str, out: str, tag: str) -> list[onnx.NodeProto]:
    """``tanh(x * 0.5 + 0.1) * x - x``: no onnxruntime fused operator covers it."""
    return [
        h.make_node("Mul", [x, "scale"], [f"{tag}_m"], name=f"{tag}_mul"),
        h.make_node("Add", [f"{tag}_m", "bias"], [f"{tag}_a"], name=f"{tag}_add"),
        h.make_node("Tanh", [f"{tag}_a"], [f"{tag}_t"], name=f"{tag}_tanh"),
        h.make_node("Mul", [f"{tag}_t", x], [f"{tag}_p"], name=f"{tag}_mul2"),
        h.make_node("Sub", [f"{tag}_p", x], [out], name=f"{tag}_sub"),
    ]


def _consts(rng: np.random.Generator, gates: int) -> list[onnx.TensorProto]:
    return [
        nh.from_array((rng.standard_normal((1, gates * HIDDEN, IN)) * 0.2).astype("f4"), "W"),
        nh.from_array((rng.standard_normal((1, gates * HIDDEN, HIDDEN)) * 0.2).astype("f4"), "R"),
        nh.from_array((rng.standard_normal((1, 2 * gates * HIDDEN)) * 0.1).astype("f4"), "B"),
        nh.from_array(np.full((HIDDEN,), 0.5, np.float32), "scale"),
        nh.from_array(np.full((HIDDEN,), 0.1, np.float32), "bias"),
        nh.from_array(np.array([1], np.int64), "axis1"),
    ]


def _checked_model(
    nodes: list, name: str, x_shape: list, out_shape: list, consts: list
) -> onnx.ModelProto:
    """An opset-17 model of ``nodes`` from float input ``x`` to float output ``out``, checked."""
    graph = h.make_graph(
        nodes,
        name,
        [h.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [h.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
        consts,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def recurrent_model(op: str) -> onnx.ModelProto:
    """``x [SEQ, BATCH, IN]`` -> ``op`` (GRU or LSTM, one direction) -> the chain."""
    gates = {"GRU": 3, "LSTM": 4}[op]
    outs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    nodes = [
        h.make_node(op, ["x", "W", "R", "B"], outs, hidden_size=HIDDEN, name="rnn"),
        h.make_node("Squeeze", ["y", "axis1"], ["ys"], name="squeeze"),
        *_chain("ys", "out", "c"),
    ]
    return _checked_model(
        nodes,
        op.lower(),
        [SEQ, BATCH, IN],
        [SEQ, BATCH, HIDDEN],
        _consts(np.random.default_rng(0), gates),
    )


def if_model() -> onnx.ModelProto:
    """``x [BATCH, HIDDEN]`` -> the chain -> ``If(sum > 0)``: Relu or Neg -> the chain."""
    then_g = h.make_graph(
        [h.make_node("Relu", ["h"], ["r"], name="then_relu")],
        "then",
        [],
        [h.make_tensor_value_info("r", TensorProto.FLOAT, [BATCH, HIDDEN])],
    )
    else_g = h.make_graph(
        [h.make_node("Neg", ["h"], ["n"], name="else_neg")],
        "else",
        [],
        [h.make_tensor_value_info("n", TensorProto.FLOAT, [BATCH, HIDDEN])],
    )
    nodes = [
        *_chain("x", "h", "pre"),
        h.make_node("ReduceSum", ["h"], ["s"], keepdims=0, name="sum"),
        h.make_node("Greater", ["s", "zero"], ["cond"], name="greater"),
        h.make_node("If", ["cond"], ["branch"], then_branch=then_g, else_branch=else_g, name="if"),
        *_chain("branch", "out", "post"),
    ]
    consts = _consts(np.random.default_rng(0), 3)[3:5]
    consts.append(nh.from_array(np.array(0.0, np.float32), "zero"))
    return _checked_model(nodes, "if_model", [BATCH, HIDDEN], [BATCH, HIDDEN], consts)


def loop_model(trips: int = 3) -> onnx.ModelProto:
    """``x [BATCH, HIDDEN]`` -> the chain -> ``Loop`` (``trips`` times ``h = tanh(h) * 0.5``)
    -> the chain."""
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            h.make_node("Tanh", ["h_in"], ["t"], name="body_tanh"),
            h.make_node("Mul", ["t", "half"], ["h_out"], name="body_mul"),
        ],
        "body",
        [
            h.make_tensor_value_info("i", TensorProto.INT64, []),
            h.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            h.make_tensor_value_info("h_in", TensorProto.FLOAT, [BATCH, HIDDEN]),
        ],
        [
            h.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            h.make_tensor_value_info("h_out", TensorProto.FLOAT, [BATCH, HIDDEN]),
        ],
    )
    nodes = [
        *_chain("x", "h0", "pre"),
        h.make_node("Loop", ["trips", "true", "h0"], ["looped"], body=body, name="loop"),
        *_chain("looped", "out", "post"),
    ]
    consts = _consts(np.random.default_rng(0), 3)[3:5]
    consts += [
        nh.from_array(np.array(trips, np.int64), "trips"),
        nh.from_array(np.array(True), "true"),
        nh.from_array(np.array(0.5, np.float32), "half"),
    ]
    return _checked_model(nodes, "loop_model", [BATCH, HIDDEN], [BATCH, HIDDEN], consts)
