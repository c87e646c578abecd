"""Generated kernels inside onnxruntime: planned groups with no contrib operator become custom
operators of the ``ai.graph_autofusion`` domain, in one library per model.

    include = ort_include_dir()                   # None: no onnxruntime_c_api.h here
    groups = plan_groups(work, analysis)          # the planned groups the wrapper can call
    built = build_library([g.kernel for g in groups], options.codegen)
    register_library(built.path, op_names)        # ort_session() registers it for our ops
    lowered = apply_groups(model, groups)         # one custom node per group

The header comes from Debian's ``libonnxruntime-dev`` (``tools/ort_headers.sh``, run by
``make``, unpacks it into ``.cache/ort-headers``); ``$GRAPH_AUTOFUSION_ORT_INCLUDE`` names
another folder. The library is built with the kernel cache of
:mod:`graph_autofusion.codegen.compiler`; the C is
:mod:`graph_autofusion.codegen.ort_customop_c`.

A group's leading contraction (a ``MatMul`` prologue) and run-time-shaped ``Reshape`` stay
ordinary onnxruntime nodes feeding the custom operator, so a MatMul epilogue runs on
onnxruntime's GEMM and then the generated kernel.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graph_autofusion import defaults, env, reasons
from graph_autofusion.codegen.call_plan import finalize_kernel, sample_shape
from graph_autofusion.codegen.compiler import (
    BuiltSource,
    CodegenOptions,
    CompilerNotFoundError,
    KernelCompileError,
    compile_source,
)
from graph_autofusion.codegen.kernel_ir import Kernel
from graph_autofusion.codegen.lower import (
    CONTRACTIONS,
    GroupLowering,
    KernelReason,
    KernelRefused,
    lower_group,
)
from graph_autofusion.codegen.lower.common import VIEW_OPS
from graph_autofusion.codegen.onnxruntime import Lowered, external_inputs
from graph_autofusion.codegen.ort_customop_c import (
    DOMAIN,
    customop_library_source,
    op_name,
    wrapper_refusal,
)
from graph_autofusion.codegen.ort_customop_registry import (
    META_DOMAIN,
    META_LIBRARY,
    check_loads,
    custom_ops_of,
    library_for,
    library_ops,
    library_path_from_metadata,
    meta_for,
    register_library,
)
from graph_autofusion.codegen.ort_customop_save import (
    KERNEL_DIR_FORMAT,
    LIBRARY_NAME,
    kernel_dir_for,
    load_line,
    save_with_library,
    write_kernel_dir,
)
from graph_autofusion.codegen.ort_gelu import OPS as GELU_OPS
from graph_autofusion.codegen.ort_gemv import OP as GEMV_OP
from graph_autofusion.codegen.ort_gemv_f16 import OP as GEMV_F16_OP
from graph_autofusion.codegen.ort_gemv_q import OP as GEMV_Q_OP
from graph_autofusion.codegen.targets import CpuTarget, candidate_nodes_outputs
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.matcher import Match
from graph_autofusion.patterns.rewrite import fuse_match
from graph_autofusion.patterns.rules import RuleMatch, RuleSet

__all__ = [
    "CustomOpBuildError",
    "CustomOpCodegenOptions",
    "CustomOpGroup",
    "CustomOpLibrary",
    "CustomOpReason",
    "ENV_CFLAGS",
    "HEADER",
    "KERNEL_DIR_FORMAT",
    "LIBRARY_NAME",
    "META_DOMAIN",
    "META_LIBRARY",
    "NO_HEADER",
    "apply_groups",
    "build_library",
    "check_loads",
    "custom_ops_of",
    "customop_options",
    "group_refusal",
    "kernel_dir_for",
    "kernel_target",
    "library_for",
    "library_ops",
    "library_path_from_metadata",
    "load_line",
    "meta_for",
    "ort_include_dir",
    "plan_groups",
    "register_library",
    "save_with_library",
    "write_kernel_dir",
]


#: ``$GRAPH_AUTOFUSION_CUSTOM_OP_CFLAGS``: extra compiler flags for the custom-operator
#: library only (``-DGAF_BREAK`` style flags to test the fallback of a failing build).
ENV_CFLAGS = env.CUSTOM_OP_CFLAGS
#: The hand-written operators a library built with ``gemv=True`` defines.
BUILTIN_OPS = (GEMV_OP, GEMV_F16_OP, GEMV_Q_OP, *GELU_OPS)


HEADER = "onnxruntime_c_api.h"


NO_HEADER = "onnxruntime C API header not available"


class CustomOpReason:
    """Why a planned group is not a custom operator (reason codes, docs/reasons.md)."""

    NO_HEADER = reasons.CUSTOMOP_NO_HEADER
    WRAPPER = reasons.CUSTOMOP_UNSUPPORTED
    NATIVE_PREFERRED = reasons.CUSTOMOP_NATIVE_PREFERRED
    BUILD_FAILED = reasons.CUSTOMOP_BUILD_FAILED
    LOAD_FAILED = reasons.CUSTOMOP_LOAD_FAILED


class CustomOpBuildError(GraphAutoFusionError):
    """The custom-operator library could not be built or loaded."""


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def ort_include_dir() -> str | None:
    """The folder holding ``onnxruntime_c_api.h``, or ``None``.

    Looked up in ``$GRAPH_AUTOFUSION_ORT_INCLUDE`` (an empty value: none), the project's
    ``.cache/ort-headers/include/onnxruntime`` (``tools/ort_headers.sh``), the virtual
    environment's ``include/onnxruntime`` and the system's ``/usr/include/onnxruntime``."""
    given = env.ort_include()
    if given is not None:
        return given if given and os.path.isfile(os.path.join(given, HEADER)) else None
    import sys

    candidates = [
        _repo_root() / ".cache" / "ort-headers" / "include" / "onnxruntime",
        Path(sys.prefix) / ".cache" / "ort-headers" / "include" / "onnxruntime",
        Path(sys.prefix) / "include" / "onnxruntime",
        Path("/usr/include/onnxruntime"),
        Path("/usr/local/include/onnxruntime"),
    ]
    for c in candidates:
        if (c / HEADER).is_file():
            return str(c)
    return None


@dataclass(frozen=True)
class CustomOpCodegenOptions(CodegenOptions):
    """:class:`CodegenOptions` for the custom-operator library: the C API header's folder and
    ``-fopenmp-simd`` instead of ``-fopenmp`` (no second thread pool inside onnxruntime)."""

    include_dir: str = ""

    def flags(self) -> list[str]:
        out = [f for f in super().flags() if f != "-fopenmp"]
        out.insert(0, "-fopenmp-simd")
        if self.include_dir:
            out.append(f"-I{self.include_dir}")
        return out


def customop_options(base: CodegenOptions | None = None) -> CustomOpCodegenOptions:
    """The library's compile options from the kernels' (raises :class:`CustomOpBuildError`
    without the header)."""
    include = ort_include_dir()
    if include is None:
        raise CustomOpBuildError(f"{NO_HEADER} (run `make` or sh tools/ort_headers.sh)")
    base = base or CodegenOptions()
    extra = tuple(base.extra_flags) + env.custom_op_cflags()
    return CustomOpCodegenOptions(
        compiler=base.compiler,
        opt_level=base.opt_level,
        march=base.march,
        vector_width=base.vector_width,
        parallel_min_elements=base.parallel_min_elements,
        extra_flags=extra,
        include_dir=include,
    )


@dataclass(frozen=True)
class CustomOpLibrary:
    """A built custom-operator library."""

    path: str
    source_path: str
    ops: tuple[str, ...]
    kernels: tuple[Kernel, ...]
    options: CustomOpCodegenOptions
    from_cache: bool
    compile_s: float


def build_library(
    kernels: Sequence[Kernel], base: CodegenOptions | None = None, *, gemv: bool = False
) -> CustomOpLibrary:
    """Compile ``kernels`` (finalized) and their operators into one library (cached);
    ``gemv``: with the hand-written operators (:data:`BUILTIN_OPS`): the few-row ``Gemv``
    family (:mod:`graph_autofusion.codegen.ort_gemv`, ``ort_gemv_f16``, ``ort_gemv_q``) and the
    one-pass GELUs (:mod:`graph_autofusion.codegen.ort_gelu`).

    Raises:
        CustomOpBuildError: no header, no compiler, or the compiler failed.
    """

    opts = customop_options(base)
    unique = list({op_name(k): k for k in kernels}.values())
    source = customop_library_source(unique, gemv=gemv)
    try:
        built: BuiltSource = compile_source(source, opts, what="custom-operator library")
    except (KernelCompileError, CompilerNotFoundError) as exc:
        raise CustomOpBuildError(f"custom-operator library failed to build: {exc}") from exc
    ops = tuple(op_name(k) for k in unique) + (BUILTIN_OPS if gemv else ())
    return CustomOpLibrary(
        built.path, built.source_path, ops, tuple(unique), opts, built.from_cache, built.compile_s
    )


@dataclass
class CustomOpGroup:
    """One planned group as one custom operator."""

    key: str
    rule: str
    node_names: list[str]  # the nodes the operator replaces (the prologue excluded)
    prologue: list[str]  # nodes kept as onnxruntime nodes before it
    input_names: list[str]  # the operator's inputs: the kernel's, in order
    output_names: list[str]  # the kernel's outputs, in order
    kernel: Kernel
    tolerance: float = defaults.FUSION_COSINE
    original_nodes: list[str] = field(default_factory=list)  # every node of the group

    @property
    def op(self) -> str:
        return op_name(self.kernel)


def group_refusal(low: Any, nodes: Sequence[Any], outputs: Sequence[Any]) -> str | None:
    """Why a lowered group (a :class:`~graph_autofusion.codegen.lower.GroupLowering`) cannot
    be one custom operator, or ``None``."""
    why = wrapper_refusal(low.kernel)
    if why:
        return why
    if not outputs or not low.kernel.outputs:  # dead code: an operator with no output is invalid
        return "none of the group's values is read (dead code): nothing to compute"
    made_by_prologue = {o.name for n in low.prologue for o in n.outputs}
    kernel_outs = {o.name for o in low.kernel.outputs}
    for v in outputs:
        if v.name not in kernel_outs and v.name not in made_by_prologue:
            return f"output {v.name!r} is not written by the kernel"
    return None


def plan_groups(
    work: Any, analysis: Any, target: Any, *, skip: Iterable[str] = ()
) -> tuple[list[CustomOpGroup], list[tuple[str, str, str, str]]]:
    """The analysis' chosen candidates that have no native rewrite, each as a
    :class:`CustomOpGroup` (kernel finalized on the sample shapes). Returns the groups and
    ``(key, rule, code, message)`` of the chosen ones that cannot be one."""

    skip = set(skip)
    groups: list[CustomOpGroup] = []
    refused: list[tuple[str, str, str, str]] = []
    for ca in analysis.candidates:
        if not ca.chosen or ca.key in skip:
            continue
        item = ca.payload
        if isinstance(item, RuleMatch) and item.rule.rewrite is not None:
            continue  # a native rewrite: lower_onnxruntime's
        rule = ca.source.split(":", 1)[1] if ca.source.startswith("rule:") else ca.source
        try:
            low = target.lower(item, analysis.binding)
            nodes, outputs = candidate_nodes_outputs(item)
            why = group_refusal(low, nodes, outputs)
            if why:
                refused.append((ca.key, rule, CustomOpReason.WRAPPER, why))
                continue
            shapes = [sample_shape(work, analysis.binding, i.name) for i in low.kernel.inputs]
            kernel = finalize_kernel(low.kernel, shapes)
        except KernelRefused as exc:
            refused.append((ca.key, rule, exc.code, exc.message))
            continue
        pro = {n.name for n in low.prologue}
        tol = getattr(getattr(item, "rule", None), "tolerance", defaults.FUSION_COSINE)
        groups.append(
            CustomOpGroup(
                ca.key,
                rule,
                [n.name for n in nodes if n.name not in pro],
                [n.name for n in low.prologue],
                [i.name for i in kernel.inputs],
                [o.name for o in kernel.outputs],
                kernel,
                tol,
                [n.name for n in nodes],
            )
        )
    return groups, refused


def apply_groups(model: Any, groups: Sequence[CustomOpGroup]) -> list[Any]:
    """Rewrite each group on ``model`` into one ``ai.graph_autofusion`` node reading the
    kernel's inputs (a prologue's nodes stay in the graph). Returns ``Lowered`` records; a
    group whose nodes are gone (rewritten by another fusion) is skipped."""

    g = model.graph
    done: list[Any] = []
    for grp in groups:
        by_name = {n.name: n for n in g.nodes}
        values = g.value_map()
        nodes = [by_name.get(n) for n in grp.node_names]
        if any(n is None for n in nodes) or not nodes:
            continue
        if any(n not in values for n in (*grp.input_names, *grp.output_names)):
            continue
        outs = [values[o] for o in grp.output_names]
        ins = [values[i] for i in grp.input_names]
        match = Match(nodes[-1], nodes, {}, {}, outs)

        def rewrite(ctx: Any, ins: list = ins, grp: CustomOpGroup = grp) -> list:
            node = ctx.make_node(grp.op, ins, domain=DOMAIN, num_outputs=len(grp.output_names))
            return list(node.outputs)

        new_nodes = fuse_match(model, match, grp.op, rewrite=rewrite, rule_name=grp.rule)
        # a prologue (a MatMul) stays an onnxruntime node: it is part of what safe mode checks
        # and times against the original group
        kept = [by_name[n] for n in grp.prologue if n in by_name and by_name[n].graph is g]
        new_nodes = kept + list(new_nodes)
        done.append(
            Lowered(
                grp.key,
                grp.rule,
                list(grp.original_nodes),
                new_nodes,
                external_inputs(new_nodes),
                list(grp.output_names),
                [f"{DOMAIN}::{grp.op}"],
                grp.tolerance,
                grp,
            )
        )
    if done:
        model.opset_imports.setdefault(DOMAIN, 1)
    return done


def kernel_target(opset: int = 17) -> Any:
    """The onnxruntime target with custom operators: rule matches with a native rewrite
    become contrib operators as before; every other rule match and automatic cluster is
    planned when the kernel generator and the custom-operator wrapper can hold it."""

    @dataclass
    class OnnxruntimeKernelTarget(CpuTarget):
        name: str = "onnxruntime"
        clustering: bool = True
        native_target: bool = True
        custom_ops: bool = True
        #: id() of the nodes a native rule match covers: onnxruntime's own fused operators
        #: are preferred over a generated kernel holding any of them. A match of layout
        #: operators only (``reshape_transpose_chain``) is not: a kernel reads them as views,
        #: for free, where the native form is at best one layout operator (and often declined);
        #: counting them refused Mamba's whole 57-node scan kernel for three of its nodes.
        native_nodes: set = field(default_factory=set)

        def prefer_native(self, graph: Any, rules: Any) -> None:

            native = RuleSet(tuple(r for r in rules if r.rewrite is not None))
            self.native_nodes = {
                id(n)
                for m in match_rules(graph, native).kept
                if not all(x.op_type in VIEW_OPS for x in m.match.nodes)
                for n in m.match.nodes
            }

        def lower_uncached(self, candidate: Any, binding: Any) -> Any:
            """The group's kernel; contractions reading only values from outside the group
            (SwiGLU's gate and up projections) stay onnxruntime nodes before it."""

            nodes, outputs = candidate_nodes_outputs(candidate)
            try:
                return lower_group(nodes, outputs, binding, name="kernel", opset=self.opset)
            except KernelRefused as exc:
                produced = {id(o) for n in nodes for o in n.outputs}
                lead = [
                    n
                    for n in nodes
                    if n.op_type in CONTRACTIONS
                    and not any(id(v) in produced for v in n.all_inputs())
                    and not any(id(o) in {id(v) for v in outputs} for o in n.outputs)
                ]
                rest = [n for n in nodes if n not in lead]
                if exc.code != KernelReason.CONTRACTION or not lead or not rest:
                    raise
            low = lower_group(rest, outputs, binding, name="kernel", opset=self.opset)
            return GroupLowering(low.kernel, lead + list(low.prologue))

        def refusal(self, candidate: Any, binding: Any) -> tuple[str, str] | None:

            if isinstance(candidate, RuleMatch) and candidate.rule.rewrite is not None:
                return None

            nodes, _outs = candidate_nodes_outputs(candidate)
            # the kernel's own nodes (a leading contraction stays an onnxruntime node)
            # an automatic cluster gives way to any native form of its nodes; a rule match
            # (its author's choice, ranked against native rules by priority) does not
            if not isinstance(candidate, RuleMatch) and any(
                id(n) in self.native_nodes for n in nodes if n.op_type not in CONTRACTIONS
            ):
                return (
                    CustomOpReason.NATIVE_PREFERRED,
                    "an onnxruntime operator (a rule's native form) covers some of its nodes",
                )
            try:
                low = self.lower(candidate, binding)
            except KernelRefused as exc:
                return exc.code, exc.message
            nodes, outs = candidate_nodes_outputs(candidate)
            why = group_refusal(low, nodes, outs)
            return (CustomOpReason.WRAPPER, f"no custom operator: {why}") if why else None

    return OnnxruntimeKernelTarget(opset=opset)
