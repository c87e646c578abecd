"""Recurrent layers LSTM, GRU and RNN with ONNX gate orders, directions and sequence_lens.

LSTM gates are stored in the order i, o, f, c (peepholes i, o, f); GRU gates z, r, h.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graph_autofusion.catalog.definitions._util import attr_str, shape_of, upcast
from graph_autofusion.catalog.definitions.elementwise import sigmoid
from graph_autofusion.catalog.registry import FusionKind, OpContext, op
from graph_autofusion.ir.core import Node

Act = Callable[[np.ndarray], np.ndarray]


def _activation(name: str, alpha: float | None, beta: float | None) -> Act:
    n = name.lower()
    if n == "sigmoid":
        return sigmoid
    if n == "tanh":
        return np.tanh
    if n == "relu":
        return lambda x: np.maximum(x, 0)
    if n == "affine":
        return lambda x: (alpha if alpha is not None else 1.0) * x + (beta or 0.0)
    if n == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * x)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x > a, x, 0)
    if n == "scaledtanh":
        return lambda x: (alpha or 1.0) * np.tanh((beta or 1.0) * x)
    if n == "hardsigmoid":
        a = 0.2 if alpha is None else alpha
        b = 0.5 if beta is None else beta
        return lambda x: np.clip(a * x + b, 0, 1)
    if n == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x > 0, x, a * np.expm1(np.minimum(x, 0)))
    if n == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if n == "softplus":
        return lambda x: np.logaddexp(x, 0)
    raise NotImplementedError(f"RNN activation {name!r} is not supported")


def _activations(ctx: OpContext, defaults: list[str], num_dir: int) -> list[list[Act]]:
    names = ctx.attr("activations", None)
    names = [n.decode() if isinstance(n, bytes) else n for n in names] if names else None
    if not names:
        names = defaults * num_dir
    elif len(names) == len(defaults) and num_dir == 2:
        names = names * 2
    alphas = list(ctx.attr("activation_alpha", []) or [])
    betas = list(ctx.attr("activation_beta", []) or [])
    acts = []
    for i, nm in enumerate(names):
        acts.append(
            _activation(
                nm,
                float(alphas[i]) if i < len(alphas) else None,
                float(betas[i]) if i < len(betas) else None,
            )
        )
    k = len(defaults)
    return [acts[d * k : (d + 1) * k] for d in range(num_dir)]


def _run(
    kind: str,
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    seq_lens: np.ndarray | None,
    h0: np.ndarray | None,
    c0: np.ndarray | None = None,
    p: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    layout = int(ctx.attr("layout", 0))
    if layout:
        x = x.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    seq, batch, _ = x.shape
    num_dir, gh, _ = w.shape
    hidden = r.shape[-1]
    direction = attr_str(ctx, "direction", "forward")
    clip = ctx.attr("clip", None)
    defaults = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
    acts = _activations(ctx, defaults[kind], num_dir)
    lens = np.full(batch, seq, dtype=np.int64) if seq_lens is None else seq_lens.astype(np.int64)
    dt = x.dtype
    y = np.zeros((seq, num_dir, batch, hidden), dtype=dt)
    y_h = np.zeros((num_dir, batch, hidden), dtype=dt)
    y_c = np.zeros((num_dir, batch, hidden), dtype=dt)
    for d in range(num_dir):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        bias = np.zeros(2 * gh, dtype=dt) if b is None else b[d]
        wb, rb = bias[:gh], bias[gh:]
        xw = x @ w[d].T + wb  # (seq, batch, gates * hidden)
        h = np.zeros((batch, hidden), dtype=dt) if h0 is None else h0[d].astype(dt)
        c = np.zeros((batch, hidden), dtype=dt) if c0 is None else c0[d].astype(dt)
        f_act, g_act = acts[d][0], acts[d][min(1, len(acts[d]) - 1)]
        for t in range(seq - 1, -1, -1) if reverse else range(seq):
            active = (t < lens)[:, None]
            if kind == "GRU":
                gx = xw[t]
                rz = h @ r[d, : 2 * hidden].T + rb[: 2 * hidden]
                pre_z, pre_r = (
                    gx[:, :hidden] + rz[:, :hidden],
                    gx[:, hidden : 2 * hidden] + rz[:, hidden:],
                )
                if clip is not None:
                    pre_z, pre_r = np.clip(pre_z, -clip, clip), np.clip(pre_r, -clip, clip)
                z, rr = f_act(pre_z), f_act(pre_r)
                rh, rbh = r[d, 2 * hidden :], rb[2 * hidden :]
                if int(ctx.attr("linear_before_reset", 0)):
                    pre_h = gx[:, 2 * hidden :] + rr * (h @ rh.T + rbh)
                else:
                    pre_h = gx[:, 2 * hidden :] + (rr * h) @ rh.T + rbh
                if clip is not None:
                    pre_h = np.clip(pre_h, -clip, clip)
                h_new = (1 - z) * g_act(pre_h) + z * h
            else:
                pre = xw[t] + h @ r[d].T + rb
                if kind == "RNN":
                    if clip is not None:
                        pre = np.clip(pre, -clip, clip)
                    h_new = f_act(pre)
                else:
                    c_new, h_new = _lstm_cell(ctx, pre, c, hidden, p, d, acts[d], clip)
                    c = np.where(active, c_new, c)
            h = np.where(active, h_new, h)
            y[t, d] = np.where(active, h_new, 0)
        y_h[d] = h
        y_c[d] = c
    if layout:
        return y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
    return y, y_h, y_c


def _lstm_cell(
    ctx: OpContext,
    pre: np.ndarray,
    c: np.ndarray,
    hidden: int,
    p: np.ndarray | None,
    d: int,
    acts: list[Act],
    clip: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    f_act, g_act, h_act = acts
    pi, po, pf = (
        (p[d, :hidden], p[d, hidden : 2 * hidden], p[d, 2 * hidden :])
        if p is not None
        else (0, 0, 0)
    )
    gi, go, gf, gc = (pre[:, k * hidden : (k + 1) * hidden] for k in range(4))
    if clip is not None:
        gi, go, gf, gc = (np.clip(g, -clip, clip) for g in (gi, go, gf, gc))
    i = f_act(gi + pi * c)
    f = 1 - i if int(ctx.attr("input_forget", 0)) else f_act(gf + pf * c)
    c_new = f * c + i * g_act(gc)
    o = f_act(go + po * c_new)
    return c_new, o * h_act(c_new)


def rnn_flops(node: Node) -> int | None:
    """2 * seq * batch * num_dir * gate_rows * (input + hidden), the two matmuls per step."""
    x, w, r = (shape_of(v) for v in node.inputs[:3])
    if x is None or w is None or r is None:
        return None
    seq_batch = x[0] * x[1]
    return 2 * seq_batch * w[0] * w[1] * (w[2] + r[2])


def _outputs(ctx: OpContext, res: tuple[np.ndarray, ...], k: int) -> tuple[np.ndarray, ...]:
    return res[:k]


@op("LSTM", FusionKind.OPAQUE, flops=rnn_flops)
@upcast
def lstm(ctx: OpContext, x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None):
    """LSTM (gates i, o, f, c); outputs Y, Y_h, Y_c."""
    return _outputs(ctx, _run("LSTM", ctx, x, w, r, b, seq_lens, h0, c0, p), 3)


@op("GRU", FusionKind.OPAQUE, flops=rnn_flops)
@upcast
def gru(ctx: OpContext, x, w, r, b=None, seq_lens=None, h0=None):
    """GRU (gates z, r, h; linear_before_reset); outputs Y, Y_h."""
    return _outputs(ctx, _run("GRU", ctx, x, w, r, b, seq_lens, h0), 2)


@op("RNN", FusionKind.OPAQUE, flops=rnn_flops)
@upcast
def rnn(ctx: OpContext, x, w, r, b=None, seq_lens=None, h0=None):
    """Simple RNN (default activation Tanh); outputs Y, Y_h."""
    return _outputs(ctx, _run("RNN", ctx, x, w, r, b, seq_lens, h0), 2)
