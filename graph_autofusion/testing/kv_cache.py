"""KV-cache decoder exports of the zoo's causal LMs: the form decoder deployments run.

One ONNX graph serves both phases of generation: a *prefill* (the prompt, past length 0) and
*decode steps* (one new token, the cache of everything before it). Inputs, in order::

    input_ids (batch, seq)  attention_mask (batch, total)  position_ids (batch, seq)
    past_key_values.{i}.key / .value (batch, kv_heads, past, head_dim)   for each layer i

where ``total = past + seq`` (the mask covers the cache and the new tokens); outputs are
``logits (batch, seq, vocab)`` and ``present.{i}.key / .value (batch, kv_heads, total,
head_dim)``, which the caller feeds back as the next step's past. Traced at past 4, seq 3 with
batch/seq/total/past dynamic in both exporters (``dynamo``: its default opset; ``torchscript``:
opset 18). Exports are cached like :func:`~graph_autofusion.testing.export.export_onnx` (same
lock, atomic replace and JSON sidecar, shared code).

``qwen2`` exists only here (not in ``MODEL_NAMES``); the others are the zoo models of the same
name with the same seeded weights. Every export x model gives PyTorch's numbers at past 0 and
at other past lengths than the traced one (``tests/test_kv_cache.py``). ``small=True`` (every
function taking a decoder name takes it) gives the same architecture at a test's size
(:func:`small_config`: 2 layers, hidden 64, 4 heads, vocabulary 256; seeded weights), exported
in a second (TorchScript) or ten (dynamo) and cached the same way
(``tests/test_kv_cache_inputs.py``).

Pitfall (of the reference, not the export): TorchScript's exporter puts the module it traces in
eval mode and afterwards restores the mode *recursively* from the top module. A wrapper that
was never ``eval()``-ed therefore leaves the wrapped HF model in training mode, and GPT-2 (the
only zoo decoder with dropout, 0.1) then gives different logits in PyTorch (2.0 max abs diff
at prefill) while the ONNX model is right. :func:`decoder_module` and the wrapper are eval'd.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.testing.builders import build_model
from graph_autofusion.testing.export import (
    EXPORTERS,
    TORCHSCRIPT_OPSET,
    cache_dir,
    quiet,
    tool_versions,
    write_cached,
)
from graph_autofusion.testing.specs import config_fingerprint, hf_config

#: Models with a KV-cache decoder export.
DECODER_NAMES: tuple[str, ...] = ("llama", "llama_gqa", "gpt2", "qwen2")

#: Bump when the wrapper or the export settings change (invalidates the decoder caches).
KV_VERSION = 1

#: Past and new-token lengths of the traced example (both axes are dynamic).
TRACE_PAST, TRACE_SEQ = 4, 3

_MAX_LEN = 2048


def _check_name(name: str) -> None:
    if name not in DECODER_NAMES:
        raise GraphAutoFusionError(
            f"no KV-cache decoder {name!r}; choose one of {', '.join(DECODER_NAMES)}"
        )


def small_config(name: str) -> Any:
    """The test-sized config of decoder ``name``: its architecture with 2 layers, hidden size
    64, 4 heads (``llama``: 4 KV heads; ``llama_gqa``, ``qwen2``: 2), vocabulary 256."""
    _check_name(name)
    import transformers as tf

    if name == "gpt2":
        return tf.GPT2Config(
            n_embd=64,
            n_layer=2,
            n_head=4,
            vocab_size=256,
            n_positions=256,
            bos_token_id=255,
            eos_token_id=255,
        )
    cls = tf.Qwen2Config if name == "qwen2" else tf.LlamaConfig
    return cls(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4 if name == "llama" else 2,
        vocab_size=256,
        max_position_embeddings=256,
    )


def _config(name: str, small: bool) -> Any:
    _check_name(name)
    return small_config(name) if small else hf_config(name)


def decoder_dims(name: str, *, small: bool = False) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a decoder's cache (from its config; cheap)."""
    cfg = _config(name, small)
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


def past_names(name: str, *, small: bool = False) -> tuple[str, ...]:
    """``past_key_values.{i}.key``, ``past_key_values.{i}.value`` for every layer, in order."""
    layers = decoder_dims(name, small=small)[0]
    return tuple(f"past_key_values.{i}.{t}" for i in range(layers) for t in ("key", "value"))


def decoder_input_names(name: str, *, small: bool = False) -> tuple[str, ...]:
    """ONNX input names of the decoder exports of ``name``."""
    return ("input_ids", "attention_mask", "position_ids", *past_names(name, small=small))


def decoder_output_names(name: str, *, small: bool = False) -> tuple[str, ...]:
    """ONNX output names: ``logits`` then ``present.{i}.key``/``.value`` per layer."""
    layers = decoder_dims(name, small=small)[0]
    presents = (f"present.{i}.{t}" for i in range(layers) for t in ("key", "value"))
    return ("logits", *presents)


