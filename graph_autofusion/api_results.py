"""What a fuse gives back, on the user's API (F14-F16): the reports, the precision and
performance checks, running the fused model, its kernels and saving it. A mixin of
:class:`~graph_autofusion.api.GraphAutoFusion` (``self.result``, ``self.model``,
``self.feeds`` and the rest are the API object's).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.core import Model


class FusedResults:
    """The reports, checks, runs and files of a fused model (mixed into ``GraphAutoFusion``)."""

    def float_check(self, feeds: Mapping[str, Any] | None = None):
        """The debug float check (F17) of the last ``fuse()``: each fused group's outputs
        against the original computing in float32, next to the drift the unfused model has
        anyway (a :class:`~graph_autofusion.verify.float_check.FloatCheckReport`)."""
        from graph_autofusion.verify.float_check import float_check

        return float_check(self._need_result(), feeds)

    def safe_fusion_report(self):
        """The last fuse run: fused, skipped by reason, rolled back with the failed check, and
        the end-to-end comparison (a ``SafeFusionReport``)."""
        from graph_autofusion.report.fuse_report import SafeFusionReport

        if self.torch_module is not None:  # one report per compiled graph, on its engine
            info = self._module_fusion().autofusion
            return [
                SafeFusionReport(r, f"{self.source_name} graph {r.engine['graph']}")
                for r in info.engine_results()
            ]
        return SafeFusionReport(self._need_result(), self.source_name)

    def html_report(self, *, precision: bool = True) -> str:
        """The self-contained HTML report (F14) of the last ``fuse()``: the graph before and
        after, fused groups, the candidate table, the safe-fusion summary, precision per fusion
        and per layer (``precision``: runs :meth:`verify_precision`), estimated against
        measured time per fusion, the hardware profile. Before any ``fuse()``: the plan of
        :meth:`analyze` on the model's graph."""
        from graph_autofusion.report.html_report import html_report

        if self.result is None:
            analysis = self.analyze()
            return html_report(analysis=analysis, model_name=self.source_name)
        prec = self.verify_precision() if precision else None
        return html_report(result=self.result, precision=prec, model_name=self.source_name)

    def write_html_report(self, path: str | os.PathLike[str], *, precision: bool = True):
        """Write :meth:`html_report` to ``path`` atomically (a temporary file, then
        ``os.replace``: never a half-written page); returns the path."""
        from graph_autofusion.report.analysis_report import write_atomic

        return write_atomic(path, self.html_report(precision=precision))

    # ------------------------------------------------------------------ verification
    def _proto(self, model: Any):
        from graph_autofusion.frontend.onnx_frontend import to_onnx

        if model is None:
            return to_onnx(self._need_result().model)
        if isinstance(model, Model):
            return to_onnx(model)
        if isinstance(model, str | os.PathLike):  # a bad file: ModelLoadError naming it
            from graph_autofusion.frontend.onnx_read import read_model
            from graph_autofusion.runtime.ort_session import saved_library

            proto = read_model(model)[0]
            saved_library(proto, model)  # a fused file's kernels (target cpu, custom ops)
            return proto
        return model

    def verify_precision(self, fused: Any = None, original: Any = None) -> dict[str, Any]:
        """Compare fused and original outputs in onnxruntime on the sample inputs: per output
        cosine, max abs and rel error, and a per-layer comparison of every intermediate value
        both models compute (by name)."""
        from graph_autofusion.frontend.onnx_frontend import load_onnx
        from graph_autofusion.verify.compare import compare_tensors
        from graph_autofusion.verify.safety import capture_activations

        if self.torch_module is not None:
            from graph_autofusion.torch_module import verify_precision

            return verify_precision(
                original if original is not None else self.torch_module,
                fused if fused is not None else self._module_fusion(),
                self.example_args,
                self.example_kwargs,
            )
        fused_p = self._proto(fused)
        orig_p = self._proto(original if original is not None else self.model)
        feeds = self.feeds()
        _same_interface(orig_p, fused_p, fused)
        with _onnxruntime_errors(self.model, feeds, _naming("verify_precision", fused)):
            a = capture_activations(load_onnx(orig_p), feeds)
            b = capture_activations(load_onnx(fused_p), feeds)
        outs = [o.name for o in orig_p.graph.output]
        outputs = {n: compare_tensors(b[n], a[n]) for n in outs if n in a and n in b}
        layers = {
            n: compare_tensors(b[n], a[n])
            for n in a
            if n in b
            and n not in outputs
            and n not in feeds
            and a[n].dtype.kind == "f"
            and a[n].shape == b[n].shape
        }
        worst = min((v["cosine"] for v in outputs.values()), default=1.0)
        return {
            "cosine": worst,
            "max_abs": max((v["max_abs"] for v in outputs.values()), default=0.0),
            "outputs": outputs,
            "layers": layers,
        }

    def verify_performance(
        self,
        fused: Any = None,
        *,
        runs: int = 20,
        warmup: int = 3,
        threads: int = 2,
        level: str = "all",
        new_tokens: int = 0,
    ) -> dict[str, Any]:
        """Measure the original and fused models in onnxruntime, side by side (alternating):
        median latency and spread, throughput, and the improvement. A PyTorch module: eager
        against the fused module, and with ``new_tokens`` the tokens/s of greedy
        ``generate(max_new_tokens=new_tokens)``."""
        from graph_autofusion.runtime.denormals import denormals_flushed
        from graph_autofusion.verify.subgraph import ort_session

        if self.torch_module is not None:
            from graph_autofusion.torch_module import verify_performance

            return verify_performance(
                self.torch_module,
                fused if fused is not None else self._module_fusion(),
                self.example_args,
                self.example_kwargs,
                runs=runs,
                warmup=warmup,
                new_tokens=new_tokens,
            )

        fused_p = self._proto(fused)
        orig_p = self._proto(self.model)
        feeds = self.feeds()
        # both as the fused model serves (FuseOptions.denormals): the improvement is the fusion's
        flush = denormals_flushed(self.options.denormals)
        what = _naming("verify_performance", fused)
        with _onnxruntime_errors(self.model, feeds, what):
            sessions = {
                "baseline": ort_session(orig_p, level, threads, flush_denormals=flush),
                "fused": ort_session(fused_p, level, threads, flush_denormals=flush),
            }

        def inputs(sess):
            names = {i.name for i in sess.get_inputs()}
            return {k: v for k, v in feeds.items() if k in names}

        from graph_autofusion.report import progress

        times: dict[str, list[float]] = {k: [] for k in sessions}
        guard = _onnxruntime_errors(self.model, feeds, what)
        with (
            guard,
            progress.task("bench: original and fused, alternating", total=warmup + runs) as tick,
        ):
            import onnxruntime as ort

            quiet = ort.RunOptions()  # a first untimed run of each: sample inputs the model
            quiet.log_severity_level = 4  # rejects are the guard's one error, with no log line
            for s in sessions.values():
                s.run(None, inputs(s), quiet)
            for _ in range(warmup):
                for s in sessions.values():
                    s.run(None, inputs(s))
                tick("warm-up")
            for _ in range(runs):
                for k, s in sessions.items():
                    f = inputs(s)
                    t = time.perf_counter()
                    s.run(None, f)
                    times[k].append(time.perf_counter() - t)
                tick()
        batch = next((int(v.shape[0]) for v in feeds.values() if np.ndim(v) > 0), 1)
        out: dict[str, Any] = {"runs": runs, "threads": threads, "level": level}
        out["denormals"] = self.options.denormals
        for k, ts in times.items():
            med = statistics.median(ts)
            out[k] = {
                "latency_ms": 1e3 * med,
                "min_ms": 1e3 * min(ts),
                "max_ms": 1e3 * max(ts),
                "throughput_per_s": batch / med,
            }
        out["improvement"] = out["baseline"]["latency_ms"] / out["fused"]["latency_ms"] - 1.0
        return out

    # ------------------------------------------------------------------ running
    def run(self, feeds: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Run the fused result on its target (the sample inputs when ``feeds`` is None);
        returns ``{output name: array}``."""
        if self.torch_module is not None:  # the fused module, called by argument name
            import torch

            from graph_autofusion.torch_outputs import output_tensors

            fused = self._module_fusion()
            named = {k: torch.as_tensor(np.asarray(v)) for k, v in (feeds or self.feeds()).items()}
            with torch.no_grad():
                outs = output_tensors(fused(**named))
            names = [v.name for v in self.model.graph.outputs]
            return {n: _to_numpy(t) for n, t in zip(names, outs)}
        result = self._need_result()
        feeds = dict(feeds) if feeds is not None else self.feeds()
        if getattr(result, "program", None) is not None:
            outs = result.program.run(feeds)
            return {k: _to_numpy(v) for k, v in outs.items()}
        from graph_autofusion.runtime.denormals import denormals_flushed
        from graph_autofusion.runtime.ort_session import ort_session

        with _onnxruntime_errors(self.model, feeds, "run"):
            if self._run_session is None or self._run_session[0] is not result:
                lib = getattr(getattr(result, "custom_ops", None), "path", None)
                threads = self.options.threads or 2
                flush = denormals_flushed(self.options.denormals)
                sess = ort_session(
                    self._proto(None), "all", threads, custom_ops_library=lib, flush_denormals=flush
                )
                self._run_session = (result, sess)  # one session per fused result
            sess = self._run_session[1]
            names = {i.name for i in sess.get_inputs()}
            got = sess.run(None, {k: np.asarray(v) for k, v in feeds.items() if k in names})
        return {o.name: v for o, v in zip(sess.get_outputs(), got)}

    def compile_fused_operators(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Write the generated kernels of the last ``fuse()`` to ``directory``: ``kernels.c``,
        ``kernels.so`` and ``manifest.json`` (kernel name, fused operators, signature, dtypes,
        source hash, compile options) for the torch runner's kernels; the custom-operator
        library's source, library and ``manifest.json`` for kernels that run inside onnxruntime
        (the cpu target's onnxruntime engine). Returns the manifest. A fused PyTorch module
        writes one folder per compiled graph (``graph<i>``), with the kernels of the engine
        that runs the graph (else of the other engine it built), and returns the manifests by
        folder.

        Raises:
            NotFusedYetError: ``fuse()`` has not run.
            GraphAutoFusionError: the last fuse used a target without generated kernels, or no
                graph of a fused module has any.
        """
        if self.torch_module is not None:  # every compiled graph's kernels, one folder each
            out = {}
            for i, g in enumerate(self._module_fusion().autofusion.graphs):
                # the kernels of the engine that runs the graph, else the other engine's
                ort_first = g.engine == "onnxruntime"
                where = os.path.join(os.fspath(directory), f"graph{i}")
                for res in (g.ort_result, g.result) if ort_first else (g.result, g.ort_result):
                    data = _write_kernels(res, where, empty=False)
                    if data is not None:
                        out[f"graph{i}"] = data
                        break
            if not out:
                raise GraphAutoFusionError(
                    "no compiled graph of the module has generated kernels (its fusions are "
                    "onnxruntime's own operators, or nothing was fused)"
                )
            return out
        result = self._need_result()
        data = _write_kernels(result, directory)
        if data is None:
            raise GraphAutoFusionError(
                f"the {self.target} target generates no kernels (its fused operators are "
                f"onnxruntime's); use GraphAutoFusion(..., target='cpu')"
            )
        return data

    def profile_fusion_kernel(self, key: str | int = 0, *, runs: int = 20) -> dict[str, Any]:
        """Time one fused kernel of the last ``fuse()`` (by candidate key or index) against its
        unfused operators on the sample shapes; report the achieved bandwidth against the
        profile's measured streaming bandwidth."""
        from graph_autofusion.kernel_profile import profile_kernel

        return profile_kernel(self._need_result(), key, self.hardware, runs=runs)

    # ------------------------------------------------------------------ saving
    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the fused model atomically. Refuses the input file's own path unless
        ``overwrite``; never leaves a partial file. A model using generated custom operators
        (onnxruntime target) gets its kernel folder beside it (``PATH.kernels/``: sources,
        library, manifest; ``self.kernel_dir``) and metadata naming the library; open it
        with :func:`graph_autofusion.runtime.ort_session.fused_session`."""
        from graph_autofusion.errors import ModelWriteError
        from graph_autofusion.frontend.onnx_frontend import save_onnx

        result = self._need_result()
        dest = os.path.abspath(os.fspath(path))
        if (
            self.source_path is not None
            and os.path.exists(dest)
            and os.path.samefile(dest, self.source_path)
            and not overwrite
        ):
            raise ModelWriteError(
                f"{path}: refusing to overwrite the input model (pass overwrite=True / --overwrite)"
            )
        from graph_autofusion.runtime.denormals import METADATA_KEY

        # the denormal mode it was verified with and serves with (fused_session's default)
        result.model.metadata_props = {
            **(result.model.metadata_props or {}),
            METADATA_KEY: self.options.denormals,
        }
        lib = getattr(result, "custom_ops", None)
        if lib is not None:  # the model needs its custom-operator library: written beside it
            from graph_autofusion.codegen.ort_customop import save_with_library

            groups = [low.payload for low in result.lowered if hasattr(low.payload, "kernel")]
            self.kernel_dir = save_with_library(result.model, dest, lib, groups)
            return
        self.kernel_dir = ""
        save_onnx(result.model, dest)


def _same_interface(original: Any, fused: Any, given: Any) -> None:
    """A fused model takes the original's inputs and gives its outputs (by name): another
    model is refused here, naming what differs, rather than compared on nothing (outputs
    neither has were skipped, and a model with none of the original's outputs passed)."""
    from graph_autofusion.errors import ModelLoadError

    def names(proto: Any) -> list[list[str]]:
        inits = {t.name for t in proto.graph.initializer}
        return [
            [v.name for v in values if v.name not in inits]
            for values in (proto.graph.input, proto.graph.output)
        ]

    (ins_o, outs_o), (ins_f, outs_f) = names(original), names(fused)
    extra = [n for n in ins_f if n not in ins_o]
    missing = [n for n in outs_o if n not in outs_f]
    why = []
    if extra:
        why.append(
            f"takes inputs the original has not ({', '.join(extra)}; the original's: "
            f"{', '.join(ins_o)})"
        )
    if missing:
        why.append(
            f"lacks outputs of the original ({', '.join(missing)}; its outputs: "
            f"{', '.join(outs_f)})"
        )
    if why:
        path = f" {os.fspath(given)}" if isinstance(given, str | os.PathLike) else ""
        raise ModelLoadError(
            f"the fused model{path} {' and '.join(why)}: verify compares a model with the one "
            f"it was fused from"
        )


def _naming(what: str, fused: Any) -> str:
    """``what``, with the fused model's file when one was given (an error names both)."""
    if isinstance(fused, str | os.PathLike):
        return f"{what} (fused model {os.fspath(fused)})"
    return what


@contextlib.contextmanager
def _onnxruntime_errors(model: Model, feeds: Mapping[str, Any], what: str):
    """onnxruntime failing on the sample inputs (or on the model) inside ``what``: one clear
    error naming the node and the inputs and pointing to ``--inputs``, not its traceback."""
    try:
        yield
    except GraphAutoFusionError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
        from graph_autofusion.errors import SampleInputError
        from graph_autofusion.samples.sample_inputs import is_generated, run_failure, source_of

        failure = run_failure(
            model, feeds, exc, runtime="onnxruntime", generated=is_generated(feeds)
        )
        if failure is not None:
            raise SampleInputError(*failure.args) from exc
        raise GraphAutoFusionError(
            f"{source_of(model)}: {what}: onnxruntime cannot run the model: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from exc


def _to_numpy(t: Any) -> np.ndarray:
    import torch

    if isinstance(t, torch.Tensor):
        t = t.detach()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return np.asarray(t)


def _write_kernels(
    result: Any, directory: str | os.PathLike[str], empty: bool = True
) -> dict[str, Any] | None:
    """Write ``result``'s generated kernels to ``directory`` (``compile_fused_operators``):
    the torch runner's kernels, or the onnxruntime custom-operator library's (the cpu target's
    onnxruntime engine, the PyTorch route's onnxruntime program). ``None`` when it has no
    library (``empty=False``: or no kernel in it)."""
    if result is None:
        return None
    kernels = getattr(result, "kernels", None)
    if kernels is not None and not (kernels or empty):
        return None
    if kernels is not None:
        from graph_autofusion.codegen.manifest import write_kernel_dir

        return write_kernel_dir(result, directory)
    lib = getattr(result, "custom_ops", None)
    groups = [low.payload for low in result.lowered if hasattr(low.payload, "kernel")]
    if lib is None or not (groups or empty):
        return None
    from graph_autofusion.codegen.ort_customop import write_kernel_dir as write_ops

    return write_ops(lib, os.fspath(directory), groups)
