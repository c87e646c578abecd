"""Residual Add followed by Relu (the end of every ResNet block):

    y = Relu(a + b)          a, b both computed tensors (not a constant bias)

No onnxruntime contrib kernel takes this pair alone, so it stays in the generic form.
"""

from __future__ import annotations

from graph_autofusion.ir.core import Value
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rules import FusionRule


def _computed(v: Value) -> str | None:
    if const_value(v) is not None:
        return f"%{v.name} is a constant (a bias add, not a residual)"
    return None


_p = PatternBuilder()

RULE = FusionRule(
    "add_relu",
    pattern=_p.Relu(_p.Add(_p.var("a", check=_computed), _p.var("b", check=_computed))),
    fuse_pattern="AddRelu",
    priority=95,
    presets=("cnn",),
    doc=__doc__.strip().splitlines()[0],
)
