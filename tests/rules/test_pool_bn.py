"""pool_bn: MaxPool | AveragePool | GlobalAveragePool -> BatchNormalization (generic form)."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.pool_bn import RULE
from graph_autofusion.patterns.matcher import Reason
from graph_autofusion.testing.rules import check_no_match, check_rule

GRAPH = """
graph g(%x: f32[2,4,8,8]) -> ({outs}) {{
  init %g: f32[4] = [0.5, 1.5, -1.0, 2.0]
  init %beta: f32[4] = [0.1, -0.2, 0.3, 0.0]
  init %mean: f32[4] = [0.2, -0.1, 0.5, 0.0]
  init %var: f32[4] = [0.5, 1.0, 1.5, 2.0]
  %p = {pool}(%x)
  %y = BatchNormalization{bn_attrs}(%p, %g, %beta, %mean, %var)
}}
"""
POOLS = {
    "MaxPool": "MaxPool<kernel_shape=[2, 2], strides=[2, 2]>",
    "AveragePool": "AveragePool<kernel_shape=[3, 3], pads=[1, 1, 1, 1]>",
    "GlobalAveragePool": "GlobalAveragePool",
}


def graph(pool: str, *, bn_attrs: str = "", outs: str = "%y") -> str:
    return GRAPH.format(pool=POOLS[pool], bn_attrs=bn_attrs, outs=outs)


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_every_variant_matches_and_rewrites(pool):
    check_rule(RULE, graph(pool), matches=1, ops_after=["graph_autofusion.fused::PoolBatchNorm"])


def test_pool_output_read_elsewhere_blocks_the_match():
    check_no_match(RULE, graph("MaxPool", outs="%y, %p"), reason=Reason.EXTERNAL_USER)


def test_training_batchnorm_is_rejected():
    check_no_match(
        RULE, graph("MaxPool", bn_attrs="<training_mode=1>"), reason=Reason.ATTR_MISMATCH
    )


def test_lp_pool_is_not_this_rule():
    text = graph("MaxPool").replace(POOLS["MaxPool"], "LpPool<kernel_shape=[2, 2]>")
    check_no_match(RULE, text, reason=Reason.OP_MISMATCH)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
def test_zoo_resnet_pools_feed_convolutions(source):
    from graph_autofusion.testing.rules import zoo_matches

    # ResNet's MaxPool feeds Convs and its global pool feeds the classifier: no Pool -> BN
    assert zoo_matches(RULE, "resnet50_bn", source) == 0
