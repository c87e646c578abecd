"""The onnxruntime target's custom operators inside :func:`graph_autofusion.pipeline.fuse_model`.

    state = CustomOps.start(options)          # None: off, or no header (a note says why)
    state.prepare(work, analysis, target)     # groups, one library built and loaded
    state.lower(model, keys)                  # the groups (or those with these keys) applied
    state.finish(result)                      # the library of the groups that survived

Every planned group without a contrib operator that the kernel generator and the wrapper can
hold becomes an ``ai.graph_autofusion`` node (:mod:`graph_autofusion.codegen.ort_customop`),
every ``MatMul`` by a constant weight with a dynamic row count becomes an ``If`` between
the few-row ``Gemv`` operator and onnxruntime's GEMM (:mod:`graph_autofusion.codegen.
ort_matmul`), and a fusion whose native form is onnxruntime's ``BiasGelu``, ``Gelu`` or
``FastGelu`` gets the one-pass ``GeluErf`` / ``GeluTanh`` in its place (:mod:`graph_autofusion.
codegen.ort_gelu`: 2-3x onnxruntime's speed on a wide activation; safe mode times the fusion
against onnxruntime's own at its ALL level, which makes the same contrib operator, so a slower
one is rolled back to it), as does each GELU node no fusion takes, as its own fusion
(:mod:`graph_autofusion.codegen.ort_gelu_sites`).
Safe mode checks each like any other lowering. A library that fails to build or load makes
the pipeline fuse again without custom operators (:class:`CustomOpsUnavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graph_autofusion.codegen.onnxruntime import Lowered, NotLowered
from graph_autofusion.codegen.ort_customop import (
    BUILTIN_OPS,
    DOMAIN,
    NO_HEADER,
    CustomOpBuildError,
    CustomOpGroup,
    CustomOpLibrary,
    apply_groups,
    build_library,
    check_loads,
    library_ops,
    ort_include_dir,
    plan_groups,
    register_library,
)
from graph_autofusion.codegen.ort_gelu_sites import MS as MS_DOMAIN
from graph_autofusion.codegen.ort_gelu_sites import RULE as GELU_RULE
from graph_autofusion.codegen.ort_gelu_sites import apply_gelu_sites, gelu_form, plan_gelu_sites
from graph_autofusion.codegen.ort_gemv_q import OP as GEMV_Q_OP
from graph_autofusion.codegen.ort_matmul import RULE as GEMV_RULE
from graph_autofusion.codegen.ort_matmul import apply_sites, plan_sites
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.dtypes import DType

#: The fusions the custom-operator stage finds itself (no candidate of the planner's): a saved
#: plan's keys of these rules are applied by :meth:`CustomOps.lower`, not matched to candidates.
SITE_RULES = frozenset({GEMV_RULE, GELU_RULE})
#: The rules' ``fuse_pattern`` of those native forms (the library is built for them).
GELU_PATTERNS = frozenset({"BiasGelu", "Gelu", "FastGelu"})


def site_key(key: str) -> bool:
    """Whether a fusion key (``rule@node``) is one of :data:`SITE_RULES`'."""
    return key.split("@", 1)[0] in SITE_RULES


class CustomOpsUnavailable(GraphAutoFusionError):
    """The library could not be built or loaded: fuse without custom operators."""


