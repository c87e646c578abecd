"""One entry point for every model source: ONNX file, ``onnx.ModelProto``, ``torch.nn.Module``."""

from __future__ import annotations

import os
from typing import Any

from graph_autofusion.errors import ModelLoadError
from graph_autofusion.ir.core import Model


def as_args(example_inputs: Any) -> tuple[Any, ...]:
    """Positional example inputs as a tuple: a tuple as given, one value as a 1-tuple, ``None``
    as no arguments."""
    if isinstance(example_inputs, tuple):
        return example_inputs
    return () if example_inputs is None else (example_inputs,)


def load_model(source: Any, example_inputs: Any = None, example_kwargs: Any = None) -> Model:
    """Load ``source`` into the IR.

    An ONNX source is imported with ``normalize=True``: older exporters' spellings become what
    fresh exports write (:mod:`graph_autofusion.frontend.onnx_legacy`), so the rules match the
    same structures; an IR :class:`Model` is returned as it is.

    Args:
        source: Path to an ``.onnx`` file, an ``onnx.ModelProto``, an IR :class:`Model`, or a
            ``torch.nn.Module`` (then ``example_inputs`` / ``example_kwargs`` are required).
        example_inputs: Positional example inputs for a torch module (tuple or one tensor).
        example_kwargs: Keyword example inputs for a torch module.

    Raises:
        ModelLoadError: the source is of no known kind or cannot be read.
    """
    if isinstance(source, Model):
        return source
    if isinstance(source, str | os.PathLike):
        from graph_autofusion.frontend.onnx_frontend import load_onnx

        return load_onnx(source, normalize=True)
    if type(source).__name__ == "ModelProto":
        from graph_autofusion.frontend.onnx_frontend import load_onnx

        return load_onnx(source, normalize=True)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        torch = None
    if torch is not None and isinstance(source, torch.nn.Module):
        if example_inputs is None and example_kwargs is None:
            raise ModelLoadError(
                "a torch.nn.Module needs example inputs (example_inputs=... or example_kwargs=...)"
            )
        from graph_autofusion.frontend.torch_frontend import from_torch

        return from_torch(source, as_args(example_inputs), example_kwargs or {})
    raise ModelLoadError(
        f"cannot load a model from {type(source).__name__}: expected a path to an .onnx file, "
        f"an onnx.ModelProto or a torch.nn.Module"
    )
