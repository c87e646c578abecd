"""The NumPy reference backend: executes the kernel IR itself (what the C kernels are tested
against, and what runs when no C compiler is allowed).

    outs = run_reference(kernel, [x, gamma])

Arithmetic is float32 (int64, bool), as in the C kernels; fp16/bf16 storage rounds on cast
and store. bf16 arrays are float32 arrays holding bf16-rounded values (NumPy has no bfloat16).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graph_autofusion.catalog.definitions.elementwise import erf
from graph_autofusion.codegen.call_plan import NP_DTYPES, concat_lengths, loop_shape, output_shapes
from graph_autofusion.codegen.kernel_ir import ROW, Kernel
from graph_autofusion.codegen.views import apply_views, view_inputs

_CT = {"f32": np.float32, "i64": np.int64, "bool": np.bool_}


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = np.isnan(x)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (u & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(nan, x, out)


def _round_to(x: np.ndarray, storage: str) -> np.ndarray:
    if storage == "i32":
        return x.astype(np.int32).astype(np.int64)
    if storage == "f16":
        return x.astype(np.float16).astype(np.float32)
    if storage == "bf16":
        return bf16_round(x)
    return x


def _unary(op: str, a: np.ndarray) -> np.ndarray:
    f = {
        "id": lambda v: v,
        "neg": np.negative,
        "abs": np.abs,
        "exp": np.exp,
        "log": np.log,
        "sqrt": np.sqrt,
        "recip": lambda v: np.float32(1) / v,
        "tanh": np.tanh,
        "erf": lambda v: erf(v).astype(np.float32),
        "sigmoid": lambda v: np.float32(1) / (np.float32(1) + np.exp(-v)),
        "relu": lambda v: np.where(v < 0, np.zeros_like(v), v),
        "sin": np.sin,
        "cos": np.cos,
        "floor": np.floor,
        "ceil": np.ceil,
        "round": np.rint,
        "sign": np.sign,
        "not": np.logical_not,
        "isnan": np.isnan,
        "isinf": np.isinf,
        "softplus": lambda v: np.where(v > 20, v, np.log1p(np.exp(np.minimum(v, 20)))),
        "log1p": np.log1p,
    }[op]
    return f(a)


def _binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    f = {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": np.divide,
        "pow": np.power,
        "min": np.minimum,
        "max": np.maximum,
        "eq": np.equal,
        "lt": np.less,
        "le": np.less_equal,
        "gt": np.greater,
        "ge": np.greater_equal,
        "and": np.logical_and,
        "or": np.logical_or,
        "xor": np.logical_xor,
    }[op]
    return f(a, b)


def run_reference(kernel: Kernel, inputs: Sequence[Any]) -> list[np.ndarray]:
    """Execute ``kernel`` on NumPy arrays; returns the outputs as arrays."""

    xs = view_inputs(kernel, [np.asarray(x) for x in inputs])
    loop = loop_shape(kernel, [tuple(x.shape) for x in xs])
    r = kernel.rank
    red = tuple(kernel.reduce_axes)
    rowlen = int(np.prod([loop[a] for a in red], dtype=np.int64)) if red else 1
    env: list[np.ndarray] = []
    with np.errstate(all="ignore"):
        for b in kernel.body:
            ct = _CT[b.ctype]
            if b.op == "load":
                x = xs[b.attr("input")]
                if kernel.inputs[b.attr("input")].dtype == "bf16":
                    x = bf16_round(x.astype(np.float32))
                v = np.asarray(x).astype(ct).reshape((1,) * (r - x.ndim) + tuple(x.shape))
            elif b.op == "const":
                v = np.asarray(b.attr("value"), dtype=ct).reshape((1,) * r)
            elif b.op == "rowlen":
                v = np.full((1,) * r, rowlen, dtype=np.float32)
            elif b.op == "reduce":
                a = np.broadcast_to(
                    env[b.args[0]], np.broadcast_shapes(env[b.args[0]].shape, _red_shape(loop, red))
                )
                kind = b.attr("kind")
                fn = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[kind]
                v = (
                    fn(a, axis=red, keepdims=True).astype(ct)
                    if a.size
                    else np.zeros(_row(loop, red), ct)
                )
            elif b.op == "cast":
                v = env[b.args[0]]
                v = (v != 0) if b.attr("to") == "bool" else v.astype(_CT[b.attr("to")])
                v = _round_to(v, b.attr("round", "")) if b.attr("round") else v
            elif b.op == "concat":
                lengths = concat_lengths(kernel, [tuple(x.shape) for x in xs])
                parts = [
                    np.broadcast_to(
                        env[a], np.broadcast_shapes(env[a].shape, (1,) * (r - 1) + (n,))
                    )
                    for a, n in zip(b.args, lengths)
                ]
                lead = np.broadcast_shapes(*[p.shape[:-1] for p in parts])
                v = np.concatenate([np.broadcast_to(p, (*lead, p.shape[-1])) for p in parts], -1)
            elif b.op == "where":
                v = np.where(env[b.args[0]], env[b.args[1]], env[b.args[2]])
            elif len(b.args) == 1:
                v = _unary(b.op, env[b.args[0]])
            else:
                v = _binary(b.op, env[b.args[0]], env[b.args[1]])
            env.append(np.asarray(v).astype(ct, copy=False))
    outs = []
    for o, shape in zip(kernel.outputs, output_shapes(kernel, loop)):
        full = _row(loop, red) if o.level == ROW else loop
        v = np.broadcast_to(env[o.instr], full)
        v = _round_to(v.astype(np.float32), o.dtype) if o.dtype in ("f16", "bf16") else v
        storage = np.float32 if o.dtype == "bf16" else NP_DTYPES[o.dtype]
        out = np.array(v, dtype=storage, order="C").reshape(shape)
        outs.append(apply_views(out, o.views) if o.views else out)
    return outs


def _row(loop: tuple[int, ...], red: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if a in red else d for a, d in enumerate(loop))


def _red_shape(loop: tuple[int, ...], red: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d if a in red else 1 for a, d in enumerate(loop))