def decoder_dynamic_axes(name: str, *, small: bool = False) -> dict[str, dict[int, str]]:
    """``{ONNX name: {axis: symbol}}`` of the decoder exports (as TorchScript takes them)."""
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits": {0: "batch", 1: "seq"},
    }
    axes.update({n: {0: "batch", 2: "past"} for n in past_names(name, small=small)})
    axes.update({n: {0: "batch", 2: "total"} for n in decoder_output_names(name, small=small)[1:]})
    return axes


def decoder_module(name: str, *, small: bool = False) -> nn.Module:
    """The seeded Hugging Face causal LM (eval mode), with the zoo model's weights.

    ``llama``, ``llama_gqa`` and ``gpt2`` are the models inside ``build_model(name)``;
    ``qwen2`` and every ``small`` one are built the same way (``torch.manual_seed(0)``, then
    the class on the config).
    """
    _check_name(name)
    if name != "qwen2" and not small:
        return build_model(name)[0].model.eval()
    import transformers as tf

    cfg = _config(name, small)
    cfg._attn_implementation = "sdpa"
    cls = {
        "qwen2": tf.Qwen2ForCausalLM,
        "gpt2": tf.GPT2LMHeadModel,
    }.get(name, tf.LlamaForCausalLM)
    torch.manual_seed(0)
    return cls(cfg).eval()


class KVDecoder(nn.Module):
    """``(input_ids, attention_mask, position_ids, *past) -> (logits, *presents)``.

    ``past`` holds each layer's key then value; they fill a ``transformers.DynamicCache`` (an
    empty past, length 0, is a prefill) and the presents are that cache after the forward.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.num_hidden_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            return_dict=True,
        )
        result = [out.logits]
        for layer in out.cache.layers:
            result += [layer.keys, layer.values]
        return tuple(result)


def _trace_inputs(name: str, small: bool = False) -> tuple[torch.Tensor, ...]:
    layers, kv_heads, head_dim = decoder_dims(name, small=small)
    gen = torch.Generator().manual_seed(1)
    vocab = _config(name, small).vocab_size
    ids = torch.randint(0, vocab, (1, TRACE_SEQ), generator=gen)
    mask = torch.ones(1, TRACE_PAST + TRACE_SEQ, dtype=torch.int64)
    pos = torch.arange(TRACE_PAST, TRACE_PAST + TRACE_SEQ)[None]
    past = [
        torch.randn(1, kv_heads, TRACE_PAST, head_dim, generator=gen) for _ in range(2 * layers)
    ]
    return (ids, mask, pos, *past)


def decoder_export_path(name: str, exporter: str = "dynamo", *, small: bool = False) -> Path:
    """Where :func:`export_decoder` caches this export (the file may not exist yet)."""
    _check_name(name)
    if exporter not in EXPORTERS:
        raise GraphAutoFusionError(f"unknown exporter {exporter!r}; choose one of {EXPORTERS}")
    if small:
        cfg = json.loads(small_config(name).to_json_string(use_diff=False))
        cfg.pop("transformers_version", None)
        fingerprint = json.dumps({"small": name, "config": cfg}, sort_keys=True, default=str)
    else:
        fingerprint = config_fingerprint(name)
    key = json.dumps(
        {
            "fp": fingerprint,
            "versions": tool_versions(),
            "opset": TORCHSCRIPT_OPSET,
            "kv": KV_VERSION,
            "trace": [TRACE_PAST, TRACE_SEQ],
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"{name}{'-small' if small else ''}-kv-{exporter}-{digest}.onnx"


def _export(
    name: str, exporter: str, module: nn.Module, args: tuple, dest: Path, small: bool = False
) -> int:
    inputs = list(decoder_input_names(name, small=small))
    outputs = list(decoder_output_names(name, small=small))
    if exporter == "torchscript":
        torch.onnx.export(
            module,
            args,
            str(dest),
            dynamo=False,
            opset_version=TORCHSCRIPT_OPSET,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=decoder_dynamic_axes(name, small=small),
        )
        return TORCHSCRIPT_OPSET
    from torch.export import Dim

    batch = Dim("batch", min=1, max=64)
    seq = Dim("seq", min=1, max=_MAX_LEN)
    past = Dim("past", min=0, max=_MAX_LEN)
    # The mask needs its own symbol: torch.export takes no expression (past + seq) for an input.
    total = Dim("total", min=1, max=2 * _MAX_LEN)
    per_past = tuple({0: batch, 2: past} for _ in past_names(name, small=small))
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, per_past)
    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        dynamic_shapes=shapes,
        input_names=inputs,
        output_names=outputs,
        verbose=False,
    )
    program.save(str(dest), external_data=False)
    return int(dict((o.domain, o.version) for o in program.model_proto.opset_import)[""])


def export_decoder(name: str, exporter: str = "dynamo", *, small: bool = False) -> Path:
    """Export the KV-cache decoder of ``name`` to ONNX (or return the cached export).

    Args:
        name: One of :data:`DECODER_NAMES`.
        exporter: ``"dynamo"`` or ``"torchscript"``.
        small: The test-sized architecture (:func:`small_config`) instead of the zoo's.

    Returns:
        Path of a self-contained ONNX file (weights inside); its inputs and outputs are
        :func:`decoder_input_names` and :func:`decoder_output_names`.

    Raises:
        GraphAutoFusionError: Unknown decoder/exporter, or the exporter failed.
    """
    path = decoder_export_path(name, exporter, small=small)

    def produce(tmp: Path) -> dict[str, Any]:
        module = KVDecoder(decoder_module(name, small=small)).eval()
        args = _trace_inputs(name, small)
        start = time.perf_counter()
        with quiet(), torch.no_grad():
            opset = _export(name, exporter, module, args, tmp, small)
        return {
            "name": name,
            "small": small,
            "kind": "kv_decoder",
            "exporter": exporter,
            "opset": opset,
            "trace_past": TRACE_PAST,
            "trace_seq": TRACE_SEQ,
            "dynamic_axes": decoder_dynamic_axes(name, small=small),
            "export_seconds": round(time.perf_counter() - start, 3),
        }

    size = "small " if small else ""
    return write_cached(
        path, f"the {size}{name!r} KV-cache decoder with the {exporter} exporter", produce
    )


def empty_past(name: str, batch: int = 1, *, small: bool = False) -> dict[str, np.ndarray]:
    """Past key/values of length 0 (float32), keyed by ONNX input name: a prefill's feeds."""
    _, kv_heads, head_dim = decoder_dims(name, small=small)
    names = past_names(name, small=small)
    return {n: np.zeros((batch, kv_heads, 0, head_dim), np.float32) for n in names}


