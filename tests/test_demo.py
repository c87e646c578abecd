"""``graph-autofusion demo`` (``make demo``): the ONNX MiniLM part end to end (the PyTorch parts
run in ``make demo``; their pieces are tested in tests/test_torch_module.py)."""

from __future__ import annotations

import os

from graph_autofusion.cli import main


def test_demo_onnx_part_prints_the_summary_and_writes_the_report(tmp_path, capsys):
    html = tmp_path / "demo report.html"
    assert main(["demo", "--no-llama", "--runs", "3", "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "== Summary (every number measured in this run)" in out
    assert "MiniLM (onnxruntime target):" in out and "fused bias_gelu" in out
    assert "precision: output cosine" in out and "sentence embeddings" in out
    assert "whole model vs onnxruntime's own optimizer" in out
    assert "demo: all checks passed" in out
    if "HTML report:" in out:
        assert os.path.getsize(html) > 0
