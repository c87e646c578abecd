"""attention: every exporter's spelling of scaled dot-product attention matches; near misses
do not; the generic rewrite keeps the numbers."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.attention import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.rules import check_no_match, check_rule

FUSED = "graph_autofusion.fused::Attention"

HEAD = (
    "graph g(%q: f32[1,2,4,8], %k: f32[1,2,4,8], %v: f32[1,2,4,8], %mask: f32[1,1,4,4], "
    "%cond: bool[1,1,4,4]) -> (%y) {"
)
INITS = """
  init %c: f32[] = [2.8284271]
  init %inv: f32[] = [0.35355339]
  init %qc: f32[] = [0.4204482]
  init %kc: f32[] = [0.4204482]
  init %fill: f32[] = [-10000.0]
  init %zero: f32[] = [0.0]
"""

#: Each variant: the graph body (reading %q, %k, %v, %mask, %cond; writing %y), and the
#: operators left around the fused node.
VARIANTS = {
    # TorchScript-era BERT: Transpose(K), Div(sqrt d), Add(mask)
    "bert_div": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %s = MatMul(%q, %kt)
  %t = Div(%s, %c)
  %m = Add(%t, %mask)
  %p = Softmax<axis=-1>(%m)
  %y = MatMul(%p, %v)
""",
        [FUSED],
    ),
    # our torch frontend: Mul(1/sqrt d), the NaN guard after the value MatMul
    "torch_frontend": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %s = MatMul(%q, %kt)
  %t = Mul(%s, %inv)
  %m = Add(%t, %mask)
  %p = Softmax<axis=-1>(%m)
  %o = MatMul(%p, %v)
  %n = IsNaN(%o)
  %y = Where(%n, %zero, %o)
""",
        [FUSED],
    ),
    # dynamo / TorchScript SDPA: q and kT scaled separately, the NaN guard on the probabilities
    "sdpa_export": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %qs = Mul(%q, %qc)
  %ks = Mul(%kt, %kc)
  %s = MatMul(%qs, %ks)
  %m = Add(%s, %mask)
  %p = Softmax<axis=-1>(%m)
  %n = IsNaN(%p)
  %g = Where(%n, %zero, %p)
  %y = MatMul(%g, %v)
""",
        [FUSED],
    ),
    # kT produced outside (a Reshape, as dynamo does): bound at the MatMul input
    "kt_from_reshape": (
        """
  init %shape: i64[4] = [1, 2, 8, 4]
  %kt: f32[1,2,8,4] = Reshape(%k, %shape)
  %qs = Mul(%qc, %q)
  %ks = Mul(%kc, %kt)
  %s = MatMul(%qs, %ks)
  %m = Add(%mask, %s)
  %p = Softmax<axis=-1>(%m)
  %y = MatMul(%p, %v)
""",
        ["Reshape", FUSED],
    ),
    # GPT-2: causal mask as Where(cond, scores, fill)
    "causal_where": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %s = MatMul(%q, %kt)
  %t = Div(%s, %c)
  %w = Where(%cond, %t, %fill)
  %p = Softmax<axis=-1>(%w)
  %y = MatMul(%p, %v)
""",
        [FUSED],
    ),
    # older GPT-2: causal Where, then the padding mask added
    "causal_where_then_add": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %s = MatMul(%q, %kt)
  %t = Div(%s, %c)
  %w = Where(%cond, %t, %fill)
  %m = Add(%w, %mask)
  %p = Softmax<axis=3>(%m)
  %y = MatMul(%p, %v)
""",
        [FUSED],
    ),
    # no mask at all
    "unmasked": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %s = MatMul(%q, %kt)
  %t = Mul(%inv, %s)
  %p = Softmax<axis=-1>(%t)
  %y = MatMul(%p, %v)
""",
        [FUSED],
    ),
    # scale folded into the weights: no scale operator
    "unscaled": (
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %s = MatMul(%q, %kt)
  %m = Add(%s, %mask)
  %p = Softmax<axis=-1>(%m)
  %y = MatMul(%p, %v)
""",
        [FUSED],
    ),
    # the Transpose of K is also read elsewhere: it stays outside, kT is bound instead
    "shared_k_transpose": (  # %r is a second graph output (see _text)
        """
  %kt = Transpose<perm=[0, 1, 3, 2]>(%k)
  %r = Relu(%kt)
  %s = MatMul(%q, %kt)
  %t = Div(%s, %c)
  %m = Add(%t, %mask)
  %p = Softmax<axis=-1>(%m)
  %y = MatMul(%p, %v)
""",
        ["Transpose", "Relu", FUSED],
    ),
}