def _prompt(prompt_ids: Any) -> np.ndarray:
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    if prompt.ndim == 1:
        prompt = prompt[None]
    if prompt.ndim != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise GraphAutoFusionError(f"prompt_ids must be (seq,) or (1, seq), got {prompt.shape}")
    return prompt


def greedy_decode_ort(
    session: Any, name: str, prompt_ids: np.ndarray, steps: int, *, small: bool = False
) -> tuple[list[int], list[float], float]:
    """Greedy generation with a decoder export: a prefill, then ``steps`` decode steps.

    The prefill runs the prompt with past length 0; each decode step feeds the last token,
    the previous step's presents as past, a mask of ones over past + 1 and its position.

    Args:
        session: Anything with ``.run(None, feeds)`` and ``.get_inputs()`` (an onnxruntime
            ``InferenceSession``); only the inputs it declares are fed. Its outputs are taken
            in :func:`decoder_output_names` order (by name when it has ``.get_outputs()``).
        name: Decoder name (for the cache shapes and names).
        prompt_ids: ``(seq,)`` or ``(1, seq)`` token ids.
        steps: Number of single-token decode steps after the prefill.
        small: The session runs a ``small=True`` export.

    Returns:
        ``(tokens, per_step_seconds, prefill_seconds)``: the ``steps + 1`` generated tokens
        (the prefill's, then one per step), each decode step's ``session.run`` wall time and
        the prefill's.
    """
    prompt = _prompt(prompt_ids)
    declared = {i.name for i in session.get_inputs()}
    out_names = list(decoder_output_names(name, small=small))
    if hasattr(session, "get_outputs"):
        out_names = [o.name for o in session.get_outputs()]
    presents = decoder_output_names(name, small=small)[1:]
    present_to_past = dict(zip(presents, past_names(name, small=small), strict=True))
    past = empty_past(name, small=small)
    ids, start = prompt, 0
    tokens: list[int] = []
    seconds: list[float] = []
    for _ in range(steps + 1):
        seq = ids.shape[1]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, start + seq), np.int64),
            "position_ids": np.arange(start, start + seq, dtype=np.int64)[None],
            **past,
        }
        t0 = time.perf_counter()
        outs = dict(
            zip(
                out_names,
                session.run(None, {k: v for k, v in feeds.items() if k in declared}),
                strict=True,
            )
        )
        seconds.append(time.perf_counter() - t0)
        tokens.append(int(np.argmax(outs["logits"][0, -1])))
        past = {present_to_past[k]: v for k, v in outs.items() if k in present_to_past}
        ids, start = np.array([[tokens[-1]]], np.int64), start + seq
    return tokens, seconds[1:], seconds[0]


def greedy_decode_torch(module: nn.Module, prompt_ids: Any, steps: int) -> list[int]:
    """Reference of :func:`greedy_decode_ort`: the HF model with its own cache (``use_cache``).

    Returns the ``steps + 1`` generated tokens.
    """
    ids = torch.from_numpy(_prompt(prompt_ids))
    with torch.no_grad():
        out = module(input_ids=ids, use_cache=True, return_dict=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(steps):
            step = torch.tensor([[tokens[-1]]], dtype=torch.int64)
            out = module(input_ids=step, cache=out.cache, use_cache=True, return_dict=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens
