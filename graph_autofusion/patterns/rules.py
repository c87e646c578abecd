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

from graph_autofusion import defaults
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Graph, Node, is_convex, topological_order
from graph_autofusion.patterns.matcher import Match, Reason, Rejection, find_matches
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder

#: The built-in presets.
PRESETS = ("transformer", "llm", "cnn", "rnn")

#: Benefit threshold of rules whose native form keeps a contraction (MatMul, Gemm, Conv) as it
#: is and folds or removes the elementwise epilogue after it (BatchNorm folding, bias + GELU,
#: FusedConv/FusedGemm activations): relative to the whole group the saving looks small, since
#: the contraction dominates, yet it is a pure saving (one memory pass and one launch fewer).
EPILOGUE_THRESHOLD = 0.01

#: Aliases the articles use for ONNX operator names.
OP_ALIASES = {"LayerNorm": "LayerNormalization", "BatchNorm": "BatchNormalization"}


class FusionRuleConflict(GraphAutoFusionError):
    """Two rules of equal priority claim overlapping nodes."""


class UnknownPresetError(GraphAutoFusionError, ValueError):
    """A preset name no rule belongs to."""


class RuleSetError(GraphAutoFusionError, ValueError):
    """Rule sets that cannot be combined (a rule name used twice)."""


class RuleDefinitionError(GraphAutoFusionError, ValueError):
    """A rule defined in Python is incomplete or names a variable its pattern does not bind."""


