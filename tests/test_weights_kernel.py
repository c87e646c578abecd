"""``FuseOptions.weights_kernel`` (issue 22): the kernel of int8/int4 contractions asked for by
the user (``GemvQ`` or ``MatMulNBits``), not raced by safe mode; ``auto`` is tested in
``test_ort_gemv_q.py``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_autofusion import GraphAutoFusion
from graph_autofusion.options import FuseOptions, OptionsError
from graph_autofusion.runtime.ort_session import fused_session, ort_session
from graph_autofusion.runtime.timing import use_timer
from tests.test_ort_gemv_q import _mlp, _ops, fused_session_of
from tests.tiny_models import matmul_chain


def _timer(gemvq_faster: bool, keys: list[str]):
    """Compressed faster than fp32; GemvQ ranked faster or slower than MatMulNBits (each call
    still runs); every key timed is recorded."""

    def timer(key, side, fn):
        keys.append(key)
        fn()
        if key.startswith("weights-kernel@"):
            return (1e-5 if gemvq_faster else 3e-5) if side == "fused" else 2e-5
        return 1e-5 if side == "fused" else 2e-5

    return timer


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("form", ["int8", "int4"])
@pytest.mark.parametrize("check_speed", [True, False])
def test_gemvq_asked_for_runs_every_layer_untimed_against_matmulnbits(form, check_speed):
    """The timer ranks GemvQ slower: asked for, every layer is on it anyway, never raced
    (no ``weights-kernel@`` timing), each still checked against fp32; the saved model runs."""
    src = _mlp()
    x = np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32)
    opts = FuseOptions(weights=form, weights_kernel="GemvQ", check_speed=check_speed)
    gaf = GraphAutoFusion(src, sample_inputs={"x": x}, options=opts)
    keys: list[str] = []
    with use_timer(_timer(False, keys)):
        fused = gaf.fuse()
    assert not [k for k in keys if k.startswith("weights-kernel@")]
    assert bool([k for k in keys if k.startswith("weights@")]) == check_speed
    layers = gaf.result.weights.layers
    assert {r.kernel for r in layers} == {"GemvQ"} and len(layers) == 3
    assert all(r.kernel_times_us is None and r.cosine is not None for r in layers)
    assert _ops(fused).get("GemvQ") == 3 and "MatMulNBits" not in _ops(fused)
    note = " ".join(gaf.result.weights.notes)
    assert "weights_kernel='GemvQ': 3 of the 3 int8/int4 contractions on GemvQ" in note
    got = fused_session_of(gaf, {"x": x})
    want = ort_session(src, "disable", 2).run(None, {"x": x})[0]
    assert _cos(got, want) > (0.9999 if form == "int8" else 0.99)


def test_matmulnbits_asked_for_is_kept_where_gemvq_would_time_faster():
    src = _mlp()
    x = np.random.default_rng(2).standard_normal((1, 1, 64)).astype(np.float32)
    opts = FuseOptions(weights="int8", weights_kernel="MatMulNBits")
    gaf = GraphAutoFusion(src, sample_inputs={"x": x}, options=opts)
    keys: list[str] = []
    with use_timer(_timer(True, keys)):
        fused = gaf.fuse()
    assert not [k for k in keys if k.startswith("weights-kernel@")]
    assert {r.kernel for r in gaf.result.weights.layers} == {"MatMulNBits"}
    assert _ops(fused).get("MatMulNBits") == 3 and "GemvQ" not in _ops(fused)
    assert gaf.result.custom_ops is None  # onnxruntime's own operator: no library to ship
    note = " ".join(gaf.result.weights.notes)
    assert "the 3 int8/int4 contractions on MatMulNBits, not timed against GemvQ" in note


def test_the_note_counts_what_the_model_holds_after_the_speed_check():
    """A layer the speed check keeps fp32 is not counted on GemvQ; nor is an embedding table
    (``weights_policy="all"``: its own operator), and a head GemvQ cannot take (N = 300) is
    counted on MatMulNBits."""
    src = _mlp()
    x = np.random.default_rng(3).standard_normal((1, 1, 64)).astype(np.float32)
    opts = FuseOptions(weights="int8", weights_kernel="GemvQ")
    gaf = GraphAutoFusion(src, sample_inputs={"x": x}, options=opts)
    inner = _timer(False, [])

    def timer(key, side, fn):  # fc2 slower compressed than fp32
        return (3e-5 if side == "fused" else 2e-5) if key == "weights@fc2" else inner(key, side, fn)

    with use_timer(timer):
        gaf.fuse()
    kernels = {r.name: r.kernel for r in gaf.result.weights.layers}
    assert kernels == {"fc1": "GemvQ", "fc2": "", "fc3": "GemvQ"}
    assert "2 of the 2 int8/int4 contractions on GemvQ" in " ".join(gaf.result.weights.notes)

    from tests.test_compressed_weights import _tiny_lm

    ids = {"ids": np.array([[1, 5, 299, 7]], np.int64)}
    opts = FuseOptions(
        weights="int8", weights_policy="all", weights_kernel="GemvQ", check_speed=False
    )
    lm = GraphAutoFusion(_tiny_lm(), sample_inputs=ids, options=opts)
    fused = lm.fuse()
    kernels = {r.name: r.kernel for r in lm.result.weights.layers}
    assert kernels["fc"] == "GemvQ" and kernels["lm_head"] == "MatMulNBits"
    assert _ops(fused).get("GatherBlockQuantized") == 1
    note = " ".join(lm.result.weights.notes)
    assert "1 of the 2 int8/int4 contractions on GemvQ" in note and "1 on MatMulNBits" in note


def test_gemvq_asked_for_without_its_library_runs_on_matmulnbits(monkeypatch):
    from graph_autofusion.pipeline import weights
    from graph_autofusion.pipeline.ort_kernels import CustomOpsUnavailable

    def unavailable(*_a, **_k):
        raise CustomOpsUnavailable("no compiler here (test)")

    monkeypatch.setattr(weights, "with_gemv", unavailable)
    x = np.random.default_rng(5).standard_normal((1, 1, 64)).astype(np.float32)
    opts = FuseOptions(weights="int4", weights_kernel="GemvQ", check_speed=False)
    gaf = GraphAutoFusion(_mlp(), sample_inputs={"x": x}, options=opts)
    fused = gaf.fuse()
    assert {r.kernel for r in gaf.result.weights.layers} == {"MatMulNBits"}
    assert _ops(fused).get("MatMulNBits") == 3 and gaf.result.custom_ops is None
    note = " ".join(gaf.result.weights.notes)
    assert "GemvQ not tried: no compiler here (test)" in note
    assert "asked for, but its library did not build: the 3 int8/int4" in note


def test_a_saved_plan_of_other_weights_ignores_the_kernel_choice():
    """Rebuilding a plan's options with its own weights: a plan without int weights drops
    ``weights_kernel`` instead of raising for a combination the user never wrote."""
    from graph_autofusion.torch_module import PLAN_VERSION, _plan_backend

    opts = FuseOptions(target="cpu", weights="int8", weights_kernel="GemvQ")
    for plan, kernel in (({}, "auto"), ({"weights": "int4"}, "GemvQ")):
        full = {"version": PLAN_VERSION, "graphs": [], **plan}
        backend = _plan_backend(full, preset="all", hardware="host", options=opts, rules=None)
        assert backend.config.options.weights_kernel == kernel


def test_gemvq_asked_for_leaves_the_layers_it_cannot_take_on_matmulnbits():
    """N not a multiple of 16 (64x120), K not whole blocks (120x64): MatMulNBits, said so."""
    rng = np.random.default_rng(4)
    ws = [
        (rng.standard_normal(s) * 0.1).astype(np.float32) for s in ((64, 120), (120, 64), (64, 64))
    ]
    src = matmul_chain(ws, x_shape=[1, 1, 64])  # fc1, fc2, fc3
    feeds = {"x": rng.standard_normal((1, 1, 64)).astype(np.float32)}
    opts = FuseOptions(
        weights="int8", weights_policy="all", weights_kernel="GemvQ", check_speed=False
    )
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=opts)
    gaf.fuse()
    kernels = {r.name: r.kernel for r in gaf.result.weights.layers}
    assert kernels == {"fc1": "MatMulNBits", "fc2": "MatMulNBits", "fc3": "GemvQ"}
    note = " ".join(gaf.result.weights.notes)
    assert "1 of the 3 int8/int4 contractions on GemvQ" in note
    assert "2 on MatMulNBits (GemvQ needs N a multiple of 16 and K in whole blocks)" in note
    got = fused_session_of(gaf, feeds)
    want = ort_session(src, "disable", 2).run(None, feeds)[0]
    assert _cos(got, want) > 0.999


def test_a_kernel_without_int_weights_or_an_unknown_one_is_refused():
    with pytest.raises(OptionsError, match="weights_kernel='GemvQ'.*weights='fp16'"):
        FuseOptions(weights="fp16", weights_kernel="GemvQ")
    with pytest.raises(OptionsError, match="weights_kernel='MatMulNBits'.*weights='fp32'"):
        FuseOptions(weights_kernel="MatMulNBits")
    with pytest.raises(OptionsError, match="unknown weights kernel 'gemv'"):
        FuseOptions(weights="int8", weights_kernel="gemv")
    assert FuseOptions(weights="int4", weights_kernel="GemvQ").weights_kernel == "GemvQ"


def test_cli_weights_kernel(tmp_path, capsys):
    from graph_autofusion.cli import main

    onnx.save(_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.int8.onnx"
    args = ["fuse", str(tmp_path / "mlp.onnx"), "-o", str(out), "--no-speed-check"]
    assert main([*args, "--weights", "int8", "--weights-kernel", "GemvQ"]) == 0
    assert sum(n.op_type == "GemvQ" for n in onnx.load(out).graph.node) == 3
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 5, 64)).astype(np.float32)}
    got = fused_session(str(out), threads=2).run(None, feeds)[0]
    want = ort_session(str(tmp_path / "mlp.onnx"), "disable", 2).run(None, feeds)[0]
    assert _cos(got, want) > 0.9999
    capsys.readouterr()
    assert main([*args, "--weights-kernel", "GemvQ"]) == 2  # fp32 weights: nothing to choose
    assert "weights_kernel='GemvQ'" in capsys.readouterr().err
    assert main([*args, "--weights", "int8", "--weights-goal", "small"]) == 2
    assert "--weights-goal: invalid choice: 'small'" in capsys.readouterr().err
    assert main([*args, "--weights", "int8", "--weights-goal", "size"]) == 0
