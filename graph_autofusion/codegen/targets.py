"""Targets: what each one can execute, so the planner plans only that.

    target = get_target("cpu")
    target.select_rules(rules)          # the rules whose matches it can run fused
    target.clustering                   # whether automatic clusters can be executed
    target.refusal(candidate, binding)  # None, or (reason code, sentence) at planning time

``analyze()`` and ``fuse()`` use the same target object, so the plan a user reads is the plan
that ``fuse()`` carries out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graph_autofusion.codegen.lower import GroupLowering, KernelReason, KernelRefused, lower_group
from graph_autofusion.errors import OptionsError
from graph_autofusion.patterns.rules import RuleMatch, RuleSet

#: the targets :func:`get_target` knows (``FuseOptions.target``)
TARGET_NAMES = ("onnxruntime", "cpu")


def candidate_nodes_outputs(candidate: Any) -> tuple[list, list]:
    if isinstance(candidate, RuleMatch):
        return list(candidate.match.nodes), list(candidate.match.outputs)
    return list(candidate.nodes), list(candidate.outputs)


@dataclass
class OnnxruntimeTarget:
    """Fusions become operators onnxruntime ships (contrib operators, folded rewrites)."""

    name: str = "onnxruntime"
    clustering: bool = False
    native_target: bool = True

    def select_rules(self, rules: RuleSet) -> RuleSet:
        return RuleSet(tuple(r for r in rules if r.rewrite is not None))

    def refusal(self, candidate: Any, binding: Any) -> tuple[str, str] | None:
        return None


@dataclass
class CpuTarget:
    """Fused groups become generated C kernels; everything else runs on torch's kernels."""

    opset: int = 17
    name: str = "cpu"
    clustering: bool = True
    native_target: bool = False
    lowered: dict[int, GroupLowering | KernelRefused] = field(default_factory=dict)

    def select_rules(self, rules: RuleSet) -> RuleSet:
        return rules

    def lower(self, candidate: Any, binding: Any) -> GroupLowering:
        """The candidate's kernel (cached per candidate object).

        Raises:
            KernelRefused: the group cannot be one kernel.
        """
        got = self.lowered.get(id(candidate))
        if got is None:
            try:
                got = self.lower_uncached(candidate, binding)
            except KernelRefused as exc:
                got = exc
            self.lowered[id(candidate)] = got
        if isinstance(got, KernelRefused):
            raise got
        return got

    def lower_uncached(self, candidate: Any, binding: Any) -> GroupLowering:
        """The candidate's kernel, uncached (a target that lowers differently overrides it).

        Raises:
            KernelRefused: the group cannot be one kernel.
        """
        nodes, outputs = candidate_nodes_outputs(candidate)
        low = lower_group(nodes, outputs, binding, name="kernel", opset=self.opset)
        written = {o.name for o in low.kernel.outputs}
        for v in outputs:  # the torch runner's fused step returns the kernel's outputs only
            if v.name not in written:
                raise KernelRefused(
                    KernelReason.OUTPUT_SHAPE,
                    f"output {v.name!r} is a group input or a view of one: nothing to compute",
                )
        return low

    def refusal(self, candidate: Any, binding: Any) -> tuple[str, str] | None:
        try:
            self.lower(candidate, binding)
        except KernelRefused as exc:
            if native_form(candidate):
                return None
            return exc.code, exc.message
        return None


#: Fused patterns whose rule's native rewrite the cpu target applies: what the rewrite
#: produces torch runs as one call with its epilogue in place (a Conv with a
#: BatchNormalization folded into its weights; ``FusedConv``: then the residual add and the
#: activation on the conv's own output).
TORCH_NATIVE_OPS = frozenset(
    {
        ("com.microsoft", "FusedConv"),
        ("", "ConvBatchNorm"),
        ("", "DepthwiseConvBatchNorm"),
    }
)


def native_form(candidate: Any) -> bool:
    """True for a rule match the cpu target runs as its rule's native rewrite (a group no
    kernel can hold, a contraction other than MatMul, whose fused operator torch runs well)."""
    if not isinstance(candidate, RuleMatch) or candidate.rule.rewrite is None:
        return False
    rule = candidate.rule
    return (rule.fused_domain, rule.fuse_pattern) in TORCH_NATIVE_OPS


def get_target(name: str, *, opset: int = 17) -> Any:
    if name == "onnxruntime":
        return OnnxruntimeTarget()
    if name == "cpu":
        return CpuTarget(opset=opset)
    raise OptionsError(f"unknown target {name!r}; known: {list(TARGET_NAMES)}")
