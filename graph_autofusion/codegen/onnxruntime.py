"""The onnxruntime target (F11): lower planned fusions to operators onnxruntime runs fused.

A fusion is lowered only through its rule's native rewrite: a ``com.microsoft`` contrib
operator (SkipLayerNormalization, BiasGelu, FastGelu, QuickGelu, FusedGemm, FusedConv,
SkipSimplifiedLayerNormalization, ...) or a folded standard rewrite (Conv with BatchNorm folded
into its weights, Q/K/V weights concatenated into one MatMul and a Split, Dropout removed).
A fusion with no runtime-native form stays unfused for this target, with the reason: its
generic form (a local function) would be inlined by onnxruntime and run exactly as before, so
calling it fused would be a lie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion.ir.core import Model, Node
from graph_autofusion.patterns.candidates import RuleMatch
from graph_autofusion.patterns.rewrite import RewriteError, fuse_match

TARGET = "onnxruntime"


class LowerReason:
    """Why a planned fusion was not lowered for onnxruntime."""

    NO_NATIVE_RULE = "no-native-form"  # the rule has no onnxruntime operator
    DECLINED = "native-declined"  # the native rewrite does not apply to this instance
    CLUSTER = "needs-codegen"  # an automatic cluster: no operator exists for it
    STALE = "stale"  # its nodes were already rewritten by another fusion
    ERROR = "rewrite-error"  # the rewrite raised; the graph is unchanged by it


@dataclass
class Lowered:
    """One fusion applied to the working model."""

    key: str
    rule: str
    original_node_names: list[str]
    new_nodes: list[Node]
    inputs: list[str]  # activation values the new nodes read (not constants)
    outputs: list[str]  # values they produce, same names as the values they replace
    fused_ops: list[str]  # the operators that now compute it
    tolerance: float = 0.999
    payload: Any = None


@dataclass
class NotLowered:
    key: str
    rule: str
    code: str
    message: str


@dataclass
class Lowering:
    lowered: list[Lowered] = field(default_factory=list)
    not_lowered: list[NotLowered] = field(default_factory=list)


def candidate_key(rule_name: str, root: Node) -> str:
    """Display key of a rule match: ``rule@root-node``."""
    return f"{rule_name}@{root.name}"


def _external_inputs(nodes: Sequence[Node]) -> list[str]:
    produced = {id(o) for n in nodes for o in n.outputs}
    seen: dict[str, None] = {}
    for n in nodes:
        for v in n.all_inputs():
            if id(v) not in produced and not v.is_const:
                seen.setdefault(v.name, None)
    return list(seen)


def lower_onnxruntime(work: Model, chosen: Sequence[Any]) -> Lowering:
    """Apply ``chosen`` fusions (``RuleMatch`` objects, or clusters) to ``work`` in place.

    Returns what was lowered (with the names needed to verify each fusion on the original
    model) and what stays unfused, with reason codes.
    """
    result = Lowering()
    for item in chosen:
        if not isinstance(item, RuleMatch):
            kind = getattr(item, "kind", "cluster")
            root = item.nodes[-1].name if getattr(item, "nodes", None) else "?"
            result.not_lowered.append(
                NotLowered(
                    f"cluster:{kind}@{root}",
                    f"cluster:{kind}",
                    LowerReason.CLUSTER,
                    "an automatic cluster has no onnxruntime operator; it needs a kernel "
                    "generator target",
                )
            )
            continue
        rule, match = item.rule, item.match
        key = candidate_key(rule.name, match.root)
        if rule.rewrite is None:
            result.not_lowered.append(
                NotLowered(
                    key,
                    rule.name,
                    LowerReason.NO_NATIVE_RULE,
                    f"{rule.fuse_pattern} has no onnxruntime-native operator (its generic "
                    f"local function would be inlined and run unfused)",
                )
            )
            continue
        names = [n.name for n in match.nodes]
        outputs = [v.name for v in match.outputs]
        try:
            new_nodes = fuse_match(
                work, match, rule.fuse_pattern, rewrite=rule.rewrite, rule_name=rule.name
            )
        except RewriteError as exc:
            code = (
                LowerReason.STALE
                if "no longer in the graph" in str(exc)
                else (LowerReason.DECLINED)
            )
            result.not_lowered.append(NotLowered(key, rule.name, code, str(exc)))
            continue
        except Exception as exc:  # a bug in a native rewrite must not break the model
            result.not_lowered.append(
                NotLowered(key, rule.name, LowerReason.ERROR, f"{type(exc).__name__}: {exc}")
            )
            continue
        # an exported output nobody reads may be dropped by the rewrite: verify what remains
        outputs = [o for o in outputs if work.graph.has_value_name(o)]
        result.lowered.append(
            Lowered(
                key,
                rule.name,
                names,
                new_nodes,
                _external_inputs(new_nodes),
                outputs,
                [n.qualified_op for n in new_nodes],
                rule.tolerance,
                item,
            )
        )
    return result
