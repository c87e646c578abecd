"""Which custom-operator library provides which operators, in this process and in a saved
model: the libraries registered once per process, the custom operators a model uses, the
library its metadata names, and a check that a library loads."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from graph_autofusion.codegen.ort_customop_c import (
    DOMAIN,
)
from graph_autofusion.ir.core import RawAttribute

#: Model metadata keys of a fused model that needs the library.
META_LIBRARY = "graph_autofusion.custom_ops_library"  # path relative to the model file


META_DOMAIN = "graph_autofusion.custom_ops_domain"


_LOCK = threading.Lock()


_LIBRARIES: list[tuple[str, frozenset[str]]] = []


def register_library(path: str, ops: Iterable[str]) -> None:
    """Make :func:`graph_autofusion.runtime.ort_session.ort_session` register ``path`` for a
    model using these operators (safe mode's subgraph sessions, the end-to-end check)."""
    with _LOCK:
        entry = (os.fspath(path), frozenset(ops))
        if entry not in _LIBRARIES:
            _LIBRARIES.append(entry)


def library_for(ops: Iterable[str]) -> str | None:
    """A registered library defining every operator in ``ops`` (the newest first)."""
    want = set(ops)
    with _LOCK:
        for path, have in reversed(_LIBRARIES):
            if want <= have and os.path.exists(path):
                return path
    return None


def _graph_ops(g: Any, out: set[str]) -> None:
    for n in g.node:
        if n.domain == DOMAIN:
            out.add(n.op_type)
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _graph_ops(sub, out)


def custom_ops_of(proto: Any) -> list[str]:
    """The ``ai.graph_autofusion`` operators a ``ModelProto`` uses (its subgraphs too)."""
    out: set[str] = set()
    _graph_ops(proto.graph, out)
    return sorted(out)


def library_path_from_metadata(proto: Any, model_path: str | None) -> str | None:
    """The library a saved fused model names in its metadata (resolved next to the file)."""
    meta = {p.key: p.value for p in proto.metadata_props}
    rel = meta.get(META_LIBRARY)
    if not rel:
        return None
    if os.path.isabs(rel) or model_path is None:
        return rel
    return os.path.join(os.path.dirname(os.path.abspath(model_path)), rel)


def check_loads(path: str) -> str:
    """``""`` when onnxruntime registers the library, else why not."""
    import onnxruntime as ort

    try:
        so = ort.SessionOptions()
        so.register_custom_ops_library(path)
    except Exception as exc:  # noqa: BLE001 - reported, the model falls back
        return f"{type(exc).__name__}: {exc}"
    return ""


def library_ops(model: Any) -> list[str]:
    """The custom operators the IR ``model`` uses (inside ``If`` branches too: ``Gemv``)."""

    out = {n.op_type for n in model.graph.nodes if n.domain == DOMAIN}
    for n in model.graph.nodes:
        for a in n.attrs.values():
            if isinstance(a, RawAttribute):
                proto = a.proto
                subs = list(proto) if isinstance(proto, list | tuple) else []
                if hasattr(proto, "node"):
                    subs = [proto]
                elif hasattr(proto, "graphs"):
                    subs = ([proto.g] if proto.HasField("g") else []) + list(proto.graphs)
                for sub in subs:
                    _graph_ops(sub, out)
    return sorted(out)


def meta_for(rel_path: str) -> Mapping[str, str]:
    return {META_LIBRARY: rel_path, META_DOMAIN: DOMAIN}
