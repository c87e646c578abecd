"""reshape_transpose_chain: 2-3 consecutive layout ops; Transposes compose, reshapes merge."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.candidates import apply_matches, match_rules
from graph_autofusion.patterns.library.reshape_transpose_chain import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.testing.rules import check_no_match, check_rule

HEAD = """
graph g(%x: f32[2,3,4,5]) -> ({outs}) {{
  init %s1: i64[3] = [6, 4, 5]
  init %s2: i64[2] = [-1, 5]
  init %s0: i64[2] = [0, -1]
  init %ax0: i64[1] = [0]
  init %ax1: i64[1] = [1]
  {body}
}}
"""
GENERIC = "graph_autofusion.fused::LayoutChain"
# name: (body, native ops after, expected attribute check)
CHAINS = {
    "transpose_transpose": (
        "%t = Transpose<perm=[0, 2, 1, 3]>(%x)\n  %y = Transpose<perm=[3, 1, 0, 2]>(%t)",
        ["Transpose"],
        [3, 2, 0, 1],
    ),
    "transpose_default_perm": (
        "%t = Transpose(%x)\n  %y = Transpose<perm=[0, 2, 1, 3]>(%t)",
        ["Transpose"],
        [3, 1, 2, 0],
    ),
    "three_transposes": (
        "%t = Transpose<perm=[1, 0, 2, 3]>(%x)\n  %u = Transpose<perm=[0, 1, 3, 2]>(%t)\n"
        "  %y = Transpose<perm=[2, 3, 0, 1]>(%u)",
        ["Transpose"],
        [3, 2, 1, 0],
    ),
    "reshape_reshape": ("%t = Reshape(%x, %s1)\n  %y = Reshape(%t, %s2)", ["Reshape"], None),
    "reshape_reshape_static": (
        "%t = Reshape(%x, %s1)\n  %y: f32[24,5] = Reshape(%t, %s2)",
        ["Reshape"],
        None,
    ),
    "reshape_reshape_copies_a_dim": (  # 0 copies a dim of the intermediate: not foldable
        "%t = Reshape(%x, %s1)\n  %y = Reshape(%t, %s0)",
        [GENERIC],
        None,
    ),
    "unsqueeze_squeeze_flatten": (
        "%t = Unsqueeze(%x, %ax0)\n  %u = Squeeze(%t, %ax0)\n  %y: f32[6,20] = Flatten<axis=2>(%u)",
        ["Reshape"],
        None,
    ),
    "reshape_transpose": (  # mixed: generic form
        "%t = Reshape(%x, %s1)\n  %y = Transpose<perm=[2, 0, 1]>(%t)",
        [GENERIC],
        None,
    ),
    "transpose_flatten": (
        "%t = Transpose<perm=[0, 2, 1, 3]>(%x)\n  %y = Flatten(%t)",
        [GENERIC],
        None,
    ),
}


def graph(name: str, outs: str = "%y") -> str:
    return HEAD.format(body=CHAINS[name][0], outs=outs)


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(name, native):
    _, ops, perm = CHAINS[name]
    if native and ops == [GENERIC]:  # not foldable: the native rewrite declines
        model = parse_model(graph(name))
        report = match_rules(model.graph, RuleSet((RULE,)))
        (applied,) = apply_matches(model, report.kept, native=True)
        assert "does not fold into one layout operator" in applied.error
        (applied,) = apply_matches(
            model := parse_model(graph(name)),
            match_rules(model.graph, RuleSet((RULE,))).kept,
            fallback_generic=True,
        )
        assert [n.qualified_op for n in model.graph.nodes] == [GENERIC]
        return
    model = check_rule(
        RULE, graph(name), matches=1, ops_after=ops if native else [GENERIC], native=native
    )
    if native and perm is not None:
        assert list(model.graph.nodes[0].attrs["perm"]) == perm


def test_intermediate_read_elsewhere_blocks_the_match():
    from graph_autofusion.ir.text import parse_model

    text = graph("transpose_transpose", outs="%y, %t")
    # The reported reason is the three-op alternative's (it fails at the same depth as the
    # closure check of the two-op one), so only the absence of a match is asserted here.
    check_no_match(RULE, text)
    model = parse_model(text)
    assert not RULE.match(model.graph)[0]
    assert RULE.match(parse_model(graph("transpose_transpose")).graph)[0]


def test_single_layout_op_on_an_input_is_not_a_chain():
    text = HEAD.format(body="%y = Transpose(%x)", outs="%y")
    check_no_match(RULE, text, reason=Reason.NO_PRODUCER)


def test_single_layout_op_after_compute_is_not_a_chain():
    text = HEAD.format(body="%t = Relu(%x)\n  %y = Transpose(%t)", outs="%y")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


def test_longer_chains_are_bounded_to_three_ops():
    body = (
        "%a = Transpose<perm=[1, 0, 2, 3]>(%x)\n  %b = Transpose<perm=[1, 0, 2, 3]>(%a)\n"
        "  %c = Transpose<perm=[0, 1, 3, 2]>(%b)\n  %d = Transpose<perm=[0, 1, 3, 2]>(%c)\n"
        "  %y = Transpose<perm=[0, 2, 1, 3]>(%d)"
    )
    text = HEAD.format(body=body, outs="%y")
    # every root matches (overlapping); overlap resolution keeps the first three-op chain
    check_rule(RULE, text, matches=1, ops_after=["Transpose"] * 3, native=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source", "count"),
    [
        # Reshape->Transpose (Q/K/V head split), Transpose->Reshape (head merge), masks
        ("bert", "dynamo", 61),
        ("bert", "torchscript", 52),
        ("bert", "torch", 48),
        ("llama", "dynamo", 21),
        ("llama", "torch", 16),
        ("resnet50", "dynamo", 0),
        ("resnet50", "torch", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
