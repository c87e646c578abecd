"""The fuse pipeline for the ``cpu`` target: generated C kernels for the planned groups, every
other operator on torch's kernels.

    result = fuse_model_cpu(model, rules, profile, options=FuseOptions(target="cpu"))
    result.program.run(feeds)       # {output name: tensor}
    result.kernels                  # one KernelGroup per fused group

Stages, in order (each timed in ``result.timings`` and able to dump its artifact with
``dump_dir``):

1. **plan** (:func:`~graph_autofusion.pipeline.plan_for_target`, shared with every target and
   with ``GraphAutoFusion.analyze()``): an independent working copy, the exporters' run-time
   ``Reshape`` shapes folded to constants where provable, candidates (rule matches and
   automatic clusters), costs on the hardware profile, the plan, with every candidate the target cannot lower refused at planning time
   (:class:`~graph_autofusion.codegen.targets.CpuTarget`).
2. **lower**: each planned group into the kernel IR; identical groups share one kernel.
3. **compile**: every kernel in one C translation unit, one shared library, cached. A batch
   the compiler rejects is compiled kernel by kernel and each failing one rolled back alone.
4. **rewrite**: each group becomes one node of the ``graph_autofusion.fused`` domain (a local
   function holding its operators, so the saved ONNX file still runs anywhere).
5. **capture**, **verify**, **end_to_end** (safe mode, :func:`~graph_autofusion.pipeline.
   safe_mode.run_safe_mode`, the runner every target shares): the original's activations on
   torch; each kernel against its unfused operators on them (cosine, max error) and timed
   against them on the real shapes (the one speed policy, :class:`~graph_autofusion.verify.
   speed.SpeedPolicy`); failures are rolled back alone and the rewrite repeats without them;
   then the fused program against the original on the sample inputs, a failure rolling every
   fusion back. This target supplies :class:`_CpuSafeMode`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.codegen.call_plan import sample_shape
from graph_autofusion.codegen.compiler import KernelCompileError, compile_library
from graph_autofusion.codegen.lower import KernelReason, KernelRefused
from graph_autofusion.codegen.onnxruntime import Lowered, NotLowered, lower_onnxruntime
from graph_autofusion.codegen.precision import keep_fp32_islands
from graph_autofusion.codegen.targets import candidate_nodes_outputs, native_form
from graph_autofusion.ir.core import Model
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.matcher import Match, match_at
from graph_autofusion.patterns.rewrite import fuse_match
from graph_autofusion.patterns.rules import RuleMatch
from graph_autofusion.patterns.shape_folding import fold_reshape_shapes
from graph_autofusion.pipeline.cpu_kernels import (
    KernelGroup,
    NativeGroup,
    check_kernel,
    finalize_kernel,
    kernel_and_operators,
    kernel_functions,
)
from graph_autofusion.pipeline.plan import plan_for_target
from graph_autofusion.pipeline.result import (
    FuseResult,
    RolledBack,
    clone_model,
    to_json,
)
from graph_autofusion.pipeline.safe_mode import run_safe_mode
from graph_autofusion.pipeline.stages import Stages
from graph_autofusion.planner.analysis import apply_saved_plan
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.verify.inputs import generate_inputs, other_shape_inputs
from graph_autofusion.verify.safety import OtherShape, SafetyResult, compare_at, compare_outputs
from graph_autofusion.verify.sample_inputs import is_generated, own_copy, run_failure
from graph_autofusion.verify.speed import SpeedPolicy


@dataclass
class CpuFuseResult(FuseResult):
    """:class:`~graph_autofusion.pipeline.FuseResult` plus the cpu target's kernels."""

    target: str = "cpu"
    kernels: list[KernelGroup] = field(default_factory=list)
    natives: list[NativeGroup] = field(default_factory=list)
    library: Any = None  # codegen.compiler.CompiledLibrary
    program: Any = None  # runtime.cpu_runtime.CpuProgram

    def kernel_counts(self) -> dict[str, int]:
        """``groups`` fused, ``functions`` distinct compiled kernels."""
        return {
            "groups": len(self.lowered),
            "functions": len({g.kernel.name for g in self.kernels if _is_live(self, g)}),
        }


def _is_live(result: CpuFuseResult, g: KernelGroup) -> bool:
    return any(low.key == g.key for low in result.lowered)


def _lowerable(target: Any, binding: Any, ca: Any) -> bool:
    if ca.payload is None:
        return False
    if native_form(ca.payload):  # the rule's own rewrite, no kernel
        return True
    try:
        target.lower(ca.payload, binding)
    except Exception:  # noqa: BLE001 - a saved key the target cannot lower is not applied
        return False
    return True


