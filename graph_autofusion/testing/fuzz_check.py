"""The fuzzer's runner: the whole pipeline on one generated graph, and its invariants.

    failures = check_graph(1234)        # [] when every invariant holds
    report = run_graph(1234)            # failures, what ran, timings

For the graph of a seed (:func:`graph_autofusion.testing.fuzz.random_graph`):

1. the original passes ``onnx.checker`` (full check) and runs in onnxruntime and in the
   reference interpreter, which agree (``generator`` / ``reference``);
2. candidates (rule matches, clusters, operator pairs) and the plan with every planner
   strategy for both targets: every chosen group convex, no node claimed twice, the groups
   acyclic together (``plan``);
3. lowering for the onnxruntime target and the cpu target (generated kernels), without safe
   mode (so that safe mode's rollback cannot hide a wrong fusion) with the seed's strategy
   (``STRATEGIES[seed % 4]``; on the seeds that compile kernels, also onnxruntime with
   generated custom operators), and with safe mode (``safe``): each fused model passes the IR
   verifier (``ir_verify``) and ``onnx.checker`` (``onnx_checker``), and its outputs equal the
   original's in the interpreter (``interpreter``) and in onnxruntime (``onnxruntime``); the
   cpu target's program (the kernels themselves) too (``cpu_program``).

The cpu target compiles its kernels with the C compiler on every ``compile_every``-th seed
(the kernel cache makes repeats cheap) and runs them on the NumPy executor of the kernel IR
on the others (``backend="reference"``): the lowering and the rewrite are the same.

A :class:`~graph_autofusion.errors.GraphAutoFusionError` is a refusal with a reason, recorded
but not a failure; any other exception is a ``crash``. Outputs are compared with a
condition-aware tolerance (:func:`tolerance`): a bfloat16 or float16 graph is looser than a
float32 one, and the tolerance grows with the largest magnitude any intermediate value of the
original reaches (``cos(sum(x))`` amplifies the sum's rounding by the sum's size).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.codegen.ort_customop import library_ops
from graph_autofusion.cost.hardware import load_profile
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx
from graph_autofusion.ir.verify import verify_problems
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.candidates import match_rules
from graph_autofusion.patterns.clustering import cluster
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.pairs import operator_pairs
from graph_autofusion.pipeline import e2e_passed, fuse_model, plan_for_target
from graph_autofusion.pipeline.cpu import fuse_model_cpu
from graph_autofusion.planner.analysis import nodes_of
from graph_autofusion.planner.plan import STRATEGIES, plan
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.fuzz import FuzzGraph, random_graph

PROFILE = "x86_avx2"  # fixed: ``host`` is calibrated per machine
_CACHE: dict[str, Any] = {}


def _profile() -> Any:

    if "profile" not in _CACHE:
        _CACHE["profile"] = load_profile(PROFILE)
    return _CACHE["profile"]


def _rules() -> Any:

    if "rules" not in _CACHE:
        _CACHE["rules"] = builtin_rules().preset("all")
    return _CACHE["rules"]


#: per element type: about 40 (float16) to 20 (bfloat16) units of rounding, 300 for float32
#: (whose executors may also differ by accumulation order and fp32-vs-fp64 references)
BASE_TOL = {"float32": 2e-5, "float16": 2e-2, "bfloat16": 8e-2, "int64": 0.0}
INVARIANTS = (
    "generator",
    "reference",
    "crash",
    "plan",
    "ir_verify",
    "onnx_checker",
    "interpreter",
    "onnxruntime",
    "cpu_program",
    "safe",
)


@dataclass
class Failure:
    invariant: str
    stage: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.stage}: {self.message}"


@dataclass
class GraphReport:
    seed: int | None
    graph: FuzzGraph
    failures: list[Failure] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # GraphAutoFusionError messages
    fused: dict[str, int] = field(default_factory=dict)  # stage -> fused groups
    timings: dict[str, float] = field(default_factory=dict)
    compiled: bool = False


def tolerance(dtype: str, scale: float) -> float:
    """The absolute tolerance of a graph computing in ``dtype`` whose values reach
    ``scale`` in magnitude (relative tolerance: the same figure)."""
    return BASE_TOL[dtype] * max(1.0, scale)


def compare(got: Mapping[str, Any], want: Mapping[str, Any], dtype: str, scale: float) -> str:
    """Where ``got`` differs from ``want`` beyond the tolerance (``""``: equal)."""
    problems = []
    for name, w in want.items():
        if name not in got:
            problems.append(f"{name}: missing")
            continue
        g = np.asarray(_np(got[name]))
        w = np.asarray(_np(w))
        if g.shape != w.shape:
            problems.append(f"{name}: shape {g.shape} != {w.shape}")
            continue
        if w.dtype.kind in "biu" or BASE_TOL[dtype] == 0.0:
            bad = g.astype(np.float64) != w.astype(np.float64)
            if bad.any():
                problems.append(f"{name}: {int(bad.sum())} of {bad.size} integers differ")
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        fin = np.isfinite(w64)
        if (np.isfinite(g64) != fin).any() or (np.isnan(g64) != np.isnan(w64)).any():
            problems.append(f"{name}: non-finite values at other positions")
            continue
        tol = tolerance(dtype, scale)
        err = np.abs(g64[fin] - w64[fin])
        bad = err > tol + BASE_TOL[dtype] * np.abs(w64[fin])
        if bad.any():
            problems.append(
                f"{name}: {int(bad.sum())} of {bad.size} elements differ (worst "
                f"{float(err.max()):.3g}, tolerance {tol:.3g}, scale {scale:.3g})"
            )
    return "; ".join(problems)


def _np(v: Any) -> Any:
    if hasattr(v, "detach"):
        return v.detach().float().numpy() if v.is_floating_point() else v.detach().numpy()
    return v


def _ort_run(proto: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:

    sess = ort_session(proto, "disable", threads=1)
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    return {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), outs)}


def _magnitude(acts: Mapping[str, Any]) -> float:
    m = 1.0
    for a in acts.values():
        a = np.asarray(a)
        if a.dtype.kind == "f" and a.size:
            fin = np.abs(a[np.isfinite(a)].astype(np.float64))
            if fin.size:
                m = max(m, float(fin.max()))
    return m


# --------------------------------------------------------------------------- plan checks
def plan_problems(groups: list[list[Any]], nodes: list[Any]) -> list[str]:
    """Overlap, convexity and joint acyclicity of the chosen ``groups`` (lists of IR nodes)
    among ``nodes`` (every node of the graph)."""
    problems: list[str] = []
    owner: dict[int, int] = {}
    for gi, grp in enumerate(groups):
        for n in grp:
            if id(n) in owner:
                problems.append(f"node {n.name!r} in groups {owner[id(n)]} and {gi}")
            owner[id(n)] = gi
    succ: dict[int, list[Any]] = {id(n): [] for n in nodes}
    for n in nodes:
        for v in (*n.inputs, *n.captures):
            if v is not None and v.producer is not None and id(v.producer) in succ:
                succ[id(v.producer)].append(n)
    for gi, grp in enumerate(groups):
        inside = {id(n) for n in grp}
        stack = [s for n in grp for s in succ.get(id(n), []) if id(s) not in inside]
        seen: set[int] = set()
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if id(n) in inside:
                problems.append(
                    f"group {gi} is not convex: a path leaves it and reaches {n.name!r}"
                )
                break
            stack.extend(succ.get(id(n), []))
    # the quotient graph (each group one vertex) must be acyclic
    key = {id(n): ("g", owner[id(n)]) if id(n) in owner else ("n", id(n)) for n in nodes}
    edges: dict[Any, set[Any]] = {k: set() for k in key.values()}
    for n in nodes:
        for s in succ[id(n)]:
            if key[id(n)] != key[id(s)]:
                edges[key[id(n)]].add(key[id(s)])
    indeg = {k: 0 for k in edges}
    for outs in edges.values():
        for o in outs:
            indeg[o] += 1
    ready = [k for k, d in indeg.items() if d == 0]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        for o in edges[k]:
            indeg[o] -= 1
            if indeg[o] == 0:
                ready.append(o)
    if done != len(edges):
        problems.append("the chosen groups form a cycle together")
    return problems


# --------------------------------------------------------------------------- the runner
class _Run:
    def __init__(self, report: GraphReport) -> None:
        self.r = report

    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        try:
            return fn()
        except GraphAutoFusionError as exc:
            self.r.refused.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
        except Exception as exc:  # noqa: BLE001 - the fuzzer records every crash
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            where = f"{tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}"
            self.fail("crash", name, f"{type(exc).__name__} at {where}: {exc}"[:400])
        finally:
            self.r.timings[name] = self.r.timings.get(name, 0.0) + time.perf_counter() - t
        return None

    def fail(self, invariant: str, stage: str, message: str) -> None:
        self.r.failures.append(Failure(invariant, stage, message))


def run_graph(
    seed: int | None = None,
    graph: FuzzGraph | None = None,
    *,
    compile_every: int = 25,
    safe_every: int = 2,
) -> GraphReport:
    """Run the pipeline on the graph of ``seed`` (or ``graph``) and check the invariants."""
    import onnx

    g = graph if graph is not None else random_graph(seed)
    seed = g.seed if seed is None else seed
    report = GraphReport(seed, g)
    run = _Run(report)
    try:
        onnx.checker.check_model(g.model, full_check=True)
    except Exception as exc:  # noqa: BLE001
        run.fail("generator", "onnx.checker", str(exc)[:300])
        return report
    model = run.stage("import", lambda: load_onnx(g.model))
    if model is None:
        return report
    acts = run.stage("interpreter", lambda: run_model(model, g.feeds, keep_intermediates=True))
    if acts is None:
        return report
    outs = [o.name for o in g.model.graph.output]
    ref = {k: acts[k] for k in outs}
    scale = _magnitude(acts)
    ort_ok = g.dtype != "bfloat16"  # onnxruntime's CPU provider has no bfloat16 kernels
    ort_ref = None
    if ort_ok:
        ort_ref = run.stage("onnxruntime", lambda: _ort_run(g.model, g.feeds))
        if ort_ref is None:
            run.fail("generator", "onnxruntime", "onnxruntime does not run the original")
            return report
        problem = compare(ref, ort_ref, g.dtype, scale)
        if problem:
            run.fail("reference", "original", f"interpreter vs onnxruntime: {problem}")
    ctx = _Ctx(run, model, g, ref, ort_ref, scale)
    run.stage("candidates", ctx.candidates)
    run.stage("plans", ctx.plans)
    strategy = _strategy(seed)
    run.stage("ort", lambda: ctx.fuse_ort(strategy, safe_mode=False))
    backend = "c" if seed is not None and seed % compile_every == 0 else "reference"
    report.compiled = backend == "c"
    run.stage("cpu", lambda: ctx.fuse_cpu(strategy, backend, safe_mode=False))
    if backend == "c":  # onnxruntime with generated custom operators (one library build)
        run.stage("ort_kernels", lambda: ctx.fuse_ort(strategy, safe_mode=False, custom=True))
    if seed is None or seed % safe_every == 0:
        run.stage("ort_safe", lambda: ctx.fuse_ort("auto", safe_mode=True))
        run.stage("cpu_safe", lambda: ctx.fuse_cpu("auto", "reference", safe_mode=True))
    return report


def _strategy(seed: int | None) -> str:

    return STRATEGIES[(seed or 0) % len(STRATEGIES)]


def check_graph(seed: int, **kwargs: Any) -> list[str]:
    """The invariant failures on the graph of ``seed`` (empty: every invariant holds)."""
    return [str(f) for f in run_graph(seed, **kwargs).failures]


@dataclass
class _Ctx:
    run: _Run
    model: Any
    g: FuzzGraph
    ref: dict[str, np.ndarray]
    ort_ref: dict[str, np.ndarray] | None
    scale: float

    def rules(self) -> Any:
        return _rules()

    def candidates(self) -> None:

        graph = self.model.graph
        match_rules(graph, self.rules())
        cluster(graph)
        operator_pairs(graph)

    def plans(self) -> None:

        # every strategy for the cpu target (rule matches and clusters: a superset of the
        # onnxruntime target's candidates), the seed's strategy for onnxruntime. The strategy
        # is read by the planner alone (candidates and costs do not depend on it): the cpu
        # target is analyzed once ("auto", the whole path) and its costed candidates planned
        # again with each other strategy
        runs = [("cpu", STRATEGIES[0]), ("onnxruntime", _strategy(self.g.seed))]
        for target, strategy in runs:
            opts = FuseOptions(target=target, strategy=strategy, check_speed=False)
            work, analysis, _f, _t = plan_for_target(
                self.model, self.rules(), _profile(), opts, self.g.feeds
            )
            self.check_plan(f"{target}/{strategy}", work, analysis)
            if target == "cpu":
                done = analysis.plan
                pcs = list(done.chosen) + [r.candidate for r in done.rejected]
                for other in STRATEGIES[1:]:
                    chosen = plan(pcs, other).chosen
                    groups = [_group_nodes(c.payload[0]) for c in chosen]
                    for p in plan_problems(groups, list(work.graph.nodes)):
                        self.run.fail("plan", f"cpu/{other}", p)

    def check_plan(self, stage: str, work: Any, analysis: Any) -> None:
        groups = [_group_nodes(c.payload) for c in analysis.candidates if c.chosen]
        for p in plan_problems(groups, list(work.graph.nodes)):
            self.run.fail("plan", stage, p)

    def check_fused(self, stage: str, fused: Any, program: Any = None) -> None:
        """The fused model's invariants (and the cpu program's outputs). The interpreter does
        not run generated custom operators (``ai.graph_autofusion``): onnxruntime does."""
        import onnx

        problems = verify_problems(fused.graph)
        if problems:
            self.run.fail("ir_verify", stage, "; ".join(problems[:3]))
            return
        proto = to_onnx(fused)
        try:
            onnx.checker.check_model(proto, full_check=True)
        except Exception as exc:  # noqa: BLE001
            self.run.fail("onnx_checker", stage, str(exc)[:300])
        dtype = self.g.dtype

        custom = bool(library_ops(fused))  # also inside If branches (the Gemv lowering)
        got = None
        if not custom:
            got = self.run.stage(f"{stage}.interpreter", lambda: run_model(fused, self.g.feeds))
        if got is not None:
            problem = compare(got, self.ref, dtype, self.scale)
            if problem:
                self.run.fail("interpreter", stage, problem)
        if self.ort_ref is not None:
            try:
                got = _ort_run(proto, self.g.feeds)
            except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
                got = None
                msg = str(exc).strip().splitlines()[0][:300]
                self.run.fail("onnxruntime", stage, f"onnxruntime does not run it: {msg}")
            if got is not None:
                problem = compare(got, self.ort_ref, dtype, self.scale)
                if problem:
                    self.run.fail("onnxruntime", stage, problem)
        if program is not None:
            got = self.run.stage(f"{stage}.program", lambda: program.run(self.g.feeds))
            if got is not None:
                want = self.ort_ref if self.ort_ref is not None else self.ref
                problem = compare(got, want, dtype, self.scale)
                if problem:
                    self.run.fail("cpu_program", stage, problem)

    def fuse_ort(self, strategy: str, *, safe_mode: bool, custom: bool = False) -> None:

        stage = "ort_kernels" if custom else "ort_safe" if safe_mode else "ort"
        opts = FuseOptions(
            safe_mode=safe_mode,
            strategy=strategy,
            check_speed=False,
            mc_samples=2,
            custom_ops=custom,
        )
        res = fuse_model(self.model, self.rules(), _profile(), options=opts, feeds=self.g.feeds)
        self.run.r.fused[stage] = len(res.lowered)
        self.check_fused(stage, res.model)
        if safe_mode and res.end_to_end is not None and not _passed(res.end_to_end):
            if res.lowered:
                self.run.fail("safe", stage, "end to end failed but fusions were kept")

    def fuse_cpu(self, strategy: str, backend: str, *, safe_mode: bool) -> None:

        stage = "cpu_safe" if safe_mode else "cpu"
        opts = FuseOptions(
            target="cpu",
            strategy=strategy,
            safe_mode=safe_mode,
            check_speed=False,
            backend=backend,
            threads=1,
        )
        res = fuse_model_cpu(self.model, self.rules(), _profile(), options=opts, feeds=self.g.feeds)
        self.run.r.fused[stage] = len(res.lowered)
        self.check_fused(stage, res.model, res.program)


def _group_nodes(payload: Any) -> list[Any]:

    return list(nodes_of(payload))


def _passed(e2e: Mapping[str, Any]) -> bool:

    return e2e_passed(e2e)
