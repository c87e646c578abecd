"""Sample inputs of KV-cache decoders: a past length, new tokens, a mask and positions that agree.

A KV-cache decoder (one graph for the prefill and the decode steps) takes the cache of the
tokens before as graph inputs (``past_key_values.{i}.key``/``.value``, ``past_key_values_0_0``,
``past_{i}``, ``cache_k.{i}`` ...), the ``S`` new tokens, an ``attention_mask`` over the past
and the new tokens (``P + S``), their positions (``P .. P+S-1``) and sometimes lengths
(``past_sequence_length``, ``total_sequence_length``, ``seqlens_k``). Drawn independently
(every unknown dim the same length, positions from 0) these disagree and the original model
fails (an invalid ``GatherND`` index, a broadcast of ``S`` against ``P + S``).

:func:`plan` derives the relations from the graph's input specs:

* a graph input named like a cache (``past``, or ``cache`` with ``key``/``value``/``kv``; not
  ``cache_position``), floating, rank >= 3, is a *past* input; its sequence axis is its one
  non-batch dim that is not static, or among several the one whose symbol reads like a length
  (``past``, ``seq``, ``len``, ...; never ``head``/``dim``/``hidden``); every such symbol is
  ``P``;
* the symbols of the batch axis (axis 0 of the ids, mask, positions, past) are ``B``;
* the new-token axis (the last axis of ``input_ids``, else of a ``*position*`` input, else axis 1
  of ``inputs_embeds``) is ``S``;
* a dim written as a sum (``past + seq``, ``past_sequence_length + 1``) is evaluated; a symbol
  naming a total (``total*``), the sequence axis of a ``present*`` output or the last axis of a
  ``*mask*`` input is ``P + S``.

A symbol given two meanings, or a past input whose sequence axis cannot be told, and the
relations are *not* derived: the inputs are drawn as before and the note of the
:class:`KVRefusal` is added to the :class:`~graph_autofusion.errors.SampleInputError` if the
original then fails. :func:`conform` gives a plan's inputs their values (a mask of ones, the
positions, the lengths) and resizes the inputs whose dims follow ``P`` and ``S`` on feeds drawn
elsewhere (``planner.analysis.default_feeds`` goes through
:func:`~graph_autofusion.samples.sample_inputs.derive_shape_inputs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.ir.core import Model, Value

B, P, S, T = "batch", "past", "new", "total"
_LENGTH_HINT = re.compile(r"past|seq|len|cache|time|tok|ctx|context|total|kv")
_NOT_LENGTH = re.compile(r"head|dim|hidden|embed|channel|feature|batch")
_TERM = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?([A-Za-z_][\w.]*|\d+)\s*$")


def is_past_name(name: str) -> bool:
    """True for a name like a cache input (``past_key_values.0.key``, ``cache_k_0``)."""
    n = name.lower()
    if "position" in n or "mask" in n:
        return False
    return "past" in n or ("cache" in n and any(k in n for k in ("key", "value", "kv", "_k", "_v")))


def new_lengths(seq_len: int) -> tuple[int, int]:
    """``(P, S)`` for a ``seq_len`` of generated inputs: ``P + S == seq_len``, both > 0."""
    s = max(1, seq_len // 4)
    return max(1, seq_len - s), s


@dataclass
class KVRefusal:
    """Past inputs found, relations not derived: why (added to the sample-input error)."""

    note: str


@dataclass
class KVPlan:
    """What every symbol and every listed (input, axis) of a KV-cache decoder is."""

    past: dict[str, int]  # past input -> its sequence axis
    symbols: dict[str, str] = field(default_factory=dict)  # symbol -> B/P/S/T
    axes: dict[tuple[str, int], str] = field(default_factory=dict)  # unnamed dims -> B/P/S/T
    masks: list[str] = field(default_factory=list)
    positions: list[str] = field(default_factory=list)
    lengths: dict[str, str] = field(default_factory=dict)  # input -> "P", "T" or "T-1"

    def values(self, batch: int, past: int, new: int) -> dict[str, int]:
        return {B: batch, P: past, S: new, T: past + new}

    def dim(self, v: Value, axis: int, d: Any, vals: Mapping[str, int]) -> int | None:
        """The length of ``v``'s ``axis`` (declared ``d``) under ``vals``; None: not known."""
        if isinstance(d, int) and d >= 0:
            return d
        role = self.axes.get((v.name, axis))
        if role is None and isinstance(d, str):
            role = self.symbols.get(d)
            if role is None:
                total = _eval_sum(d, self.symbols, vals)
                if total is not None:
                    return total
        return vals[role] if role is not None else None

    def shape(
        self, v: Value, vals: Mapping[str, int], fallback: tuple[int, ...]
    ) -> tuple[int, ...]:
        """``v``'s shape under ``vals``; dims the plan does not know keep ``fallback``'s."""
        if v.shape is None or len(v.shape) != len(fallback):
            return fallback
        out = []
        for i, d in enumerate(v.shape):
            n = self.dim(v, i, d, vals)
            out.append(fallback[i] if n is None else n)
        return tuple(out)

    def describe(self) -> str:
        syms = ", ".join(f"{k}={v}" for k, v in sorted(self.symbols.items()))
        return f"KV-cache decoder: {len(self.past)} past inputs; symbols {syms}"


