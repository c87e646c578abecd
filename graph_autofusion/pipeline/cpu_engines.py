"""The cpu target on an ONNX model: two engines, the faster one on the real inputs kept.

    result = fuse_onnx_cpu(model, rules, profile, options=FuseOptions(target="cpu"), feeds=feeds)
    result.engine["name"]        # "onnxruntime" or "torch"
    result.engine["ms"]          # each engine's measured time on the sample inputs
    result.engine["why"]         # how it was chosen

The engines:

- **onnxruntime**: the ONNX route with the generated kernels as onnxruntime custom operators
  (:func:`graph_autofusion.pipeline.fuse_model` with ``custom_ops``): the planned groups with no
  onnxruntime operator become one ``ai.graph_autofusion`` node each, the others onnxruntime's
  own fused operators, and every other operator is onnxruntime's, so the target accepts every
  model onnxruntime runs (GRU, If, Loop, ...). The result is the ONNX route's ``FuseResult``
  (``result.custom_ops``: the library; ``GraphAutoFusion.save`` writes it beside the model).
- **torch**: :func:`graph_autofusion.pipeline.cpu.fuse_model_cpu`, the generated kernels
  called from the torch runner and every other operator on torch's kernels (oneDNN's GEMM,
  which can beat onnxruntime's MLAS on some CPUs); ``result.program`` runs it.

A model with an operator the torch runner lacks gets the onnxruntime engine, without
building or trying the torch one. Otherwise, with safe mode's speed check on
(``check_speed``), both engines are built (each with its own safe mode) and timed on the sample
inputs, each call through :func:`graph_autofusion.runtime.timing.current_timer` as
``timer("engine@model", engine_name, fn)`` (a test pins the choice with ``use_timer``), in a
seeded shuffled order each round, each engine timed on its second consecutive call (the one
engine timing of :meth:`graph_autofusion.verify.speed.SpeedPolicy.engine_times`); the
onnxruntime engine is kept only when strictly faster. Without the speed check the torch
engine runs the model, as the cpu target always did.

Without onnxruntime's C API header (``tools/ort_headers.sh``) the onnxruntime engine has no
generated kernels (onnxruntime's own fused operators only): one warning says so.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from graph_autofusion import defaults
from graph_autofusion.codegen.ort_customop import ort_include_dir
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Model
from graph_autofusion.pipeline.cpu import fuse_model_cpu
from graph_autofusion.pipeline.onnxruntime import fuse_model
from graph_autofusion.report import progress as _progress
from graph_autofusion.runtime.denormals import denormals_flushed
from graph_autofusion.runtime.ort_session import SERVING_MODES, SERVING_SPINNING, ort_session
from graph_autofusion.runtime.timing import current_timer
from graph_autofusion.verify.inputs import generate_inputs
from graph_autofusion.verify.sample_inputs import own_copy
from graph_autofusion.verify.speed import SpeedPolicy

ENGINES = ("onnxruntime", "torch")
#: The timer key of the engine measurement (``side`` is the engine's name).
ENGINE_KEY = "engine@model"


class EngineWarning(UserWarning):
    """The cpu target's onnxruntime engine runs without generated kernels."""


def torch_unsupported(model: Model) -> list[str]:
    """The operators of ``model`` (main graph) the torch runner has no implementation for."""
    from graph_autofusion.runtime.torch_runtime import impl_for  # heavy: torch

    return sorted({n.qualified_op for n in model.graph.nodes if impl_for(n) is None})


class OrtEngineProgram:
    """A fused model of the onnxruntime engine in one onnxruntime session (its custom-operator
    library registered): ``run(feeds)`` returns ``{output name: array}``."""

    def __init__(
        self,
        result: Any,
        threads: int,
        spinning: bool | str = SERVING_SPINNING,
        flush_denormals: bool = True,
    ) -> None:
        lib = getattr(result, "custom_ops", None)
        self.session = ort_session(
            result.model,
            "all",
            threads,
            spinning=spinning,
            custom_ops_library=lib.path if lib is not None else None,
            flush_denormals=flush_denormals,
        )
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        got = self.session.run(
            None, {k: _numpy(v) for k, v in feeds.items() if k in self.input_names}
        )
        return dict(zip(self.output_names, got))


def _numpy(v: Any) -> np.ndarray:
    return v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)


def _threads(options: Any) -> int:
    if options.threads:
        return int(options.threads)
    import torch

    return torch.get_num_threads()


