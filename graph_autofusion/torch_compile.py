"""``torch.compile(model, backend="autofusion")``: the PyTorch path's front door.

    compiled = torch.compile(model, backend="autofusion")          # registered entry point
    compiled = torch.compile(model, backend=autofusion_backend)    # the same, by object
    compiled = torch.compile(model, backend=make_backend(preset="llm", safe_mode=False))

Dynamo hands the backend each captured FX graph (torch-level operators, parameters as
inputs). The backend returns a :class:`CompiledGraph` that does the work on its first call,
with the real inputs (an export inside Dynamo's own compilation would add guards to the frame
being compiled): the graph is imported into the IR (:func:`~graph_autofusion.frontend.
torch_frontend.import_fx`; sizes Dynamo made symbolic stay symbolic), planned for the
calibrated ``host`` profile with the cpu target, its fused groups compiled into C kernels,
each verified in safe mode against eager's outputs, and the fused program generated as
straight-line Python (:mod:`graph_autofusion.runtime.pyprogram`): GEMMs and every operator
without a kernel run on torch's own kernels.

Fallbacks: a graph the importer, planner or compiler cannot handle (one that writes into its
inputs or buffers among them) runs as Dynamo captured it (eager), with one warning naming the
graph and the reason; a graph break is Dynamo's business (each piece is compiled apart); a call
autograd must record runs eagerly. Before a compiled program is used, the generated function
itself is run on the first call's inputs and compared with eager's outputs (cosine and
relative error).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.options import FuseOptions

#: Weight sets one graph compiles for (other modules of the same class) before eager.
MAX_WEIGHT_SETS = 4
#: Largest relative L2 error of an output against eager's, per dtype.
REL_TOLERANCE = {
    torch.float32: 1e-3,
    torch.float64: 1e-6,
    torch.float16: 1e-2,
    torch.bfloat16: 3e-2,
}


class AutofusionWarning(UserWarning):
    """A graph (or part of one) runs in eager because the backend could not compile it."""


@dataclass
class BackendConfig:
    """What the backend plans with (one per ``make_backend`` call)."""

    preset: str = "all"
    hardware: Any = "host"
    options: FuseOptions = field(default_factory=lambda: FuseOptions(target="cpu"))
    rules: Any = None  # a RuleSet; the preset's rules when None
    #: A saved plan: graph fingerprint -> candidate keys to apply (no planning for those).
    saved_plan: dict[str, list[str]] | None = None
    #: Every graph compiled through this backend, in order (reports and tests read them).
    graphs: list[CompiledGraph] = field(default_factory=list)

    def ruleset(self) -> Any:
        if self.rules is None:
            from graph_autofusion.patterns.library import builtin_rules

            self.rules = builtin_rules().preset(self.preset)
        return self.rules


class CompiledGraph:
    """One Dynamo graph: compiled on its first call, then the fused program (or eager).

    The program holds the graph's parameters as constants. Dynamo passes them as arguments and
    may reuse one graph for another module of the same class, so each call checks that the
    constant arguments are the same tensors at the same version (a cheap identity test) and
    compiles again for other weights (at most :data:`MAX_WEIGHT_SETS` sets, then eager). A call
    that autograd must record (grad enabled and an argument requiring grad) runs eagerly.
    """

    def __init__(self, gm: torch.fx.GraphModule, config: BackendConfig, index: int) -> None:
        self.gm = gm
        self.config = config
        self.index = index
        self.result: Any = None  # CpuFuseResult
        self.fallback: str | None = None  # why this graph runs in eager
        self.compile_seconds = 0.0
        self.calls = 0
        self.eager_calls = 0  # calls autograd had to record
        self._lock = threading.Lock()
        self.plan_source = ""  # "planned", or "saved" (a loaded plan's choice)
        self.source = ""  # the generated program
        #: (constant argument indices and the tensors/versions compiled for, program)
        self._programs: list[tuple[tuple[int, ...], list[Any], list[int], Any]] = []
        self._grad_warned = False

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        ):
            self.eager_calls += 1
            if not self._grad_warned:
                self._grad_warned = True
                warnings.warn(
                    f"autofusion: graph {self.index} runs in eager while autograd records "
                    f"(call it under torch.no_grad() or torch.inference_mode())",
                    AutofusionWarning,
                    stacklevel=2,
                )
            return self.gm.forward(*args)
        for indices, refs, versions, program in self._programs:
            if all(args[i] is r and r._version == v for i, r, v in zip(indices, refs, versions)):
                return program(*args)
        with self._lock:
            return self._build(args)

    # ------------------------------------------------------------------ compile
    def _build(self, args: Sequence[Any]) -> Any:
        """Compile for these arguments' weights and run this call; a graph that cannot be
        compiled (or a weight set past the limit) runs as Dynamo captured it from now on."""
        if self.fallback is not None or len(self._programs) >= MAX_WEIGHT_SETS:
            if self.fallback is None:
                self._fail(f"more than {MAX_WEIGHT_SETS} weight sets")
            return self.gm.forward(*args)
        t = time.perf_counter()
        try:
            program, indices, outs = self._compile(args)
        except Exception as exc:  # noqa: BLE001 - a graph we cannot compile runs in eager
            self._fail(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            self.compile_seconds += time.perf_counter() - t
            return self.gm.forward(*args)
        refs = [args[i] for i in indices]
        self._programs.append((indices, refs, [r._version for r in refs], program))
        self.compile_seconds += time.perf_counter() - t
        return outs

    def _fail(self, why: str) -> None:
        self.fallback = why
        self._programs.clear()
        warnings.warn(
            f"autofusion: graph {self.index} runs in eager ({why})",
            AutofusionWarning,
            stacklevel=4,
        )

    def _compile(self, args: Sequence[Any]) -> tuple[Any, tuple[int, ...], Any]:
        from graph_autofusion.frontend.torch_frontend import import_fx
        from graph_autofusion.pipeline_cpu import fuse_model_cpu
        from graph_autofusion.runtime.pyprogram import generate_program

        _check_outputs(self.gm)
        # the import has no side effects and refuses graphs that write into their inputs,
        # so the reference run below is this call's only eager run
        imported = import_fx(self.gm, args)
        with torch.no_grad():
            expected = self.gm(*args)
        model = imported.model
        names = [v.name for v in model.graph.inputs]
        feeds = {n: args[i] for n, i in zip(names, imported.user_inputs)}
        outs = expected if isinstance(expected, tuple | list) else (expected,)
        chosen = None
        if self.config.saved_plan is not None:
            from graph_autofusion.torch_module import graph_fingerprint

            chosen = self.config.saved_plan.get(graph_fingerprint(model))
        self.plan_source = "saved" if chosen is not None else "planned"
        reference = {v.name: t for v, t in zip(model.graph.outputs, outs)}
        with torch.no_grad():
            result = fuse_model_cpu(
                model,
                self.config.ruleset(),
                self.config.hardware,
                options=self.config.options,
                feeds=feeds,
                reference=reference,
                chosen_keys=chosen,
            )
        self.result = result
        if result.end_to_end and not result.end_to_end.get("passed", True):
            raise GraphAutoFusionError(
                "the fused graph differs from eager (every fusion rolled back)"
            )
        program = generate_program(result.program, imported.user_inputs, len(args))
        self.source = program.source
        with torch.no_grad():  # the generated function itself, against eager
            got = program(*args)
        _same_as_eager(got, outs, self.config.options.e2e_cosine_floor)
        # this call returns the program's outputs, as every later call will: their layouts
        # feed Dynamo's guards on the next frame (a decode step's cache), and eager's may differ
        return (
            program,
            imported.constant_inputs,
            got if isinstance(expected, tuple | list) else got[0],
        )

    # ------------------------------------------------------------------ facts
    def summary(self) -> dict[str, Any]:
        res = self.result
        return {
            "graph": self.index,
            "fallback": self.fallback,
            "compile_seconds": round(self.compile_seconds, 3),
            "nodes": len(res.original.graph.nodes) if res is not None else None,
            "fused_groups": len(res.lowered) if res is not None else 0,
            "rolled_back": [(r.key, r.code) for r in res.rolled_back] if res is not None else [],
            "calls": self.calls,
            "eager_calls": self.eager_calls,
            "weight_sets": len(self._programs),
            "plan": self.plan_source,
        }


def _same_as_eager(got: Sequence[Any], want: Sequence[Any], floor: float) -> None:
    """Raise unless every output matches eager's (cosine, and relative error: a scaled
    answer has cosine 1)."""
    from graph_autofusion.verify.compare import compare_tensors

    if len(got) != len(want):
        raise GraphAutoFusionError(f"the program returns {len(got)} outputs, eager {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            raise GraphAutoFusionError(
                f"output {i}: {tuple(g.shape)} {g.dtype} where eager gives {tuple(w.shape)} "
                f"{w.dtype}"
            )
        if g.numel() == 0:
            continue
        if not w.dtype.is_floating_point:
            if not torch.equal(g, w):
                raise GraphAutoFusionError(f"output {i} differs from eager's")
            continue
        cmp = compare_tensors(g.detach().float().numpy(), w.detach().float().numpy())
        scale = float(w.detach().float().norm())
        rel = float((g.detach().float() - w.detach().float()).norm()) / max(scale, 1e-30)
        if cmp["cosine"] < floor or rel > REL_TOLERANCE[w.dtype]:
            raise GraphAutoFusionError(
                f"output {i} differs from eager's (cosine {cmp['cosine']:.6f}, relative "
                f"error {rel:.2e})"
            )


def _check_outputs(gm: torch.fx.GraphModule) -> None:
    """Refuse a graph returning something other than tensors (sizes, ``None``)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    for a in torch.fx.node.map_aggregate(out.args[0], lambda x: x) or ():
        val = a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a
        if not isinstance(val, torch.Tensor):
            raise GraphAutoFusionError(f"the graph returns a {type(val).__name__}, not a tensor")


