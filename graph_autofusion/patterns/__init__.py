"""Pattern language (F5), matcher with reasons, and fusion rules (F6)."""

from graph_autofusion.patterns.matcher import Match, Reason, Rejection, find_matches, match_at
from graph_autofusion.patterns.pattern import ANY, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule, FusionRuleConflict, RuleSet

__all__ = [
    "ANY",
    "FusionRule",
    "FusionRuleConflict",
    "Match",
    "PatternBuilder",
    "Reason",
    "Rejection",
    "RuleSet",
    "find_matches",
    "match_at",
]
