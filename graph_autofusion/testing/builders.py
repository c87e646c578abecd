"""Builders of the zoo models: wrappers, seeded example inputs, MiniLM tokenizer helpers."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from graph_autofusion import env
from graph_autofusion.testing.specs import (
    LSTM_FEATURES,
    LSTM_HIDDEN,
    LSTM_OUT,
    MINILM_EXAMPLE_SENTENCE,
    hf_config,
    minilm_path,
    model_spec,
)

# --------------------------------------------------------------------------------------------
# Wrappers: named tensor inputs -> plain tensor outputs (what both exporters see)
# --------------------------------------------------------------------------------------------


class CausalLMLogits(nn.Module):
    """``(input_ids, attention_mask) -> logits`` of a Hugging Face causal LM, no KV cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True
        )
        return out.logits


class EncoderOutputs(nn.Module):
    """``(input_ids, attention_mask, token_type_ids) -> last_hidden_state[, pooler_output]``."""

    def __init__(self, model: nn.Module, *, pooled: bool) -> None:
        super().__init__()
        self.model = model
        self.pooled = pooled

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        if self.pooled:
            return out.last_hidden_state, out.pooler_output
        return out.last_hidden_state


class ImageLogits(nn.Module):
    """``pixel_values -> logits`` of a Hugging Face image classifier."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).logits


class LSTMModel(nn.Module):
    """``x (batch, seq, 32) -> output (batch, seq, 16)``: Linear, 2-layer LSTM, Linear."""

    def __init__(
        self, features: int = LSTM_FEATURES, hidden: int = LSTM_HIDDEN, out: int = LSTM_OUT
    ) -> None:
        super().__init__()
        self.proj = nn.Linear(features, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(torch.tanh(self.proj(x)))
        return self.head(h)


# --------------------------------------------------------------------------------------------
# Inputs and builders
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def minilm_tokenizer() -> Any:
    """The all-MiniLM-L6-v2 tokenizer (loaded offline from the package, cached)."""
    env.hub_offline()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)


def minilm_tokenize(
    sentences: str | Sequence[str], *, seq_len: int | None = None
) -> dict[str, torch.Tensor]:
    """Tokenize sentences for ``minilm``.

    Args:
        sentences: One sentence or a list of sentences.
        seq_len: Pad/truncate to exactly this length; ``None`` pads to the longest sentence.

    Returns:
        ``input_ids``, ``attention_mask`` and ``token_type_ids`` as int64 tensors.
    """
    batch = [sentences] if isinstance(sentences, str) else list(sentences)
    kw: dict[str, Any] = {"padding": True}
    if seq_len is not None:
        kw = {"padding": "max_length", "truncation": True, "max_length": seq_len}
    enc = minilm_tokenizer()(batch, return_tensors="pt", **kw)
    names = model_spec("minilm").input_names
    return {n: enc[n].to(torch.int64) for n in names}


def minilm_sentence_embeddings(
    last_hidden_state: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Mean-pool token embeddings over the attention mask and L2-normalize (as sentence-BERT).

    Args:
        last_hidden_state: ``(batch, seq, hidden)`` output of ``minilm``.
        attention_mask: ``(batch, seq)`` mask used for the forward pass.

    Returns:
        ``(batch, hidden)`` unit-norm sentence embeddings.
    """
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    summed = (last_hidden_state * mask).sum(dim=1)
    pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


