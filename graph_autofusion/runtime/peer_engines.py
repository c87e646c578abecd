"""The other engines a CPU user would pick for the same ONNX file, for side-by-side
comparisons (``graph-autofusion demo``, ``benchmarks/``): onnxruntime's transformers optimizer
and OpenVINO.

    sess = OpenVINOSession("model.onnx")     # PeerUnavailable when openvino is not installed
    out = transformers_optimized("model.onnx", "peer.onnx", "bert", num_heads=12, hidden_size=384)
    times = time_engines({"ort": s1, "openvino": sess}, feeds, runs=20)   # name -> stats, ms
    cpu_facts()     # {"cpu": model name, "isa": [...], "cpus": n}: what a result was run on

OpenVINO runs the ONNX file on its CPU plugin with :data:`OV_CONFIG`: float32
(``INFERENCE_PRECISION_HINT`` f32; without it OpenVINO computes in bf16 on CPUs with AMX or
AVX-512 BF16), :data:`THREADS` inference threads and the latency hint (one stream), the
settings our onnxruntime sessions are timed with. OpenVINO is an optional (benchmark)
dependency: without it, :class:`PeerUnavailable`.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.runtime.timing import round_robin, summarize

THREADS = 2
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
ISA_FLAGS += ("avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
OV_CONFIG: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "INFERENCE_NUM_THREADS": THREADS,
    "PERFORMANCE_HINT": "LATENCY",
}


class PeerUnavailable(GraphAutoFusionError):
    """A peer engine that does not apply or is not installed (recorded, not a failure)."""


def openvino_version() -> str:
    """OpenVINO's version, or ``"not installed"``."""
    try:
        import openvino
    except ImportError:
        return "not installed"
    return openvino.__version__.split("-")[0]


class OpenVINOSession:
    """An OpenVINO CPU model of an ONNX file behind onnxruntime's ``run`` / ``get_inputs`` /
    ``get_outputs`` (outputs in the file's order).

    Raises:
        PeerUnavailable: openvino is not installed.
    """

    def __init__(self, path: str | os.PathLike[str], config: Mapping[str, Any] | None = None):
        import onnx

        try:
            import openvino
        except ImportError as exc:
            raise PeerUnavailable("not installed") from exc
        proto = onnx.load(os.fspath(path), load_external_data=False)
        inits = {i.name for i in proto.graph.initializer}
        self._in = [SimpleNamespace(name=i.name) for i in proto.graph.input if i.name not in inits]
        self._out = [SimpleNamespace(name=o.name) for o in proto.graph.output]
        cfg = dict(OV_CONFIG if config is None else config)
        self.model = openvino.Core().compile_model(os.fspath(path), "CPU", cfg)
        self.request = self.model.create_infer_request()

    def get_inputs(self) -> list[Any]:
        return self._in

    def get_outputs(self) -> list[Any]:
        return self._out

    def run(self, _names: Any, feeds: Mapping[str, Any]) -> list[Any]:
        res = self.request.infer(dict(feeds))
        return [res[p] for p in self.model.outputs]


def transformers_optimized(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    model_type: str,
    num_heads: int = 0,
    hidden_size: int = 0,
) -> str:
    """``onnxruntime.transformers.optimizer.optimize_model`` on ``path`` with its defaults,
    saved to ``out`` (returned); its errors propagate (a peer failure is a result)."""
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(
        os.fspath(path), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size
    )
    opt.save_model_to_file(os.fspath(out))
    return os.fspath(out)


def time_engines(
    sessions: Mapping[str, Any], feeds: Mapping[str, Any], runs: int = 20, warmup: int = 3
) -> dict[str, dict[str, float]]:
    """Every session on ``feeds`` (only the inputs it declares), side by side: ``warmup``
    calls each, then ``runs`` rounds of one call each, every round in its own seeded shuffled
    order (:func:`~graph_autofusion.runtime.timing.round_robin` with ``rotate``). Returns each
    name's median, 10th and 90th percentile in ms."""

    fns = {}
    for name, sess in sessions.items():
        declared = {i.name for i in sess.get_inputs()}
        ins = {k: np.asarray(v) for k, v in feeds.items() if k in declared}
        fns[name] = lambda sess=sess, ins=ins: sess.run(None, ins)
    return summarize(round_robin(fns, runs, warmup, rotate=True))


def cpu_facts() -> dict[str, Any]:
    """The CPU model (``/proc/cpuinfo``'s model name), its ISA extensions that matter to the
    GEMM kernels (:data:`ISA_FLAGS` present), and the logical CPU count."""
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key.strip() == "model name":
                cpu = val.strip()
            elif key.strip() == "flags":
                flags = set(val.split())
    return {"cpu": cpu, "isa": [f for f in ISA_FLAGS if f in flags], "cpus": os.cpu_count()}
