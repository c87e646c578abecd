"""Declarative rule files (F5/F6): YAML loaded at run time, no reinstall.

Schema (documented with examples in ``docs/rules.md``)::

    rules:
      - name: attention_scale_by_div          # required, unique
        fused_op: AttentionScaleMask            # required: the fused operator's name
        pattern: "Softmax(Add(Div(x, const(scale, scalar=true)), mask), axis=-1)"
        priority: 10                            # default 0
        benefit_threshold: 0.1                  # default: the global threshold
        presets: [transformer, llm]             # default []
        tolerance: 0.999                        # cosine floor for safe mode, default 0.999
        exported: []                            # labels of internal nodes also exported
        checks: ["broadcastable(x, mask)"]      # constraints between variables
        horizontal: x                           # sibling branches sharing %x fuse together
        min_branches: 2                         # with horizontal: fewest siblings

The pattern is an expression in the pattern language: ``Op(inputs..., attr=value)`` is an
operator (capitalized name; ``ms::Op`` is not allowed, use ``domain: com.microsoft``),
``(Relu|Gelu)(x)`` accepts several operator types, a lowercase name is a variable,
``const(name, scalar=true, value=1.0)`` a constant, ``var(name, rank=4)`` a constrained
variable, ``optional(Cast, x)`` an operator that may be absent, ``label="name"`` names a node.
The expression is parsed with :mod:`ast`, never evaluated. A malformed file raises
:class:`RuleFileError` naming the file, the line and the problem; nothing is half-loaded.
"""

from __future__ import annotations

import ast
import math
import os
import reprlib
from collections.abc import Callable
from typing import Any

from graph_autofusion import defaults
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.patterns.constraints import CONSTRAINTS
from graph_autofusion.patterns.matcher import root_op_types
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule, RuleSet
from graph_autofusion.yaml_util import load_yaml_with_nodes, read_yaml_file

REQUIRED = ("name", "fused_op", "pattern")
OPTIONAL = {
    "priority": int,
    "benefit_threshold": (int, float),
    "presets": list,
    "tolerance": (int, float),
    "exported": list,
    "domain": str,
    "doc": str,
    "checks": list,
    "horizontal": str,
    "min_branches": int,
}
_VAR_KEYS = {"dtypes", "rank", "last_dim", "static", "const", "scalar", "value", "rtol", "atol"}
#: keys whose value is a list of strings
_STRING_LISTS = ("presets", "exported", "checks")
#: longest pattern or check expression read (a real pattern is a few hundred characters)
MAX_EXPRESSION_CHARS = 10_000


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _var_key_ok(key: str, v: Any) -> str:
    """What is wrong with ``var(..., key=v)`` ('' when it is fine)."""
    if key in ("rank", "last_dim"):
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
        return "" if ok else "must be an integer >= 0"
    if key in ("static", "const", "scalar"):
        return "" if isinstance(v, bool) else "must be true or false"
    if key == "value":
        return "" if _is_number(v) else "must be a finite number"
    if key in ("rtol", "atol"):
        return "" if _is_number(v) and v >= 0 else "must be a number >= 0"
    if key == "dtypes":
        ok = isinstance(v, list | tuple) and all(isinstance(d, str) for d in v)
        return "" if ok else "must be a list of dtype names such as ['f32', 'f16']"
    return ""


class RuleFileError(GraphAutoFusionError):
    """A rule file is malformed; the message names file, line and problem."""


