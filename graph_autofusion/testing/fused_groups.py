"""Random fused groups for the kernel generator's property tests.

    group = random_group(RngChooser(seed), name="g0")
    group.model, group.outputs, group.feeds

A group is a small graph of 2-12 operators drawn from the catalog's elementwise, broadcast,
injective (views on the group's inputs) and reduction kinds, on ranks 1-4 with random
broadcasts, in fp32, fp16 or bf16, with at most one reduction axis set (every reduction of a
kernel reduces the same axes). Values stay in a range where every operator is well defined
(divisors are bounded away from 0, ``Sqrt`` and ``Log`` read positive values).

The choices come from a :class:`Chooser`: :class:`RngChooser` (a seeded NumPy generator) or
:class:`HypothesisChooser` (hypothesis' ``data.draw``), so the same generator serves seeded
corpora and hypothesis' search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graph_autofusion.codegen.reference import bf16_round
from graph_autofusion.ir.core import Graph, Model, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.runtime.torch_runtime import infer_shapes


class Chooser:
    def int(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.int(0, len(options) - 1)]

    def flag(self, p: float = 0.5) -> bool:
        return self.int(0, 999) < int(p * 1000)


class RngChooser(Chooser):
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def int(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


class HypothesisChooser(Chooser):
    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return int(self.data.draw(self.st.integers(lo, hi)))


UNARY = ["Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Erf", "Sin", "Cos", "Floor", "Softplus"]
UNARY_ATTR = ["LeakyRelu", "HardSigmoid", "Elu", "Gelu", "HardSwish"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]
DTYPES = [DType.FLOAT, DType.FLOAT16, DType.BFLOAT16]


@dataclass
class RandomGroup:
    model: Model
    nodes: list
    outputs: list[Value]
    feeds: dict[str, np.ndarray]  # float32 arrays (bf16 inputs hold bf16-rounded values)
    dtype: DType
    description: str


def _broadcast_shape(c: Chooser, full: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``full``: a suffix of it, some dims set to 1."""
    k = c.int(1, len(full))
    tail = list(full[len(full) - k :])
    for i in range(len(tail)):
        if c.flag(0.3):
            tail[i] = 1
    return tuple(tail)


def _operand_shape(c: Chooser, full: tuple[int, ...], axes: list[int] | None) -> tuple[int, ...]:
    """After a reduction an operand either has the full shape or one value per row (size 1 on
    the reduced axes), so every value stays a full or a per-row one (what one kernel holds)."""
    if axes is None:
        return _broadcast_shape(c, full)
    if c.flag(0.5):
        return full
    row = tuple(1 if i in axes else d for i, d in enumerate(full))
    return _broadcast_shape(c, row)


