"""Every reason code the tool reports, with its one-sentence meaning, in one place.

A reason code says why a match failed, why two operators do not fuse, why the cost model or
the planner left a candidate out, why a target did not lower a planned fusion, and why safe
mode rolled one back. Modules import the constants below (``reasons.NUMERICS``); the classes
that group them by stage (``matcher.Reason``, ``pairs.PairReason``, ``plan.PlanReason``,
``onnxruntime.LowerReason``, ``lower.KernelReason``, ``ort_customop.CustomOpReason``, the cost
model's ``Verdict``) are views of these. :data:`CODES` maps each code to its
:class:`ReasonCode` (stage and meaning); ``docs/reasons.md`` and the user guide list them from
here, and ``tests/test_reasons.py`` checks that no other code is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CODES", "STAGES", "ReasonCode", "by_stage", "meaning"]


@dataclass(frozen=True)
class ReasonCode:
    """One code: its text, the stages that report it and what it means."""

    code: str
    stages: tuple[str, ...]
    meaning: str


#: The stages, in pipeline order, with what their codes explain.
STAGES: dict[str, str] = {
    "matcher": "why a rule's pattern did not match at a node",
    "pairs": "whether a producer and its consumer can share one kernel (automatic clustering)",
    "clustering": "why two groups were not merged into one cluster",
    "cost": "the cost model's verdict on one candidate",
    "planner": "why the planner left a candidate out of the plan",
    "controls": "why a fusion control (F17) turned a candidate off",
    "onnxruntime": "why a planned fusion was not lowered to an onnxruntime operator",
    "codegen": "why a group cannot become a generated kernel (cpu target)",
    "customop": "why a planned group did not become a generated custom operator",
    "safe-mode": "why safe mode rolled a fusion back (or ok when it passed)",
}

#: code -> its :class:`ReasonCode`
CODES: dict[str, ReasonCode] = {}


def _define(code: str, stage: str, meaning: str) -> str:
    assert stage in STAGES, stage
    old = CODES.get(code)
    stages = (*old.stages, stage) if old is not None else (stage,)
    CODES[code] = ReasonCode(code, stages, old.meaning if old is not None else meaning)
    return code


# ---------------------------------------------------------------- matcher
OP_MISMATCH = _define(
    "op-mismatch", "matcher", "A node has another operator type than the pattern asks."
)
NO_PRODUCER = _define(
    "no-producer",
    "matcher",
    "The pattern wants an operator where the graph has an input or an initializer.",
)
OUTPUT_INDEX = _define(
    "output-index", "matcher", "The value is another output of its producer than the pattern reads."
)
ARITY = _define(
    "arity",
    "matcher",
    "The node has another number of inputs than the pattern, or a needed input is omitted.",
)
ATTR_MISMATCH = _define(
    "attr-mismatch",
    "matcher",
    "An attribute fails its constraint (axis=2 where the pattern wants -1).",
)
DTYPE = _define("dtype", "matcher", "A variable's element type is not one the pattern accepts.")
RANK = _define("rank", "matcher", "A variable's rank or last dimension differs from the pattern's.")
DYNAMIC_SHAPE = _define(
    "dynamic-shape",
    "matcher",
    "A static shape is required and the value has symbolic or unknown dims.",
)
NOT_CONSTANT = _define(
    "not-constant", "matcher", "A constant is required and the value is computed at run time."
)
VALUE_MISMATCH = _define(
    "value-mismatch",
    "matcher",
    "A constant's value or element count differs (a scale that is not sqrt(head_dim)).",
)
BINDING_CONFLICT = _define(
    "binding-conflict", "matcher", "One pattern variable would bind two different values."
)
CHECK_FAILED = _define(
    "check-failed", "matcher", "A rule's own check rejected the match; its sentence says why."
)
EXTERNAL_USER = _define(
    "external-user",
    "matcher",
    "A value inside the match is read outside it (or is a graph output) and is not exported.",
)
NOT_CONVEX = _define(
    "not-convex",
    "matcher",
    "Fusing the nodes would create a cycle (a path leaves the group and comes back).",
)
TOO_FEW_SIBLINGS = _define(
    "too-few-siblings",
    "matcher",
    "Fewer sibling branches share the input than the horizontal rule's min_branches.",
)

# ---------------------------------------------------------------- operator pairs, clustering
LOOP_FUSION = _define(
    "loop-fusion", "pairs", "Elementwise or layout producer and consumer run in one loop."
)
REDUCTION_PROLOGUE = _define(
    "reduction-prologue",
    "pairs",
    "An elementwise or layout operator feeding a reduction runs before it in its kernel.",
)
REDUCTION_EPILOGUE = _define(
    "reduction-epilogue",
    "pairs",
    "An elementwise or layout operator reads a reduction's result in the same kernel.",
)
CONTRACTION_EPILOGUE = _define(
    "contraction-epilogue",
    "pairs",
    "An elementwise operator runs on a MatMul, Gemm or Conv output in its kernel.",
)
HAS_SUBGRAPH = _define(
    "has-subgraph", "pairs", "The node carries a subgraph (If, Loop, Scan) and is never fused."
)
UNKNOWN_OP = _define(
    "unknown-op",
    "pairs",
    "The operator is not in the catalog (a custom domain) and is treated as opaque.",
)
OPAQUE_OP = _define(
    "opaque-op",
    "pairs",
    "A known opaque operator (control flow, an RNN operator, TopK, CumSum) keeps its own kernel.",
)
DATA_MOVEMENT = _define(
    "data-movement",
    "pairs",
    "Gather, Concat, Split, Pad, Shape, Constant and the like keep their own kernel.",
)
TWO_CONTRACTIONS = _define("two-contractions", "pairs", "Two contractions would share one kernel.")
CONTRACTION_PROLOGUE = _define(
    "contraction-prologue", "pairs", "A node would run before the contraction in its group."
)
NOT_ELEMENTWISE_EPILOGUE = _define(
    "not-elementwise-epilogue",
    "pairs",
    "A contraction's epilogue would hold a layout operator or a reduction.",
)
REDUCE_AFTER_REDUCE = _define(
    "reduce-after-reduce", "pairs", "A reduction would read another reduction's output directly."
)
_define(NOT_CONVEX, "clustering", "")
MAX_NODES = _define(
    "max-nodes",
    "clustering",
    "The merged group would exceed the cluster node limit (max_cluster_nodes, default 64).",
)
MAX_INPUTS = _define(
    "max-inputs",
    "clustering",
    "The merged group would read more external values than max_cluster_inputs (default 8).",
)
REDUCTION_MISMATCH = _define(
    "reduction-mismatch",
    "clustering",
    "Reductions over different shapes or axes, or a shape is unknown.",
)
LOOP_SHAPE = _define(
    "loop-shape",
    "clustering",
    "The groups compute over shapes that do not broadcast together (one loop nest cannot run both).",
)

# ---------------------------------------------------------------- cost model verdicts
FUSE = _define(
    "fuse", "cost", "The estimated relative saving reaches the benefit threshold: worth fusing."
)
SKIP_LOW_BENEFIT = _define(
    "skip-low-benefit",
    "cost",
    "The estimated saving is below the benefit threshold (the rule's own or the global one).",
)
SKIP_LOCAL_MEMORY_OVERFLOW = _define(
    "skip-local-memory-overflow",
    "cost",
    "The fused kernel's intermediates do not fit the on-chip local memory of the profile.",
)
MAYBE = _define(
    "maybe",
    "cost",
    "The estimate is uncertain (unknown shapes or costs); only a measurement can decide.",
)

# ---------------------------------------------------------------- planner and analysis
CHOSEN = _define("chosen", "planner", "The planner chose the candidate.")
ILLEGAL = _define(
    "illegal", "planner", "A legality check refused the candidate and gave no more specific code."
)
OVERLAP = _define(
    "overlap",
    "planner",
    "It shares nodes with a chosen candidate; the chosen set has the larger total saving.",
)
JOINT_CYCLE = _define(
    "joint-cycle",
    "planner",
    "Each group is convex, but fusing it together with the chosen ones would create a cycle.",
)
NO_SAVING = _define("no-saving", "planner", "The estimated saving is not positive.")
SAME_AS_RULE = _define(
    "same-as-rule",
    "planner",
    "An automatic cluster with exactly a rule match's nodes: the rule is preferred.",
)
NOT_CHOSEN = _define(
    "not-chosen", "planner", "Left out of the plan with no code of its own (a summary count)."
)
NOT_IN_SAVED_PLAN = _define(
    "not-in-saved-plan",
    "planner",
    "A saved plan (load_fused) replaced the planner's choice, and it does not fuse the candidate.",
)

# ---------------------------------------------------------------- fusion controls (F17)
PRECISION_CONSTRAINT = _define(
    "precision-constraint",
    "controls",
    "The fusion would compute an operator kept in float32 (keep_fp32) in half precision.",
)
SIZE_SWITCH_OFF = _define(
    "size-switch-off",
    "controls",
    "A size switch turned the rule off: the sample inputs' size fails its condition.",
)

# ---------------------------------------------------------------- onnxruntime target
NO_NATIVE_FORM = _define(
    "no-native-form",
    "onnxruntime",
    "The rule has no onnxruntime operator; onnxruntime would run its generic form unfused, so it is left unfused.",
)
NATIVE_DECLINED = _define(
    "native-declined",
    "onnxruntime",
    "The rule's native rewrite does not apply to this instance (a bias that is not 1-D for BiasGelu).",
)
NEEDS_CODEGEN = _define(
    "needs-codegen",
    "onnxruntime",
    "An automatic cluster: no onnxruntime operator computes it; it needs a kernel-generating target.",
)
STALE = _define("stale", "onnxruntime", "Its nodes were already rewritten by another fusion.")
REWRITE_ERROR = _define(
    "rewrite-error", "onnxruntime", "The native rewrite raised; the graph is unchanged by it."
)

# ---------------------------------------------------------------- cpu target: generated kernels
CODEGEN_UNSUPPORTED_OP = _define(
    "codegen-unsupported-op",
    "codegen",
    "An operator the kernel IR cannot express (Gather of run-time indices, TopK, a contrib operator).",
)
CODEGEN_UNSUPPORTED_DTYPE = _define(
    "codegen-unsupported-dtype",
    "codegen",
    "A dtype the kernels do not take (float64, int8) or an operation whose meaning would change (integer Div).",
)
CODEGEN_UNKNOWN_SHAPE = _define(
    "codegen-unknown-shape",
    "codegen",
    "A value of the group has no concrete shape under the sample inputs.",
)
CODEGEN_LAYOUT_INSIDE = _define(
    "codegen-layout-inside-group",
    "codegen",
    "A layout operator the kernel cannot express as index arithmetic.",
)
CODEGEN_REDUCTION_MISMATCH = _define(
    "codegen-reduction-mismatch",
    "codegen",
    "Reductions over different axes in one group, or a reduction without keepdims read inside it.",
)
CODEGEN_BROADCAST = _define(
    "codegen-broadcast",
    "codegen",
    "The group's shapes do not broadcast to one loop shape, or a reduced axis is broadcast.",
)
CODEGEN_OUTPUT_SHAPE = _define(
    "codegen-output-shape",
    "codegen",
    "An output is neither the loop shape nor one value per row, or the group computes nothing.",
)
CODEGEN_CONTRACTION_NOT_FIRST = _define(
    "codegen-contraction-not-first",
    "codegen",
    "A MatMul, Gemm or Conv inside the group that is not its first node.",
)
CODEGEN_COMPILE_FAILED = _define(
    "codegen-compile-failed",
    "codegen",
    "The C compiler rejected the kernel; it is rolled back alone with the compiler's message.",
)

# ---------------------------------------------------------------- custom operators
CUSTOMOP_NO_HEADER = _define(
    "customop-no-header",
    "customop",
    "The onnxruntime C API header is not installed, so no custom-operator library can be built.",
)
CUSTOMOP_UNSUPPORTED = _define(
    "customop-unsupported",
    "customop",
    "The group's kernel has no custom-operator wrapper (its inputs or outputs are not supported).",
)
CUSTOMOP_NATIVE_PREFERRED = _define(
    "customop-native-preferred",
    "customop",
    "The group has a native onnxruntime operator, which is preferred.",
)
CUSTOMOP_BUILD_FAILED = _define(
    "customop-build-failed", "customop", "The custom-operator library did not compile."
)
CUSTOMOP_LOAD_FAILED = _define(
    "customop-load-failed", "customop", "The custom-operator library did not load in onnxruntime."
)

# ---------------------------------------------------------------- safe mode (F13)
OK = _define("ok", "safe-mode", "Every check passed; the fusion is kept.")
NUMERICS = _define(
    "numerics",
    "safe-mode",
    "A fused output's cosine similarity with the original, on the real activations, is below the floor.",
)
FP16_OVERFLOW = _define(
    "fp16-overflow",
    "safe-mode",
    "A float16 value inside the fusion would exceed 65504, or the fused output has inf/nan where the original has none.",
)
MONTE_CARLO = _define(
    "monte-carlo",
    "safe-mode",
    "With the inputs perturbed within their range, a sample fell below the floor.",
)
ALIAS = _define(
    "alias",
    "safe-mode",
    "The fusion would read a value after an in-place write, or writes a value it reads.",
)
SLOWER = _define(
    "slower",
    "safe-mode",
    "The fused operator is slower than the subgraph it replaces on the real shapes (confirmed twice).",
)
ERROR = _define(
    "error",
    "safe-mode",
    "The check could not run (an activation was not captured, a subgraph did not build).",
)
OTHER_SHAPE = _define(
    "other-shape",
    "safe-mode",
    "The fused model differs from the original, or fails, on inputs of another shape (batch 2, another length), and this fusion's own check fails there; it alone is rolled back.",
)
END_TO_END = _define(
    "end-to-end",
    "safe-mode",
    "The whole fused model differs from the original on the sample inputs; every fusion is rolled back.",
)

#: Rollback codes that drop one fusion but are not numerical failures (progressive fusion
#: keeps going past them).
NOT_A_FAILURE = frozenset({SLOWER})


def meaning(code: str) -> str:
    """The one-sentence meaning of ``code`` (``KeyError`` for a code that is not defined)."""
    return CODES[code].meaning


def by_stage() -> dict[str, list[ReasonCode]]:
    """The codes grouped by stage, in :data:`STAGES` order (a code of two stages is in both)."""
    out: dict[str, list[ReasonCode]] = {s: [] for s in STAGES}
    for rc in CODES.values():
        for s in rc.stages:
            out[s].append(rc)
    return out
