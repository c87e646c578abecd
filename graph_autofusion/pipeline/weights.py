"""Compressed weights as a verified fusion (``FuseOptions.weights``): the onnxruntime route's
last stage.

    report = compress_weights(result, options)     # result.model now has MatMulNBits nodes
    report.layers                                  # every contraction: form, error, time, reason

After the fusions are verified, every contraction by a constant matrix of the fused model
(:func:`graph_autofusion.codegen.weights.find_sites`) is quantized without calibration data
(round to nearest per block along K) and checked by safe mode on its own:

1. **Per layer**: the fused fp32 model runs once on the sample inputs with each candidate's
   activation and output exposed; every candidate's ``MatMulNBits`` then runs in one
   onnxruntime session (prepacked, as a deployed session runs it: an unpacked ``MatMulNBits``
   takes onnxruntime's slow dequantizing path and ignores ``accuracy_level``) on its real
   activation, and its output is compared with the fp32 output: cosine at least
   ``WEIGHTS_LAYER_COSINE[form]``, relative L2 error at most ``WEIGHTS_LAYER_REL_ERR[form]``.
   With ``check_speed`` each layer is also timed against its fp32 ``MatMul`` (kept fp32 when
   slower than ``speed_margin`` x, by safe mode's one speed policy,
   :class:`~graph_autofusion.verify.speed.SpeedPolicy`). A failing layer stays fp32, alone,
   with its reason.
2. **End to end**: the whole compressed model against the original on the sample inputs
   (cosine of every output at least ``WEIGHTS_E2E_COSINE[form]``). When it fails, the fewest
   of the worst layers (ranked by their own relative error) whose rollback makes it pass go
   back to fp32, found by bisection on their count (``_roll_back_fewest``).

Forms: ``int8``/``int4`` are onnxruntime's ``com.microsoft.MatMulNBits``; ``fp16`` is the
``ai.graph_autofusion`` ``GemvF16`` custom operator (:mod:`graph_autofusion.codegen.
ort_gemv_f16`: the weight stored fp16, widened in registers, fp32 accumulation), whose library
becomes ``result.custom_ops`` (saved beside the model); where it cannot be built every layer
is reported "kept fp32" with the reason.

Policy: the LM head and the embedding tables stay at a higher precision than the rest (fp16 in
an int8 or int4 model, fp32 in an fp16 one); tiny matrices stay fp32. ``all`` compresses them
too (the head int8 in an int4 model, fp16 in an fp16 one; the tables int8, fp16 in an fp16
model). Without safe mode the candidates are compressed unchecked (the report says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.codegen.onnxruntime import drop_dead_initializers
from graph_autofusion.codegen.weights import (
    BITS,
    KEPT_EMBEDDING,
    KEPT_FP16,
    KEPT_HEAD,
    Embedding,
    Packed,
    Site,
    compress_embedding,
    compress_site,
    find_embeddings,
    find_sites,
    quantize,
    to_half,
)
from graph_autofusion.codegen.weights_probe import probe_model, reference_model
from graph_autofusion.ir.core import Model
from graph_autofusion.pipeline.ort_kernels import CustomOpsUnavailable, with_gemv
from graph_autofusion.pipeline.result import clone_model
from graph_autofusion.runtime.ort_session import model_weights, ort_session
from graph_autofusion.verify.speed import SpeedPolicy

#: The form of the sensitive layers, the LM head and the embedding tables, per
#: ``weights_policy`` and weight form. ``default`` keeps them at a higher precision than the
#: model's other layers: fp16 in an int8 or int4 model (a head stays fp32 where GemvF16 cannot
#: be built), fp32 in an fp16 model. ``all`` compresses them: the highest of the compressed
#: forms (an int4 model keeps them at 8 bits), fp16 in an fp16 model. An fp16 table is a
#: ``Gather`` of the fp16 table, then ``Cast``; an int8 one ``GatherBlockQuantized``.
SENSITIVE_FORM = {
    "default": {"int8": "fp16", "int4": "fp16", "fp16": "fp32"},
    "all": {"int8": "int8", "int4": "int8", "fp16": "fp16"},
}
#: What each form's contractions become.
FORM_OPS = {"int8": "MatMulNBits", "int4": "MatMulNBits", "fp16": "GemvF16"}


@dataclass
class LayerRecord:
    """One contraction's fate: ``form`` ``int8``/``int4`` (compressed) or ``fp32`` (kept)."""

    name: str
    op: str
    k: int
    n: int
    form: str
    block_size: int | None = None
    zero_point: bool = False
    cosine: float | None = None  # the compressed output against fp32 on real activations
    rel_err: float | None = None  # relative L2 error of the same
    time_fp32_us: float | None = None
    time_us: float | None = None
    fp32_bytes: int = 0
    bytes: int = 0  # the stored weight (packed + scales + zero points), fp32 bytes if kept
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WeightsReport:
    """What the weight-compression stage did (``FuseResult.weights``)."""

    form: str
    layers: list[LayerRecord] = field(default_factory=list)
    end_to_end: dict[str, Any] | None = None
    verified: bool = True
    accuracy_level: int = defaults.WEIGHTS_ACCURACY_LEVEL
    notes: list[str] = field(default_factory=list)

    @property
    def compressed(self) -> list[LayerRecord]:
        return [r for r in self.layers if r.form != "fp32"]

    @property
    def kept(self) -> list[LayerRecord]:
        return [r for r in self.layers if r.form == "fp32"]

    def to_dict(self) -> dict[str, Any]:
        fp32 = sum(r.fp32_bytes for r in self.layers)
        now = sum(r.bytes for r in self.layers)
        return {
            "form": self.form,
            "compressed": len(self.compressed),
            "kept_fp32": len(self.kept),
            "verified": self.verified,
            "accuracy_level": self.accuracy_level,
            "contraction_bytes_fp32": fp32,
            "contraction_bytes": now,
            "end_to_end": self.end_to_end,
            "layers": [r.to_dict() for r in self.layers],
            "notes": list(self.notes),
        }

    def to_text(self) -> str:
        d = self.to_dict()
        ratio = (
            d["contraction_bytes"] / d["contraction_bytes_fp32"]
            if d["contraction_bytes_fp32"]
            else 1
        )
        lines = [
            f"weights {self.form}: {d['compressed']} contractions compressed, {d['kept_fp32']} "
            f"kept fp32 ({d['contraction_bytes'] / 1e6:.1f} of {d['contraction_bytes_fp32'] / 1e6:.1f}"
            f" MB, {ratio:.2f}x){'' if self.verified else ' (not verified: safe mode off)'}"
        ]
        for r in self.layers:
            err = f" cos {r.cosine:.6f} rel {r.rel_err:.2e}" if r.cosine is not None else ""
            t = (
                f" {r.time_us:.0f}us vs {r.time_fp32_us:.0f}us fp32"
                if r.time_us is not None and r.time_fp32_us is not None
                else ""
            )
            blk = f"/{r.block_size}" if r.block_size else ""
            why = f"  {r.reason}" if r.reason else ""
            lines.append(f"  {r.name} [{r.k}x{r.n}] {r.form}{blk}{err}{t}{why}")
        for name, v in (self.end_to_end or {}).items():
            lines.append(
                f"  end to end {name}: cosine {v['cosine']:.6f} rel {v['rel_err']:.2e}"
                f"{'' if v['passed'] else ' FAILED'}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def compress_weights(
    result: Any, options: Any, *, threads: int = 2, only: Any = None
) -> WeightsReport | None:
    """Compress ``result.model``'s weights to ``options.weights`` (see the module docstring);
    sets ``result.model`` and ``result.weights`` and returns the report (``None`` for fp32).
    ``only``: the names of the layers to consider (a saved plan's), the others kept."""
    form = options.weights
    if form == "fp32":
        return None
    model: Model = result.model
    policy = getattr(options, "weights_policy", "default")
    sensitive = SENSITIVE_FORM[policy][form]  # the LM head's and the embedding tables' form
    sites = find_sites(model, min_elements=defaults.WEIGHTS_MIN_ELEMENTS, keep_head=False)
    for s in sites:
        if s.head and not s.reason and sensitive == "fp32":
            s.reason = KEPT_HEAD
    block8 = defaults.WEIGHTS_BLOCK_SIZE["int8"]
    embs = find_embeddings(model, block8 if sensitive == "int8" else 1)
    report = WeightsReport(form, verified=bool(options.safe_mode))
    records = {s.name: _record(s) for s in sites}
    half = form == "fp16"
    for e in embs:
        if e.name in records:  # a node of the same name: the table is left alone, unlisted
            continue
        rows, cols = e.table.shape
        reason = e.reason or (KEPT_EMBEDDING if sensitive == "fp32" else "")
        records[e.name] = LayerRecord(
            e.name, "Gather", int(cols), int(rows), "fp32", fp32_bytes=e.fp32_bytes,
            bytes=e.fp32_bytes, reason=reason,
        )  # fmt: skip
    report.layers = list(records.values())
    result.weights = report
    library = None
    heads = [s for s in sites if s.head and not s.reason]
    if half or (heads and sensitive == "fp16"):  # GemvF16: its library must build here
        try:
            library = with_gemv(getattr(result, "custom_ops", None), options.codegen)
        except CustomOpsUnavailable as exc:
            for r in report.layers:
                if half or r.name in {s.name for s in heads}:
                    r.reason = r.reason or KEPT_FP16
            report.notes.append(f"{KEPT_FP16[len('kept fp32: ') :]} ({exc})")
            if half:
                return report
    level = defaults.WEIGHTS_ACCURACY_LEVEL
    if only is not None:
        for r in report.layers:
            if not r.reason and r.name not in set(only):
                r.reason = "kept fp32: the saved plan keeps it fp32"
    todo = [s for s in sites if not records[s.name].reason]
    forms = {s.name: sensitive if s.head else form for s in todo}
    packs = {s.name: _quantize(s.weight, forms[s.name]) for s in todo}
    tables = [e for e in embs if records.get(e.name) is not None and not records[e.name].reason]
    tables = [e for e in tables if records[e.name].op == "Gather"]
    for e in tables:  # int8: symmetric (GatherBlockQuantized's default zero point)
        forms[e.name] = sensitive
        t = np.ascontiguousarray(e.table.T)
        packs[e.name] = to_half(t) if sensitive == "fp16" else quantize(t, 8, block8, False)
    if options.safe_mode and todo:
        todo = _check_layers(model, result.feeds, todo, packs, records, options, level, forms)
    if options.safe_mode and tables:
        tables = _check_tables(model, result.feeds, tables, packs, records, threads, forms)
    chosen = [s.name for s in todo] + [e.name for e in tables]
    for name in chosen:
        r, p = records[name], packs[name]
        r.form, r.block_size, r.bytes = forms[name], p.block_size or None, p.nbytes
        r.zero_point = p.zero_points is not None
    if not chosen:
        report.notes.append("no layer compressed")
        return report
    work = _apply(model, chosen, packs, level)
    if options.safe_mode:
        e2e = _end_to_end(result.original, work, result.feeds, form, threads)
        report.end_to_end = e2e
        if not _passed(e2e):
            chosen, work = _roll_back_fewest(
                result, model, chosen, packs, records, level, form, threads, e2e, report
            )
            if not chosen:
                report.notes.append("the end-to-end check failed: every layer stays fp32")
                return report
    result.model = work
    if library is not None and any(forms[n] == "fp16" for n in chosen):
        result.custom_ops = library  # the fused model needs the GemvF16 library (saved with it)
    n_tables = sum(records[n].op == "Gather" for n in chosen)
    head_other_form = any(s.name in chosen and forms[s.name] != form for s in heads)
    how = (
        "fp16 weights, fp32 accumulation"
        if half
        else f"{form}{f', LM head {sensitive}' if head_other_form else ''}, "
        f"block {defaults.WEIGHTS_BLOCK_SIZE[form]}, accuracy_level {level}"
    )
    report.notes.append(
        f"{len(chosen) - n_tables} contractions are {FORM_OPS[form]} ({how})"
        + (
            f", {n_tables} embedding tables "
            + ("fp16 (Gather, Cast)" if sensitive == "fp16" else "GatherBlockQuantized (int8)")
            if n_tables
            else ""
        )
    )
    return report


