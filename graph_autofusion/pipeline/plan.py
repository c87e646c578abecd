"""The planning stages every target shares (what ``GraphAutoFusion.analyze()`` shows and
``fuse()`` carries out): a working copy, its folded ``Reshape`` shapes, and the analysis with
the target's rules, clustering and executability.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graph_autofusion.codegen.ort_customop import kernel_target, ort_include_dir
from graph_autofusion.codegen.targets import get_target
from graph_autofusion.ir.core import Model
from graph_autofusion.options import TARGETS
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.patterns.shape_folding import fold_reshape_shapes
from graph_autofusion.pipeline.result import clone_model
from graph_autofusion.planner.analysis import analyze_model
from graph_autofusion.planner.controls import PrecisionGuard, half_precision
from graph_autofusion.report import progress


def plan_for_target(
    original: Model,
    rules: RuleSet,
    profile: Any,
    options: Any,
    feeds: Mapping[str, Any],
    *,
    model_name: str | None = None,
    fold: bool | None = None,
    activations: Mapping[str, Any] | None = None,
) -> tuple[Model, Any, Any, Any]:
    """The planning stages every target shares: a working copy, its folded ``Reshape`` shapes,
    and the analysis with the target's rules, clustering and executability (what
    ``GraphAutoFusion.analyze()`` shows and ``fuse()`` carries out).

    ``activations``: the original's values on ``feeds`` (safe mode's capture): the analysis
    reads the shapes from them instead of running the graph again.

    Returns ``(work, analysis, folding, target)``; ``original`` is not modified.
    """
    opset = int(original.opset_imports.get("", 17))
    if options.target == "onnxruntime" and getattr(options, "custom_ops", False):
        target = kernel_target(opset) if ort_include_dir() else get_target("onnxruntime")
    else:
        target = get_target(options.target, opset=opset)
    work = clone_model(original)
    folding = None
    if options.fold_shapes if fold is None else fold:
        folding = fold_reshape_shapes(work)
    if hasattr(target, "prefer_native"):
        target.prefer_native(work.graph, rules)
    refuser = target if target.name != "onnxruntime" or hasattr(target, "custom_ops") else None
    keep_fp32 = getattr(options, "keep_fp32", ())
    if keep_fp32 and half_precision(work):  # F17: fusions that would compute them in half
        refuser = PrecisionGuard(target, keep_fp32)
    with progress.task(f"analyze {len(work.graph)} nodes"):
        analysis = analyze_model(
            work,
            target.select_rules(rules),
            profile,
            feeds=feeds,
            benefit_threshold=options.benefit_threshold,
            strategy=options.strategy,
            max_cluster_nodes=options.max_cluster_nodes,
            max_cluster_inputs=options.max_cluster_inputs,
            clustering=options.clustering and target.clustering,
            accept_maybe=options.safe_mode and options.check_speed,  # safe mode times close calls
            native_target=target.native_target,
            target=refuser,
            model_name=model_name,
            activations=activations,
        )
    analysis.target = target.name
    return work, analysis, folding, target


def add_other_targets(
    report: Any,
    original: Model,
    rules: RuleSet,
    profile: Any,
    options: Any,
    feeds: Mapping[str, Any],
) -> None:
    """Plan for every target but ``options.target`` and list, in ``report.other_targets``,
    what each would fuse instead (shown apart from the plan ``fuse()`` carries out)."""
    for name in TARGETS:
        if name != options.target:
            alt = plan_for_target(original, rules, profile, options.replace(target=name), feeds)[1]
            report.other_targets[name] = {
                "fusions": len(alt.chosen),
                "performance_improvement": alt.performance_improvement,
            }
