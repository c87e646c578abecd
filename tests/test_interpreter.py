"""Reference interpreter: multi-node graphs against onnxruntime, feeds, memory, control flow."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.ir.core import Graph, Model, RawAttribute, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.runtime.interpreter import (
    FeedError,
    InterpreterError,
    ReferenceInterpreter,
    run_model,
)
from graph_autofusion.runtime.ort_session import ort_session

rng = np.random.default_rng(1)


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort_session(model, "all").run(None, feeds)


def _block_weights() -> dict[str, np.ndarray]:
    return {
        "w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.2,
        "b1": rng.standard_normal(32).astype(np.float32),
        "gamma": rng.standard_normal(32).astype(np.float32),
        "beta": rng.standard_normal(32).astype(np.float32),
    }


def _block_ir(w: dict[str, np.ndarray], dtype: DType = DType.FLOAT) -> Model:
    """MatMul -> Add -> Gelu -> LayerNorm -> Softmax, built with the IR API."""
    g = Graph("block")
    x = g.add_input(Value("x", dtype, ("batch", 4, 16)))
    inits = {k: g.add_initializer(k, v.astype(dtype.to_numpy())) for k, v in w.items()}
    mm = g.make_node("MatMul", [x, inits["w1"]], output_names=["mm"])
    add = g.make_node("Add", [mm.outputs[0], inits["b1"]], output_names=["add"])
    ge = g.make_node("Gelu", [add.outputs[0]], output_names=["gelu"])
    ln = g.make_node(
        "LayerNormalization", [ge.outputs[0], inits["gamma"], inits["beta"]], {"epsilon": 1e-5}
    )
    sm = g.make_node("Softmax", [ln.outputs[0]], {"axis": -1}, output_names=["y"])
    g.set_outputs([sm.outputs[0]])
    return Model(g, {"": 20})


def _block_onnx(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["mm"]),
        oh.make_node("Add", ["mm", "b1"], ["add"]),
        oh.make_node("Gelu", ["add"], ["gelu"]),
        oh.make_node("LayerNormalization", ["gelu", "gamma", "beta"], ["ln"], epsilon=1e-5),
        oh.make_node("Softmax", ["ln"], ["y"], axis=-1),
    ]
    graph = oh.make_graph(
        nodes,
        "block",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 16])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)], ir_version=10)


def test_multi_node_graph_matches_onnxruntime() -> None:
    w = _block_weights()
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)
    got = run_model(_block_ir(w), {"x": x})["y"]
    (expected,) = _ort(_block_onnx(w), {"x": x})
    assert got.dtype == np.float32 and got.shape == (3, 4, 32)
    assert np.max(np.abs(got - expected)) <= 1e-5


def test_fp16_graph_keeps_fp16_and_stays_close() -> None:
    w = _block_weights()
    x = rng.standard_normal((2, 4, 16)).astype(np.float32)
    got = run_model(_block_ir(w, DType.FLOAT16), {"x": x.astype(np.float16)})["y"]
    ref = run_model(_block_ir(w), {"x": x})["y"]
    assert got.dtype == np.float16
    assert np.max(np.abs(got.astype(np.float32) - ref)) < 5e-3


def test_intermediate_outputs_and_keep_intermediates() -> None:
    model = _block_ir(_block_weights())
    x = rng.standard_normal((1, 4, 16)).astype(np.float32)
    res = run_model(model, {"x": x}, outputs=["add", "gelu"])
    assert set(res) == {"add", "gelu"}
    np.testing.assert_allclose(
        res["gelu"], 0.5 * res["add"] * (1 + _erf(res["add"] / np.sqrt(2))), atol=1e-6
    )
    every = run_model(model, {"x": x}, keep_intermediates=True)
    assert {"x", "mm", "add", "gelu", "y"} <= set(every)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


def test_intermediates_are_freed_after_last_use() -> None:
    g = Graph()
    v = g.add_input(Value("x", DType.FLOAT, (8,)))
    for _ in range(50):
        v = g.make_node("Relu", [v]).outputs[0]
    g.set_outputs([v])
    interp = ReferenceInterpreter(g)
    out = interp.run({"x": np.arange(-4, 4, dtype=np.float32)})
    np.testing.assert_array_equal(out[v.name], np.maximum(np.arange(-4, 4), 0))
    assert interp.last_run_stats == {"nodes_executed": 50, "peak_live_values": 2}
    interp.run({"x": np.ones(8, np.float32)}, keep_intermediates=True)
    assert interp.last_run_stats["peak_live_values"] == 51


def test_only_needed_nodes_run() -> None:
    model = _block_ir(_block_weights())
    interp = ReferenceInterpreter(model)
    interp.run({"x": np.ones((1, 4, 16), np.float32)}, outputs=["mm"])
    assert interp.last_run_stats["nodes_executed"] == 1


def test_feed_errors_are_clear() -> None:
    model = _block_ir(_block_weights())
    with pytest.raises(FeedError, match="missing feed for graph input 'x'"):
        run_model(model, {})
    with pytest.raises(FeedError, match=r"'x' has dtype float64.*FLOAT"):
        run_model(model, {"x": np.ones((1, 4, 16))})
    with pytest.raises(FeedError, match="dim 2 must be 16"):
        run_model(model, {"x": np.ones((1, 4, 15), np.float32)})
    with pytest.raises(FeedError, match="rank 3"):
        run_model(model, {"x": np.ones((4, 16), np.float32)})
    with pytest.raises(FeedError, match=r"\['z'\] are not inputs"):
        run_model(model, {"x": np.ones((1, 4, 16), np.float32), "z": np.ones(1)})


def test_reference_failure_names_the_node() -> None:
    g = Graph()
    a = g.add_input(Value("a", DType.FLOAT, None))
    b = g.add_input(Value("b", DType.FLOAT, None))
    n = g.make_node("MatMul", [a, b], name="bad_matmul")
    g.set_outputs([n.outputs[0]])
    with pytest.raises(InterpreterError, match="bad_matmul.*MatMul"):
        run_model(g, {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)})


def test_unsupported_attribute_value_raises_unsupported() -> None:
    g = Graph()
    x = g.add_input(Value("x", DType.FLOAT, (1, 1, 2, 2)))
    sc = g.add_initializer("sc", np.array([1, 1, 2, 2], np.float32))
    n = g.make_node("Resize", [x, None, sc], {"mode": "bogus"}, name="rs")
    g.set_outputs([n.outputs[0]])
    with pytest.raises(UnsupportedOperatorError, match="rs.*bogus"):
        run_model(g, {"x": np.ones((1, 1, 2, 2), np.float32)})


def test_local_function_is_expanded() -> None:
    # local.ScaledTanh(x; alpha) = alpha * tanh(x), with alpha referencing the caller's attribute.
    body = [
        oh.make_node("Tanh", ["x"], ["t"]),
        oh.make_node("Constant", [], ["a"], value_float=0.0),
        oh.make_node("Mul", ["t", "s"], ["y"]),
    ]
    body[1].attribute[0].ref_attr_name = "alpha"
    body[1].attribute[0].name = "value_float"
    body.insert(2, oh.make_node("Identity", ["a"], ["s"]))
    fn = oh.make_function(
        "local", "ScaledTanh", ["x"], ["y"], body, [oh.make_opsetid("", 20)], ["alpha"]
    )
    g = Graph()
    x = g.add_input(Value("x", DType.FLOAT, (5,)))
    n = g.make_node("ScaledTanh", [x], {"alpha": 3.0}, domain="local")
    g.set_outputs([n.outputs[0]])
    model = Model(g, {"": 20, "local": 1})
    model.functions = [fn]
    xv = np.linspace(-2, 2, 5).astype(np.float32)
    got = run_model(model, {"x": xv})[n.outputs[0].name]
    np.testing.assert_allclose(got, 3.0 * np.tanh(xv), rtol=1e-6)
    # The same model in onnxruntime agrees.
    proto = oh.make_model(
        oh.make_graph(
            [oh.make_node("ScaledTanh", ["x"], ["y"], domain="local", alpha=3.0)],
            "g",
            [oh.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
            [oh.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        ),
        opset_imports=[oh.make_opsetid("", 20), oh.make_opsetid("local", 1)],
        functions=[fn],
        ir_version=10,
    )
    np.testing.assert_allclose(got, _ort(proto, {"x": xv})[0], atol=1e-6)


def _branch(name: str, op_type: str) -> onnx.GraphProto:
    """Subgraph computing op_type(outer_x, outer_y) from outer-scope values."""
    return oh.make_graph(
        [oh.make_node(op_type, ["x", "y"], [f"{name}_out"])],
        name,
        [],
        [oh.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [3])],
    )


@pytest.mark.parametrize("as_attribute_proto", [False, True])
@pytest.mark.parametrize("cond", [True, False])
def test_if_runs_the_chosen_branch(cond: bool, as_attribute_proto: bool) -> None:
    g = Graph()
    c = g.add_input(Value("c", DType.BOOL, ()))
    x = g.add_input(Value("x", DType.FLOAT, (3,)))
    y = g.add_input(Value("y", DType.FLOAT, (3,)))
    # The ONNX frontend keeps the whole AttributeProto; hand-built IR may hold the GraphProto.
    then_b, else_b = _branch("then", "Add"), _branch("else", "Sub")
    if as_attribute_proto:
        then_b = oh.make_attribute("then_branch", then_b)
        else_b = oh.make_attribute("else_branch", else_b)
    attrs = {
        "then_branch": RawAttribute(then_b, ["x", "y"]),
        "else_branch": RawAttribute(else_b, ["x", "y"]),
    }
    n = g.make_node("If", [c], attrs, output_names=["out"])
    n.set_captures([x, y])
    z = g.make_node("Neg", [n.outputs[0]], output_names=["z"])
    g.set_outputs([z.outputs[0]])
    xv, yv = np.array([1, 2, 3], np.float32), np.array([4, 5, 7], np.float32)
    got = run_model(g, {"c": np.array(cond), "x": xv, "y": yv})["z"]
    np.testing.assert_array_equal(got, -(xv + yv) if cond else -(xv - yv))


def test_loop_carries_state_and_stacks_scan_outputs() -> None:
    # for i in range(4): acc = acc + i (as float); scan output: acc after each step.
    body = oh.make_graph(
        [
            oh.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
            oh.make_node("Add", ["acc_in", "fi"], ["acc_out"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
            oh.make_node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", TensorProto.INT64, []),
            oh.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            oh.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            oh.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            oh.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
            oh.make_tensor_value_info("scan", TensorProto.FLOAT, [1]),
        ],
    )
    g = Graph()
    m = g.add_initializer("m", np.array(4, np.int64))
    a0 = g.add_input(Value("a0", DType.FLOAT, (1,)))
    n = g.make_node("Loop", [m, None, a0], {"body": RawAttribute(body)}, num_outputs=2)
    g.set_outputs(list(n.outputs))
    res = run_model(g, {"a0": np.array([10.0], np.float32)})
    final, scans = (res[v.name] for v in n.outputs)
    np.testing.assert_array_equal(final, [16.0])
    np.testing.assert_array_equal(scans.reshape(-1), [10.0, 11.0, 13.0, 16.0])


def test_resnet_bottleneck_matches_onnxruntime() -> None:
    """Conv/BN/Relu/MaxPool/Add/GlobalAveragePool/Gemm at ResNet-50 stem-like sizes."""
    w = {
        "c1": rng.standard_normal((16, 3, 7, 7)).astype(np.float32) * 0.1,
        "c2": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1,
        "s": rng.random(16).astype(np.float32) + 0.5,
        "b": rng.standard_normal(16).astype(np.float32),
        "mu": rng.standard_normal(16).astype(np.float32),
        "var": rng.random(16).astype(np.float32) + 0.5,
        "fc": rng.standard_normal((10, 16)).astype(np.float32),
    }
    spec = [
        ("Conv", ["x", "c1"], ["a"], {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
        ("BatchNormalization", ["a", "s", "b", "mu", "var"], ["bn"], {}),
        ("Relu", ["bn"], ["r"], {}),
        ("MaxPool", ["r"], ["p"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),
        ("Conv", ["p", "c2"], ["c"], {"pads": [1, 1, 1, 1]}),
        ("Add", ["c", "p"], ["res"], {}),
        ("GlobalAveragePool", ["res"], ["gap"], {}),
        ("Flatten", ["gap"], ["f"], {}),
        ("Gemm", ["f", "fc"], ["y"], {"transB": 1}),
    ]
    proto = oh.make_model(
        oh.make_graph(
            [oh.make_node(o, i, out, **a) for o, i, out, a in spec],
            "rn",
            [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
            [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, k) for k, v in w.items()],
        ),
        opset_imports=[oh.make_opsetid("", 17)],
        ir_version=10,
    )
    g = Graph("rn")
    vals = {"x": g.add_input(Value("x", DType.FLOAT, (1, 3, 64, 64)))}
    vals.update({k: g.add_initializer(k, v) for k, v in w.items()})
    for o, i, out, a in spec:
        vals[out[0]] = g.make_node(o, [vals[k] for k in i], a, output_names=out).outputs[0]
    g.set_outputs([vals["y"]])
    x = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    got = run_model(Model(g, {"": 17}), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(proto, {"x": x})[0], atol=1e-4, rtol=1e-5)