def _terms(expr: str) -> list[tuple[int, str]] | None:
    """``"past + seq"`` -> ``[(1, "past"), (1, "seq")]``; ``"2*s0 + 1"`` -> ...; else None."""
    if "+" not in expr:
        return None
    out = []
    for part in expr.split("+"):
        m = _TERM.match(part)
        if not m:
            return None
        out.append((int(m.group(1) or 1), m.group(2)))
    return out


def _eval_sum(expr: str, symbols: Mapping[str, str], vals: Mapping[str, int]) -> int | None:
    terms = _terms(expr)
    if terms is None:
        return None
    total = 0
    for k, t in terms:
        if t.isdigit():
            total += k * int(t)
        elif t in symbols:
            total += k * vals[symbols[t]]
        else:
            return None
    return total


def _is_float(v: Value) -> bool:
    return v.dtype is not None and np.issubdtype(v.dtype.to_numpy(), np.floating)


def _is_int(v: Value) -> bool:
    if v.dtype is None:
        return False
    dt = v.dtype.to_numpy()
    return np.issubdtype(dt, np.integer)


def _batch_axis(v: Value, batch_syms: set[str]) -> int | None:
    """The batch axis of a past input: a dim of a batch symbol, else axis 0 when not static."""
    shape = v.shape or ()
    for i, d in enumerate(shape):
        if isinstance(d, str) and (d in batch_syms or "batch" in d.lower()):
            return i
    if shape and not (isinstance(shape[0], int) and shape[0] >= 0):
        return 0
    return None


def _seq_axis(v: Value, batch_syms: set[str]) -> int | str:
    """The sequence axis of past input ``v`` (an int), or why it cannot be told (a str)."""
    if v.shape is None:
        return "its rank is unknown"
    b = _batch_axis(v, batch_syms)
    free = [
        i
        for i, d in enumerate(v.shape)
        if i != b
        and not (isinstance(d, int) and d >= 0)
        and not (isinstance(d, str) and d in batch_syms)
    ]
    if len(free) == 1:
        return free[0]
    if not free:
        return "all its dims are static"
    named = [i for i in free if isinstance(v.shape[i], str)]
    dims = [str(v.shape[i]) for i in free]
    if len(named) == len(free):
        syms = {v.shape[i] for i in free}
        if len(syms) == 1 and len(free) > 1:
            return f"dims {dims} share one symbol"
        hinted = [
            i
            for i in free
            if _LENGTH_HINT.search(str(v.shape[i]).lower())
            and not _NOT_LENGTH.search(str(v.shape[i]).lower())
        ]
        if len({v.shape[i] for i in hinted}) == 1:
            return hinted[0]
    return f"its dims {dims} are not static and none of them reads like a sequence length"


