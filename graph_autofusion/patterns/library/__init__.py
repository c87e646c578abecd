"""The built-in rule library (F7): one module per rule, each defining ``RULE``.

Every module's docstring states the math the rule fuses; its test is
``tests/rules/test_<module>.py``. Modules are discovered, so adding a rule is adding a file.

    from graph_autofusion.patterns.library import builtin_rules
    rules = builtin_rules().preset("transformer")
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from graph_autofusion.patterns.rules import FusionRule, RuleSet


def rule_modules() -> list[str]:
    """Names of the rule modules, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


@functools.cache
def builtin_rules() -> RuleSet:
    """Every built-in rule, in module order."""
    rules = []
    for name in rule_modules():
        module = importlib.import_module(f"{__name__}.{name}")
        rule = getattr(module, "RULE", None)
        if not isinstance(rule, FusionRule):
            raise TypeError(f"rule module {module.__name__} must define RULE = FusionRule(...)")
        rules.append(rule)
    return RuleSet(tuple(rules))