def random_group(c: Chooser, *, name: str = "g", max_ops: int = 12) -> RandomGroup:
    """One random fused group (see the module docstring)."""

    rank = c.int(1, 4)
    full = tuple(c.choice([1, 2, 3, 5, 8, 16, 33]) for _ in range(rank))
    dtype = c.choice(DTYPES)
    g = Graph(name)
    feeds: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(c.int(0, 2**31))
    n_inputs = 0
    desc: list[str] = []

    def new_input(shape: tuple[int, ...], positive: bool = False) -> Value:
        nonlocal n_inputs
        v = Value(f"{name}_in{n_inputs}", dtype, shape)
        n_inputs += 1
        g.add_input(v)
        a = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)
        a = a.astype(np.float32)
        if dtype == DType.FLOAT16:
            a = a.astype(np.float16)
        elif dtype == DType.BFLOAT16:
            a = bf16_round(a)
        feeds[v.name] = a
        return v

    cur = new_input(full)
    if rank >= 2 and c.flag(0.25):  # a transposed input: a view
        perm = list(range(rank))
        i, j = c.int(0, rank - 1), c.int(0, rank - 1)
        perm[i], perm[j] = perm[j], perm[i]
        src = new_input(tuple(full[p] for p in np.argsort(perm)))
        t = g.make_node("Transpose", [src], attrs={"perm": perm}, name=f"{name}_T")
        t.outputs[0].dtype, t.outputs[0].shape = dtype, full
        b = g.make_node("Add", [cur, t.outputs[0]], name=f"{name}_addT")
        cur = b.outputs[0]
        desc.append("Transpose-view")
    axes = None
    if rank >= 1 and c.flag(0.5):
        axes = sorted({c.int(0, rank - 1) for _ in range(c.int(1, min(2, rank)))})
    reduced = False
    n_ops = c.int(2, max_ops)
    nodes_made = 0
    values = [cur]
    while nodes_made < n_ops:
        kind = c.int(0, 9)
        x = c.choice(values) if c.flag(0.3) else cur
        if kind <= 2:
            op = c.choice(UNARY)
            n = g.make_node(op, [x], name=f"{name}_{nodes_made}")
        elif kind == 3:
            op = c.choice(UNARY_ATTR)
            attrs = {"LeakyRelu": {"alpha": 0.1}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
                     "Elu": {"alpha": 0.7}, "Gelu": {"approximate": c.choice(["none", "tanh"])},
                     "HardSwish": {}}[op]  # fmt: skip
            n = g.make_node(op, [x], attrs=attrs, name=f"{name}_{nodes_made}")
        elif kind <= 6:
            op = c.choice(BINARY)
            other = (
                new_input(_operand_shape(c, full, axes if reduced else None))
                if c.flag(0.6)
                else c.choice(values)
            )
            if c.flag(0.5):
                x, other = other, x
            n = g.make_node(op, [x, other], name=f"{name}_{nodes_made}")
        elif kind == 7:
            d = new_input(_operand_shape(c, full, axes if reduced else None), positive=True)
            n = g.make_node("Div", [x, d], name=f"{name}_{nodes_made}")
        elif kind == 8 and axes is not None and not reduced:
            op = c.choice(REDUCE)
            n = g.make_node(
                op, [x], attrs={"axes": axes, "keepdims": 1}, name=f"{name}_{nodes_made}"
            )
            reduced = True
        elif kind == 8:
            cond = g.make_node("Greater", [x, c.choice(values)], name=f"{name}_{nodes_made}c")
            cond.outputs[0].dtype = DType.BOOL
            n = g.make_node(
                "Where", [cond.outputs[0], x, c.choice(values)], name=f"{name}_{nodes_made}"
            )
            nodes_made += 1
        else:
            pos = g.make_node("Abs", [x], name=f"{name}_{nodes_made}a")
            pos.outputs[0].dtype = dtype
            one = new_input((1,), positive=True)
            shifted = g.make_node("Add", [pos.outputs[0], one], name=f"{name}_{nodes_made}b")
            shifted.outputs[0].dtype = dtype
            n = g.make_node(
                c.choice(["Sqrt", "Log"]), [shifted.outputs[0]], name=f"{name}_{nodes_made}"
            )
            nodes_made += 2
        n.outputs[0].dtype = dtype
        desc.append(n.op_type)
        nodes_made += 1
        cur = n.outputs[0]
        values.append(cur)
    if not reduced and rank >= 2 and c.flag(0.3):  # a transpose of a computed value
        perm = list(range(rank))
        i, j = c.int(0, rank - 1), c.int(0, rank - 1)
        perm[i], perm[j] = perm[j], perm[i]
        t = g.make_node("Transpose", [cur], attrs={"perm": perm}, name=f"{name}_Tin")
        t.outputs[0].dtype = dtype
        other = new_input(tuple(full[p] for p in perm))
        n = g.make_node("Add", [t.outputs[0], other], name=f"{name}_addTin")
        n.outputs[0].dtype = dtype
        cur = n.outputs[0]
        values = [cur]  # later values live in the transposed shape
        full = tuple(full[p] for p in perm)
        desc.append("Transpose-inside")
    if reduced and c.flag(0.5):  # an epilogue that reads the full-shape value again
        n = g.make_node("Mul", [cur, values[0]], name=f"{name}_epi")
        n.outputs[0].dtype = dtype
        cur = n.outputs[0]
        desc.append("Mul-epilogue")
    outputs = [cur]
    g.set_outputs(outputs)
    model = Model(g, {"": 20})

    infer_shapes(model)
    outputs = [cur]
    # a second output: an intermediate with the loop's own shape, also read outside
    mids = [v for v in values[1:-1] if v.shape == cur.shape and v.producer is not None]
    if mids and c.flag(0.3) and (not reduced or _is_row(cur, mids[0], axes)):
        outputs.append(mids[0])
        g.set_outputs(outputs)
    return RandomGroup(model, list(g.nodes), outputs, feeds, dtype, " ".join(desc))


def _is_row(a: Value, b: Value, axes: list[int] | None) -> bool:
    return a.shape == b.shape
