"""SwiGLU (the Llama MLP's gated activation):

    y = silu(x @ W_gate) * (x @ W_up)        silu(g) = g * sigmoid(g)

Spelled ``Mul(Mul(g, Sigmoid(g)), u)`` with operands in either order. When ``g`` and ``u``
are both ``MatMul`` outputs of the same ``x`` (the gate and up projections), the match takes
them in too, so the fused operator is the whole gated projection; otherwise it is the
elementwise part alone (any ``g`` and ``u``). Generic form only: onnxruntime has no
single operator for either.
"""

from __future__ import annotations

from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule


def _swiglu(p: PatternBuilder, g: Pattern, u: Pattern) -> Pattern:
    return p.Mul(p.Mul(g, p.Sigmoid(g, _label="sigmoid"), _label="silu"), u, _label="gate_mul")


_p = PatternBuilder()
_x = _p.var("x")
PATTERN = _swiglu(
    _p,
    _p.MatMul(_x, _p.var("w_gate"), _label="gate"),
    _p.MatMul(_x, _p.var("w_up"), _label="up"),
) | _swiglu(_p, _p.var("g"), _p.var("u"))

RULE = FusionRule(
    "swiglu",
    pattern=PATTERN,
    fuse_pattern="SwiGLU",
    priority=135,
    presets=("llm",),
    doc=__doc__.strip().splitlines()[0],
)
