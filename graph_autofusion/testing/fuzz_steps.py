"""The fuzzer's rule-pattern steps (the shapes the built-in rules match: LayerNorm, RMSNorm,
Gelu, SiLU, SwiGLU, Softmax, bias+activation, attention) and the table of every step with
its weight (:data:`STEPS`, :func:`steps_for`); the single-operator steps are in
:mod:`graph_autofusion.testing.fuzz_ops`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graph_autofusion.testing.fuzz_ops import (
    ACTS,
    B,
    allowed_ops,
    binary,
    cast_int,
    concat,
    conv,
    expand,
    gather,
    gemm,
    guarded,
    if_,
    is_float_graph,
    matmul,
    pick_value,
    reduce,
    reshape,
    slice_,
    transpose,
    unary,
    unsqueeze,
    where,
)


def _last_axis(b: B, lo: int = 2) -> Any:
    x = pick_value(b, lambda v: len(v.shape) >= 1 and v.shape[-1] >= lo)
    return x if x is not None and is_float_graph(b) else None


def _spread(b: B, x: Any) -> Any:
    """``x`` plus a constant ramp over the last axis: a row of equal values (an ``Expand``, a
    saturated ``Relu``) would make a normalization divide rounding noise by ``sqrt(eps)``,
    which no two correct implementations agree on; real activations are not constant rows."""
    d = x.shape[-1]
    ramp = b.const(np.linspace(-2.0, 2.0, d) + b.rng.uniform(-0.1, 0.1, d), share="ramp")
    (y,) = b.node("Add", [x.name, ramp])
    return b.add(y, x.shape, x.mag + 2.1)


def layernorm(b: B) -> None:
    x = _last_axis(b)
    if x is None:
        return
    x = _spread(b, x)
    d = x.shape[-1]
    gamma, beta = b.weights((d,), 1.0), b.weights((d,), 1.0)
    if b.c.flag(0.4):  # skip + LayerNormalization
        y = b.pick(lambda v: v.shape == x.shape and v is not x)
        src = x.name
        if y is not None:
            (src,) = b.node("Add", [x.name, b.tame(y).name])
        (out,) = b.node("LayerNormalization", [src, gamma, beta], axis=-1, epsilon=1e-5)
        b.patterns.append("skip_layernorm" if y is not None else "layernorm")
    else:
        axes = b.ints([-1])
        (mean,) = b.node("ReduceMean", [x.name, axes], keepdims=1)
        (dev,) = b.node("Sub", [x.name, mean])
        if b.c.flag(0.5):
            (sq,) = b.node("Pow", [dev, b.scalar(2.0)])
        else:
            (sq,) = b.node("Mul", [dev, dev])
        (var,) = b.node("ReduceMean", [sq, axes], keepdims=1)
        (ve,) = b.node("Add", [var, b.scalar(1e-5)])
        (sd,) = b.node("Sqrt", [ve])
        (nrm,) = b.node("Div", [dev, sd])
        (sc,) = b.node("Mul", [nrm, gamma])
        (out,) = b.node("Add", [sc, beta])
        b.patterns.append("layernorm_decomposed")
    b.add(out, x.shape, 4.0 * math.sqrt(d) + 4)


def rmsnorm(b: B) -> None:
    x = _last_axis(b)
    if x is None:
        return
    x = _spread(b, x)
    (sq,) = b.node("Pow", [x.name, b.scalar(2.0)])
    (ms,) = b.node("ReduceMean", [sq, b.ints([-1])], keepdims=1)
    (me,) = b.node("Add", [ms, b.scalar(1e-6)])
    (sd,) = b.node("Sqrt", [me])
    (inv,) = b.node("Reciprocal", [sd])
    (nrm,) = b.node("Mul", [x.name, inv])
    (out,) = b.node("Mul", [b.weights((x.shape[-1],), 1.0), nrm])
    b.patterns.append("rmsnorm")
    b.add(out, x.shape, 4.0 * math.sqrt(x.shape[-1]) + 4)


def gelu(b: B) -> None:
    x = pick_value(b)
    if x is None or not is_float_graph(b):
        return
    if b.c.flag(0.5):
        (s,) = b.node("Div", [x.name, b.scalar(1.4142135381698608)])
        (e,) = b.node("Erf", [s])
        b.patterns.append("gelu_erf")
    else:
        (cube,) = b.node("Pow", [x.name, b.scalar(3.0)])
        (m,) = b.node("Mul", [cube, b.scalar(0.044715)])
        (a,) = b.node("Add", [x.name, m])
        (s,) = b.node("Mul", [a, b.scalar(0.7978845834732056)])
        (e,) = b.node("Tanh", [s])
        b.patterns.append("gelu_tanh")
    (p,) = b.node("Add", [e, b.scalar(1.0)])
    (m1,) = b.node("Mul", [x.name, p])
    (out,) = b.node("Mul", [m1, b.scalar(0.5)])
    b.add(out, x.shape, x.mag + 1)


def silu(b: B) -> None:
    x = pick_value(b)
    if x is None or not is_float_graph(b):
        return
    src = x.name
    if b.c.flag(0.4):
        (src,) = b.node("Mul", [x.name, b.scalar(1.702)])
        b.patterns.append("quick_gelu")
    else:
        b.patterns.append("silu")
    (sg,) = b.node("Sigmoid", [src])
    (out,) = b.node("Mul", [x.name, sg] if b.c.flag(0.5) else [sg, x.name])
    b.add(out, x.shape, x.mag)


def swiglu(b: B) -> None:
    x = _last_axis(b)
    if x is None:
        return
    k, n = x.shape[-1], b.c.choice([4, 8, 16])
    (g,) = b.node("MatMul", [x.name, b.weights((k, n), 1 / math.sqrt(k))])
    (u,) = b.node("MatMul", [x.name, b.weights((k, n), 1 / math.sqrt(k))])
    (sg,) = b.node("Sigmoid", [g])
    (si,) = b.node("Mul", [g, sg])
    (out,) = b.node("Mul", [si, u])
    b.patterns.append("swiglu")
    b.add(out, (*x.shape[:-1], n), (x.mag * math.sqrt(k)) ** 2)


def softmax(b: B) -> None:
    x = _last_axis(b)
    if x is None:
        return
    if b.c.flag(0.5):
        axis = b.c.choice([-1, len(x.shape) - 1, 0])
        (out,) = b.node("Softmax", [x.name], axis=axis)
        b.patterns.append("softmax")
    else:
        axes = b.ints([-1])
        (mx,) = b.node("ReduceMax", [x.name, axes], keepdims=1)
        (sh,) = b.node("Sub", [x.name, mx])
        (e,) = b.node("Exp", [sh])
        (s,) = b.node("ReduceSum", [e, axes], keepdims=1)
        (out,) = b.node("Div", [e, s])
        b.patterns.append("softmax_decomposed")
    b.add(out, x.shape, 1.0)


def bias_act(b: B) -> None:
    x = _last_axis(b, 1)
    if x is None:
        return
    k, n = x.shape[-1], b.c.choice([4, 8, 16])
    (m,) = b.node("MatMul", [x.name, b.weights((k, n), 1 / math.sqrt(k))])
    (a,) = b.node("Add", [m, b.weights((n,), 1.0)])
    act = b.c.choice(allowed_ops(b, ACTS))
    (out,) = b.node(act, [a])
    b.patterns.append(f"bias_{act.lower()}")
    b.add(out, (*x.shape[:-1], n), x.mag * math.sqrt(k) + 3)


def attention(b: B) -> None:
    x = _last_axis(b, 2)
    if x is None or len(x.shape) != 3:
        return
    d = x.shape[-1]
    q, k, v = (b.node("MatMul", [x.name, b.weights((d, d), 1 / math.sqrt(d))])[0] for _ in range(3))
    (kt,) = b.node("Transpose", [k], perm=[0, 2, 1])
    (s,) = b.node("MatMul", [q, kt])
    (sc,) = b.node("Div", [s, b.scalar(float(math.sqrt(d)))])
    (p,) = b.node("Softmax", [sc], axis=-1)
    (out,) = b.node("MatMul", [p, v])
    b.patterns.append("attention")
    b.add(out, x.shape, x.mag * math.sqrt(d))


STEPS: dict[str, Callable[[B], None]] = {
    "unary": unary,
    "guarded": guarded,
    "binary": binary,
    "cast_int": cast_int,
    "reduce": reduce,
    "transpose": transpose,
    "reshape": reshape,
    "concat": concat,
    "slice": slice_,
    "unsqueeze": unsqueeze,
    "expand": expand,
    "gather": gather,
    "matmul": matmul,
    "gemm": gemm,
    "conv": conv,
    "where": where,
    "if": if_,
    "layernorm": layernorm,
    "rmsnorm": rmsnorm,
    "gelu": gelu,
    "silu": silu,
    "swiglu": swiglu,
    "softmax": softmax,
    "bias_act": bias_act,
    "attention": attention,
}


_FLOAT_WEIGHTS = {"unary": 8, "binary": 10, "guarded": 3, "reduce": 4, "matmul": 4}
_FLOAT_WEIGHTS |= {"cast_int": 1, "transpose": 3, "reshape": 2, "concat": 2, "slice": 2}
_FLOAT_WEIGHTS |= {"unsqueeze": 2, "expand": 1, "gather": 2, "gemm": 2, "conv": 2, "where": 2}
_FLOAT_WEIGHTS |= {"if": 1, "layernorm": 3, "rmsnorm": 2, "gelu": 3, "silu": 2, "swiglu": 1}
_FLOAT_WEIGHTS |= {"softmax": 2, "bias_act": 3, "attention": 1}


_INT_STEPS = ("unary", "binary", "reduce", "transpose", "reshape", "concat", "slice")
_INT_STEPS += ("unsqueeze", "expand", "gather", "matmul", "where", "if")


def steps_for(dtype: str) -> list[tuple[str, int]]:
    """The steps a graph of ``dtype`` draws from, with their weights."""
    if dtype == "int64":
        return [(s, _FLOAT_WEIGHTS[s]) for s in _INT_STEPS]
    return list(_FLOAT_WEIGHTS.items())
