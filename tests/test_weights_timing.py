"""Safe mode's speed check of compressed weights times a layer at a decode step's cache
pressure: copies of the layer in one session run where the candidate layers outgrow the
last-level cache, one where they fit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion import GraphAutoFusion, defaults
from graph_autofusion.options import FuseOptions
from graph_autofusion.pipeline import weights_checks
from graph_autofusion.pipeline.weights_checks import timing_copies
from graph_autofusion.runtime.timing import use_timer
from tests.tiny_models import matmul_chain


def test_copies_follow_the_cache(monkeypatch):
    monkeypatch.setattr(weights_checks, "_llc_bytes", lambda: 32 << 20)
    assert timing_copies(10 << 20, 1 << 20) == 1  # the layers fit in half the cache
    want = 2 * (32 << 20) // (3 << 20) + 1  # ceil(2 x cache / layer)
    assert timing_copies(100 << 20, 3 << 20) == want
    assert timing_copies(100 << 20, 3 << 20) * (3 << 20) >= 2 * (32 << 20)
    assert timing_copies(10 << 30, 1 << 10) == defaults.WEIGHTS_TIMING_MAX_COPIES
    assert timing_copies(10 << 30, 300 << 20) == 1  # a layer beyond the cache: itself
    monkeypatch.setattr(weights_checks, "_llc_bytes", lambda: 2 << 30)
    assert timing_copies(10 << 30, 10 << 20) == 25  # 256 MB of copies at most


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((64, 128)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((128, 64)) * 0.1).astype(np.float32)
    return matmul_chain([w1, w2], x_shape=[1, 1, 64])


@pytest.mark.parametrize("cache,copies", [(32 << 20, 1), (64 << 10, 4)])
def test_the_speed_check_times_copies_and_reports_per_layer(monkeypatch, cache, copies):
    """With a 64 KB cache the MLP's 64 KB of fp32 weights outgrow half of it: each layer is
    timed as copies (enough for twice the cache, each of distinct bytes) and its times are per
    copy; each timed run really runs that many copies (the timer counts the outputs)."""
    monkeypatch.setattr(weights_checks, "_llc_bytes", lambda: cache)
    seen = []

    def timer(key, side, fn):
        out = fn()
        if key.startswith("weights@"):
            seen.append(len(out))
            # distinct copies (onnxruntime shares equal initializers: equal copies would be
            # read from cache once)
            assert len(out) == 1 or not np.allclose(out[0], out[1])
        return 4e-5 if side == "unfused" else 2e-5

    x = np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32)
    opts = FuseOptions(weights="int8", weights_policy="all")  # fc2 gives the output: a head
    gaf = GraphAutoFusion(_mlp(), sample_inputs={"x": x}, options=opts)
    with use_timer(timer):
        gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert all(r.form == "int8" for r in layers.values())
    assert {r.timing_copies for r in layers.values()} == {copies}
    assert set(seen) == {copies}
    for r in layers.values():
        assert r.time_us == pytest.approx(20.0 / copies)
        assert r.time_fp32_us == pytest.approx(40.0 / copies)


def _repeated() -> onnx.ModelProto:
    """Three 64x64 layers (the same shapes) and a 64x96 one."""
    rng = np.random.default_rng(2)
    ws = [(rng.standard_normal((64, 64)) * 0.1).astype(np.float32) for _ in range(3)]
    ws.append((rng.standard_normal((64, 96)) * 0.1).astype(np.float32))
    return matmul_chain(ws, x_shape=[1, 1, 64], first=0)


@pytest.mark.parametrize("slower", [False, True])
def test_repeated_layers_are_timed_once_and_share_the_verdict(slower):
    keys = set()

    def timer(key, side, fn):
        fn()
        keys.add(key.split("@")[0] + "@" + key.split("@")[1])
        if slower and key.startswith("weights@"):
            return 4e-5 if side == "fused" else 2e-5
        return 2e-5 if side == "fused" else 4e-5

    x = np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32)
    opts = FuseOptions(weights="int8", weights_policy="all")
    gaf = GraphAutoFusion(_repeated(), sample_inputs={"x": x}, options=opts)
    with use_timer(timer):
        gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert {k for k in keys if k.startswith("weights@")} == {"weights@fc0", "weights@fc3"}
    assert layers["fc1"].timed_as == layers["fc2"].timed_as == "fc0"
    assert layers["fc0"].timed_as == layers["fc3"].timed_as == ""
    assert layers["fc1"].time_us == layers["fc0"].time_us
    if slower:  # every layer slower compressed: the shared verdict names the layer timed
        assert all(r.form == "fp32" for r in layers.values())
        assert all(r.kernel == "" for r in layers.values())  # no kernel runs a layer kept fp32
        assert "timed as fc0" in layers["fc2"].reason
    else:
        assert all(r.form == "int8" for r in layers.values())
        kernels = {r.kernel for r in layers.values()}
        assert len(kernels) == 1  # the shared kernel verdict (GemvQ where it builds)
