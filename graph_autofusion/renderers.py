"""Renderers of the package's records, registered by the layer that draws them.

A record made low in the layers (the planner's
:class:`~graph_autofusion.planner.records.AnalysisReport`) renders itself with
``render("analysis-text", self)``; the report layer, above it, registers the function under
that name when it is imported (``register_renderer``). ``import graph_autofusion`` imports the
report modules that register (``graph_autofusion/__init__.py``), and importing any module of
the package runs that first, so the renderers are there before any record exists; the record
never imports the layer that draws it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graph_autofusion.errors import GraphAutoFusionError

__all__ = ["register_renderer", "render"]

_RENDERERS: dict[str, Callable[..., str]] = {}


def register_renderer(name: str, fn: Callable[..., str]) -> Callable[..., str]:
    """Register ``fn(record, **options) -> str`` as the renderer ``name``; returns ``fn``."""
    _RENDERERS[name] = fn
    return fn


def render(name: str, record: Any, **options: Any) -> str:
    """``record`` drawn by the renderer registered as ``name``.

    Raises:
        GraphAutoFusionError: no renderer of that name is registered.
    """
    fn = _RENDERERS.get(name)
    if fn is None:
        raise GraphAutoFusionError(
            f"no renderer {name!r} registered (known: {sorted(_RENDERERS)}); the report "
            f"layer registers them when graph_autofusion is imported"
        )
    return fn(record, **options)
