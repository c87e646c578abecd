"""Fusions onnxruntime makes itself: a CNN whose whole fused model onnxruntime's ALL level
optimizes into the very graph it makes of the original is not timed fusion by fusion (the
times differ only by noise). Real onnxruntime sessions; the timer is pinned so that a timed
fusion would be rolled back as slower."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from graph_autofusion import GraphAutoFusion
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import use_timer
from graph_autofusion.verify.optimized_graph import (
    same_model_after_optimization,
    same_optimized_graph,
)

pytestmark = pytest.mark.xdist_group("same_optimized_graph")

C = 16


def _conv_net(act: str = "Relu", seed: int = 0, residual: bool = True) -> onnx.ModelProto:
    """x -> Conv -> act -> Conv -> (+ the first activation) -> Relu: a ResNet block's two
    FusedConv sites, which onnxruntime's ALL level fuses itself (NCHWc Conv, Sum input)."""
    rng = np.random.default_rng(seed)
    inits = [
        nh.from_array((rng.standard_normal((C, C, 3, 3)) * 0.1).astype("f4"), "w1"),
        nh.from_array((rng.standard_normal(C) * 0.1).astype("f4"), "b1"),
        nh.from_array((rng.standard_normal((C, C, 3, 3)) * 0.1).astype("f4"), "w2"),
        nh.from_array((rng.standard_normal(C) * 0.1).astype("f4"), "b2"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        h.make_node(act, ["c1"], ["a1"], name="act1"),
        h.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
    ]
    if residual:
        nodes.append(h.make_node("Add", ["c2", "a1"], ["s"], name="add"))
    nodes.append(h.make_node("Relu", ["s" if residual else "c2"], ["y"], name="relu"))
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 28, 28])
    y = h.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 28, 28])
    model = h.make_model(
        h.make_graph(nodes, "cnn", [x], [y], inits), opset_imports=[h.make_opsetid("", 17)]
    )
    onnx.checker.check_model(model)
    return model


def _optimized(tmp_path, name, model):
    path = str(tmp_path / f"{name}.onnx")
    ort_session(model, "all", 2, optimized_model_path=path)
    return path


def _fused_by_hand(model: onnx.ModelProto) -> onnx.ModelProto:
    """``conv1 + act1`` as the FusedConv onnxruntime itself makes of them."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = list(m.graph.node)
    fused = h.make_node(
        "FusedConv",
        ["x", "w1", "b1"],
        ["a1"],
        domain="com.microsoft",
        activation="Relu",
        pads=[1, 1, 1, 1],
        name="fused1",
    )
    del m.graph.node[:]
    m.graph.node.extend([fused, *nodes[2:]])
    m.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return m


def test_the_same_optimized_graph_is_recognised_whatever_the_names(tmp_path):
    base = _conv_net()
    a = _optimized(tmp_path, "a", base)
    assert same_optimized_graph(a, _optimized(tmp_path, "fused", _fused_by_hand(base)))
    renamed = onnx.ModelProto()
    renamed.CopyFrom(base)
    for init in renamed.graph.initializer:  # other constant names, same values
        old = init.name
        init.name = f"renamed_{old}"
        for n in renamed.graph.node:
            n.input[:] = [f"renamed_{old}" if i == old else i for i in n.input]
    assert same_optimized_graph(a, _optimized(tmp_path, "renamed", renamed))
    # another activation, other weights: not the same graph
    assert not same_optimized_graph(a, _optimized(tmp_path, "sigmoid", _conv_net("Sigmoid")))
    assert not same_optimized_graph(a, _optimized(tmp_path, "seed1", _conv_net(seed=1)))
    assert not same_optimized_graph(a, str(tmp_path / "missing.onnx"))
    assert same_model_after_optimization(base, _fused_by_hand(base))
    assert not same_model_after_optimization(base, _conv_net(seed=1))


def _slower_timer(seen):
    def timer(key, side, fn):  # real runs; a timed fusion is "slower"
        fn()
        seen.append(key)
        return 5e-5 if side == "fused" else 1e-5

    return timer


def test_a_cnn_that_onnxruntime_optimizes_into_the_same_graph_is_not_timed(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(_conv_net(), path)
    feeds = {"x": np.random.default_rng(2).standard_normal((1, C, 28, 28)).astype("f4")}
    seen: list[str] = []
    gaf = GraphAutoFusion(path, preset="cnn", sample_inputs=feeds)
    with use_timer(_slower_timer(seen)):
        gaf.fuse()
    r = gaf.result
    assert r.lowered and not r.rolled_back, r.rolled_back
    assert {low.rule for low in r.lowered} == {"conv_activation", "conv_add_relu"}
    assert seen == []  # nothing timed, nothing rolled back as "slower"
    assert any("same graph" in n for n in r.notes), r.notes
    for low in r.lowered:  # numerics still checked
        res = r.safety[low.key]
        assert res.passed and res.cosine > 0.9999 and res.details["same_optimized_graph"]
    got = gaf.run(feeds)["y"]
    want = ort_session(path, "disable").run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