def _token_inputs(
    names: Sequence[str], vocab: int, seq_len: int, batch: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    out = {"input_ids": torch.randint(0, vocab, (batch, seq_len), generator=gen)}
    out["attention_mask"] = torch.ones(batch, seq_len, dtype=torch.int64)
    if "token_type_ids" in names:
        tt = torch.zeros(batch, seq_len, dtype=torch.int64)
        tt[:, seq_len // 2 :] = 1
        out["token_type_ids"] = tt
    return {n: out[n] for n in names}


def example_inputs(name: str, *, seq_len: int = 16, batch: int = 1) -> dict[str, torch.Tensor]:
    """Seeded example inputs of a zoo model, keyed by forward argument (= ONNX input) name.

    Token ids are drawn uniformly within the vocabulary with an all-ones attention mask;
    ``minilm`` uses a real tokenized sentence padded to ``seq_len``; ``bert``'s token_type_ids
    are 0 for the first half and 1 for the second. Cheap: does not build the model.

    Args:
        name: Zoo model name.
        seq_len: Sequence length (tokens, or LSTM time steps); ignored by the ResNets.
        batch: Batch size (the exports are traced at batch 1).
    """
    spec = model_spec(name)
    if name in ("llama", "llama_gqa", "bert", "gpt2"):
        return _token_inputs(spec.input_names, hf_config(name).vocab_size, seq_len, batch)
    if name == "minilm":
        return minilm_tokenize([MINILM_EXAMPLE_SENTENCE] * batch, seq_len=seq_len)
    gen = torch.Generator().manual_seed(1)
    if name in ("resnet50", "resnet50_bn", "mobilenet_v2", "convnext"):
        return {"pixel_values": torch.randn(batch, 3, 224, 224, generator=gen)}
    return {"x": torch.randn(batch, seq_len, LSTM_FEATURES, generator=gen)}


def _perturb_batchnorm(module: nn.Module) -> None:
    """Give every BatchNorm non-trivial affine parameters and running statistics (seeded)."""
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(0.75 + 0.5 * torch.rand(n, generator=gen))
                m.bias.copy_(0.2 * torch.rand(n, generator=gen) - 0.1)
                m.running_mean.copy_(0.2 * torch.rand(n, generator=gen) - 0.1)
                m.running_var.copy_(0.5 + torch.rand(n, generator=gen))


def _build_module(name: str) -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if name == "lstm":
        return LSTMModel()
    if name == "minilm":
        env.hub_offline()
        bar = tf.utils.logging.is_progress_bar_enabled()
        tf.utils.logging.disable_progress_bar()  # "Loading weights" bar on stderr
        try:
            model = tf.AutoModel.from_pretrained(
                str(minilm_path()), local_files_only=True, attn_implementation="sdpa"
            )
        finally:
            if bar:
                tf.utils.logging.enable_progress_bar()
        return EncoderOutputs(model, pooled=False)
    cfg = hf_config(name)
    if name in ("llama", "llama_gqa", "gpt2", "bert"):
        cfg._attn_implementation = "sdpa"  # the default today; pinned so exports stay stable
    if name in ("llama", "llama_gqa"):
        return CausalLMLogits(tf.LlamaForCausalLM(cfg))
    if name == "gpt2":
        return CausalLMLogits(tf.GPT2LMHeadModel(cfg))
    if name == "bert":
        return EncoderOutputs(tf.BertModel(cfg), pooled=True)
    if name == "mobilenet_v2":
        model = tf.MobileNetV2ForImageClassification(cfg)
    elif name == "convnext":
        model = tf.ConvNextForImageClassification(cfg)
    else:
        model = tf.ResNetForImageClassification(cfg)
    _perturb_batchnorm(model)
    return ImageLogits(model)


def build_model(name: str, *, seq_len: int = 16) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Build a zoo model (eval mode, seeded weights) and its example inputs.

    Every call builds a fresh module with identical weights, so callers may mutate it.

    Args:
        name: One of :data:`ALL_NAMES` (the models plus the ``resnet50_bn`` variant) or
            :data:`BENCH_NAMES` (held-out CNNs the benchmarks build).
        seq_len: Sequence length of the example inputs (see :func:`example_inputs`).

    Returns:
        ``(module, inputs)``: call it as ``module(**inputs)``; it returns a tensor, or a tuple
        of tensors in the order of :attr:`ModelSpec.output_names`.
    """
    model_spec(name)
    module = _build_module(name).eval()
    return module, example_inputs(name, seq_len=seq_len)


def run_eager(
    module: nn.Module, inputs: dict[str, torch.Tensor], name: str
) -> dict[str, torch.Tensor]:
    """Run a zoo module without gradients; return its outputs keyed by ONNX output name."""
    with torch.no_grad():
        out = module(**inputs)
    outs = out if isinstance(out, tuple) else (out,)
    return dict(zip(model_spec(name).output_names, outs, strict=True))
