"""softmax_dropout: Softmax -> inference Dropout; native form is the Softmax alone."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.softmax_dropout import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,4,8,8]) -> ({outs}) {{
  init %ratio: f32[] = [0.1]
  init %train: bool[] = [{train}]
  %s = Softmax<axis=-1>(%x)
  {drop_outs} = Dropout({drop_args})
}}
"""
VARIANTS = {
    "no_inputs": ("%s", "%y"),
    "ratio": ("%s, %ratio", "%y"),
    "ratio_and_false_mode": ("%s, %ratio, %train", "%y"),
    "unread_mask": ("%s, %ratio", "%y, %mask"),
}


def graph(variant="ratio_and_false_mode", train=0, outs="%y"):
    args, drop_outs = VARIANTS[variant]
    return GRAPH.format(drop_args=args, drop_outs=drop_outs, train=train, outs=outs)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(variant, native):
    ops = ["Softmax"] if native else ["graph_autofusion.fused::Softmax"]
    check_rule(RULE, graph(variant), matches=1, ops_after=ops, native=native)


def test_training_mode_is_rejected():
    check_no_match(RULE, graph(train=1), reason=Reason.CHECK_FAILED)


def test_read_mask_is_rejected():
    check_no_match(RULE, graph("unread_mask", outs="%y, %mask"), reason=Reason.CHECK_FAILED)


def test_softmax_with_another_reader_is_rejected():
    check_no_match(RULE, graph(outs="%y, %s"), reason=Reason.EXTERNAL_USER)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "source"),
    [(m, s) for m in ("bert", "gpt2", "llama") for s in ("dynamo", "torchscript", "torch")],
)
def test_zoo_models(model, source):
    """Exporters drop inference-mode Dropout, so no zoo model has one."""
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == 0
