"""Attention with logit soft-capping (Gemma-2): ``c * tanh(scores / c)`` between the scale and
the mask is matched into the opset-23 ``Attention``'s ``softcap`` attribute, which onnxruntime
applies before the mask, as the exporters' graphs do; the reference definition computes the
same order; a ``Tanh`` whose two factors differ is not a soft-cap and is left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.frontend.onnx_import import load_onnx
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import use_timer

B, H, KV, S, D = 1, 4, 2, 6, 8
CAP = 5.0
LOWEST = float(np.finfo(np.float32).min)


def _fused_is_faster(key, side, fn):  # keep the fusion whatever this machine's load
    fn()
    return 5e-6 if side == "fused" else 10e-6


def _feeds(rows_masked: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {n: (rng.standard_normal((B, H, S, D)) * 3).astype(np.float32) for n in "qkv"}
    mask = np.triu(np.full((S, S), LOWEST, np.float32), 1)[None, None]
    if rows_masked:  # the first query row sees no key at all, as a left-padded row
        mask = mask.copy()
        mask[..., 0, :] = LOWEST
    feeds["mask"] = mask
    return feeds


def _model(
    inner: str = "Div", inner_c: float = CAP, outer_c: float = CAP, capped: bool = True
) -> onnx.ModelProto:
    """Gemma-2's eager attention as both torch exporters write it: q @ k^T, * scale,
    / c, Tanh, * c, + mask, Softmax, @ v (``capped=False``: without the three capping
    nodes)."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, [B, H, S, D]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", f, [B, 1, S, S]))
    inits = [
        numpy_helper.from_array(np.array(D**-0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(inner_c, np.float32), "cap_in"),
        numpy_helper.from_array(np.array(outer_c, np.float32), "cap_out"),
    ]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["s2"]),
        helper.make_node(inner, ["s2", "cap_in"], ["d"]),
        helper.make_node("Tanh", ["d"], ["t"]),
        helper.make_node("Mul", ["t", "cap_out"], ["c"]),
        helper.make_node("Add", ["c" if capped else "s2", "mask"], ["a"]),
        helper.make_node("Softmax", ["a"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    if not capped:
        nodes = nodes[:3] + nodes[6:]
    out = [helper.make_tensor_value_info("y", f, [B, H, S, D])]
    graph = helper.make_graph(nodes, "softcap_attention", inputs, out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _fuse(model: onnx.ModelProto, tmp_path) -> tuple[GraphAutoFusion, onnx.ModelProto, str]:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    gaf = GraphAutoFusion(str(path), sample_inputs=_feeds())
    with use_timer(_fused_is_faster):
        gaf.fuse()
    fused = tmp_path / "fused.onnx"
    gaf.save(str(fused))
    return gaf, onnx.load(str(fused)), str(path)


@pytest.mark.parametrize("inner", ["Div", "Mul"])
def test_a_soft_capped_attention_is_one_attention_carrying_its_cap(inner, tmp_path):
    inner_c = CAP if inner == "Div" else 1.0 / CAP
    gaf, fused, path = _fuse(_model(inner, inner_c), tmp_path)
    atts = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert len(atts) == 1, [(c.key, c.code, c.message) for c in gaf.result.analysis.candidates]
    attrs = {a.name: helper.get_attribute_value(a) for a in atts[0].attribute}
    assert attrs["softcap"] == pytest.approx(CAP)
    assert attrs["scale"] == pytest.approx(D**-0.5)
    assert not any(n.op_type in ("Tanh", "Softmax") for n in fused.graph.node)
    for rows_masked in (False, True):  # also a row every key of which is masked
        feeds = _feeds(rows_masked)
        want = ort_session(path, "disable", 1).run(None, feeds)[0]
        got = ort_session(fused.SerializeToString(), "all", 1).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # without the cap the answer is another one: the attribute is what keeps it right
    for a in atts[0].attribute:
        if a.name == "softcap":
            a.f = 0.0
    uncapped = ort_session(fused.SerializeToString(), "all", 1).run(None, _feeds())[0]
    assert np.abs(uncapped - want).max() > 1e-2


def test_a_soft_capped_attention_is_fused_only_when_safe_mode_times_it(tmp_path):
    """The cost model cannot price onnxruntime's capping pass (1.5-3x slower than the unfused
    graph on onnxruntime 1.32): the match is a close call (``maybe``) that is fused only when
    safe mode measures it; without the speed check it stays unfused, with the reason. An
    attention without a cap is not affected."""
    path = tmp_path / "model.onnx"
    onnx.save(_model(), str(path))
    gaf = GraphAutoFusion(str(path), sample_inputs=_feeds())
    fused = gaf.fuse(check_speed=False)
    assert not any(n.op_type == "Attention" for n in fused.graph.nodes)
    (cand,) = [c for c in gaf.result.analysis.candidates if c.key.startswith("attention@")]
    assert not cand.chosen and cand.code == "maybe", (cand.code, cand.message)
    assert "caps the scores" in cand.message and "safe mode measures" in cand.message

    path2 = tmp_path / "plain.onnx"  # the same attention without the cap: fused untimed
    onnx.save(_model(capped=False), str(path2))
    gaf = GraphAutoFusion(str(path2), sample_inputs=_feeds())
    fused = gaf.fuse(check_speed=False)
    assert any(n.op_type == "Attention" for n in fused.graph.nodes), [
        (c.key, c.code, c.message) for c in gaf.result.analysis.candidates
    ]


def test_tanh_between_two_different_factors_is_not_a_softcap(tmp_path):
    gaf, fused, path = _fuse(_model("Div", 3.0, CAP), tmp_path)
    assert not any(n.op_type == "Attention" for n in fused.graph.node)
    assert sum(n.op_type == "Tanh" for n in fused.graph.node) == 1
    att = [c for c in gaf.result.analysis.candidates if c.key.startswith("attention@")]
    assert not att  # the rule's check refused the match
    feeds = _feeds()
    want = ort_session(path, "disable", 1).run(None, feeds)[0]
    got = ort_session(fused.SerializeToString(), "all", 1).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [0, 1])
def test_the_reference_attention_caps_before_the_mask_as_onnxruntime_does(causal):
    """The opset-23 ``Attention``'s ``softcap`` acts on the scaled scores before ``attn_mask``
    and ``is_causal``: a masked key stays masked (capping after the mask would give it
    ``-c`` and a weight of about ``exp(-c - max)``, far from zero for a small ``c``)."""
    f = TensorProto.FLOAT
    node = helper.make_node(
        "Attention", ["q", "k", "v", "mask"], ["y"], softcap=CAP, is_causal=causal
    )
    inputs = [helper.make_tensor_value_info(n, f, [B, H, S, D]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", f, [S, S]))
    graph = helper.make_graph(
        [node], "attention", inputs, [helper.make_tensor_value_info("y", f, [B, H, S, D])]
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    feeds = _feeds()
    mask = np.zeros((S, S), np.float32)
    mask[:, 2] = -np.inf  # key 2 masked for every query
    feeds["mask"] = mask
    want = ort_session(proto.SerializeToString(), "disable", 1).run(None, feeds)[0]
    got = run_model(load_onnx(proto), feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