def plan(model: Model) -> KVPlan | KVRefusal | None:
    """The relations of a KV-cache decoder's inputs, a refusal saying why they cannot be
    derived, or ``None`` for a model without past inputs."""
    graph = model.graph
    inputs = [v for v in graph.inputs if v.name not in graph.initializers and v.dtype is not None]
    past_inputs = [
        v
        for v in inputs
        if is_past_name(v.name) and _is_float(v) and v.shape is not None and len(v.shape) >= 3
    ]
    if not past_inputs:
        return None
    low = {v.name: v.name.lower() for v in inputs}
    ids = [
        v for v in inputs if _is_int(v) and ("ids" in low[v.name]) and "position" not in low[v.name]
    ]
    ids = [v for v in ids if "input" in low[v.name]] or ids
    masks = [
        v
        for v in inputs
        if "mask" in low[v.name] and v.shape is not None and 1 <= len(v.shape) <= 2
    ]
    positions = [
        v for v in inputs if "position" in low[v.name] and _is_int(v) and v.shape is not None
    ]
    embeds = [
        v
        for v in inputs
        if "embed" in low[v.name] and _is_float(v) and v.shape and len(v.shape) == 3
    ]

    kv = KVPlan(past={})
    conflicts: list[str] = []

    def assign(v: Value, axis: int, role: str) -> None:
        d = v.shape[axis] if v.shape is not None and axis < len(v.shape) else None
        if isinstance(d, int) and d >= 0:
            return
        if isinstance(d, str) and _terms(d) is None:
            old = kv.symbols.setdefault(d, role)
            if old != role:
                conflicts.append(f"symbol {d!r} is both {old} and {role} length")
        elif d is None:
            kv.axes[(v.name, axis)] = role

    # batch: axis 0 of the token inputs and of the past inputs' batch axes
    batch_syms = {
        v.shape[0]
        for v in [*ids, *masks, *positions, *embeds]
        if v.shape and isinstance(v.shape[0], str) and len(v.shape) >= 2
    }
    for v in [*ids, *masks, *embeds]:
        if v.shape and len(v.shape) >= 2:
            assign(v, 0, B)
    for v in past_inputs:
        b = _batch_axis(v, batch_syms)
        if b is not None:
            assign(v, b, B)
    # past: the sequence axis of every past input
    batch_syms |= {d for d, role in kv.symbols.items() if role == B}
    for v in past_inputs:
        axis = _seq_axis(v, batch_syms)
        if isinstance(axis, str):
            return KVRefusal(
                f"graph input {v.name!r} {tuple(v.shape or ())} looks like a KV cache, but its "
                f"sequence axis cannot be told: {axis}"
            )
        kv.past[v.name] = axis
        assign(v, axis, P)
    # new tokens
    if ids:
        for v in ids:
            if v.shape:
                assign(v, len(v.shape) - 1, S)
    elif embeds:
        for v in embeds:
            assign(v, 1, S)
    for v in positions:  # the new tokens' positions (unless their dims say otherwise)
        if v.shape and len(v.shape) >= 2 and not isinstance(v.shape[-2], int):
            if v.shape[-2] is None or v.shape[-2] not in kv.symbols:
                assign(v, len(v.shape) - 2, B)
        if v.shape and (v.shape[-1] is None or v.shape[-1] not in kv.symbols):
            assign(v, len(v.shape) - 1, S)
    # totals: named totals, the presents' sequence axes, the masks' last axes
    for v in inputs:
        for d in v.shape or ():
            if isinstance(d, str) and d not in kv.symbols and "total" in d.lower():
                kv.symbols[d] = T
    for out in graph.outputs:
        lname = out.name.lower()
        if ("present" in lname or is_past_name(lname)) and out.shape and len(out.shape) >= 3:
            axis = next(iter(kv.past.values()))
            if axis < len(out.shape):
                d = out.shape[axis]
                if isinstance(d, str) and d not in kv.symbols and _terms(d) is None:
                    kv.symbols[d] = T
    for v in masks:
        axis = len(v.shape) - 1  # type: ignore[arg-type]
        d = v.shape[axis]  # type: ignore[index]
        if d is None:
            kv.axes[(v.name, axis)] = T
        elif isinstance(d, str) and d not in kv.symbols and _terms(d) is None:
            kv.symbols[d] = T
    if conflicts:
        return KVRefusal(
            "the inputs look like a KV-cache decoder's, but their dims do not say how the "
            f"lengths relate: {'; '.join(dict.fromkeys(conflicts))}"
        )
    kv.masks = [v.name for v in masks]
    kv.positions = [v.name for v in positions]
    for v in inputs:
        n = low[v.name]
        if not _is_int(v) or (v.shape is not None and len(v.shape) > 1) or v.name in kv.positions:
            continue
        if "seqlens_k" in n:
            kv.lengths[v.name] = "T-1"
        elif "total" in n and ("len" in n or "seq" in n):
            kv.lengths[v.name] = "T"
        elif "past" in n and ("len" in n or "seq" in n):
            kv.lengths[v.name] = "P"
    return kv


