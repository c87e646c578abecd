"""Local-memory need of a fused kernel, found by a small tiling search.

A fused kernel works tile by tile: it loads a tile of each external input from main memory into
local memory (Ascend Unified Buffer, GPU shared memory, CPU L2), computes every operator of the
group on it, and writes the tile of each output back. Intermediates never leave local memory.
The *working set* of a tile is what must be resident at once.

Iteration space
    The largest value the group computes (by element count) defines it: for an elementwise
    chain the output, for ``MatMul -> Softmax`` the score matrix. Each tile is a box in it.

Legality
    A reduction needs its whole reduced axes in one tile: ``Softmax``/``LayerNormalization``
    rows, ``ReduceMean`` axes, ``GlobalAveragePool``'s spatial axes. Those tile dims are fixed to
    the full extent. A contraction (``MatMul``, ``Gemm``, ``Conv``) tiles its output freely and
    its reduction dimension ``K`` in chunks ``tk`` (the accumulator stays resident).

Candidates
    Powers of two per dim (plus the full extent): "contiguous blocks" (full on inner dims,
    partial on one dim, 1 on outer dims) and 2-D blocks on the last two dims; times ``tk`` for
    contractions. A few hundred to a few thousand candidates.

Footprint of a value in a tile
    The value is aligned to the iteration space from the right; a dim equal to the space's dim
    contributes the tile's extent, a broadcast dim (size 1) contributes 1, a mismatching dim is
    taken whole (conservative). Contraction operands use their own tiles (``tm x tk`` of A,
    ``tk x tn`` of B; a Conv input tile includes its halo). Bytes per element: the value's
    dtype for inputs and outputs; intermediates and contraction accumulators at least 4
    (fp32 compute inside the fused region). External inputs are double-buffered (x2: the next
    tile loads while this one computes); intermediates and outputs count once. All
    intermediates are counted live at once, an upper bound.

Choice
    Among the tiles that fit the capacity, the one with the least main-memory traffic
    (``tiles x (input + output tile bytes) + tiles x TILE_OVERHEAD_BYTES``): largest tiles for
    elementwise work, balanced ``tm ~ tn`` for contractions. When not even the smallest legal
    tile (e.g. one full reduction row) fits, the group overflows local memory.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from graph_autofusion.ir.core import Node, Value, const_value

#: Fixed cost of one tile (loop overhead, DMA descriptor), expressed as equivalent bytes moved.
TILE_OVERHEAD_BYTES = 1024

#: Double-buffering factor of external inputs.
INPUT_BUFFERS = 2

_CONTRACTIONS = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Conv", "FusedConv", "MatMulInteger"}
_LAST_AXIS_NORMS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


@dataclass
class TilePlan:
    """Result of the tiling search for one fused group.

    Attributes:
        iteration_shape: The tiled space (shape of the group's largest computed value).
        whole_axes: Axes of the space a tile must cover whole (reductions).
        tile: Chosen tile (or the minimal legal tile when none fits).
        k_tile: Chunk of a contraction's reduction dim (``None`` without contraction).
        working_set_bytes: Local memory the chosen tile needs.
        minimal_bytes: Local memory the smallest legal tile needs.
        capacity_bytes: The profile's local memory.
        fits: Whether some legal tile fits.
        n_tiles: Number of tiles covering the space.
        traffic_bytes: Main-memory traffic of the chosen tiling (incl. re-reads).
        candidates: Tiles examined.
        footprints: Value name -> bytes resident in the chosen tile (buffering included).
    """

    iteration_shape: tuple[int, ...]
    whole_axes: tuple[int, ...]
    tile: tuple[int, ...]
    k_tile: int | None
    working_set_bytes: int
    minimal_bytes: int
    capacity_bytes: int
    fits: bool
    n_tiles: int
    traffic_bytes: int
    candidates: int
    footprints: dict[str, int] = field(default_factory=dict)


def _static(v: Value | None) -> bool:
    return v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape)


def _itemsize(v: Value) -> int:
    return v.dtype.itemsize if v.dtype is not None else 4


def _norm_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    return tuple(sorted({a % rank for a in axes})) if rank else ()


def _const_ints(node: Node, index: int) -> list[int] | None:
    """Input ``index`` of ``node`` as constant ints: an initializer or a ``Constant`` node's
    output (seen through ``Identity``), also for a detached shadow node (cost.shapes) through
    the model node it shadows; ``None`` when it is computed at run time."""
    candidates = [node]
    original = node.meta.get("original") if hasattr(node, "meta") else None
    if original is not None:
        candidates.append(original)
    for n in candidates:
        v = n.inputs[index] if index < len(n.inputs) else None
        data = const_value(v) if v is not None else None
        if data is not None:
            return [int(x) for x in np.asarray(data).reshape(-1).tolist()]
    return None


def reduced_axes(node: Node, *, unknown_as_all: bool = True) -> tuple[int, ...] | None:
    """Axes of ``node``'s first input that one tile must hold whole (empty if none).

    A reduction whose axes are a run-time input counts as reducing every axis (a tile must
    then hold the whole tensor), or gives ``None`` with ``unknown_as_all=False``.
    """
    x = node.inputs[0] if node.inputs else None
    if x is None or x.shape is None:
        return ()
    rank = len(x.shape)
    op = node.op_type
    if rank == 0:
        return ()
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return _norm_axes([node.attr("axis", -1)], rank)
    if op in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"):
        axis = node.attr("axis", -1) % rank
        return tuple(range(axis, rank))
    if op in _LAST_AXIS_NORMS:
        return (rank - 1,)
    if op in ("ArgMax", "ArgMin", "CumSum"):
        return _norm_axes([node.attr("axis", 0)], rank)
    if op in ("InstanceNormalization", "GroupNormalization", "GlobalAveragePool", "GlobalMaxPool"):
        return tuple(range(2 if op != "GroupNormalization" else 1, rank))
    if op.startswith("Reduce"):
        axes = node.attr("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = _const_ints(node, 1)
            if axes is None:
                return tuple(range(rank)) if unknown_as_all else None
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return ()
            return tuple(range(rank))
        return _norm_axes(axes, rank)
    return ()


def _align(v_shape: Sequence[int], space: Sequence[int]) -> list[int | None]:
    """For each dim of ``v_shape``: the matching space axis, or None (broadcast or mismatch)."""
    r, s = len(v_shape), len(space)
    out: list[int | None] = []
    for j, d in enumerate(v_shape):
        i = s - r + j
        out.append(i if 0 <= i < s and space[i] == d else None)
    return out


def _footprint_elems(v_shape: Sequence[int], space: Sequence[int], tile: Sequence[int]) -> int:
    """Elements of a value touched by one tile (right alignment, else left, the smaller)."""

    def by(al: list[int | None]) -> int:
        n = 1
        for d, i in zip(v_shape, al):
            n *= 1 if d == 1 else (tile[i] if i is not None else d)
        return n

    right = by(_align(v_shape, space))
    left_al: list[int | None] = [
        j if j < len(space) and space[j] == d else None for j, d in enumerate(v_shape)
    ]
    return min(right, by(left_al))


def _opts(n: int) -> list[int]:
    vals = {1 << k for k in range(int(math.log2(n)) + 1)} if n >= 1 else {1}
    vals.add(n)
    return sorted(vals)


def _candidate_tiles(space: tuple[int, ...], whole: tuple[int, ...]) -> list[tuple[int, ...]]:
    r = len(space)
    tiles: set[tuple[int, ...]] = set()
    for d in range(r):
        for x in _opts(space[d]):
            t = [1] * d + [x] + list(space[d + 1 :])
            tiles.add(tuple(t))
    if r >= 2:
        for a, b in itertools.product(_opts(space[-2]), _opts(space[-1])):
            tiles.add(tuple([1] * (r - 2) + [a, b]))
    if r == 0:
        tiles.add(())
    fixed = set()
    for t in tiles:
        lst = list(t)
        for a in whole:
            lst[a] = space[a]
        fixed.add(tuple(lst))
    return sorted(fixed)


@dataclass
class _Operand:
    """A contraction operand: how its tile depends on (tile, tk)."""

    value: Value
    kind: str  # "A", "B", "conv_x", "conv_w"
    node: Node


def _contraction_operands(
    nodes: Sequence[Node],
) -> tuple[dict[str, _Operand], int | None, Node | None]:
    ops: dict[str, _Operand] = {}
    k_dim = None
    root = None
    for n in nodes:
        if n.op_type not in _CONTRACTIONS or len(n.inputs) < 2:
            continue
        a, b = n.inputs[0], n.inputs[1]
        if not (_static(a) and _static(b)):
            continue
        if n.op_type in ("Conv", "FusedConv"):
            k = int(b.shape[1]) if len(b.shape) > 1 else 1
            ops[a.name] = _Operand(a, "conv_x", n)
            ops[b.name] = _Operand(b, "conv_w", n)
        else:
            trans_a = bool(n.attr("transA", 0))
            k = int(a.shape[-2] if trans_a and len(a.shape) >= 2 else a.shape[-1])
            ops[a.name] = _Operand(a, "A", n)
            ops[b.name] = _Operand(b, "B", n)
        if k_dim is None or k > k_dim:
            k_dim, root = k, n
    return ops, k_dim, root


def _operand_elems(op: _Operand, space: tuple[int, ...], tile: tuple[int, ...], tk: int) -> int:
    v, n = op.value, op.node
    out = n.outputs[0]
    shape = tuple(int(d) for d in v.shape)
    if not _static(out):
        return math.prod(shape)
    oshape = tuple(int(d) for d in out.shape)
    # tile extents of the contraction's output dims (aligned to the space)
    al = _align(oshape, space)
    ot = [tile[i] if i is not None else d for d, i in zip(oshape, al)]
    if op.kind in ("A", "B"):
        if len(oshape) < 2:
            return math.prod(shape)
        batch = math.prod(ot[:-2]) if op.kind == "A" or len(shape) > 2 else 1
        if op.kind == "A":
            return batch * ot[-2] * min(tk, shape[-1] if len(shape) else 1)
        return batch * min(tk, shape[-2] if len(shape) >= 2 else 1) * ot[-1]
    if op.kind == "conv_w":  # [Co, Ci/g, kh, kw]
        co = ot[1] if len(ot) > 1 else shape[0]
        return co * min(tk, shape[1]) * math.prod(shape[2:])
    # conv_x: [N, Ci, H, W] with a halo
    w = n.inputs[1]
    kernel = [int(d) for d in w.shape[2:]] if _static(w) else [1] * (len(shape) - 2)
    strides = list(n.attr("strides", [1] * len(kernel)))
    dil = list(n.attr("dilations", [1] * len(kernel)))
    elems = (ot[0] if ot else 1) * min(tk, shape[1])
    for k, (t, s, dl, full) in enumerate(zip(ot[2:], strides, dil, shape[2:])):
        elems *= min(full, (t - 1) * s + (kernel[k] - 1) * dl + 1)
    return elems


_PLAN_CACHE: dict[tuple, tuple[TilePlan | None, tuple[str, ...]]] = {}
_PLAN_CACHE_MAX = 4096


def _attr_key(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return ("array", a.shape, str(a.dtype), a.tobytes()[:256])
    if isinstance(a, list | tuple):
        return tuple(_attr_key(x) for x in a)
    return a if isinstance(a, int | float | str | bool | type(None)) else repr(a)


def _group_key(
    nodes: Sequence[Node],
    capacity: int,
    inputs: Sequence[Value],
    outputs: Sequence[Value],
    intermediates: Sequence[Value],
) -> tuple[tuple, tuple[str, ...]]:
    """A key equal for groups of the same structure, shapes and dtypes (the repeated layers
    of a model), and the group's value names in canonical order.

    The data of a small constant is part of the key where the search may read it: integer
    constants (axes, shapes) and what a ``Reduce*`` node reads past its first input. Float
    data (a layer's LayerNorm gamma, its biases) never changes the plan, and keying on it
    would give every layer its own search."""
    ids: dict[str, int] = {}
    read_as_ints = {
        id(v)
        for n in nodes
        if n.op_type.startswith("Reduce")
        for v in n.inputs[1:]
        if v is not None
    }

    def vid(v: Value | None) -> Any:
        if v is None:
            return None
        c = const_value(v)  # axes, shapes: small constants the search reads
        data = None
        if c is not None and c.size <= 64 and (c.dtype.kind in "iub" or id(v) in read_as_ints):
            data = tuple(c.ravel().tolist())
        return (ids.setdefault(v.name, len(ids)), str(v.dtype), v.shape, data)

    parts: list[Any] = [capacity]
    for n in nodes:
        attrs = tuple(sorted((k, _attr_key(a)) for k, a in n.attrs.items()))
        parts.append(
            (
                n.op_type,
                n.domain,
                attrs,
                tuple(vid(v) for v in n.inputs),
                tuple(vid(v) for v in n.outputs),
            )
        )
    for vs in (inputs, outputs, intermediates):
        parts.append(tuple(vid(v) for v in vs))
    return tuple(parts), tuple(ids)


def plan_tiles(
    nodes: Sequence[Node],
    capacity_bytes: int,
    *,
    inputs: Sequence[Value],
    outputs: Sequence[Value],
    intermediates: Sequence[Value],
) -> TilePlan | None:
    """Tiling search for a fused group (``None`` when a needed shape is not static).

    The search runs once per group structure: a group equal to an earlier one in structure,
    shapes and dtypes (the next layer's) takes its plan, footprints renamed to its values.

    Args:
        nodes: The group's nodes with concrete shapes (shadow nodes), topological order.
        capacity_bytes: Local memory available to one tile.
        inputs: External inputs (read from main memory).
        outputs: Values written back to main memory.
        intermediates: Values produced and consumed inside the group.
    """
    try:
        key, names = _group_key(nodes, capacity_bytes, inputs, outputs, intermediates)
    except TypeError:  # an unhashable attribute: search without the cache
        return _plan_tiles(nodes, capacity_bytes, inputs, outputs, intermediates)
    hit = _PLAN_CACHE.get(key)
    if hit is None:
        plan = _plan_tiles(nodes, capacity_bytes, inputs, outputs, intermediates)
        if len(_PLAN_CACHE) >= _PLAN_CACHE_MAX:
            _PLAN_CACHE.clear()
        _PLAN_CACHE[key] = (plan, names)
        return plan
    plan, first = hit
    if plan is None:
        return None
    rename = dict(zip(first, names))
    return replace(plan, footprints={rename.get(k, k): b for k, b in plan.footprints.items()})


def _plan_tiles(
    nodes: Sequence[Node],
    capacity_bytes: int,
    inputs: Sequence[Value],
    outputs: Sequence[Value],
    intermediates: Sequence[Value],
) -> TilePlan | None:
    computed = [o for n in nodes for o in n.outputs]
    if not all(_static(v) for v in [*inputs, *outputs, *intermediates]) or not computed:
        return None
    if not all(_static(v) for v in computed):
        return None
    space_v = max(computed, key=lambda v: (math.prod(v.shape), len(v.shape)))
    space = tuple(int(d) for d in space_v.shape)
    if 0 in space:  # an empty tensor (no global tokens, an empty cache): nothing to tile
        return TilePlan(
            iteration_shape=space,
            whole_axes=(),
            tile=space,
            k_tile=None,
            working_set_bytes=0,
            minimal_bytes=0,
            capacity_bytes=int(capacity_bytes),
            fits=True,
            n_tiles=0,
            traffic_bytes=0,
            candidates=0,
            footprints={},
        )
    whole: set[int] = set()
    for n in nodes:
        x = n.inputs[0] if n.inputs else None
        axes = reduced_axes(n)
        if not axes or x is None or not _static(x):
            continue
        al = _align(tuple(x.shape), space)
        for a in axes:
            i = al[a] if a < len(al) else None
            if i is not None:
                whole.add(i)
            else:
                # reduced axis not in the space: it is whole anyway (the value is taken whole)
                pass
    whole_t = tuple(sorted(whole))
    operands, k_dim, _ = _contraction_operands(nodes)
    k_opts = _opts(k_dim) if k_dim else [1]
    in_names = {v.name for v in inputs}
    out_names = {v.name for v in outputs}

    def cost(tile: tuple[int, ...], tk: int) -> tuple[int, int, dict[str, int]]:
        fp: dict[str, int] = {}
        traffic = 0
        for v in [*inputs, *intermediates, *outputs]:
            if v.name in fp:
                continue
            shape = tuple(int(d) for d in v.shape)
            if v.name in operands:
                elems = _operand_elems(operands[v.name], space, tile, tk)
            else:
                elems = _footprint_elems(shape, space, tile)
            size = _itemsize(v)
            if v.name in in_names:
                b = elems * size
                traffic += b
                fp[v.name] = b * INPUT_BUFFERS
            elif v.name in out_names:
                traffic += elems * size
                fp[v.name] = elems * max(size, 4 if v.producer in operands_nodes else size)
            else:
                fp[v.name] = elems * max(size, 4)
        return sum(fp.values()), traffic, fp

    operands_nodes = {op.node for op in operands.values()}
    best = None
    minimal = None
    count = 0
    for tile in _candidate_tiles(space, whole_t):
        n_tiles = math.prod(math.ceil(s / t) for s, t in zip(space, tile)) if space else 1
        for tk in k_opts:
            count += 1
            ws, traffic, fp = cost(tile, tk)
            k_iters = math.ceil(k_dim / tk) if k_dim else 1
            total = n_tiles * traffic + n_tiles * k_iters * TILE_OVERHEAD_BYTES
            if minimal is None or ws < minimal[0]:
                minimal = (ws, tile, tk, n_tiles, total, fp)
            if ws <= capacity_bytes and (best is None or (total, -ws) < (best[4], -best[0])):
                best = (ws, tile, tk, n_tiles, total, fp)
    assert minimal is not None
    chosen = best if best is not None else minimal
    return TilePlan(
        iteration_shape=space,
        whole_axes=whole_t,
        tile=chosen[1],
        k_tile=chosen[2] if k_dim else None,
        working_set_bytes=int(chosen[0]),
        minimal_bytes=int(minimal[0]),
        capacity_bytes=int(capacity_bytes),
        fits=best is not None,
        n_tiles=int(chosen[3]),
        traffic_bytes=int(chosen[4]),
        candidates=count,
        footprints=dict(chosen[5]),
    )
