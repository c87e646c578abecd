"""Safe mode at a second shape (``pipeline/other_shape.py``): a model with dynamic dims is
also compared end to end at batch 2 and another length, and a fusion that is right on the
sample inputs but wrong (or refused by onnxruntime) there is rolled back alone."""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.text import parse_model
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.library import rotary_embedding as rotary
from graph_autofusion.pipeline import fuse_model, other_shape
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.samples.inputs import other_shape_inputs
from graph_autofusion.verify.safety import at_other_shape

PROFILE = "x86_avx2"

#: q rotated by tables of one row of positions ([1, 1, S, 8], broadcast over the batch by the
#: Mul, as the exporters write them) and an erf GELU; batch and length dynamic.
ROTARY = """model opset {"": 20}
graph g(%x: f32[B,2,S,8], %f: f32[1,S,4], %r: f32[B,S,16]) -> (%y, %z) {
  init %c: f32[] = [1.4142135381698608]
  init %onef: f32[] = [1.0]
  init %half: f32[] = [0.5]
  init %i0: i64[1] = [0]
  init %i3: i64[1] = [3]
  init %i4: i64[1] = [4]
  init %imax: i64[1] = [9223372036854775807]
  init %one: i64[1] = [1]
  %emb = Concat<axis=-1>(%f, %f)
  %c0 = Cos(%emb)
  %s0 = Sin(%emb)
  %cos = Unsqueeze(%c0, %one)
  %sin = Unsqueeze(%s0, %one)
  %lo = Slice(%x, %i0, %i4, %i3, %one)
  %hi = Slice(%x, %i4, %imax, %i3, %one)
  %n = Neg(%hi)
  %rot = Concat<axis=-1>(%n, %lo)
  %a = Mul(%x, %cos)
  %b = Mul(%rot, %sin)
  %y = Add(%a, %b)
  %d = Div(%r, %c)
  %e = Erf(%d)
  %e1 = Add(%e, %onef)
  %m = Mul(%r, %e1)
  %z = Mul(%m, %half)
}
"""


def _fuse(text: str):
    return fuse_model(
        parse_model(text),
        builtin_rules().preset("all"),
        PROFILE,
        options=FuseOptions(check_speed=False, benefit_threshold=0.0),
    )


def _run(model, feeds):
    return ort_session(model, "all").run(None, feeds)


def test_the_end_to_end_check_also_runs_a_second_shape():
    res = _fuse(ROTARY)
    assert {low.rule for low in res.lowered} == {"rotary_embedding", "gelu_erf"}
    other = [k for k in res.end_to_end if at_other_shape(k)]
    assert sorted(other) == ["y @ batch 2, sequence 7", "z @ batch 2, sequence 7"]
    assert all(res.end_to_end[k]["passed"] for k in other)