def fuse_onnx_cpu(
    original: Model,
    rules: Any,
    profile: Any,
    *,
    options: Any,
    feeds: Mapping[str, Any] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Any:
    """Fuse an ONNX model for the cpu target on the engine that runs it fastest (see the
    module docstring). Returns that engine's result with ``result.engine`` filled in and
    ``result.target == "cpu"``; ``original`` is not modified.

    Raises:
        GraphAutoFusionError: no engine can run the model (each engine's reason named).
    """
    options = options.replace(target="cpu")
    # own_copy: generated inputs stay marked as such (an error about them says so)
    feeds = own_copy(feeds) if feeds is not None else generate_inputs(original)
    missing = torch_unsupported(original)
    notes: dict[str, str] = {}
    if missing:
        notes["torch"] = f"no torch implementation for operators {missing}"
        wanted = ["onnxruntime"]
    elif options.check_speed and options.backend == "c":
        wanted = list(ENGINES)  # both, then measured
    else:  # no measurement (or the NumPy reference, which only the torch runner calls)
        wanted = ["torch"]
    built: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for engine in wanted:
        t = time.perf_counter()
        try:
            with _progress.task(f"cpu target: {engine} engine"):
                if engine == "onnxruntime":
                    built[engine] = _onnxruntime_engine(
                        original, rules, profile, options, feeds, progress
                    )
                else:
                    built[engine] = fuse_model_cpu(
                        original, rules, profile, options=options, feeds=feeds, progress=progress
                    )
        except Exception as exc:  # noqa: BLE001 - the other engine runs the model
            if len(wanted) == 1:
                raise
            notes[engine] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        finally:
            seconds[engine] = time.perf_counter() - t
    if not built:
        raise GraphAutoFusionError(
            "no engine can run the model: " + "; ".join(f"{k}: {v}" for k, v in notes.items())
        )
    t = time.perf_counter()
    times: dict[str, float] = {}
    if len(built) > 1:
        with _progress.task("cpu target: measure the engines"):
            times = measure_engines(
                built,
                feeds,
                _threads(options),
                SERVING_MODES[options.spinning],
                denormals_flushed(options.denormals),
            )
        name = "onnxruntime" if times["onnxruntime"] < times["torch"] else "torch"
        why = "measured on the sample inputs"
    else:
        (name,) = built
        if missing:
            why = "the torch runner cannot run the model"
        elif len(wanted) > 1:
            why = "the other engine failed"
        elif options.check_speed:
            why = "the NumPy reference backend runs on the torch engine"
        else:
            why = "no speed check: the torch engine, as before"
    result = built.pop(name)
    built.clear()
    result.target = "cpu"
    result.engine = {
        "name": name,
        "why": why,
        "ms": {k: round(v * 1e3, 4) for k, v in times.items()},
        "notes": notes,
    }
    result.timings = dict(result.timings)
    for k, v in seconds.items():
        result.timings[f"engine.{k}"] = v
    if times:
        result.timings["engine.choose"] = time.perf_counter() - t
    return result


def _onnxruntime_engine(
    original: Model, rules: Any, profile: Any, options: Any, feeds: Any, progress: Any
) -> Any:
    """The ONNX route with generated kernels as custom operators (one warning when the C API
    header is missing: onnxruntime's own fused operators only)."""
    if ort_include_dir() is None:
        warnings.warn(
            "cpu target: onnxruntime's C API header is not available (sh tools/ort_headers.sh): "
            "the onnxruntime engine runs no generated kernels, only onnxruntime's own fused "
            "operators",
            EngineWarning,
            stacklevel=4,
        )
    opts = options.replace(target="onnxruntime", custom_ops=True)
    return fuse_model(original, rules, profile, options=opts, feeds=feeds, progress=progress)


def measure_engines(
    built: Mapping[str, Any],
    feeds: Mapping[str, Any],
    threads: int,
    spinning: bool | str = SERVING_SPINNING,
    flush_denormals: bool = True,
) -> dict[str, float]:
    """Each built engine's median seconds on ``feeds`` (see the module docstring); the
    onnxruntime engine as it serves (``spinning``, ``flush_denormals``)."""
    import torch

    calls: dict[str, Callable[[], Any]] = {}
    for name, res in built.items():
        if name == "onnxruntime":
            prog = OrtEngineProgram(res, threads, spinning, flush_denormals)
            arrays = {k: _numpy(v) for k, v in feeds.items()}
            calls[name] = lambda prog=prog, arrays=arrays: prog.run(arrays)
        else:
            calls[name] = lambda res=res: res.program.run(feeds)
    with torch.no_grad():
        samples = SpeedPolicy().engine_times(
            calls, ENGINE_KEY, rounds=defaults.ENGINE_TIMING_ROUNDS, timer=current_timer()
        )
    return {k: statistics.median(v) for k, v in samples.items()}
