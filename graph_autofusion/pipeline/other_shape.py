"""Safe mode at a second shape: the fused model must give the original's answer on inputs of
another shape than the sample inputs, not only on them.

    other = prepare(original, feeds, capture)      # None: a static model, or none runs
    e2e = end_to_end(..., others=[other])          # "name @ batch 2, sequence 7, ..." entries
    bad = culprits(original, model, lowered, other, record_of, floor)

Every fusion is checked on the sample inputs' activations, and those are of one shape (batch 1,
one sequence length, a mask of ones). A fusion can be right there and wrong, or refused by
onnxruntime, at another: a rotary table of one row where the operator does not broadcast it
(batch 2), a mask whose rows the fused kernel reads differently (padding). So the end-to-end
check of a model with dynamic dims also runs the fused model on generated inputs of batch
:data:`~graph_autofusion.samples.inputs.OTHER_BATCH`, sequence
:data:`~graph_autofusion.samples.inputs.OTHER_SEQ_LEN` and a padded second row of every integer
mask (:func:`~graph_autofusion.samples.inputs.other_shape_inputs`), against the original's
outputs there, taken by the same capture session as the sample inputs' activations (one more
run, no other session). A model the original does not run at that shape (a fixed length the
graph does not declare) is checked at its sample shape only.

When only that second comparison fails, :func:`culprits` finds the fusions at fault: the
original's activations at the second shape, and each fusion's own check on them (numerics, no
timing). Those are rolled back alone (:data:`~graph_autofusion.reasons.OTHER_SHAPE`); if none is
found, every fusion is, as for any end-to-end failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graph_autofusion.ir.core import Model
from graph_autofusion.verify.inputs import other_shape_inputs
from graph_autofusion.verify.safety import (
    FusionRecord,
    OtherShape,
    SafetyResult,
    at_other_shape,
    capture_activations,
    check_fusion,
)


def prepare(
    original: Model, feeds: Mapping[str, Any], capture: Callable[[Mapping[str, Any]], dict]
) -> OtherShape | None:
    """The second shape's inputs and the original's outputs on them (``capture``: the
    session that captured the sample inputs' activations); ``None`` when the model has no
    dynamic dim or the original does not run at that shape."""
    got = other_shape_inputs(original, feeds)
    if got is None:
        return None
    what, arrays = got
    try:
        acts = capture(arrays)
    except Exception:  # noqa: BLE001 - the original does not take that shape: nothing to compare
        return None
    names = [v.name for v in original.graph.outputs]
    if not all(n in acts for n in names):
        return None
    return OtherShape(what, arrays, {n: acts[n] for n in names})


def only_there(e2e: Mapping[str, Any]) -> bool:
    """Whether the end-to-end comparison ``e2e`` failed, and only at the second shape."""
    bad = [k for k, v in e2e.items() if isinstance(v, Mapping) and not v.get("passed", True)]
    return bool(bad) and all(at_other_shape(k) for k in bad)


def culprits(
    original: Model,
    model: Model,
    lowered: Sequence[Any],
    other: OtherShape,
    record_of: Callable[[Any], FusionRecord],
    cosine_floor: float,
) -> list[tuple[Any, SafetyResult]]:
    """The fusions of ``lowered`` (in ``model``, before its layout clean-ups) that fail their
    own check on the original's activations at the second shape, with their verdicts."""
    acts = capture_activations(original, other.feeds)
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
