"""load_model dispatches on the source kind and rejects what it cannot read."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from graph_autofusion.errors import ModelLoadError
from graph_autofusion.frontend.loader import load_model
from graph_autofusion.ir import Model


def _proto():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_sources(tmp_path):
    proto = _proto()
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    assert load_model(proto).graph.op_histogram() == {"Relu": 1}
    m = load_model(path)
    assert isinstance(m, Model) and load_model(m) is m
    assert load_model(str(path)).graph.op_histogram() == {"Relu": 1}
    t = load_model(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), torch.ones(1, 3))
    assert t.graph.op_histogram() == {"Add": 1, "MatMul": 1, "Relu": 1}


def test_rejections():
    with pytest.raises(ModelLoadError, match="needs example inputs"):
        load_model(torch.nn.ReLU())
    with pytest.raises(ModelLoadError, match="cannot load a model from int"):
        load_model(42)