def _passed(e2e: Mapping[str, Mapping[str, Any]]) -> bool:
    return all(v["passed"] for v in e2e.values())


def _roll_back_fewest(
    result: Any,
    model: Model,
    chosen: list[str],
    packs: Mapping[str, Packed],
    records: Mapping[str, LayerRecord],
    level: int,
    form: str,
    threads: int,
    failed: dict[str, Any],
    report: WeightsReport,
) -> tuple[list[str], Model | None]:
    """The end-to-end check failed with every layer of ``chosen`` compressed: roll back the
    fewest of the worst ones (ranked by their own relative error) that make it pass, found
    by bisection on that count (about log2(len(chosen)) checks; with all of them rolled back
    the model is the original, which passes). Returns the layers kept and their model."""
    ranked = sorted(chosen, key=lambda n: -(records[n].rel_err or 0.0))
    lo, hi, fail = 0, len(ranked), failed  # lo rolled back fails, hi passes
    best: tuple[Model, dict[str, Any]] | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        work = _apply(model, ranked[mid:], packs, level)
        e2e = _end_to_end(result.original, work, result.feeds, form, threads)
        if _passed(e2e):
            hi, best = mid, (work, e2e)
        else:
            lo, fail = mid, e2e
    cos = min(v["cosine"] for v in fail.values())
    rel = max(v["rel_err"] for v in fail.values())
    floor = defaults.WEIGHTS_E2E_COSINE[form]
    for name in ranked[:hi]:
        r = records[name]
        r.form, r.block_size, r.zero_point = "fp32", None, False
        r.bytes = r.fp32_bytes
        r.reason = (
            f"kept fp32: rolled back by the end-to-end check (the {hi} layers of largest "
            f"relative error are the fewest whose rollback passes it; with {lo} rolled back: "
            f"output cosine {cos:.6f}, floor {floor}, relative error {rel:.3g}, cap "
            f"{defaults.WEIGHTS_E2E_REL_ERR[form]})"
        )
    if best is None:
        return [], None
    report.end_to_end = best[1]
    return ranked[hi:], best[0]


