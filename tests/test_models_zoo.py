"""Tests of the test-model zoo: builders, cached ONNX exports with both exporters, numerics."""

from __future__ import annotations

import collections
import functools
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing import (
    ALL_NAMES,
    EXPORTERS,
    MODEL_NAMES,
    TORCHSCRIPT_OPSET,
    build_model,
    cache_dir,
    example_feeds,
    example_inputs,
    export_info,
    export_onnx,
    export_path,
    minilm_path,
    minilm_sentence_embeddings,
    minilm_tokenize,
    model_spec,
    run_eager,
)

# ResNet-50 logits reach ~20 with random weights: 2e-4 absolute is ~1e-5 relative.
TOLERANCE = {"resnet50": 2e-4, "resnet50_bn": 2e-4}
DEFAULT_TOL = 1e-4
DYN_BATCH, DYN_SEQ = 2, 11  # a second shape, to prove the dynamic axes really are dynamic

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse on the beach at sunset.",
]


def _session(path: Path) -> ort.InferenceSession:
    return ort_session(path, "all", 1)


@functools.cache
def _eager(name: str) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """Eager outputs at the traced shape (1, 16) and, for dynamic models, at (2, 11)."""
    module, inputs = build_model(name)
    shapes = {(1, 16): inputs}
    if model_spec(name).dynamic_axes:
        shapes[(DYN_BATCH, DYN_SEQ)] = example_inputs(name, seq_len=DYN_SEQ, batch=DYN_BATCH)
    return {
        shape: {k: v.numpy() for k, v in run_eager(module, feeds, name).items()}
        for shape, feeds in shapes.items()
    }


def _op_histogram(path: Path) -> collections.Counter[str]:
    model = onnx.load(str(path), load_external_data=False)
    return collections.Counter(node.op_type for node in model.graph.node)


def _assert_close(name: str, got: list[np.ndarray], want: dict[str, np.ndarray]) -> None:
    tol = TOLERANCE.get(name, DEFAULT_TOL)
    for out_name, g in zip(model_spec(name).output_names, got, strict=True):
        w = want[out_name]
        assert g.shape == w.shape, out_name
        diff = float(np.abs(g - w).max())
        assert diff <= tol, f"{name}/{out_name}: max abs diff {diff:.3g} > {tol}"


@pytest.mark.slow
@pytest.mark.xdist_group("models")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ALL_NAMES)
def test_export_runs_and_matches_eager(name: str, exporter: str) -> None:
    path = export_onnx(name, exporter)
    assert path.is_file() and path.suffix == ".onnx"
    assert path.parent == cache_dir()
    onnx.checker.check_model(str(path))  # path form: works for files over 2 GB too

    # A second call is a cache hit: same file, not rewritten.
    mtime = path.stat().st_mtime_ns
    assert export_onnx(name, exporter) == path
    assert path.stat().st_mtime_ns == mtime

    spec = model_spec(name)
    sess = _session(path)
    assert [i.name for i in sess.get_inputs()] == list(spec.input_names)
    assert [o.name for o in sess.get_outputs()] == list(spec.output_names)
    eager = _eager(name)
    _assert_close(name, sess.run(None, example_feeds(name)), eager[(1, 16)])

    if spec.dynamic_axes:
        assert sess.get_inputs()[0].shape == ["batch", "seq"]
        feeds = example_feeds(name, seq_len=DYN_SEQ, batch=DYN_BATCH)
        _assert_close(name, sess.run(None, feeds), eager[(DYN_BATCH, DYN_SEQ)])
    else:
        assert all(isinstance(d, int) for i in sess.get_inputs() for d in i.shape)


@pytest.mark.slow
@pytest.mark.xdist_group("models")
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_resnet50_bn_export_keeps_batchnorm(exporter: str) -> None:
    kept = _op_histogram(export_onnx("resnet50_bn", exporter))
    folded = _op_histogram(export_onnx("resnet50", exporter))
    assert kept["BatchNormalization"] == 53
    assert kept["Conv"] == 53
    assert folded["BatchNormalization"] == 0  # the default exports fold BN into Conv
    assert folded["Conv"] == 53


