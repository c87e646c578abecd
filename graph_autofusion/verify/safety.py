"""Safe mode (F13): check every applied fusion on real activations, roll back the ones that fail.

The engine, in the order the fuse pipeline uses it::

    feeds = generate_inputs(original)                    # or the user's sample inputs
    acts = capture_activations(original, feeds)          # every intermediate, one ORT run
    for record in records:                               # one FusionRecord per applied fusion
        result = check_fusion(original, fused, record, acts)
        if not result.passed: ...                        # roll back, report result.code/message
    end_to_end(original_proto, fused_proto, feeds)       # closes it

Per fusion, :func:`check_fusion` builds two standalone models with :func:`subgraph_model` (the
original nodes the fusion replaced, and the new nodes that replace them, both reading the same
captured activations) and runs them in onnxruntime:

* ``alias``: a fused node writes a value it reads, an in-place (``aten::*_``) op moved into or
  out of the fusion with readers of the written value outside it, or a name written twice;
* ``fp16-overflow``: fp32 reference magnitudes (the original subgraph rerun in float32) above
  65504 in a value that is, or that the fused operator computes, in float16 (where the fused
  operator holds every value in float16, not one the original's own run saturates there too:
  a masked score plus float16's lowest value);
  or inf/nan in a fused output where the original had none, with float16 in play;
* ``numerics``: cosine similarity of each fused output with the original value below the floor
  (``record.tolerance``, or ``cosine_floor``); max abs/rel errors are reported;
* ``monte-carlo``: the float inputs perturbed by ``mc_scale`` times their std, ``mc_samples``
  times; any sample below the floor fails; the spread (max - min cosine) is reported;
* ``slower``: the fused subgraph's median time above ``speed_margin`` times the unfused one's
  (confirmed by a second, longer measurement before failing);
* ``error``: a subgraph cannot be built or run (e.g. an activation was not captured).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion import defaults, reasons
from graph_autofusion.ir.core import Model, Node
from graph_autofusion.ir.node import from_constants
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import Timer, current_timer
from graph_autofusion.samples.inputs import generate_inputs
from graph_autofusion.verify.compare import compare_tensors
from graph_autofusion.verify.fp16 import FP16_MAX, fp16_analysis
from graph_autofusion.verify.signature import Repeats, fusion_signature
from graph_autofusion.verify.speed import SpeedPolicy
from graph_autofusion.verify.subgraph import (
    SafetyCheckError,
    activation_runner,
    capture_activations,
    run_session,
    subgraph_model,
)


@dataclass
class FusionRecord:
    """One applied fusion, as safe mode sees it.

    Attributes:
        key: Display name, e.g. ``"bias_gelu@node_gelu_3"``.
        rule: Rule name or ``"cluster:<kind>"``.
        original_nodes: Nodes of the ORIGINAL model the fusion replaced.
        new_nodes: Nodes of the FUSED model that replace them.
        inputs: Value names the fusion reads (they exist in both models).
        outputs: Value names it produces (the same names in both models).
        tolerance: Cosine-similarity floor (the rule's ``tolerance``).
    """

    key: str
    rule: str
    original_nodes: list[Node]
    new_nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    tolerance: float = defaults.FUSION_COSINE


@dataclass
class SafetyResult:
    """The verdict on one fusion. ``code`` is ``"ok"`` or the first failing check's reason."""

    key: str
    passed: bool
    code: str
    message: str
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    mc_spread: float | None = None
    fp16_max: float | None = None
    time_unfused_us: float | None = None
    time_fused_us: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def record_from_applied(original: Model, applied: Any, *, key: str | None = None) -> FusionRecord:
    """The :class:`FusionRecord` of an ``Applied`` (``patterns.candidates``) rewritten on a copy
    of ``original`` made with the same node names (e.g. ``load_onnx(to_onnx(original))``).

    The match's nodes are mapped to ``original``'s nodes by name; inputs and outputs are the
    match's value names (fused outputs take over those names).
    """
    by_name = {n.name: n for n in original.graph.nodes}
    match = applied.match
    missing = [n.name for n in match.nodes if n.name not in by_name]
    if missing:
        raise SafetyCheckError(f"nodes {missing} are not in the original model")
    return FusionRecord(
        key=key or f"{applied.rule.name}@{match.root.name}",
        rule=applied.rule.name,
        original_nodes=[by_name[n.name] for n in match.nodes],
        new_nodes=list(applied.nodes),
        inputs=_read_from_outside([by_name[n.name] for n in match.nodes], applied.nodes),
        outputs=[v.name for v in match.outputs],
        tolerance=float(getattr(applied.rule, "tolerance", defaults.FUSION_COSINE)),
    )


def _read_from_outside(*node_lists: Sequence[Node]) -> list[str]:
    """Names of the non-constant values each node list reads from outside itself."""
    names: dict[str, None] = {}
    for nodes in node_lists:
        produced = {o.name for n in nodes for o in n.outputs}
        for n in nodes:
            for v in n.all_inputs():
                if v.name not in produced and v.const is None:
                    names.setdefault(v.name, None)
    return list(names)


# ----------------------------------------------------------------------------- alias
def _alias_hazard(original: Model, fused: Model, record: FusionRecord) -> str:
    for n in record.new_nodes:
        ins = {v.name for v in n.all_inputs()}
        for o in n.outputs:
            if o.name in ins:
                return f"fused node {n.name!r} writes %{o.name}, which it also reads (in place)"
        if n.op_type.endswith("_") and ("aten" in n.domain or "torch" in n.domain):
            return f"fused node {n.name!r} is an in-place operator ({n.qualified_op})"
    inside = {id(n) for n in record.original_nodes}
    for n in record.original_nodes:
        if n.op_type.endswith("_") and ("aten" in n.domain or "torch" in n.domain) and n.inputs:
            target = n.inputs[0]
            if target is not None and any(id(u) not in inside for u in target.user_nodes):
                return (
                    f"in-place {n.qualified_op} writes %{target.name}, which nodes outside the "
                    "fusion read: fusing would move the write across those reads"
                )
    wanted = set(record.outputs)
    writers: dict[str, int] = {}
    for n in fused.graph.nodes:
        for o in n.outputs:
            if o.name in wanted:
                writers[o.name] = writers.get(o.name, 0) + 1
    for name in wanted:
        if name in fused.graph.initializers or any(v.name == name for v in fused.graph.inputs):
            writers[name] = writers.get(name, 0) + 1
    twice = sorted(k for k, c in writers.items() if c > 1)
    if twice:
        return f"%{twice[0]} is written more than once in the fused graph"
    return ""


# ----------------------------------------------------------------------------- timing
def _speed(
    original: Model,
    record: FusionRecord,
    activations: Mapping[str, np.ndarray],
    fused_proto: Any,
    weights: dict[str, np.ndarray],
    feeds: Mapping[str, np.ndarray],
    ort_level: str,
    threads: int,
    time_runs: int,
    timer: Timer,
    speed_margin: float,
    flush_denormals: bool = False,
) -> tuple[float, float, bool]:
    """Median unfused and fused times (us) of one fusion and whether the fused one is slower
    than ``speed_margin`` x the unfused (:class:`~graph_autofusion.verify.speed.SpeedPolicy`:
    confirmed by a second, longer measurement). ``weights``: the constants ``fused_proto``
    declares without data (:func:`subgraph_model`'s ``in_place``), and the original's."""
    timed_orig = subgraph_model(
        original,
        record.original_nodes,
        record.inputs,
        record.outputs,
        arrays=activations,
        in_place=weights,
    )
    # onnxruntime's default spinning workers, as deployed: without them, a fused kernel
    # that splits its rows over the thread pool pays a worker wake-up (~8 us here) per
    # run that the small unfused operators, each below the pool's cut-off, do not, and
    # an isolated fused RMSNorm at 16 x 512 times 17 us against 11 us unfused (9 us
    # fused with spinning). Only these two sessions run while they are timed.
    # both sides with the denormal mode the fused model serves with (FuseOptions.denormals)
    kw = {"spinning": True, "in_place": weights or None, "flush_denormals": flush_denormals}
    a = ort_session(timed_orig, ort_level, threads, **kw)
    b = ort_session(fused_proto, ort_level, threads, **kw)
    fa, fb = _feeds_for(a, feeds), _feeds_for(b, feeds)
    na, nb = [o.name for o in a.get_outputs()], [o.name for o in b.get_outputs()]
    policy = SpeedPolicy(speed_margin, time_runs)  # the one speed policy (verify/speed.py)
    return policy.measure(lambda: a.run(na, fa), lambda: b.run(nb, fb), record.key, timer=timer)


def _perturb(a: np.ndarray, rng: np.random.Generator, scale: float) -> np.ndarray:
    """``a`` plus noise of ``scale`` x its std; integers, non-finite values and sentinels
    (|x| >= max/4 of the dtype, like an attention mask's minimum) stay as they are. The common
    float32 case draws uniform noise of that standard deviation (six times faster to draw
    than Gaussian: a GPT-2 s128 fuse drew 210 such tensors, 0.5 s of Gaussian noise)."""
    if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
        return a
    limit = float(np.finfo(a.dtype).max) / 4
    if a.dtype == np.float32 and np.isfinite(a).all() and float(np.abs(a).max()) < limit:
        # the common case, in float32 without masks: every element moves
        std = float(np.std(a, dtype=np.float64)) or 1.0
        noise = rng.random(a.shape, dtype=np.float32)  # U[0, 1): std 1 / sqrt(12)
        noise -= np.float32(0.5)
        noise *= np.float32(scale * std * math.sqrt(12.0))
        return noise.__iadd__(a)
    wide = a.astype(np.float64)
    movable = np.isfinite(wide) & (np.abs(wide) < limit)
    if not movable.any():
        return a
    std = float(np.std(wide[movable])) or 1.0
    noise = rng.standard_normal(a.shape) * (scale * std)
    return np.asarray(np.where(movable, wide + noise, wide).astype(a.dtype))


def _feeds_for(sess: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {i.name: arrays[i.name] for i in sess.get_inputs()}


# ----------------------------------------------------------------------------- the check
def check_fusion(
    original: Model,
    fused: Model,
    record: FusionRecord,
    activations: Mapping[str, np.ndarray],
    *,
    cosine_floor: float | None = None,
    mc_samples: int = defaults.MC_SAMPLES,
    mc_scale: float = 1e-2,
    time_runs: int = 20,
    check_speed: bool = True,
    speed_margin: float = defaults.CHECK_FUSION_SPEED_MARGIN,
    ort_level: str = "all",
    threads: int = 2,
    seed: int = 0,
    timer: Timer | None = None,
    repeats: Repeats | None = None,
    flush_denormals: bool = False,
) -> SafetyResult:
    """Check one fusion on the captured ``activations`` of the original model.

    Args:
        cosine_floor: Overrides ``record.tolerance`` when given.
        mc_samples: Monte-Carlo perturbations (0 skips the check).
        mc_scale: Perturbation std relative to each float input's std.
        time_runs: Timed runs per side (median); ``check_speed=False`` skips timing.
        speed_margin: Fused may take up to this factor of the unfused time.
        ort_level: Graph optimization level for timing (``disable``/``basic``/``all``); the
            numeric checks always run with optimizations off.
        flush_denormals: both sides timed with denormals flushed to zero, as the fused model
            serves (``FuseOptions.denormals``); the numeric checks compute IEEE denormals.
        timer: Times each run of the speed check (default: the current timer of
            :mod:`graph_autofusion.runtime.timing`, the wall clock unless a test swapped it).
        repeats: What the checks of one fuse learned per
            :func:`~graph_autofusion.verify.signature.fusion_signature`: a fusion whose
            signature was timed takes that speed verdict (``details["timed_as"]``) instead of
            timing again (a "slower" verdict only once a second fusion of the signature,
            timed on its own, ``details["timed_again"]``, measured slower too; else that
            second verdict is the one shared), and one whose signature passed the full Monte-Carlo check runs
            ``defaults.REPEAT_MC_SAMPLES`` samples (``details["mc_as"]``); its numerics are
            always checked on its own activations.

    Returns:
        A :class:`SafetyResult`; ``code`` names the first failing check in the order alias,
        error, fp16-overflow, numerics, monte-carlo, slower.
    """
    floor = record.tolerance if cosine_floor is None else cosine_floor
    res = SafetyResult(record.key, True, reasons.OK, "")
    sig = fusion_signature(record, activations) if repeats is not None else None

    def fail(code: str, message: str) -> SafetyResult:
        res.passed, res.code, res.message = False, code, message
        return res

    weights: dict[str, np.ndarray] = {}  # the constants every session reads in place
    hazard = _alias_hazard(original, fused, record)
    if hazard:
        return fail(reasons.ALIAS, hazard)
    try:
        internal = [
            o.name
            for n in record.original_nodes
            for o in n.outputs
            if o.name
            and o.name not in record.outputs
            and not (o.meta.get("onnx_omitted") and not o.users)
        ]
        orig_proto = subgraph_model(
            original,
            record.original_nodes,
            record.inputs,
            [*record.outputs, *internal],
            arrays=activations,
            in_place=weights,
        )
        fused_proto = subgraph_model(
            fused,
            record.new_nodes,
            record.inputs,
            record.outputs,
            arrays=activations,
            in_place=weights,
        )
        # numerics only: the weights are read in place and not packed (a 65 MB LM head is
        # not copied into every session)
        orig_sess = ort_session(orig_proto, "disable", threads, lean=True, in_place=weights or None)
        fused_sess = ort_session(
            fused_proto, "disable", threads, lean=True, in_place=weights or None
        )
        wanted = [i.name for s in (orig_sess, fused_sess) for i in s.get_inputs()]
        feeds = {k: np.asarray(activations[k]) for k in wanted if k in activations}
        missing = [k for k in wanted if k not in feeds]
        if missing:
            return fail(
                reasons.ERROR, f"activations not captured: %{', %'.join(sorted(set(missing)))}"
            )
        ref = run_session(orig_sess, feeds)
        got = run_session(fused_sess, feeds)
    except Exception as exc:  # a subgraph ORT rejects is a fusion we cannot vouch for
        return fail(reasons.ERROR, f"{type(exc).__name__}: {exc}")

    per_output = {}
    for name in record.outputs:
        expected = activations.get(name, ref[name])
        per_output[name] = compare_tensors(got[name], expected)
    res.details["outputs"] = per_output
    res.cosine = min(s["cosine"] for s in per_output.values())
    res.max_abs = max(s["max_abs"] for s in per_output.values())
    res.max_rel = max(s["max_rel"] for s in per_output.values())
    new_nonfinite = [k for k, s in per_output.items() if s["nonfinite"]]

    try:
        res.fp16_max, overflow = fp16_analysis(
            original, fused, record, orig_proto, feeds, internal, weights, own=ref
        )
    except Exception as exc:
        return fail(reasons.ERROR, f"fp16 range analysis failed: {type(exc).__name__}: {exc}")
    if overflow:
        return fail(reasons.FP16_OVERFLOW, overflow)
    if new_nonfinite and res.fp16_max is not None:
        return fail(
            reasons.FP16_OVERFLOW,
            f"fused output %{new_nonfinite[0]} has inf/nan; the original has none",
        )
    if res.cosine < floor:
        worst = min(per_output, key=lambda k: per_output[k]["cosine"])
        return fail(
            reasons.NUMERICS,
            f"%{worst}: cosine {res.cosine:.6f} < {floor} (max abs {res.max_abs:.3g}, "
            f"max rel {res.max_rel:.3g})",
        )

    full_mc = mc_samples
    if sig is not None and sig in repeats.mc:
        mc_samples = min(mc_samples, defaults.REPEAT_MC_SAMPLES)
        res.details["mc_as"] = repeats.mc[sig]
    if mc_samples > 0:
        rng = np.random.default_rng(seed)
        outside = {v.name: v for n in record.original_nodes for v in n.all_inputs()}
        # data, not activations, is not perturbed (a jittered exponent is another op)
        fixed = {k for k, v in outside.items() if from_constants(v)}
        cosines = []
        for _ in range(mc_samples):
            pert = {k: a if k in fixed else _perturb(a, rng, mc_scale) for k, a in feeds.items()}
            o, f = run_session(orig_sess, pert), run_session(fused_sess, pert)
            cosines.append(min(compare_tensors(f[k], o[k])["cosine"] for k in record.outputs))
        res.mc_spread = float(max(cosines) - min(cosines))
        res.details["mc_cosines"] = cosines
        if min(cosines) < floor:
            return fail(
                reasons.MONTE_CARLO,
                f"{sum(c < floor for c in cosines)}/{len(cosines)} perturbed samples fall below "
                f"cosine {floor} (lowest {min(cosines):.6f}, spread {res.mc_spread:.3g})",
            )
        if sig is not None and mc_samples == full_mc:
            repeats.mc.setdefault(sig, record.key)

    if check_speed:
        shared = repeats.speed.get(sig) if sig is not None else None
        if shared is not None and (not shared[2] or sig in repeats.agreed):
            tu, tf, slower, first = shared
            res.details["timed_as"] = first
        else:  # first of its signature, or the second after a "slower": timed on its own
            try:
                tu, tf, slower = _speed(
                    original, record, activations, fused_proto, weights, feeds, ort_level, threads,
                    time_runs, timer or current_timer(), speed_margin, flush_denormals,
                )  # fmt: skip
            except Exception as exc:
                return fail(reasons.ERROR, f"timing failed: {type(exc).__name__}: {exc}")
            if sig is not None:
                if shared is not None:
                    res.details["timed_again"] = shared[3]  # it measured slower there
                    if slower:
                        repeats.agreed.add(sig)
                repeats.speed[sig] = (tu, tf, slower, record.key)
        res.time_unfused_us, res.time_fused_us = tu, tf
        if slower:
            return fail(
                reasons.SLOWER,
                f"fused {tf:.1f} us > unfused {tu:.1f} us x {speed_margin} on the real shapes",
            )
    res.message = f"cosine {res.cosine:.6f}, max abs {res.max_abs:.3g}"
    return res


# ----------------------------------------------------------------------------- end to end
def end_to_end(
    original_path_or_proto: Any,
    fused_proto: Any,
    feeds: Mapping[str, np.ndarray],
    *,
    cosine_floor: float = defaults.E2E_COSINE,
    threads: int = 2,
    reference: Mapping[str, np.ndarray] | None = None,
    others: Sequence[OtherShape] = (),
    flush_denormals: bool = False,
) -> dict[str, dict[str, Any]]:
    """Run the whole original and fused models (path, ModelProto or IR Model each) on ``feeds``
    in onnxruntime and compare every output of the original (``reference``: its outputs on
    ``feeds``, in its output order, e.g. captured: not run again). ``others``: more inputs
    (another shape) with the original's outputs on them, run by the same fused session.
    ``flush_denormals``: the fused model runs as it will serve (``FuseOptions.denormals``),
    denormals flushed to zero, against the original's IEEE outputs.

    Returns:
        Output name -> ``{"cosine", "max_abs", "max_rel", "passed"}``; an output the fused
        model lacks is reported with cosine 0 and ``passed=False``. The outputs on an
        :class:`OtherShape` are keyed ``"name @ what"``, and a fused model that fails there
        has one failing entry ``"@ what"`` with its ``error``.
    """
    if reference is None:
        a = ort_session(original_path_or_proto, "disable", threads, lean=True)
        reference = run_session(a, feeds)
        del a
    b = ort_session(fused_proto, "disable", threads, lean=True, flush_denormals=flush_denormals)
    out = compare_outputs(reference, run_session(b, feeds), cosine_floor=cosine_floor)
    for other in others:
        out.update(
            compare_at(other, lambda f: run_session(b, f, quiet=True), cosine_floor=cosine_floor)
        )
    return out


def compare_at(
    other: OtherShape,
    run: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    *,
    cosine_floor: float,
) -> dict[str, dict[str, Any]]:
    """The fused program ``run`` on ``other``'s inputs against the original's outputs there:
    :func:`compare_outputs` of the floating outputs (an argmax or a top-k index may flip on a
    near tie of random inputs, where nothing is wrong), keyed ``"name @ what"``; a run that
    fails is one failing entry ``"@ what"`` with its ``error``."""
    try:
        got = run(other.feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's or torch's own exception types
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return {
            f"{AT} {other.what}": {
                "cosine": 0.0, "max_abs": math.inf, "max_rel": math.inf, "passed": False,
                "error": error,
            }
        }  # fmt: skip
    ref = {k: v for k, v in other.reference.items() if _floating(v)}
    cmp = compare_outputs(ref, got, cosine_floor=cosine_floor)
    return {f"{name} {AT} {other.what}": v for name, v in cmp.items()}


def _floating(v: Any) -> bool:
    return isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)


def outputs_of(model: Model, acts: Mapping[str, Any]) -> dict[str, Any] | None:
    """``model``'s outputs among captured activations ``acts`` (``None`` if one is missing)."""
    names = [v.name for v in model.graph.outputs]
    return {k: acts[k] for k in names} if all(k in acts for k in names) else None


#: What joins an output's name and the shape it was compared at in :func:`end_to_end`'s keys.
AT = "@"


@dataclass
class OtherShape:
    """Inputs of another shape than the sample inputs (``what``: the shape in words) and the
    original's outputs on them: safe mode's second end-to-end comparison."""

    what: str
    feeds: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]


def at_other_shape(key: str) -> bool:
    """Whether an :func:`end_to_end` entry is of an :class:`OtherShape`."""
    return f" {AT} " in key or key.startswith(f"{AT} ")


def compare_outputs(
    ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], *, cosine_floor: float
) -> dict[str, dict[str, Any]]:
    """Every output of ``ref`` against the same output of ``got``: output name ->
    ``{"cosine", "max_abs", "max_rel", "passed"}`` (a missing output, or one of another shape,
    has cosine 0 and fails)."""
    out: dict[str, dict[str, Any]] = {}
    for name, expected in ref.items():
        if name not in got:
            out[name] = {
                "cosine": 0.0,
                "max_abs": float("inf"),
                "max_rel": float("inf"),
                "passed": False,
            }
            continue
        s = compare_tensors(got[name], expected)
        out[name] = {
            "cosine": s["cosine"],
            "max_abs": s["max_abs"],
            "max_rel": s["max_rel"],
            "passed": bool(s["cosine"] >= cosine_floor),
        }
    return out


__all__ = [
    "AT",
    "FP16_MAX",
    "OtherShape",
    "activation_runner",
    "at_other_shape",
    "compare_at",
    "compare_outputs",
    "outputs_of",
    "FusionRecord",
    "SafetyCheckError",
    "SafetyResult",
    "capture_activations",
    "check_fusion",
    "compare_tensors",
    "end_to_end",
    "generate_inputs",
    "record_from_applied",
    "subgraph_model",
]
