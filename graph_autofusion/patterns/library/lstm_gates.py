"""The elementwise gate math of an LSTM cell written out (custom RNN code, one timestep):

    i, f, g, o = chunk(gates, 4)                  gates = x W + h U + b
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')

The fused operator outputs ``h'`` and ``c'`` (both are read by the next timestep). The four
pieces must come from one ``Split`` or from ``Slice`` nodes of one tensor (see
``_rnn_common``); the Split and the projections stay outside. ``nn.LSTM`` exports as one ONNX
``LSTM`` operator instead and does not match. Generic form only (no onnxruntime kernel takes
the gate math alone).
"""

from __future__ import annotations

from graph_autofusion.patterns.library._rnn_common import same_chunked_tensor
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule


def lstm_gates_pattern(p: PatternBuilder) -> Pattern:
    """``h' = Sigmoid(o) * Tanh(c')`` with ``c' = Sigmoid(f) * c + Sigmoid(i) * Tanh(g)``."""
    i = p.Sigmoid(p.var("i"))
    f = p.Sigmoid(p.var("f"))
    g = p.Tanh(p.var("g"))
    o = p.Sigmoid(p.var("o"))
    c_new = p.Add(p.Mul(f, p.var("c")), p.Mul(i, g), _label="c_new")
    return p.Mul(o, p.Tanh(c_new), _label="h_new")


def gates_from_one_chunk(ctx: MatchContext) -> str | None:
    """Check: i, f, g, o are four distinct pieces of one gates tensor."""
    return same_chunked_tensor([ctx.values[k] for k in "ifgo"], "gate pre-activations")


_p = PatternBuilder()

RULE = FusionRule(
    "lstm_gates",
    pattern=lstm_gates_pattern(_p),
    fuse_pattern="LSTMCellGates",
    priority=160,
    presets=("rnn",),
    checks=(gates_from_one_chunk,),
    exported=("c_new",),
    doc=__doc__.strip().splitlines()[0],
)
