"""Random valid ONNX graphs for the fuzzer (issue 15): a seeded generator and hypothesis
strategies on top of it.

    g = random_graph(1234)          # the same graph for the same seed, in any process
    g.model, g.feeds, g.ops, g.dtype

A graph has 5-40 nodes (a rule pattern drawn last may take it to 48) from the catalog's kinds: elementwise (Relu ... Gelu, guarded Exp/Log/
Sqrt/Reciprocal/Div/Pow), broadcast (Add, Sub, Mul, Max, Min with graph values or constants),
reduction (ReduceSum/Mean/Max/Min/L2/SumSquare), layout (Transpose, Reshape, Concat, Slice,
Unsqueeze, Squeeze, Expand), contraction (MatMul, Gemm, Conv), data movement (Gather of an
embedding table) and control flow (Where, If on a boolean input). It also spells out the
patterns the rules look for (decomposed LayerNorm and RMSNorm, both GELU forms, SiLU,
QuickGELU, SwiGLU, softmax in both forms, bias + activation, skip + LayerNormalization,
attention, Conv + BatchNorm + Relu) so that fusions actually happen.

Element types: float32, float16, bfloat16 (float32 inputs cast to bfloat16 inside the graph,
as mixed-precision exports do; onnxruntime's CPU provider has no bfloat16 kernels) and int64
(integer-only operators). Shapes are static or have a symbolic leading dim (``batch``; the
feeds bind it). Graphs have several outputs, outputs that internal nodes also read, values
read by many nodes and constants shared between nodes.

Values stay where every operator is well defined and well conditioned: a bound on each
value's magnitude is tracked and a ``Tanh`` squashes one that grows past it; divisors, ``Log``
and ``Sqrt`` read ``|x| + 1``; comparisons (``Where``, ``If``) read graph inputs only, so
rounding inside a fused group can never flip them.

Choices come from a :class:`~graph_autofusion.testing.fused_groups.Chooser`, so the same
generator serves seeded corpora (:func:`random_graph`) and hypothesis' search
(:func:`graphs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from graph_autofusion.testing.fused_groups import Chooser, RngChooser

OPSET = 20
DIMS = (1, 2, 3, 4, 5, 8, 16)
MAX_ELEMENTS = 2048
DTYPES = ("float32", "float16", "bfloat16", "int64")
_ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}
_ONNX["bfloat16"] = TensorProto.BFLOAT16
#: magnitude past which a float value is squashed (fp16's range is 65504)
_BOUND = {"float32": 60.0, "float16": 16.0, "bfloat16": 16.0, "int64": 1000.0}


@dataclass
class FuzzGraph:
    """One generated graph and its sample inputs."""

    seed: int | None
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    dtype: str
    symbolic: bool
    ops: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)

    def describe(self) -> str:
        shape = "symbolic" if self.symbolic else "static"
        return (
            f"seed {self.seed}: {len(self.model.graph.node)} nodes, {self.dtype}, {shape}, "
            f"patterns {self.patterns or '-'}"
        )


@dataclass
class _V:
    name: str
    shape: tuple[int, ...]
    mag: float  # an upper bound of |value|
    dtype: str
    is_input: bool = False


class _Builder:
    def __init__(self, c: Chooser, dtype: str, symbolic: bool) -> None:
        self.c, self.dtype, self.symbolic = c, dtype, symbolic
        self.compute = dtype  # element type of the computation (bf16 inside, fp32 inputs)
        self.rng = np.random.default_rng(c.int(0, 2**31 - 1))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.pool: list[_V] = []
        self.consts: dict[tuple, str] = {}  # (shape, kind) -> name, for shared constants
        self.patterns: list[str] = []
        self.count = 0
        self.batch = 1  # the symbolic leading dim's size in the feeds

    # ----- names, nodes, constants -----------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def node(self, op: str, ins: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=self.fresh(f"n_{op}"), **attrs))
        return outs

    def np_dtype(self, dtype: str | None = None) -> Any:
        d = dtype or self.compute
        return {"float16": np.float16, "int64": np.int64}.get(d, np.float32)

    def const(self, array: np.ndarray, dtype: str | None = None, share: str = "") -> str:
        """An initializer; with ``share`` a constant of the same shape and key is reused."""
        d = dtype or self.compute
        key = (share, array.shape, d)
        if share and key in self.consts:
            return self.consts[key]
        name = self.fresh("c")
        if d == "bfloat16":
            t = helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.ravel().tolist())
        else:
            t = onnx.numpy_helper.from_array(np.asarray(array).astype(self.np_dtype(d)), name)
        self.inits.append(t)
        if share:
            self.consts[key] = name
        return name

    def scalar(self, x: float, dtype: str | None = None) -> str:
        return self.const(np.array(x), dtype, share=f"scalar{x!r}")

    def ints(self, values: list[int]) -> str:
        return self.const(np.array(values, np.int64), "int64", share=f"ints{values!r}")

    def weights(self, shape: tuple[int, ...], scale: float) -> str:
        share = "w" if self.c.flag(0.25) else ""
        a = self.rng.standard_normal(shape) * scale
        return self.const(a, share=share)

    def add(self, name: str, shape: tuple[int, ...], mag: float, dtype: str | None = None) -> _V:
        v = _V(name, tuple(shape), mag, dtype or self.compute)
        self.pool.append(v)
        return v

    # ----- inputs ------------------------------------------------------------------------
    def input(self, shape: tuple[int, ...], dtype: str | None = None, low: int = -3) -> _V:
        d = dtype or self.dtype
        stored = "float32" if d == "bfloat16" else d
        name = f"in{len(self.inputs)}"
        dims: list[Any] = list(shape)
        if not self.inputs:
            self.batch = shape[0] if shape else 1
        if self.symbolic and dims and dims[0] == self.batch:  # the feeds bind it one way
            dims[0] = "batch"
        self.inputs.append(helper.make_tensor_value_info(name, _ONNX[stored], dims))
        if stored == "int64":
            self.feeds[name] = self.rng.integers(low, 4, shape).astype(np.int64)
        else:
            self.feeds[name] = self.rng.standard_normal(shape).astype(self.np_dtype(stored))
        if d == "bfloat16":  # the graph computes in bfloat16
            (cast,) = self.node("Cast", [name], to=TensorProto.BFLOAT16)
            v = self.add(cast, shape, 5.0, "bfloat16")
        else:
            v = self.add(name, shape, 5.0 if d != "int64" else 3.0, d)
        v.is_input = True
        return v

    # ----- value selection -----------------------------------------------------------------
    def pick(self, pred: Callable[[_V], bool] = lambda v: True) -> _V | None:
        vals = [v for v in self.pool if v.dtype == self.compute and pred(v)]
        if not vals:
            return None
        recent = vals[-4:]  # favour recent values: deeper chains, still some fan-out
        return self.c.choice(recent if self.c.flag(0.7) else vals)

    def tame(self, v: _V) -> _V:
        """``Tanh`` of a value whose bound grew past the dtype's (keeps every later op in a
        well-conditioned range)."""
        if v.mag <= _BOUND[self.compute] or self.compute == "int64":
            return v
        if self.compute == "int64":
            return v
        (y,) = self.node("Tanh", [v.name])
        return self.add(y, v.shape, 1.0)


def tensor_size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def bcast_shape(c: Chooser, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape broadcasting to ``shape``: a suffix of it with some dims set to 1."""
    k = c.int(0, len(shape))
    tail = [1 if c.flag(0.3) else d for d in shape[len(shape) - k :]]
    return tuple(tail)


