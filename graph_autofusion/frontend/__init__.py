"""Frontends (F1): ONNX import/export; ``onnx`` is imported only when first used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graph_autofusion.frontend.loader import load_model
    from graph_autofusion.frontend.onnx_frontend import (
        check_model,
        load_onnx,
        save_onnx,
        to_onnx,
    )

# Public name -> module that defines it (add other frontends' entry points here).
_LAZY = {
    "load_onnx": "graph_autofusion.frontend.onnx_frontend",
    "to_onnx": "graph_autofusion.frontend.onnx_frontend",
    "save_onnx": "graph_autofusion.frontend.onnx_frontend",
    "check_model": "graph_autofusion.frontend.onnx_frontend",
    "load_model": "graph_autofusion.frontend.loader",
}

__all__ = ["check_model", "load_model", "load_onnx", "save_onnx", "to_onnx"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