def _quantize(w: np.ndarray, form: str) -> Packed:
    if form == "fp16":
        return to_half(w, panels=True)
    return quantize(
        w, BITS[form], defaults.WEIGHTS_BLOCK_SIZE[form], defaults.WEIGHTS_ZERO_POINT[form]
    )


def _check_tables(
    model: Model,
    feeds: Mapping[str, Any],
    tables: list[Embedding],
    packs: Mapping[str, Packed],
    records: Mapping[str, LayerRecord],
    threads: int,
    forms: Mapping[str, str],
) -> list[Embedding]:
    """Safe mode's check of compressed embedding tables: the rows the sample inputs select
    (every row when their indices cannot be captured), dequantized, against fp32."""
    names = {n.inputs[1].name for e in tables for n in e.nodes}
    acts = _capture(model, feeds, names, threads)
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
        r.cosine, r.rel_err = _stats(deq[rows], e.table[rows])
        if r.cosine < floor:
            r.reason = f"kept fp32: table check: cosine {r.cosine:.6f} < {floor}"
        elif r.rel_err > cap:
            r.reason = f"kept fp32: table check: relative error {r.rel_err:.3g} > {cap}"
        else:
            passed.append(e)
    return passed


def _record(s: Site) -> LayerRecord:
    return LayerRecord(
        s.name,
        s.op,
        s.k,
        s.n,
        "fp32",
        fp32_bytes=s.fp32_bytes,
        bytes=s.fp32_bytes,
        reason=s.reason,
    )


