"""Safe mode for every target: one runner owns the rollback loop, the speed policy and the
end-to-end fallback; a target supplies only what differs.

    run_safe_mode(result, target, stages, options, notes, progress=progress)

The runner, in the order of :data:`~graph_autofusion.pipeline.stages.STAGES`:

1. **capture**: ``target.capture()``: what the checks read (the original's activations on
   the sample inputs).
2. **verify**: each fusion of ``result.lowered`` through ``target.check(low, speed)``. Every
   failure becomes a :class:`~graph_autofusion.pipeline.result.RolledBack` with its reason
   code and message, and ``target.rebuild(failed)`` rebuilds the fused model without every
   failure so far (never the original: a fresh copy). A rebuild that made the surviving
   fusions anew (a re-lowering: new nodes, maybe other matches) has them checked again, on
   the new model, up to :data:`MAX_ROUNDS` rounds; one that only left the failures out keeps
   their verdicts. ``result.safety`` holds every verdict.
3. **end_to_end**: ``target.end_to_end()``, the whole fused program against the original
   (``result.end_to_end``), on the sample inputs and at the target's second shape
   (``target.other``, :mod:`.other_shape`). When only the second shape fails,
   ``target.culprits()`` names the fusions wrong there; they are rolled back alone
   (:data:`~graph_autofusion.reasons.OTHER_SHAPE`), the model is rebuilt without them and
   compared again. If it fails, every fusion still applied is rolled back
   (:data:`~graph_autofusion.reasons.END_TO_END`), ``target.roll_back_all()`` gives back an
   unfused model, and one note says so.

One speed policy for every target: ``speed`` is a
:class:`~graph_autofusion.verify.speed.SpeedPolicy` with ``options.speed_margin``, or ``None``
when ``options.check_speed`` is off (nothing is timed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from graph_autofusion import reasons
from graph_autofusion.codegen.onnxruntime import Lowered
from graph_autofusion.pipeline import other_shape
from graph_autofusion.pipeline.result import FuseResult, RolledBack, e2e_passed
from graph_autofusion.pipeline.stages import Stages
from graph_autofusion.verify.safety import OtherShape, SafetyResult
from graph_autofusion.verify.speed import SpeedPolicy

#: Rounds of check -> roll back -> rebuild before safe mode stops (with a note).
MAX_ROUNDS = 4


class SafeModeTarget(Protocol):
    """What a target supplies to :func:`run_safe_mode`."""

    def capture(self) -> None:
        """Prepare the checks: the original's activations on the sample inputs."""

    def check(self, low: Lowered, speed: SpeedPolicy | None) -> SafetyResult:
        """One fusion's verdict on the current fused model (timed by ``speed`` when given)."""

    def rebuild(self, failed: set[str]) -> bool:
        """Set ``result.model`` and ``result.lowered`` to a fresh fuse without the fusions
        keyed ``failed``; True when the fusions kept are new objects to check again."""

    #: The second shape's inputs and the original's outputs there (``None``: no second shape).
    other: OtherShape | None

    def end_to_end(self) -> Mapping[str, Any]:
        """The whole fused program against the original, on the sample inputs and at
        ``other`` (a target may first apply, and roll back when they differ, its clean-ups
        of the fused model)."""

    def culprits(self) -> list[tuple[Lowered, SafetyResult]]:
        """The fusions of the current model whose own check fails at ``other``, with their
        verdicts (it may rebuild the model first: :meth:`rebuild` follows)."""

    def roll_back_all(self) -> str:
        """Give ``result`` an unfused model; returns what was rolled back, in words."""


def run_safe_mode(
    result: FuseResult,
    target: SafeModeTarget,
    stages: Stages,
    options: Any,
    notes: list[str],
    *,
    progress: Callable[[str, int, int], None] | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> None:
    """Safe mode on ``result`` (see the module docstring); ``options``: the
    :class:`~graph_autofusion.options.FuseOptions` (``check_speed``, ``speed_margin``)."""
    speed = SpeedPolicy(options.speed_margin) if options.check_speed else None
    with stages("capture", "safe mode: capture activations"):
        target.capture()
    with stages("verify"):
        result.safety = verify_each(result, target, speed, notes, progress, max_rounds)
    with stages("end_to_end", "safe mode: end-to-end check"):
        result.end_to_end = dict(_end_to_end(result, target, notes))
        if not e2e_passed(result.end_to_end):
            for low in result.lowered:
                result.rolled_back.append(
                    RolledBack(
                        low.key, low.rule, reasons.END_TO_END, "the whole fused model differs"
                    )
                )
            what = target.roll_back_all()
            notes.append(f"the end-to-end comparison failed: {what} rolled back")


def _end_to_end(result: FuseResult, target: SafeModeTarget, notes: list[str]) -> Mapping[str, Any]:
    """``target.end_to_end()``; when it fails only at the second shape, the fusions at fault
    there are rolled back alone and it runs again on the model rebuilt without them (none at
    fault: the failing comparison, and every fusion goes). The notes of the failing pass
    (its clean-ups) go with it."""
    mark = len(notes)
    e2e = target.end_to_end()
    if target.other is None or not other_shape.only_there(e2e):
        return e2e
    del notes[mark:]
    bad = target.culprits()
    if not bad:
        return e2e
    target.rebuild(other_shape.roll_back(result, notes, bad, target.other))
    return target.end_to_end()


def verify_each(
    result: FuseResult,
    target: SafeModeTarget,
    speed: SpeedPolicy | None,
    notes: list[str],
    progress: Callable[[str, int, int], None] | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> dict[str, SafetyResult]:
    """The rollback loop: check, roll back the failures, rebuild, check what is new; returns
    every verdict by fusion key."""
    checked: dict[str, SafetyResult] = {}
    failed: set[str] = set()
    for _round in range(max_rounds):
        todo = [low for low in result.lowered if low.key not in checked]
        for i, low in enumerate(todo):
            if progress is not None:
                progress("verify", i, len(todo))
            checked[low.key] = target.check(low, speed)
        bad = [low for low in result.lowered if not checked[low.key].passed]
        if not bad:
            break
        for low in bad:
            r = checked[low.key]
            failed.add(low.key)
            result.rolled_back.append(RolledBack(low.key, low.rule, r.code, r.message, r))
        if target.rebuild(failed):
            for low in result.lowered:
                checked.pop(low.key, None)  # new node objects: check them on the new model
    else:
        notes.append(f"safe mode stopped after {max_rounds} rounds")
    return dict(checked)