def _text(body: str) -> str:
    head = HEAD.replace("-> (%y)", "-> (%y, %r)") if "%r = " in body else HEAD
    return head + INITS + body + "}\n"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_matches_and_rewrites(variant):
    body, ops = VARIANTS[variant]
    check_rule(RULE, _text(body), matches=1, ops_after=ops)


def test_the_k_transpose_moves_into_the_fused_operator():
    model = check_rule(RULE, _text(VARIANTS["bert_div"][0]), matches=1, ops_after=[FUSED])
    (node,) = model.graph.nodes
    assert sorted(v.name for v in node.inputs) == ["c", "k", "mask", "q", "v"]


def test_softmax_over_another_axis_is_rejected():
    body = VARIANTS["bert_div"][0].replace("Softmax<axis=-1>", "Softmax<axis=2>")
    check_no_match(RULE, _text(body), reason=Reason.CHECK_FAILED)


def test_probabilities_read_elsewhere_block_the_match():
    text = _text(VARIANTS["bert_div"][0]).replace("-> (%y)", "-> (%y, %p)")
    check_no_match(RULE, text, reason=Reason.EXTERNAL_USER)


def test_a_non_softmax_normalization_is_not_attention():
    body = VARIANTS["bert_div"][0].replace("Softmax<axis=-1>", "LogSoftmax<axis=-1>")
    check_no_match(RULE, _text(body))


