"""The peers every side-by-side benchmark shares, and the facts a results file records.

    sess = OpenVINOSession(path)        # raises Unavailable when openvino is not installed
    outs = sess.run(None, feeds)        # like an onnxruntime session
    facts = cpu_facts()                 # {"cpu": model name, "isa": [...], "cpus": n}

OpenVINO runs the ONNX export directly on its CPU plugin with ``OV_CONFIG``: float32
(``INFERENCE_PRECISION_HINT`` f32: without it OpenVINO computes in bf16 on CPUs with AMX or
AVX-512 BF16), ``THREADS`` inference threads and the latency hint (one stream), the settings
our onnxruntime sessions run with. Used by ``torch_e2e_engines.py`` (``torch_e2e.py``),
``vs_ort_optimizer.py`` and ``vs_ort_decode.py``; OpenVINO is a benchmark dependency only.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from types import SimpleNamespace
from typing import Any

THREADS = 2
OV_CONFIG: dict[str, Any] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "INFERENCE_NUM_THREADS": THREADS,
    "PERFORMANCE_HINT": "LATENCY",
}
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
ISA_FLAGS += ("avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


class Unavailable(Exception):
    """A configuration that does not apply or is not installed (recorded, not a failure)."""


class OpenVINOSession:
    """An OpenVINO CPU model behind onnxruntime's ``run``/``get_inputs``/``get_outputs``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import onnx

        try:
            import openvino
        except ImportError as exc:
            raise Unavailable("not installed") from exc
        proto = onnx.load(str(path), load_external_data=False)
        inits = {i.name for i in proto.graph.initializer}
        self._in = [SimpleNamespace(name=i.name) for i in proto.graph.input if i.name not in inits]
        self._out = [SimpleNamespace(name=o.name) for o in proto.graph.output]
        self.model = openvino.Core().compile_model(str(Path(path)), "CPU", OV_CONFIG)
        self.request = self.model.create_infer_request()

    def get_inputs(self) -> list[Any]:
        return self._in

    def get_outputs(self) -> list[Any]:
        return self._out

    def run(self, _names: Any, feeds: dict[str, Any]) -> list[Any]:
        res = self.request.infer(feeds)
        return [res[p] for p in self.model.outputs]


def openvino_version() -> str:
    try:
        import openvino
    except ImportError:
        return "not installed"
    return openvino.__version__.split("-")[0]


def cpu_facts() -> dict[str, Any]:
    """The CPU model (``/proc/cpuinfo``'s model name), its ISA extensions that matter to the
    GEMM kernels (``ISA_FLAGS`` present), and the logical CPU count."""
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key.strip() == "model name":
                cpu = val.strip()
            elif key.strip() == "flags":
                flags = set(val.split())
    return {"cpu": cpu, "isa": [f for f in ISA_FLAGS if f in flags], "cpus": os.cpu_count()}
