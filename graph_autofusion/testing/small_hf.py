"""Small random-weight Hugging Face models of architectures no issue names, exported by both
torch exporters: the robustness set of ``tests/test_unseen_architectures.py`` and
``benchmarks/unseen_models.py``.

Each model is built from a config (2 layers, hidden size 64-128, sequence 12 or a 32x32 image)
with ``torch.manual_seed(0)`` inside a forked RNG, wrapped to return its first output tensor,
and exported with ``torch.onnx.export(dynamo=True)`` or ``dynamo=False`` (opset 18)::

    from graph_autofusion.testing.small_hf import SMALL_HF, export_small_hf

    feeds, expected = export_small_hf("qwen2", "torchscript", "/tmp/qwen2.onnx")

Requires torch and transformers (the ``hf`` extra).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transformers

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.testing.export import quiet

SEQ = 12

#: exports torch 2.13's exporters cannot produce (their own error, not the pipeline's)
KNOWN_EXPORT_FAILURES = frozenset({("t5_encoder", "dynamo"), ("swin", "dynamo")})


class KnownExportFailure(GraphAutoFusionError, RuntimeError):
    """The torch exporter failed on a pair listed in :data:`KNOWN_EXPORT_FAILURES`."""


def _ids(vocab: int = 1000) -> Any:
    return torch.randint(0, vocab, (1, SEQ))


def _mask() -> Any:
    return torch.ones(1, SEQ, dtype=torch.long)


def _image(size: int = 32) -> Any:
    return torch.randn(1, 3, size, size)


#: The causal LMs' size: 2 layers, hidden 128, 4 heads, vocabulary 1000.
LLM_CONFIG = dict(
    vocab_size=1000,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
)


def _causal_lm(config_cls: str, model_cls: str, **cfg: Any) -> Any:
    config = getattr(transformers, config_cls)(**{**LLM_CONFIG, **cfg})
    return getattr(transformers, model_cls)(config)


def _llm(config_cls: str, model_cls: str, **cfg: Any) -> Callable[[], tuple[Any, dict]]:
    def build() -> tuple[Any, dict]:
        model = _causal_lm(config_cls, model_cls, **cfg)
        return model, {"input_ids": _ids(), "attention_mask": _mask()}

    return build


def tiny_causal_lm(config_cls: str, model_cls: str, *, seed: int = 0, **cfg: Any) -> Any:
    """A causal LM of any Hugging Face family by its config and model class names
    (:data:`LLM_CONFIG`'s size, ``cfg`` on top), random weights from ``seed``, eval."""
    torch.manual_seed(seed)
    return _causal_lm(config_cls, model_cls, **cfg).eval()


def tiny_llama(kv_heads: int = 2, *, seed: int = 0) -> Any:
    """A 2-layer Llama (hidden 64, vocab 1000, ``kv_heads`` of 4 heads), random weights, eval."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _encoder(config_cls: str, model_cls: str, inputs: Callable[[], dict], **cfg: Any):
    def build() -> tuple[Any, dict]:
        config = getattr(transformers, config_cls)(**cfg)
        return getattr(transformers, model_cls)(config), inputs()

    return build


def _whisper_encoder() -> tuple[Any, dict]:
    config = transformers.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=16,
    )
    return transformers.WhisperModel(config).encoder, {"input_features": torch.randn(1, 16, 32)}


_BERTISH = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)

#: name -> builder returning (eval-ready module, named torch inputs)
SMALL_HF: dict[str, Callable[[], tuple[Any, dict]]] = {
    # grouped-query attention, biased QKV, SwiGLU, RMSNorm
    "qwen2": _llm("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2),
    # multi-query attention, GeGLU, RMSNorm with (1 + w)
    "gemma": _llm("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1, head_dim=32),
    # partial rotary, parallel attention + MLP, LayerNorm, gelu_new
    "phi": _llm("PhiConfig", "PhiForCausalLM"),
    # parallel residual, rotary on part of the head
    "gpt_neox": _llm("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "distilbert": _encoder(
        "DistilBertConfig",
        "DistilBertModel",
        lambda: {"input_ids": _ids(), "attention_mask": _mask()},
        vocab_size=1000,
        dim=128,
        n_layers=2,
        n_heads=4,
        hidden_dim=256,
    ),
    "deberta_v2": _encoder(
        "DebertaV2Config", "DebertaV2Model", lambda: {"input_ids": _ids()}, **_BERTISH
    ),
    "t5_encoder": _encoder(
        "T5Config",
        "T5EncoderModel",
        lambda: {"input_ids": _ids()},
        vocab_size=1000,
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_heads=4,
    ),
    "bart": _encoder(
        "BartConfig",
        "BartModel",
        lambda: {"input_ids": _ids()},
        vocab_size=1000,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
    ),
    "whisper_encoder": _whisper_encoder,
    "vit": _encoder(
        "ViTConfig",
        "ViTModel",
        lambda: {"pixel_values": _image()},
        image_size=32,
        patch_size=8,
        **_BERTISH,
    ),
    "convnext": _encoder(
        "ConvNextConfig",
        "ConvNextModel",
        lambda: {"pixel_values": _image()},
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        image_size=32,
    ),
    "mobilenet_v2": _encoder(
        "MobileNetV2Config",
        "MobileNetV2Model",
        lambda: {"pixel_values": _image()},
        image_size=32,
        depth_multiplier=0.35,
        # the default 0.02 shrinks the activations to ~1e-25 by the last block, where any
        # output compares equal; 0.3 keeps them O(1) (ReLU6: half 0, a third 6, the rest between)
        initializer_range=0.3,
    ),
    "swin": _encoder(
        "SwinConfig",
        "SwinModel",
        lambda: {"pixel_values": _image()},
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
}


class _FirstOutput(torch.nn.Module):
    """The model called with named inputs, returning its first output tensor."""

    def __init__(self, model: Any, names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args: Any) -> Any:
        out = self.model(**dict(zip(self.names, args)))
        if hasattr(out, "to_tuple"):
            out = out.to_tuple()
        return out[0] if isinstance(out, tuple) else out


def export_small_hf(
    name: str, exporter: str, path: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Build ``SMALL_HF[name]`` (seed 0, torch's RNG state restored after), export it to
    ``path`` with ``exporter`` (``"dynamo"`` or ``"torchscript"``) and return (the feeds by
    ONNX input name, PyTorch's first output). A failure of a pair in
    :data:`KNOWN_EXPORT_FAILURES` raises :class:`KnownExportFailure`; any other exporter error
    propagates."""
    if exporter not in ("dynamo", "torchscript"):
        raise ValueError(f"exporter must be 'dynamo' or 'torchscript', got {exporter!r}")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return _export_seeded(name, exporter, path)


def _export_seeded(name: str, exporter: str, path: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    build = SMALL_HF[name]
    model, inputs = build()
    model.eval()
    if getattr(getattr(model, "config", None), "use_cache", None):
        model.config.use_cache = False
    names = list(inputs)
    wrapped = _FirstOutput(model, names).eval()
    args = tuple(inputs[n] for n in names)
    with torch.no_grad():
        expected = wrapped(*args).numpy()
    try:
        # the zoo exporter's silencing (warnings, noisy loggers, stdout), and stderr: the
        # TorchScript exporter prints its whole IR there when it fails
        with quiet(), contextlib.redirect_stderr(io.StringIO()):
            if exporter == "dynamo":
                torch.onnx.export(
                    wrapped, args, path, dynamo=True, input_names=names, output_names=["out"]
                )
            else:
                torch.onnx.export(
                    wrapped,
                    args,
                    path,
                    dynamo=False,
                    opset_version=18,
                    input_names=names,
                    output_names=["out"],
                )
    except Exception as e:  # the torch exporter's own failure, not the pipeline's
        if (name, exporter) not in KNOWN_EXPORT_FAILURES:
            raise
        raise KnownExportFailure(
            f"torch.onnx.export(dynamo={exporter == 'dynamo'}) failed on {name}: {e!r:.200}"
        ) from e
    return {n: inputs[n].numpy() for n in names}, expected
