"""Sample inputs the model accepts: values of inputs that carry shapes, sizes or indices.

:func:`~graph_autofusion.verify.inputs.generate_inputs` draws every input from its name and
type; an integer input that an operator reads as a shape, a split, a slice bound or indices
then usually makes the model fail (an ``Expand`` whose target shape is a graph input, a
``SplitToSequence`` whose split sizes are). This module is the one place that knows those
operators: :func:`derive_shape_inputs` finds each graph input that such an operand reads
(directly or through ``Cast``/``Identity``) and gives it a value consistent with the concrete
shapes of the model on the other inputs (ONNX shape inference with data propagation, rerun
as values get fixed, so a derived ``Reshape`` shape feeds the ``Expand`` after it). A generated
value already valid (token ids within the embedding table) is kept as drawn. A KV-cache
decoder's inputs are first made to agree (:func:`graph_autofusion.verify.kv_inputs.conform`:
the mask over past + new tokens, the positions after the past); those values are kept.

When the original model still fails on the sample inputs, :func:`run_failure` turns the
runtime's exception into one :class:`~graph_autofusion.errors.SampleInputError` naming the
failing node and the inputs that reach it, and pointing to ``--inputs``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graph_autofusion.errors import SampleInputError
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.verify import kv_inputs

#: One sample input larger than this is refused (an absurd declared dim, e.g. 2**40).
MAX_INPUT_BYTES = 1 << 30
_PASS = {"Cast", "Identity"}
_ROUNDS = 4
_STANDARD = ("", "ai.onnx")


class SampleInputs(dict):
    """Generated sample feeds (a plain dict to every user) that remember how they were made:
    ``derived`` maps an input name to the operand it was derived for; ``notes`` say what could
    not be derived (added to the error when the model fails on them)."""

    generated = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.derived: dict[str, str] = {}
        self.notes: list[str] = []


def own_copy(feeds: Mapping[str, Any]) -> dict[str, Any]:
    """A pipeline's own copy of ``feeds``; generated ones stay :class:`SampleInputs`."""
    if isinstance(feeds, SampleInputs):
        copy = SampleInputs(feeds)
        copy.derived = dict(feeds.derived)
        copy.notes = list(getattr(feeds, "notes", ()))
        return copy
    return dict(feeds)


def is_generated(feeds: Any) -> bool:
    """True for feeds made by :func:`~graph_autofusion.verify.inputs.generate_inputs`."""
    return bool(getattr(feeds, "generated", False))