class _PatternParser:
    def __init__(self, where: str, domain: str) -> None:
        self.where = where
        self.b = PatternBuilder(domain)
        self.variables: set[str] = set()  # the names the pattern binds

    def fail(self, msg: str) -> RuleFileError:
        return RuleFileError(f"{self.where}: pattern: {msg}")

    def literal(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in ("true", "false"):
            return node.id == "true"
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise self.fail(f"expected a literal value, got {_clip(ast.unparse(node))}") from None

    def op_types(self, func: ast.AST) -> tuple[str, ...]:
        if isinstance(func, ast.Name):
            return (func.id,)
        if isinstance(func, ast.BinOp) and isinstance(func.op, ast.BitOr):
            return self.op_types(func.left) + self.op_types(func.right)
        raise self.fail(f"{ast.unparse(func)!r} is not an operator name")

    def pattern(self, node: ast.AST) -> Pattern:
        if isinstance(node, ast.Name):
            if node.id[:1].isupper():
                raise self.fail(f"operator {node.id} needs its inputs: {node.id}(...)")
            self.variables.add(node.id)
            return self.b.var(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.pattern(node.left) | self.pattern(node.right)
        if not isinstance(node, ast.Call):
            raise self.fail(f"cannot read {ast.unparse(node)!r}")
        kwargs = {k.arg: self.literal(k.value) for k in node.keywords if k.arg}
        fname = node.func.id if isinstance(node.func, ast.Name) else ""
        if fname in ("var", "const"):
            if not node.args or not isinstance(node.args[0], ast.Name):
                raise self.fail(f"{fname}() needs a variable name first")
            bad = set(kwargs) - _VAR_KEYS
            if bad:
                raise self.fail(
                    f"{fname}() does not take {sorted(bad)}; it takes {sorted(_VAR_KEYS)}"
                )
            for key, value in kwargs.items():
                problem = _var_key_ok(key, value)
                if problem:
                    raise self.fail(f"{fname}({node.args[0].id}, {key}=...): {problem}")
            if "dtypes" in kwargs:
                try:
                    kwargs["dtypes"] = [DType.from_short(d) for d in kwargs["dtypes"]]
                except ValueError as e:
                    raise self.fail(f"{fname}({node.args[0].id}): {e}") from None
            self.variables.add(node.args[0].id)
            make = self.b.const if fname == "const" else self.b.var
            return make(node.args[0].id, **kwargs)
        if fname == "optional":
            if len(node.args) != 2:
                raise self.fail("optional(Op, input) takes an operator and an input")
            return self.b.optional(self.op_types(node.args[0]), self.pattern(node.args[1]))
        types = self.op_types(node.func)
        if any(not t[:1].isupper() for t in types):
            raise self.fail(f"unknown function {ast.unparse(node.func)!r}")
        label = kwargs.pop("label", "")
        if not isinstance(label, str):
            raise self.fail(f"label= must be a string, got {_clip(label)}")
        inputs = tuple(self.pattern(a) for a in node.args)
        return self.b.op(*types)(*inputs, _label=label, **kwargs)

    def parse(self, text: str) -> Pattern:
        tree = self._parse(text, "")
        try:
            pat = self.pattern(tree.body)
        except RecursionError:
            raise self.fail("nested too deeply") from None
        if not root_op_types(pat):
            raise self.fail("the pattern's root must be an operator")
        return pat

    def _parse(self, text: Any, what: str) -> ast.Expression:
        """``text`` parsed as one Python expression (never evaluated)."""
        head = f"{what}: " if what else ""
        if not isinstance(text, str):
            raise self.fail(f"{head}must be a string, got {type(text).__name__}")
        if len(text) > MAX_EXPRESSION_CHARS:
            raise self.fail(f"{head}longer than {MAX_EXPRESSION_CHARS:,} characters")
        try:
            return ast.parse(text.strip(), mode="eval")
        except SyntaxError as e:
            raise self.fail(f"{head}syntax error at column {e.offset}: {e.msg}") from None
        except (RecursionError, MemoryError, ValueError):  # too deep, or a NUL character
            raise self.fail(f"{head}nested too deeply or not readable") from None

    def check(self, text: str) -> Callable:
        """A constraint call such as ``broadcastable(x, bias)`` or ``last_dim(x, 64)``."""
        tree = self._parse(text, f"check {_clip(text)}").body
        name = (
            tree.func.id if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) else ""
        )
        if name not in CONSTRAINTS:
            raise self.fail(f"check {text!r}: unknown constraint; known: {sorted(CONSTRAINTS)}")
        assert isinstance(tree, ast.Call)
        args = [a.id if isinstance(a, ast.Name) else self.literal(a) for a in tree.args]
        unbound = [a.id for a in tree.args if isinstance(a, ast.Name)]
        unbound = [n for n in unbound if n not in self.variables and n not in ("true", "false")]
        if unbound:
            raise self.fail(
                f"check {text!r}: names %{', %'.join(unbound)}, which the pattern does not bind "
                f"(it binds {sorted(self.variables)})"
            )
        try:
            return CONSTRAINTS[name](*args)
        except TypeError as e:
            raise self.fail(f"check {text!r}: {e}") from None


def _rule_from_mapping(entry: Any, mark_line: int, path: str) -> FusionRule:
    where = f"{path}, line {mark_line}"
    if not isinstance(entry, dict):
        raise RuleFileError(f"{where}: each rule must be a mapping, got {type(entry).__name__}")
    missing = [k for k in REQUIRED if k not in entry]
    if missing:
        raise RuleFileError(f"{where}: rule is missing required key(s) {missing}")
    unknown = set(entry) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise RuleFileError(
            f"{where}: unknown key(s) {sorted(map(str, unknown))}; allowed: "
            f"{sorted((*REQUIRED, *OPTIONAL))}"
        )
    for key in REQUIRED:
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise RuleFileError(
                f"{where}: {key} must be a non-empty string, got {type(entry[key]).__name__} "
                f"{_clip(entry[key])}"
            )
    name = entry["name"]
    for key, typ in OPTIONAL.items():
        if key not in entry:
            continue
        v = entry[key]
        ok = isinstance(v, typ) and not isinstance(v, bool)
        if typ == (int, float):
            ok = _is_number(v)
        if not ok:
            want = {int: "an integer", str: "a string", list: "a list"}.get(typ, "a number")  # type: ignore[call-overload]
            raise RuleFileError(
                f"{where}: rule {name!r}: {key} has the wrong type: must be {want}, got "
                f"{type(v).__name__} {_clip(v)}"
            )
        if key in _STRING_LISTS and not all(isinstance(x, str) for x in v):
            raise RuleFileError(f"{where}: rule {name!r}: {key} must be a list of strings")
    if "tolerance" in entry and not 0 < entry["tolerance"] <= 1:
        raise RuleFileError(
            f"{where}: rule {name!r}: tolerance is a cosine floor in (0, 1], "
            f"got {entry['tolerance']}"
        )
    if "benefit_threshold" in entry and not 0 <= entry["benefit_threshold"] < 1:
        raise RuleFileError(
            f"{where}: rule {name!r}: benefit_threshold must be in [0, 1), "
            f"got {entry['benefit_threshold']}"
        )
    if entry.get("min_branches", 2) < 2:
        raise RuleFileError(f"{where}: rule {name!r}: min_branches must be >= 2")
    parser = _PatternParser(f"{where}: rule {entry['name']!r}", entry.get("domain", ""))
    pattern = parser.parse(entry["pattern"])
    if entry.get("horizontal") and entry["horizontal"] not in parser.variables:
        raise RuleFileError(
            f"{where}: rule {name!r}: horizontal names %{entry['horizontal']}, which the "
            f"pattern does not bind (it binds {sorted(parser.variables)})"
        )
    checks = tuple(parser.check(c) for c in entry.get("checks", ()))
    return FusionRule(
        name=str(entry["name"]),
        pattern=pattern,
        fuse_pattern=str(entry["fused_op"]),
        priority=int(entry.get("priority", 0)),
        benefit_threshold=entry.get("benefit_threshold"),
        presets=tuple(entry.get("presets", ())),
        tolerance=float(entry.get("tolerance", defaults.FUSION_COSINE)),
        exported=tuple(entry.get("exported", ())),
        doc=str(entry.get("doc", "")),
        checks=checks,
        horizontal=str(entry.get("horizontal", "")),
        min_branches=int(entry.get("min_branches", 2)),
    )


def load_rule_text(text: str, path: str = "<string>") -> RuleSet:
    """Parse rule-file text. Raises :class:`RuleFileError` naming ``path``, line and problem."""
    root, data = load_yaml_with_nodes(text, path, RuleFileError)
    if not isinstance(data, dict) or "rules" not in data or not isinstance(data["rules"], list):
        raise RuleFileError(f"{path}, line 1: the file must be a mapping with a 'rules' list")
    rules_node = next(v for k, v in root.value if k.value == "rules")
    rules: list[FusionRule] = []
    seen: dict[str, int] = {}
    for entry, node in zip(data["rules"], rules_node.value):
        line = node.start_mark.line + 1
        rule = _rule_from_mapping(entry, line, path)
        if rule.name in seen:
            raise RuleFileError(
                f"{path}, line {line}: rule name {rule.name!r} already used on line "
                f"{seen[rule.name]}"
            )
        seen[rule.name] = line
        rules.append(rule)
    return RuleSet(tuple(rules))


def load_rule_file(path: str | os.PathLike[str]) -> RuleSet:
    """Load a YAML rule file (see the module docstring for the schema)."""
    text = read_yaml_file(path, RuleFileError, "rule file")  # bounded size, UTF-8
    return load_rule_text(text, str(path))


def _clip(v: Any) -> str:
    """A short repr of ``v`` for messages (a hostile value may be huge)."""
    return reprlib.repr(v)
