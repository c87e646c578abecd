"""Tiny ONNX models for the error, hostile-input and path tests (built in milliseconds)."""

from __future__ import annotations

import os

import numpy as np
import onnx

from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.ort_session import ort_session

#: shipped profile: no host calibration in these tests
PROFILE = "x86_avx2"
#: fuse options that keep a tiny model's fuse well under a second
FAST = ("--hardware", PROFILE, "--no-speed-check")

# MatMul + bias + erf-GELU: one bias_gelu fusion (BiasGelu) on the onnxruntime target.
BIAS_GELU = """
model opset {"": 18}
graph g(%x: f32[2,8]) -> (%y) {
  init %w: f32[8,8] = randn(0)
  init %b: f32[8] = randn(1)
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %h = MatMul(%x, %w)
  %hb = Add(%h, %b)
  %d = Div(%hb, %c)
  %e = Erf(%d)
  %e1 = Add(%e, %one)
  %m = Mul(%hb, %e1)
  %y = Mul(%m, %half)
}
"""


def write_model(path: str | os.PathLike[str]) -> str:
    """Write the tiny model to ``path``; returns the path as a string."""
    onnx.save(to_onnx(parse_model(BIAS_GELU)), os.fspath(path))
    return os.fspath(path)


def run(path: str | os.PathLike[str], x: np.ndarray | None = None) -> np.ndarray:
    """The model's output in onnxruntime on ``x`` (default: a fixed [2, 8] input)."""
    if x is None:
        x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    sess = ort_session(path, "all")
    return sess.run(None, {"x": x})[0]
