"""Safe mode at a second shape: the fused model must give the original's answer on inputs of
another shape than the sample inputs, not only on them.

    other = prepare(original, feeds, capture)      # None: a static model, or none runs
    e2e = end_to_end(..., others=[other])          # "name @ batch 2, sequence 7" entries
    bad = culprits(original, model, lowered, other, record_of, floor)

Every fusion is checked on the sample inputs' activations, and those are of one shape (batch 1,
one sequence length). A fusion can be right there and wrong, or refused by onnxruntime, at
another: a rotary table of one row where the operator does not broadcast it (batch 2), a mask
a fused kernel needs of the query's length. So the end-to-end check of a model with dynamic
dims also runs the fused model on generated inputs of batch
:data:`~graph_autofusion.samples.inputs.OTHER_BATCH` and sequence
:data:`~graph_autofusion.samples.inputs.OTHER_SEQ_LEN`
(:func:`~graph_autofusion.samples.inputs.other_shape_inputs`) and compares its floating outputs
with the original's there, taken by the same capture session as the sample inputs' activations
(one more run, of the outputs only). A model the original does not run at that shape (a fixed
length the graph does not declare) is checked at its sample shape only.

When only that second comparison fails, :func:`culprits` finds the fusions at fault: the
original's activations at the second shape, and each fusion's own check on them (numerics, no
timing). Those are rolled back alone (:data:`~graph_autofusion.reasons.OTHER_SHAPE`); if none is
found, every fusion is, as for any end-to-end failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.ir.core import Model
from graph_autofusion.pipeline.result import RolledBack
from graph_autofusion.verify.inputs import other_shape_inputs
from graph_autofusion.verify.safety import (
    FusionRecord,
    OtherShape,
    SafetyResult,
    at_other_shape,
    capture_activations,
    check_fusion,
    outputs_of,
)


def prepare(
    original: Model, feeds: Mapping[str, Any], capture: Callable[..., dict]
) -> OtherShape | None:
    """The second shape's inputs and the original's outputs on them (``capture``: the
    :func:`~graph_autofusion.verify.subgraph.activation_runner` that captured the sample
    inputs' activations); ``None`` when there is no second shape or the original does not run
    at it."""
    got = other_shape_inputs(original, feeds)
    if got is None:
        return None
    what, arrays = got
    try:  # the outputs only: every intermediate at this shape would double the capture's memory
        acts = capture(arrays, outputs=[v.name for v in original.graph.outputs])
    except Exception:  # noqa: BLE001 - the original does not take that shape: nothing to compare
        return None
    reference = outputs_of(original, acts)
    return OtherShape(what, arrays, reference) if reference is not None else None


def only_there(e2e: Mapping[str, Any]) -> bool:
    """Whether the end-to-end comparison ``e2e`` (output name -> comparison, or the cpu
    target's ``{"outputs": ..., "passed": ...}``) failed, and only at the second shape."""
    outs = e2e.get("outputs", e2e)
    bad = [k for k, v in outs.items() if isinstance(v, Mapping) and not v.get("passed", True)]
    return bool(bad) and all(at_other_shape(k) for k in bad)


def roll_back(
    result: Any, notes: list[str], bad: Sequence[tuple[Any, SafetyResult]], other: OtherShape
) -> set[str]:
    """Record the fusions ``bad`` (with their verdicts at the second shape) as rolled back
    alone (:data:`~graph_autofusion.reasons.OTHER_SHAPE`), with one note; their keys."""
    for low, res in bad:
        result.rolled_back.append(
            RolledBack(
                low.key,
                low.rule,
                reasons.OTHER_SHAPE,
                f"on inputs of {other.what}: {res.message}",
                res,
            )  # fmt: skip
        )
    notes.append(f"{len(bad)} fusions rolled back: they differ on inputs of {other.what}")
    return {low.key for low, _ in bad}


def culprits(
    original: Model,
    model: Model,
    lowered: Sequence[Any],
    other: OtherShape,
    record_of: Callable[[Any], FusionRecord],
    cosine_floor: float,
) -> list[tuple[Any, SafetyResult]]:
    """The fusions of ``lowered`` (in ``model``, before its layout clean-ups) that fail their
    own check on the original's activations at the second shape, with their verdicts (none
    when those cannot be captured again: every fusion then goes)."""
    try:
        acts = capture_activations(original, other.feeds)
    except Exception:  # noqa: BLE001 - it ran there in prepare(); out of memory, say
        return []
    bad = []
    for low in lowered:
        res = check_fusion(
            original,
            model,
            record_of(low),
            acts,
            cosine_floor=cosine_floor,
            mc_samples=0,
            check_speed=False,
        )
        if not res.passed:
            bad.append((low, res))
    return bad
