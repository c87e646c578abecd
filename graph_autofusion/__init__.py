"""graph-autofusion: an automatic operator-fusion compiler for ONNX and PyTorch models."""

__version__ = "0.1.0"

from graph_autofusion.api import GraphAutoFusion  # noqa: E402
from graph_autofusion.patterns.rules import FusionRule, FusionRuleConflict, RuleSet  # noqa: E402

# the report layer registers how the planner's AnalysisReport renders (to_text, to_html)
from graph_autofusion.report import analysis_report as _analysis_report  # noqa: E402, F401
from graph_autofusion.report import html_report as _html_report  # noqa: E402, F401

__all__ = ["FusionRule", "FusionRuleConflict", "GraphAutoFusion", "RuleSet", "__version__"]
