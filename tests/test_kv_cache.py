"""KV-cache decoder exports (testing.kv_cache): valid ONNX, PyTorch's numbers at a decode step
and at a prefill (past 0), PyTorch's greedy tokens, for every decoder and both exporters.

Every decoder x exporter runs at its ``small=True`` size (same architecture and export code, 2
layers, hidden 64); the full-size zoo form runs for Llama's dynamo export, the one the fusion
tests (``tests/test_kv_cache_fusion.py``) and the benchmarks build on. Exporting every full-size
decoder took minutes of the suite (GPT-2's dynamo export alone 1-1.5 min) and proved nothing
the small exports do not."""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.testing.models import (
    DECODER_NAMES,
    EXPORTERS,
    MODEL_NAMES,
    cache_dir,
    config_fingerprint,
    decoder_dims,
    decoder_input_names,
    decoder_module,
    decoder_output_names,
    empty_past,
    export_decoder,
    greedy_decode_ort,
    greedy_decode_torch,
    hf_config,
)

TOL = 1e-4
PAST = 5  # a decode step at another past length than the traced one (4)
GREEDY_STEPS = 9  # 10 generated tokens
#: Prompt seeds (full size, small) on which every decoder's greedy tokens vary (GPT-2's often
#: repeat one token)
PROMPT_SEED = {False: 3, True: 0}


@functools.lru_cache(maxsize=1)  # one torch model alive at a time (gpt2 is 124M parameters)
def _module(name: str, small: bool) -> torch.nn.Module:
    return decoder_module(name, small=small)


@pytest.fixture(scope="module", autouse=True)
def _free_module() -> Iterator[None]:
    yield
    _module.cache_clear()
    gc.collect()


def _session(path: Path) -> ort.InferenceSession:
    return ort_session(path, "all", 1)


#: Every decoder x exporter at the small size, and the full-size Llama dynamo export.
CASES = [
    *[(n, e, True) for n in DECODER_NAMES for e in EXPORTERS],
    ("llama", "dynamo", False),
]
_IDS = [f"{n}-{e}{'-small' if small else ''}" for n, e, small in CASES]


def _cache_arrays(cache) -> list[np.ndarray]:
    return [t.numpy().copy() for layer in cache.layers for t in (layer.keys, layer.values)]


def _reference(
    name: str, ids: torch.Tensor, past: int, small: bool
) -> tuple[list[np.ndarray], list]:
    """PyTorch's (past arrays, [logits, *presents]) for ``ids[:, past:]`` after ``ids[:, :past]``."""
    module = _module(name, small)
    with torch.no_grad():
        cache = None
        past_arrays = list(empty_past(name, small=small).values())
        if past:
            cache = module(input_ids=ids[:, :past], use_cache=True, return_dict=True).cache
            past_arrays = _cache_arrays(cache)
        out = module(input_ids=ids[:, past:], cache=cache, use_cache=True, return_dict=True)
        return past_arrays, [out.logits.numpy(), *_cache_arrays(out.cache)]


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], names: tuple[str, ...]) -> None:
    for g, w, n in zip(got, want, names, strict=True):
        assert g.shape == w.shape, n
        diff = float(np.abs(g - w).max())
        assert diff <= TOL, f"{n}: max abs diff {diff:.3g} > {TOL}"


def test_names_and_config() -> None:
    assert DECODER_NAMES == ("llama", "llama_gqa", "gpt2", "qwen2")
    assert "qwen2" not in MODEL_NAMES
    cfg = hf_config("qwen2")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (512, 4, 2)
    assert json.loads(config_fingerprint("qwen2"))["name"] == "qwen2"
    assert decoder_dims("gpt2") == (12, 12, 64) and decoder_dims("llama_gqa") == (4, 2, 64)
    assert decoder_input_names("llama")[3:5] == ("past_key_values.0.key", "past_key_values.0.value")
    assert decoder_output_names("llama")[-1] == "present.3.value"
    assert empty_past("qwen2", batch=2)["past_key_values.3.value"].shape == (2, 2, 0, 64)
    with pytest.raises(GraphAutoFusionError, match="no KV-cache decoder"):
        export_decoder("bert")
    with pytest.raises(GraphAutoFusionError, match="unknown exporter"):
        export_decoder("llama", "tflite")


def test_qwen2_is_seeded() -> None:
    a, b = decoder_module("qwen2"), decoder_module("qwen2")
    assert type(a).__name__ == "Qwen2ForCausalLM" and not a.training
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.slow
@pytest.mark.xdist_group("models")
@pytest.mark.parametrize("name, exporter, small", CASES, ids=_IDS)
def test_export_is_valid_and_cached(name: str, exporter: str, small: bool) -> None:
    path = export_decoder(name, exporter, small=small)
    assert path.parent == cache_dir()
    onnx.checker.check_model(str(path))
    mtime = path.stat().st_mtime_ns
    assert export_decoder(name, exporter, small=small) == path
    assert path.stat().st_mtime_ns == mtime
    info = json.loads(path.with_name(path.name + ".json").read_text())
    assert info["kind"] == "kv_decoder" and info["exporter"] == exporter
    assert info["file_bytes"] == path.stat().st_size
    model = onnx.load(str(path), load_external_data=False)
    assert [i.name for i in model.graph.input] == list(decoder_input_names(name, small=small))
    assert [o.name for o in model.graph.output] == list(decoder_output_names(name, small=small))


@pytest.mark.slow
@pytest.mark.xdist_group("models")
@pytest.mark.parametrize("name, exporter, small", CASES, ids=_IDS)
def test_steps_and_greedy_decode_match_torch(name: str, exporter: str, small: bool) -> None:
    sess = _session(export_decoder(name, exporter, small=small))
    declared = {i.name for i in sess.get_inputs()}
    inputs = decoder_input_names(name, small=small)
    outputs = decoder_output_names(name, small=small)
    vocab = _module(name, small).config.vocab_size
    ids = torch.randint(0, vocab, (1, PAST + 1), generator=torch.Generator().manual_seed(5))

    # One decode step at past length PAST, then a 4-token prefill at past length 0.
    for past, seq in ((PAST, 1), (0, 4)):
        step_ids = ids[:, : past + seq]
        past_arrays, want = _reference(name, step_ids, past, small)
        feeds = {
            "input_ids": step_ids[:, past:].numpy(),
            "attention_mask": np.ones((1, past + seq), np.int64),
            "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
            **dict(zip(inputs[3:], past_arrays, strict=True)),
        }
        got = sess.run(None, {k: v for k, v in feeds.items() if k in declared})
        _assert_close(got, want, outputs)

    prompt = np.random.default_rng(PROMPT_SEED[small]).integers(0, vocab, (1, 6))
    tokens, step_seconds, prefill_seconds = greedy_decode_ort(
        sess, name, prompt, GREEDY_STEPS, small=small
    )
    assert len(tokens) == GREEDY_STEPS + 1 and len(step_seconds) == GREEDY_STEPS
    assert prefill_seconds > 0 and min(step_seconds) > 0
    assert len(set(tokens)) > 1  # not a degenerate repetition
    assert tokens == greedy_decode_torch(_module(name, small), prompt[0], GREEDY_STEPS)
    del sess
    gc.collect()
