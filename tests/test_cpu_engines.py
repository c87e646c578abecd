"""The cpu target on ONNX models the torch runner cannot run (GRU, If, Loop) or can (LSTM): the
onnxruntime engine with generated kernels as custom operators, the engine chosen by
measurement (pinned here with ``use_timer``) and reported; outputs equal onnxruntime's on the
original model."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")

from graph_autofusion import GraphAutoFusion  # noqa: E402
from graph_autofusion.codegen.ort_customop import DOMAIN, ort_include_dir  # noqa: E402
from graph_autofusion.pipeline.cpu_engines import ENGINE_KEY, EngineWarning  # noqa: E402
from graph_autofusion.runtime.timing import use_timer  # noqa: E402
from graph_autofusion.testing import ort_outputs  # noqa: E402
from graph_autofusion.testing.engine_models import (  # noqa: E402
    BATCH,
    HIDDEN,
    IN,
    SEQ,
    if_model,
    loop_model,
    recurrent_model,
)

pytestmark = pytest.mark.xdist_group("cpu_engines")

HEADER = ort_include_dir() is not None


def _save(tmp_path, name, model):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


def _feeds(name):
    rng = np.random.default_rng(1)
    shape = (BATCH, HIDDEN) if name in ("if", "loop") else (SEQ, BATCH, IN)
    return {"x": rng.standard_normal(shape).astype(np.float32)}


def _timer(fast_engine):
    """Real runs, set verdicts: every fusion is faster than its operators, and
    ``fast_engine`` is the faster engine; every engine timing is recorded."""
    seen = []

    def timer(key, side, fn):
        fn()
        if key == ENGINE_KEY:
            seen.append(side)
            return 1e-3 if side == fast_engine else 2e-3
        return 5e-6 if side == "fused" else 10e-6

    return timer, seen


def _passed(result):
    """The end-to-end check passed (either pipeline's form of it)."""
    e2e = result.end_to_end
    return all(v["passed"] for v in e2e.get("outputs", e2e).values())


def _check_outputs(gaf, path, feeds):
    got = gaf.run(feeds)
    want = ort_outputs(path, feeds)
    assert set(got) == set(want)
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=1e-5)


MODELS = {"gru": lambda: recurrent_model("GRU"), "if": if_model, "loop": loop_model}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_the_torch_runner_cannot_run_gets_the_onnxruntime_engine(tmp_path, name):
    model = MODELS[name]()
    path = _save(tmp_path, name, model)
    feeds = _feeds(name)
    gaf = GraphAutoFusion(path, target="cpu", sample_inputs=feeds)
    timer, seen = _timer("torch")
    with use_timer(timer):  # speed checks on: the torch engine is never even tried
        gaf.fuse()
    r = gaf.result
    assert r.engine["name"] == "onnxruntime" and seen == []
    assert "torch runner cannot run" in r.engine["why"]
    assert {"gru": "GRU", "if": "If", "loop": "Loop"}[name] in r.engine["notes"]["torch"]
    assert r.target == "cpu" and _passed(r)
    text = gaf.safe_fusion_report().to_text()
    assert "target cpu" in text and "engine: onnxruntime" in text
    if HEADER:  # the generated kernel runs inside onnxruntime as a custom operator
        assert r.custom_ops is not None
        assert any(n.domain == DOMAIN for n in r.model.graph.nodes), r.summary()
    _check_outputs(gaf, path, feeds)
    other = {"x": feeds["x"] * -1.5}  # other values (the If takes its other branch)
    _check_outputs(gaf, path, other)
    if HEADER:  # saved with its kernel folder; it runs in a plain session with the library
        from graph_autofusion.runtime.ort_session import fused_session

        out = str(tmp_path / f"{name}_fused.onnx")
        gaf.save(out)
        assert os.path.isfile(os.path.join(gaf.kernel_dir, "libgaf_custom_ops.so"))
        sess = fused_session(out)
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, ort_outputs(path, feeds)["out"], rtol=1e-4, atol=1e-5)
        data = gaf.compile_fused_operators(tmp_path / "kernels")
        assert data["groups"] and (tmp_path / "kernels" / "custom_ops.c").is_file()


@pytest.mark.parametrize("fast", ["onnxruntime", "torch"])
def test_the_engine_of_a_model_both_run_is_the_measured_faster_one(tmp_path, fast):
    path = _save(tmp_path, "lstm", recurrent_model("LSTM"))
    feeds = _feeds("lstm")
    gaf = GraphAutoFusion(path, target="cpu", sample_inputs=feeds)
    timer, seen = _timer(fast)
    with use_timer(timer):
        gaf.fuse()
    r = gaf.result
    assert sorted(set(seen)) == ["onnxruntime", "torch"]
    assert r.engine["name"] == fast and r.engine["why"] == "measured on the sample inputs"
    assert r.engine["ms"] == {"onnxruntime": 1.0 if fast == "onnxruntime" else 2.0,
                              "torch": 1.0 if fast == "torch" else 2.0}  # fmt: skip
    assert r.summary()["engine"]["name"] == fast
    assert r.lowered and _passed(r)
    if fast == "torch":  # the cpu target's program, generated kernels called from torch
        assert r.program is not None and r.kernels
    elif HEADER:
        assert any(n.domain == DOMAIN for n in r.model.graph.nodes)
    _check_outputs(gaf, path, feeds)


def test_without_the_header_the_onnxruntime_engine_runs_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPH_AUTOFUSION_ORT_INCLUDE", "")
    path = _save(tmp_path, "gru", recurrent_model("GRU"))
    feeds = _feeds("gru")
    gaf = GraphAutoFusion(path, target="cpu", sample_inputs=feeds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gaf.fuse(check_speed=False)
    ours = [w for w in caught if issubclass(w.category, EngineWarning)]
    assert len(ours) == 1 and "header" in str(ours[0].message)
    assert gaf.result.engine["name"] == "onnxruntime" and gaf.result.custom_ops is None
    _check_outputs(gaf, path, feeds)
