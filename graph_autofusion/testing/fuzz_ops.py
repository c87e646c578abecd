"""The fuzzer's building steps: one function per operator family or rule pattern, each adding
a few valid nodes to a :class:`~graph_autofusion.testing.fuzz._Builder` (or nothing, when the
current values do not fit it). :func:`steps_for` gives the steps and weights of a dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from graph_autofusion.testing.fuzz import DIMS, MAX_ELEMENTS, bcast_shape, tensor_size

__all__ = [
    "ACTS",
    "B",
    "BOUNDED",
    "GROWING",
    "NO_BF16",
    "allowed_ops",
    "binary",
    "cast_int",
    "concat",
    "conv",
    "expand",
    "gather",
    "gemm",
    "guarded",
    "if_",
    "is_float_graph",
    "matmul",
    "pick_value",
    "reduce",
    "reshape",
    "slice_",
    "transpose",
    "unary",
    "unsqueeze",
    "where",
]


B = Any  # the builder (kept untyped: a private record of fuzz.py)


BOUNDED = {"Sigmoid": 1.0, "Tanh": 1.0, "Erf": 1.0, "Sin": 1.0, "Cos": 1.0, "Softsign": 1.0}


BOUNDED["HardSigmoid"] = 1.0


GROWING = ["Relu", "Abs", "Neg", "LeakyRelu", "Elu", "Gelu", "HardSwish", "Softplus", "Identity"]


ACTS = ["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Gelu", "HardSigmoid", "Elu", "Softplus"]


_INT_LIMIT = 10_000


#: operators whose opset-20 schema has no bfloat16
NO_BF16 = {"Sin", "Cos", "Softsign", "HardSigmoid", "Elu", "HardSwish", "Softplus", "Conv"}


def allowed_ops(b: B, ops: list[str]) -> list[str]:
    return [o for o in ops if b.compute != "bfloat16" or o not in NO_BF16]


def pick_value(b: B, pred: Callable[[Any], bool] = lambda v: True) -> Any:
    v = b.pick(pred)
    return b.tame(v) if v is not None else None


def is_float_graph(b: B) -> bool:
    return b.compute != "int64"


def unary(b: B) -> None:
    x = pick_value(b)
    if x is None:
        return
    if b.compute == "int64":
        op = b.c.choice(["Abs", "Neg"])
        (y,) = b.node(op, [x.name])
        b.add(y, x.shape, x.mag)
        return
    op = b.c.choice(allowed_ops(b, [*BOUNDED, *GROWING, "Clip"]))
    attrs: dict[str, Any] = {}
    ins = [x.name]
    if op == "LeakyRelu":
        attrs["alpha"] = b.c.choice([0.01, 0.2])
    elif op == "Clip":
        ins += [b.scalar(-1.5), b.scalar(2.0)]
    elif op == "Gelu" and b.c.flag(0.3):
        attrs["approximate"] = "tanh"
    (y,) = b.node(op, ins, **attrs)
    b.add(y, x.shape, BOUNDED.get(op, 2.0 if op == "Clip" else x.mag + 1.0))


def _abs_plus_one(b: B, x: Any) -> str:
    (a,) = b.node("Abs", [x.name])
    (p,) = b.node("Add", [a, b.scalar(1.0)])
    return p


def guarded(b: B) -> None:
    """Operators defined on part of the line, on inputs that keep them there."""
    x = pick_value(b)
    if x is None or not is_float_graph(b):
        return
    kind = b.c.choice(["Exp", "Log", "Sqrt", "Reciprocal", "Div", "Pow"])
    if kind == "Exp":
        (t,) = b.node("Tanh", [x.name])
        (y,) = b.node("Exp", [t])
        b.add(y, x.shape, math.e)
    elif kind in ("Log", "Sqrt", "Reciprocal"):
        (y,) = b.node(kind, [_abs_plus_one(b, x)])
        b.add(y, x.shape, 1.0 if kind == "Reciprocal" else math.sqrt(x.mag + 1.0) + 1.0)
    elif kind == "Div":
        d = b.pick(lambda v: _bcast_to(v.shape, x.shape))
        den = _abs_plus_one(b, d) if d is not None else b.scalar(b.c.choice([1.5, 3.0]))
        (y,) = b.node("Div", [x.name, den])
        b.add(y, x.shape, x.mag)
    else:
        (y,) = b.node("Pow", [x.name, b.scalar(2.0)])
        b.add(y, x.shape, x.mag * x.mag)


def _bcast_to(small: tuple[int, ...], full: tuple[int, ...]) -> bool:
    if len(small) > len(full):
        return False
    return all(s in (1, f) for s, f in zip(small[::-1], full[::-1]))


def binary(b: B) -> None:
    x = pick_value(b)
    if x is None:
        return
    op = b.c.choice(["Add", "Sub", "Mul", "Max", "Min", "Add", "Mul"])
    other = b.pick(lambda v: v is not x and _bcast_to(v.shape, x.shape)) if b.c.flag(0.6) else None
    if other is not None:
        y_name, y_mag = b.tame(other).name, b.tame(other).mag
    else:
        shape = bcast_shape(b.c, x.shape)
        if b.symbolic and shape and len(shape) == len(x.shape):  # no constant dim vs ``batch``
            shape = (1, *shape[1:])
        if b.compute == "int64":
            arr = b.rng.integers(-3, 4, shape)
        else:
            arr = b.rng.standard_normal(shape)
        y_name, y_mag = b.const(arr, share="bin" if b.c.flag(0.4) else ""), 3.0
    if op == "Mul":
        mag = x.mag * y_mag
    elif op in ("Add", "Sub"):
        mag = x.mag + y_mag
    else:
        mag = max(x.mag, y_mag)
    if b.compute == "int64" and mag > _INT_LIMIT:
        return
    ins = [x.name, y_name] if b.c.flag(0.7) else [y_name, x.name]
    (z,) = b.node(op, ins)
    b.add(z, x.shape, mag)


def cast_int(b: B) -> None:
    """An int64 graph input cast into the float computation (mixed element types)."""
    x = pick_value(b)
    if x is None or not is_float_graph(b):
        return
    shape = bcast_shape(b.c, x.shape)  # may be 0-d: a (1,) would raise a 0-d x's rank
    i = b.input(shape, "int64")
    b.pool.remove(i)
    to = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
    (f,) = b.node("Cast", [i.name], to=to.get(b.compute, TensorProto.BFLOAT16))
    (z,) = b.node(b.c.choice(["Add", "Mul"]), [x.name, f])
    b.add(z, x.shape, x.mag * 4.0)


def reduce(b: B) -> None:
    x = pick_value(b, lambda v: len(v.shape) >= 1)
    if x is None:
        return
    if b.compute == "int64":
        op = b.c.choice(["ReduceSum", "ReduceMax", "ReduceMin"])
    else:
        op = b.c.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2"])
        op = b.c.choice([op, op, "ReduceSumSquare"])
    rank = len(x.shape)
    axes = sorted({b.c.int(0, rank - 1) for _ in range(b.c.int(1, 2))})
    if b.c.flag(0.5):
        axes = [rank - 1]
    keep = b.c.int(0, 1)
    n = tensor_size(tuple(x.shape[a] for a in axes))
    mag = {"ReduceSum": x.mag * n, "ReduceL2": x.mag * math.sqrt(n)}.get(op, x.mag)
    mag = x.mag * x.mag * n if op == "ReduceSumSquare" else mag
    if b.compute == "int64" and mag > _INT_LIMIT:
        return
    neg = [a - rank if b.c.flag(0.4) else a for a in axes]
    (y,) = b.node(op, [x.name, b.ints(neg)], keepdims=keep)
    shape = (
        tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        if keep
        else tuple(d for i, d in enumerate(x.shape) if i not in axes)
    )
    b.add(y, shape, mag)


def transpose(b: B) -> None:
    x = pick_value(b, lambda v: len(v.shape) >= 2)
    if x is None:
        return
    rank = len(x.shape)
    perm = list(range(rank))
    while perm == list(range(rank)):
        perm = list(b.rng.permutation(rank))
    (y,) = b.node("Transpose", [x.name], perm=[int(p) for p in perm])
    b.add(y, tuple(x.shape[p] for p in perm), x.mag)


def reshape(b: B) -> None:
    x = pick_value(b, lambda v: len(v.shape) >= 2 or (len(v.shape) == 1 and v.shape[0] % 2 == 0))
    if x is None:
        return
    s = x.shape
    if len(s) >= 2 and (s[-1] % 2 or b.c.flag(0.5) or len(s) >= 4):
        target, shape = [0] * (len(s) - 2) + [-1], (*s[:-2], s[-2] * s[-1])
    elif s[-1] % 2 == 0:
        target, shape = [0] * (len(s) - 1) + [2, -1], (*s[:-1], 2, s[-1] // 2)
    else:
        return
    (y,) = b.node("Reshape", [x.name, b.ints(target)])
    b.add(y, shape, x.mag)


def concat(b: B) -> None:
    x = pick_value(b, lambda v: len(v.shape) >= 1)
    if x is None:
        return
    axis = b.c.int(0, len(x.shape) - 1)
    same = [v for v in b.pool if v.dtype == b.compute and v.shape == x.shape and v is not x]
    other = b.c.choice(same) if same and b.c.flag(0.7) else x
    shape = tuple(d * 2 if i == axis else d for i, d in enumerate(x.shape))
    if tensor_size(shape) > MAX_ELEMENTS:
        return
    (y,) = b.node("Concat", [x.name, other.name], axis=axis - len(x.shape) * b.c.int(0, 1))
    b.add(y, shape, max(x.mag, other.mag))


def slice_(b: B) -> None:
    x = pick_value(b, lambda v: any(d >= 2 for d in v.shape))
    if x is None:
        return
    axis = b.c.choice([i for i, d in enumerate(x.shape) if d >= 2])
    d = x.shape[axis]
    start = b.c.int(0, d - 1)
    end = b.c.int(start + 1, d)
    step = 2 if b.c.flag(0.2) else 1
    ends = end if b.c.flag(0.8) else 2**62  # "to the end"
    ins = [x.name, b.ints([start]), b.ints([min(ends, 2**62)]), b.ints([axis]), b.ints([step])]
    (y,) = b.node("Slice", ins)
    n = len(range(start, end if ends != 2**62 else d, step))
    b.add(y, tuple(n if i == axis else s for i, s in enumerate(x.shape)), x.mag)


def unsqueeze(b: B) -> None:
    x = pick_value(b)
    if x is None:
        return
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    if ones and b.c.flag(0.5):
        axis = b.c.choice(ones)
        (y,) = b.node("Squeeze", [x.name, b.ints([axis])])
        b.add(y, tuple(d for i, d in enumerate(x.shape) if i != axis), x.mag)
    elif len(x.shape) < 5:
        axis = b.c.int(0, len(x.shape))
        (y,) = b.node("Unsqueeze", [x.name, b.ints([axis])])
        b.add(y, (*x.shape[:axis], 1, *x.shape[axis:]), x.mag)


def expand(b: B) -> None:
    x = pick_value(b, lambda v: 1 in v.shape)
    if x is None:
        return
    shape = tuple(b.c.choice(DIMS[1:5]) if d == 1 and b.c.flag(0.7) else d for d in x.shape)
    if tensor_size(shape) > MAX_ELEMENTS or shape == x.shape:
        return
    (y,) = b.node("Expand", [x.name, b.ints(list(shape))])
    b.add(y, shape, x.mag)


def gather(b: B) -> None:
    """A Gather: an embedding table read by int64 ids (float graphs), or constant indices."""
    x = pick_value(b, lambda v: len(v.shape) >= 1)
    if x is None:
        return
    if is_float_graph(b) and b.c.flag(0.6):
        rows, h = b.c.choice([5, 16]), x.shape[-1]
        ids = b.input(tuple(b.c.choice(DIMS[:5]) for _ in range(b.c.int(1, 2))), "int64", low=0)
        b.pool.remove(ids)
        b.feeds[ids.name] = b.feeds[ids.name] % rows
        table = b.weights((rows, h), 1.0)
        (y,) = b.node("Gather", [table, ids.name], axis=0)
        b.add(y, (*ids.shape, h), 4.0)
        return
    axis = b.c.int(0, len(x.shape) - 1)
    idx = [int(i) for i in b.rng.integers(-x.shape[axis], x.shape[axis], b.c.int(1, 3))]
    (y,) = b.node("Gather", [x.name, b.ints(idx)], axis=axis)
    b.add(y, (*x.shape[:axis], len(idx), *x.shape[axis + 1 :]), x.mag)


def matmul(b: B) -> None:
    x = pick_value(b, lambda v: len(v.shape) >= 1 and v.shape[-1] >= 1)
    if x is None:
        return
    k = x.shape[-1]
    if b.c.flag(0.3) and len(x.shape) >= 2:  # two graph values: x @ y^T
        y = b.pick(lambda v: v.shape == x.shape)
        if y is not None and tensor_size((*x.shape, x.shape[-2])) <= MAX_ELEMENTS:
            y = b.tame(y)
            perm = [*range(len(x.shape) - 2), len(x.shape) - 1, len(x.shape) - 2]
            (t,) = b.node("Transpose", [y.name], perm=perm)
            mag = x.mag * y.mag * k
            if b.compute == "int64" and mag > _INT_LIMIT:
                return
            (z,) = b.node("MatMul", [x.name, t])
            b.add(z, (*x.shape[:-1], x.shape[-2]), mag)
            return
    n = b.c.choice([2, 4, 8, 16])
    if b.compute == "int64":
        w = b.const(b.rng.integers(-2, 3, (k, n)))
        mag = x.mag * 2 * k
        if mag > _INT_LIMIT:
            return
    else:
        w, mag = b.weights((k, n), 1.0 / math.sqrt(k)), x.mag * math.sqrt(k)
    (z,) = b.node("MatMul", [x.name, w])
    b.add(z, (*x.shape[:-1], n), mag)


def gemm(b: B) -> None:
    x = pick_value(b, lambda v: len(v.shape) == 2)
    if x is None or not is_float_graph(b):
        return
    k, n = x.shape[1], b.c.choice([2, 4, 8])
    trans = b.c.int(0, 1)
    w = b.weights((n, k) if trans else (k, n), 1.0 / math.sqrt(k))
    ins = [x.name, w]
    if b.c.flag(0.7):
        ins.append(b.weights((n,), 1.0))
    alpha = b.c.choice([1.0, 0.5])
    (z,) = b.node("Gemm", ins, transB=trans, alpha=alpha)
    b.add(z, (x.shape[0], n), x.mag * math.sqrt(k) + 3)


def conv(b: B) -> None:
    """Conv (+ BatchNormalization) (+ Relu) on an NCHW float32 value."""
    x = pick_value(b, lambda v: len(v.shape) == 4 and v.shape[2] >= 2 and v.shape[3] >= 2)
    if x is None or b.compute != "float32":
        return
    cin, cout, ksz = x.shape[1], b.c.choice([2, 4, 8]), b.c.choice([1, 3])
    shape = (x.shape[0], cout, x.shape[2], x.shape[3])
    if tensor_size(shape) > MAX_ELEMENTS:
        return
    w = b.weights((cout, cin, ksz, ksz), 1.0 / math.sqrt(cin * ksz * ksz))
    ins = [x.name, w] + ([b.weights((cout,), 0.5)] if b.c.flag(0.6) else [])
    (y,) = b.node("Conv", ins, pads=[ksz // 2] * 4, kernel_shape=[ksz, ksz])
    b.patterns.append("conv")
    if b.c.flag(0.5):
        scale, bias = b.weights((cout,), 1.0), b.weights((cout,), 1.0)
        mean = b.weights((cout,), 0.5)
        var = b.const(b.rng.uniform(0.5, 2.0, (cout,)))
        (y,) = b.node("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
        b.patterns.append("conv_bn")
    if b.c.flag(0.5):
        (y,) = b.node("Relu", [y])
    b.add(y, shape, x.mag * 4 + 4)


def _condition_input(b: B, shape: tuple[int, ...]) -> str | None:
    """A boolean from a graph input compared with a constant (exact in every executor)."""
    ins = [n for n, a in b.feeds.items() if a.dtype != np.bool_ and _bcast_to(a.shape, shape)]
    if not ins:
        return None
    name = b.c.choice(ins)
    dt = b.feeds[name].dtype
    c = b.const(np.array(0 if dt == np.int64 else 0.25), "int64" if dt == np.int64 else None)
    if dt != np.int64 and b.compute != str(dt):  # the fp32 input of a bf16 graph
        c = b.const(np.array(0.25), "float32", share="cond")
    (cond,) = b.node(b.c.choice(["Greater", "Less"]), [name, c])
    return cond


def where(b: B) -> None:
    x = pick_value(b)
    if x is None:
        return
    cond = _condition_input(b, x.shape)
    if cond is None:
        return
    other = b.pick(lambda v: v is not x and _bcast_to(v.shape, x.shape))
    oname = b.tame(other).name if other is not None else b.scalar(0.0)
    (y,) = b.node("Where", [cond, x.name, oname])
    b.add(y, x.shape, max(x.mag, b.tame(other).mag if other is not None else 0.0))


def if_(b: B) -> None:
    """If on a boolean graph input; the branches read an outer value."""
    x = pick_value(b)
    if x is None or any(n.op_type == "If" for n in b.nodes) or b.c.flag(0.6):
        return
    flag = "flag"
    b.inputs.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
    b.feeds[flag] = np.array(bool(b.c.int(0, 1)))
    elem = {"float32": 1, "float16": 10, "bfloat16": 16, "int64": 7}[b.compute]
    ops = (["Abs"], ["Neg"]) if b.compute == "int64" else (["Relu", "Tanh"], ["Sigmoid"])
    branches = []
    for which, chain in zip(("then", "else"), ops):
        nodes, cur = [], x.name
        for op in chain:
            out = b.fresh(f"{which}_{op.lower()}")
            nodes.append(helper.make_node(op, [cur], [out], name=b.fresh(f"n_{which}")))
            cur = out
        out_info = helper.make_tensor_value_info(cur, elem, list(x.shape))
        branches.append(helper.make_graph(nodes, f"{which}_branch", [], [out_info]))
    (y,) = b.node("If", [flag], then_branch=branches[0], else_branch=branches[1])
    b.add(y, x.shape, x.mag)
