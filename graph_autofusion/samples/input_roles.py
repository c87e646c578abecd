"""The roles of model inputs that carry a shape, a size or an index (ROLES): for each
(operator, input position), how to derive a value the operator accepts from the sizes of
its other inputs, and how to check a value already chosen."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graph_autofusion.ir.core import Node, Value


@dataclass
class RoleContext:
    node: Node
    index: int
    value: Value
    dtype: np.dtype
    current: np.ndarray
    shapes: Callable[[Value | None], tuple[int, ...] | None]
    consts: Callable[[Value | None], np.ndarray | None]
    rng: np.random.Generator
    seq_len: int

    def data_shape(self, i: int = 0) -> tuple[int, ...] | None:
        ins = self.node.inputs
        return self.shapes(ins[i] if i < len(ins) else None)

    def declared_len(self, default: int) -> int:
        """The length of a 1-D operand: its declared length, else ``default``."""
        d = self.value.shape
        if d is not None and len(d) == 1 and isinstance(d[0], int) and d[0] >= 0:
            return d[0]
        return default

    def vec(self, values: list[int] | list[float]) -> np.ndarray:
        """``values`` as this input's dtype, a scalar when the input is declared 0-d."""
        arr = np.asarray(values, dtype=self.dtype)
        if self.value.shape == () and arr.size == 1:
            return arr.reshape(())
        return arr.reshape(-1)

    def axis(self, default: int, rank: int) -> int:
        a = int(self.node.attr("axis", default) or 0)
        return a + rank if a < 0 else a


def _distribute(total: int, parts: int) -> list[int]:
    base, rem = divmod(total, parts)
    return [base + 1] * rem + [base] * (parts - rem)


