"""The elementwise gate math of a GRU cell written out (PyTorch's equations, one timestep):

    xr, xz, xn = chunk(x W + b_x, 3);   hr, hz, hn = chunk(h U + b_h, 3)
    r = sigmoid(xr + hr);   z = sigmoid(xz + hz);   n = tanh(xn + r * hn)
    h' = (1 - z) * n + z * h          (also written h' = n + z * (h - n))

The input-side pieces must come from one Split / Slice group and the hidden-side pieces from
another (see ``_rnn_common``). ``nn.GRU`` exports as one ONNX ``GRU`` operator and does not
match. Generic form only.
"""

from __future__ import annotations

from graph_autofusion.patterns.library._rnn_common import chunk_source, same_chunked_tensor
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule


def gru_gates_pattern(p: PatternBuilder) -> Pattern:
    """``h'`` from the pieces ``xr, hr, xz, hz, xn, hn`` and the previous state ``h``."""
    r = p.Sigmoid(p.Add(p.var("xr"), p.var("hr")))
    z = p.Sigmoid(p.Add(p.var("xz"), p.var("hz")))
    n = p.Tanh(p.Add(p.var("xn"), p.Mul(r, p.var("hn"))))
    h = p.var("h")
    one = p.const("one", scalar=True, value=1.0)
    lerp = p.Add(p.Mul(p.Sub(one, z), n), p.Mul(z, h))
    update = p.Add(n, p.Mul(z, p.Sub(h, n)))
    return lerp | update


def pieces_from_two_chunks(ctx: MatchContext) -> str | None:
    """Check: the x-side and h-side pieces are each one chunked tensor.

    ``xn`` and ``hn`` are told apart by the pattern; the Adds of the r and z gates commute,
    so their operands are sorted by which chunk they come from.
    """
    v = ctx.values
    xs, hs = [v["xn"]], [v["hn"]]
    x_src, h_src = chunk_source(v["xn"]), chunk_source(v["hn"])
    for a, b in ((v["xr"], v["hr"]), (v["xz"], v["hz"])):
        if chunk_source(a) == h_src and chunk_source(b) == x_src:
            a, b = b, a
        xs.append(a)
        hs.append(b)
    return same_chunked_tensor(xs, "input-side pieces") or same_chunked_tensor(
        hs, "hidden-side pieces"
    )


_p = PatternBuilder()

RULE = FusionRule(
    "gru_gates",
    pattern=gru_gates_pattern(_p),
    fuse_pattern="GRUCellGates",
    priority=158,
    presets=("rnn",),
    checks=(pieces_from_two_chunks,),
    doc=__doc__.strip().splitlines()[0],
)