def check_input_size(model: Model, v: Value, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse a sample input too large to allocate (before anything allocates it)."""
    n = math.prod(shape)
    size = n * max(dtype.itemsize, 1)
    if size > MAX_INPUT_BYTES:
        raise SampleInputError(
            f"{source_of(model)}: graph input {v.name!r} declares shape {v.shape} "
            f"({n} elements, {size / 2**30:.1f} GiB): too large for a generated sample input; "
            f"pass inputs with --inputs FILE.npz (API: sample_inputs={{...}})"
        )


def source_of(model: Model) -> str:
    """The file the model was read from (or its graph name), for messages."""
    return str(model.meta.get("onnx_source") or f"graph {model.graph.name!r}")


# ----------------------------------------------------------------------------- derivation
@dataclass
class _Ctx:
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


def _expand(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    k = c.declared_len(len(ds))
    if k == 0:
        return c.vec([])
    return c.vec(list(ds[-k:]) if k <= len(ds) else [1] * (k - len(ds)) + list(ds))


def _expand_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    try:
        out = np.broadcast_shapes(ds, tuple(int(x) for x in cur.reshape(-1)))
    except ValueError:
        return False
    return math.prod(out) <= max(math.prod(ds), 1) * 64


def _reshape(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    k = c.declared_len(len(ds))
    if k == 0:
        return c.vec([]) if math.prod(ds) == 1 else None
    if k >= len(ds):
        return c.vec(list(ds) + [1] * (k - len(ds)))
    return c.vec(list(ds[: k - 1]) + [math.prod(ds[k - 1 :])])


def _reshape_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
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


def _tile(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    return None if ds is None else c.vec([1] * c.declared_len(len(ds)))


def _tile_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    rep = cur.reshape(-1)
    return rep.size == len(ds) and bool((rep >= 0).all()) and math.prod(rep.tolist()) <= 64


def _ones_shape(c: _Ctx) -> np.ndarray:
    return c.vec([1] * c.declared_len(1))


def _nonneg_small(c: _Ctx, cur: np.ndarray) -> bool:
    return bool((cur >= 0).all()) and math.prod(cur.reshape(-1).tolist()) <= 1 << 20


def _gather(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    n = ds[c.axis(0, len(ds))]
    return c.rng.integers(0, n, c.current.shape).astype(c.dtype) if n > 0 else None


def _gather_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if not ds:
        return None
    n = ds[c.axis(0, len(ds))]
    return bool(((cur >= -n) & (cur < n)).all())


def _gather_elements(c: _Ctx) -> np.ndarray | None:
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


def _gather_elements_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if not ds:
        return None
    axis = c.axis(0, len(ds))
    if cur.ndim != len(ds) or any(cur.shape[i] > ds[i] for i in range(len(ds)) if i != axis):
        return False
    n = ds[axis]
    return bool(((cur >= -n) & (cur < n)).all())


def _gather_nd(c: _Ctx) -> np.ndarray | None:
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


def _gather_nd_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if not ds:
        return None
    b = int(c.node.attr("batch_dims", 0) or 0)
    if cur.ndim < 1 or cur.shape[:b] != tuple(ds[:b]) or not 1 <= cur.shape[-1] <= len(ds) - b:
        return False
    bound = np.asarray(ds[b : b + cur.shape[-1]])
    return bool(((cur >= -bound) & (cur < bound)).all())


def _split_to_sequence(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    length = ds[c.axis(0, len(ds))]
    if c.value.shape == ():
        return c.vec([max(1, length // 2)])
    k = c.declared_len(min(2, max(length, 1)))
    return c.vec(_distribute(length, k)) if k else None


def _split(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    return c.vec(_distribute(ds[c.axis(0, len(ds))], len(c.node.outputs)))


def _topk(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if not ds:
        return None
    n = ds[c.axis(-1, len(ds))]
    return c.vec([max(1, n // 2) if n else 0])


def _slice(c: _Ctx) -> np.ndarray | None:
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


def _onehot_depth(c: _Ctx) -> np.ndarray:
    depth = max(2, min(c.seq_len, 16))
    return c.vec([depth]) if c.declared_len(0) == 1 else _scalar(depth)(c)


def _onehot_indices(c: _Ctx) -> np.ndarray | None:
    depth = c.consts(c.node.inputs[1] if len(c.node.inputs) > 1 else None)
    if depth is None:
        return None
    d = int(np.asarray(depth).reshape(-1)[0])
    return c.rng.integers(0, max(d, 1), c.current.shape).astype(c.dtype)


def _onehot_indices_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    depth = c.consts(c.node.inputs[1] if len(c.node.inputs) > 1 else None)
    if depth is None:
        return None
    d = int(np.asarray(depth).reshape(-1)[0])
    return bool(((cur >= -d) & (cur < d)).all())


def _pad(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    return None if ds is None else c.vec([0] * c.declared_len(2 * len(ds)))


def _pad_ok(c: _Ctx, cur: np.ndarray) -> bool | None:
    ds = c.data_shape()
    if ds is None:
        return None
    return cur.size == 2 * len(ds) and bool((cur >= 0).all()) and bool((cur <= 64).all())


def _unsqueeze(c: _Ctx) -> np.ndarray:
    return c.vec(list(range(c.declared_len(1))))


def _squeeze(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    ones = [i for i, d in enumerate(ds) if d == 1]
    k = c.declared_len(len(ones))
    return c.vec(ones[:k]) if k <= len(ones) else None


def _reduce_axes(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    if ds is None:
        return None
    k = c.declared_len(1)
    return c.vec(list(range(len(ds) - k, len(ds)))) if k <= len(ds) else None


def _resize_sizes(c: _Ctx) -> np.ndarray | None:
    ds = c.data_shape()
    return None if ds is None else c.vec(list(ds[-c.declared_len(len(ds)) :]))


def _fill(value: float) -> Callable[[_Ctx], np.ndarray]:
    return lambda c: c.vec([value] * (c.declared_len(1) if c.value.shape != () else 1))


def _scalar(value: float) -> Callable[[_Ctx], np.ndarray]:
    return lambda c: np.asarray(value, dtype=c.dtype).reshape(())


def _divisor(c: _Ctx) -> np.ndarray | None:
    if c.dtype.kind not in "iu":
        return None
    return c.rng.integers(1, max(2, c.seq_len), c.current.shape).astype(c.dtype)


def _divisor_ok(c: _Ctx, cur: np.ndarray) -> bool:
    return c.dtype.kind not in "iu" or bool((cur != 0).all())


_Derive = Callable[[_Ctx], "np.ndarray | None"]
_Valid = Callable[[_Ctx, np.ndarray], "bool | None"]
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


@dataclass
class _Role:
    value: Value
    node: Node
    index: int


def find_roles(model: Model) -> list[_Role]:
    """Graph inputs an operator reads as a shape, sizes, bounds or indices (through
    ``Cast``/``Identity``), each with the first such operand."""
    graph = model.graph
    roles = []
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        frontier, seen = [v], {id(v)}
        while frontier:
            cur = frontier.pop()
            for node, idx in cur.users:
                if idx < 0 or node.domain not in _STANDARD:
                    continue
                if (node.op_type, idx) in ROLES:
                    roles.append(_Role(v, node, idx))
                elif node.op_type in _PASS:
                    for out in node.outputs:
                        if id(out) not in seen:
                            seen.add(id(out))
                            frontier.append(out)
    return roles


class _Shapes:
    """Concrete shapes of the model's values on the current feeds (and fixed values)."""

    def __init__(self, model: Model, feeds: Mapping[str, Any], fixed: Mapping[str, np.ndarray]):
        self.model, self.feeds, self.fixed = model, feeds, fixed
        self._inferred: dict[str, tuple[int, ...]] | None = None

    def shape(self, v: Value | None) -> tuple[int, ...] | None:
        if v is None:
            return None
        if v.const is not None:
            return tuple(np.shape(v.const))
        if v.name in self.feeds and v.producer is None:
            return tuple(np.shape(self.feeds[v.name]))
        if v.shape is not None and all(isinstance(d, int) and d >= 0 for d in v.shape):
            return tuple(v.shape)
        if self._inferred is None:
            self._inferred = _infer(self.model, self.feeds, self.fixed)
        return self._inferred.get(v.name)

    def const(self, v: Value | None) -> np.ndarray | None:
        if v is None:
            return None
        if v.const is not None:
            return np.asarray(v.const)
        if v.producer is None and v.name in self.fixed:
            return self.fixed[v.name]
        return None


def _infer(
    model: Model, feeds: Mapping[str, Any], fixed: Mapping[str, np.ndarray]
) -> dict[str, tuple[int, ...]]:
    """ONNX shape inference (data propagation on) with the feeds' shapes and the fixed values
    as constants; only fully known shapes are returned."""
    import onnx
    from onnx import numpy_helper

    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.frontend.onnx_read import inference_skeleton

    try:
        skel = inference_skeleton(to_onnx(model))
        inputs = list(skel.graph.input)
        del skel.graph.input[:]
        for vi in inputs:
            if vi.name in fixed:
                skel.graph.initializer.append(numpy_helper.from_array(fixed[vi.name], vi.name))
                continue
            arr = feeds.get(vi.name)
            if isinstance(arr, np.ndarray) and vi.type.HasField("tensor_type"):
                shp = vi.type.tensor_type.shape
                shp.Clear()
                shp.SetInParent()
                for d in arr.shape:
                    shp.dim.add().dim_value = int(d)
            skel.graph.input.append(vi)
        inferred = onnx.shape_inference.infer_shapes(
            skel, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception:  # noqa: BLE001 - no inference: nothing is derived from it
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if all(d is not None and d >= 0 for d in dims):
                out[vi.name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
    return out


def derive_shape_inputs(
    model: Model, feeds: dict[str, Any], *, seed: int = 0, seq_len: int = 16
) -> dict[str, str]:
    """Give every shape-, size- or index-carrying graph input (see :data:`ROLES`) a value the
    model accepts, in place in ``feeds``; a drawn value already valid is kept. Returns what
    was derived: input name -> ``"<op> 'node' <operand>"`` (or what a KV-cache decoder's input
    is). A KV-cache decoder whose relations cannot be derived adds a note to ``feeds.notes``
    (:class:`SampleInputs`)."""

    derived: dict[str, str] = {}
    kv = kv_inputs.plan(model)
    if isinstance(kv, kv_inputs.KVPlan):
        derived.update(kv_inputs.conform(model, feeds, kv))
    elif isinstance(kv, kv_inputs.KVRefusal):
        notes = getattr(feeds, "notes", None)
        if isinstance(notes, list) and kv.note not in notes:
            notes.append(kv.note)
    keep = set(derived)
    roles = find_roles(model)
    if not roles:
        return derived
    rng = np.random.default_rng([seed, 7919])
    fixed: dict[str, np.ndarray] = {}
    pending = roles
    for _ in range(_ROUNDS):
        shapes = _Shapes(model, feeds, fixed)
        rest: list[_Role] = []
        for r in pending:
            name = r.value.name
            if name in fixed or name not in feeds:
                continue
            if name in keep:  # a KV-cache decoder's mask, positions or lengths: as made
                fixed[name] = np.asarray(feeds[name])
                continue
            derive, valid, what = ROLES[(r.node.op_type, r.index)]
            cur = np.asarray(feeds[name])
            dtype = cur.dtype
            c = _Ctx(r.node, r.index, r.value, dtype, cur, shapes.shape, shapes.const, rng, seq_len)
            verdict = valid(c, cur) if valid is not None else False
            if verdict:
                fixed[name] = cur
                continue
            new = derive(c)
            if new is None:
                rest.append(r)
                continue
            feeds[name] = fixed[name] = np.asarray(new, dtype=dtype)
            derived[name] = f"{r.node.op_type} {r.node.name!r} {what}"
        if not rest or len(rest) == len(pending):
            break
        pending = rest
    return derived


# ----------------------------------------------------------------------------- failures
_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'(?: Status Message: (.*))?", re.S)
_TORCH_NODE = re.compile(r"failed at node '([^']*)' \(([^)]*)\): (.*)", re.S)
_ORT_INPUT = re.compile(r"(?:for input|input name|input): ?'?([\w./:-]+)'?")
_RUN_MARKERS = (
    "while running",
    "invalid dimensions for input",
    "Unexpected input data type",
    "Invalid rank for input",
    "Got invalid",
    "failed at node",
)


def run_failure(
    model: Model, feeds: Mapping[str, Any], exc: BaseException, *, runtime: str, generated: bool
) -> SampleInputError | None:
    """One clear error for the original model failing on the sample inputs (``None`` when
    ``exc`` is not such a failure, e.g. the runtime refused the model itself)."""
    text = " ".join(str(exc).split())
    if not any(m in text for m in _RUN_MARKERS):
        return None
    node_name, op, detail = "", "", text
    m = _ORT_NODE.search(text) or None
    if m:
        op, node_name, detail = m.group(1), m.group(2), (m.group(3) or text)
    else:
        t = _TORCH_NODE.search(text)
        if t:
            node_name, op, detail = t.group(1), t.group(2), t.group(3)
    detail = detail.split("onnxruntime::")[-1].strip()[:240]
    node = next((n for n in model.graph.nodes if node_name and n.name == node_name), None)
    suspects = _suspects(model, node, feeds)
    if not node:
        named = _ORT_INPUT.search(text)
        if named and named.group(1) in feeds:
            suspects = [named.group(1)]
    derived = getattr(feeds, "derived", {})
    how = "generated from the input specs" if generated else "given"
    at = f" at node {node_name!r} ({op})" if node_name else ""
    parts = []
    for name in suspects[:3]:
        arr = np.asarray(feeds[name]) if not isinstance(feeds[name], list) else None
        desc = "a sequence" if arr is None else f"{arr.dtype} {tuple(arr.shape)}"
        if arr is not None and arr.dtype.kind in "iub" and arr.size <= 8:
            desc += f" = {arr.reshape(-1).tolist()}"
        if name in derived:
            desc += f", derived as the {derived[name]}"
        parts.append(f"{name!r} ({desc})")
    carriers = [n for n in suspects if not _floating(feeds[n])]
    who = f"; check input{'s' if len(parts) > 1 else ''} {', '.join(parts)}" if parts else ""
    if not carriers:  # nothing shape- or index-like reaches it: maybe the model itself
        who += "; the model itself may be invalid, or it needs other inputs"
    for note in getattr(feeds, "notes", ()):
        who += f"; {note}"
    return SampleInputError(
        f"{source_of(model)}: the sample inputs {how} make the original model fail in "
        f"{runtime}{at}: {detail}{who}; pass inputs the model accepts with --inputs FILE.npz "
        f"(API: sample_inputs={{name: array}})"
    )


def _floating(arr: Any) -> bool:
    return not isinstance(arr, list) and np.asarray(arr).dtype.kind in "fc"


def _suspects(model: Model, node: Node | None, feeds: Mapping[str, Any]) -> list[str]:
    """Graph inputs reaching ``node`` (all of them without one), shape- or index-carrying
    (non-float) ones first."""
    graph = model.graph
    inputs = [v for v in graph.inputs if v.name not in graph.initializers and v.name in feeds]
    if node is not None:
        reach: set[int] = set()
        stack, seen = [node], {id(node)}
        while stack:
            n = stack.pop()
            for v in n.all_inputs():
                if v.producer is None:
                    reach.add(id(v))
                elif id(v.producer) not in seen:
                    seen.add(id(v.producer))
                    stack.append(v.producer)
        inputs = [v for v in inputs if id(v) in reach] or inputs

    carriers = [v.name for v in inputs if not _floating(feeds[v.name])]
    return carriers or [v.name for v in inputs]


__all__ = [
    "MAX_INPUT_BYTES",
    "ROLES",
    "SampleInputs",
    "check_input_size",
    "derive_shape_inputs",
    "find_roles",
    "is_generated",
    "own_copy",
    "run_failure",
]
