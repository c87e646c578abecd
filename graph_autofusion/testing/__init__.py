"""Test-model zoo: seeded models and cached ONNX exports shared by the whole test suite.

Typical use::

    from graph_autofusion.testing import build_model, example_feeds, export_onnx

    module, inputs = build_model("llama")            # eval-mode torch module + named inputs
    path = export_onnx("llama", "torchscript")       # cached ONNX file
    feeds = example_feeds("llama")                   # same inputs as NumPy, by ONNX input name
"""

from graph_autofusion.testing.models import (
    ALL_NAMES,
    EXPORTERS,
    MODEL_NAMES,
    TORCHSCRIPT_OPSET,
    VARIANT_NAMES,
    ModelSpec,
    build_model,
    cache_dir,
    example_feeds,
    example_inputs,
    export_info,
    export_onnx,
    export_path,
    minilm_onnx_embeddings,
    minilm_path,
    minilm_sentence_embeddings,
    minilm_tokenize,
    model_spec,
    ort_outputs,
    run_eager,
)

__all__ = [
    "ALL_NAMES",
    "EXPORTERS",
    "MODEL_NAMES",
    "TORCHSCRIPT_OPSET",
    "VARIANT_NAMES",
    "ModelSpec",
    "build_model",
    "cache_dir",
    "example_feeds",
    "example_inputs",
    "export_info",
    "export_onnx",
    "export_path",
    "minilm_onnx_embeddings",
    "minilm_path",
    "minilm_sentence_embeddings",
    "minilm_tokenize",
    "model_spec",
    "ort_outputs",
    "run_eager",
]
