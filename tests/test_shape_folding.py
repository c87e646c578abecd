"""Folding exporters' Reshape shape programs into constants (patterns/shape_folding.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model, print_model
from graph_autofusion.patterns.shape_folding import fold_reshape_shapes
from graph_autofusion.testing import ort_outputs

# TorchScript's spelling of x.view(b, s, 2, -1): Shape -> Gather -> Unsqueeze -> Concat
TS_VIEW = """
graph g(%x: f32[B,S,8]) -> (%y) {
  init %i0: i64[] = [0]
  init %i1: i64[] = [1]
  init %ax: i64[1] = [0]
  init %two: i64[1] = [2]
  init %neg: i64[1] = [-1]
  %sh: i64[3] = Shape(%x) @shape
  %b: i64[] = Gather<axis=0>(%sh, %i0) @g0
  %s: i64[] = Gather<axis=0>(%sh, %i1) @g1
  %ub: i64[1] = Unsqueeze(%b, %ax) @u0
  %us: i64[1] = Unsqueeze(%s, %ax) @u1
  %t: i64[4] = Concat<axis=0>(%ub, %us, %two, %neg) @cat
  %y: f32[B,S,2,4] = Reshape(%x, %t) @view
}
"""

# dynamo's spelling: Shape with start/end, and allowzero=1
DYNAMO_VIEW = """
graph g(%x: f32[B,S,8], %ids: i64[B,S]) -> (%y) {
  init %two: i64[1] = [2]
  init %neg: i64[1] = [-1]
  %b: i64[1] = Shape<start=0, end=1>(%ids) @sb
  %s: i64[1] = Shape<start=1, end=2>(%ids) @ss
  %t: i64[4] = Concat<axis=0>(%b, %s, %two, %neg) @cat
  %y: f32[B,S,2,4] = Reshape<allowzero=1>(%x, %t) @view
}
"""


def _ops(model):
    return sorted(n.op_type for n in model.graph.nodes)


def _feeds(b, s):
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((b, s, 8)).astype(np.float32),
        "ids": np.zeros((b, s), np.int64),
    }


@pytest.mark.parametrize("text", [TS_VIEW, DYNAMO_VIEW], ids=["torchscript", "dynamo"])
def test_view_program_folds_to_copy_dims_and_holds_for_every_shape(text):
    original = parse_model(text)
    model = parse_model(text)
    rep = fold_reshape_shapes(model)
    (f,) = rep.folded
    assert f.node == "view" and f.before == ["B", "S", "2", "-1"] and f.after == [0, 0, 2, -1]
    assert _ops(model) == ["Reshape"]  # the whole shape program is gone
    assert rep.nodes_removed == len(original.graph.nodes) - 1
    (view,) = model.graph.nodes
    assert view.attr("allowzero", 0) == 0
    proto = to_onnx(model)
    onnx.checker.check_model(proto)
    assert [o.name for o in proto.graph.output] == ["y"]
    for b, s in ((1, 16), (3, 7), (2, 1)):  # a symbolic proof: any batch and sequence
        feeds = _feeds(b, s)
        want = ort_outputs(original, feeds)["y"]
        got = ort_outputs(proto, feeds)["y"]
        assert got.shape == want.shape == (b, s, 2, 4)
        np.testing.assert_array_equal(got, want)


def test_shared_shape_nodes_stay_for_their_other_readers():
    text = TS_VIEW.replace("-> (%y)", "-> (%y, %b)")
    model = parse_model(text)
    rep = fold_reshape_shapes(model)
    assert len(rep.folded) == 1
    assert {"Shape", "Gather"} <= set(_ops(model))  # %b is a graph output
    assert rep.nodes_removed_by_op == {"Concat": 1, "Unsqueeze": 2, "Gather": 1}


def test_unprovable_programs_are_left_alone():
    # the dim comes from another position (S placed first): neither a copy nor the one -1
    swapped = TS_VIEW.replace("%t: i64[4] = Concat<axis=0>(%ub, %us, %two, %neg)",
                              "%t: i64[4] = Concat<axis=0>(%us, %ub, %two, %neg)")  # fmt: skip
    swapped = swapped.replace("f32[B,S,2,4] = Reshape", "f32[S,B,2,4] = Reshape")
    # a literal 0 with allowzero=1 (a zero-size dim, not a copy)
    zero = DYNAMO_VIEW.replace("init %two: i64[1] = [2]", "init %two: i64[1] = [0]")
    for text in (swapped, zero):
        model = parse_model(text)
        before = print_model(model)
        rep = fold_reshape_shapes(model)
        assert rep.folded == [] and rep.nodes_removed == 0
        assert print_model(model) == before


def test_an_unknown_dim_is_never_turned_into_a_new_minus_one():
    # on the IR's shapes the sequence dim is unknown ("?"): a -1 for it would fail (or infer
    # another size) on an empty tensor where the original's computed dim does not
    text = TS_VIEW.replace("%x: f32[B,S,8]", "%x: f32[B,?,8]").replace(
        "f32[B,S,2,4]", "f32[B,?,2,4]"
    )
    text = text.replace("init %neg: i64[1] = [-1]", "init %neg: i64[1] = [4]")
    assert fold_reshape_shapes(parse_model(text), symbolic=False).folded == []
    # onnxruntime's symbolic inference names the unknown dim (x_d1) on both sides: a copy
    model = parse_model(text)
    (f,) = fold_reshape_shapes(model).folded
    assert f.before == ["B", "x_d1", "2", "4"] and f.after == [0, 0, 2, 4]
    feeds = _feeds(2, 5)
    want = ort_outputs(parse_model(text), feeds)["y"]
    got = ort_outputs(model, feeds)["y"]
    np.testing.assert_array_equal(got, want)


def test_symbols_equal_only_by_a_broadcast_guess_are_not_trusted():
    """Add(x[B,S,56], m[B,T,56]) is valid with T = 1: S and T are not the same dim, so the
    view of m by x's S must not become a copy of m's dim (or an identity)."""
    text = """
    graph g(%x: f32[B,S,56], %m: f32[B,T,56]) -> (%a, %z) {
      init %neg: i64[1] = [-1]
      %a: f32[B,S,56] = Add(%x, %m) @add
      %bs: i64[2] = Shape<start=0, end=2>(%x) @shape
      %t: i64[3] = Concat<axis=0>(%bs, %neg) @cat
      %r = Reshape(%m, %t) @view
      %z = Relu(%r) @relu
    }
    """
    model = parse_model(text)
    assert fold_reshape_shapes(model).folded == []
    rng = np.random.default_rng(2)
    feeds = {
        "x": rng.standard_normal((2, 7, 56)).astype(np.float32),
        "m": rng.standard_normal((2, 1, 56)).astype(np.float32),
    }
    want = ort_outputs(parse_model(text), feeds)
    got = ort_outputs(model, feeds)
    assert got["z"].shape == want["z"].shape == (2, 7, 8)


def _proto_model(nodes, inputs, inits, opset, listed=()):
    from onnx import TensorProto, helper, numpy_helper

    from graph_autofusion.frontend.onnx_import import load_onnx

    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    vis += [helper.make_tensor_value_info(n, TensorProto.INT64, [len(inits[n])]) for n in listed]
    graph = helper.make_graph(
        nodes,
        "g",
        vis,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 7
    return load_onnx(proto)


def test_opset9_slice_folds_and_overridable_initializers_are_left_alone():
    from onnx import helper

    # Slice-1 keeps its bounds in attributes: evaluated from them (issue 13)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s"], ["bs"], starts=[0], ends=[2], axes=[0]),
        helper.make_node("Concat", ["bs", "neg"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["y"]),
    ]
    model = _proto_model(nodes, [("x", ["B", "S", 8])], {"neg": [-1]}, 9)
    assert [f.after for f in fold_reshape_shapes(model).folded] == [[0, 0, -1]]
    # an initializer also listed as a graph input can be fed another value: not a constant
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=0, end=2),
        helper.make_node("Concat", ["s", "heads", "neg"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["y"]),
    ]
    model = _proto_model(
        nodes, [("x", ["B", "S", 8])], {"heads": [2], "neg": [-1]}, 18, listed=["heads"]
    )
    assert fold_reshape_shapes(model).folded == []
    assert "heads" in [v.name for v in to_onnx(model).graph.input]


def test_a_reshape_that_changes_nothing_is_removed():
    text = """
    graph g(%x: f32[B,4,S,8]) -> (%y) {
      init %i0: i64[] = [0]
      init %i2: i64[] = [2]
      init %ax: i64[1] = [0]
      init %neg: i64[1] = [-1]
      init %eight: i64[1] = [8]
      %sh: i64[4] = Shape(%x) @shape
      %b: i64[] = Gather<axis=0>(%sh, %i0) @g0
      %s: i64[] = Gather<axis=0>(%sh, %i2) @g2
      %ub: i64[1] = Unsqueeze(%b, %ax) @u0
      %us: i64[1] = Unsqueeze(%s, %ax) @u2
      %t: i64[4] = Concat<axis=0>(%ub, %neg, %us, %eight) @cat
      %r: f32[B,4,S,8] = Reshape(%x, %t) @same
      %y: f32[B,4,S,8] = Relu(%r) @relu
    }
    """
    model = parse_model(text)
    rep = fold_reshape_shapes(model)
    assert rep.identities_removed == ["same"] and rep.folded[0].after == [0, -1, 0, 8]
    assert _ops(model) == ["Relu"]
    assert model.graph.nodes[0].inputs[0].name == "x"
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 4, 3, 8)).astype(np.float32)}
    want = ort_outputs(parse_model(text), feeds)["y"]
    got = ort_outputs(model, feeds)["y"]
    np.testing.assert_array_equal(got, want)
    # a graph output keeps its name: the Reshape stays, with a constant shape
    kept = parse_model(text.replace("-> (%y)", "-> (%y, %r)"))
    rep = fold_reshape_shapes(kept)
    assert rep.identities_removed == [] and len(rep.folded) == 1
    assert _ops(kept) == ["Relu", "Reshape"]


@pytest.mark.slow
@pytest.mark.xdist_group("models")  # with the other zoo-model tests: one worker, bounded memory
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama_gqa"])
def test_zoo_exports_fold_and_match_onnxruntime_at_other_shapes(name, exporter):
    from graph_autofusion.frontend.onnx_import import load_onnx
    from graph_autofusion.testing import example_feeds, export_onnx

    path = export_onnx(name, exporter)
    model = load_onnx(path)
    n0 = len(model.graph.nodes)
    rep = fold_reshape_shapes(model)
    assert rep.folded, "every export views Q/K/V per head"
    assert len(model.graph.nodes) == n0 - rep.nodes_removed
    proto = to_onnx(model)
    onnx.checker.check_model(proto)
    for batch, seq in ((1, 16), (2, 5)):
        feeds = example_feeds(name, seq_len=seq, batch=batch)
        want = ort_outputs(path, feeds)
        got = ort_outputs(proto, feeds)
        assert list(got) == list(want)
        for k, w in want.items():
            np.testing.assert_array_equal(got[k], w)


def test_only_merges_that_hold_for_every_accepted_input_are_used():
    from graph_autofusion.patterns.shape_folding import _safe_merge

    assert _safe_merge("Min(512, seq)", "seq") and _safe_merge("seq", "Min(seq, 512)")
    assert not _safe_merge("S", "T")  # a broadcast: T may be 1
    assert not _safe_merge("Min(512, seq)", "batch")
    assert not _safe_merge("Min(0, seq)", "seq")


@pytest.mark.slow
@pytest.mark.xdist_group("models")  # with the other zoo-model tests: one worker, bounded memory
def test_bert_torchscript_folds_every_head_view_through_the_position_slice_merge():
    """BERT's position table is sliced to Min(512, seq) and added to the embeddings: the one
    merge onnxruntime's inference makes is sound, so all 12 x 5 views fold."""
    from graph_autofusion.frontend.onnx_import import load_onnx
    from graph_autofusion.testing import export_onnx

    model = load_onnx(export_onnx("bert", "torchscript"))
    rep = fold_reshape_shapes(model)
    assert len(rep.folded) == 60 and len(rep.identities_removed) == 12
