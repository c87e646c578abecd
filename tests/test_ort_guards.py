"""codegen.ort_guards: an Add -> LayerNormalization that onnxruntime's session would fuse into
its (slower) SkipLayerNormalization reads the sum through a 2-D Reshape where the profile prices
the fused kernel slower; the values are the same and the session's optimized graph has no
SkipLayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion.codegen.ort_guards import guard_skip_layernorms, session_would_fuse
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.ort_session import ort_session

TEXT = """model opset {{"": 18}}
graph g(%x: f32[{d0},{d1},8], %r: f32[{d0},{d1},8]) -> ({outs}) {{
  init %gamma: f32[8] = randn(0)
  init %beta: f32[8] = randn(1)
  %s: f32[{d0},{d1},8] = Add(%x, %r)
  %y: f32[{d0},{d1},8] = LayerNormalization<axis={axis}>(%s, %gamma, %beta)
  %z: f32[{d0},{d1},8] = Relu(%y)
}}
"""


class _Profile:  # the calibrated per-element rates the guard compares (ns)
    def __init__(self, fused: float) -> None:
        self.extra = {
            "op_ns_per_element": {
                "SkipLayerNormalization": fused,
                "Add": 0.1,
                "LayerNormalization": 0.35,
            }
        }


SLOW, FAST = _Profile(4.0), _Profile(0.3)


def _text(d0="B", d1="S", axis=-1, outs="%z"):
    return TEXT.format(d0=d0, d1=d1, axis=axis, outs=outs)


def _session_ops(model, tmp_path) -> list[str]:
    path = tmp_path / "opt.onnx"
    ort_session(model, "all", 2, optimized_model_path=str(path))
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def _feeds(shape):
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(shape).astype(np.float32) for k in ("x", "r")}


@pytest.mark.parametrize(("d0", "d1"), [("B", "S"), (2, 5)])
def test_the_pair_is_kept_apart_and_gives_the_same_values(tmp_path, d0, d1):
    model, original = parse_model(_text(d0, d1)), parse_model(_text(d0, d1))
    ln = next(n for n in model.graph.nodes if n.op_type == "LayerNormalization")
    assert session_would_fuse(ln, model)
    assert "SkipLayerNormalization" in _session_ops(original, tmp_path)  # what it prevents
    assert guard_skip_layernorms(model, SLOW) == 1
    assert "SkipLayerNormalization" not in _session_ops(model, tmp_path)
    for shape in ((2, 5, 8), (1, 3, 8)) if d0 == "B" else ((2, 5, 8),):
        feeds = _feeds(shape)
        got = ort_session(model, "all").run(None, feeds)[0]
        want = ort_session(original, "all").run(None, feeds)[0]
        assert got.shape == shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_graph_output_keeps_its_name_and_shape():
    model = parse_model(_text(outs="%y, %z"))
    assert guard_skip_layernorms(model, SLOW) == 1
    assert [v.name for v in model.graph.outputs] == ["y", "z"]
    got = ort_session(model, "all").run(None, _feeds((2, 5, 8)))
    assert got[0].shape == (2, 5, 8)


@pytest.mark.parametrize(
    ("text", "profile", "why"),
    [
        (_text(), FAST, "the profile prices the fused kernel faster"),
        (_text(), object(), "no calibrated rates"),
        (_text(axis=1), SLOW, "a norm over more than the last axis"),
        (_text().replace("%x: f32[B,S,8]", "%x: f32[1,S,8]"), SLOW, "operands of other shapes"),
        (_text().replace("%z: f32[B,S,8] = Relu(%y)", "%z: f32[B,S,8] = Add(%y, %s)"), SLOW,
         "the sum is read again"),
    ],
)  # fmt: skip
def test_left_alone(text, profile, why):
    model = parse_model(text)
    before = [n.op_type for n in model.graph.nodes]
    assert guard_skip_layernorms(model, profile) == 0, why
    assert [n.op_type for n in model.graph.nodes] == before


def test_a_sum_of_unknown_shape_takes_the_operands_dims():
    """The pair is recognized by the Add's operands; the sum's own shape may be unknown."""
    model, original = parse_model(_text(2, 5)), parse_model(_text(2, 5))
    add = next(n for n in model.graph.nodes if n.op_type == "Add")
    add.outputs[0].shape = None
    assert guard_skip_layernorms(model, SLOW) == 1
    feeds = _feeds((2, 5, 8))
    got = ort_session(model, "all").run(None, feeds)[0]
    np.testing.assert_allclose(
        got, ort_session(original, "all").run(None, feeds)[0], rtol=1e-5, atol=1e-5
    )
