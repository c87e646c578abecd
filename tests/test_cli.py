"""Command line: inspect (text and JSON), errors, version, python -m."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

from graph_autofusion.cli import main


@pytest.fixture()
def small_model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.5] * 16)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Frobnicate", ["r"], ["y"], domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [w])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


def test_inspect_text(small_model, capsys):
    assert main(["inspect", str(small_model)]) == 0
    out = capsys.readouterr().out
    assert "nodes        3" in out
    assert "parameters   16" in out
    assert "contraction" in out and "elementwise" in out and "opaque" in out
    assert "unknown operators (kept opaque): com.example::Frobnicate" in out
    assert "x" in out and "f32['B', 4]" in out


def test_inspect_json(small_model, capsys):
    assert main(["inspect", str(small_model), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nodes"] == 3 and data["parameters"] == 16
    assert data["op_histogram"] == {"MatMul": 1, "Relu": 1, "com.example::Frobnicate": 1}
    assert data["kind_histogram"] == {"contraction": 1, "elementwise": 1, "opaque": 1}
    assert data["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["B", 4]}]


def test_inspect_bad_file_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf at all \x00\x01\x02")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graph-autofusion: error:") and "bad.onnx" in err
    assert "Traceback" not in err
    assert main(["inspect", str(tmp_path / "missing.onnx")]) == 2
    assert "missing.onnx" in capsys.readouterr().err


def test_python_dash_m_and_version():
    out = subprocess.run(
        [sys.executable, "-m", "graph_autofusion", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("graph-autofusion ")
