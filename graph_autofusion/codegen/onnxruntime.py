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

import numpy as np

from graph_autofusion import defaults, reasons
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.patterns.candidates import RuleMatch
from graph_autofusion.patterns.rewrite import RewriteError, fuse_match

TARGET = "onnxruntime"


class LowerReason:
    """Why a planned fusion was not lowered for onnxruntime."""

    NO_NATIVE_RULE = reasons.NO_NATIVE_FORM  # the rule has no onnxruntime operator
    DECLINED = reasons.NATIVE_DECLINED  # the native rewrite does not apply to this instance
    CLUSTER = reasons.NEEDS_CODEGEN  # an automatic cluster: no operator exists for it
    STALE = reasons.STALE  # its nodes were already rewritten by another fusion
    ERROR = reasons.REWRITE_ERROR  # the rewrite raised; the graph is unchanged by it


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
    tolerance: float = defaults.FUSION_COSINE
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


def external_inputs(nodes: Sequence[Node]) -> list[str]:
    produced = {id(o) for n in nodes for o in n.outputs}
    seen: dict[str, None] = {}
    for n in nodes:
        for v in n.all_inputs():
            if id(v) not in produced and not v.is_const:
                seen.setdefault(v.name, None)
    return list(seen)


def prune_dead_feeders(work: Model, values: Sequence[Value]) -> int:
    """Remove the nodes that computed ``values`` (what a fusion read) and that nothing reads
    any more, recursively: a native form that reads a tensor upstream of the match (the
    attention lowering skips a grouped-query repeat) leaves them dead. Returns the count."""
    graph, removed = work.graph, 0
    stack = [v.producer for v in values if v is not None and v.producer is not None]
    while stack:
        node = stack.pop()
        if node.graph is not graph or node.captures:
            continue
        if any(out.users or graph.is_output(out) for out in node.outputs):
            continue
        feeders = [v.producer for v in node.inputs if v is not None and v.producer is not None]
        graph.remove_node(node)
        removed += 1
        stack.extend(feeders)
    return removed


def _input_key(v: Value | None) -> Any:
    if v is None:
        return None
    if v.const is not None and v.const.size <= 64:
        return ("const", str(v.const.dtype), v.const.shape, v.const.tobytes())
    return id(v)


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(_attr_key(x) for x in value)
    return value if isinstance(value, int | float | str | bytes | None) else id(value)


def share_created(work: Model, lowered: Sequence[Lowered]) -> int:
    """Merge identical nodes the lowerings created (same operator, attributes and inputs,
    small constant inputs compared by value): rewrites that each derive the same helper
    tensor (the rotary lowering's half tables, one per layer) compute it once. Run after each
    fusion was verified on its own nodes. Returns the number of nodes removed."""
    graph, seen, removed = work.graph, {}, 0
    created = {n for low in lowered for n in low.new_nodes if n.graph is graph}
    for node in graph.nodes:  # topological: a node's inputs are merged before it is seen
        if node not in created or node.captures or not node.outputs:
            continue
        key = (
            node.domain,
            node.op_type,
            len(node.outputs),
            tuple(_input_key(v) for v in node.inputs),
            tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())),
        )
        first = seen.setdefault(key, node)
        if first is node or any(graph.is_output(o) for o in node.outputs):
            continue
        for old, new in zip(node.outputs, first.outputs):
            graph.replace_all_uses_with(old, new)
        graph.remove_node(node)
        removed += 1
    if removed:
        drop_dead_initializers(work)
    return removed


def drop_dead_initializers(model: Model) -> None:
    """Remove initializers nothing reads any more (a folded weight, a flattened bias, a
    merged constant); graph inputs and outputs stay."""
    g = model.graph
    inputs = {v.name for v in g.inputs}
    for name in [k for k, v in g.initializers.items() if not v.users and not g.is_output(v)]:
        if name not in inputs:
            g.remove_initializer(name)


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
        read = match.inputs()
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
        prune_dead_feeders(work, read)
        # an exported output nobody reads may be dropped by the rewrite: verify what remains
        outputs = [o for o in outputs if work.graph.has_value_name(o)]
        result.lowered.append(
            Lowered(
                key,
                rule.name,
                names,
                new_nodes,
                external_inputs(new_nodes),
                outputs,
                [n.qualified_op for n in new_nodes],
                rule.tolerance,
                item,
            )
        )
    return result