def _expand(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    k = c.declared_len(len(ds))
    if k == 0:
        return c.vec([])
    return c.vec(list(ds[-k:]) if k <= len(ds) else [1] * (k - len(ds)) + list(ds))


def _expand_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    try:
        out = np.broadcast_shapes(ds, tuple(int(x) for x in cur.reshape(-1)))
    except ValueError:
        return False
    return math.prod(out) <= max(math.prod(ds), 1) * 64


def _reshape(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    k = c.declared_len(len(ds))
    if k == 0:
        return c.vec([]) if math.prod(ds) == 1 else None
    if k >= len(ds):
        return c.vec(list(ds) + [1] * (k - len(ds)))
    return c.vec(list(ds[: k - 1]) + [math.prod(ds[k - 1 :])])


def _reshape_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    dims = [int(x) for x in cur.reshape(-1)]
    allowzero = int(c.node.attr("allowzero", 0) or 0)
    known, free = 1, 0
    for i, d in enumerate(dims):
        if d == -1:
            free += 1
        elif d == 0 and not allowzero:
            if i >= len(ds):
                return False
            known *= ds[i]
        elif d < 0:
            return False
        else:
            known *= d
    n = math.prod(ds)
    if free > 1:
        return False
    return (known > 0 and n % known == 0) if free else known == n


def _tile(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    return None if ds is None else c.vec([1] * c.declared_len(len(ds)))


def _tile_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    rep = cur.reshape(-1)
    return rep.size == len(ds) and bool((rep >= 0).all()) and math.prod(rep.tolist()) <= 64


def _ones_shape(c: RoleContext) -> np.ndarray:
    return c.vec([1] * c.declared_len(1))


def _nonneg_small(c: RoleContext, cur: np.ndarray) -> bool:
    return bool((cur >= 0).all()) and math.prod(cur.reshape(-1).tolist()) <= 1 << 20


def _gather(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    n = ds[c.axis(0, len(ds))]
    return c.rng.integers(0, n, c.current.shape).astype(c.dtype) if n > 0 else None


def _gather_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if not ds:
        return None
    n = ds[c.axis(0, len(ds))]
    return bool(((cur >= -n) & (cur < n)).all())


def _gather_elements(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    axis = c.axis(0, len(ds))
    decl = c.value.shape or ()
    shape = tuple(
        decl[i] if i < len(decl) and isinstance(decl[i], int) and decl[i] >= 0 else ds[i]
        for i in range(len(ds))
    )
    return c.rng.integers(0, max(ds[axis], 1), shape).astype(c.dtype) if ds[axis] else None


def _gather_elements_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if not ds:
        return None
    axis = c.axis(0, len(ds))
    if cur.ndim != len(ds) or any(cur.shape[i] > ds[i] for i in range(len(ds)) if i != axis):
        return False
    n = ds[axis]
    return bool(((cur >= -n) & (cur < n)).all())


def _gather_nd(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    b = int(c.node.attr("batch_dims", 0) or 0)
    m = c.current.shape[-1] if c.current.ndim else 1
    if m > len(ds) - b or m < 1:
        m = max(1, len(ds) - b)
    mid = c.current.shape[b:-1] if c.current.ndim > b + 1 else ()
    shape = (*ds[:b], *mid, m)
    cols = [c.rng.integers(0, max(ds[b + j], 1), shape[:-1]) for j in range(m)]
    return np.stack(cols, axis=-1).astype(c.dtype)


def _gather_nd_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if not ds:
        return None
    b = int(c.node.attr("batch_dims", 0) or 0)
    if cur.ndim < 1 or cur.shape[:b] != tuple(ds[:b]) or not 1 <= cur.shape[-1] <= len(ds) - b:
        return False
    bound = np.asarray(ds[b : b + cur.shape[-1]])
    return bool(((cur >= -bound) & (cur < bound)).all())


def _split_to_sequence(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    length = ds[c.axis(0, len(ds))]
    if c.value.shape == ():
        return c.vec([max(1, length // 2)])
    k = c.declared_len(min(2, max(length, 1)))
    return c.vec(_distribute(length, k)) if k else None


def _split(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    return c.vec(_distribute(ds[c.axis(0, len(ds))], len(c.node.outputs)))


def _topk(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    n = ds[c.axis(-1, len(ds))]
    return c.vec([max(1, n // 2) if n else 0])


def _slice(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    axes_in = c.node.inputs[3] if len(c.node.inputs) > 3 else None
    given = None if c.index == 3 else c.consts(axes_in)
    k = c.declared_len(len(ds) if given is None else int(np.asarray(given).size))
    axes = (
        [int(a) % max(len(ds), 1) for a in np.asarray(given).reshape(-1)]
        if given is not None
        else list(range(k))
    )
    if len(axes) != k or any(a >= len(ds) for a in axes):
        return None
    values = {1: [0] * k, 2: [ds[a] for a in axes], 3: axes, 4: [1] * k}[c.index]
    return c.vec(values)


def _onehot_depth(c: RoleContext) -> np.ndarray:
    depth = max(2, min(c.seq_len, 16))
    return c.vec([depth]) if c.declared_len(0) == 1 else _scalar(depth)(c)


def _onehot_indices(c: RoleContext) -> np.ndarray | None:
    depth = c.consts(c.node.inputs[1] if len(c.node.inputs) > 1 else None)
    if depth is None:
        return None
    d = int(np.asarray(depth).reshape(-1)[0])
    return c.rng.integers(0, max(d, 1), c.current.shape).astype(c.dtype)


def _onehot_indices_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    depth = c.consts(c.node.inputs[1] if len(c.node.inputs) > 1 else None)
    if depth is None:
        return None
    d = int(np.asarray(depth).reshape(-1)[0])
    return bool(((cur >= -d) & (cur < d)).all())


def _pad(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    return None if ds is None else c.vec([0] * c.declared_len(2 * len(ds)))


def _pad_ok(c: RoleContext, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    return cur.size == 2 * len(ds) and bool((cur >= 0).all()) and bool((cur <= 64).all())


def _unsqueeze(c: RoleContext) -> np.ndarray:
    return c.vec(list(range(c.declared_len(1))))


def _squeeze(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    ones = [i for i, d in enumerate(ds) if d == 1]
    k = c.declared_len(len(ones))
    return c.vec(ones[:k]) if k <= len(ones) else None


def _reduce_axes(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    k = c.declared_len(1)
    return c.vec(list(range(len(ds) - k, len(ds)))) if k <= len(ds) else None


def _resize_sizes(c: RoleContext) -> np.ndarray | None:
    ds = c.data_shape()
    return None if ds is None else c.vec(list(ds[-c.declared_len(len(ds)) :]))


def _fill(value: float) -> Callable[[RoleContext], np.ndarray]:
    return lambda c: c.vec([value] * (c.declared_len(1) if c.value.shape != () else 1))


def _scalar(value: float) -> Callable[[RoleContext], np.ndarray]:
    return lambda c: np.asarray(value, dtype=c.dtype).reshape(())


def _divisor(c: RoleContext) -> np.ndarray | None:
    if c.dtype.kind not in "iu":
        return None
    return c.rng.integers(1, max(2, c.seq_len), c.current.shape).astype(c.dtype)


def _divisor_ok(c: RoleContext, cur: np.ndarray) -> bool:
    return c.dtype.kind not in "iu" or bool((cur != 0).all())


_Derive = Callable[[RoleContext], "np.ndarray | None"]


_Valid = Callable[[RoleContext, np.ndarray], "bool | None"]


_REDUCE = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
)  # fmt: skip


#: (op type, input index) -> (derive a value, judge the drawn one (None: cannot tell yet)).
ROLES: dict[tuple[str, int], tuple[_Derive, _Valid | None, str]] = {
    ("Expand", 1): (_expand, _expand_ok, "target shape"),
    ("Reshape", 1): (_reshape, _reshape_ok, "shape"),
    ("Tile", 1): (_tile, _tile_ok, "repeats"),
    ("ConstantOfShape", 0): (_ones_shape, _nonneg_small, "shape"),
    ("Gather", 1): (_gather, _gather_ok, "indices"),
    ("GatherElements", 1): (_gather_elements, _gather_elements_ok, "indices"),
    ("GatherND", 1): (_gather_nd, _gather_nd_ok, "indices"),
    ("SplitToSequence", 1): (_split_to_sequence, None, "split sizes"),
    ("Split", 1): (_split, None, "split sizes"),
    ("TopK", 1): (_topk, None, "k"),
    ("Slice", 1): (_slice, None, "starts"),
    ("Slice", 2): (_slice, None, "ends"),
    ("Slice", 3): (_slice, None, "axes"),
    ("Slice", 4): (_slice, None, "steps"),
    ("OneHot", 0): (_onehot_indices, _onehot_indices_ok, "indices"),
    ("OneHot", 1): (_onehot_depth, None, "depth"),
    ("Pad", 1): (_pad, _pad_ok, "pads"),
    ("Unsqueeze", 1): (_unsqueeze, None, "axes"),
    ("Squeeze", 1): (_squeeze, None, "axes"),
    ("Range", 0): (_scalar(0), None, "start"),
    ("Range", 1): (lambda c: _scalar(c.seq_len)(c), None, "limit"),
    ("Range", 2): (_scalar(1), None, "delta"),
    ("CumSum", 1): (_scalar(0), None, "axis"),
    ("Trilu", 1): (_scalar(0), None, "k"),
    ("Resize", 2): (_fill(1.0), None, "scales"),
    ("Resize", 3): (_resize_sizes, None, "sizes"),
    ("Upsample", 1): (_fill(1.0), None, "scales"),
    ("Dropout", 1): (_scalar(0.1), None, "ratio"),
    ("Div", 1): (_divisor, _divisor_ok, "divisor"),
    ("Mod", 1): (_divisor, _divisor_ok, "divisor"),
    **{(op, 1): (_reduce_axes, None, "axes") for op in _REDUCE},
}
