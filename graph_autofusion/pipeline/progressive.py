"""Progressive fusion (F17): rule stages with validation between, stopping at the first stage
that fails.

    prog = gaf.fuse_progressive([["gelu_erf", "layernorm_decomposed"], ["attention"]])
    prog.result            # the FuseResult of the last stage that passed (none did: unfused)
    print(prog.to_text())

Stage ``k`` fuses with the rules of stages ``1..k`` together (a later stage adds rules; it
never re-plans the model an earlier stage fused), in safe mode, and is then validated:

* every fusion of the stage's own rules passed its safe-mode checks: a numerical failure
  (``precision`` ... ) fails the stage; a fusion that was only slower (``slower``) is dropped
  by safe mode as usual and does not fail it;
* no fusion of an earlier stage's rules failed a numerical check in this run;
* the whole fused model matches the original end to end.

The first stage that fails is rolled back as a whole (its fusions, even the ones that passed,
are not applied) and no later stage runs: the result is the previous stage's fused model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.pipeline.result import e2e_passed
from graph_autofusion.planner.controls import ControlError

__all__ = ["ProgressiveResult", "StageOutcome", "fuse_progressive", "resolve_stages"]

#: Rollback codes that are not numerical failures: they drop a fusion, not a stage.
NOT_A_FAILURE = reasons.NOT_A_FAILURE


@dataclass
class StageOutcome:
    index: int  # 1-based
    rules: list[str]
    passed: bool
    fused: list[str] = field(default_factory=list)  # candidate keys of this stage's rules
    failures: list[dict[str, str]] = field(default_factory=list)  # key, rule, code, message
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.index,
            "rules": self.rules,
            "passed": self.passed,
            "fused": self.fused,
            "failures": self.failures,
            "message": self.message,
        }


@dataclass
class ProgressiveResult:
    stages: list[StageOutcome]
    result: Any  # the FuseResult kept (the last passing stage's; stage 1 failed: unfused)
    stopped_at: int | None  # the failing stage (1-based), None when every stage passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": [s.to_dict() for s in self.stages],
            "stopped_at": self.stopped_at,
            "kept_fusions": len(self.result.lowered) if self.result is not None else 0,
        }

    def to_text(self) -> str:
        lines = ["progressive fusion:"]
        for s in self.stages:
            state = "passed" if s.passed else "FAILED, rolled back"
            lines.append(
                f"  stage {s.index} [{', '.join(s.rules)}]: {state}; "
                f"{len(s.fused)} fusions of its rules"
            )
            for f in s.failures:
                lines.append(f"    {f['key']}: {f['code']}: {f['message']}")
            if s.message:
                lines.append(f"    {s.message}")
        kept = len(self.result.lowered) if self.result is not None else 0
        if self.stopped_at is not None:
            lines.append(
                f"  stopped at stage {self.stopped_at}; kept the {kept} fusions of the stages "
                f"before it"
            )
        else:
            lines.append(f"  every stage passed; {kept} fusions")
        return "\n".join(lines)


def resolve_stages(rules: Any, stages: Sequence[str | Sequence[str]]) -> list[list[str]]:
    """Each stage as a list of rule names (a stage may be a comma-separated string).

    Raises:
        ControlError: no stages, an empty stage, or a name no rule in ``rules`` has (the
            message lists the known names).
    """
    known = [r.name for r in rules]
    out: list[list[str]] = []
    seen: set[str] = set()
    if not stages:
        raise ControlError("progressive fusion needs at least one stage of rule names")
    for i, stage in enumerate(stages, 1):
        names = [s.strip() for s in stage.split(",")] if isinstance(stage, str) else list(stage)
        names = [n for n in names if n]
        if not names:
            raise ControlError(f"progressive fusion: stage {i} names no rules")
        for n in names:
            if n not in known:
                raise ControlError(
                    f"progressive fusion: stage {i} names rule {n!r}, which is not in the rule "
                    f"set; known: {sorted(known)}"
                )
        out.append([n for n in names if n not in seen])
        seen.update(names)
    return out


def _rule_of(key: str) -> str:
    return key.split("@", 1)[0]


def fuse_progressive(
    rules: Any,
    stages: Sequence[str | Sequence[str]],
    run_stage: Callable[[Any], Any],
) -> ProgressiveResult:
    """Run the stages (see the module docstring). ``run_stage(ruleset)`` fuses the original
    model with ``ruleset`` in safe mode and returns its ``FuseResult``."""
    plan = resolve_stages(rules, stages)
    outcomes: list[StageOutcome] = []
    kept: Any = None
    active: set[str] = set()
    for i, names in enumerate(plan, 1):
        active |= set(names)
        result = run_stage(RuleSet(tuple(r for r in rules if r.name in active)))
        mine = set(names)
        fused = [low.key for low in result.lowered if low.rule in mine]
        failures = [
            {"key": b.key, "rule": b.rule, "code": b.code, "message": b.message}
            for b in result.rolled_back
            if b.code not in NOT_A_FAILURE
        ]
        e2e_ok = result.end_to_end is None or e2e_passed(result.end_to_end)
        outcome = StageOutcome(i, names, passed=not failures and e2e_ok, fused=fused)
        outcome.failures = failures
        if not result.safe_mode:
            outcome.message = "safe mode is off: nothing validated this stage"
        if not e2e_ok and not failures:
            outcome.message = "the whole fused model differs from the original"
        outcomes.append(outcome)
        if not outcome.passed:
            return ProgressiveResult(outcomes, kept, i)
        kept = result
    return ProgressiveResult(outcomes, kept, None)