@pytest.mark.slow
@pytest.mark.xdist_group("models")
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_sidecar_records_the_export(exporter: str) -> None:
    path = export_onnx("llama", exporter)
    info = export_info("llama", exporter)
    assert info["name"] == "llama" and info["exporter"] == exporter
    assert info["file_bytes"] == path.stat().st_size
    assert info["export_seconds"] > 0
    assert info["versions"]["torch"] == torch.__version__
    assert info["dynamic_axes"]["input_ids"] == {"0": "batch", "1": "seq"}
    opsets = {
        o.domain: o.version for o in onnx.load(str(path), load_external_data=False).opset_import
    }
    assert opsets[""] == info["opset"]
    if exporter == "torchscript":
        assert info["opset"] == TORCHSCRIPT_OPSET
    else:
        assert info["opset"] >= 18


@pytest.mark.xdist_group("models")
def test_concurrent_exports_write_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GRAPH_AUTOFUSION_CACHE", str(tmp_path))
    results: list[Path] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(export_onnx("lstm", "torchscript", seq_len=8))
        except BaseException as exc:  # re-raised below in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    path = results[0]
    assert path.parent == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        path.name,
        path.name + ".json",
    ]
    onnx.checker.check_model(str(path))
    # The key includes seq_len: another length is another file.
    assert export_path("lstm", "torchscript", seq_len=9) != path
    out = _session(path).run(None, example_feeds("lstm", seq_len=8))[0]
    module, inputs = build_model("lstm", seq_len=8)
    want = run_eager(module, inputs, "lstm")["output"].numpy()
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=0)


def test_cache_dir_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPH_AUTOFUSION_CACHE", raising=False)
    repo = Path(__file__).resolve().parents[1]
    assert cache_dir() == repo / ".cache" / "models"
    monkeypatch.setenv("GRAPH_AUTOFUSION_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    assert export_path("bert", "dynamo").parent == tmp_path / "c"


def test_names() -> None:
    assert "resnet50_bn" not in MODEL_NAMES and "resnet50_bn" in ALL_NAMES
    assert set(MODEL_NAMES) == {"llama", "llama_gqa", "bert", "gpt2", "resnet50", "minilm", "lstm"}


def test_unknown_model_or_exporter_raises() -> None:
    with pytest.raises(GraphAutoFusionError, match="unknown zoo model"):
        build_model("gpt5")
    with pytest.raises(GraphAutoFusionError, match="unknown exporter"):
        export_onnx("lstm", "tflite")


@pytest.mark.parametrize("name", ["lstm", "llama_gqa"])
def test_build_model_is_seeded(name: str) -> None:
    a, inputs_a = build_model(name)
    b, inputs_b = build_model(name)
    assert not a.training
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert all(torch.equal(inputs_a[k], inputs_b[k]) for k in inputs_a)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_example_feeds_match_spec(name: str) -> None:
    spec = model_spec(name)
    feeds = example_feeds(name, seq_len=12)
    assert list(feeds) == list(spec.input_names)
    if "input_ids" in feeds:
        ids = feeds["input_ids"]
        assert ids.dtype == np.int64 and ids.shape == (1, 12)
        assert feeds["attention_mask"].dtype == np.int64
        assert 0 <= ids.min() and ids.max() < 50257
    elif name == "lstm":
        assert feeds["x"].shape == (1, 12, 32) and feeds["x"].dtype == np.float32
    else:
        assert feeds["pixel_values"].shape == (1, 3, 224, 224)


@pytest.mark.slow
@pytest.mark.xdist_group("models")
def test_minilm_embeddings_match_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_path()), device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    enc = minilm_tokenize(SENTENCES)  # padded to the longest sentence: exercises the mask
    assert int(enc["attention_mask"].sum(1).min()) < enc["attention_mask"].shape[1]
    module, _ = build_model("minilm")
    hidden = run_eager(module, enc, "minilm")["last_hidden_state"]
    emb = minilm_sentence_embeddings(hidden, enc["attention_mask"])
    torch.testing.assert_close(emb, reference, atol=1e-5, rtol=0)
    sim = emb @ emb.T
    assert sim[0, 1] > 0.5 > sim[0, 2]  # paraphrases close, unrelated sentences far

    # The ONNX export, run at another batch and length, gives the same embeddings.
    sess = _session(export_onnx("minilm", "dynamo"))
    (onnx_hidden,) = sess.run(None, {k: v.numpy() for k, v in enc.items()})
    onnx_emb = minilm_sentence_embeddings(torch.from_numpy(onnx_hidden), enc["attention_mask"])
    torch.testing.assert_close(onnx_emb, reference, atol=1e-5, rtol=0)