@dataclass
class CustomOps:
    codegen: Any = None
    groups: list[CustomOpGroup] = field(default_factory=list)
    library: CustomOpLibrary | None = None
    gemv: bool = False  # the library defines the hand-written operators (BUILTIN_OPS)
    gemv_keys: set = field(default_factory=set)  # their keys (planned on the sample shapes)
    gelu_keys: set = field(default_factory=set)  # the lone GELU nodes' keys (ort_gelu_sites)
    #: the ``If`` form (a dynamic row count) is planned: not with compressed weights, whose
    #: stage finds no contraction inside an ``If`` (it takes the direct form's ``Gemv``)
    gemv_if: bool = True

    @staticmethod
    def start(
        enabled: bool, codegen: Any, notes: list[str], weights: str = "fp32"
    ) -> CustomOps | None:
        if not enabled:
            return None
        if ort_include_dir() is None:
            notes.append(f"custom operators off: {NO_HEADER} (sh tools/ort_headers.sh)")
            return None
        return CustomOps(codegen, gemv_if=weights == "fp32")

    def prepare(self, work: Any, analysis: Any, target: Any) -> list[NotLowered]:
        """Lower the planned groups into kernels, build and load their library.

        Raises:
            CustomOpsUnavailable: the library fails to build or to load.
        """
        self.groups, refused = plan_groups(work, analysis, target)
        out = [NotLowered(k, r, c, m) for k, r, c, m in refused]
        types = getattr(getattr(analysis, "binding", None), "types", {}) or {}

        def sample_shape(name: str) -> Any:
            t = types.get(name)
            return tuple(int(d) for d in t[1]) if t is not None and t[1] is not None else None

        sites, _refused = plan_sites(work, sample_shape)
        if not self.gemv_if:
            sites = [s for s in sites if s.rows is not None]
        self.gemv_keys = {s.key for s in sites}
        self.gelu_keys = {s.key for s in plan_gelu_sites(work, types.get)}
        self.gemv = bool(sites) or bool(self.gelu_keys) or _plans_gelu(analysis)
        if self.groups or self.gemv:
            self.library = self.build(self.groups, self.gemv)
        return out

    def build(self, groups: list[CustomOpGroup], gemv: bool = False) -> CustomOpLibrary:
        return _build([g.kernel for g in groups], self.codegen, gemv)

    def lower(
        self, model: Any, keys: list[str] | None, native: list[Lowered] = ()
    ) -> list[Lowered]:
        """Apply the groups (all, or those with ``keys``), the Gemv sites and the lone GELU
        nodes to ``model``; the ``native`` lowerings' GELU operators become the one-pass ones
        (:func:`~graph_autofusion.codegen.ort_gelu_sites.gelu_form`)."""
        if self.gemv:
            swap_gelus(model, native)
        groups = self.groups if keys is None else [g for g in self.groups if g.key in set(keys)]
        done = apply_groups(model, groups)
        if self.gemv:  # after the groups: a MatMul a group keeps is rewritten inside it
            done += apply_sites(model, keys, done, allowed=self.gemv_keys)
            # the GELU nodes no fusion took (those it took are gone, or swapped above)
            done += apply_gelu_sites(model, keys, self.gelu_keys, [*native, *done])
        return done

    def finish(self, result: Any) -> None:
        """Keep, on ``result.custom_ops``, the library of the operators the fused model uses
        (rebuilt, from the kernel cache, when safe mode rolled some back)."""
        used = set(library_ops(result.model))
        result.custom_ops = None
        if not used or self.library is None:
            return
        if used != set(self.library.ops):
            keep = [g for g in self.groups if g.op in used]
            self.library = self.build(keep, bool(used & set(BUILTIN_OPS)))
        result.custom_ops = self.library


def _plans_gelu(analysis: Any) -> bool:
    """Whether a chosen candidate's native form is one of onnxruntime's GELU operators."""
    for ca in getattr(analysis, "candidates", ()):
        rule = getattr(ca.payload, "rule", None)
        if ca.chosen and getattr(rule, "rewrite", None) is not None:
            if getattr(rule, "fuse_pattern", None) in GELU_PATTERNS:
                return True
    return False


def swap_gelus(model: Any, lowered: Any) -> int:
    """In each of ``lowered``'s new nodes, onnxruntime's ``BiasGelu`` / ``Gelu`` / ``FastGelu``
    over float32 becomes ``GeluErf`` / ``GeluTanh`` (same inputs and output; the record's fused
    operators say so; fp16 and bf16 GELUs stay onnxruntime's). Returns how many were swapped."""
    n = 0
    for low in lowered:
        swapped = False
        for node in low.new_nodes:
            # the native forms make onnxruntime's (com.microsoft) GELUs; the one-pass operator
            # with the same inputs is ort_gelu_sites.gelu_form's
            op = gelu_form(node) if node.domain == MS_DOMAIN else None
            # ours are float32 only: the output's type where the input's is not known (a value
            # a rewrite made in a graph of symbolic sizes)
            if op is not None and (node.inputs[0].dtype or node.outputs[0].dtype) == DType.FLOAT:
                node.op_type, node.domain = op, DOMAIN
                node.attrs.clear()
                swapped = True
                n += 1
        if swapped:
            low.fused_ops = [n_.qualified_op for n_ in low.new_nodes]
    if n:
        model.opset_imports.setdefault(DOMAIN, 1)
    return n


def _build(kernels: list[Any], codegen: Any, gemv: bool) -> CustomOpLibrary:
    """One library of ``kernels`` (and the Gemv operators), built, loaded once to check it,
    and registered for this process's sessions.

    Raises:
        CustomOpsUnavailable: no onnxruntime header, or the library fails to build or load.
    """
    if ort_include_dir() is None:
        raise CustomOpsUnavailable(f"{NO_HEADER} (sh tools/ort_headers.sh)")
    try:
        lib = build_library(kernels, codegen, gemv=gemv)
    except CustomOpBuildError as exc:
        raise CustomOpsUnavailable(str(exc)) from exc
    problem = check_loads(lib.path)
    if problem:
        raise CustomOpsUnavailable(f"the custom-operator library does not load: {problem}")
    register_library(lib.path, lib.ops)
    return lib


def with_gemv(library: CustomOpLibrary | None, codegen: Any) -> CustomOpLibrary:
    """``library`` when it defines ``GemvF16``, else one library of its kernels and the Gemv
    operators (the compressed-weights stage's fp16 form needs them).

    Raises:
        CustomOpsUnavailable: it cannot be built or loaded here.
    """
    if library is not None and GEMV_Q_OP in library.ops:
        return library
    return _build(list(library.kernels) if library is not None else [], codegen, True)
