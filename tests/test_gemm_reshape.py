"""codegen.gemm_reshape: GPT-2's Reshape -> Gemm -> Reshape(shape program) is a batched MatMul
(+ bias) again, only when the shape program provably restores the activation's leading dims."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.codegen.gemm_reshape import flatten_gemms
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.ort_session import ort_session

TEXT = """model opset {{"": 18}}
graph g(%x: f32[B,S,8], %other: f32[B,S,4]) -> (%y) {{
  init %flat: i64[2] = [-1, 8]
  init %w: f32[{w}] = randn(0)
  init %b: f32[6] = randn(1)
  init %i0: i64[] = [0]
  init %i1: i64[] = [1]
  init %ax: i64[1] = [0]
  init %n: i64[1] = [6]
  %x2: f32[?,8] = Reshape(%x, %flat)
  %g: f32[?,6] = Gemm<transB={tb}>(%x2, %w, %b)
  %sh = Shape(%{src})
  %d0 = Gather<axis=0>(%sh, %i0)
  %d1 = Gather<axis=0>(%sh, %{second})
  %u0 = Unsqueeze(%d0, %ax)
  %u1 = Unsqueeze(%d1, %ax)
  %t = Concat<axis=0>(%u0, %u1, %n)
  %y: f32[?,?,6] = Reshape(%g, %t)
}}
"""


def _run(model, feeds):
    return ort_session(model, "all").run(None, feeds)[0]


@pytest.mark.parametrize("tb", [0, 1])
def test_the_chain_becomes_matmul_and_add(tb):
    text = TEXT.format(w="6,8" if tb else "8,6", tb=tb, src="x", second="i1")
    model, original = parse_model(text), parse_model(text)
    assert flatten_gemms(model) == 1
    assert [n.op_type for n in model.graph.nodes] == ["MatMul", "Add"]
    for shape in ((1, 1, 8), (2, 5, 8)):
        feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32),
                 "other": np.zeros((*shape[:2], 4), np.float32)}  # fmt: skip
        np.testing.assert_allclose(_run(model, feeds), _run(original, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("src", "second"), [("other", "i1"), ("x", "i0")])
def test_a_shape_program_that_does_not_restore_x_is_left_alone(src, second):
    # dims read from another tensor without x's symbols ("other" has them: B, S -> accepted
    # only through the symbols; here its dims are renamed), or x's dim 0 twice
    text = TEXT.format(w="8,6", tb=0, src=src, second=second).replace(
        "%other: f32[B,S,4]", "%other: f32[P,Q,4]"
    )
    model = parse_model(text)
    before = [n.op_type for n in model.graph.nodes]
    assert flatten_gemms(model) == 0
    assert [n.op_type for n in model.graph.nodes] == before
