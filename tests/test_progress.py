"""Progress on long work (F16): every long step reports to the installed display; nothing is
shown when stderr is not a terminal or with ``--quiet``."""

from __future__ import annotations

import io
import subprocess
import sys

import onnx

from graph_autofusion import GraphAutoFusion
from graph_autofusion.cli import main
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.report import progress
from tests.test_controls import _model


class Recorder:
    """Stands in for the terminal display only: records what the pipeline reported."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self._n = 0

    def add(self, name, total):
        self._n += 1
        self.events.append(("add", name))
        return self._n

    def update(self, tid, name, done, total, label):
        self.events.append(("update", name, str(done), str(total)))

    def remove(self, tid):
        self.events.append(("remove", str(tid)))

    def names(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "add"]


def _record(fn):
    rec = Recorder()
    token = progress._REPORTER.set(rec)
    try:
        fn()
    finally:
        progress._REPORTER.reset(token)
    return rec


def test_fuse_reports_analysis_safe_mode_and_end_to_end():
    gaf = GraphAutoFusion(_model(), hardware="x86_avx2")
    rec = _record(lambda: gaf.fuse(check_speed=False))
    names = rec.names()
    assert any(n.startswith("analyze ") for n in names)
    assert "safe mode: capture activations" in names
    assert "fuse: verify" in names and "safe mode: end-to-end check" in names
    adds = sum(e[0] == "add" for e in rec.events)
    assert adds == sum(e[0] == "remove" for e in rec.events)  # every line removed when done


def test_cpu_target_reports_its_stages_and_bench_counts_runs():
    gaf = GraphAutoFusion(_model(), hardware="x86_avx2", target="cpu")
    names = _record(lambda: gaf.fuse(check_speed=False)).names()
    for stage in ("plan", "lower", "compile", "verify"):
        assert f"cpu target: {stage}" in names
    ort = GraphAutoFusion(_model(), hardware="x86_avx2")
    ort.fuse(check_speed=False)
    rec = _record(lambda: ort.verify_performance(runs=4, warmup=1))
    ticks = [e for e in rec.events if e[0] == "update" and e[1].startswith("bench")]
    assert [t[2] for t in ticks] == ["1", "2", "3", "4", "5"] and ticks[-1][3] == "5"


def test_calibration_reports_each_measurement():
    from graph_autofusion.cost.calibrate import calibrate_host

    rec = _record(lambda: calibrate_host(quick=True))
    ticks = [e for e in rec.events if e[0] == "update" and e[1] == "calibrate host"]
    assert [t[2] for t in ticks] == [str(i) for i in range(1, 8)]
    assert all(t[3] == "7" for t in ticks)


def test_nothing_is_shown_without_a_terminal_or_with_quiet(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(to_onnx(_model()), src)
    run = [sys.executable, "-m", "graph_autofusion"]
    args = ["fuse", str(src), "-o", str(out), "--hardware", "x86_avx2", "--no-speed-check"]
    for extra in ([], ["--quiet"]):
        res = subprocess.run([*run, *extra, *args], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stderr.strip().splitlines() == [f"fused model written to {out}"]


def test_rich_display_renders_tasks_on_a_terminal_like_stream(monkeypatch):
    """The real rich display: forced on, it draws the task's description."""
    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(
        "rich.console.Console",
        lambda **kw: Console(file=buf, force_terminal=True, width=100),
    )
    with progress.reporting(True):
        with progress.task("compile kernels", total=2) as tick:
            tick("k1")
            tick("k2")
    assert "compile kernels" in buf.getvalue()


def test_quiet_flag_parses(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(to_onnx(_model()), src)
    assert main(["--quiet", "inspect", str(src)]) == 0