def fuse_model_cpu(
    original: Model,
    rules: Any,
    profile: Any,
    *,
    options: FuseOptions | None = None,
    feeds: Mapping[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    reference: Mapping[str, Any] | None = None,
    chosen_keys: Any = None,
) -> CpuFuseResult:
    """Fuse ``original`` for the cpu target (see the module docstring); it is not modified.

    ``reference``: the original's outputs on ``feeds`` as its own framework computed them
    (the PyTorch path passes eager's); by default onnxruntime runs the original.
    ``chosen_keys``: apply exactly these candidates (a saved plan) instead of the planner's
    choice; a key that no longer matches is ignored."""
    options = options or FuseOptions(target="cpu")
    stages = Stages(dump_dir)
    notes: list[str] = []
    if options.weights != "fp32":  # never a surprise: said, not silently ignored
        notes.append(
            f"weights={options.weights}: the cpu target keeps every weight fp32 (compressed "
            f"weights are MatMulNBits on the onnxruntime target)"
        )
    feeds = own_copy(feeds) if feeds is not None else generate_inputs(original)
    opset = int(original.opset_imports.get("", 17))
    with stages("plan"):  # load, fold_shapes, candidates, cost, plan
        work, analysis, folding, target = plan_for_target(
            original, rules, profile, options.replace(target="cpu"), feeds
        )
    for k in ("bind", "candidates", "cost", "plan"):
        stages.timings[f"plan.{k}"] = analysis.timings.get(k, 0.0)
    if chosen_keys is not None:
        allowed = functools.partial(_lowerable, target, analysis.binding)
        apply_saved_plan(analysis, chosen_keys, notes, allowed)
    stages.dump("plan.json", lambda: to_json(analysis.to_dict()))
    groups: list[KernelGroup] = []
    not_lowered: list[NotLowered] = []
    natives: list[NativeGroup] = []
    with stages("lower"):
        for ca in analysis.candidates:
            if not ca.chosen:
                continue
            try:
                low = target.lower(ca.payload, analysis.binding)
            except KernelRefused:
                if not native_form(ca.payload):
                    raise
                m = ca.payload.match
                natives.append(
                    NativeGroup(
                        ca.key,
                        ca.payload.rule,
                        m.root.name,
                        [n.name for n in m.nodes],
                        [v.name for v in m.outputs],
                        ca.payload.rule.tolerance,
                    )
                )
                continue
            nodes, outputs = candidate_nodes_outputs(ca.payload)
            shapes = [sample_shape(work, analysis.binding, i.name) for i in low.kernel.inputs]
            kernel = finalize_kernel(low.kernel, shapes)
            rule = ca.source.split(":", 1)[1] if ca.source.startswith("rule:") else ca.source
            tol = getattr(getattr(ca.payload, "rule", None), "tolerance", defaults.FUSION_COSINE)
            groups.append(
                KernelGroup(
                    ca.key,
                    rule,
                    ca.fused_op,
                    [n.name for n in nodes],
                    [v.name for v in outputs],
                    kernel,
                    [n.name for n in low.prologue],
                    tol,
                    [i.name for i in low.kernel.inputs],
                )
            )
    unique = list({g.kernel.name: g.kernel for g in groups}.values())
    stages.dump("kernels.txt", lambda: "\n\n".join(k.to_text() for k in unique))
    library = None
    rolled: list[RolledBack] = []
    with stages("compile"):
        if unique and options.backend == "c":
            try:
                library = compile_library(unique, options.codegen)
            except KernelCompileError:
                good = []
                for k in unique:
                    try:
                        compile_library([k], options.codegen)
                        good.append(k)
                    except KernelCompileError as exc:
                        for g in groups:
                            if g.kernel.name == k.name:
                                rolled.append(
                                    RolledBack(g.key, g.rule, KernelReason.COMPILE_FAILED, str(exc))
                                )
                bad = {r.key for r in rolled}
                groups = [g for g in groups if g.key not in bad]
                library = compile_library(good, options.codegen) if good else None
    kernels = kernel_functions(library, groups, options)
    result = CpuFuseResult(
        work, original, analysis, [], not_lowered, safe_mode=options.safe_mode, feeds=feeds
    )
    result.shape_folding = folding
    result.kernels = groups
    result.library = library
    result.rolled_back = rolled

    result.natives = natives

    def build(keep: list[KernelGroup], keep_native: list[NativeGroup] | None = None) -> None:
        fresh = clone_model(original)
        if folding is not None and folding.folded:
            fold_reshape_shapes(fresh)
        native_done = _apply_natives(fresh, natives if keep_native is None else keep_native)
        if options.keep_fp32:  # F17: unfused operators of keep_fp32 compute in float32
            grouped = {n for g in keep for n in (*g.node_names, *g.prologue)}
            grouped |= {n.name for low in native_done for n in low.new_nodes}
            result.fp32_islands = keep_fp32_islands(fresh, options.keep_fp32, exclude=grouped)
        lowered, program = _rewrite(fresh, keep, kernels, opset)
        result.model, result.lowered, result.program = fresh, native_done + lowered, program

    with stages("rewrite"):
        build(groups)
    if options.safe_mode:  # the one runner: check, roll back, rebuild, end to end
        target = _CpuSafeMode(result, groups, options, build, notes, reference)
        run_safe_mode(result, target, stages, options, notes, progress=progress)
    result.timings = stages.timings
    result.notes = notes
    return result


def _apply_natives(model: Model, natives: list[NativeGroup]) -> list[Lowered]:
    """Each native group's rule rewrite on ``model``, as the onnxruntime target applies them
    (re-matched at its root by name; a group whose match no longer holds, or whose rewrite
    declines, is left unfused)."""
    by_name = {n.name: n for n in model.graph.nodes}
    matches, groups = [], {}
    for grp in natives:
        root = by_name.get(grp.root)
        if root is None or root.graph is None:
            continue
        rule = grp.rule
        m = match_at(rule.pattern, root, checks=rule.checks, exported=rule.exported)
        if isinstance(m, Match):
            matches.append(RuleMatch(rule, m))
            groups[grp.key] = grp
    done = lower_onnxruntime(model, matches).lowered
    for low in done:
        low.payload = groups[low.key]
    return done


def _rewrite(model: Model, groups: list[KernelGroup], kernels: Mapping[str, Any], opset: int):
    """Rewrite each group into one fused node on ``model``; the program that runs it."""
    from graph_autofusion.runtime.cpu_runtime import CpuProgram, kernel_step  # heavy: torch

    g = model.graph
    by_name = {n.name: n for n in g.nodes}
    values = g.value_map()
    lowered: list[Lowered] = []
    steps: dict[str, Any] = {}
    for grp in groups:
        nodes = [by_name.get(n) for n in grp.node_names]
        if any(n is None for n in nodes) or grp.kernel.name not in kernels:
            continue
        outputs = [values[o] for o in grp.output_names]
        prologue = [by_name[n] for n in grp.prologue]
        match = Match(nodes[-1], nodes, {}, {}, outputs)
        inputs = [v.name for v in match.inputs()]
        # the step reads the prologue nodes' inputs now: fuse_match detaches them
        step = kernel_step(kernels[grp.kernel.name], inputs, prologue, opset, grp.input_names)
        new_nodes = fuse_match(model, match, grp.fused_op, rule_name=grp.rule)
        steps[new_nodes[0].name] = step
        lowered.append(
            Lowered(
                grp.key,
                grp.rule,
                list(grp.node_names),
                new_nodes,
                [i for i in inputs if i in values and values[i].const is None],
                list(grp.output_names),
                [f"kernel:{grp.kernel.name}"],
                grp.tolerance,
                grp,
            )
        )
    return lowered, CpuProgram(model, steps)


class _CpuSafeMode:
    """What the cpu target supplies to safe mode's runner (:mod:`.safe_mode`): its check (each
    kernel against its unfused operators on torch's activations of the original,
    :func:`~graph_autofusion.pipeline.cpu_kernels.check_kernel`), its rebuild (the rewrite of a
    fresh copy without the failures: the kernels kept are the same compiled functions, their
    verdicts stand), its end-to-end check (the fused program against the original's outputs)
    and its fallback (the rewrite with no group)."""

    def __init__(
        self,
        result: CpuFuseResult,
        groups: list[KernelGroup],
        options: FuseOptions,
        build: Callable[..., None],
        notes: list[str],
        reference: Mapping[str, Any] | None,
    ) -> None:
        self.result, self.groups, self.options = result, groups, options
        self.build, self.notes, self.reference = build, notes, reference
        self.ref: Any = None
        self.acts: Any = None
        self.other: OtherShape | None = None  # the second shape and the original's outputs

    def capture(self) -> None:
        from graph_autofusion.runtime.torch_runtime import TorchRunner  # heavy: torch

        result, feeds = self.result, self.result.feeds
        self.ref = TorchRunner(result.original, shared_constants=_same_values(result))
        try:
            self.acts = self.ref.run(feeds, keep=_checked_values(result))
        except RuntimeError as exc:  # the original fails on the sample inputs: one clear error
            failure = run_failure(
                result.original, feeds, exc, runtime="torch", generated=is_generated(feeds)
            )
            if failure is None:
                raise
            raise failure from exc
        got = other_shape_inputs(result.original, feeds)
        if got is not None:
            try:  # the original's outputs there, by the same runner
                outs = self.ref.run(got[1])
                self.other = OtherShape(*got, {k: _host(v) for k, v in outs.items()})
            except Exception:  # noqa: BLE001 - it does not take that shape: nothing to compare
                self.other = None

    def check(self, low: Lowered, speed: SpeedPolicy | None) -> SafetyResult:
        step, args, unfused = kernel_and_operators(self.result, low, self.acts, self.ref.opset)
        floor = self.options.cosine_floor
        return check_kernel(
            low,
            step,
            args,
            self.acts,
            floor=floor if floor is not None else low.tolerance,
            unfused=unfused,
            speed=speed,
        )

    def rebuild(self, failed: set[str]) -> bool:
        self.build(
            [g for g in self.groups if g.key not in failed],
            [n for n in self.result.natives if n.key not in failed],
        )
        return False

    def culprits(self) -> list[tuple[Lowered, SafetyResult]]:
        result, floor = self.result, self.options.cosine_floor
        try:
            acts = self.ref.run(self.other.feeds, keep=_checked_values(result))
        except Exception:  # noqa: BLE001 - it ran there in capture(); out of memory, say
            return []
        bad = []
        for low in result.lowered:
            step, args, unfused = kernel_and_operators(result, low, acts, self.ref.opset)
            res = check_kernel(
                low, step, args, acts, floor=floor if floor is not None else low.tolerance,
                unfused=unfused,
            )  # fmt: skip
            if not res.passed:
                bad.append((low, res))
        return bad

    def end_to_end(self) -> Mapping[str, Any]:
        """The fused program against the original on the sample inputs and the second shape."""
        result, feeds = self.result, self.result.feeds
        if self.reference is not None:
            want = {k: _as_float_array(v) for k, v in self.reference.items()}
        else:
            want = _reference_outputs(result.original, feeds)
        try:
            got = {k: v.float().numpy() for k, v in result.program.run(feeds).items()}
        except Exception as exc:  # noqa: BLE001
            got = {}
            self.notes.append(f"the fused program failed: {type(exc).__name__}: {exc}")
        floor = self.options.e2e_cosine_floor
        cmp = compare_outputs(want, got, cosine_floor=floor)
        if self.other is not None:
            run = result.program.run
            cmp.update(
                compare_at(
                    self.other,
                    lambda f: {k: _host(v) for k, v in run(f).items()},
                    cosine_floor=floor,
                )
            )
        return {"outputs": cmp, "passed": all(v["passed"] for v in cmp.values())}

    def roll_back_all(self) -> str:
        self.build([], [])
        return "every fusion"


def _checked_values(result: CpuFuseResult) -> set[str]:
    """The original's values safe mode's checks read: each fused group's inputs and outputs
    and those of the operators it replaced (a rebuild only drops groups). Keeping only these,
    not every activation, keeps the capture's memory near one run's (a prefill's activations
    are tens of MB)."""
    originals = {n.name: n for n in result.original.graph.nodes}
    names: set[str] = set()
    for low in result.lowered:
        names.update(low.outputs)
        names.update(low.inputs)
        for node in low.new_nodes:
            names.update(v.name for v in node.inputs if v is not None)
        for n in low.original_node_names:
            node = originals.get(n)
            if node is not None:
                names.update(v.name for v in (*node.inputs, *node.outputs) if v is not None)
    return names


def _same_values(result: CpuFuseResult) -> dict[str, Any]:
    """The program's constant tensors made from the very array the original's initializer of
    that name holds (the fused model is a clone sharing constant arrays; a rewrite's new
    weights have new names and arrays): safe mode's reference runner reuses them."""
    if result.program is None:
        return {}
    fused = result.model.graph.initializers
    consts = result.program.constants
    return {
        name: consts[name]
        for name, v in result.original.graph.initializers.items()
        if name in consts and name in fused and v.const is not None and fused[name].const is v.const
    }


def _reference_outputs(original: Model, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The original's outputs: onnxruntime's (an independent executor), else torch's."""
    from graph_autofusion.runtime.torch_runtime import TorchRunner  # heavy: torch

    try:
        sess = ort_session(original, "disable")
        names = {i.name for i in sess.get_inputs()}
        outs = sess.run(None, {k: np.asarray(v) for k, v in feeds.items() if k in names})
        return {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), outs)}
    except Exception:  # noqa: BLE001 - a model onnxruntime cannot run is compared in torch
        return {k: v.float().numpy() for k, v in TorchRunner(original).run(feeds).items()}


def _host(v: Any) -> np.ndarray:
    """A torch tensor as a NumPy array of its kind (floating ones as float32)."""
    if not hasattr(v, "detach"):
        return np.asarray(v)
    v = v.detach()
    return v.float().numpy() if v.is_floating_point() else v.numpy()


def _as_float_array(v: Any) -> np.ndarray:
    return v.detach().float().numpy() if hasattr(v, "detach") else np.asarray(v)
