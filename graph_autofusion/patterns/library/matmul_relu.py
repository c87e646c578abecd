"""MatMul followed by Relu, no bias:

    y = relu(x @ W)

Generic form only: onnxruntime's ``FusedMatMul`` has no activation, and ``FusedGemm`` needs
2-D operands and is the ``gemm_activation`` rule's business.
"""

from __future__ import annotations

from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rules import FusionRule

_p = PatternBuilder()

RULE = FusionRule(
    "matmul_relu",
    pattern=_p.Relu(_p.MatMul(_p.var("x"), _p.var("w"), _label="matmul"), _label="act"),
    fuse_pattern="MatMulRelu",
    priority=120,
    presets=("transformer", "cnn"),
    doc=__doc__.strip().splitlines()[0],
)
