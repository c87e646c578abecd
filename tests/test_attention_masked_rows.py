"""A query row whose every key is masked by the exporters' finite fill (float32's lowest
value, a left-padded batch's padding positions) keeps the original's answer once attention is
fused into the opset-23 ``Attention``: the scores vanish in the fill, so the original averages
every value, while onnxruntime's kernel reads that exact value as ``-inf`` and gives zeros
unless the lowering passes it as a finite fill it takes as given."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import use_timer

LOWEST = np.finfo(np.float32).min
B, H, S, D = 2, 2, 6, 8


def _model(kind: str) -> onnx.ModelProto:
    """q @ k^T * scale, masked (an additive float mask input, a boolean mask through
    ``Where(cond, scores, lowest)``, or a constant additive mask), softmax, @ v."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, [B, H, S, D]) for n in ("q", "k", "v")]
    inits = [numpy_helper.from_array(np.array(D**-0.5, np.float32), "scale")]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["s2"]),
    ]
    if kind == "additive":
        inputs.append(helper.make_tensor_value_info("mask", f, [B, 1, S, S]))
        nodes.append(helper.make_node("Add", ["s2", "mask"], ["a"]))
    elif kind == "boolean":
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, [B, 1, S, S]))
        inits.append(numpy_helper.from_array(np.array(LOWEST, np.float32), "fill"))
        nodes.append(helper.make_node("Where", ["cond", "s2", "fill"], ["a"]))
    else:  # a constant mask: the first query row masked everywhere, the second partly
        mask = np.zeros((1, 1, S, S), np.float32)
        mask[..., 0, :] = LOWEST
        mask[..., 1, :3] = LOWEST
        inits.append(numpy_helper.from_array(mask, "cmask"))
        nodes.append(helper.make_node("Add", ["s2", "cmask"], ["a"]))
    nodes += [
        helper.make_node("Softmax", ["a"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    out = [helper.make_tensor_value_info("y", f, [B, H, S, D])]
    graph = helper.make_graph(nodes, "masked_attention", inputs, out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(kind: str, padded: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in ("q", "k", "v")}
    keep = np.ones((B, 1, S, S), bool)
    if padded:  # batch row 1 left-padded by 2: its first two queries see no key at all
        keep[1, :, :, :2] = False
        keep[1, :, :2, :] = False
    if kind == "additive":
        feeds["mask"] = np.where(keep, 0.0, LOWEST).astype(np.float32)
    elif kind == "boolean":
        feeds["cond"] = keep
    return feeds


def _fused_is_faster(key, side, fn):  # keep the fusion whatever this machine's load
    fn()
    return 5e-6 if side == "fused" else 10e-6


@pytest.mark.parametrize("kind", ["additive", "boolean", "constant"])
def test_rows_masked_everywhere_keep_the_originals_answer(kind, tmp_path):
    path = tmp_path / f"{kind}.onnx"
    onnx.save(_model(kind), str(path))
    gaf = GraphAutoFusion(str(path), sample_inputs=_feeds(kind, padded=False))
    with use_timer(_fused_is_faster):
        gaf.fuse()
    result = gaf.result
    assert any(k.startswith("attention@") for k in (x.key for x in result.lowered)), [
        (c.key, c.code) for c in result.analysis.candidates
    ]
    fused = tmp_path / "fused.onnx"
    gaf.save(str(fused))
    assert any(n.op_type == "Attention" for n in onnx.load(str(fused)).graph.node)
    feeds = _feeds(kind, padded=True)
    want = ort_session(str(path), "disable", 1).run(None, feeds)[0]
    got = ort_session(str(fused), "all", 1).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    masked = want[1, :, 0] if kind != "constant" else want[:, :, 0]
    assert np.abs(masked).max() > 0.05  # the original averages the values there: not zeros


def test_a_mask_a_feed_may_override_stays_an_input_and_a_constant_one_is_made_once(tmp_path):
    """An initializer also listed as a graph input (IR >= 4) is a default a feed may replace:
    the rewrite reads it at run time (``Where(Equal(...))``), so a fed mask still masks. A
    constant mask read by two attentions gets one finite-fill copy, not one per layer."""
    model = _model("constant")
    mask = next(i for i in model.graph.initializer if i.name == "cmask")
    model.graph.input.append(
        helper.make_tensor_value_info("cmask", TensorProto.FLOAT, [1, 1, S, S])
    )
    path = tmp_path / "overridable.onnx"
    onnx.save(model, str(path))
    feeds = _feeds("constant", padded=False)
    gaf = GraphAutoFusion(str(path), sample_inputs=feeds)
    with use_timer(_fused_is_faster):
        gaf.fuse()
    fused = tmp_path / "fused.onnx"
    gaf.save(str(fused))
    assert any(n.op_type == "Attention" for n in onnx.load(str(fused)).graph.node)
    other = np.zeros((1, 1, S, S), np.float32)
    other[..., :, 3:] = LOWEST  # a different mask, fed
    fed = dict(feeds, cmask=other)
    want = ort_session(str(path), "disable", 1).run(None, fed)[0]
    got = ort_session(str(fused), "all", 1).run(None, fed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert numpy_helper.to_array(mask).shape == (1, 1, S, S)

    two = _model("constant")  # a second attention reading the same constant mask
    g = two.graph
    extra = [
        helper.make_node("MatMul", ["q", "kt"], ["s_b"]),
        helper.make_node("Mul", ["s_b", "scale"], ["s2_b"]),
        helper.make_node("Add", ["s2_b", "cmask"], ["a_b"]),
        helper.make_node("Softmax", ["a_b"], ["p_b"], axis=-1),
        helper.make_node("MatMul", ["p_b", "v"], ["y_b"]),
    ]
    g.node.extend(extra)
    g.output.append(helper.make_tensor_value_info("y_b", TensorProto.FLOAT, [B, H, S, D]))
    path2 = tmp_path / "two.onnx"
    onnx.save(two, str(path2))
    gaf = GraphAutoFusion(str(path2), sample_inputs=_feeds("constant", padded=False))
    with use_timer(_fused_is_faster):
        gaf.fuse()
    out = tmp_path / "two_fused.onnx"
    gaf.save(str(out))
    proto = onnx.load(str(out))
    assert sum(n.op_type == "Attention" for n in proto.graph.node) == 2
    masks = [i for i in proto.graph.initializer if list(i.dims) == [1, 1, S, S]]
    assert len(masks) == 1, [i.name for i in masks]
    want = ort_session(str(path2), "disable", 1).run(None, _feeds("constant", padded=False))
    got = ort_session(str(out), "all", 1).run(None, _feeds("constant", padded=False))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
