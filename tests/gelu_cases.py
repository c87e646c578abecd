"""The GELU tests' shared steps (``tests/test_ort_gelu.py``, ``tests/test_ort_gelu_sites.py``):
fuse an IR model with or without custom operators, the slow-fused timer, and the saved fused
model against onnxruntime at other sizes."""

from __future__ import annotations

from typing import Any

import numpy as np

from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.ort_session import fused_session, ort_session


def fuse_gelu_model(
    text: str, feeds: dict[str, np.ndarray], custom_ops: bool, check_speed: bool = False
) -> Any:
    """``GraphAutoFusion`` of the IR ``text`` (preset ``all``, the AVX2 profile) fused on
    ``feeds``, custom operators on or off."""
    gaf = GraphAutoFusion(parse_model(text), preset="all", hardware="x86_avx2", sample_inputs=feeds)
    gaf.options = gaf.options.replace(custom_ops=custom_ops)
    gaf.fuse(check_speed=check_speed)
    return gaf


def fused_twice_as_slow(key: str, side: str, fn: Any) -> float:
    """Safe mode's timer (``use_timer``): the sessions run; every fused side takes twice the
    unfused."""
    fn()
    return 10e-6 if side == "unfused" else 20e-6


def assert_same_at_other_sizes(text: str, path: str, feeds_for: Any) -> None:
    """The saved fused model at ``path`` computes what onnxruntime computes on the IR ``text``
    at sizes other than the sample's (``feeds_for(batch, seq, seed)``)."""
    ref = ort_session(to_onnx(parse_model(text)), "all")
    sess = fused_session(path)
    for batch, seq in ((1, 1), (3, 7), (2, 300)):
        feeds = feeds_for(batch, seq, seed=seq)
        (want,) = ref.run(None, feeds)
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.abs(want).max()))
