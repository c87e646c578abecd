"""What an analysis produces: one record per candidate (:class:`CandidateAnalysis`: its
cost, verdict, plan decision and reason) and the report over all of them
(:class:`AnalysisReport`: totals, counts, text, JSON and HTML views)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.cost.model import (
    FusionCost,
    Verdict,
)
from graph_autofusion.patterns.clustering import Cluster
from graph_autofusion.patterns.rules import RuleMatch
from graph_autofusion.planner.plan import Plan
from graph_autofusion.renderers import render

#: Reason code of a chosen candidate.
CHOSEN = reasons.CHOSEN


#: Reason code of a cluster whose nodes are exactly a rule match's (the rule is preferred).
SAME_AS_RULE = reasons.SAME_AS_RULE


@dataclass
class CandidateAnalysis:
    """One candidate's costs and outcome.

    Attributes:
        key: Display name (``gelu_erf@/layer.0/Mul_1``, ``cluster#3@/layer.0/Add``).
        source: ``rule:<name>`` or ``cluster:<kind>``.
        fused_op: The fused operator it becomes (the rule's ``fuse_pattern``, or
            ``Cluster_<kind>``).
        cost: The cost model's before/after record and verdict.
        chosen: Whether the plan takes it.
        code, message: ``chosen`` and the cost sentence, or the planner's/cost model's reason
            code and sentence for a candidate left out.
        saving_s: ``time_before - time_after`` (0 when unknown).
        position: Graph position of its first node (report order).
        payload: The :class:`RuleMatch` or :class:`Cluster`.
    """

    key: str
    source: str
    fused_op: str
    cost: FusionCost
    chosen: bool
    code: str
    message: str
    saving_s: float
    position: int
    payload: RuleMatch | Cluster

    @property
    def ops(self) -> list[str]:
        return self.cost.ops

    @property
    def verdict(self) -> Verdict:
        return self.cost.verdict

    def to_dict(self) -> dict[str, Any]:
        c = self.cost
        return {
            "key": self.key,
            "source": self.source,
            "fused_op": self.fused_op,
            "ops": c.ops,
            "nodes": c.nodes,
            "hbm_accesses": [c.hbm_accesses_before, c.hbm_accesses_after],
            "bytes": [c.bytes_before, c.bytes_after],
            "time_us": [_us(c.time_before_s), _us(c.time_after_s)],
            "gflops": [c.gflops_before, c.gflops_after],
            "local_memory_bytes": c.local_memory_bytes,
            "local_memory_capacity": c.local_memory_capacity,
            "tile": list(c.tile.tile) if c.tile else None,
            "saving": c.saving,
            "saving_us": self.saving_s * 1e6,
            "benefit_threshold": c.benefit_threshold,
            "verdict": c.verdict.value,
            "chosen": self.chosen,
            "code": self.code,
            "message": self.message,
        }


@dataclass
class AnalysisReport:
    """Every candidate with its costs and plan outcome, and whole-model totals.

    Attributes:
        model_name: Display name of the model.
        profile: Hardware profile name; ``profile_kind`` its kind (npu/gpu/cpu).
        strategy: Strategy asked for; ``strategy_used`` what ran (``auto`` resolves).
        benefit_threshold: The global threshold (rules may override theirs).
        num_nodes: Nodes in the graph.
        binding_method: ``execute`` or ``symbols`` (how shapes were bound); ``symbols``: the
            symbolic dims bound.
        candidates: In graph order.
        plan: The planner's result.
        time_before_s / time_after_s: Whole-model estimated time unfused / with the plan.
        hbm_accesses_before / hbm_accesses_after: Whole-model HBM tensor accesses.
        bytes_before / bytes_after: Whole-model HBM bytes.
        unknown_nodes: Nodes whose cost is unknown (excluded from the totals).
        timings: Seconds per stage (``bind``, ``candidates``, ``cost``, ``plan``).
    """

    model_name: str
    profile: str
    profile_kind: str
    strategy: str
    strategy_used: str
    benefit_threshold: float
    num_nodes: int
    binding_method: str
    symbols: dict[str, int]
    candidates: list[CandidateAnalysis]
    plan: Plan
    time_before_s: float
    time_after_s: float
    hbm_accesses_before: int
    hbm_accesses_after: int
    bytes_before: int
    bytes_after: int
    unknown_nodes: int
    timings: dict[str, float] = field(default_factory=dict)
    binding: Any = field(default=None, repr=False)  # the ShapeBinding the costs used
    target: str | None = None
    #: What other targets would plan instead: name -> {"fusions", "performance_improvement"}.
    other_targets: dict[str, Any] = field(default_factory=dict)
    #: The analyzed model and the HardwareProfile used (the HTML report draws and lists them).
    model: Any = field(default=None, repr=False)
    hardware: Any = field(default=None, repr=False)

    # ------------------------------------------------------------------ derived numbers
    @property
    def chosen(self) -> list[CandidateAnalysis]:
        return [c for c in self.candidates if c.chosen]

    @property
    def performance_improvement(self) -> float:
        """Relative speedup ``time_before / time_after - 1`` (0.25 = 25% faster)."""
        if self.time_after_s <= 0:
            return 0.0
        return self.time_before_s / self.time_after_s - 1.0

    @property
    def time_saving_fraction(self) -> float:
        """``1 - time_after / time_before``: the fraction of the run time removed."""
        return 1.0 - self.time_after_s / self.time_before_s if self.time_before_s else 0.0

    @property
    def hbm_access_reduction(self) -> float:
        """``1 - accesses_after / accesses_before`` over the whole model."""
        if not self.hbm_accesses_before:
            return 0.0
        return 1.0 - self.hbm_accesses_after / self.hbm_accesses_before

    def verdict_counts(self) -> dict[str, int]:
        """Candidates per cost-model verdict (every verdict listed, 0 included)."""
        out = {v.value: 0 for v in Verdict}
        for c in self.candidates:
            out[c.verdict.value] += 1
        return out

    def code_counts(self) -> dict[str, int]:
        """Candidates per outcome code (``chosen`` or the reason code)."""
        out: dict[str, int] = {}
        for c in self.candidates:
            out[c.code] = out.get(c.code, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def chosen_matches(self) -> list[RuleMatch | Cluster]:
        """The chosen candidates' :class:`RuleMatch`/:class:`Cluster` objects, in graph order
        (non-overlapping; what the fuse step rewrites)."""
        return [c.payload for c in self.candidates if c.chosen]

    def totals(self) -> dict[str, Any]:
        return {
            "time_before_us": self.time_before_s * 1e6,
            "time_after_us": self.time_after_s * 1e6,
            "performance_improvement": self.performance_improvement,
            "time_saving_fraction": self.time_saving_fraction,
            "hbm_accesses": [self.hbm_accesses_before, self.hbm_accesses_after],
            "hbm_access_reduction": self.hbm_access_reduction,
            "bytes": [self.bytes_before, self.bytes_after],
            "candidates": len(self.candidates),
            "chosen": len(self.chosen),
            "by_verdict": self.verdict_counts(),
            "by_code": self.code_counts(),
            "unknown_nodes": self.unknown_nodes,
        }

    # ------------------------------------------------------------------ renderings
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "profile": self.profile,
            "profile_kind": self.profile_kind,
            "strategy": self.strategy,
            "strategy_used": self.strategy_used,
            "benefit_threshold": self.benefit_threshold,
            "nodes": self.num_nodes,
            "shapes": {"method": self.binding_method, "symbols": self.symbols},
            "plan_notes": list(self.plan.notes),
            "timings_s": dict(self.timings),
            "target": self.target,
            "other_targets": dict(self.other_targets),
            "totals": self.totals(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def to_text(self, *, reasons: bool = True) -> str:
        """The console table of :func:`graph_autofusion.report.analysis_report.render_text`."""
        return render("analysis-text", self, reasons=reasons)

    def to_html(self) -> str:
        """The self-contained HTML report of this plan: the graph with the planned groups,
        the candidate table, the hardware profile (:mod:`graph_autofusion.report.html_report`)."""
        return render("analysis-html", self)


def _us(s: float | None) -> float | None:
    return None if s is None else s * 1e6
