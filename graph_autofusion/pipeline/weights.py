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
   with its reason; in an int4 model a layer whose int4 output misses its accuracy floors is
   tried at int8 first (checked and timed the same way at int8's floors) and stays fp32 only
   if that fails (a layer slower at int4 is not tried at int8: it streams twice the bytes).
2. **End to end**: the whole compressed model against the original on the sample inputs
   (cosine of every output at least ``WEIGHTS_E2E_COSINE[form]``). When it fails, in an int4
   model the fewest of the worst int4 layers (ranked by their own relative error) whose
   demotion to int8 makes it pass become int8 (each checked and timed on its own at int8
   first; found by bisection on their count, ``_demote_fewest``); where demoting every one
   of them does not pass either, and in an int8 or fp16 model, the fewest of the worst layers
   whose rollback makes it pass go back to fp32, found the same way (``_roll_back_fewest``;
   both bisect with ``_fewest``).

Forms: ``int8``/``int4`` are onnxruntime's ``com.microsoft.MatMulNBits`` or, per layer where
safe mode times it faster on the layer's real activation (and its output passes the same
floors), our ``GemvQ`` custom operator on the same quantized values with the activations kept
fp32 (:mod:`graph_autofusion.codegen.ort_gemv_q`; ``weights_checks.choose_kernel``; a saved
torch plan records it as ``"int8+GemvQ"``); ``fp16`` is the
``ai.graph_autofusion`` ``GemvF16`` custom operator (:mod:`graph_autofusion.codegen.
ort_gemv_f16`: the weight stored fp16, widened in registers, fp32 accumulation), whose library
becomes ``result.custom_ops`` (saved beside the model); where it cannot be built every layer
is reported "kept fp32" with the reason.