# --------------------------------------------------------------------------- generator
def build_graph(c: Chooser, *, seed: int | None = None) -> FuzzGraph:
    """One random graph drawn with ``c`` (see the module docstring)."""
    from graph_autofusion.testing import fuzz_steps

    dtype = c.choice(["float32"] * 5 + ["float16"] * 2 + ["bfloat16"] * 2 + ["int64"])
    symbolic = c.flag(0.35)
    b = _Builder(c, dtype, symbolic)
    rank = c.int(2, 4)
    shape = tuple(c.choice(DIMS) for _ in range(rank))
    while tensor_size(shape) > MAX_ELEMENTS // 4:
        shape = tuple(max(1, d // 2) for d in shape)
    if c.flag(0.6) and shape[-1] < 4:  # norms and contractions read a real last axis
        shape = (*shape[:-1], c.choice((4, 8, 16)))
    b.input(shape)
    if c.flag(0.5):
        b.input(shape if c.flag(0.6) else bcast_shape(c, shape) or (1,))
    target = c.int(5, 40)
    steps = fuzz_steps.steps_for(dtype)
    names, weights = zip(*steps)
    guard = 0
    while len(b.nodes) < target and guard < 200:
        guard += 1
        step = names[_weighted(c, weights)]
        before = len(b.nodes)
        fuzz_steps.STEPS[step](b)
        if len(b.nodes) > 44:  # a pattern overshot: stop growing
            break
        if len(b.nodes) == before:
            continue
    _outputs(b)
    graph = helper.make_graph(b.nodes, "fuzz", b.inputs, _output_infos(b), b.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="graph-autofusion.fuzz",
    )
    model.ir_version = 10
    ops = sorted({n.op_type for n in b.nodes})
    return FuzzGraph(seed, model, b.feeds, dtype, symbolic, ops, sorted(set(b.patterns)))


def _weighted(c: Chooser, weights: tuple[int, ...]) -> int:
    r = c.int(0, sum(weights) - 1)
    for i, w in enumerate(weights):
        if r < w:
            return i
        r -= w
    return len(weights) - 1


def _outputs(b: _Builder) -> None:
    """The last value, and sometimes internal values that later nodes also read."""
    internal = [v for v in b.pool if not v.is_input and v.name != b.pool[-1].name]
    outs = [b.pool[-1]] if not b.pool[-1].is_input else []
    for _ in range(b.c.int(0, 2)):
        if internal:
            v = b.c.choice(internal)
            if v not in outs:
                outs.append(v)
    if not outs:  # a graph of inputs only: one node at least
        v = b.pool[-1]
        (y,) = b.node("Neg" if v.dtype != "bfloat16" else "Identity", [v.name])
        outs.append(b.add(y, v.shape, v.mag, v.dtype))
    b.outs = outs  # type: ignore[attr-defined]


def _output_infos(b: _Builder) -> list[onnx.ValueInfoProto]:
    infos = []
    final = []
    for v in b.outs:  # type: ignore[attr-defined]
        name = v.name
        if v.dtype == "bfloat16":  # back to the inputs' type, as mixed-precision exports do
            (name,) = b.node("Cast", [v.name], to=TensorProto.FLOAT)
        final.append((name, "float32" if v.dtype == "bfloat16" else v.dtype, v.shape))
    for name, d, shape in final:
        dims: list[Any] = list(shape)
        if b.symbolic and dims:
            dims = [None] * len(dims)  # onnx infers them; the symbol may have moved
        infos.append(helper.make_tensor_value_info(name, _ONNX[d], dims if dims else []))
    return infos


def random_graph(seed: int) -> FuzzGraph:
    """The graph of ``seed`` (deterministic: the same graph in every process and run)."""
    return build_graph(RngChooser(seed), seed=seed)


# --------------------------------------------------------------------------- hypothesis
class _DrawChooser(Chooser):
    def __init__(self, draw: Any) -> None:
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def int(self, lo: int, hi: int) -> int:
        return int(self.draw(self.st.integers(lo, hi)))


def graphs() -> Any:
    """A hypothesis strategy of :class:`FuzzGraph` (every choice drawn, so it shrinks)."""
    from hypothesis import strategies as st

    @st.composite
    def _graphs(draw: Any) -> FuzzGraph:
        return build_graph(_DrawChooser(draw))

    return _graphs()


def seeds(lo: int = 0, hi: int = 2**31 - 1) -> Any:
    """A hypothesis strategy of seeded graphs (failures print a seed that reproduces)."""
    from hypothesis import strategies as st

    return st.integers(lo, hi).map(random_graph)
