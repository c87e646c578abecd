"""Pooling followed by an inference BatchNormalization:

    y = (Pool(x) - mean) * gamma / sqrt(var + eps) + beta
    Pool in MaxPool, AveragePool, GlobalAveragePool

No onnxruntime kernel runs this fused, so it stays in the generic (local-function) form.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._conv_common import batch_norm, bn_single_output
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rules import FusionRule

POOLS = ("MaxPool", "AveragePool", "GlobalAveragePool")

_p = PatternBuilder()

RULE = FusionRule(
    "pool_bn",
    pattern=batch_norm(_p, _p.op(*POOLS)(_p.var("x"), _label="pool")),
    fuse_pattern="PoolBatchNorm",
    priority=100,
    presets=("cnn",),
    checks=(bn_single_output,),
    doc=__doc__.strip().splitlines()[0],
)