def make_backend(
    *,
    preset: str = "all",
    hardware: Any = "host",
    safe_mode: bool = True,
    check_speed: bool = True,
    options: FuseOptions | None = None,
    rules: Any = None,
) -> Callable[..., Any]:
    """A ``torch.compile`` backend with these settings; ``backend.config.graphs`` lists what
    it compiled. ``check_speed``: safe mode also times each fusion against its operators on
    the real shapes (rolled back when slower) and plans the close calls the cost model marks
    ``maybe``."""
    opts = options or FuseOptions(target="cpu", safe_mode=safe_mode, check_speed=check_speed)
    if opts.target != "cpu":
        opts = opts.replace(target="cpu")
    config = BackendConfig(preset=preset, hardware=hardware, options=opts, rules=rules)

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        graph = CompiledGraph(gm, config, len(config.graphs))
        config.graphs.append(graph)
        return graph

    backend.config = config  # type: ignore[attr-defined]
    return backend


_DEFAULT: Callable[..., Any] | None = None


def autofusion_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The registered ``autofusion`` backend (default settings; see :func:`make_backend`)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = make_backend()
    return _DEFAULT(gm, example_inputs)


def default_graphs() -> list[CompiledGraph]:
    """The graphs the registered backend compiled in this process."""
    return list(_DEFAULT.config.graphs) if _DEFAULT is not None else []  # type: ignore[attr-defined]
