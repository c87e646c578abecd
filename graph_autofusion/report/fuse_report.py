"""The safe-fusion report (F14): what ``fuse`` did, what it refused, and why, in numbers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.report.html_report import html_report
from graph_autofusion.report.report_data import SAFETY_KEYS


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


@dataclass
class SafeFusionReport:
    """A view of a :class:`~graph_autofusion.pipeline.FuseResult` for people and programs."""

    result: Any
    model_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        data: dict[str, Any] = {"model": self.model_name, **r.summary()}
        data["fusions"] = [
            {
                "key": low.key,
                "rule": low.rule,
                "fused_ops": low.fused_ops,
                "replaced": low.original_node_names,
                **(_safety(r.safety.get(low.key))),
            }
            for low in r.lowered
        ]
        data["rolled_back"] = [
            {
                "key": b.key,
                "rule": b.rule,
                "code": b.code,
                "message": b.message,
                **_safety(b.result),
            }
            for b in r.rolled_back
        ]
        data["not_lowered"] = [
            {"key": n.key, "rule": n.rule, "code": n.code, "message": n.message}
            for n in r.not_lowered
        ]
        data["folded_reshapes"] = (
            r.shape_folding.to_dict()["folded"] if r.shape_folding is not None else []
        )
        data["timings_s"] = r.timings
        data["notes"] = r.notes
        return data

    def to_html(self, precision: dict[str, Any] | None = None, hardware: Any = None) -> str:
        """The self-contained HTML report of this run (:mod:`graph_autofusion.report.
        html_report`); ``precision``: :meth:`GraphAutoFusion.verify_precision`'s dict for the
        per-layer comparison (safe mode's per-fusion checks are in the result already)."""
        return html_report(
            result=self.result, precision=precision, hardware=hardware, model_name=self.model_name
        )

    def to_text(self, *, limit: int = 12) -> str:
        r = self.result
        s = r.summary()
        lines = [
            f"safe fusion report for {self.model_name} (target {_target(r)}, safe mode "
            f"{'on' if r.safe_mode else 'off'})",
            f"candidates {s['candidates']}, planned {s['planned']}, fused {s['fused']}, "
            f"rolled back {s['rolled_back']}",
        ]
        eng = s.get("engine")
        if eng:
            ms = ", ".join(f"{k} {v:.3f} ms" for k, v in eng["ms"].items())
            lines.append(
                f"engine: {eng['name']} ({eng['why']}{': ' + ms if ms else ''})"
                + "".join(f"; {k}: {v}" for k, v in eng.get("notes", {}).items())
            )
        if s["fused_ops"]:
            lines.append(
                "fused operators: " + ", ".join(f"{k} x{v}" for k, v in s["fused_ops"].items())
            )
        sf = s.get("shape_folding")
        if sf and sf["reshapes_folded"]:
            removed = ", ".join(f"{k} {v}" for k, v in sorted(sf["nodes_removed_by_op"].items()))
            lines.append(
                f"shape plumbing folded: {sf['reshapes_folded']} Reshape target shapes made "
                f"constant, {sf['nodes_removed']} nodes removed"
                + (f" ({removed})" if removed else "")
            )
        if s["skipped"]:
            lines.append(
                "not fused, by reason: " + ", ".join(f"{k} {v}" for k, v in s["skipped"].items())
            )
        lines.append(
            f"estimated improvement (cost model) {_pct(s['estimated_improvement'])}; measured on "
            f"the fused subgraphs {_pct(s['measured_improvement'])}"
        )
        if r.rolled_back:
            lines.append("rolled back:")
            for b in r.rolled_back[:limit]:
                lines.append(f"  {b.key}: [{b.code}] {b.message}")
            if len(r.rolled_back) > limit:
                lines.append(f"  ... {len(r.rolled_back) - limit} more")
        byrule = Counter(n.rule for n in r.not_lowered if n.code == reasons.NO_NATIVE_FORM)
        if byrule:
            lines.append(
                "no onnxruntime-native form (left unfused): "
                + ", ".join(f"{k} {v}" for k, v in byrule.most_common())
            )
        if r.end_to_end is not None:
            outs = r.end_to_end.get("outputs", r.end_to_end)
            for name, v in outs.items():
                lines.append(
                    f"end to end %{name}: cosine {v.get('cosine', float('nan')):.9f}, max abs "
                    f"{v.get('max_abs', float('nan')):.3g} -> "
                    f"{'pass' if v.get('passed', True) else 'FAIL'}"
                )
        weights = getattr(r, "weights", None)
        if weights is not None:  # compressed weights: every contraction's form and error
            lines.extend(weights.to_text().splitlines())
        lines.extend(f"note: {n}" for n in r.notes)
        return "\n".join(lines)


def _safety(res: Any) -> dict[str, Any]:
    if res is None:
        return {}
    return {k: getattr(res, k, None) for k in SAFETY_KEYS}


def _target(r: Any) -> str:
    """The target the result was fused for (the cpu target's result says so itself)."""
    return getattr(r, "target", None) or getattr(r.analysis, "target", None) or "onnxruntime"
