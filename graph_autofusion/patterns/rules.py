"""Fusion rules (F6): immutable records with an explicit priority; rule sets compose with ``+``.

A rule names a pattern, the fused operator it becomes, a priority, a benefit threshold, the
presets it belongs to and the precision tolerance its verification uses. The articles' simple
form ``FusionRule(op1="LayerNorm", op2="Add", fuse_pattern="LayerNormAdd")`` builds a two-node
producer -> consumer pattern. Overlapping matches are resolved by priority; two rules of equal
priority that claim the same nodes raise :class:`FusionRuleConflict`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Graph
from graph_autofusion.patterns.matcher import Match, Rejection, find_matches
from graph_autofusion.patterns.pattern import OpPattern, PatternBuilder

#: Aliases the articles use for ONNX operator names.
OP_ALIASES = {"LayerNorm": "LayerNormalization", "BatchNorm": "BatchNormalization"}


class FusionRuleConflict(GraphAutoFusionError):
    """Two rules of equal priority claim overlapping nodes."""


@dataclass(frozen=True)
class FusionRule:
    """One fusion rule.

    Attributes:
        name: Unique rule name (``attention_scale_by_div``).
        pattern: Root operator pattern; built from ``op1``/``op2`` when not given.
        fuse_pattern: Name of the fused operator the match becomes.
        priority: Higher wins when matches overlap.
        benefit_threshold: Minimum estimated relative saving to fuse (``None``: global default).
        presets: Presets that include this rule (``transformer``, ``llm``, ``cnn``, ``rnn``).
        tolerance: Cosine-similarity floor safe mode applies to this fusion.
        checks: Callables ``(MatchContext) -> str | None`` rejecting a match with a reason.
        exported: Labels of internal nodes the fused operator also outputs.
        op1, op2: The articles' simple form: producer and consumer operator names.
        doc: The math the rule fuses.
    """

    name: str
    pattern: OpPattern | None = None
    fuse_pattern: str = ""
    priority: int = 0
    benefit_threshold: float | None = None
    presets: tuple[str, ...] = ()
    tolerance: float = 0.999
    checks: tuple[Callable, ...] = ()
    exported: tuple[str, ...] = ()
    op1: str = ""
    op2: str = ""
    doc: str = ""

    def __post_init__(self) -> None:
        if self.pattern is None:
            if not (self.op1 and self.op2):
                raise ValueError(f"rule {self.name!r}: give a pattern, or op1 and op2")
            b = PatternBuilder()
            op1 = OP_ALIASES.get(self.op1, self.op1)
            op2 = OP_ALIASES.get(self.op2, self.op2)
            inner = b.op(op1)(_label="op1", _exact=False)
            object.__setattr__(self, "pattern", b.op(op2)(inner, _label="op2", _exact=False))
            if not self.fuse_pattern:
                object.__setattr__(self, "fuse_pattern", f"{self.op1}{self.op2}")
        if not self.fuse_pattern:
            object.__setattr__(self, "fuse_pattern", self.name)

    def __add__(self, other: FusionRule | RuleSet) -> RuleSet:
        return RuleSet((self,)) + other

    def match(self, graph: Graph) -> tuple[list[Match], list[Rejection]]:
        assert self.pattern is not None
        return find_matches(graph, self.pattern, checks=self.checks, exported=self.exported)


@dataclass(frozen=True)
class RuleSet:
    """An ordered, immutable collection of rules; ``a + b`` concatenates."""

    rules: tuple[FusionRule, ...] = field(default_factory=tuple)

    def __add__(self, other: FusionRule | RuleSet) -> RuleSet:
        more = (other,) if isinstance(other, FusionRule) else other.rules
        names = {r.name for r in self.rules}
        dup = [r.name for r in more if r.name in names]
        if dup:
            raise ValueError(f"rule names {dup} appear twice in the rule set")
        return RuleSet(self.rules + tuple(more))

    def __iter__(self) -> Iterator[FusionRule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def preset(self, name: str) -> RuleSet:
        return RuleSet(tuple(r for r in self.rules if name in r.presets))


@dataclass
class RuleMatch:
    """A match of a specific rule."""

    rule: FusionRule
    match: Match


def resolve_overlaps(candidates: Iterable[RuleMatch]) -> tuple[list[RuleMatch], list[tuple]]:
    """Choose non-overlapping matches: higher priority first, then larger matches.

    Returns the kept matches and ``(dropped, winner)`` pairs.

    Raises:
        FusionRuleConflict: two *different* rules of equal priority claim overlapping nodes.
    """
    ordered = sorted(candidates, key=lambda c: (-c.rule.priority, -len(c.match.nodes)))
    claimed: dict = {}
    kept: list[RuleMatch] = []
    dropped: list[tuple] = []
    for cand in ordered:
        clash = next((claimed[n] for n in cand.match.nodes if n in claimed), None)
        if clash is None:
            kept.append(cand)
            for n in cand.match.nodes:
                claimed[n] = cand
            continue
        if clash.rule.priority == cand.rule.priority and clash.rule.name != cand.rule.name:
            shared = [n.name for n in cand.match.nodes if n in set(clash.match.nodes)]
            raise FusionRuleConflict(
                f"rules {clash.rule.name!r} and {cand.rule.name!r} have equal priority "
                f"{cand.rule.priority} and both claim nodes {shared} "
                f"({clash.rule.fuse_pattern} vs {cand.rule.fuse_pattern}); give one a higher "
                f"priority"
            )
        dropped.append((cand, clash))
    return kept, dropped
