"""Safe mode's checks of compressed weights (:mod:`graph_autofusion.pipeline.weights`):
each layer on its real activation, the embedding tables on the rows the inputs select, each
layer's speed against its fp32 form, and the whole model end to end.

    acts = capture(model, feeds, names, threads)            # values of the fp32 model
    passed = check_layers(model, feeds, sites, packs, records, options, level, forms)
    e2e = end_to_end(original, compressed, feeds, form, threads); passed(e2e)

Every check writes what it measured (cosine, relative error, times) and, for a layer that
fails, its "kept fp32: ..." reason into the layer's record.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.codegen.ort_gemv_q import OP as Q_OP
from graph_autofusion.codegen.weights import Embedding, Packed, Site
from graph_autofusion.codegen.weights_probe import probe_model, reference_model
from graph_autofusion.cost.measure_host import read_caches
from graph_autofusion.ir.core import Model
from graph_autofusion.runtime.ort_session import model_weights, ort_session
from graph_autofusion.runtime.timing import current_timer
from graph_autofusion.verify.speed import SpeedPolicy

#: The start of the reason the layer check writes for a layer whose output missed its floors.
LAYER_CHECK = "kept fp32: layer check:"
#: The reason of a layer the speed check kept fp32 (its times follow in brackets).
KEPT_SLOWER = "kept fp32: slower compressed"


@dataclass(frozen=True)
class Timing:
    """How the speed check times a stage's layers: whether ``GemvQ`` may be chosen (the
    stage's own custom-operator library built) and the fp32 bytes whose cache pressure the
    copies stand for (``None``: the layers being checked; a fallback's or demotion's few
    layers pass the whole stage's)."""

    gemvq: bool = False
    pressure_bytes: int | None = None


def passed(e2e: Mapping[str, Mapping[str, Any]]) -> bool:
    return all(v["passed"] for v in e2e.values())


def check_tables(
    model: Model,
    feeds: Mapping[str, Any],
    tables: list[Embedding],
    packs: Mapping[str, Packed],
    records: Mapping[str, Any],
    threads: int,
    forms: Mapping[str, str],
) -> list[Embedding]:
    """Safe mode's check of compressed embedding tables: the rows the sample inputs select
    (every row when their indices cannot be captured), dequantized, against fp32."""
    names = {n.inputs[1].name for e in tables for n in e.nodes}
    acts = capture(model, feeds, names, threads)
    passed = []
    for e in tables:
        floor = defaults.WEIGHTS_LAYER_COSINE[forms[e.name]]
        cap = defaults.WEIGHTS_LAYER_REL_ERR[forms[e.name]]
        idx = [acts.get(n.inputs[1].name) for n in e.nodes]
        rows = (
            np.unique(np.concatenate([np.ravel(i) for i in idx]).astype(np.int64))
            if all(i is not None for i in idx)
            else np.arange(e.table.shape[0])
        )
        rows = rows[(rows >= -e.table.shape[0]) & (rows < e.table.shape[0])]
        deq = packs[e.name].dequantized.T  # [rows, columns]
        r = records[e.name]
        r.cosine, r.rel_err = stats(deq[rows], e.table[rows])
        if r.cosine < floor:
            r.reason = f"kept fp32: table check: cosine {r.cosine:.6f} < {floor}"
        elif r.rel_err > cap:
            r.reason = f"kept fp32: table check: relative error {r.rel_err:.3g} > {cap}"
        else:
            passed.append(e)
    return passed


def capture(model: Model, feeds: Mapping[str, Any], names: set[str], threads: int) -> dict:
    """The values ``names`` of ``model`` on ``feeds`` (one onnxruntime run)."""
    import onnx

    from graph_autofusion.frontend.onnx_frontend import to_onnx

    arrays = model_weights(model)
    proto = to_onnx(model, without_data=set(arrays))
    taken = {o.name for o in proto.graph.output}
    inputs = {i.name for i in proto.graph.input}
    for name in sorted(names - taken - inputs):
        proto.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = ort_session(proto, "disable", threads, lean=True, in_place=arrays)
    given = {i.name for i in sess.get_inputs()}
    wanted = [o.name for o in sess.get_outputs() if o.name in names]
    outs = dict(zip(wanted, sess.run(wanted, {k: v for k, v in feeds.items() if k in given})))
    outs.update({k: np.asarray(v) for k, v in feeds.items() if k in names})
    return outs


def stats(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """``(cosine, relative L2 error)`` of ``got`` against ``want``."""
    g = np.asarray(got, np.float64).ravel()
    w = np.asarray(want, np.float64).ravel()
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return 0.0, math.inf
    nw, ng = float(np.linalg.norm(w)), float(np.linalg.norm(g))
    if nw == 0.0:
        return (1.0, 0.0) if ng == 0.0 else (0.0, math.inf)
    cos = float(g @ w) / (nw * ng) if ng else 0.0
    return cos, float(np.linalg.norm(g - w)) / nw


def check_layers(
    model: Model,
    feeds: Mapping[str, Any],
    todo: list[Site],
    packs: Mapping[str, Packed],
    records: Mapping[str, Any],
    options: Any,
    level: int,
    forms: Mapping[str, str],
    threads: int = 2,
    timing: Timing | None = None,
) -> list[Site]:
    """Safe mode's per-layer check (each layer against its own form's floors); returns the
    sites that pass (the others' records carry their reason)."""
    names = {s.a.name for s in todo} | {s.y.name for s in todo}
    acts = capture(model, feeds, names, threads)
    items = []
    for s in todo:
        a = acts.get(s.a.name)
        if a is None or acts.get(s.y.name) is None:
            records[s.name].reason = "kept fp32: its activation could not be captured"
            continue
        items.append((s, np.ascontiguousarray(a, np.float32)))
    if not items:
        return []
    probe = probe_model([(s.name, a, packs[s.name], s.bias) for s, a in items], level)
    sess = ort_session(probe, "disable", threads)  # prepacked: the kernel a deployment runs
    outs = sess.run(None, {f"a{i}": a for i, (_s, a) in enumerate(items)})
    del sess
    passed = []
    for (s, _a), y in zip(items, outs):
        cos_floor = defaults.WEIGHTS_LAYER_COSINE[forms[s.name]]
        rel_cap = defaults.WEIGHTS_LAYER_REL_ERR[forms[s.name]]
        r = records[s.name]
        r.cosine, r.rel_err = stats(y, acts[s.y.name])
        if r.cosine < cos_floor:
            r.reason = f"{LAYER_CHECK} cosine {r.cosine:.6f} < {cos_floor}"
        elif r.rel_err > rel_cap:
            r.reason = f"{LAYER_CHECK} relative error {r.rel_err:.3g} > {rel_cap}"
        else:
            passed.append((s, _a))
    if options.check_speed and passed:
        passed = check_speed(passed, packs, records, options, level, threads, acts, timing)
    return [s for s, _a in passed]


def check_speed(
    items: list[tuple[Site, np.ndarray]],
    packs: dict[str, Packed],
    records: Mapping[str, Any],
    options: Any,
    level: int,
    threads: int,
    acts: Mapping[str, np.ndarray],
    timing: Timing | None = None,
) -> list[tuple[Site, np.ndarray]]:
    """Time each layer compressed and fp32 on its activation by safe mode's one speed policy
    (:class:`~graph_autofusion.verify.speed.SpeedPolicy`); a layer slower than
    ``speed_margin`` x its fp32 form stays fp32 (with ``weights_goal="size"``, it is
    compressed anyway, its times reported). An 8- or 4-bit layer first gets the faster of
    ``MatMulNBits`` and ``GemvQ`` (:func:`choose_kernel`). Repeated layers are timed once: a
    layer of the same form, shapes and bias as one timed before takes its verdicts and times
    (``timed_as`` in its record; a GemvQ verdict only where its own output passes the floors)."""
    policy = SpeedPolicy(options.speed_margin)
    timing = timing or Timing()
    kept = []
    total = timing.pressure_bytes or sum(s.fp32_bytes for s, _a in items)
    timed: dict[tuple, str] = {}  # a layer's shape key -> the layer timed for it
    for s, a in items:
        shape = _shape_key(s, a, packs[s.name])
        if shape in timed:
            shared = _share_timing(
                s, a, timed[shape], packs, records, level, threads, acts[s.y.name]
            )
            if shared is not None:
                if shared:
                    kept.append((s, a))
                continue
        else:
            timed[shape] = s.name
        n = timing_copies(total, s.fp32_bytes)
        feeds = {f"a{i}": a for i in range(n)}
        if timing.gemvq:
            choose_kernel(s, a, packs, records, level, threads, acts[s.y.name], policy, n)
        else:
            records[s.name].kernel = packs[s.name].op
        # workers asleep between calls, as before GemvQ (spinning ones favour fp32's
        # multi-threaded GEMM on a layer hot in cache: they rolled back 8 of the zoo Llama's
        # 22 fp16-all layers on the EPYC, 2026-12-06, timed one copy each)
        probe = probe_model([(s.name, a, _copy(packs[s.name], i), s.bias) for i in range(n)], level)
        fast = ort_session(probe, "all", threads)
        ref = reference_model([(s.name, a, _copy(s.weight, i), s.bias) for i in range(n)])
        slow = ort_session(ref, "all", threads)
        key = f"weights@{s.name}"
        t_f, t_q, slower = policy.measure(
            lambda slow=slow, f=feeds: slow.run(None, f),
            lambda fast=fast, f=feeds: fast.run(None, f),
            key,
        )
        t_q, t_f = t_q / n, t_f / n
        r = records[s.name]
        r.time_us, r.time_fp32_us, r.timing_copies = t_q, t_f, n
        if slower and getattr(options, "weights_goal", "speed") != "size":
            r.reason = f"{KEPT_SLOWER} ({t_q:.0f} us vs {t_f:.0f} us fp32)"
        else:
            kept.append((s, a))
    return kept


@functools.lru_cache(maxsize=1)
def _llc_bytes() -> int:
    caches = read_caches()[0]
    return int((caches.get("l3") or caches.get("l2") or 32768.0) * 1024)


def _copy(w: Any, i: int) -> Any:
    """Copy ``i`` of a weight (a :class:`Packed` or an array) for the speed check: copy 0 is
    the weight, the others hold the same bytes rotated (onnxruntime shares initializers of
    equal content: 64 equal copies of a 512x512 fp32 weight ran at 17.6 us a copy, from cache,
    64 distinct ones at 63.2)."""
    if i == 0:
        return w
    if not isinstance(w, Packed):
        return np.roll(w, i)
    zp = None if w.zero_points is None else np.roll(w.zero_points, i)
    return replace(w, b=np.roll(w.b, i), scales=np.roll(w.scales, i), zero_points=zp)


def timing_copies(total_bytes: int, layer_bytes: int) -> int:
    """How many copies of a layer of ``layer_bytes`` (fp32) its speed check times in one
    session run, when the candidate layers' fp32 bytes are ``total_bytes``: one where they fit
    in half the last-level cache (a step keeps them there), else enough for
    ``WEIGHTS_TIMING_CACHE_MULTIPLE`` times the cache in fp32 (the copies stream from memory
    as a step's layers do; the compressed side's copies are its own, fewer, bytes)."""
    llc = _llc_bytes()
    if total_bytes * 2 < llc or layer_bytes <= 0:
        return 1
    want = -(-defaults.WEIGHTS_TIMING_CACHE_MULTIPLE * llc // layer_bytes)
    cap = min(defaults.WEIGHTS_TIMING_MAX_COPIES, defaults.WEIGHTS_TIMING_MAX_BYTES // layer_bytes)
    return int(max(1, min(want, cap)))


def choose_kernel(
    s: Site,
    a: np.ndarray,
    packs: dict[str, Packed],
    records: Mapping[str, Any],
    level: int,
    threads: int,
    want: np.ndarray,
    policy: SpeedPolicy,
    copies: int = 1,
) -> None:
    """``packs[s.name]`` on ``GemvQ`` where the weight fits it (the caller knows its library
    built: :attr:`Timing.gemvq`), its output on the real activation ``a`` passes the layer's floors against fp32's
    ``want``, and its median time (``copies`` of the layer a run, as the speed check's) is
    below ``MatMulNBits``' (interleaved calls in sessions as a deployment runs them). The
    record's ``kernel`` and figures follow the choice."""
    p, r = packs[s.name], records[s.name]
    r.kernel = p.op
    if p.bits == 16 or not p.gemvq:
        return
    q = replace(p, kernel=Q_OP)
    checked = _gemvq_output(s, a, q, want, level, threads)
    if checked is None:
        return
    cos, rel = checked
    feeds = {f"a{i}": a for i in range(copies)}
    sides = [[(s.name, a, _copy(k, i), s.bias) for i in range(copies)] for k in (p, q)]
    nbits = _timed_session(probe_model(sides[0], level), threads)
    gemvq = _timed_session(probe_model(sides[1], level), threads)
    ta, tb = policy.times(
        lambda: nbits.run(None, feeds),
        lambda: gemvq.run(None, feeds),
        f"weights-kernel@{s.name}",
        policy.runs,
        current_timer(),
        early=False,
    )  # interleaved calls, as the fp32 comparison's
    t = {p.kernel: statistics.median(ta) / copies, Q_OP: statistics.median(tb) / copies}
    r.kernel_times_us = {k: round(v, 1) for k, v in t.items()}
    if t[Q_OP] < t[p.kernel]:
        packs[s.name] = q
        r.kernel, r.cosine, r.rel_err = Q_OP, cos, rel


def _gemvq_output(
    s: Site, a: np.ndarray, q: Packed, want: np.ndarray, level: int, threads: int
) -> tuple[float, float] | None:
    """``(cosine, relative error)`` of the layer on ``GemvQ`` (``q``) against fp32's ``want``,
    or ``None`` where they miss the layer's floors."""
    sess = ort_session(probe_model([(s.name, a, q, s.bias)], level), "all", threads)
    cos, rel = stats(sess.run(None, {"a0": a})[0], want)
    form = _form(q)
    if cos < defaults.WEIGHTS_LAYER_COSINE[form] or rel > defaults.WEIGHTS_LAYER_REL_ERR[form]:
        return None
    return cos, rel


def _shape_key(s: Site, a: np.ndarray, p: Packed) -> tuple:
    """What a layer's speed depends on: its form, layout (scales fp16 on ``GemvQ`` or not),
    shapes and bias (not its values)."""
    zp, half = p.zero_points is not None, p.half_scales
    return (p.bits, p.block_size, zp, p.gemvq, half, s.k, s.n, s.bias is not None, a.shape, a.dtype)


def _share_timing(
    s: Site,
    a: np.ndarray,
    first: str,
    packs: dict[str, Packed],
    records: Mapping[str, Any],
    level: int,
    threads: int,
    want: np.ndarray,
) -> bool:
    """Layer ``s`` takes the speed verdicts of ``first`` (timed, same shape key): its kernel
    (``GemvQ`` where ``first`` got it, checked on ``s``'s own output) and whether it stays fp32
    as slower; returns whether it stays compressed, or ``None`` where ``s`` must be timed
    itself (``first`` on GemvQ, ``s``'s own output on it missing the floors)."""
    r, r0 = records[s.name], records[first]
    if r0.kernel == Q_OP:
        q = replace(packs[s.name], kernel=Q_OP)
        checked = _gemvq_output(s, a, q, want, level, threads)
        if checked is None:
            return None
        packs[s.name] = q
        r.cosine, r.rel_err = checked
    r.kernel = packs[s.name].op
    r.time_us, r.time_fp32_us = r0.time_us, r0.time_fp32_us
    r.kernel_times_us, r.timing_copies, r.timed_as = r0.kernel_times_us, r0.timing_copies, first
    if r0.reason.startswith(KEPT_SLOWER):
        r.reason = f"{r0.reason} (timed as {first}, the same shapes)"
        return False
    return True


def _timed_session(model: Any, threads: int) -> Any:
    """A session as a deployment runs the layer (prepacked, ``all``), its workers spinning
    inside a run (a served decoder's are; asleep, each call would also time their wake-up:
    a hot 512x1376 int8 layer alone, ``GemvQ`` 33-38 us and ``MatMulNBits`` 30-32 asleep, 13-16
    and 14 spinning, in a probe on the EPYC) and asleep after it."""
    return ort_session(model, "all", threads, spinning="run")


def _form(p: Packed) -> str:
    return "int8" if p.bits == 8 else "int4"


def end_to_end(
    original: Model, work: Model, feeds: Mapping[str, Any], form: str, threads: int
) -> dict[str, dict[str, Any]]:
    """Every output of ``original`` against ``work`` (compressed, in a prepacked session):
    cosine at least ``WEIGHTS_E2E_COSINE[form]``, relative error at most
    ``WEIGHTS_E2E_REL_ERR[form]``."""
    floor = defaults.WEIGHTS_E2E_COSINE[form]
    cap = defaults.WEIGHTS_E2E_REL_ERR[form]
    a = ort_session(original, "disable", threads, lean=True)
    b = ort_session(work, "disable", threads, in_place=model_weights(work))
    names = [o.name for o in a.get_outputs()]
    given = {i.name for i in a.get_inputs()}
    fa = {k: v for k, v in feeds.items() if k in given}
    want = dict(zip(names, a.run(names, fa)))
    gb = {i.name for i in b.get_inputs()}
    got = dict(zip(names, b.run(names, {k: v for k, v in feeds.items() if k in gb})))
    out = {}
    for name in names:
        w = np.asarray(want[name])
        if w.dtype.kind != "f":
            same = np.array_equal(w, np.asarray(got[name]))
            out[name] = {"cosine": 1.0 if same else 0.0, "rel_err": 0.0, "passed": same}
            continue
        cos, rel = stats(got[name], w)
        out[name] = {"cosine": cos, "rel_err": rel, "passed": bool(cos >= floor and rel <= cap)}
    return out
