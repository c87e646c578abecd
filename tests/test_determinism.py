"""Determinism (issue 15): the same model and options give byte-identical outputs in two
separate processes.

Each case runs the pipeline twice in fresh interpreters started at the same time, with
different ``PYTHONHASHSEED`` values (set and dict-of-set iteration orders differ), different
working directories, output folders and kernel caches (a temporary or cache path written into
an output shows up as a difference), and compares:

* the fused model: the serialized ONNX bytes;
* the kernel sources and library (cpu target: every file of ``OUTPUT.kernels/``);
* the JSON report, with the fields listed in :data:`TIMING_FIELDS` removed (wall-clock
  durations: they are measurements, not results).

Safe mode runs (per-fusion checks, Monte-Carlo perturbations, end-to-end comparison), but
with its speed check off (``--no-speed-check``, ``check_speed=False``): that check keeps or
rolls back a fusion by timing it on this machine, so its decisions are measurements and
differ under load by design; ``tests/test_safety.py`` tests it with a set timer. Likewise the
hardware profile is a shipped one (``x86_avx2``), not ``host``, which is calibrated by
measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from graph_autofusion.testing import export_onnx

#: The report fields that hold wall-clock measurements, dropped before comparing (at any depth).
#: ``timings_s``: per-stage seconds; ``time_unfused_us``/``time_fused_us``: safe mode's speed
#: check (``None`` here, since it is off); ``measured_improvement``: derived from those times.
TIMING_FIELDS = frozenset({"timings_s", "time_unfused_us", "time_fused_us", "measured_improvement"})
PROFILE = "x86_avx2"
HASH_SEEDS = ("1", "4242")
TIMEOUT_S = 600


def without_timings(data: Any) -> Any:
    """``data`` (parsed JSON) with every key of :data:`TIMING_FIELDS` removed, at any depth."""
    if isinstance(data, dict):
        return {k: without_timings(v) for k, v in data.items() if k not in TIMING_FIELDS}
    if isinstance(data, list):
        return [without_timings(v) for v in data]
    return data


def _env(hash_seed: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONHASHSEED=hash_seed, GRAPH_AUTOFUSION_CACHE=str(cache))
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    return env


def _run_both(commands: list[tuple[list[str], Path, dict[str, str]]]) -> list[str]:
    """Start every command at once (cwd, env each), wait for all; their stdouts."""
    procs = [
        subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for cmd, cwd, env in commands
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, err[-4000:]
        outs.append(out)
    return outs


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("target", ["onnxruntime", "cpu"])
def test_the_cli_fuse_is_byte_identical_across_processes(tmp_path, target):
    """MiniLM (a 6-layer BERT, real weights) through ``graph-autofusion fuse --json``."""
    src = str(export_onnx("minilm", "torchscript"))
    commands = []
    for seed in HASH_SEEDS:
        run = tmp_path / f"run{seed}"
        run.mkdir()
        cmd = [sys.executable, "-m", "graph_autofusion", "fuse", src, "-o", str(run / "m.onnx")]
        cmd += ["--json", "--no-speed-check", "--hardware", PROFILE, "--target", target]
        commands.append((cmd, run, _env(seed, tmp_path / f"cache{seed}")))
    reports = [json.loads(out) for out in _run_both(commands)]
    runs = [tmp_path / f"run{seed}" for seed in HASH_SEEDS]

    assert reports[0]["fused"] > 0, reports[0]  # something was fused (and checked)
    assert not reports[0]["rolled_back"], reports[0]["rolled_back"]
    assert without_timings(reports[0]) == without_timings(reports[1])
    assert reports[0]["timings_s"] != reports[1]["timings_s"]  # the fields dropped were there
    assert (runs[0] / "m.onnx").read_bytes() == (runs[1] / "m.onnx").read_bytes()
    if target == "cpu":
        kernels = [_files(r / "m.kernels") for r in runs]
        assert {"kernels.c", "kernels.so", "manifest.json"} <= set(kernels[0])
        for name in kernels[0]:
            assert kernels[0][name] == kernels[1].get(name), f"m.kernels/{name} differs"
        assert set(kernels[0]) == set(kernels[1])


MODULE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from graph_autofusion import GraphAutoFusion
    from graph_autofusion.codegen.c_backend import library_source

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(64)
            self.fc = torch.nn.Linear(64, 128)

        def forward(self, x):
            h = self.ln(x)
            return torch.nn.functional.gelu(self.fc(h)) * 2.0 + torch.sigmoid(h).sum(-1, True)

    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8, 64)
    gaf = GraphAutoFusion(model, example_inputs=(x,), hardware=sys.argv[1])
    fused = gaf.fuse(check_speed=False)
    # the kernels of the engine that runs each graph (onnxruntime's custom operators here)
    results = fused.autofusion.engine_results()
    kernels = [[low.payload.kernel for low in r.lowered if hasattr(low.payload, "kernel")]
               for r in results]
    print(json.dumps({
        "plan": fused.autofusion.plan(),
        "reports": [r.to_dict() for r in gaf.safe_fusion_report()],
        "kernels": [library_source(ks) for ks in kernels],
    }, sort_keys=True, default=str))
    """
)


def test_a_pytorch_module_fuses_to_the_same_plan_and_kernels_across_processes(tmp_path):
    """The drop-in module path (``torch.compile`` backend, cpu target, generated kernels)."""
    commands = []
    for seed in HASH_SEEDS:
        run = tmp_path / f"run{seed}"
        run.mkdir()
        cmd = [sys.executable, "-c", MODULE_SCRIPT, PROFILE]
        commands.append((cmd, run, _env(seed, tmp_path / f"cache{seed}")))
    a, b = (json.loads(out) for out in _run_both(commands))
    assert a["kernels"] and all(a["kernels"]), a["kernels"]  # kernels were generated
    assert a["plan"] == b["plan"]
    assert a["kernels"] == b["kernels"]
    assert without_timings(a["reports"]) == without_timings(b["reports"])
