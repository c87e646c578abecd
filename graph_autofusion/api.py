"""The user-facing API (F15): ``GraphAutoFusion(model, ...)``.

    gaf = GraphAutoFusion("model.onnx", preset="transformer", rule_files=["my_rules.yaml"])
    report = gaf.candidates()          # rule matches, automatic clusters, operator pairs
    print(report.to_text())

    gaf.analyze()                      # costs on the hardware profile, the fusion plan
    gaf.estimate_benefit()             # performance_improvement, hbm_access_reduction, ...
    fused = gaf.fuse_safe()            # onnxruntime-native fusions, each verified (F13)
    gaf.safe_fusion_report()           # what was fused, skipped, rolled back, and why
    gaf.verify_precision()             # whole-model and per-layer comparison
    gaf.verify_performance()           # measured latency, throughput, improvement
    gaf.save("fused.onnx")             # atomic; never overwrites the input unless asked

Targets: ``target="onnxruntime"`` (default) fuses into operators onnxruntime ships;
``target="cpu"`` generates, compiles and runs C kernels for every planned group (rule matches
and automatic clusters), with every other operator on the engine that runs the model faster
on the sample inputs: onnxruntime (the kernels as its custom operators; every model
onnxruntime runs: GRU, If, Loop) or torch's kernels (``result.engine`` says which and why;
:mod:`graph_autofusion.pipeline.cpu_engines`)::

    gaf = GraphAutoFusion("model.onnx", target="cpu")
    gaf.analyze()                      # exactly the groups fuse() will compile
    gaf.fuse()
    outputs = gaf.run(feeds)           # {output name: array}
    gaf.compile_fused_operators("kernels/")   # sources, library, manifest.json

The articles' CamelCase names (``Fuse``, ``FuseSafe``, ``AnalyzeFusionBenefit``,
``EstimateFusionBenefit``, ``GetSafeFusionReport``, ``VerifyPrecision``, ``VerifyPerformance``,
``AddFusionRule``, ``CompileFusedOperators``) are aliases.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.api_results import FusedResults
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Model
from graph_autofusion.patterns.rules import FusionRule, RuleSet


class NotFusedYetError(GraphAutoFusionError):
    """A method that needs a fused model was called before ``fuse()``."""


class GraphAutoFusion(FusedResults):
    """Fusion compiler front door.

    Args:
        model: ONNX path, ``onnx.ModelProto``, IR :class:`Model`, or ``torch.nn.Module`` (then
            give ``example_inputs``/``example_kwargs``).
        preset: Built-in rule preset: ``transformer``, ``llm``, ``cnn``, ``rnn`` or ``all``.
        rule_files: YAML rule files loaded at run time, added to the preset's rules.
        rules / fuse_rules: Extra Python :class:`FusionRule` objects.
        hardware: Hardware profile name or YAML path (``host`` = this machine, calibrated).
        safe_mode: Verify every fusion and roll back failures (:meth:`fuse`).
        benefit_threshold: Minimum estimated relative saving for a fusion (default 0.2).
        strategy: Planner strategy: ``auto``, ``greedy``, ``dp``, ``evolutionary``.
        sample_inputs: Inputs for shapes, safe mode and measurements (by ONNX input name);
            generated from the input specs when absent (token ids within the vocabulary).
            Every input needs a value (``SampleInputError`` names the missing ones); keys
            that name no input are ignored.
        max_cluster_nodes, max_cluster_inputs: Limits of automatic clustering (F4c).
        clustering: Whether analysis includes automatic clusters.
        target: ``onnxruntime`` or ``cpu`` (generated kernels); see the module docstring.
        size_switches: Rules that apply only when an input's size meets a condition
            (``"attention:input_ids[1]>=128"``; F17, :mod:`graph_autofusion.planner.controls`).
        keep_fp32: Operators that compute in float32 inside half-precision models
            (``"default"``: BatchNormalization and the reductions).
        options: A :class:`~graph_autofusion.options.FuseOptions` (overrides the keyword
            arguments it covers).
    """

    def __init__(
        self,
        model: Any,
        *,
        preset: str = "all",
        rule_files: Sequence[str | os.PathLike[str]] = (),
        rules: Iterable[FusionRule] = (),
        fuse_rules: Iterable[FusionRule] = (),
        hardware: Any = "host",
        safe_mode: bool = True,
        benefit_threshold: float = defaults.BENEFIT_THRESHOLD,
        strategy: str = "auto",
        sample_inputs: Mapping[str, Any] | None = None,
        example_inputs: Any = None,
        example_kwargs: Any = None,
        max_cluster_nodes: int = defaults.MAX_CLUSTER_NODES,
        max_cluster_inputs: int = defaults.MAX_CLUSTER_INPUTS,
        clustering: bool = True,
        target: str = "onnxruntime",
        options: Any = None,
        size_switches: Sequence[Any] = (),
        keep_fp32: Sequence[str] | str = (),
    ) -> None:
        from graph_autofusion.frontend.loader import load_model
        from graph_autofusion.patterns.library import builtin_rules
        from graph_autofusion.patterns.yaml_rules import load_rule_file

        self.source_path = os.fspath(model) if isinstance(model, str | os.PathLike) else None
        self.source_name = self.source_path or type(model).__name__
        self.torch_module = _torch_module(model)
        if self.torch_module is not None:  # the PyTorch path: fuse() returns a module
            from graph_autofusion.torch_module import example_call

            args, kwargs = example_call(model, example_inputs, example_kwargs)
            self.example_args, self.example_kwargs = args, kwargs
            if target == "onnxruntime" and options is None:
                target = "cpu"  # a module runs in torch: its fused groups are kernels
            self._model: Model | None = None  # imported when analysis first needs it
        else:
            self._model = load_model(model, example_inputs, example_kwargs)
        self.preset = preset
        ruleset = builtin_rules().preset(preset)
        for path in rule_files:
            ruleset = ruleset + load_rule_file(path)
        for rule in (*rules, *fuse_rules):
            ruleset = ruleset + rule
        self.rules: RuleSet = ruleset
        self.hardware = hardware
        from graph_autofusion.options import FuseOptions

        options = FuseOptions.coerce(options)  # a dict of its fields too
        if options is None:
            options = FuseOptions(
                target=target,
                benefit_threshold=benefit_threshold,
                strategy=strategy,
                max_cluster_nodes=max_cluster_nodes,
                max_cluster_inputs=max_cluster_inputs,
                clustering=clustering,
                safe_mode=safe_mode,
                size_switches=tuple(size_switches),
                keep_fp32=(keep_fp32,) if isinstance(keep_fp32, str) else tuple(keep_fp32),
            )
        self.options: FuseOptions = options
        self.sample_inputs = dict(sample_inputs) if sample_inputs is not None else None
        self.result: Any = None  # the last FuseResult
        self.fused_module: Any = None  # the last fuse() of a PyTorch module
        self.kernel_dir = ""  # the custom-operator folder the last save() wrote
        self.progressive: Any = None  # the last fuse_progressive()
        self._run_session: Any = None  # (result, onnxruntime session) run() last opened

    @property
    def model(self) -> Model:
        """The model in the IR (a PyTorch module is imported with ``torch.export`` on first
        use, its outputs flattened to tensors: a Hugging Face model without its cache)."""
        if self._model is None:
            from graph_autofusion.torch_module import import_for_analysis

            self._model = import_for_analysis(
                self.torch_module, self.example_args, self.example_kwargs
            )
        return self._model

    @model.setter
    def model(self, value: Model) -> None:
        self._model = value

    # read-only views of the options record
    target = property(lambda self: self.options.target)
    safe_mode = property(lambda self: self.options.safe_mode)
    benefit_threshold = property(lambda self: self.options.benefit_threshold)
    strategy = property(lambda self: self.options.strategy)
    clustering = property(lambda self: self.options.clustering)
    max_cluster_nodes = property(lambda self: self.options.max_cluster_nodes)
    max_cluster_inputs = property(lambda self: self.options.max_cluster_inputs)

    # ------------------------------------------------------------------ rules
    def register_custom_fusion(self, rule: FusionRule) -> None:
        """Add a Python rule (pattern, checks, optional native ``rewrite`` callback)."""
        self.rules = self.rules + rule

    add_rule = register_custom_fusion

    # ------------------------------------------------------------------ candidates / analysis
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

    def feeds(self) -> dict[str, np.ndarray]:
        """The sample inputs used for shapes, safe mode and measurements."""
        if self.sample_inputs is None:
            from graph_autofusion.samples.inputs import generate_inputs

            self.sample_inputs = generate_inputs(self.model)
        elif self.torch_module is None:
            from graph_autofusion.samples.run_failure import check_given_inputs

            check_given_inputs(self.model, self.sample_inputs)
        return self.sample_inputs

    def analyze(
        self, *, hardware: Any = None, strategy: str | None = None, other_targets: bool = False
    ):
        """Cost every candidate on the hardware profile and plan for this object's target (an
        ``AnalysisReport``): the plan :meth:`fuse` carries out, on the same shape-folded copy,
        with every candidate the target cannot execute refused with its reason.
        ``other_targets``: also plan for the other target and list what it would fuse apart
        (``report.other_targets``)."""
        from graph_autofusion.pipeline import add_other_targets, plan_for_target

        opts = self.options if strategy is None else self.options.replace(strategy=strategy)
        profile = hardware if hardware is not None else self.hardware
        rules, switched = self.active_rules()
        report = plan_for_target(
            self.model, rules, profile, opts, self.feeds(), model_name=self.source_name
        )[1]
        report.controls = {"size_switches": switched} if switched else {}
        if other_targets:  # listed apart: what the other target would plan instead
            add_other_targets(report, self.model, rules, profile, opts, self.feeds())
        return report

    def active_rules(self, rules: RuleSet | None = None) -> tuple[RuleSet, list[dict[str, Any]]]:
        """The rules that apply to the sample inputs' sizes (``size_switches``, F17) and one
        record per switch: what it saw and whether the rule is on."""
        from graph_autofusion.planner.controls import apply_size_switches

        rules = self.rules if rules is None else rules
        if not self.options.size_switches:
            return rules, []
        return apply_size_switches(rules, self.options.size_switches, self.feeds())

    def estimate_benefit(self, **kwargs: Any) -> dict[str, Any]:
        """``performance_improvement``, ``hbm_access_reduction`` and times of the plan."""
        from graph_autofusion.planner.analysis import estimate_benefit

        return estimate_benefit(self.analyze(**kwargs))

    # ------------------------------------------------------------------ fusing
    def fuse(
        self,
        *,
        safe_mode: bool | None = None,
        check_speed: bool | None = None,
        progress=None,
        **options: Any,
    ):
        """Fuse for onnxruntime: the planned fusions with a runtime-native form, each verified
        in safe mode (on by default); returns the fused IR :class:`Model`.

        ``safe_mode``, ``check_speed`` (``None``: the options record's) and ``options``
        override fields of :attr:`options` for this fuse (``speed_margin``, ``cosine_floor``,
        ``e2e_cosine_floor``, ``mc_samples``, ``fold_shapes``, ...); the pipeline reads every
        field from the one record. ``rules``: a :class:`RuleSet` instead of this object's."""
        rules, switched = self.active_rules(options.pop("rules", None))
        self._fuse_with(rules, safe_mode, check_speed, progress, options)
        if self.result is not None:
            self.result.controls = {
                **({"size_switches": switched} if switched else {}),
                **({"keep_fp32": list(self.options.keep_fp32)} if self.options.keep_fp32 else {}),
            }
        return self.fused_module if self.torch_module is not None else self.result.model

    def _fuse_with(self, rules: RuleSet, safe_mode, check_speed, progress, options) -> None:
        from graph_autofusion.pipeline import fuse_model
        from graph_autofusion.report import progress as _progress

        progress = progress if progress is not None else _progress.callback("fuse")
        overrides = dict(options)
        if safe_mode is not None:
            overrides["safe_mode"] = safe_mode
        if check_speed is not None:
            overrides["check_speed"] = check_speed
        opts = self.options.replace(**overrides)
        if self.torch_module is not None:
            from graph_autofusion.torch_module import fuse_module

            self.fused_module = fuse_module(
                self.torch_module,
                self.example_args,
                self.example_kwargs,
                rules=rules,
                preset=self.preset,
                hardware=self.hardware,
                options=opts.replace(target="cpu"),
                source_name=self.source_name,
            )
            info = self.fused_module.autofusion
            results = info.engine_results()  # what runs: the reports and checks read it
            self.result = results[0] if results else None
            return
        if opts.target == "cpu":  # the faster of onnxruntime with our kernels and torch's
            from graph_autofusion.pipeline.cpu_engines import fuse_onnx_cpu

            self.result = fuse_onnx_cpu(
                self.model,
                rules,
                self.hardware,
                options=opts,
                feeds=self.feeds(),
                progress=progress,
            )
            return
        self.result = fuse_model(
            self.model, rules, self.hardware, options=opts, feeds=self.feeds(), progress=progress
        )
        from graph_autofusion.samples.sample_inputs import is_generated

        if is_generated(self.sample_inputs) and is_generated(self.result.feeds):
            self.sample_inputs = self.result.feeds  # longer ones, where 16 was too short

    def fuse_progressive(self, stages: Sequence[str | Sequence[str]], **kwargs: Any):
        """Progressive fusion (F17): fuse with the rules of stage 1, validate, then stages
        1..2, and so on, stopping at the first stage that fails (rolled back as a whole).
        ``stages``: lists of rule names (or comma-separated strings). Returns a
        :class:`~graph_autofusion.pipeline.progressive.ProgressiveResult`; ``self.result``
        becomes the kept stage's result (``None`` when stage 1 fails: nothing fused).
        ``kwargs`` go to :meth:`fuse` (safe mode is always on)."""
        from graph_autofusion.pipeline.progressive import fuse_progressive

        kwargs.pop("safe_mode", None)

        def run_stage(rules: RuleSet, **more: Any):
            self.fuse(safe_mode=True, rules=rules, **kwargs, **more)
            return self.result

        prog = fuse_progressive(self.active_rules()[0], stages, run_stage)
        if prog.result is None:  # stage 1 failed: the model unfused, as a result to save
            off = (
                {"clustering": False}
                if self.torch_module is not None or self.target == "cpu"
                else {}
            )
            prog.result = run_stage(RuleSet(()), **off)
        self.result = prog.result
        self.progressive = prog
        return prog

    def _module_fusion(self):
        if self.fused_module is None:
            raise NotFusedYetError("call fuse() or fuse_safe() first")
        return self.fused_module

    def fuse_safe(self, **kwargs: Any):
        """:meth:`fuse` with safe mode on."""
        return self.fuse(safe_mode=True, **kwargs)

    def _need_result(self):
        if self.result is None:
            raise NotFusedYetError("call fuse() or fuse_safe() first")
        return self.result

    # ------------------------------------------------------------------ the articles' names
    Fuse = fuse
    FuseSafe = fuse_safe
    AnalyzeFusionBenefit = analyze
    EstimateFusionBenefit = estimate_benefit
    GetSafeFusionReport = FusedResults.safe_fusion_report
    VerifyPrecision = FusedResults.verify_precision
    VerifyPerformance = FusedResults.verify_performance
    AddFusionRule = add_rule
    CompileFusedOperators = FusedResults.compile_fused_operators
    ProfileFusionKernel = FusedResults.profile_fusion_kernel


def _torch_module(model: Any) -> Any:
    """``model`` if it is a ``torch.nn.Module`` (without importing torch: an object can only
    be one once torch is imported)."""
    torch = sys.modules.get("torch")
    return model if torch is not None and isinstance(model, torch.nn.Module) else None