def _apply(model: Model, names: list[str], packs: Mapping[str, Packed], level: int) -> Model:
    """A copy of ``model`` with the sites named ``names`` in their packed form (``MatMulNBits``
    or ``GemvF16``) and the tables named so as ``GatherBlockQuantized`` (or fp16 ``Gather``)."""
    work = clone_model(model)
    wanted = set(names)
    sites = find_sites(work, min_elements=defaults.WEIGHTS_MIN_ELEMENTS, keep_head=False)
    for site in sites:
        if site.name in wanted:
            compress_site(work, site, packs[site.name], level)
    for emb in find_embeddings(work, defaults.WEIGHTS_BLOCK_SIZE["int8"]):
        if emb.name in wanted:
            compress_embedding(work, emb, packs[emb.name])
    drop_dead_initializers(work)
    return work


def _capture(model: Model, feeds: Mapping[str, Any], names: set[str], threads: int) -> dict:
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


def _stats(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
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


def _check_layers(
    model: Model,
    feeds: Mapping[str, Any],
    todo: list[Site],
    packs: Mapping[str, Packed],
    records: Mapping[str, LayerRecord],
    options: Any,
    level: int,
    forms: Mapping[str, str],
    threads: int = 2,
) -> list[Site]:
    """Safe mode's per-layer check (each layer against its own form's floors); returns the
    sites that pass (the others' records carry their reason)."""
    names = {s.a.name for s in todo} | {s.y.name for s in todo}
    acts = _capture(model, feeds, names, threads)
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
        r.cosine, r.rel_err = _stats(y, acts[s.y.name])
        if r.cosine < cos_floor:
            r.reason = f"kept fp32: layer check: cosine {r.cosine:.6f} < {cos_floor}"
        elif r.rel_err > rel_cap:
            r.reason = f"kept fp32: layer check: relative error {r.rel_err:.3g} > {rel_cap}"
        else:
            passed.append((s, _a))
    if options.check_speed and passed:
        passed = _check_speed(passed, packs, records, options, level, threads)
    return [s for s, _a in passed]


def _check_speed(
    items: list[tuple[Site, np.ndarray]],
    packs: Mapping[str, Packed],
    records: Mapping[str, LayerRecord],
    options: Any,
    level: int,
    threads: int,
) -> list[tuple[Site, np.ndarray]]:
    """Time each layer compressed and fp32 on its activation by safe mode's one speed policy
    (:class:`~graph_autofusion.verify.speed.SpeedPolicy`); a layer slower than
    ``speed_margin`` x its fp32 form stays fp32."""
    policy = SpeedPolicy(options.speed_margin)
    kept = []
    for s, a in items:
        fast = ort_session(probe_model([(s.name, a, packs[s.name], s.bias)], level), "all", threads)
        slow = ort_session(reference_model([(s.name, a, s.weight, s.bias)]), "all", threads)
        key = f"weights@{s.name}"
        t_f, t_q, slower = policy.measure(
            lambda slow=slow, a=a: slow.run(None, {"a0": a}),
            lambda fast=fast, a=a: fast.run(None, {"a0": a}),
            key,
        )
        r = records[s.name]
        r.time_us, r.time_fp32_us = t_q, t_f
        if slower:
            r.reason = f"kept fp32: slower compressed ({t_q:.0f} us vs {t_f:.0f} us fp32)"
        else:
            kept.append((s, a))
    return kept


def _end_to_end(
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
        cos, rel = _stats(got[name], w)
        out[name] = {"cosine": cos, "rel_err": rel, "passed": bool(cos >= floor and rel <= cap)}
    return out
