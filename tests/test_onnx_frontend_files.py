"""ONNX frontend, files: external data, atomic saving, and one clear error per bad input.

Every failing load or save must leave the folder exactly as it was (names, bytes, mtimes).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from test_onnx_frontend import X8, make, mlp, round_trip, run, snapshot, vi

from graph_autofusion.errors import CycleError, FrontendError, ModelLoadError, ModelWriteError
from graph_autofusion.frontend import load_onnx, save_onnx, to_onnx
from graph_autofusion.runtime.ort_session import ort_session


def test_external_data_load_and_save(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(mlp(), src / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    before = snapshot(src)
    model = load_onnx(src / "m.onnx")
    assert snapshot(src) == before  # input files untouched
    np.testing.assert_array_equal(
        model.graph.initializers["w"].const, numpy_helper.to_array(mlp().graph.initializer[0])
    )
    round_trip(to_onnx(model), X8)
    dst = tmp_path / "dst"
    dst.mkdir()
    save_onnx(model, dst / "out.onnx", external_data=True)
    assert sorted(os.listdir(dst)) == ["out.onnx", "out.onnx.data"]
    saved = onnx.load(dst / "out.onnx", load_external_data=False)
    location = {t.name: t.data_location for t in saved.graph.initializer}
    assert location == {"w": T.EXTERNAL, "b": T.DEFAULT}  # tensors under 1 KiB stay inline
    np.testing.assert_array_equal(run(onnx.load(dst / "out.onnx"), X8)[0], run(mlp(), X8)[0])
    save_onnx(model, dst / "inline.onnx")
    assert sorted(os.listdir(dst)) == ["inline.onnx", "out.onnx", "out.onnx.data"]
    assert load_onnx(dst / "inline.onnx").graph.initializers["b"].const.shape == (64,)


def test_missing_external_data_names_the_data_file(tmp_path):
    onnx.save(
        mlp(), tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    os.remove(tmp_path / "w.bin")
    before = snapshot(tmp_path)
    with pytest.raises(ModelLoadError, match=r"w\.bin.*missing"):
        load_onnx(tmp_path / "m.onnx")
    assert snapshot(tmp_path) == before


BAD_FILES = {
    "truncated": lambda: mlp().SerializeToString()[:-37],
    "garbage": lambda: np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
    "empty": lambda: b"",
    "text": lambda: b"this is not an onnx model\n" * 10,
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_unreadable_files_raise_model_load_error(tmp_path, kind):
    path = tmp_path / f"{kind}.onnx"
    path.write_bytes(BAD_FILES[kind]())
    before = snapshot(tmp_path)
    with pytest.raises(ModelLoadError, match=kind):
        load_onnx(path)
    assert snapshot(tmp_path) == before
    with pytest.raises(ModelLoadError, match="no such file"):
        load_onnx(tmp_path / "absent.onnx")


def test_cycle_raises_cycle_error_naming_the_cycle(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="entry"),
        helper.make_node("Add", ["a", "c"], ["b"], name="loop_add"),
        helper.make_node("Relu", ["b"], ["c"], name="loop_relu"),
        helper.make_node("Neg", ["b"], ["y"], name="after"),
    ]
    path = tmp_path / "cycle.onnx"
    onnx.save(make(nodes, [vi("x")], [vi("y")]), path)
    before = snapshot(tmp_path)
    with pytest.raises(CycleError, match="cycle.onnx") as info:
        load_onnx(path)
    msg = str(info.value)
    assert "loop_add" in msg and "loop_relu" in msg and "entry" not in msg and "after" not in msg
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "nodes, match",
    [
        ([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], "adder.*'ghost'"),
        (
            [
                helper.make_node("Relu", ["x"], ["y"], name="r1"),
                helper.make_node("Neg", ["x"], ["y"]),
            ],
            "%y defined|duplicate value name %y",
        ),
    ],
)
def test_undefined_or_duplicate_values_raise_frontend_error(tmp_path, nodes, match):
    path = tmp_path / "bad.onnx"
    onnx.save(make(nodes, [vi("x")], [vi("y")]), path)
    before = snapshot(tmp_path)
    with pytest.raises(FrontendError, match=match) as info:
        load_onnx(path)
    assert "bad.onnx" in str(info.value)
    assert snapshot(tmp_path) == before


def test_save_errors_leave_nothing_behind(tmp_path):
    model = load_onnx(mlp())
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ModelWriteError, match="missing_dir"):
        save_onnx(model, tmp_path / "missing_dir" / "m.onnx")
    with pytest.raises(ModelWriteError, match="a_file"):
        save_onnx(model, tmp_path / "a_file" / "m.onnx")
    save_onnx(model, tmp_path / "m.onnx")
    before = snapshot(tmp_path)
    with pytest.raises(ModelWriteError, match="exists"):
        save_onnx(mlp(), tmp_path / "m.onnx", overwrite=False)
    (tmp_path / "x.onnx.data").mkdir()  # external data cannot be moved into place
    with pytest.raises(ModelWriteError, match=r"x\.onnx"):
        save_onnx(model, tmp_path / "x.onnx", external_data=True)
    model.graph.nodes[0].attrs["bad"] = {1, 2}  # cannot be encoded
    with pytest.raises(ModelWriteError, match="m.onnx"):
        save_onnx(model, tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == ["a_file", "m.onnx", "x.onnx.data"]
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "x.onnx.data"} == before
    assert os.listdir(tmp_path / "x.onnx.data") == []


def test_large_models_get_external_data_automatically(tmp_path, monkeypatch):
    from graph_autofusion.frontend import onnx_frontend

    proto = mlp()
    before = proto.SerializeToString()
    model = load_onnx(proto)
    assert proto.SerializeToString() == before  # an in-memory source is never modified
    save_onnx(proto, tmp_path / "small.onnx")
    assert sorted(os.listdir(tmp_path)) == ["small.onnx"]
    monkeypatch.setattr(onnx_frontend, "EXTERNAL_DATA_THRESHOLD_BYTES", 1000)
    save_onnx(proto, tmp_path / "proto.onnx")
    save_onnx(model, tmp_path / "ir.onnx")
    assert proto.SerializeToString() == before  # saving a ModelProto never modifies it
    names = sorted(os.listdir(tmp_path))
    assert names == ["ir.onnx", "ir.onnx.data", "proto.onnx", "proto.onnx.data", "small.onnx"]
    for name in ("ir.onnx", "proto.onnx", "small.onnx"):
        np.testing.assert_array_equal(run(onnx.load(tmp_path / name), X8)[0], run(proto, X8)[0])


def test_torch_exported_model_round_trip(tmp_path):
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.norm = torch.nn.LayerNorm(8)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.norm(self.conv(x)))
            return self.fc(h).softmax(-1).flatten(1)

    torch.manual_seed(0)
    path = tmp_path / "net.onnx"
    x = torch.randn(2, 3, 8, 8)
    torch.onnx.export(
        Net().eval(),
        (x,),
        str(path),
        dynamo=False,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
        opset_version=17,
    )
    before = snapshot(tmp_path)
    model = load_onnx(path)
    assert snapshot(tmp_path) == before
    assert model.graph.inputs[0].shape == ("batch", 3, 8, 8)
    assert all(v.dtype is not None for n in model.graph.nodes for v in n.outputs)
    out = round_trip(onnx.load(path), {"x": x.numpy()})
    save_onnx(load_onnx(out), tmp_path / "again.onnx")
    np.testing.assert_array_equal(
        run(onnx.load(tmp_path / "again.onnx"), {"x": x.numpy()})[0],
        run(onnx.load(path), {"x": x.numpy()})[0],
    )


def test_overwriting_external_data_model_never_breaks_the_old_pair(tmp_path):
    """The old model keeps valid data until the new model file replaces it in one step."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from graph_autofusion.frontend.onnx_frontend import save_onnx

    def model_with(value: float):
        w = numpy_helper.from_array(np.full((64, 64), value, np.float32), "w")
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
        g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])

    path = tmp_path / "m.onnx"
    save_onnx(model_with(1.0), path, external_data=True)
    save_onnx(model_with(2.0), path, external_data=True)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[0] == "m.onnx" and files[1].endswith(".data")
    out = ort_session(path, "all").run(None, {"x": np.ones((1, 64), np.float32)})[0]
    assert float(out[0, 0]) == 128.0
