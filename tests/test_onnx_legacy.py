"""Older and third-party ONNX spellings normalised on import (frontend/onnx_legacy.py, issue 13).

Each normalisation on a small hand-built graph: the normalised model computes what the file
computes in onnxruntime, the rules then match what they match on a fresh export, and what
cannot be proven stays as it is (reported, never a crash).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graph_autofusion.frontend import load_model
from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx
from graph_autofusion.frontend.onnx_legacy import normalize_legacy
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.patterns.shape_folding import fold_reshape_shapes
from graph_autofusion.testing import ort_outputs

RNG = np.random.default_rng(0)


def vi(name, elem=T.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def make(nodes, inputs, outputs, inits=(), *, opset=13, ir=7) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = ir
    return proto


def normalized(proto):
    before = proto.SerializeToString()
    model = load_onnx(proto, normalize=True)
    assert proto.SerializeToString() == before  # the user's model is never modified
    out = to_onnx(model)
    onnx.checker.check_model(out, full_check=True)
    return model, out


def same_outputs(a, b, feeds):
    want, got = ort_outputs(a, feeds), ort_outputs(b, feeds)
    assert set(want) == set(got)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6)


def kept(graph, rule):
    return match_rules(graph, RuleSet((builtin_rules().get(rule),))).per_rule[rule].kept


def ops(proto):
    return sorted(n.op_type for n in proto.graph.node)


def test_every_constant_attribute_form_becomes_an_initializer_of_its_type():
    dense = numpy_helper.from_array(RNG.standard_normal((2, 3)).astype(np.float16), "")
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sv"),
        numpy_helper.from_array(np.array([1, 4], np.int64), "si"),
        [2, 3],
    )
    nodes = [
        helper.make_node("Constant", [], ["c_value"], value=dense),
        helper.make_node("Constant", [], ["c_float"], value_float=0.25),
        helper.make_node("Constant", [], ["c_floats"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["c_sparse"], sparse_value=sparse),
        helper.make_node("Constant", [], ["c_int"], value_int=3),
        helper.make_node("Constant", [], ["c_ints"], value_ints=[2, 3]),
        helper.make_node("Cast", ["c_value"], ["cv"], to=T.FLOAT),
        helper.make_node("Add", ["x", "cv"], ["a"]),
        helper.make_node("Mul", ["a", "c_float"], ["b"]),
        helper.make_node("Add", ["b", "c_floats"], ["c"]),
        helper.make_node("Sub", ["c", "c_sparse"], ["y"]),
        helper.make_node("Reshape", ["y", "c_ints"], ["z"]),
        helper.make_node("Add", ["k", "c_int"], ["w"]),
    ]
    proto = make(
        nodes,
        [vi("x", shape=[2, 3]), vi("k", T.INT64, [])],
        [vi("z", shape=[2, 3]), vi("w", T.INT64, [])],
    )
    model, out = normalized(proto)
    assert model.meta["legacy_normalization"].constants_to_initializers == 6
    assert "Constant" not in ops(out)
    inits = {t.name: t for t in out.graph.initializer}
    assert inits["c_float"].data_type == T.FLOAT and list(inits["c_float"].dims) == []
    assert inits["c_floats"].data_type == T.FLOAT
    assert inits["c_value"].data_type == T.FLOAT16
    assert inits["c_int"].data_type == T.INT64 and inits["c_ints"].data_type == T.INT64
    np.testing.assert_array_equal(
        numpy_helper.to_array(inits["c_sparse"]), [[0, 1.5, 0], [0, -2.0, 0]]
    )
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32), "k": np.array(4, np.int64)}
    same_outputs(proto, out, feeds)


def test_shape_program_constants_stay_nodes_and_unsupported_constants_are_left_alone():
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([6]))),
        helper.make_node("Constant", [], ["label"], name="label_c", value_string="legacy"),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    proto = make(nodes, [vi("x", shape=[2, 3])], [vi("y", shape=[6]), vi("label", T.STRING, [])])
    model, out = normalized(proto)
    rep = model.meta["legacy_normalization"]
    assert rep.constants_to_initializers == 0 and ops(out) == ["Constant", "Constant", "Reshape"]
    assert [n for n, why in rep.skipped] == ["label_c"] and "value_string" in rep.skipped[0][1]
    # a Constant written with two attributes (invalid ONNX) is reported and kept, not guessed
    bad = helper.make_node("Constant", [], ["c"], name="two", value_float=1.0, value_int=2)
    model = load_onnx(make([bad, helper.make_node("Identity", ["c"], ["y"])], [], [vi("y")]))
    rep = normalize_legacy(model)
    assert rep.skipped == [
        ("two", "Constant with attributes ['value_float', 'value_int'] (exactly one expected)")
    ]
    assert [n.op_type for n in model.graph.nodes] == ["Constant", "Identity"]


def test_constant_of_shape_of_a_constant_shape_is_folded():
    fill = numpy_helper.from_array(np.array([7], np.int64), "")
    nodes = [
        helper.make_node("Constant", [], ["s1"], value=numpy_helper.from_array(np.array([2, 3]))),
        helper.make_node("ConstantOfShape", ["s1"], ["zeros"]),  # default: float32 zeros
        helper.make_node("ConstantOfShape", ["s2"], ["sevens"], value=fill),
        helper.make_node("Shape", ["x"], ["sx"]),  # a static shape: provable
        helper.make_node(
            "ConstantOfShape",
            ["sx"],
            ["ones"],
            value=numpy_helper.from_array(np.array([1.0], np.float32), ""),
        ),
        helper.make_node("Add", ["x", "zeros"], ["a"]),
        helper.make_node("Mul", ["a", "ones"], ["y"]),
        helper.make_node("Cast", ["sevens"], ["z"], to=T.FLOAT),
    ]
    s2 = numpy_helper.from_array(np.array([3], np.int64), "s2")
    proto = make(nodes, [vi("x", shape=[2, 3])], [vi("y", shape=[2, 3]), vi("z", shape=[3])], [s2])
    model, out = normalized(proto)
    assert model.meta["legacy_normalization"].constant_of_shape_folded == 3
    assert ops(out) == ["Add", "Cast", "Mul"]  # the Shape and the shape Constant went too
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert inits["sevens"].dtype == np.int64 and inits["zeros"].dtype == np.float32
    same_outputs(proto, out, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})


def test_constant_of_shape_that_cannot_be_proven_stays_unfolded():
    nodes = [
        helper.make_node("ConstantOfShape", ["shape_in"], ["f"], name="fed"),
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("ConstantOfShape", ["sx"], ["g"], name="dynamic"),
        helper.make_node("ConstantOfShape", ["big"], ["h"], name="huge"),
        helper.make_node("Add", ["x", "g"], ["y"]),
        helper.make_node("ReduceSum", ["h"], ["r"], keepdims=0),
    ]
    big = numpy_helper.from_array(np.array([1 << 23], np.int64), "big")
    proto = make(
        nodes,
        [vi("shape_in", T.INT64, [2]), vi("x", shape=["B", 3])],
        [vi("f"), vi("y", shape=["B", 3]), vi("r", shape=[])],
        [big],
    )
    model, out = normalized(proto)
    rep = model.meta["legacy_normalization"]
    assert rep.constant_of_shape_folded == 0 and ops(out).count("ConstantOfShape") == 3
    assert [n for n, _ in rep.skipped] == ["fed", "dynamic", "huge"]
    assert "over the limit" in rep.skipped[2][1]
    feeds = {"shape_in": np.array([2, 2], np.int64), "x": np.ones((4, 3), np.float32)}
    same_outputs(proto, out, feeds)


def test_ir3_initializers_listed_as_inputs_are_constants_ir4_ones_stay_overridable():
    w = numpy_helper.from_array(RNG.standard_normal((3,)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("Reshape", ["a", "shape"], ["y"]),
    ]
    inputs = [vi("x", shape=[2, 3]), vi("w", shape=[3]), vi("shape", T.INT64, [2])]
    proto = make(nodes, inputs, [vi("y", shape=[3, 2])], [w, shape], opset=9, ir=3)
    model, out = normalized(proto)
    rep = model.meta["legacy_normalization"]
    assert rep.listed_initializers_constant == 2 and rep.ir_version == (3, 4)
    assert [i.name for i in out.graph.input] == ["x"] and out.ir_version == 4
    same_outputs(proto, out, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})
    # IR version 7: a feed may override them, so the listing stays
    proto.ir_version = 7
    model, out = normalized(proto)
    assert model.meta["legacy_normalization"].listed_initializers_constant == 0
    assert [i.name for i in out.graph.input] == ["x", "w", "shape"]


def _projections(ir: int, listed: bool) -> onnx.ModelProto:
    """Three sibling projections of x (a QKV), their weights and biases listed as graph
    inputs when ``listed`` (``keep_initializers_as_inputs``)."""
    nodes, inits, names = [], [], []
    for i in range(3):
        w = RNG.standard_normal((16, 8)).astype(np.float32)
        b = RNG.standard_normal((8,)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        names += [(f"w{i}", [16, 8]), (f"b{i}", [8])]
        nodes += [
            helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"]),
        ]
    inputs = [vi("x", shape=[1, 5, 16])] + ([vi(n, shape=s) for n, s in names] if listed else [])
    outputs = [vi(f"y{i}", shape=[1, 5, 8]) for i in range(3)]
    return make(nodes, inputs, outputs, inits, opset=13, ir=ir)


@pytest.mark.parametrize("ir", [3, 7])
def test_initializers_a_feed_may_override_are_no_constants_to_fuse(ir):
    """From IR version 4 an initializer listed as a graph input may be replaced by a feed:
    QKV's weights were concatenated into a new constant, the listed inputs dropped from the
    fused model (a feed onnxruntime accepted on the original was refused). At IR 3 the
    listing is the only way to have an initializer: constants, fused as before."""
    qkv = RuleSet([r for r in builtin_rules() if r.name == "qkv_horizontal"])
    plain = load_onnx(_projections(ir, listed=False), normalize=True)
    assert len(match_rules(plain.graph, qkv).kept) == 1
    model = load_onnx(_projections(ir, listed=True), normalize=True)
    assert len(match_rules(model.graph, qkv).kept) == (1 if ir == 3 else 0)


def test_shape_folding_reads_ir3_listed_initializers_and_slice1_attributes():
    # x.view(x.size(0) * x.size(1), -1) as opset 9 wrote it: Slice-1 bounds in attributes, an
    # Unsqueeze axes attribute, and the -1 an initializer listed as an IR-3 graph input
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s"], ["bs"], starts=[0], ends=[2], axes=[0]),
        helper.make_node("ReduceProd", ["bs"], ["n"], keepdims=0),
        helper.make_node("Shape", ["x"], ["s2"]),
        helper.make_node("Gather", ["s2", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b"], ["ub"], axes=[0]),
        helper.make_node("Concat", ["ub", "neg"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["y"]),
        helper.make_node("Slice", ["s"], ["last"], starts=[-1], ends=[3]),
        helper.make_node("Concat", ["bs", "last"], ["t2"], axis=0),
        helper.make_node("Reshape", ["x", "t2"], ["y2"]),
    ]
    i0 = numpy_helper.from_array(np.array(0, np.int64), "i0")
    neg = numpy_helper.from_array(np.array([-1], np.int64), "neg")
    inputs = [vi("x", shape=["B", "S", 8]), vi("i0", T.INT64, []), vi("neg", T.INT64, [1])]
    outputs = [vi("y", shape=["B", "F"]), vi("y2", shape=["B", "S", 8]), vi("n", T.INT64, [])]
    proto = make(nodes, inputs, outputs, [i0, neg], opset=9, ir=3)
    model = load_onnx(proto)  # not normalised: shape folding itself knows IR-3 listings
    rep = fold_reshape_shapes(model, symbolic=False)
    assert sorted(f.after for f in rep.folded) == [[0, -1], [0, 0, 8]]
    out = to_onnx(model)
    onnx.checker.check_model(out)
    same_outputs(proto, out, {"x": RNG.standard_normal((2, 5, 8)).astype(np.float32)})


def test_two_input_sum_is_a_residual_add():
    nodes = [
        helper.make_node("Sum", ["a", "b"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["y"]),
        helper.make_node("Sum", ["a", "b", "y"], ["s3"]),
        helper.make_node("Sum", ["s3"], ["z"]),
    ]
    proto = make(nodes, [vi("a", shape=[2, 4]), vi("b", shape=[2, 4])], [vi("z", shape=[2, 4])])
    assert kept(load_onnx(proto).graph, "add_relu") == 0
    model, out = normalized(proto)
    assert model.meta["legacy_normalization"].sums_to_adds == 1
    assert [n.op_type for n in out.graph.node] == ["Add", "Relu", "Sum", "Sum"]
    assert out.graph.node[0].name == "residual"
    assert kept(model.graph, "add_relu") == 1
    feeds = {k: RNG.standard_normal((2, 4)).astype(np.float32) for k in "ab"}
    same_outputs(proto, out, feeds)


def _conv_bn_relu(opset: int, bn_attrs: dict):
    """Conv + BatchNorm + Relu as an old exporter wrote it: the weight a Constant node, mean and
    variance uniform fills (ConstantOfShape from opset 9, Constant before), scale and bias
    initializers listed as IR-3 graph inputs."""
    c = 4
    w = numpy_helper.from_array(RNG.standard_normal((c, 3, 3, 3)).astype(np.float32), "")
    nodes = [helper.make_node("Constant", [], ["w"], value=w)]
    params = {
        "scale": 0.5 + RNG.random(c),
        "bias": RNG.standard_normal(c),
        "mean": np.full(c, 0.1),
        "var": np.full(c, 2.0),
    }
    inits = []
    for k, v in params.items():
        v = v.astype(np.float32)
        if k in ("mean", "var") and opset >= 9:
            shape = numpy_helper.from_array(np.array([c], np.int64), "")
            fill = numpy_helper.from_array(v[:1], "")
            nodes.append(helper.make_node("Constant", [], [f"{k}_shape"], value=shape))
            nodes.append(helper.make_node("ConstantOfShape", [f"{k}_shape"], [k], value=fill))
        elif k in ("mean", "var"):
            nodes.append(helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v)))
        else:
            inits.append(numpy_helper.from_array(v, k))
    nodes += [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", *params], ["bn"], **bn_attrs),
        helper.make_node("Relu", ["bn"], ["y"]),
    ]
    inputs = [vi("x", shape=[1, 3, 8, 8])] + [vi(t.name, shape=[c]) for t in inits]
    return make(nodes, inputs, [vi("y", shape=[1, c, 8, 8])], inits, opset=opset, ir=3)


@pytest.mark.parametrize(
    ("opset", "bn_attrs"), [(7, {"spatial": 1}), (9, {})], ids=["bn7-spatial", "bn9"]
)
def test_legacy_conv_bn_relu_matches_like_a_fresh_export(opset, bn_attrs):
    proto = _conv_bn_relu(opset, bn_attrs)
    model, out = normalized(proto)
    assert kept(model.graph, "conv_bn_relu") == 1 and kept(model.graph, "conv_bn") == 1
    same_outputs(proto, out, {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)})
    if opset >= 9:  # the ConstantOfShape statistics are no constants before normalisation
        assert kept(load_onnx(proto).graph, "conv_bn_relu") == 0


def test_opset_attribute_forms_the_rules_read_directly():
    # Clip-6 keeps min/max as attributes: conv_activation matches and FusedConv gets them
    w = numpy_helper.from_array(RNG.standard_normal((2, 3, 1, 1)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Clip", ["c"], ["y"], min=0.0, max=6.0),
    ]
    proto = make(nodes, [vi("x", shape=[1, 3, 4, 4])], [vi("y")], [w], opset=9)
    assert kept(load_model(proto).graph, "conv_activation") == 1
    # ReduceMean's axes attribute (opset < 18): the decomposed LayerNorm matches
    g = numpy_helper.from_array(np.ones(8, np.float32), "g")
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "g"], ["y"]),
    ]
    proto = make(nodes, [vi("x", shape=[2, 8])], [vi("y")], [g, eps, two], opset=11)
    assert kept(load_model(proto).graph, "layernorm_decomposed") == 1
