"""The candidates report (F4): rule matches per rule, automatic clusters, operator pairs.

For a rule that never fired, the report shows its closest partial match (the rejection that
matched the most nodes) and why it failed, so a user can see which exporter spelling defeated
it. Produced by :meth:`graph_autofusion.api.GraphAutoFusion.candidates` and printed by
``graph-autofusion match MODEL``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion.patterns.candidates import CandidateReport


@dataclass
class MatchReport:
    """Rule matches, automatic clusters and operator-pair verdicts of one model."""

    model_name: str
    num_nodes: int
    preset: str
    rules: CandidateReport
    clusters: Any = None  # patterns.clustering.ClusterResult
    pairs: list[Any] = field(default_factory=list)  # patterns.pairs.PairVerdict

    # ------------------------------------------------------------------ data
    def to_dict(self) -> dict[str, Any]:
        per_rule = []
        for name, rr in self.rules.per_rule.items():
            entry: dict[str, Any] = {
                "rule": name,
                "fused_op": rr.rule.fuse_pattern,
                "priority": rr.rule.priority,
                "matches": len(rr.matches),
                "kept": rr.kept,
                "roots": [m.root.name for m in rr.matches],
            }
            if not rr.matches and rr.closest is not None:
                c = rr.closest
                entry["closest"] = {
                    "code": c.code,
                    "message": c.message,
                    "matched_nodes": c.depth,
                    "node": c.node,
                }
            per_rule.append(entry)
        dropped = [
            {"rule": lo.rule.name, "root": lo.match.root.name, "lost_to": win.rule.name}
            for lo, win in self.rules.dropped
        ]
        out: dict[str, Any] = {
            "model": self.model_name,
            "nodes": self.num_nodes,
            "preset": self.preset,
            "rules": per_rule,
            "selected": [
                {"rule": k.rule.name, "nodes": [n.name for n in k.match.nodes]}
                for k in self.rules.kept
            ],
            "overlaps": dropped,
        }
        if self.clusters is not None:
            out["clusters"] = [c.to_dict() for c in self.clusters.clusters]
            out["cluster_rejections"] = dict(Counter(r.code for r in self.clusters.rejections))
        if self.pairs:
            out["pairs"] = {
                "total": len(self.pairs),
                "fusible": sum(1 for p in self.pairs if p.fusible),
                "by_reason": dict(Counter(p.code for p in self.pairs)),
            }
        return out

    # ------------------------------------------------------------------ text
    def to_text(self, *, max_roots: int = 4) -> str:
        lines = [
            f"candidates for {self.model_name} ({self.num_nodes} nodes), preset {self.preset}",
            "",
            "rule matches (raw = every match of the rule alone; kept = after overlaps):",
        ]
        width = max((len(n) for n in self.rules.per_rule), default=4)
        for name, rr in sorted(
            self.rules.per_rule.items(), key=lambda kv: (-len(kv[1].matches), kv[0])
        ):
            head = f"  {name:<{width}}  raw {len(rr.matches):>4}  kept {rr.kept:>4}"
            if rr.matches:
                roots = ", ".join(m.root.name for m in rr.matches[:max_roots])
                more = f", +{len(rr.matches) - max_roots}" if len(rr.matches) > max_roots else ""
                lines.append(f"{head}  -> {rr.rule.fuse_pattern} at {roots}{more}")
            elif rr.closest is not None:
                c = rr.closest
                lines.append(
                    f"{head}  never fired; closest: {c.depth} node(s) matched, [{c.code}] "
                    f"{c.message}"
                )
            else:
                lines.append(f"{head}  never fired; no node of its root operator type")
        if self.rules.dropped:
            lost = Counter((lo.rule.name, win.rule.name) for lo, win in self.rules.dropped)
            lines.append("")
            lines.append("overlaps resolved by priority:")
            for (lo, win), n in sorted(lost.items()):
                lines.append(f"  {n:>4} x {lo} gave way to {win}")
        if self.clusters is not None:
            cl = self.clusters.clusters
            kinds = Counter(c.kind for c in cl)
            lines.append("")
            lines.append(
                f"automatic clusters: {len(cl)} ({sum(len(c.nodes) for c in cl)} nodes)"
                + (": " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()) if cl else "")
            )
            for c in cl[:max_roots]:
                lines.append(f"  {c.kind}: {' -> '.join(n.op_type for n in c.nodes)}")
            if len(cl) > max_roots:
                lines.append(f"  ... {len(cl) - max_roots} more")
            rej = Counter(r.code for r in self.clusters.rejections)
            if rej:
                lines.append(
                    "  merges refused: " + ", ".join(f"{k} {n}" for k, n in rej.most_common())
                )
        if self.pairs:
            fusible = sum(1 for p in self.pairs if p.fusible)
            by = Counter(p.code for p in self.pairs if not p.fusible)
            lines.append("")
            tail = "; not fusible: " + ", ".join(f"{k} {n}" for k, n in by.most_common())
            lines.append(
                f"operator pairs: {len(self.pairs)} producer->consumer edges, {fusible} fusible"
                + (tail if by else "")
            )
        return "\n".join(lines)