def _bound(kv: KVPlan, model: Model, feeds: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(B, P, S)`` as the feeds hold them (the past arrays, the new-token input)."""
    graph = model.graph
    by_name = {v.name: v for v in graph.inputs}
    batch = past = new = None
    for name, axis in kv.past.items():
        arr = feeds.get(name)
        if isinstance(arr, np.ndarray) and axis < arr.ndim:
            past = int(arr.shape[axis])
            break
    for v in by_name.values():
        arr = feeds.get(v.name)
        if not isinstance(arr, np.ndarray) or v.shape is None or arr.ndim != len(v.shape):
            continue
        for i, d in enumerate(v.shape):
            role = kv.axes.get((v.name, i)) or (kv.symbols.get(d) if isinstance(d, str) else None)
            if role == B and batch is None:
                batch = int(arr.shape[i])
            elif role == S and new is None:
                new = int(arr.shape[i])
    if past is None:
        return None
    return batch or 1, past, new if new is not None else 1


def conform(model: Model, feeds: MutableMapping[str, Any], kv: KVPlan) -> dict[str, str]:
    """Make ``feeds`` agree with ``kv`` in place: the lengths are read from the past arrays and
    the new-token input; inputs whose dims follow them are resized (``np.resize``), masks
    become ones, positions ``P .. P+S-1``, length inputs ``P``, ``P+S`` or ``P+S-1``. Returns
    what each input the plan gave a value or a shape is: name -> description."""
    bound = _bound(kv, model, feeds)
    if bound is None:
        return {}
    vals = kv.values(*bound)
    total = vals[T]
    past, new_len = vals[P], vals[S]
    done: dict[str, str] = {}
    for v in model.graph.inputs:
        arr = feeds.get(v.name)
        if not isinstance(arr, np.ndarray) or v.name in kv.past:
            continue
        new = arr
        want = kv.shape(v, vals, tuple(arr.shape))
        what = ""
        if want != arr.shape:
            new = np.resize(arr, want).astype(arr.dtype)
            what = f"KV-cache decoder input of shape {want} (past {past}, new tokens {new_len})"
        if v.name in kv.masks:
            new = np.ones(new.shape, dtype=new.dtype)
            what = f"KV-cache attention mask: ones over past + new tokens ({past} + {new_len})"
        elif v.name in kv.positions and new.ndim:
            last = new.shape[-1]
            start = max(0, total - last)
            new = np.broadcast_to(np.arange(start, start + last), new.shape).astype(new.dtype)
            what = f"KV-cache positions {start}..{start + last - 1}"
        elif v.name in kv.lengths:
            n = {"P": past, "T": total, "T-1": total - 1}[kv.lengths[v.name]]
            new = np.full(new.shape, n, dtype=new.dtype)
            rel = {"P": "past", "T": "past + new", "T-1": "past + new - 1"}[kv.lengths[v.name]]
            what = f"KV-cache length {rel} = {n}"
        if new is not arr:
            feeds[v.name] = new
        if what:
            done[v.name] = what
    return done


__all__ = ["KVPlan", "KVRefusal", "conform", "is_past_name", "new_lengths", "plan"]
