"""ONNX frontend: import to IR, export back, atomic saving, and the errors for bad inputs.

Every round trip is checked with ``onnx.checker`` (full check) and with onnxruntime: outputs of
the exported model must equal the original's bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graph_autofusion.errors import (
    IRError,
)
from graph_autofusion.frontend import load_onnx, to_onnx
from graph_autofusion.frontend.onnx_frontend import check_model
from graph_autofusion.ir import DType, Graph, Model, Value
from graph_autofusion.ir.verify import verify
from graph_autofusion.runtime.ort_session import ort_session

RNG = np.random.default_rng(0)


def run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort_session(proto, "all", 1)
    return sess.run(None, feeds)


def round_trip(
    proto: onnx.ModelProto, feeds: dict[str, np.ndarray], *, check: bool = True, same: bool = True
) -> onnx.ModelProto:
    """load -> to_onnx; asserts checker (full) passes and ORT outputs are bit-identical.

    With ``same``, the exported proto must also equal the source proto field for field.
    """
    model = load_onnx(proto)
    verify(model)
    out = to_onnx(model)
    if same:
        assert out == proto
    if check:
        onnx.checker.check_model(out, full_check=True)
    for a, b in zip(run(proto, feeds), run(out, feeds), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    return out


def make(nodes, inputs, outputs, inits=(), opset=17, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), **kw)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, elem=T.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 64)).astype(np.float32), "w")  # 2 KiB
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm", doc_string="projection"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1),
    ]
    return make(nodes, [vi("x", shape=["batch", 8])], [vi("y", shape=["batch", 64])], [w, b])


def snapshot(folder) -> dict[str, tuple[int, bytes]]:
    return {
        p.name: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
        for p in folder.iterdir()
    }


X8 = {"x": RNG.standard_normal((3, 8)).astype(np.float32)}


def test_mlp_round_trip_keeps_nodes_types_and_numbers():
    proto = mlp()
    model = load_onnx(proto)
    g = model.graph
    assert [(n.name, n.op_type) for n in g.nodes] == [
        ("mm", "MatMul"),
        ("bias", "Add"),
        ("relu", "Relu"),
        ("sm", "Softmax"),
    ]
    assert g.inputs[0].shape == ("batch", 8) and g.inputs[0].dtype == DType.FLOAT
    assert g.initializers["w"].const.shape == (8, 64)
    assert g.nodes[3].attrs == {"axis": -1} and g.nodes[0].doc == "projection"
    h = g.nodes[0].outputs[0]
    assert h.shape == ("batch", 64) and [n.name for n in h.user_nodes] == ["bias"]
    out = round_trip(proto, X8)
    assert [n.name for n in out.graph.node] == ["mm", "bias", "relu", "sm"]
    assert out.graph.node[0].doc_string == "projection"
    assert not out.graph.value_info  # inferred-only types are left out by default ...
    assert {v.name for v in to_onnx(model, all_value_info=True).graph.value_info} == {
        "h",
        "hb",
        "r",
    }
    assert out.graph.output[0] == proto.graph.output[0]
    assert list(out.graph.initializer) == list(proto.graph.initializer)


def test_attributes_of_every_type_keep_their_proto_types():
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [vi("o")])
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32)),
        numpy_helper.from_array(np.array([2], np.int64)),
        [4],
    )
    odd = helper.make_node(
        "Custom",
        ["x"],
        ["c"],
        domain="com.example",
        name="odd",
        i=3,
        f=0.1,
        s="text",
        ints=[1, 2],
        floats=[0.5, 1.5],
        strings=["a", "b"],
        t=numpy_helper.from_array(np.arange(4, dtype=np.int32), "tname"),
        g=body,
        tensors=[numpy_helper.from_array(np.ones(2, np.float16))],
        graphs=[body, body],
        sp=sparse,
        tp=helper.make_tensor_type_proto(T.FLOAT, [2]),
        whole_float=2.0,
    )
    odd.attribute.append(helper.make_attribute("empty", [], attr_type=onnx.AttributeProto.INTS))
    proto = make([odd], [vi("x", shape=[2])], [vi("c")])
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    model = load_onnx(proto)
    node = model.graph.nodes[0]
    assert node.attrs["i"] == 3 and node.attrs["s"] == "text" and node.attrs["ints"] == [1, 2]
    assert node.attrs["whole_float"] == 2.0 and node.attr_types["whole_float"] == 1  # FLOAT
    np.testing.assert_array_equal(node.attrs["t"], np.arange(4))
    assert node.attrs["g"].captures == ("x",) and [v.name for v in node.captures] == ["x"]
    out = to_onnx(model).graph.node[0]
    assert list(out.attribute) == list(odd.attribute)
    # a new attribute without a recorded type gets an inferred one
    node.attrs["new_floats"] = [1.0, 2.0]
    node.attrs["new_f"] = np.float32(0.25)
    out = {a.name: a for a in to_onnx(model).graph.node[0].attribute}
    assert out["new_floats"].type == onnx.AttributeProto.FLOATS
    assert out["new_f"].type == onnx.AttributeProto.FLOAT and out["new_f"].f == 0.25


def test_runnable_attributes_constants_and_omitted_inputs_round_trip():
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(1.5))),
        helper.make_node("Constant", [], ["cf"], value_floats=[0.5, -1.0, 2.0, 3.0]),
        helper.make_node("Gemm", ["x", "w", "cf"], ["g"], alpha=0.5, beta=2.0, transB=1),
        helper.make_node("LeakyRelu", ["g"], ["l"], alpha=0.2),
        helper.make_node("Clip", ["l", "", "c"], ["cl"]),  # omitted optional min
        helper.make_node("Transpose", ["cl"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["ci"], to=T.INT32),
        helper.make_node("Cast", ["ci"], ["y"], to=T.DOUBLE),
        helper.make_node("Dropout", ["cl"], ["d", ""]),  # omitted optional output
        helper.make_node("Concat", ["d", "cl"], ["z"], axis=0),
    ]
    w = numpy_helper.from_array(RNG.standard_normal((4, 8)).astype(np.float32), "w")
    proto = make(
        nodes, [vi("x", shape=[3, 8])], [vi("y", T.DOUBLE, [4, 3]), vi("z", shape=[6, 4])], [w]
    )
    model = load_onnx(proto)
    clip = model.graph.nodes[4]
    assert clip.inputs[1] is None and model.graph.nodes[8].outputs[1].meta["onnx_omitted"]
    out = round_trip(proto, X8)
    assert list(out.graph.node[4].input) == ["l", "", "c"]
    assert list(out.graph.node[8].output) == ["d", ""]
    assert [n.name for n in out.graph.node] == [""] * len(nodes)  # unnamed stays unnamed
    assert len({n.name for n in model.graph.nodes}) == len(nodes)  # but unique in the IR


def test_model_level_fields_metadata_and_doc_strings():
    proto = mlp()
    proto.ir_version = 8
    proto.producer_name, proto.producer_version = "unit", "1.2"
    proto.domain, proto.model_version, proto.doc_string = "org.test", 7, "model doc"
    proto.graph.doc_string = "graph doc"
    helper.set_model_props(proto, {"author": "me", "license": "MIT"})
    proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model = load_onnx(proto)
    assert model.opset_imports == {"": 17, "com.microsoft": 1}
    assert model.metadata_props == {"author": "me", "license": "MIT"}
    out = round_trip(proto, X8)
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        assert getattr(out, field) == getattr(proto, field)
    assert out.doc_string == "model doc" and out.graph.doc_string == "graph doc"
    assert list(out.metadata_props) == list(proto.metadata_props)
    assert list(out.opset_import) == list(proto.opset_import)


def test_local_function_runs_after_round_trip():
    fn = helper.make_function(
        "local",
        "Swish",
        ["a"],
        ["o"],
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["o"])],
        [helper.make_opsetid("", 17)],
    )
    nodes = [helper.make_node("Swish", ["x"], ["y"], domain="local", name="sw")]
    proto = make(nodes, [vi("x", shape=[3, 8])], [vi("y", shape=[3, 8])])
    proto.opset_import.append(helper.make_opsetid("local", 1))
    proto.functions.append(fn)
    model = load_onnx(proto)
    assert model.functions[0] == fn
    assert model.graph.nodes[0].outputs[0].shape == (3, 8)  # inferred through the function
    out = round_trip(proto, X8)
    assert list(out.functions) == [fn]
    x = X8["x"].astype(np.float64)
    np.testing.assert_allclose(run(out, X8)[0], x / (1 + np.exp(-x)), rtol=1e-5)


def test_value_info_symbolic_dims_and_shape_inference():
    shape = numpy_helper.from_array(np.array([0, 2, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Reshape", ["x", "s"], ["r2"]),  # target shape known by data_prop only
        helper.make_node("Relu", ["r2"], ["y"]),
    ]
    proto = make(
        nodes,
        [vi("x", shape=["batch", 8])],
        [vi("y", shape=None)],
        [shape],
        value_info=[vi("r", shape=["batch", 2, 4])],
    )
    proto.graph.output[0].type.tensor_type.ClearField("shape")
    model = load_onnx(proto)
    vals = model.graph.value_map()
    assert vals["x"].shape == ("batch", 8)
    assert vals["r"].shape == ("batch", 2, 4) and vals["s"].shape == (3,)
    assert vals["s"].dtype == DType.INT64
    assert vals["y"].shape is not None and vals["y"].shape[1:] == (2, 4)
    assert model.meta["onnx_shape_inference"] == "data_prop"
    bare = load_onnx(proto, infer_shapes=False).graph.value_map()
    assert (
        bare["r"].shape == ("batch", 2, 4) and bare["s"].shape is None and bare["y"].shape is None
    )
    unknown = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", shape=[None, 3])], [vi("y")])
    assert load_onnx(unknown).graph.inputs[0].shape == (None, 3)
    out = round_trip(proto, X8, same=False)  # the output gained its inferred shape
    assert out.graph.output[0].type.tensor_type.shape.dim[2].dim_value == 4
    r = next(v for v in out.graph.value_info if v.name == "r").type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in r] == ["batch", 2, 4]


def if_model(nested: bool) -> onnx.ModelProto:
    then_nodes = [helper.make_node("Add", ["x", "w"], ["t"])]
    if nested:
        inner = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["u"])], "in", [], [vi("u")])
        then_nodes = [helper.make_node("If", ["c"], ["t"], then_branch=inner, else_branch=inner)]
    then_b = helper.make_graph(then_nodes, "then", [], [vi("t")])
    else_b = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
    w = numpy_helper.from_array(np.full((3, 8), 2.0, np.float32), "w")
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
        helper.make_node("Greater", ["sum", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_b, else_branch=else_b),
    ]
    zero = numpy_helper.from_array(np.float32(0.0), "zero")
    # value_info may describe values inside a body ("t"): kept as an entry of graph.value_info
    info = [vi("t", shape=[3, 8])]
    return make(nodes, [vi("x", shape=[3, 8])], [vi("y", shape=[3, 8])], [w, zero], value_info=info)


@pytest.mark.parametrize("nested", [False, True])
def test_if_subgraph_captures_outer_values(nested):
    proto = if_model(nested)
    model = load_onnx(proto)
    node = next(n for n in model.graph.nodes if n.op_type == "If")
    # union over both bodies (else_branch is stored first), in first-use order
    assert [v.name for v in node.captures] == (["x", "c", "w"] if nested else ["x", "w"])
    assert node.attrs["then_branch"].captures == (("c", "x", "w") if nested else ("x", "w"))
    assert node.attrs["else_branch"].captures == ("x",)
    assert node in model.graph.initializers["w"].user_nodes  # use-def sees the capture
    assert model.graph.value_info["t"].shape == (3, 8)
    for x in (X8["x"], -np.abs(X8["x"])):
        round_trip(proto, {"x": x})


def test_replacing_a_captured_value_renames_it_inside_the_body():
    model = load_onnx(if_model(nested=True))
    g = model.graph
    w2 = g.add_initializer("w2", np.full((3, 8), 5.0, np.float32))
    g.replace_all_uses_with(g.initializers["w"], w2)
    g.remove_initializer("w")
    out = to_onnx(model)
    onnx.checker.check_model(out, full_check=True)
    x = np.abs(X8["x"]) + 0.1
    np.testing.assert_array_equal(run(out, {"x": x})[0], x * 5.0)


def test_unknown_domain_imports_and_checker_wrapper_reports():
    nodes = [helper.make_node("Mystery", ["x"], ["y"], domain="vendor.secret", mode="fast")]
    proto = make(nodes, [vi("x", shape=[2])], [vi("y", shape=[2])])
    model = load_onnx(proto)
    node = model.graph.nodes[0]
    assert model.meta["onnx_shape_inference"] == "data_prop"  # unknown op skipped, not fatal
    assert (node.domain, node.op_type, node.attrs) == ("vendor.secret", "Mystery", {"mode": "fast"})
    assert to_onnx(model).graph.node[0] == proto.graph.node[0]
    check_model(mlp())
    with pytest.raises(IRError, match="vendor.secret"):
        check_model(model)


def test_unsorted_acyclic_graph_is_sorted():
    proto = mlp()
    nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(reversed(nodes))
    model = load_onnx(proto)
    assert [n.name for n in model.graph.nodes] == ["mm", "bias", "relu", "sm"]
    out = to_onnx(model)
    np.testing.assert_array_equal(run(out, X8)[0], run(mlp(), X8)[0])


def test_loop_body_captures_outer_values():
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc", "w"], ["acc_out"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [vi("i", T.INT64, []), vi("cond", T.BOOL, []), vi("acc", shape=[3, 8])],
        [vi("cond_out", T.BOOL, []), vi("acc_out", shape=[3, 8])],
    )
    trips = numpy_helper.from_array(np.array(4, np.int64), "trips")
    w = numpy_helper.from_array(np.full((3, 8), 0.5, np.float32), "w")
    nodes = [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)]
    proto = make(nodes, [vi("x", shape=[3, 8])], [vi("y", shape=[3, 8])], [trips, w])
    model = load_onnx(proto)
    loop = model.graph.nodes[0]
    assert [v.name for v in loop.captures] == ["w"] and loop.inputs[1] is None
    out = round_trip(proto, X8)
    np.testing.assert_array_equal(run(out, X8)[0], X8["x"] + 0.5 + 0.5 + 0.5 + 0.5)


def test_initializers_listed_as_inputs_are_kept():
    proto = mlp()
    proto.ir_version = 3
    proto.graph.input.extend([vi("w", shape=[8, 64]), vi("b", shape=[64])])
    model = load_onnx(proto)
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert set(model.graph.initializers) == {"w", "b"}
    out = round_trip(proto, X8)
    assert [v.name for v in out.graph.input] == ["x", "w", "b"]


def test_bfloat16_initializer_kept_raw_until_changed():
    data = np.array([1.0, -2.5, 3.0, 0.15625], np.float32)
    w = helper.make_tensor("w", T.BFLOAT16, [4], data)
    nodes = [
        helper.make_node("Cast", ["w"], ["wf"], to=T.FLOAT),
        helper.make_node("Add", ["x", "wf"], ["y"]),
    ]
    proto = make(nodes, [vi("x", shape=[4])], [vi("y", shape=[4])], [w])
    model = load_onnx(proto)
    v = model.graph.initializers["w"]
    assert v.dtype == DType.BFLOAT16 and v.const.dtype == np.float32
    np.testing.assert_array_equal(v.const, data)
    out = round_trip(proto, {"x": np.zeros(4, np.float32)})
    assert out.graph.initializer[0] == w
    v.const = v.const * 2
    out = to_onnx(model)
    assert out.graph.initializer[0].data_type == T.BFLOAT16
    np.testing.assert_array_equal(run(out, {"x": np.zeros(4, np.float32)})[0], data * 2)


def test_sparse_initializer_kept():
    sp = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "s"),
        numpy_helper.from_array(np.array([1, 5], np.int64)),
        [2, 3],
    )
    nodes = [helper.make_node("Add", ["x", "s"], ["y"])]
    proto = make(nodes, [vi("x", shape=[2, 3])], [vi("y", shape=[2, 3])], sparse_initializer=[sp])
    model = load_onnx(proto)
    np.testing.assert_array_equal(model.graph.initializers["s"].const, [[0, 1, 0], [0, 0, 2]])
    # the checker rejects sparse tensors as Add inputs; onnxruntime densifies and runs them
    out = round_trip(proto, {"x": np.ones((2, 3), np.float32)}, check=False)
    assert list(out.graph.sparse_initializer) == [sp] and not out.graph.initializer


def test_model_built_in_the_ir_exports_and_runs():
    g = Graph("built")
    x = g.add_input(Value("x", DType.FLOAT, ("n", 8)))
    w = g.add_initializer("w", np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4))
    mm = g.make_node("MatMul", [x, w], name="mm")
    act = g.make_node("LeakyRelu", [mm.outputs[0]], {"alpha": 0.25}, name="act")
    red = g.make_node("ReduceMax", [act.outputs[0]], {"axes": [1], "keepdims": 0}, name="red")
    red.outputs[0].dtype, red.outputs[0].shape = DType.FLOAT, ("n",)
    g.set_outputs([red.outputs[0]])
    model = Model(g, {"": 17})
    out = to_onnx(model)
    onnx.checker.check_model(out, full_check=True)
    kinds = {a.name: a.type for a in out.graph.node[2].attribute}
    assert kinds == {"axes": onnx.AttributeProto.INTS, "keepdims": onnx.AttributeProto.INT}
    assert out.graph.node[1].attribute[0].type == onnx.AttributeProto.FLOAT
    h = X8["x"] @ numpy_helper.to_array(out.graph.initializer[0])
    want = np.where(h > 0, h, np.float32(0.25) * h).max(axis=1)
    np.testing.assert_allclose(run(out, X8)[0], want, rtol=1e-5, atol=1e-6)
    again = load_onnx(out)
    assert [n.name for n in again.graph.nodes] == ["mm", "act", "red"]
    assert again.graph.nodes[2].outputs[0].shape == ("n",)
