"""The fuse pipeline for onnxruntime (F11, F13): analyze, lower, verify, roll back, close.

    result = fuse_model(original, rules, profile, options=FuseOptions(), feeds=...)
    result.model            # the fused IR model (a new model; the original is untouched)
    result.summary()        # candidates, fused, skipped by reason, estimated improvement

Steps:

1. **Analyze** a working copy with the rules that have an onnxruntime-native form (clusters and
   generic-only rules have none for this target): candidates, costs on the hardware profile,
   the plan (:mod:`graph_autofusion.planner.analysis`).
2. **Lower** the plan's chosen matches through their native rewrites
   (:mod:`graph_autofusion.codegen.onnxruntime`); the rest stay unfused with a reason, and so
   do the matches of rules that have no native form.
3. **Safe mode** (on by default; the runner every target shares, :mod:`.safe_mode`, with
   what this target supplies, :class:`_OrtSafeMode`): capture every intermediate of the
   original in onnxruntime once (before step 1: the analysis reads its shapes there, and the
   checks below the original's outputs), check each lowered fusion on the real activations
   that feed it (numerics, fp16 range, Monte-Carlo, alias, speed;
   :mod:`graph_autofusion.verify.safety`).
   A failing fusion is rolled back on its own: a fresh copy is lowered with only the passing
   fusions (the same matches: matching is deterministic), and the check repeats until nothing
   fails (at most ``MAX_ROUNDS`` rounds).
4. **End to end**: the whole fused model against the original on the sample inputs. If that
   fails, every fusion is rolled back and the original is returned (reported).

Before step 1, ``Reshape`` target shapes that exporters compute at run time
(``Shape -> Gather -> Unsqueeze -> Concat``) are folded into constants where a symbolic proof
allows (:mod:`graph_autofusion.patterns.shape_folding`; ``fold_shapes=False`` turns it off).
The analysis and the lowering start from that folded copy; a rollback folds a fresh copy of
the original again (the folding is deterministic).
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.codegen.attention_layout import absorb_layout
from graph_autofusion.codegen.gemm_reshape import flatten_gemms
from graph_autofusion.codegen.onnxruntime import (
    Lowered,
    Lowering,
    NotLowered,
    candidate_key,
    drop_dead_initializers,
    lower_onnxruntime,
    share_created,
)
from graph_autofusion.codegen.ort_guards import guard_skip_layernorms
from graph_autofusion.codegen.ort_matmul import timed_alone
from graph_autofusion.codegen.precision import keep_fp32_islands
from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.errors import (
    AutofusionWarning,
    GraphAutoFusionError,
    UnsupportedOperatorError,
)
from graph_autofusion.ir.core import Model
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.patterns.shape_folding import fold_reshape_shapes
from graph_autofusion.pipeline import other_shape
from graph_autofusion.pipeline.ort_kernels import CustomOps, CustomOpsUnavailable, site_key
from graph_autofusion.pipeline.plan import plan_for_target
from graph_autofusion.pipeline.result import (
    FuseResult,
    clone_model,
    e2e_passed,
    to_json,
    to_onnx_bytes,
)
from graph_autofusion.pipeline.safe_mode import run_safe_mode
from graph_autofusion.pipeline.stages import Stages
from graph_autofusion.pipeline.weights import compress_weights
from graph_autofusion.planner.analysis import apply_saved_plan
from graph_autofusion.runtime.denormals import denormals_flushed
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.samples.inputs import finite_outputs, nonfinite_outputs
from graph_autofusion.verify.inputs import generate_inputs, retry_longer
from graph_autofusion.verify.optimized_graph import same_model_after_optimization
from graph_autofusion.verify.safety import (
    FusionRecord,
    OtherShape,
    SafetyResult,
    activation_runner,
    check_fusion,
    compare_outputs,
    end_to_end,
    outputs_of,
)
from graph_autofusion.verify.sample_inputs import is_generated, own_copy, run_failure, source_of
from graph_autofusion.verify.signature import Repeats
from graph_autofusion.verify.speed import SpeedPolicy
from graph_autofusion.verify.subgraph import run_session


def _lower(
    work: Model, rules: RuleSet, keys: list[str] | None, analysis: Any, custom: Any = None
) -> tuple[Lowering, list[str]]:
    """Lower the analysis' chosen matches, or (``keys`` given) the matches with these keys
    found again on a fresh copy. ``custom`` (:class:`~graph_autofusion.pipeline.ort_kernels.
    CustomOps`): the groups without a native form become custom operators."""
    if keys is None:
        chosen = analysis.chosen_matches()
        if custom is not None:  # the rest are custom's groups
            chosen = [c for c in chosen if getattr(getattr(c, "rule", None), "rewrite", None)]
    else:
        kept = match_rules(work.graph, rules).kept
        by_key = {candidate_key(k.rule.name, k.match.root): k for k in kept}
        chosen = [by_key[k] for k in keys if k in by_key]
    lowering = lower_onnxruntime(work, chosen)
    if custom is not None:
        lowering.lowered += custom.lower(work, keys, lowering.lowered)
    drop_dead_initializers(work)  # other dead code is left as the user wrote it
    return lowering, [low.key for low in lowering.lowered]


def _same_after_ort(original: Model, result: FuseResult, notes: list[str]) -> bool:
    """A CNN whose fused model onnxruntime's ALL level optimizes into the very graph it makes
    of the original (FusedConv epilogues, folded BatchNormalization: its own fusions): the
    fusions are not timed one by one (numerics are still checked), with a note."""
    if not result.lowered or not any(n.op_type == "Conv" for n in original.graph.nodes):
        return False
    if not same_model_after_optimization(original, result.model):
        return False
    notes.append(
        "not timed one by one: onnxruntime's ALL level makes the same graph of the fused and "
        "the original model"
    )
    return True


def fuse_model(
    original: Model,
    rules: RuleSet,
    profile: Any,
    *,
    options: Any = None,
    feeds: Mapping[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    dump_dir: Any = None,
    keys: Sequence[str] | None = None,
    weight_layers: Sequence[str] | None = None,
) -> FuseResult:
    """Fuse ``original`` for onnxruntime (see the module docstring). ``original`` is not
    modified. ``options``: the :class:`~graph_autofusion.options.FuseOptions` record (default
    ``FuseOptions()``); every field is read from it (its ``target`` is onnxruntime here):
    ``fold_shapes`` first folds provable ``Reshape`` shape computations into constants
    (:mod:`graph_autofusion.patterns.shape_folding`); ``safe_mode``, ``check_speed``,
    ``speed_margin``, ``cosine_floor``, ``mc_samples`` and ``e2e_cosine_floor`` drive safe
    mode; ``benefit_threshold``, ``strategy``, ``clustering`` and ``max_cluster_*`` the plan.
    ``dump_dir``: write each stage's artifact there (``plan.json``, ``lowered.txt``,
    ``fused.onnx``). ``keys``: a saved plan's candidate keys, lowered instead of the
    analysis' choice (found again by matching; safe mode still checks each).

    ``options.custom_ops``: planned groups with no onnxruntime operator become generated
    kernels in one custom-operator library (``result.custom_ops``, :mod:`graph_autofusion.
    pipeline.ort_kernels`); a library that fails to build or load gives the model without
    custom operators, with a note saying why. ``options.codegen``: their compiler options.

    ``options.weights`` (``int8``/``int4``): the last stage compresses the contractions'
    weights, each layer verified (:mod:`graph_autofusion.pipeline.weights`; ``result.weights``);
    ``weight_layers``: only these contractions (a saved plan's), still verified."""
    options = (options or FuseOptions()).replace(target="onnxruntime")
    args = dict(feeds=feeds, progress=progress, dump_dir=dump_dir, saved_keys=keys)
    notes: list[str] = []
    custom = CustomOps.start(options.custom_ops, options.codegen, notes, options.weights)
    result = None
    if custom is not None:
        try:
            result = _fuse_model(
                original, rules, profile, options, custom=custom, notes=notes, **args
            )
        except CustomOpsUnavailable as exc:
            notes.append(f"custom operators off: {exc}; fused without them")
    if result is None:
        result = _fuse_model(original, rules, profile, options, custom=None, notes=notes, **args)
    if options.weights != "fp32":  # compressed weights: the last stage, each layer verified
        stages = Stages(dump_dir, label=f"onnxruntime ({options.weights} weights)")
        stages.timings = result.timings
        with stages("weights", f"weights: {options.weights}"):
            report = compress_weights(result, options, only=weight_layers)
        if report is not None:
            result.notes.append(report.notes[-1] if report.notes else f"weights {report.form}")
        stages.dump("fused.onnx", lambda: to_onnx_bytes(result.model))
    return result


def _fuse_model(
    original: Model,
    rules: RuleSet,
    profile: Any,
    options: Any,
    *,
    feeds: Mapping[str, Any] | None,
    progress: Callable[[str, int, int], None] | None,
    dump_dir: Any,
    custom: Any,
    notes: list[str],
    saved_keys: Sequence[str] | None = None,
) -> FuseResult:
    stages = Stages(dump_dir, label="onnxruntime")
    notes = list(notes)
    if isinstance(profile, str | os.PathLike):  # once: the plan (twice on a folding
        profile = load_profile(profile)  # rollback) and the session-fusion guards read it
    native = RuleSet(tuple(r for r in rules if r.rewrite is not None))
    generic_only = RuleSet(tuple(r for r in rules if r.rewrite is None))
    feeds = own_copy(feeds) if feeds is not None else generate_inputs(original)
    opts = options.replace(custom_ops=custom is not None)
    safe_mode = opts.safe_mode
    planned = rules if custom is not None else native  # custom: every rule, and clusters

    acts = reference = other = None
    if safe_mode:  # first: the plan reads its shapes, the checks the original's outputs
        with stages("capture", "safe mode: capture activations"):
            runner: list[Any] = []  # one session for the sample inputs and the second shape

            def capture(model: Model, arrays: Mapping[str, Any]) -> dict[str, Any]:
                if not runner:
                    runner.append(activation_runner(model))
                return runner[0](arrays)  # every intermediate

            acts, feeds = _capture_original(original, feeds, capture, notes)
            other = other_shape.prepare(original, feeds, runner[0]) if runner else None
            runner.clear()
        reference = outputs_of(original, acts)
    with stages("plan"):
        work, analysis, folding, _target = plan_for_target(
            original, planned, profile, opts, feeds, activations=acts
        )
        if folding is not None and folding.folded and safe_mode:
            problem = _check_folding(original, work, feeds, opts.e2e_cosine_floor, reference, other)
            if problem:
                notes.append(f"shape folding rolled back: {problem}")
                work, analysis, folding, _target = plan_for_target(
                    original, planned, profile, opts, feeds, fold=False, activations=acts
                )
    if saved_keys is not None:
        # a saved plan replaces the cost model's choice, for our kernels too: the library is
        # built from the chosen candidates, and a fusion this machine's cost model leaves to
        # safe mode's timing (a close call) was dropped on load without a word
        # (the custom-operator stage's own sites are no candidates: lowered by their keys)
        planned_keys = [k for k in saved_keys if custom is None or not site_key(k)]
        apply_saved_plan(analysis, planned_keys, notes)
    stages.dump("plan.json", lambda: to_json(analysis.to_dict()))
    with stages("lower"):
        custom_refused = custom.prepare(work, analysis, _target) if custom is not None else []
        if saved_keys is not None:
            lowering, keys = _lower(work, native, list(saved_keys), None, custom)
        else:
            lowering, keys = _lower(work, native, None, analysis, custom)
        not_lowered = list(lowering.not_lowered) + custom_refused
        for rm in match_rules(original.graph, generic_only).kept if custom is None else ():
            not_lowered.append(
                NotLowered(
                    candidate_key(rm.rule.name, rm.match.root),
                    rm.rule.name,
                    reasons.NO_NATIVE_FORM,
                    f"{rm.rule.fuse_pattern} has no onnxruntime-native operator (its generic local "
                    f"function would be inlined and run unfused)",
                )
            )
    stages.dump(
        "lowered.txt",
        lambda: "\n".join(f"{low.key}: {' '.join(low.fused_ops)}" for low in lowering.lowered),
    )
    result = FuseResult(
        work, original, analysis, lowering.lowered, not_lowered, safe_mode=safe_mode, feeds=feeds
    )
    result.shape_folding = folding
    if safe_mode:  # the one runner: check, roll back, re-lower, end to end
        target = _OrtSafeMode(
            result, opts, notes, native, custom, keys, acts, reference, profile=profile,
            other=other,
        )  # fmt: skip
        run_safe_mode(result, target, stages, opts, notes, progress=progress)
    else:
        share_created(result.model, result.lowered)
        absorb_layout(result.model)
        flatten_gemms(result.model)
        _guard(result.model, profile, notes)
        _keep_fp32(result, opts.keep_fp32, notes)
    result.timings = stages.timings
    result.notes = notes
    if custom is not None:
        custom.finish(result)
    stages.dump("fused.onnx", lambda: to_onnx_bytes(result.model))
    return result


class _OrtSafeMode:
    """What the onnxruntime target supplies to safe mode's runner (:mod:`.safe_mode`): its
    check (:func:`~graph_autofusion.verify.safety.check_fusion` on onnxruntime's activations of
    the original), its rebuild (a fresh copy of the original, folded again, lowered with the
    kept keys: new nodes, checked again), its end-to-end check (after the layout clean-ups and
    ``keep_fp32``, each rolled back alone when the whole model differs; at the second shape
    too, :mod:`.other_shape`), its culprits there (each fusion's own check on the original's
    activations at that shape, on a fresh lowering), and its fallback (the original,
    unfolded)."""

    def __init__(
        self,
        result: FuseResult,
        opts: Any,
        notes: list[str],
        native: RuleSet,
        custom: Any,
        keys: list[str],
        acts: Any,
        reference: Mapping[str, Any] | None,
        *,
        profile: Any = None,
        other: OtherShape | None = None,
    ) -> None:
        self.result, self.opts, self.notes = result, opts, notes
        self.other = other  # the second shape's inputs and the original's outputs there
        self.native, self.custom, self.keys = native, custom, keys
        self.original = result.original
        self.originals = {n.name: n for n in self.original.graph.nodes}
        self.repeats = Repeats()  # per fusion signature: repeated layers time once
        self.acts = acts  # captured before the plan (it reads its shapes there)
        self.reference = reference  # the original's outputs among them
        self.timed = True
        self.profile = profile  # the plan's hardware profile (the session-fusion guards)

    def capture(self) -> None:
        # the activations were captured first; a CNN onnxruntime optimizes into the same
        # graph fused or not is not timed one by one
        self.timed = self.opts.check_speed and not _same_after_ort(
            self.original, self.result, self.notes
        )

    def _record(self, low: Lowered) -> FusionRecord:
        return FusionRecord(
            low.key,
            low.rule,
            [self.originals[n] for n in low.original_node_names if n in self.originals],
            low.new_nodes,
            low.inputs,
            low.outputs,
            low.tolerance,
        )

    def check(self, low: Lowered, speed: SpeedPolicy | None) -> SafetyResult:
        record = self._record(low)
        alone = timed_alone(low)
        res = check_fusion(
            self.original,
            self.result.model,
            record,
            self.acts,
            cosine_floor=self.opts.cosine_floor,
            mc_samples=self.opts.mc_samples,
            check_speed=speed is not None and self.timed and alone,
            speed_margin=speed.margin if speed is not None else self.opts.speed_margin,
            repeats=self.repeats,
            flush_denormals=denormals_flushed(self.opts.denormals),
        )
        if speed is not None and not self.timed:  # not timed: see _same_after_ort
            res.details["same_optimized_graph"] = True
        elif speed is not None and not alone:
            res.details["timed_with_graph"] = "one-row Gemv: streams its weight once"
        return res

    def rebuild(self, failed: set[str]) -> bool:
        result = self.result
        self.keys = [k for k in self.keys if k not in failed]
        fresh = clone_model(self.original)
        if result.shape_folding is not None and result.shape_folding.folded:
            fold_reshape_shapes(fresh)  # deterministic: the same folds as the first time
        lowering, self.keys = _lower(fresh, self.native, self.keys, None, self.custom)
        result.model, result.lowered = fresh, lowering.lowered
        return True

    def culprits(self) -> list[tuple[Lowered, SafetyResult]]:
        # on a fresh lowering: the layout clean-ups rewrite the fusions' nodes
        self.rebuild(set())
        return other_shape.culprits(
            self.original, self.result.model, self.result.lowered, self.other, self._record,
            self.opts.cosine_floor,
        )  # fmt: skip

    def end_to_end(self) -> Mapping[str, Any]:
        result, notes, floor = self.result, self.notes, self.opts.e2e_cosine_floor
        share_created(result.model, result.lowered)  # each fusion was verified on its own nodes
        relayout = any(
            n.op_type in ("Attention", "Gemm", "LayerNormalization")
            for n in result.model.graph.nodes
        )
        # the verified model as it is (a fallback: not typed again through ONNX)
        before_layout = clone_model(result.model, infer_types=False) if relayout else None
        absorbed = absorb_layout(result.model)  # all three checked end to end here
        flattened = flatten_gemms(result.model)
        guarded = _guard(result.model, self.profile, None)

        def whole() -> dict[str, Any]:  # the original's outputs are the captured ones
            return end_to_end(
                self.original, result.model, result.feeds, cosine_floor=floor,
                reference=self.reference, others=[self.other] if self.other else [],
                flush_denormals=denormals_flushed(self.opts.denormals),
            )  # fmt: skip

        e2e = whole()
        if (absorbed or flattened or guarded) and not e2e_passed(e2e):
            notes.append(
                f"layout clean-up ({absorbed} attentions, {flattened} flattened Gemms, {guarded} "
                f"guarded norms) rolled back: it differs"
            )
            result.model = before_layout
            e2e = whole()
        else:
            if absorbed:
                notes.append(
                    f"{absorbed} attentions take the heads and the KV cache themselves (3-D)"
                )
            if flattened:
                notes.append(
                    f"{flattened} flattened Gemms are batched MatMuls again (shape programs gone)"
                )
            if guarded:
                notes.append(_guard_note(guarded))
        if _keep_fp32(result, self.opts.keep_fp32, notes):
            e2e = whole()
        return e2e

    def roll_back_all(self) -> str:
        self.result.model = clone_model(self.original)
        self.result.lowered = []
        self.result.shape_folding = None
        return "every fusion (and the shape folding)"


def _guard_note(n: int) -> str:
    return (
        f"{n} Add -> LayerNormalization pairs read through a 2-D Reshape: onnxruntime's session "
        f"would fuse them into SkipLayerNormalization, which the profile prices slower"
    )


def _guard(model: Model, profile: Any, notes: list[str] | None) -> int:
    """:func:`~graph_autofusion.codegen.ort_guards.guard_skip_layernorms` on ``model`` (its
    count; noted in ``notes`` when given)."""
    n = guard_skip_layernorms(model, profile) if profile is not None else 0
    if n and notes is not None:
        notes.append(_guard_note(n))
    return n


def _keep_fp32(result: FuseResult, ops: tuple[str, ...], notes: list[str]) -> int:
    """F17: the unfused operators of ``ops`` in a half-precision model compute in float32
    (:func:`graph_autofusion.codegen.precision.keep_fp32_islands`; the fused groups' own nodes
    were verified as they are and are left alone)."""
    if not ops:
        return 0
    fused = {n.name for low in result.lowered for n in low.new_nodes}
    count = keep_fp32_islands(result.model, ops, exclude=fused)
    result.fp32_islands = count
    if count:
        notes.append(f"{count} unfused operators ({', '.join(ops)}) compute in float32")
    return count


def _capture_original(
    original: Model, feeds: Mapping[str, Any], capture: Callable, notes: list[str]
) -> tuple[Any, Mapping[str, Any]]:
    """Safe mode's activations of the original, and the sample inputs they are of; a model
    onnxruntime cannot run (an operator without a CPU kernel for its type, e.g. bfloat16) is a
    clear error, not its traceback. Generated inputs the model fails on in a convolution or a
    pooling are generated again, longer (:func:`~graph_autofusion.samples.inputs.
    retry_longer`), before that error; sample inputs that make an output NaN or infinite
    everywhere are generated again or warned of (:func:`~graph_autofusion.samples.inputs.
    finite_outputs`)."""
    try:
        acts = capture(original, feeds)
    except GraphAutoFusionError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
        failure = run_failure(
            original, feeds, exc, runtime="onnxruntime", generated=is_generated(feeds)
        )
        retried = None
        if failure is not None and is_generated(feeds):
            retried = retry_longer(original, exc, capture)
        if retried is None and failure is not None:  # it runs, but not on these inputs
            raise failure from exc
        if retried is None:
            raise UnsupportedOperatorError(
                f"{source_of(original)}: safe mode compares every fusion with the original in "
                f"onnxruntime, which cannot run it: {' '.join(str(exc).split())[:300]}; fuse "
                f"with safe_mode=False (--unsafe) or for the cpu target (torch runs it)"
            ) from exc
        acts, feeds = retried
    bad = nonfinite_outputs(original, acts)
    if not bad:
        return acts, feeds
    acts = None  # captured again below: never two sets of activations at once
    acts, used, note = finite_outputs(original, feeds, bad, capture)
    notes.append(note)
    if used is feeds and is_generated(feeds):  # not made finite: those checks compare nothing
        # (inputs the caller gave, a Dynamo graph's real ones included, are theirs: a note)
        warnings.warn(f"{source_of(original)}: {note}", AutofusionWarning, stacklevel=2)
    return acts, used


def _check_folding(
    original: Model,
    folded: Model,
    feeds: Mapping[str, Any],
    cosine_floor: float,
    reference: Mapping[str, Any] | None = None,
    other: OtherShape | None = None,
) -> str:
    """Safe mode's check of the shape folding: the folded model against the original on the
    sample inputs and on the second shape's (:mod:`.other_shape`), where the original runs on
    them. ``reference``, ``other``: the original's outputs on the sample inputs (its captured
    activations) and the second shape: not run again. Returns what failed, or ``""``."""
    sets = [("the sample inputs", dict(feeds))]
    if other is not None:
        sets.append((f"inputs of {other.what}", other.feeds))
    # lean sessions: the weights are read in place, not serialized twice
    try:
        b = ort_session(folded, lean=True)
    except Exception as exc:  # noqa: BLE001
        return f"onnxruntime refuses the folded model: {type(exc).__name__}: {exc}"
    original_session: list[Any] = []  # made when the original has to run

    def run_original(arrays: Mapping[str, Any], quiet: bool) -> dict[str, Any]:
        if reference is not None and arrays is sets[0][1]:
            return dict(reference)
        if other is not None and arrays is other.feeds:
            return dict(other.reference)
        if not original_session:
            original_session.append(ort_session(original, lean=True))
        return run_session(original_session[0], arrays, quiet=quiet)

    try:
        return _compare_folding(run_original, b, sets, cosine_floor)
    finally:
        del b
        original_session.clear()
        gc.collect()  # sessions holding the weights: give the memory back before safe mode


def _compare_folding(run_original: Any, b: Any, sets: list, cosine_floor: float) -> str:
    for what, arrays in sets:
        try:
            want = run_original(arrays, quiet=what != "the sample inputs")
        except Exception as exc:  # noqa: BLE001
            if what == "the sample inputs":
                return f"the original does not run on {what} ({type(exc).__name__}): not checked"
            continue  # the original may not take other dims: nothing to compare there
        try:
            got = run_session(b, arrays)
        except Exception as exc:  # noqa: BLE001
            return f"the folded model fails on {what}: {type(exc).__name__}: {exc}"
        cmp = compare_outputs(want, got, cosine_floor=cosine_floor)
        bad = [name for name, v in cmp.items() if not v["passed"]]
        if bad:
            return f"outputs {bad} differ on {what}"
    return ""
