"""The user-facing API (F15): ``GraphAutoFusion(model, ...)``.

    gaf = GraphAutoFusion("model.onnx", preset="transformer", rule_files=["my_rules.yaml"])
    report = gaf.candidates()          # rule matches, automatic clusters, operator pairs
    print(report.to_text())

This issue's part of the API finds candidates; benefit analysis, planning and the fused
rewrite for a target are added on top of it (``analyze``/``fuse`` come with later issues and
do not exist yet).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from graph_autofusion.ir.core import Model
from graph_autofusion.patterns.rules import FusionRule, RuleSet


class GraphAutoFusion:
    """Fusion compiler front door.

    Args:
        model: ONNX path, ``onnx.ModelProto``, IR :class:`Model`, or ``torch.nn.Module`` (then
            give ``example_inputs``/``example_kwargs``).
        preset: Built-in rule preset: ``transformer``, ``llm``, ``cnn``, ``rnn`` or ``all``.
        rule_files: YAML rule files loaded at run time, added to the preset's rules.
        rules: Extra Python :class:`FusionRule` objects.
        max_cluster_nodes, max_cluster_inputs: Limits of automatic clustering (F4c).
        clustering: Whether :meth:`candidates` runs automatic clustering.
    """

    def __init__(
        self,
        model: Any,
        *,
        preset: str = "all",
        rule_files: Sequence[str | os.PathLike[str]] = (),
        rules: Iterable[FusionRule] = (),
        example_inputs: Any = None,
        example_kwargs: Any = None,
        max_cluster_nodes: int = 64,
        max_cluster_inputs: int = 8,
        clustering: bool = True,
    ) -> None:
        from graph_autofusion.frontend.loader import load_model
        from graph_autofusion.patterns.library import builtin_rules
        from graph_autofusion.patterns.yaml_rules import load_rule_file

        self.source_name = (
            str(model) if isinstance(model, str | os.PathLike) else type(model).__name__
        )
        self.model: Model = load_model(model, example_inputs, example_kwargs)
        self.preset = preset
        ruleset = builtin_rules().preset(preset)
        for path in rule_files:
            ruleset = ruleset + load_rule_file(path)
        for rule in rules:
            ruleset = ruleset + rule
        self.rules: RuleSet = ruleset
        self.max_cluster_nodes = max_cluster_nodes
        self.max_cluster_inputs = max_cluster_inputs
        self.clustering = clustering

    def register_custom_fusion(self, rule: FusionRule) -> None:
        """Add a Python rule (pattern, checks, optional native ``rewrite`` callback)."""
        self.rules = self.rules + rule

    def candidates(self):
        """Every fusion candidate: rule matches (with overlaps resolved and, for rules that never
        fired, the closest partial match), automatic clusters and operator-pair verdicts.

        Raises:
            FusionRuleConflict: two rules of equal priority claim the same nodes.
        """
        from graph_autofusion.patterns.candidates import match_rules
        from graph_autofusion.patterns.clustering import cluster
        from graph_autofusion.patterns.pairs import operator_pairs
        from graph_autofusion.report.match_report import MatchReport

        graph = self.model.graph
        rules = match_rules(graph, self.rules)
        clusters = (
            cluster(graph, max_nodes=self.max_cluster_nodes, max_inputs=self.max_cluster_inputs)
            if self.clustering
            else None
        )
        return MatchReport(
            self.source_name,
            len(graph),
            self.preset,
            rules,
            clusters,
            operator_pairs(graph),
        )
