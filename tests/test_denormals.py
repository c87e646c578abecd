"""Denormal floats flushed to zero in the sessions that serve a fused model
(``FuseOptions.denormals``), and nowhere else: the calling thread keeps its own setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from graph_autofusion.options import FuseOptions, OptionsError
from graph_autofusion.runtime.denormals import SUPPORTED, flushing_denormals, mxcsr
from graph_autofusion.runtime.ort_session import ort_session

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="flush-to-zero is set per call on x86-64")

TINY = np.float32(1e-39)  # a denormal float32
ROOT = Path(__file__).resolve().parents[1]


def _ieee() -> bool:
    """Whether this thread computes denormals (2 x 1e-39 is not flushed to 0)."""
    return float((torch.tensor([TINY]) * 2)[0]) != 0.0


def _mul_model(n: int):
    """y = x * 1 over ``n`` floats: a denormal in stays one only without DAZ."""
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "one"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_block_flushes_and_the_thread_gets_its_setting_back():
    before = mxcsr()
    assert _ieee()
    with flushing_denormals():
        assert not _ieee()
    assert _ieee() and mxcsr() & 0x8040 == before & 0x8040
    with pytest.raises(KeyError), flushing_denormals():
        raise KeyError("inside")
    assert _ieee()
    with flushing_denormals(on=False):
        assert _ieee()


def test_a_thread_that_already_flushes_keeps_flushing():
    torch.set_flush_denormal(True)
    try:
        with flushing_denormals():
            assert not _ieee()
        assert not _ieee()  # the user's choice, not undone
    finally:
        torch.set_flush_denormal(False)
    assert _ieee()


@pytest.mark.parametrize("flush", [True, False])
def test_a_flushing_session_flushes_on_every_thread_and_only_in_its_runs(flush):
    n = 1 << 20  # large enough that onnxruntime splits the Mul over both threads
    sess = ort_session(_mul_model(n), "all", 2, flush_denormals=flush)
    assert _ieee()  # opening it changed nothing on this thread
    y = sess.run(None, {"x": np.full(n, TINY)})[0]
    if flush:
        assert not y.any()  # every element, whichever thread computed it
    else:
        assert (y == TINY).all()
    assert _ieee()  # nor did the run
    assert [i.name for i in sess.get_inputs()] == ["x"]  # the session's own attributes


FIRST_SESSION = """
import numpy as np, torch
from tests.test_denormals import _ieee, _mul_model, TINY
from graph_autofusion.runtime.ort_session import ort_session
{body}
print("ok")
"""


@pytest.mark.parametrize(
    "body",
    [
        # a flushing session first: the caller's thread stays IEEE, the runs flush
        "sess = ort_session(_mul_model(4), 'all', 2, flush_denormals=True)\n"
        "assert _ieee(), 'the first flushing session left this thread flushing'\n"
        "assert not sess.run(None, {'x': np.full(4, TINY)})[0].any()\n"
        "assert _ieee()",
        # a user who flushes, then a plain session first: the thread keeps flushing
        "torch.set_flush_denormal(True)\n"
        "sess = ort_session(_mul_model(4), 'all', 2)\n"
        "assert not _ieee(), 'a plain first session turned the user flushing off'",
    ],
    ids=["flushing-first", "plain-first-after-the-user-flushes"],
)
def test_the_first_session_of_a_process_leaves_the_callers_thread_as_it_was(body):
    """onnxruntime sets the flush-to-zero bits of the thread that opens a process's first
    session to that session's setting, for good; the helper puts them back. Each case in a
    fresh process, whose first session it opens."""
    out = subprocess.run(
        [sys.executable, "-c", FIRST_SESSION.format(body=body)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_an_unknown_mode_is_refused():
    with pytest.raises(OptionsError, match="denormals"):
        FuseOptions(denormals="zero")


@pytest.mark.parametrize("mode", ["flush", "keep"])
def test_the_torch_routes_session_follows_the_option(mode):
    """Half the outputs ~1e-30, half ~1e-40 (denormal): flushed, the second half is zero,
    which the engine's check against eager accepts (cosine 1); kept, all are eager's."""
    from graph_autofusion.torch_compile import make_backend

    def scale(x):
        return torch.tanh(x) * 1e-30

    backend = make_backend(
        engine="onnxruntime", options=FuseOptions(target="cpu", check_speed=False, denormals=mode)
    )
    compiled = torch.compile(scale, backend=backend)
    x = torch.cat([torch.ones(32), torch.full((32,), 1e-10)])
    with torch.no_grad():
        want, got = scale(x), compiled(x)
    assert want[32:].abs().min() > 0 and _ieee()
    (graph,) = backend.config.graphs
    assert graph.engine == "onnxruntime" and graph.fallback is None, graph.summary()
    assert torch.allclose(got[:32], want[:32], rtol=1e-6, atol=0)
    if mode == "flush":
        assert not got[32:].any()
    else:  # the denormal half computed as eager computes it
        assert got[32:].abs().min() > 0
        assert torch.allclose(got[32:], want[32:], rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", ["flush", "keep"])
def test_a_saved_model_serves_with_the_mode_it_was_fused_with(tmp_path, mode):
    import onnx

    from graph_autofusion import GraphAutoFusion
    from graph_autofusion.runtime.ort_session import fused_session

    src = tmp_path / "in.onnx"
    onnx.save(_mul_model(512), str(src))
    gaf = GraphAutoFusion(str(src), options=FuseOptions(denormals=mode, check_speed=False))
    gaf.fuse()
    out = tmp_path / "fused.onnx"
    gaf.save(str(out))
    x = np.full(512, TINY)
    y = fused_session(out).run(None, {"x": x})[0]
    assert (not y.any()) if mode == "flush" else (y == TINY).all()
    assert np.array_equal(gaf.run({"x": x})["y"], y)  # FuseResult.run serves the same way
    other = "keep" if mode == "flush" else "flush"
    y = fused_session(out, denormals=other).run(None, {"x": x})[0]
    assert (not y.any()) if other == "flush" else (y == TINY).all()
