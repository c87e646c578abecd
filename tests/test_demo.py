"""``graph-autofusion demo`` (``make demo``): the ONNX MiniLM part end to end (the PyTorch parts
run in ``make demo``; their pieces are tested in tests/test_torch_module.py)."""

from __future__ import annotations

import importlib.util
import os

from graph_autofusion.cli import main


def test_demo_onnx_part_prints_the_summary_and_writes_the_report(tmp_path, capsys):
    html = tmp_path / "demo report.html"
    assert main(["demo", "--no-llama", "--runs", "3", "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "== Summary (every number measured in this run)" in out
    assert "MiniLM (onnxruntime target):" in out
    # MiniLM's six GELUs are found and reported: fused, or rolled back with safe mode's reason
    # (its speed verdict on the sample shapes goes either way on a noisy machine)
    assert "fused bias_gelu" in out or "rolled back bias_gelu@" in out, out
    assert "precision: output cosine" in out and "sentence embeddings" in out
    # the fused model against every engine on the machine, measured (whatever it shows)
    summary = out.split("== Summary (every number measured in this run)")[1].splitlines()
    assert "the fused model against the" in summary[1] and "the fastest of them" in summary[1]
    assert "ours: the fused model in onnxruntime ALL" in out
    assert "onnxruntime ALL on the export" in out and "ours/it" in out
    assert "onnxruntime transformers optimizer, then ALL" in out
    (ov,) = [line for line in out.splitlines() if line.startswith("  OpenVINO")]
    if importlib.util.find_spec("openvino") is None:
        assert "not measured: not installed" in ov
    else:  # measured beside ours
        assert "on the export (f32)" in ov and "ours/it" in ov
    assert "whole model: ours/ORT ALL" in out
    assert "demo: all checks passed" in out
    if "HTML report:" in out:
        assert os.path.getsize(html) > 0
