"""The debug float check (F17): how far each fused group's outputs drift from float32.

    report = float_check(result)          # a FuseResult of either target
    print(report.to_text())

The reference is the original model computing in float32 (float16 constants and types
widened: :func:`graph_autofusion.verify.fp16.to_fp32`; for a float32 model, the original
itself). For every fused group, its output values are compared with the reference's values
of the same name (fusion keeps output names) three ways:

* ``fused``: the fused model as it runs (its own precision);
* ``unfused``: the original as it runs: the drift the model's precision has anyway, so
  ``fused - unfused`` is what the fusion adds;
* ``fused_fp32``: the fused model itself run in float32 (onnxruntime target): the fusion's
  own arithmetic, precision aside. ``None`` on the cpu target, whose kernels are compiled
  for the model's types.

Intermediates are captured in onnxruntime with every optimization off (the cpu target's
program keeps every value it computes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.ir.dtypes import DType
from graph_autofusion.verify.compare import compare_tensors

__all__ = ["FloatCheckReport", "GroupDrift", "float_check"]


@dataclass
class GroupDrift:
    key: str
    rule: str
    outputs: list[str]
    fused: dict[str, float]
    unfused: dict[str, float]
    fused_fp32: dict[str, float] | None

    @property
    def added_max_abs(self) -> float:
        return self.fused["max_abs"] - self.unfused["max_abs"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "rule": self.rule,
            "outputs": self.outputs,
            "fused": self.fused,
            "unfused": self.unfused,
            "fused_fp32": self.fused_fp32,
            "added_max_abs": self.added_max_abs,
        }


@dataclass
class FloatCheckReport:
    precision: str  # the model's float type: float32, float16, bfloat16, mixed
    groups: list[GroupDrift] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "groups": [g.to_dict() for g in self.groups],
            "notes": self.notes,
        }

    def to_text(self) -> str:
        lines = [
            f"debug float check: each fused group's outputs vs the original in float32 "
            f"(model precision {self.precision})",
            f"  {'group':<44} {'fused max abs':>14} {'unfused':>10} {'added':>10} "
            f"{'fused fp32':>11} {'cosine':>12}",
        ]
        for g in sorted(self.groups, key=lambda g: -g.added_max_abs):
            f32 = f"{g.fused_fp32['max_abs']:.3g}" if g.fused_fp32 else "-"
            lines.append(
                f"  {g.key[:44]:<44} {g.fused['max_abs']:>14.3g} {g.unfused['max_abs']:>10.3g} "
                f"{g.added_max_abs:>+10.3g} {f32:>11} {g.fused['cosine']:>12.9f}"
            )
        if not self.groups:
            lines.append("  (no fused groups)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _precision(model: Any) -> str:
    kinds = {
        v.dtype
        for v in model.graph.values()
        if v.dtype in (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)
    }
    names = {DType.FLOAT: "float32", DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16"}
    return names[next(iter(kinds))] if len(kinds) == 1 else ("mixed" if kinds else "none")


def _widen(feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in feeds.items():
        a = np.asarray(v)
        out[k] = a.astype(np.float32) if a.dtype == np.float16 else a
    return out


def float_check(result: Any, feeds: Mapping[str, Any] | None = None) -> FloatCheckReport:
    """The drift of each fused group of ``result`` (a ``FuseResult``; see the module
    docstring). ``feeds``: the inputs (default: the ones the fuse run used)."""
    # onnx and onnxruntime (optional, heavy) load with these
    from graph_autofusion.frontend.onnx_frontend import to_onnx
    from graph_autofusion.verify.fp16 import to_fp32
    from graph_autofusion.verify.subgraph import capture_activations, capture_proto

    feeds = dict(feeds if feeds is not None else result.feeds)
    report = FloatCheckReport(_precision(result.original))
    ref = capture_proto(to_fp32(to_onnx(result.original)), _widen(feeds))
    unfused = capture_activations(result.original, feeds)
    program = getattr(result, "program", None)
    if program is not None:  # the cpu target: the fused program's own values
        got = {
            k: v.detach().float().numpy() if hasattr(v, "detach") else np.asarray(v)
            for k, v in program.run(feeds, keep_all=True).items()
        }
        fused32: dict[str, np.ndarray] | None = None
        report.notes.append("cpu target: kernels are compiled for the model's types (no fp32 run)")
    else:
        got = capture_activations(result.model, feeds)
        try:
            fused32 = capture_proto(to_fp32(to_onnx(result.model)), _widen(feeds))
        except Exception as exc:  # noqa: BLE001 - e.g. a fused operator with no fp32 kernel
            fused32 = None
            report.notes.append(f"the fused model does not run in float32: {exc}"[:300])
    for low in result.lowered:
        names = [n for n in low.outputs if n in ref and n in got and n in unfused]
        if not names:
            continue

        def worst(values: Mapping[str, np.ndarray], names: list[str] = names) -> dict[str, float]:
            stats = [compare_tensors(values[n], ref[n]) for n in names]
            return {
                "max_abs": max(s["max_abs"] for s in stats),
                "max_rel": max(s["max_rel"] for s in stats),
                "cosine": min(s["cosine"] for s in stats),
            }

        f32 = worst(fused32) if fused32 is not None and all(n in fused32 for n in names) else None
        report.groups.append(GroupDrift(low.key, low.rule, names, worst(got), worst(unfused), f32))
    return report