Policy: the LM head and the embedding tables stay at a higher precision than the rest (in an
int8 model both fp16; in an int4 model the head int8 and the tables fp16; in an fp16 model both
fp32); tiny matrices stay fp32. ``all`` compresses them too (the head and the tables int8 in an
int8 or int4 model, fp16 in an fp16 one). Without safe mode the candidates are compressed
unchecked (the report says so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.codegen.onnxruntime import drop_dead_initializers
from graph_autofusion.codegen.ort_gemv_f16 import OP as F16_OP
from graph_autofusion.codegen.ort_gemv_q import OP as Q_OP
from graph_autofusion.codegen.weights import (
    BITS,
    KEPT_EMBEDDING,
    KEPT_FP16,
    KEPT_HEAD,
    Packed,
    Site,
    compress_embedding,
    compress_site,
    find_embeddings,
    find_sites,
    quantize,
    share_identical,
    to_half,
)
from graph_autofusion.ir.core import Model
from graph_autofusion.pipeline.ort_kernels import CustomOpsUnavailable, with_gemv
from graph_autofusion.pipeline.result import clone_model
from graph_autofusion.pipeline.weights_checks import (
    KEPT_SLOWER,
    LAYER_CHECK,
    Timing,
    check_layers,
    check_tables,
    end_to_end,
    passed,
)

#: The forms of the sensitive layers, ``(LM head, embedding tables)``, per ``weights_policy``
#: and weight form. ``default`` keeps them at a higher precision than the model's other
#: layers: in an int8 model both fp16 (a head stays fp32 where GemvF16 cannot be built); in an
#: int4 model the head at 8 bits (int8: the head is the largest weight a decode step reads,
#: 56% of the zoo Llama's fp32 bytes a token, and int8 is within 0.02% of fp32's perplexity on the
#: trained test LM, ``benchmarks/results/compressed_accuracy.md``) and the tables fp16; fp32
#: in an fp16 model. ``all`` compresses them: the highest of the compressed forms (an int4
#: model keeps them at 8 bits), fp16 in an fp16 model. An fp16 table is a ``Gather`` of the
#: fp16 table, then ``Cast``; an int8 one ``GatherBlockQuantized``.
SENSITIVE_FORM = {
    "default": {"int8": ("fp16", "fp16"), "int4": ("int8", "fp16"), "fp16": ("fp32", "fp32")},
    "all": {"int8": ("int8", "int8"), "int4": ("int8", "int8"), "fp16": ("fp16", "fp16")},
}
#: The form an int4 layer falls back to, before fp32, when its int4 form misses its accuracy
#: floors (its own, or the end-to-end check's).
FALLBACK = {"int4": "int8"}
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
    kernel: str = ""  # MatMulNBits or GemvQ (8/4 bits), GemvF16 (fp16); "" where kept fp32
    kernel_times_us: dict[str, float] | None = None  # MatMulNBits' and GemvQ's, where timed
    timing_copies: int = 1  # copies of the layer its speed check timed in one run (per copy)
    timed_as: str = ""  # the layer of the same shapes whose timing this one shares
    weight: str = ""  # the weight's initializer (layers sharing one are counted once)

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
        # a weight read by several layers (ALBERT's shared layers) is stored once, in each
        # form its layers took
        fp32 = now = 0
        seen: set[Any] = set()
        for r in self.layers:
            w = r.weight or r.name
            if w not in seen:
                seen.add(w)
                fp32 += r.fp32_bytes
            if (w, r.form, r.kernel, r.block_size) not in seen:
                seen.add((w, r.form, r.kernel, r.block_size))
                now += r.bytes
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
    report = _compress(result, options, threads, only)
    if report is not None:  # whatever the exit: the layers the speed check kept, counted
        _speed_note(report)
    return report


def _compress(result: Any, options: Any, threads: int, only: Any) -> WeightsReport | None:
    form = options.weights
    if form == "fp32":
        return None
    model: Model = result.model
    policy = getattr(options, "weights_policy", "default")
    head_form, table_form = SENSITIVE_FORM[policy][form]
    sites = find_sites(model, min_elements=defaults.WEIGHTS_MIN_ELEMENTS, keep_head=False)
    for s in sites:
        if s.head and not s.reason and head_form == "fp32":
            s.reason = KEPT_HEAD
    block8 = defaults.WEIGHTS_BLOCK_SIZE["int8"]
    embs = find_embeddings(model, 1)
    # an int8 table needs whole blocks per row; one that has not is fp16, the default policy's
    # form (never fp32: under "all" the file must not grow past "default"'s)
    table_forms = {
        e.name: "fp16" if table_form == "int8" and e.table.shape[1] % block8 else table_form
        for e in embs
    }
    report = WeightsReport(form, verified=bool(options.safe_mode))
    records = {s.name: _record(s) for s in sites}
    half = form == "fp16"
    for e in embs:
        if e.name in records:  # a node of the same name: the table is left alone, unlisted
            continue
        rows, cols = e.table.shape
        reason = e.reason or (KEPT_EMBEDDING if table_form == "fp32" else "")
        records[e.name] = LayerRecord(
            e.name, "Gather", int(cols), int(rows), "fp32", fp32_bytes=e.fp32_bytes,
            bytes=e.fp32_bytes, reason=reason, weight=e.name,
        )  # fmt: skip
    report.layers = list(records.values())
    result.weights = report
    library = None
    heads = [s for s in sites if s.head and not s.reason]
    saved = {}  # a saved plan's forms, and its layers on GemvQ
    saved_q = set()
    if isinstance(only, Mapping):
        for name, value in only.items():
            saved[name], _, kernel = str(value).partition("+")
            if kernel == Q_OP:
                saved_q.add(name)
    timed = bool(options.safe_mode and options.check_speed)
    kernel = getattr(options, "weights_kernel", "auto")
    if kernel == "MatMulNBits":  # the user's choice over a saved plan's GemvQ layers
        saved_q = set()
    # GemvQ: timed against MatMulNBits, asked for, or saved
    gemvq = not half and (kernel == "GemvQ" or (kernel == "auto" and (timed or saved_q)))
    fp16 = half or (heads and head_form == "fp16")  # GemvF16: its library must build here
    if gemvq or fp16:  # one library holds both
        try:
            library = with_gemv(getattr(result, "custom_ops", None), options.codegen)
        except CustomOpsUnavailable as exc:
            if gemvq:
                report.notes.append(f"GemvQ not tried: {exc}")
                saved_q = set()
                if kernel == "GemvQ":  # every layer on MatMulNBits, as the note says
                    options = options.replace(weights_kernel="MatMulNBits")
            if fp16:
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
    forms = {s.name: head_form if s.head else form for s in todo}
    for s in todo:  # a layer the saved plan holds at the fallback form (int8 in an int4 model)
        if not s.head and form in FALLBACK and saved.get(s.name) == FALLBACK[form]:
            forms[s.name] = FALLBACK[form]
    packs = {s.name: _quantize(s.weight, forms[s.name], options) for s in todo}
    for name in saved_q & set(packs):  # untimed (or timed again below): the saved kernel
        if packs[name].gemvq and not timed:
            packs[name] = replace(packs[name], kernel=Q_OP)
    tables = [e for e in embs if records.get(e.name) is not None and not records[e.name].reason]
    tables = [e for e in tables if records[e.name].op == "Gather"]
    for e in tables:  # int8: symmetric (GatherBlockQuantized's default zero point)
        forms[e.name] = tf = table_forms[e.name]
        t = np.ascontiguousarray(e.table.T)
        packs[e.name] = to_half(t) if tf == "fp16" else quantize(t, 8, block8, False)
    timing = Timing(
        gemvq=library is not None and not half and kernel == "auto",
        pressure_bytes=sum(s.fp32_bytes for s in todo),
    )
    if options.safe_mode and todo:
        first = todo
        todo = check_layers(
            model, result.feeds, todo, packs, records, options, level, forms, timing=timing
        )
        if form in FALLBACK:  # a layer whose int4 failed its check gets a chance at int8
            ok = {s.name for s in todo}
            failed = [s for s in first if s.name not in ok and _failed_accuracy(records[s.name])]
            todo += _fall_back(
                model, result.feeds, failed, packs, records, options, level, forms, timing
            )
    if options.safe_mode and tables:
        tables = check_tables(model, result.feeds, tables, packs, records, threads, forms)
    chosen = [s.name for s in todo] + [e.name for e in tables]
    for name in chosen:
        r, p = records[name], packs[name]
        r.form, r.block_size, r.bytes = forms[name], p.block_size or None, p.nbytes
        r.zero_point = p.zero_points is not None
    if not chosen:
        _settle_kernels(report, packs)
        report.notes.append("no layer compressed")
        return report
    work = _apply(model, chosen, packs, level)
    if options.safe_mode:
        e2e = end_to_end(result.original, work, result.feeds, form, threads)
        report.end_to_end = e2e
        if not passed(e2e) and form in FALLBACK and options.safe_mode:
            done = _demote_fewest(
                result,
                model,
                chosen,
                sites,
                packs,
                records,
                options,
                level,
                forms,
                e2e,
                report,
                threads,
                timing,
            )
            if done is not None:
                work, e2e = done
        if not passed(e2e):
            chosen, work = _roll_back_fewest(
                result, model, chosen, packs, records, level, form, threads, e2e, report
            )
            if not chosen:
                _settle_kernels(report, packs)
                report.notes.append("the end-to-end check failed: every layer stays fp32")
                return report
    result.model = work
    _settle_kernels(report, packs)
    ours = {F16_OP, Q_OP}
    if library is not None and any(records[n].kernel in ours for n in chosen):
        result.custom_ops = library  # the fused model needs our library (saved with it)
    n_tables = sum(records[n].op == "Gather" for n in chosen)
    t_forms = sorted({forms[n] for n in chosen if records[n].op == "Gather"})
    head_other_form = any(s.name in chosen and forms[s.name] != form for s in heads)
    how = (
        "fp16 weights, fp32 accumulation"
        if half
        else f"{form}{f', LM head {head_form}' if head_other_form else ''}"
        f"{_fallback_note(chosen, heads, records, form)}"
        f", block {defaults.WEIGHTS_BLOCK_SIZE[form]}, accuracy_level {level}"
    )
    by_op: dict[str, int] = {}
    for n in chosen:
        if records[n].op != "Gather":
            by_op[records[n].kernel] = by_op.get(records[n].kernel, 0) + 1
    ops = " and ".join(f"{op} ({c})" for op, c in sorted(by_op.items(), key=lambda kv: -kv[1]))
    if len(by_op) == 1:
        ops = next(iter(by_op))
    report.notes.append(
        f"{len(chosen) - n_tables} contractions are {ops or FORM_OPS[form]} ({how})"
        + (
            f", {n_tables} embedding tables "
            + " or ".join(
                "fp16 (Gather, Cast)" if tf == "fp16" else "GatherBlockQuantized (int8)"
                for tf in t_forms
            )
            if n_tables
            else ""
        )
    )
    if kernel != "auto":
        on = [records[n].kernel for n in chosen if records[n].op != "Gather" and forms[n] != "fp16"]
        report.notes.append(_forced_note(getattr(options, "weights_kernel", kernel), kernel, on))
    return report


def _speed_note(report: WeightsReport) -> None:
    """A note counting the layers the speed check kept fp32 (the user asked for compressed
    weights: why so many stayed, and how to compress them anyway)."""
    slow = [r for r in report.layers if r.reason.startswith(KEPT_SLOWER)]
    if slow:
        report.notes.append(
            f"{len(slow)} contraction{'s' if len(slow) > 1 else ''} kept fp32 as slower "
            "compressed on the sample inputs "
            "(a call of many rows, a prefill, runs faster on the fp32 GEMM; one row, a decode "
            "step, is where compressed weights win); weights_goal='size' compresses every layer "
            "that passes its accuracy checks"
        )


def _settle_kernels(report: WeightsReport, packs: Mapping[str, Packed]) -> None:
    """Each record's ``kernel`` as the model holds it, after demotions and rollbacks ("" for a
    layer kept fp32, whatever the speed check had timed it on)."""
    for r in report.layers:
        p = packs.get(r.name)
        r.kernel = "" if r.form == "fp32" or p is None else _kernel(r, p)


def _kernel(r: LayerRecord, p: Packed) -> str:
    """The operator a compressed layer runs on."""
    if r.op == "Gather":
        return "Gather" if p.bits == 16 else "GatherBlockQuantized"
    return p.op


def _fallback_note(chosen: list[str], heads: list[Site], records: Mapping, form: str) -> str:
    """``, k layers int8 (...)``: the layers at :data:`FALLBACK`'s form, by cause."""
    head_names = {s.name for s in heads}
    low = FALLBACK.get(form)
    fell = [records[n] for n in chosen if n not in head_names and records[n].op != "Gather"]
    fell = [r for r in fell if r.form == low]
    if not fell:
        return ""
    own = sum(r.reason.startswith(f"{low}: its ") for r in fell)
    e2e = sum(r.reason.startswith(f"{low}: demoted") for r in fell)
    causes = [f"{own} after their {form} layer check"] if own else []
    causes += [f"{e2e} by the end-to-end check"] if e2e else []
    causes += (
        [f"{len(fell) - own - e2e} as the saved plan holds them"] if len(fell) > own + e2e else []
    )
    return f", {len(fell)} layers {low} ({', '.join(causes)})"


def _failed_accuracy(record: LayerRecord) -> bool:
    return record.reason.startswith(LAYER_CHECK)


def _fall_back(
    model: Model,
    feeds: Mapping[str, Any],
    failed: list[Site],
    packs: dict[str, Packed],
    records: Mapping[str, LayerRecord],
    options: Any,
    level: int,
    forms: dict[str, str],
    timing: Timing | None = None,
) -> list[Site]:
    """The layers of ``failed`` (their int4 form missed its layer check) that pass the same
    check, and the speed check, at :data:`FALLBACK`'s form; their records say why they are
    not int4. The others keep their fp32 record, its reason naming both checks."""
    failed = [s for s in failed if forms[s.name] in FALLBACK]
    if not failed:
        return []
    why = {s.name: records[s.name].reason[len("kept fp32: ") :] for s in failed}
    old = {s.name: (forms[s.name], packs[s.name]) for s in failed}
    stats = {s.name: (records[s.name].cosine, records[s.name].rel_err) for s in failed}
    for s in failed:
        forms[s.name] = FALLBACK[forms[s.name]]
        packs[s.name] = _quantize(s.weight, forms[s.name], options)
        records[s.name].reason = ""
    kept = check_layers(model, feeds, failed, packs, records, options, level, forms, timing=timing)
    passed_now = {s.name for s in kept}
    for s in failed:
        r = records[s.name]
        if s.name in passed_now:
            r.reason = f"{forms[s.name]}: its {old[s.name][0]} form failed the {why[s.name]}"
        else:  # the record keeps the first form's figures; the reason quotes both checks
            r.reason = f"{r.reason} (at {forms[s.name]}); at {old[s.name][0]}: {why[s.name]}"
            forms[s.name], packs[s.name] = old[s.name]
            r.cosine, r.rel_err = stats[s.name]
            r.time_us = r.time_fp32_us = None
    return kept


def _demote_fewest(
    result: Any,
    model: Model,
    chosen: list[str],
    sites: list[Site],
    packs: dict[str, Packed],
    records: Mapping[str, LayerRecord],
    options: Any,
    level: int,
    forms: dict[str, str],
    failed: dict[str, Any],
    report: WeightsReport,
    threads: int,
    timing: Timing | None = None,
) -> tuple[Model, dict[str, Any]] | None:
    """The end-to-end check failed: demote the fewest of the worst int4 layers (ranked by their
    own relative error) to :data:`FALLBACK`'s form, found by bisection on their count, each
    first checked on its own at that form, accuracy and (``check_speed``) speed: a layer
    slower than fp32 there is no candidate. Returns the model and its passing check, or
    ``None`` (nothing changed) where demoting every such layer does not pass either."""
    form = options.weights
    by_name = {s.name: s for s in sites}
    pool = [n for n in chosen if forms[n] == form and n in by_name]
    if not pool:
        return None
    low = FALLBACK[form]
    trial = {n: _record(by_name[n]) for n in pool}
    low_packs = {n: _quantize(by_name[n].weight, low, options) for n in pool}
    ok = check_layers(
        model, result.feeds, [by_name[n] for n in pool], low_packs, trial, options, level,
        {n: low for n in pool}, threads, timing=timing,
    )  # fmt: skip
    ok_names = {s.name for s in ok}
    ranked = sorted((n for n in pool if n in ok_names), key=lambda n: -(records[n].rel_err or 0.0))
    if not ranked:
        return None

    def demoted(count: int) -> tuple[Model, dict[str, Any]]:
        mixed = {**packs, **{n: low_packs[n] for n in ranked[:count]}}
        work = _apply(model, chosen, mixed, level)
        return work, end_to_end(result.original, work, result.feeds, form, threads)

    every = demoted(len(ranked))
    if not passed(every[1]):
        return None
    lo, hi, best, fail = _fewest(len(ranked), demoted, failed, every)
    cos = min(v["cosine"] for v in fail.values())
    for n in ranked[:hi]:
        r, t, p = records[n], trial[n], low_packs[n]
        forms[n], packs[n] = low, p
        r.form, r.block_size, r.bytes = low, p.block_size or None, p.nbytes
        r.zero_point = p.zero_points is not None
        r.cosine, r.rel_err = t.cosine, t.rel_err
        r.time_us, r.time_fp32_us = t.time_us, t.time_fp32_us
        r.kernel, r.kernel_times_us = t.kernel, t.kernel_times_us
        r.timing_copies, r.timed_as = t.timing_copies, t.timed_as
        r.reason = (
            f"{low}: demoted from {form} by the end-to-end check (the {hi} layers of largest "
            f"relative error are the fewest whose demotion passes it; with {lo} demoted: output "
            f"cosine {cos:.6f}, floor {defaults.WEIGHTS_E2E_COSINE[form]})"
        )
    report.end_to_end = best[1]
    return best


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

    def rolled_back(count: int) -> tuple[Model, dict[str, Any]]:
        work = _apply(model, ranked[count:], packs, level)
        return work, end_to_end(result.original, work, result.feeds, form, threads)

    # all of them rolled back is the original, which passes: not built
    lo, hi, best, fail = _fewest(len(ranked), rolled_back, failed, None)
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


def _fewest(
    count: int,
    trial: Callable[[int], tuple[Model, dict[str, Any]]],
    failed: dict[str, Any],
    best: tuple[Model, dict[str, Any]] | None,
) -> tuple[int, int, tuple[Model, dict[str, Any]] | None, dict[str, Any]]:
    """Bisection on how many of the worst layers change (``trial(k)``: the model with the
    ``k`` worst changed, and its end-to-end check): none changed fails (``failed``, its
    check), all ``count`` pass (``best``: that model and check, ``None`` when not built).
    Returns ``(lo, hi, best, fail)``: ``hi`` the fewest that pass, ``lo = hi - 1`` the most
    that fail, ``best`` the model and check at ``hi``, ``fail`` the check at ``lo``."""
    lo, hi, fail = 0, count, failed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        work, e2e = trial(mid)
        if passed(e2e):
            hi, best = mid, (work, e2e)
        else:
            lo, fail = mid, e2e
    return lo, hi, best, fail


def _quantize(w: np.ndarray, form: str, options: Any = None) -> Packed:
    """``w`` in ``form``'s layout; on ``GemvQ`` where ``options.weights_kernel`` asks for it and
    the weight fits it (else the kernel safe mode's timing or a saved plan decides)."""
    if form == "fp16":
        return to_half(w, panels=True)
    p = quantize(
        w, BITS[form], defaults.WEIGHTS_BLOCK_SIZE[form], defaults.WEIGHTS_ZERO_POINT[form]
    )
    if getattr(options, "weights_kernel", "auto") == Q_OP and p.gemvq:
        p = replace(p, kernel=Q_OP)
    return p


def _forced_note(effective: str, asked: str, kernels: list[str]) -> str:
    """The report's note on a kernel the options chose (``weights_kernel``), not safe mode's
    race; ``kernels``: those of the int8/int4 contractions the model holds."""
    n, on_q = len(kernels), kernels.count(Q_OP)
    if effective == asked == Q_OP:
        rest = (
            f"; {n - on_q} on MatMulNBits (GemvQ needs N a multiple of 16 and K in whole blocks)"
            if n - on_q
            else ""
        )
        return (
            f"weights_kernel='{Q_OP}': {on_q} of the {n} int8/int4 contractions on {Q_OP}, "
            f"not timed against MatMulNBits{rest}"
        )
    if asked == Q_OP:
        return (
            f"weights_kernel='{Q_OP}' asked for, but its library did not build: the {n} "
            f"int8/int4 contractions on MatMulNBits"
        )
    return (
        f"weights_kernel='{asked}': the {n} int8/int4 contractions on {asked}, not timed "
        f"against {Q_OP}"
    )


def _record(s: Site) -> LayerRecord:
    b = s.node.inputs[1] if len(s.node.inputs) > 1 else None
    if s.extra and s.extra[0] is not None and s.extra[0].inputs:  # W through a Transpose
        b = s.extra[0].inputs[0]
    return LayerRecord(
        s.name,
        s.op,
        s.k,
        s.n,
        "fp32",
        fp32_bytes=s.fp32_bytes,
        bytes=s.fp32_bytes,
        reason=s.reason,
        weight=b.name if b is not None else "",
    )


def _apply(model: Model, names: list[str], packs: Mapping[str, Packed], level: int) -> Model:
    """A copy of ``model`` with the sites named ``names`` in their packed form (``MatMulNBits``
    or ``GemvF16``) and the tables named so as ``GatherBlockQuantized`` (or fp16 ``Gather``)."""
    work = clone_model(model)
    wanted = set(names)
    old = set(work.graph.initializers)
    sites = find_sites(work, min_elements=defaults.WEIGHTS_MIN_ELEMENTS, keep_head=False)
    for site in sites:
        if site.name in wanted:
            compress_site(work, site, packs[site.name], level)
    for emb in find_embeddings(work, defaults.WEIGHTS_BLOCK_SIZE["int8"]):
        if emb.name in wanted:
            compress_embedding(work, emb, packs[emb.name])
    share_identical(work, old)  # a shared weight's compressed form, stored once
    drop_dead_initializers(work)
    return work
