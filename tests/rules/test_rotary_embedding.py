"""rotary_embedding: every exporter spelling of x*cos + rotate_half(x)*sin matches; near misses
do not; the generic rewrite keeps the numbers."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.rotary_embedding import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import check_no_match, check_rule

FUSED = "graph_autofusion.fused::RotaryEmbedding"

HEAD = """model opset {{"": {opset}}}
graph g(%x: f32[1,2,4,8], %cos: f32[1,1,4,8], %sin: f32[1,1,4,8]) -> (%y) {{
  init %i0: i64[1] = [0]
  init %i3: i64[1] = [3]
  init %i4: i64[1] = [4]
  init %i8: i64[1] = [8]
  init %im1: i64[1] = [-1]
  init %im4: i64[1] = [-4]
  init %one: i64[1] = [1]
  init %imax: i64[1] = [9223372036854775807]
"""
TAIL = """
  %n = Neg(%hi)
  %r = Concat<axis={cat_axis}>(%n, %lo)
  {products}
}}
"""
PRODUCTS = {
    "x_cos_first": "%a = Mul(%x, %cos)\n  %b = Mul(%r, %sin)\n  %y = Add(%a, %b)",
    "swapped": "%a = Mul(%cos, %x)\n  %b = Mul(%sin, %r)\n  %y = Add(%b, %a)",
}
#: How the halves %lo and %hi are cut (and the operators left outside the fused node).
HALVES = {
    # dynamo: constant bounds, axes [3], steps [1], INT64_MAX as the open end
    "dynamo_slices": (
        "%lo = Slice(%x, %i0, %i4, %i3, %one)\n  %hi = Slice(%x, %i4, %imax, %i3, %one)",
        [],
    ),
    # axes -1, no steps, the exact end
    "slices_last_axis_negative": (
        "%lo = Slice(%x, %i0, %i4, %im1)\n  %hi = Slice(%x, %i4, %i8, %im1)",
        [],
    ),
    # bounds counted from the end
    "slices_negative_bounds": (
        "%lo = Slice(%x, %i0, %im4, %im1)\n  %hi = Slice(%x, %im4, %imax, %im1)",
        [],
    ),
    # TorchScript: the half computed at run time from Shape(x)
    "torchscript_runtime_half": (
        """init %three: i64[] = [3]
  init %two: i64[] = [2]
  %sh = Shape(%x)
  %d = Gather<axis=0>(%sh, %three)
  %h = Div(%d, %two)
  %hc = Cast<to=7>(%h)
  %hc2 = Cast<to=7>(%hc)
  %e0 = Unsqueeze(%hc2, %i0)
  %e1 = Unsqueeze(%hc2, %i0)
  %lo = Slice(%x, %i0, %e0, %i3, %one)
  %hi = Slice(%x, %e1, %imax, %i3, %one)""",
        ["Shape", "Gather", "Div", "Cast", "Cast", "Unsqueeze", "Unsqueeze"],
    ),
    # one Split with a sizes input (opset >= 13)
    "split_sizes": (
        "init %sizes: i64[2] = [4, 4]\n  %lo, %hi = Split<axis=-1>(%x, %sizes)",
        [],
    ),
    # opset 18 Split into two equal outputs
    "split_num_outputs": ("%lo, %hi = Split<axis=3, num_outputs=2>(%x)", []),
}


def _text(halves: str, products: str = "x_cos_first", cat_axis: int = -1, opset: int = 18):
    return (
        HEAD.format(opset=opset)
        + "  "
        + halves
        + TAIL.format(cat_axis=cat_axis, products=PRODUCTS[products])
    )


@pytest.mark.parametrize("cat_axis", [-1, 3])
@pytest.mark.parametrize("products", sorted(PRODUCTS))
@pytest.mark.parametrize("halves", sorted(HALVES))
def test_every_variant_matches_and_rewrites(halves, products, cat_axis):
    body, outside = HALVES[halves]
    check_rule(RULE, _text(body, products, cat_axis), matches=1, ops_after=[*outside, FUSED])


def test_q_and_k_each_match_once():
    body = HALVES["dynamo_slices"][0]
    text = _text(body).replace("-> (%y)", "-> (%y, %yk)")
    k_part = body.replace("%x", "%k").replace("%lo", "%klo").replace("%hi", "%khi")
    k_part += "\n  %kn = Neg(%khi)\n  %kr = Concat<axis=-1>(%kn, %klo)"
    k_part += "\n  %ka = Mul(%k, %cos)\n  %kb = Mul(%kr, %sin)\n  %yk = Add(%ka, %kb)\n}"
    text = text.replace("%x: f32[1,2,4,8],", "%x: f32[1,2,4,8], %k: f32[1,1,4,8],")
    text = text.rstrip().removesuffix("}") + "  " + k_part + "\n"
    check_rule(RULE, text, matches=2, ops_after=[FUSED, FUSED])


def test_slices_that_are_not_halves_are_rejected():
    body = "%lo = Slice(%x, %i0, %i3, %i3, %one)\n  %hi = Slice(%x, %i3, %imax, %i3, %one)"
    check_no_match(RULE, _text(body), reason=Reason.CHECK_FAILED)


def test_slices_of_another_axis_are_rejected():
    body = "init %i2: i64[1] = [2]\n  "
    body += "%lo = Slice(%x, %i0, %i2, %i2, %one)\n  %hi = Slice(%x, %i2, %imax, %i2, %one)"
    check_no_match(RULE, _text(body), reason=Reason.CHECK_FAILED)


def test_a_runtime_bound_of_another_dimension_is_rejected():
    body = HALVES["torchscript_runtime_half"][0].replace("[3]\n  init %two", "[1]\n  init %two")
    assert "%three: i64[] = [1]" in body
    check_no_match(RULE, _text(body), reason=Reason.CHECK_FAILED)


def test_unequal_split_is_rejected():
    body = "init %sizes: i64[2] = [3, 5]\n  %lo, %hi = Split<axis=-1>(%x, %sizes)"
    check_no_match(RULE, _text(body), reason=Reason.CHECK_FAILED)


def test_negating_the_lower_half_is_not_rotate_half():
    body = HALVES["dynamo_slices"][0].replace("%lo =", "%tmp =").replace("%hi =", "%lo =")
    body = body.replace("%tmp =", "%hi =")
    check_no_match(RULE, _text(body), reason=Reason.CHECK_FAILED)


def test_rotating_a_different_tensor_is_a_binding_conflict():
    text = _text(HALVES["dynamo_slices"][0]).replace("Mul(%x, %cos)", "Mul(%cos, %cos)")
    check_no_match(RULE, text, reason=Reason.BINDING_CONFLICT)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
@pytest.mark.parametrize(
    ("model", "count"),
    [("llama", 8), ("llama_gqa", 8), ("bert", 0), ("gpt2", 0)],  # q and k of 4 layers
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


# ------------------------------------------------------------------ native form (opset 23)
NATIVE_HEAD = """model opset {{"": {opset}}}
graph g(%x: f32[1,2,4,8], %k: f32[1,2,4,8], %f: f32[1,4,4]) -> (%y, %yk) {{
  init %i0: i64[1] = [0]
  init %i3: i64[1] = [3]
  init %i4: i64[1] = [4]
  init %imax: i64[1] = [9223372036854775807]
  init %one: i64[1] = [1]
  init %scale: f32[] = [1.0]
  %emb: f32[1,4,8] = Concat<axis=-1>(%f, %f)
  %c0: f32[1,4,8] = Cos(%emb)
  %s0: f32[1,4,8] = Sin(%emb)
  %c1: f32[1,4,8] = Mul(%c0, %scale)
  %cos: f32[1,1,4,8] = Unsqueeze(%c1, %one)
  %sin: f32[1,1,4,8] = Unsqueeze(%s0, %one)
{body}
}}
"""


def _rotate(x: str, y: str) -> str:
    return f"""  %{x}lo = Slice(%{x}, %i0, %i4, %i3, %one)
  %{x}hi = Slice(%{x}, %i4, %imax, %i3, %one)
  %{x}n = Neg(%{x}hi)
  %{x}r = Concat<axis=-1>(%{x}n, %{x}lo)
  %{x}a = Mul(%{x}, %cos)
  %{x}b = Mul(%{x}r, %sin)
  %{y} = Add(%{x}a, %{x}b)"""


def _ort_matches_original(text: str, model) -> None:
    """The rewritten ``model`` in onnxruntime computes what the reference interpreter
    computes on the original ``text`` (both outputs, ``y`` and ``yk``)."""
    import numpy as np

    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.runtime.interpreter import run_model
    from graph_autofusion.testing.rules import random_feeds

    original = parse_model(text)
    feeds = random_feeds(original.graph, 0)
    want = run_model(original, feeds)
    sess = ort_session(model, "all")
    for name, got in zip(("y", "yk"), sess.run(None, feeds)):
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-5)


def test_native_form_is_the_opset_23_operator_with_shared_half_tables():
    """q and k rotated with tables built as concat(freqs, freqs) (Llama): two RotaryEmbedding
    nodes on the half tables; each match slices its own, identical ones are merged after."""
    from graph_autofusion.codegen.onnxruntime import Lowered, share_created

    text = NATIVE_HEAD.format(opset=20, body=_rotate("x", "y") + "\n" + _rotate("k", "yk"))
    model = check_rule(RULE, text, matches=2, native=True, rtol=1e-4)
    assert model.opset_imports[""] == 23
    rot = [n for n in model.graph.nodes if n.op_type == "RotaryEmbedding"]
    assert len(rot) == 2 and all(n.attrs["interleaved"] == 0 for n in rot)
    created = [n for n in model.graph.nodes if n.name.startswith("rotary_embedding/")]
    assert share_created(model, [Lowered("all", "rotary_embedding", [], created, [], [], [])]) == 4
    assert rot[0].inputs[1] is rot[1].inputs[1] and rot[0].inputs[2] is rot[1].inputs[2]
    assert rot[0].inputs[1].shape == (1, 4, 4)
    _ort_matches_original(text, model)


def test_tables_of_one_row_are_expanded_to_the_batch():
    """The exporters' tables have one row of positions for the whole batch (the Mul
    broadcasts it); RotaryEmbedding does not broadcast, so the fused model failed in
    onnxruntime at batch 3 (a dynamo Olmo2 export) until the tables were expanded."""

    text = NATIVE_HEAD.format(opset=20, body=_rotate("x", "y") + "\n" + _rotate("k", "yk"))
    text = text.replace("%x: f32[1,2,4,8], %k: f32[1,2,4,8]", "%x: f32[3,2,4,8], %k: f32[3,2,4,8]")
    model = check_rule(RULE, text, matches=2, native=True, rtol=1e-4)
    rot = [n for n in model.graph.nodes if n.op_type == "RotaryEmbedding"]
    assert all(n.inputs[1].producer.op_type == "Expand" for n in rot)
    assert rot[0].inputs[1].shape == (3, 4, 4)
    _ort_matches_original(text, model)


def test_tables_that_are_not_two_equal_halves_keep_the_generic_form():
    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.patterns.candidates import apply_matches, match_rules
    from graph_autofusion.patterns.rules import RuleSet

    text = NATIVE_HEAD.format(opset=20, body=_rotate("x", "y") + "\n  %yk = Identity(%k)")
    text = text.replace("Concat<axis=-1>(%f, %f)", "Concat<axis=-1>(%f, %c_other)").replace(
        "%f: f32[1,4,4]", "%f: f32[1,4,4], %c_other: f32[1,4,4]"
    )
    model = parse_model(text)
    (applied,) = apply_matches(model, match_rules(model.graph, RuleSet((RULE,))).kept, native=True)
    assert "not concat(t, t)" in applied.error