def test_a_fusion_wrong_at_batch_two_is_rolled_back_alone(monkeypatch):
    """The rotary tables' batch expansion undone (the bug it fixed: RotaryEmbedding does not
    broadcast a one-row table, so the fused model failed in onnxruntime at batch 2): the
    sample inputs (batch 1) pass, the second shape does not, and only that fusion goes."""
    monkeypatch.setattr(rotary, "_batch_of", lambda ctx, table, x: table)
    res = _fuse(ROTARY)
    (bad,) = res.rolled_back
    assert (bad.rule, bad.code) == ("rotary_embedding", "other-shape"), bad
    assert "batch 2, sequence 7" in bad.message
    assert [low.rule for low in res.lowered] == ["gelu_erf"]
    assert any("differ on inputs of batch 2" in n for n in res.notes)
    rng = np.random.default_rng(3)
    feeds = {
        "x": rng.standard_normal((3, 2, 5, 8), np.float32),
        "f": rng.standard_normal((1, 5, 4), np.float32),
        "r": rng.standard_normal((3, 5, 16), np.float32),
    }
    for got, want in zip(_run(res.model, feeds), _run(res.original, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_static_models_have_no_second_shape():
    text = ROTARY.replace("B,", "1,").replace("S,", "6,")
    res = _fuse(text)
    assert not [k for k in res.end_to_end if at_other_shape(k)]


def test_with_no_fusion_found_at_fault_every_fusion_goes(monkeypatch):
    monkeypatch.setattr(rotary, "_batch_of", lambda ctx, table, x: table)
    monkeypatch.setattr(other_shape, "culprits", lambda *a, **k: [])
    res = _fuse(ROTARY)
    assert not res.lowered
    assert {b.code for b in res.rolled_back} == {"end-to-end"}
    assert sorted(b.rule for b in res.rolled_back) == ["gelu_erf", "rotary_embedding"]
    assert [n.op_type for n in res.model.graph.nodes] == [
        n.op_type for n in res.original.graph.nodes
    ]


def test_the_second_shape_inputs():
    """Batch 2, sequence 7, masks of ones (no padding: see other_shape_inputs); none for a
    model whose inputs already have that shape, or with a size input nothing explains."""
    model = parse_model(
        """model opset {"": 18}
graph g(%input_ids: i64[B,S], %attention_mask: i64[B,S]) -> (%y) {
  %s = Add(%input_ids, %attention_mask)
  %y = Cast<to=1>(%s)
}
"""
    )
    feeds = {"input_ids": np.zeros((1, 16), np.int64), "attention_mask": np.ones((1, 16), np.int64)}
    what, other = other_shape_inputs(model, feeds)
    assert what == "batch 2, sequence 7"
    assert other["attention_mask"].shape == (2, 7) and other["attention_mask"].all()
    assert other_shape_inputs(model, {k: np.zeros((2, 7), np.int64) for k in feeds}) is None
    sized = parse_model(
        """model opset {"": 18}
graph g(%x: f32[B,S], %s0: i64[]) -> (%y) {
  %c = Cast<to=1>(%s0)
  %y = Mul(%x, %c)
}
"""
    )
    assert (
        other_shape_inputs(sized, {"x": np.zeros((1, 16), np.float32), "s0": np.array(16)}) is None
    )


def test_integer_outputs_are_not_compared_at_the_second_shape():
    text = ROTARY.replace("-> (%y, %z)", "-> (%y, %z, %top)").replace(
        "  %z = Mul(%m, %half)\n", "  %z = Mul(%m, %half)\n  %top = ArgMax<axis=-1>(%z)\n"
    )
    res = _fuse(text)
    assert "top" in res.end_to_end
    assert sorted(k for k in res.end_to_end if at_other_shape(k)) == [
        "y @ batch 2, sequence 7",
        "z @ batch 2, sequence 7",
    ]


def test_a_model_the_original_cannot_run_at_the_second_shape_keeps_one_check():
    """A Reshape to a fixed size: the original fails at the second shape, which is then not
    compared (nothing to compare against), and the fusion stays."""
    text = """model opset {"": 18}
graph g(%r: f32[B,S,16]) -> (%y) {
  init %c: f32[] = [1.4142135381698608]
  init %onef: f32[] = [1.0]
  init %half: f32[] = [0.5]
  init %shape: i64[3] = [1, 16, 16]
  %d = Div(%r, %c)
  %e = Erf(%d)
  %e1 = Add(%e, %onef)
  %m = Mul(%r, %e1)
  %z = Mul(%m, %half)
  %y = Reshape(%z, %shape)
}
"""
    res = _fuse(text)
    assert [low.rule for low in res.lowered] == ["gelu_erf"] and not res.rolled_back
    assert not [k for k in res.end_to_end if at_other_shape(k)]
    assert res.end_to_end["y"]["passed"]
    res = _fuse(text.replace("i64[3] = [1, 16, 16]", "i64[2] = [-1, 16]"))
    assert "y @ batch 2, sequence 7" in res.end_to_end  # runs at any length: compared there


def test_the_cpu_target_compares_its_program_at_the_second_shape_too():
    """The cpu target's end-to-end check runs its program (generated kernels and torch's) at
    the second shape against the original run by the same torch runner."""
    from graph_autofusion.pipeline.cpu import fuse_model_cpu

    res = fuse_model_cpu(
        parse_model(ROTARY),
        builtin_rules().preset("all"),
        PROFILE,
        options=FuseOptions(target="cpu", check_speed=False, benefit_threshold=0.0),
    )
    assert res.lowered and not res.rolled_back
    outs = res.end_to_end["outputs"]
    assert sorted(k for k in outs if at_other_shape(k)) == [
        "y @ batch 2, sequence 7",
        "z @ batch 2, sequence 7",
    ]
    assert all(v["passed"] for v in outs.values()) and res.end_to_end["passed"]