class UnknownRuleError(GraphAutoFusionError, KeyError):
    """No rule of that name in the rule set (the message lists the names)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


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
        horizontal: Horizontal fusion: ``pattern`` describes one branch, and branches that
            bind this variable to the same value (siblings sharing an input, like Q/K/V
            projections) fuse into one operator with one output per branch.
        min_branches: Fewest siblings a horizontal match needs.
        rewrite: Native lowering ``(RewriteContext) -> list[Value]`` returning the values
            that replace the match's outputs, in order; without it the match becomes one call
            of a local function holding the matched nodes.
        fused_domain: Domain of the fused operator a native rewrite creates (report only).
        native_op: Operator type the native rewrite mainly emits (default: ``fuse_pattern``
            for a rule with a rewrite). The cost model prices the fused kernel with the
            hardware profile's calibrated rate for it when the profile has one.
        measure_first: ``(Match) -> str | None``: a reason the cost model cannot price this
            match's native form (a variant of the runtime's kernel that takes another, slower
            path); such a match is a close call that safe mode's speed check measures, and is
            not fused without it.
    """

    name: str
    pattern: Pattern | None = None
    fuse_pattern: str = ""
    priority: int = 0
    benefit_threshold: float | None = None
    presets: tuple[str, ...] = ()
    tolerance: float = defaults.FUSION_COSINE
    checks: tuple[Callable, ...] = ()
    exported: tuple[str, ...] = ()
    op1: str = ""
    op2: str = ""
    doc: str = ""
    horizontal: str = ""
    min_branches: int = 2
    rewrite: Callable | None = None
    fused_domain: str = ""
    native_op: str = ""
    measure_first: Callable | None = None

    def __post_init__(self) -> None:
        if self.pattern is None:
            if not (self.op1 and self.op2):
                raise RuleDefinitionError(f"rule {self.name!r}: give a pattern, or op1 and op2")
            b = PatternBuilder()
            op1 = OP_ALIASES.get(self.op1, self.op1)
            op2 = OP_ALIASES.get(self.op2, self.op2)
            inner = b.op(op1)(_label="op1", _exact=False)
            object.__setattr__(self, "pattern", b.op(op2)(inner, _label="op2", _exact=False))
            if not self.fuse_pattern:
                object.__setattr__(self, "fuse_pattern", f"{self.op1}{self.op2}")
        if not self.fuse_pattern:
            object.__setattr__(self, "fuse_pattern", self.name)
        if not self.native_op and self.rewrite is not None:
            object.__setattr__(self, "native_op", self.fuse_pattern)

    def __add__(self, other: FusionRule | RuleSet) -> RuleSet:
        return RuleSet((self,)) + other

    def match(
        self, graph: Graph, index: dict[str, list[Node]] | None = None
    ) -> tuple[list[Match], list[Rejection]]:
        """Every match of this rule in ``graph`` (possibly overlapping) and the rejections."""
        assert self.pattern is not None
        found, rejected = find_matches(
            graph, self.pattern, checks=self.checks, exported=self.exported, index=index
        )
        if not self.horizontal:
            return found, rejected
        return self._group_siblings(found, rejected)

    def _group_siblings(
        self, found: list[Match], rejected: list[Rejection]
    ) -> tuple[list[Match], list[Rejection]]:
        groups: dict[int, list[Match]] = {}
        for m in found:
            shared = m.values.get(self.horizontal)
            if shared is None:
                raise RuleDefinitionError(
                    f"rule {self.name!r}: horizontal variable %{self.horizontal} is not bound "
                    f"by its pattern"
                )
            groups.setdefault(id(shared), []).append(m)
        merged: list[Match] = []
        for group in groups.values():
            chosen: list[Match] = []
            used: set[Node] = set()
            for m in sorted(group, key=lambda m: -len(m.nodes)):  # a branch with its bias first
                if not used.intersection(m.nodes):
                    chosen.append(m)
                    used.update(m.nodes)
            shared = chosen[0].values[self.horizontal]
            if len(chosen) < self.min_branches:
                rejected.append(
                    Rejection(
                        Reason.HORIZONTAL,
                        f"%{shared.name} feeds {len(chosen)} branch(es) of the pattern, "
                        f"want at least {self.min_branches}",
                        len(used),
                        chosen[0].root.name,
                    )
                )
                continue
            if not is_convex(used):
                rejected.append(
                    Rejection(
                        Reason.NOT_CONVEX,
                        f"the siblings reading %{shared.name} depend on one another",
                        len(used),
                        chosen[0].root.name,
                    )
                )
                continue
            chosen.sort(key=lambda m: m.root.graph.position(m.root) if m.root.graph else 0)
            values = dict(chosen[0].values)
            labels: dict[str, Node] = {}
            for i, m in enumerate(chosen):
                values.update({f"b{i}.{k}": v for k, v in m.values.items()})
                labels.update({f"b{i}.{k}": v for k, v in m.labels.items()})
            outputs = [o for m in chosen for o in m.outputs]
            merged.append(
                Match(chosen[0].root, topological_order(list(used)), values, labels, outputs)
            )
        return merged, rejected


@dataclass(frozen=True)
class RuleSet:
    """An ordered, immutable collection of rules; ``a + b`` concatenates."""

    rules: tuple[FusionRule, ...] = field(default_factory=tuple)

    def __add__(self, other: FusionRule | RuleSet) -> RuleSet:
        more = (other,) if isinstance(other, FusionRule) else other.rules
        names = {r.name for r in self.rules}
        dup = [r.name for r in more if r.name in names]
        if dup:
            raise RuleSetError(
                f"rule names {dup} appear twice in the rule set; rename the rule in your file"
            )
        return RuleSet(self.rules + tuple(more))

    def __iter__(self) -> Iterator[FusionRule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def preset(self, name: str) -> RuleSet:
        """Rules of one preset (``all`` = every rule)."""
        if name == "all":
            return self
        known = sorted(set(PRESETS) | {p for r in self.rules for p in r.presets})
        if name not in known:
            raise UnknownPresetError(f"unknown preset {name!r}; known presets: {known + ['all']}")
        return RuleSet(tuple(r for r in self.rules if name in r.presets))

    def get(self, name: str) -> FusionRule:
        for r in self.rules:
            if r.name == name:
                return r
        raise UnknownRuleError(f"no rule named {name!r}; rules: {[r.name for r in self.rules]}")


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