def test_a_guard_that_does_not_test_for_nan_is_not_absorbed():
    # Where(IsInf(o), 0, o) is not the NaN guard: attention matches, the Where stays outside
    body = VARIANTS["torch_frontend"][0].replace("IsNaN(%o)", "IsInf(%o)")
    check_rule(RULE, _text(body), matches=1, ops_after=[FUSED, "IsInf", "Where"])


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
@pytest.mark.parametrize(
    ("model", "count"),
    [
        ("bert", 12),
        ("minilm", 6),
        ("gpt2", 12),
        ("llama", 4),
        ("llama_gqa", 4),  # K and V through repeat_kv (Unsqueeze/Expand/Reshape), outside
        ("resnet50", 0),
        ("lstm", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count


# ------------------------------------------------------------------ native form (opset 23)
def _ort_matches_reference(original, model, seed=0):
    pytest.importorskip("onnxruntime")
    import numpy as np

    from graph_autofusion.runtime.interpreter import run_model
    from graph_autofusion.testing.rules import random_feeds

    feeds = random_feeds(original.graph, seed)
    want = run_model(original, feeds)
    sess = ort_session(model, "all")
    names = [o.name for o in sess.get_outputs()]
    for name, got in zip(names, sess.run(None, feeds)):
        np.testing.assert_allclose(got, want[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_lowers_to_the_opset_23_operator(variant):
    from graph_autofusion.ir.text import parse_model

    text = _text(VARIANTS[variant][0])
    model = check_rule(RULE, text, matches=1, native=True, rtol=1e-4)
    ops = [n.op_type for n in model.graph.nodes]
    assert ops.count("Attention") == 1 and "Softmax" not in ops, ops
    assert model.opset_imports[""] == 23
    (att,) = [n for n in model.graph.nodes if n.op_type == "Attention"]
    masked = "mask" in VARIANTS[variant][0] or "cond" in VARIANTS[variant][0]
    assert len(att.inputs) == (4 if masked else 3)
    _ort_matches_reference(parse_model(text), model)


def test_native_scale_is_the_product_of_the_matched_scales():
    model = check_rule(RULE, _text(VARIANTS["sdpa_export"][0]), matches=1, native=True)
    (att,) = [n for n in model.graph.nodes if n.op_type == "Attention"]
    assert att.attrs["scale"] == pytest.approx(0.4204482**2)
    model = check_rule(RULE, _text(VARIANTS["bert_div"][0]), matches=1, native=True)
    (att,) = [n for n in model.graph.nodes if n.op_type == "Attention"]
    assert att.attrs["scale"] == pytest.approx(1 / 2.8284271)


@pytest.mark.parametrize("mask_shape", ["2,1,1,4", "1,4", "2,1,3,4"])
def test_a_mask_with_one_row_for_every_query_gets_a_row_per_query(mask_shape):
    """onnxruntime's Attention kernel wants the mask's second-to-last dim to be the query
    length: a mask of one row for all queries (a key-padding mask ``[B, 1, 1, S]``, or a 2-D
    ``[1, S]``) is expanded; onnxruntime refused the fused model before."""
    from graph_autofusion.ir.text import parse_model

    text = (
        f"graph g(%q: f32[2,2,3,8], %k: f32[2,2,4,8], %v: f32[2,2,4,8], %mask: f32[{mask_shape}])"
        " -> (%y) {" + INITS + VARIANTS["bert_div"][0] + "}\n"
    )
    model = check_rule(RULE, text, matches=1, native=True, rtol=1e-4)
    (att,) = [n for n in model.graph.nodes if n.op_type == "Attention"]
    expanded = att.inputs[3].producer is not None and att.inputs[3].producer.op_type == "Expand"
    assert expanded == (mask_shape != "2,1,3,4"), [n.op_type for n in model.graph.nodes]
    _ort_matches_reference(parse_model(text), model)


GQA = """graph g(%q: f32[1,4,3,8], %k0: f32[1,2,5,8], %v0: f32[1,2,5,8], %mask: f32[1,1,3,5]) -> (%y) {
  init %ax: i64[1] = [2]
  init %wide: i64[5] = [1, 2, 2, 5, 8]
  init %flat: i64[4] = [1, 4, 5, 8]
  init %flat3: i64[3] = [4, 5, 8]
  init %back: i64[4] = [1, 4, 8, 5]
  init %qc: f32[] = [0.4204482]
  init %zero: f32[] = [0.0]
  %ku: f32[1,2,1,5,8] = Unsqueeze(%k0, %ax)
  %ke: f32[1,2,2,5,8] = Expand(%ku, %wide)
  %k: f32[1,4,5,8] = Reshape(%ke, %flat)
  %vu: f32[1,2,1,5,8] = Unsqueeze(%v0, %ax)
  %ve: f32[1,2,2,5,8] = Expand(%vu, %wide)
  %v: f32[1,4,5,8] = Reshape(%ve, %flat)
  %k3: f32[4,5,8] = Reshape(%k, %flat3)
  %kt3: f32[4,8,5] = Transpose<perm=[0, 2, 1]>(%k3)
  %kt: f32[1,4,8,5] = Reshape(%kt3, %back)
  %qs = Mul(%q, %qc)
  %ks = Mul(%kt, %qc)
  %s = MatMul(%qs, %ks)
  %m = Add(%s, %mask)
  %p = Softmax<axis=-1>(%m)
  %n = IsNaN(%p)
  %g = Where(%n, %zero, %p)
  %y = MatMul(%g, %v)
}
"""


def test_grouped_query_repeat_and_the_dynamo_transpose_chain_are_not_computed():
    """dynamo's GQA export: repeat_kv on K and V, kT through Reshape/Transpose/Reshape. The
    lowering reads the un-repeated K/V (2 heads for 4 query heads); the rest is dead."""
    from graph_autofusion.codegen.onnxruntime import prune_dead_feeders
    from graph_autofusion.ir.text import parse_model

    model = check_rule(RULE, GQA, matches=1, native=True, rtol=1e-4)
    prune_dead_feeders(model, [v for v in model.graph.values() if v.producer is not None])
    (att,) = [n for n in model.graph.nodes if n.op_type == "Attention"]
    assert [v.name for v in att.inputs[:3]] == ["q", "k0", "v0"]
    # the run-time mask, its float32 lowest value passed as the finite fill (Equal, Where):
    # nothing else is left
    fill = att.inputs[3].producer
    assert fill.op_type == "Where" and fill.inputs[2].name == "mask"
    assert sorted(n.op_type for n in model.graph.nodes) == ["Attention", "Equal", "Where"]
    _ort_matches_reference(parse_model(GQA), model)


GQA_SYMBOLIC = """graph g(%q: f32[1,4,3,8], %k0: f32[1,2,t,8], %v0: f32[1,2,t,8], %mask: f32[1,1,3,t]) -> (%y) {
  init %ax: i64[1] = [2]
  init %rep: i64[1] = [2]
  init %z: i64[1] = [0]
  init %one: i64[1] = [1]
  init %two: i64[1] = [2]
  init %three: i64[1] = [3]
  init %four: i64[1] = [4]
  init %heads: i64[1] = [4]
  init %qc: f32[] = [0.4204482]
  %s0: i64[4] = Shape(%k0)
  %b: i64[1] = Slice(%s0, %z, %one)
  %kvn: i64[1] = Slice(%s0, %one, %two)
  %tl: i64[1] = Slice(%s0, %two, %three)
  %hd: i64[1] = Slice(%s0, %three, %four)
  %wide: i64[5] = Concat<axis=0>(%b, %kvn, %rep, %tl, %hd)
  %flat: i64[4] = Concat<axis=0>(%b, %heads, %tl, %hd)
  %tiled: i64[5] = Concat<axis=0>(%rep, %kvn, %one, %tl, %hd)
  %ku: f32[1,2,1,t,8] = Unsqueeze(%k0, %ax)
  %ke = Expand(%ku, %wide)
  %k: f32[1,4,t,8] = Reshape(%ke, %flat)
  %vu: f32[1,2,1,t,8] = Unsqueeze(%v0, %ax)
  %ve = Expand(%vu, %wide)
  %v: f32[1,4,t,8] = Reshape(%ve, %flat)
  %kt: f32[1,4,8,t] = Transpose<perm=[0, 1, 3, 2]>(%k)
  %qs = Mul(%q, %qc)
  %s = MatMul(%qs, %kt)
  %m = Add(%s, %mask)
  %p = Softmax<axis=-1>(%m)
  %y = MatMul(%p, %v)
}
"""


def test_grouped_query_repeat_to_a_computed_shape_is_not_computed():
    """The PyTorch route's repeat_kv expands to a shape computed from Dynamo's symbolic
    lengths, so the Expand's output has no known shape: the repeat is read from its two ends
    (the cache's heads; the merged heads; batch, length and head size kept)."""
    from graph_autofusion.codegen.onnxruntime import prune_dead_feeders
    from graph_autofusion.ir.text import parse_model

    text = GQA_SYMBOLIC.replace(",t,", ",5,").replace(",t]", ",5]").replace("8,t]", "8,5]")
    model = check_rule(RULE, text, matches=1, native=True, rtol=1e-4)
    prune_dead_feeders(model, [v for v in model.graph.values() if v.producer is not None])
    (att,) = [n for n in model.graph.nodes if n.op_type == "Attention"]
    assert [v.name for v in att.inputs[1:3]] == ["k0", "v0"], [v.name for v in att.inputs]
    assert not [n for n in model.graph.nodes if n.op_type in ("Expand", "Reshape")]
    _ort_matches_reference(parse_model(text), model)


@pytest.mark.parametrize(
    "change, repeated",
    [
        ((), True),  # symbolic length on both ends
        (("f32[1,4,t,8] = Reshape", "f32[1,3,t,8] = Reshape"), False),  # 3 heads over 2
        (("f32[1,4,t,8] = Reshape", "f32[2,4,t,8] = Reshape"), False),  # the batch grew
        (("f32[1,4,t,8] = Reshape", "f32[1,4,u,8] = Reshape"), False),  # another length
        # a batch of 1 grown to 2 and merged into the heads: tiled, not repeated in place
        (("Expand(%ku, %wide)", "Expand(%ku, %tiled)"), False),
        (("Expand(%ku, %wide)", "Expand(%ku, %s0)"), False),  # a shape of 4 entries
    ],
)
def test_a_repeat_of_unknown_expanded_shape_is_judged_by_its_ends(change, repeated):
    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.patterns.library._attention_native import unrepeated

    text = GQA_SYMBOLIC.replace(*change, 1) if change else GQA_SYMBOLIC  # K only
    values = parse_model(text).graph.value_map()
    assert (unrepeated(values["k"]) is values["k0"]) == repeated
    assert unrepeated(values["v"]) is values["v0"]


def test_old_opsets_and_changed_operators_keep_the_generic_form():
    from graph_autofusion.patterns.candidates import apply_matches, match_rules
    from graph_autofusion.patterns.rules import RuleSet

    text = _text(VARIANTS["bert_div"][0])
    for header, why in (
        ('model opset {"": 17}\n', "below 18"),
        ("", "GroupNormalization"),
    ):
        body = text
        if not header:  # an opset-18 GroupNormalization (its scale changed meaning at 21)
            body = (
                text.replace(
                    "%y = MatMul(%p, %v)",
                    "%y = MatMul(%p, %v)\n  %gn = GroupNormalization<num_groups=1>(%q, %c1, %c1)",
                )
                .replace("-> (%y)", "-> (%y, %gn)")
                .replace("init %c:", "init %c1: f32[1] = [1.0]\n  init %c:")
            )
            header = 'model opset {"": 18}\n'
        from graph_autofusion.ir.text import parse_model

        model = parse_model(header + body)
        report = match_rules(model.graph, RuleSet((RULE,)))
        (applied,) = apply_matches(model, report.kept, native=True)
        assert why in applied.error, applied.error
        assert model.opset_imports[""] in (17, 18)
