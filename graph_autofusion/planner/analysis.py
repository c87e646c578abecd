"""Benefit analysis (F14) on top of the cost model (F8) and the planner (F10).

    report = analyze_model(model, builtin_rules().preset("transformer"), load_profile("ascend910b"))
    print(report.to_text())                  # per candidate: ops, HBM, GFLOPS, local memory, verdict
    estimate_benefit(report)                 # performance_improvement, hbm_access_reduction ...
    report.chosen_matches()                  # RuleMatch / Cluster objects the fuse step rewrites

Stages (each timed in ``report.timings``):

1. **bind**: concrete shapes with :func:`~graph_autofusion.cost.shapes.bind_shapes`. With
   ``feeds`` the graph runs once on them (exact shapes). With ``input_shapes`` only symbols are
   bound. With neither, feeds are generated from the graph's input specs: a symbolic dim is
   ``1`` in position 0 (batch) and ``16`` elsewhere (sequence, ...) unless ``symbols`` names it;
   floats are standard normal, integers are token-like ids in ``[0, 100)`` (fewer when the
   input indexes a smaller constant table through ``Gather``: ``token_type_ids`` index 2 rows),
   booleans are ``True`` (an all-ones mask); seed 0. If the graph cannot run on them, shapes
   come from symbol substitution alone. The model is never mutated.
2. **candidates**: the rule matches kept after priority resolution (``match_rules(...).kept``)
   plus the automatic clusters (``cluster(...)``, unless ``clustering=False``). A rule match and
   a cluster may claim the same nodes: the planner decides between them.
3. **cost**: each candidate through :func:`~graph_autofusion.cost.model.fusion_cost` with the
   rule's own ``benefit_threshold`` when it sets one, else the global one. The candidate is legal
   when the verdict is ``fuse``; otherwise it keeps the verdict as its reason code
   (``skip-low-benefit``, ``skip-local-memory-overflow``, ``maybe``). A cluster with exactly a
   rule match's nodes is refused as ``same-as-rule`` (the rule names the fused operator and may
   lower it natively). Convexity and the size and input limits are enforced upstream: the matcher refuses non-convex matches (``not-convex``)
   and clustering never builds a cluster past ``max_cluster_nodes``/``max_cluster_inputs``.
4. **plan**: :func:`~graph_autofusion.planner.plan.plan` with the requested strategy picks a
   non-overlapping, jointly acyclic set maximising ``saving_s = time_before - time_after``.

Totals: the whole model's estimated time unfused is the sum of ``kernel_cost`` over every node;
fused, that minus the chosen candidates' savings. ``performance_improvement`` is the relative
speedup ``time_before / time_after - 1`` (0.25 = 25% faster, as in the articles);
``hbm_access_reduction`` is ``1 - accesses_after / accesses_before`` over the whole model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from graph_autofusion import defaults, reasons
from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.cost.model import (
    DEFAULT_BENEFIT_THRESHOLD,
    Verdict,
    fusion_cost,
    kernel_cost,
)
from graph_autofusion.cost.shapes import ShapeBinding
from graph_autofusion.errors import OptionsError
from graph_autofusion.ir.core import Graph, Model, Node
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.clustering import Cluster, cluster
from graph_autofusion.patterns.rules import RuleMatch, RuleSet
from graph_autofusion.planner.binding import (
    DEFAULT_BATCH,
    DEFAULT_DIM,
    INT_HIGH,
    bind_model,
    bind_shapes_for,
    default_feeds,
)
from graph_autofusion.planner.plan import STRATEGIES, Plan, PlanCandidate, plan
from graph_autofusion.planner.records import CHOSEN, SAME_AS_RULE, AnalysisReport, CandidateAnalysis

__all__ = [
    "AnalysisReport",
    "CHOSEN",
    "CandidateAnalysis",
    "DEFAULT_BATCH",
    "DEFAULT_DIM",
    "INT_HIGH",
    "SAME_AS_RULE",
    "analyze_model",
    "apply_saved_plan",
    "bind_model",
    "bind_shapes_for",
    "build_report",
    "cost_candidates",
    "default_feeds",
    "describe",
    "estimate_benefit",
    "find_candidates",
    "nodes_of",
]


__all__ = [
    "AnalysisReport",
    "CandidateAnalysis",
    "CHOSEN",
    "SAME_AS_RULE",
    "analyze_model",
    "apply_saved_plan",
    "bind_model",
    "build_report",
    "cost_candidates",
    "default_feeds",
    "describe",
    "find_candidates",
    "estimate_benefit",
]


def find_candidates(
    graph: Graph,
    rules: RuleSet,
    *,
    clustering: bool = True,
    max_cluster_nodes: int = defaults.MAX_CLUSTER_NODES,
    max_cluster_inputs: int = defaults.MAX_CLUSTER_INPUTS,
) -> list[RuleMatch | Cluster]:
    """Stage 2: kept rule matches plus automatic clusters, in graph order (rule first on a
    tie). Rule matches do not overlap each other, nor clusters each other; a rule match and a
    cluster may."""
    kept: list[RuleMatch | Cluster] = list(match_rules(graph, rules).kept)
    if clustering:
        kept.extend(
            cluster(graph, max_nodes=max_cluster_nodes, max_inputs=max_cluster_inputs).clusters
        )
    pos = {n: i for i, n in enumerate(graph.nodes)}
    kept.sort(key=lambda c: (_first_position(nodes_of(c), pos), isinstance(c, Cluster)))
    return kept


def nodes_of(c: RuleMatch | Cluster) -> list[Node]:
    return list(c.match.nodes) if isinstance(c, RuleMatch) else list(c.nodes)


def describe(c: RuleMatch | Cluster) -> tuple[str, str, int]:
    """``(source, fused operator, priority)`` of a candidate."""
    if isinstance(c, RuleMatch):
        return f"rule:{c.rule.name}", c.rule.fuse_pattern, c.rule.priority
    return f"cluster:{c.kind}", f"Cluster_{c.kind.replace('+', '_')}", 0


def cost_candidates(
    found: list[RuleMatch | Cluster],
    profile: Any,
    binding: ShapeBinding | None,
    *,
    benefit_threshold: float = DEFAULT_BENEFIT_THRESHOLD,
    accept_maybe: bool = False,
    native_target: bool = False,
    target: Any = None,
) -> list[PlanCandidate]:
    """Stage 3: a :class:`PlanCandidate` per candidate, ``payload = (candidate, FusionCost)``.

    Legal when the cost verdict is ``fuse`` (or ``maybe`` with ``accept_maybe``: the caller
    measures those, as safe mode's speed check does); otherwise the verdict is its code and the
    cost sentence its message. A rule's own ``benefit_threshold`` overrides the global one.
    """
    out: list[PlanCandidate] = []
    n_clusters = 0
    rule_sets = {
        frozenset(c.match.nodes): f"{c.rule.name}@{c.match.root.name}"
        for c in found
        if isinstance(c, RuleMatch)
    }
    for c in found:
        nodes = nodes_of(c)
        thr = benefit_threshold
        if isinstance(c, RuleMatch):
            key = f"{c.rule.name}@{c.match.root.name}"
            if c.rule.benefit_threshold is not None:
                thr = float(c.rule.benefit_threshold)
        else:
            key = f"cluster#{n_clusters}@{c.nodes[-1].name}"
            n_clusters += 1
        native_op = (
            c.rule.native_op if isinstance(c, RuleMatch) and c.rule.rewrite is not None else None
        )
        fc = fusion_cost(
            nodes, profile, binding=binding, benefit_threshold=thr, native_op=native_op
        )
        saving = 0.0
        if fc.time_before_s is not None and fc.time_after_s is not None:
            saving = fc.time_before_s - fc.time_after_s
        if native_target and native_op is not None:
            fc = _close_call(fc, saving)
            unpriced = c.rule.measure_first if isinstance(c, RuleMatch) else None
            if unpriced is not None:
                fc = _measured_first(fc, unpriced(c.match))
        legal = fc.verdict == Verdict.FUSE or (
            accept_maybe and fc.verdict == Verdict.MAYBE and saving > 0
        )
        if (
            native_target
            and fc.verdict == Verdict.SKIP_LOCAL_MEMORY_OVERFLOW
            and saving > 0
            and isinstance(c, RuleMatch)
            and c.rule.rewrite is not None
        ):
            # the runtime's own kernel computes the fused operator: no tile of ours has to
            # fit the local memory
            legal = True
        code, message = ("", "") if legal else (fc.verdict.value, fc.reason)
        refused = target.refusal(c, binding) if target is not None else None
        if refused is not None:
            legal = False
            code, message = refused[0], f"{target.name} target cannot execute it: {refused[1]}"
        twin = rule_sets.get(frozenset(nodes)) if isinstance(c, Cluster) else None
        if twin is not None:
            legal = False
            code = SAME_AS_RULE
            message = (
                f"the same nodes as rule match {twin}; the rule's fused operator is preferred "
                f"({fc.verdict.value}: {fc.reason})"
            )
        out.append(
            PlanCandidate(
                key,
                tuple(nodes),
                saving,
                legal=legal,
                code=code,
                message=message,
                priority=describe(c)[2],
                payload=(c, fc),
            )
        )
    return out


def _first_position(nodes: list[Node], pos: dict[Node, int]) -> int:
    return min((pos.get(n, 1 << 60) for n in nodes), default=1 << 60)


def build_report(
    model: Model,
    profile: Any,
    binding: ShapeBinding,
    candidates: list[PlanCandidate],
    result: Plan,
    *,
    strategy: str,
    benefit_threshold: float,
    model_name: str | None = None,
    timings: dict[str, float] | None = None,
) -> AnalysisReport:
    """Stage 5: per-candidate outcomes and whole-model totals of a plan."""
    graph = model.graph
    pos = {n: i for i, n in enumerate(graph.nodes)}
    chosen_ids = {id(c) for c in result.chosen}
    why = {id(r.candidate): r for r in result.rejected}
    analyses: list[CandidateAnalysis] = []
    for pc in candidates:
        cand, fc = pc.payload
        source, fused, _prio = describe(cand)
        if id(pc) in chosen_ids:
            code, message = CHOSEN, fc.reason
        else:
            r = why.get(id(pc))
            code, message = (r.code, r.message) if r else (reasons.ILLEGAL, fc.reason)
        analyses.append(
            CandidateAnalysis(
                pc.key,
                source,
                fused,
                fc,
                id(pc) in chosen_ids,
                code,
                message,
                pc.saving_s,
                _first_position(list(pc.nodes), pos),
                cand,
            )
        )
    before = [kernel_cost(binding.node(n), profile) for n in graph.nodes]
    known = [k for k in before if k.time_s is not None]
    time_before = float(sum(k.time_s for k in known))
    acc_before = sum(k.hbm_accesses for k in before)
    bytes_before = sum(k.bytes or 0 for k in before)
    time_after, acc_after, bytes_after = _after_plan(
        [a for a in analyses if a.chosen], time_before, acc_before, bytes_before
    )
    return AnalysisReport(
        model_name=model_name or graph.name,
        profile=profile.name,
        profile_kind=profile.kind,
        strategy=strategy,
        strategy_used=result.strategy,
        benefit_threshold=benefit_threshold,
        num_nodes=len(graph),
        binding_method=binding.method,
        symbols=dict(binding.symbols),
        candidates=analyses,
        plan=result,
        time_before_s=time_before,
        time_after_s=time_after,
        hbm_accesses_before=acc_before,
        hbm_accesses_after=acc_after,
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        unknown_nodes=len(before) - len(known),
        timings=dict(timings or {}),
    )


def _close_call(fc: Any, saving: float) -> Any:
    """A runtime operator's fusion estimated to save time, but less than the threshold, is a
    close call (``maybe``) that safe mode's speed check measures, not a refusal: the cost model
    prices the runtime's own kernel (onnxruntime's Attention, its fused normalizations) from
    its pieces, and a small relative saving of a large operator (attention, dominated by its
    matrix products) can be the largest absolute saving in a transformer."""
    if fc.verdict != Verdict.SKIP_LOW_BENEFIT or saving <= 0 or not fc.time_before_s:
        return fc
    fc.verdict = Verdict.MAYBE
    fc.reason = (
        f"{fc.reason}; a runtime operator priced from its pieces: a close call safe mode measures"
    )
    return fc


def _measured_first(fc: Any, why: str | None) -> Any:
    """A fusion the cost model would take whose native form it cannot price (the rule's
    ``measure_first`` says why) is a close call (``maybe``): fused only when safe mode times it
    on the real shapes (and checks its numbers), also where its tile would overflow the local
    memory, which a runtime kernel is otherwise let through for."""
    if why and fc.verdict in (Verdict.FUSE, Verdict.SKIP_LOCAL_MEMORY_OVERFLOW):
        fc.verdict = Verdict.MAYBE
        fc.reason = f"{fc.reason}; {why}: a close call safe mode measures"
    return fc


def analyze_model(
    model: Model,
    rules: RuleSet,
    profile: Any,
    *,
    feeds: Mapping[str, Any] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    symbols: Mapping[str, int] | None = None,
    benefit_threshold: float = DEFAULT_BENEFIT_THRESHOLD,
    strategy: str = "auto",
    max_cluster_nodes: int = defaults.MAX_CLUSTER_NODES,
    max_cluster_inputs: int = defaults.MAX_CLUSTER_INPUTS,
    clustering: bool = True,
    model_name: str | None = None,
    seed: int = 0,
    max_work: int | None = None,
    accept_maybe: bool = False,
    native_target: bool = False,
    target: Any = None,
    activations: Mapping[str, Any] | None = None,
) -> AnalysisReport:
    """Cost every fusion candidate of ``model`` on ``profile`` and plan the fusions.

    Args:
        model: IR model (not modified).
        rules: Rules to match (e.g. ``builtin_rules().preset("transformer")``).
        profile: A :class:`~graph_autofusion.cost.hardware.HardwareProfile`, or a profile name
            or YAML path for :func:`~graph_autofusion.cost.hardware.load_profile`.
        feeds: Example inputs (the graph runs once on them for exact shapes).
        input_shapes: Input shapes without data (symbol binding only); ignored with ``feeds``.
        symbols: Symbolic dim values (``{"batch": 1, "seq": 128}``), also used for generated
            feeds.
        benefit_threshold: Minimum relative saving for ``fuse`` (a rule's own
            ``benefit_threshold`` overrides it for its matches).
        strategy: ``auto``, ``greedy``, ``dp`` or ``evolutionary``.
        max_cluster_nodes, max_cluster_inputs: Limits of automatic clustering.
        clustering: Add automatic clusters to the rule matches.
        model_name: Display name (defaults to the graph's name).
        seed, max_work: Evolutionary search seed and work budget (candidate decodes per
            conflict component; default ``planner.plan.EVOLUTION_WORK``; never seconds).
        accept_maybe: Plan ``maybe`` candidates too (the caller measures them).
        native_target: Fusions become the runtime's own operators (onnxruntime): a rule
            match with a native rewrite is not refused for local-memory overflow.
        target: A target (:mod:`graph_autofusion.codegen.targets`): candidates it cannot
            execute are refused with its reason code, so the plan is what ``fuse()`` runs.
        activations: A run's values on ``feeds`` by name (safe mode's captured
            activations): the shapes are read from them instead of running the graph again.

    Raises:
        OptionsError: (a ValueError) unknown strategy.
        HardwareError: unknown profile name (the message lists the known ones).
        FusionRuleConflict: two rules of equal priority claim the same nodes.
    """
    if strategy not in STRATEGIES:  # fail before the expensive stages
        raise OptionsError(f"unknown planner strategy {strategy!r}; known: {list(STRATEGIES)}")
    if isinstance(profile, str | os.PathLike):
        profile = load_profile(profile)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    binding = bind_shapes_for(model, feeds, input_shapes, symbols, activations)
    timings["bind"] = time.perf_counter() - t
    t = time.perf_counter()
    found = find_candidates(
        model.graph,
        rules,
        clustering=clustering,
        max_cluster_nodes=max_cluster_nodes,
        max_cluster_inputs=max_cluster_inputs,
    )
    timings["candidates"] = time.perf_counter() - t
    t = time.perf_counter()
    pcs = cost_candidates(
        found,
        profile,
        binding,
        benefit_threshold=benefit_threshold,
        accept_maybe=accept_maybe,
        native_target=native_target,
        target=target,
    )
    timings["cost"] = time.perf_counter() - t
    t = time.perf_counter()
    work = {} if max_work is None else {"max_work": max_work}
    result = plan(pcs, strategy, seed=seed, **work)
    timings["plan"] = time.perf_counter() - t
    t = time.perf_counter()
    report = build_report(
        model,
        profile,
        binding,
        pcs,
        result,
        strategy=strategy,
        benefit_threshold=benefit_threshold,
        model_name=model_name,
        timings=timings,
    )
    report.timings["report"] = time.perf_counter() - t
    report.binding = binding
    report.target = getattr(target, "name", None)
    report.model, report.hardware = model, profile
    return report


def estimate_benefit(report: AnalysisReport) -> dict[str, Any]:
    """The benefit estimate of a plan (F14): relative speedup, HBM access reduction, times.

    Returns:
        ``performance_improvement`` (``time_before / time_after - 1``),
        ``hbm_access_reduction`` (``1 - accesses_after / accesses_before``),
        ``time_before_s``, ``time_after_s``, ``time_saving_fraction``, ``hbm_accesses_before``,
        ``hbm_accesses_after``, ``bytes_before``, ``bytes_after``, ``fusions`` (chosen count),
        ``candidates``, ``profile``, ``strategy``.
    """
    return {
        "performance_improvement": report.performance_improvement,
        "hbm_access_reduction": report.hbm_access_reduction,
        "time_before_s": report.time_before_s,
        "time_after_s": report.time_after_s,
        "time_saving_fraction": report.time_saving_fraction,
        "hbm_accesses_before": report.hbm_accesses_before,
        "hbm_accesses_after": report.hbm_accesses_after,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "fusions": len(report.chosen),
        "candidates": len(report.candidates),
        "profile": report.profile,
        "strategy": report.strategy_used,
    }


def apply_saved_plan(
    report: AnalysisReport,
    keys: Iterable[str],
    notes: list[str],
    allowed: Callable[[CandidateAnalysis], bool] | None = None,
) -> None:
    """Replace the planner's choice in ``report`` with a saved plan's candidate ``keys``
    (``load_fused``): a saved candidate is chosen (code ``chosen``, "the saved plan fuses
    it") where ``allowed`` accepts it, every other one is not (``not-in-saved-plan``), and the
    whole-model estimates are those of the saved set. Saved keys that match no candidate (the
    graph changed since the plan was saved) are named in one note, appended to ``notes``."""
    keep = list(dict.fromkeys(keys))
    wanted = set(keep)
    for a in report.candidates:
        take = a.key in wanted and (allowed is None or allowed(a))
        if take and not a.chosen:
            a.chosen, a.code, a.message = True, CHOSEN, "the saved plan fuses it"
        elif not take and a.chosen:
            a.chosen, a.code = False, reasons.NOT_IN_SAVED_PLAN
            a.message = "the saved plan does not fuse it"
    report.time_after_s, report.hbm_accesses_after, report.bytes_after = _after_plan(
        [a for a in report.candidates if a.chosen],
        report.time_before_s,
        report.hbm_accesses_before,
        report.bytes_before,
    )
    known = {a.key for a in report.candidates}
    unmatched = [k for k in keep if k not in known]
    if unmatched:
        more = f" and {len(unmatched) - 8} more" if len(unmatched) > 8 else ""
        notes.append(
            f"saved plan: {len(unmatched)} fusion(s) match nothing in this graph (ignored): "
            + ", ".join(unmatched[:8])
            + more
        )


def _after_plan(
    chosen: Sequence[CandidateAnalysis], time_before: float, acc_before: int, bytes_before: int
) -> tuple[float, int, int]:
    """Whole-model estimated time, HBM accesses and bytes with the ``chosen`` candidates fused
    (each one's saving taken off the unfused totals)."""
    time_after = time_before - sum(a.saving_s for a in chosen)
    acc_after = acc_before - sum(
        a.cost.hbm_accesses_before - a.cost.hbm_accesses_after for a in chosen
    )
    bytes_after = bytes_before - sum(
        (a.cost.bytes_before or 0) - (a.cost.bytes_after or 0) for a in chosen
    )
    return time_after, acc_after, bytes_after
