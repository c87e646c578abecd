"""graph-autofusion: an automatic operator-fusion compiler for ONNX and PyTorch models."""

__version__ = "0.1.0"

from graph_autofusion.api import GraphAutoFusion  # noqa: E402
from graph_autofusion.patterns.rules import FusionRule, FusionRuleConflict, RuleSet  # noqa: E402

__all__ = ["FusionRule", "FusionRuleConflict", "GraphAutoFusion", "RuleSet", "__version__"]
