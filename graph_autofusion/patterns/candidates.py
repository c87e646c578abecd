"""Rule candidates over a graph (F4b): every rule's matches, the overlap resolution, and for a
rule that never fired the closest partial match and why it failed.

    report = match_rules(model.graph, builtin_rules().preset("transformer"))
    report.kept              # non-overlapping RuleMatch list, highest priority first
    report.per_rule["gelu_erf"].closest    # Rejection that got furthest, when nothing matched
    apply_matches(model, report.kept)      # rewrite them (generic or native form)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from graph_autofusion.ir.core import Graph, Model, Node
from graph_autofusion.patterns.matcher import Match, Rejection, index_by_op
from graph_autofusion.patterns.rewrite import RewriteError, fuse_match
from graph_autofusion.patterns.rules import FusionRule, RuleMatch, RuleSet, resolve_overlaps


@dataclass
class RuleReport:
    """One rule's outcome on a graph."""

    rule: FusionRule
    matches: list[Match] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    kept: int = 0  # matches that survived overlap resolution

    @property
    def closest(self) -> Rejection | None:
        """The rejection that matched the most nodes before failing."""
        return max(self.rejections, key=lambda r: r.depth, default=None)


@dataclass
class CandidateReport:
    """Every rule's matches on one graph, and the non-overlapping selection."""

    per_rule: dict[str, RuleReport]
    kept: list[RuleMatch]
    dropped: list[tuple[RuleMatch, RuleMatch]]  # (loser, winner)

    def counts(self) -> dict[str, int]:
        """Kept matches per rule name (rules with none included, as 0)."""
        return {name: r.kept for name, r in self.per_rule.items()}


def match_rules(graph: Graph, rules: RuleSet | Iterable[FusionRule]) -> CandidateReport:
    """Match every rule, then resolve overlaps (priority, then size).

    Raises:
        FusionRuleConflict: two rules of equal priority claim the same nodes.
    """
    index = index_by_op(graph)
    per_rule: dict[str, RuleReport] = {}
    everything: list[RuleMatch] = []
    for rule in rules:
        matches, rejections = rule.match(graph, index)
        per_rule[rule.name] = RuleReport(rule, matches, rejections)
        everything.extend(RuleMatch(rule, m) for m in matches)
    kept, dropped = resolve_overlaps(everything)
    for rm in kept:
        per_rule[rm.rule.name].kept += 1
    return CandidateReport(per_rule, kept, dropped)


@dataclass
class Applied:
    """A rewritten match, or one that failed to rewrite (then ``error`` says why)."""

    rule: FusionRule
    match: Match
    nodes: list[Node] = field(default_factory=list)
    error: str = ""


def apply_matches(
    model: Model,
    matches: Iterable[RuleMatch],
    *,
    native: bool = True,
    fallback_generic: bool = False,
) -> list[Applied]:
    """Rewrite non-overlapping ``matches`` into fused operators, one at a time.

    A match whose rewrite fails is left unfused (the graph is untouched by it) and reported.
    ``native=False`` uses the generic local-function form even where a rule has a native
    rewrite; ``fallback_generic=True`` uses it where a native rewrite declines (the declined
    reason is kept in ``Applied.error`` prefixed with ``fallback:``).
    """
    done: list[Applied] = []
    for rm in matches:
        rule = rm.rule
        try:
            nodes = fuse_match(
                model,
                rm.match,
                rule.fuse_pattern,
                rewrite=rule.rewrite if native else None,
                rule_name=rule.name,
            )
        except RewriteError as exc:
            if fallback_generic and native and rule.rewrite is not None:
                try:
                    nodes = fuse_match(model, rm.match, rule.fuse_pattern, rule_name=rule.name)
                except RewriteError as again:
                    done.append(Applied(rule, rm.match, error=str(again)))
                    continue
                done.append(Applied(rule, rm.match, nodes, error=f"fallback: {exc}"))
                continue
            done.append(Applied(rule, rm.match, error=str(exc)))
            continue
        except Exception as exc:  # a native rewrite's bug must not leave a broken model
            done.append(Applied(rule, rm.match, error=f"{type(exc).__name__}: {exc}"))
            continue
        done.append(Applied(rule, rm.match, nodes))
    return done
