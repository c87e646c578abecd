"""The one onnxruntime CPU session helper of the project.

sess = ort_session(model_or_path_or_proto, level="all", threads=2)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graph_autofusion.codegen import ort_customop as co
from graph_autofusion.errors import MissingFileError
from graph_autofusion.ir.core import Model
from graph_autofusion.runtime.denormals import METADATA_KEY as DENORMALS_METADATA_KEY
from graph_autofusion.runtime.denormals import denormals_flushed
from graph_autofusion.runtime.ort_core import (
    IN_PLACE_MIN_BYTES,
    SERVING_MODES,
    SERVING_SPINNING,
    in_place_weights,
    open_session,
)

__all__ = [
    "IN_PLACE_MIN_BYTES",
    "SERVING_MODES",
    "SERVING_SPINNING",
    "fused_session",
    "in_place_weights",
    "model_weights",
    "ort_session",
]


def ort_session(
    model: Any,
    level: str = "disable",
    threads: int = 2,
    spinning: bool | str = False,
    custom_ops_library: str | None = None,
    in_place: Mapping[str, np.ndarray] | None = None,
    *,
    find_library: bool = True,
    **options: Any,
) -> Any:
    """An onnxruntime CPU session of an IR :class:`Model`, a ``ModelProto``, its serialized
    bytes or a path. ``options``: :func:`~graph_autofusion.runtime.ort_core.open_session`'s
    keyword arguments (``log_severity``, ``profile_prefix``, ``lean``, ``prepack``,
    ``optimized_model_path``), described below.

    ``level``: ``disable``, ``basic``, ``extended`` or ``all``. ``spinning``: let idle worker
    threads spin (``True``: onnxruntime's default, what deployments run); off by default
    because sessions here are often used side by side, and an idle session's spinning threads
    take the cores from the one being timed. ``"run"``: they spin between the operators of a
    run and for at most ``ort_core.SPIN_TAIL_US`` (1 ms) after it returns
    (``session.intra_op.spin_duration_us``): a run is as fast as with spinning (MiniLM s16:
    3.7-3.9 ms against 6.1-6.4 without, 3.7-3.8 with) and leaves little spinning behind (an
    eager forward right after took 13.3 ms, against 12.9 after a session that never spins and
    58 after a spinning one).

    A model using graph-autofusion's custom operators gets their library registered:
    ``custom_ops_library``, else the one its metadata names (next to a saved file), else the
    one this process built for those operators. Without any, onnxruntime refuses the model
    with a message naming the ``ai.graph_autofusion`` domain. ``find_library=False``: only
    ``custom_ops_library`` is registered, never one found from the model (the session plain
    onnxruntime makes of a saved file, as a user without graph-autofusion opens it).

    ``in_place``: initializers (by name) that the session reads from these arrays' memory
    instead of the model's bytes (:func:`in_place_weights`): nothing is copied beyond what
    onnxruntime's own kernels pack, and a write into an array is seen by the next run.

    ``threads``: 0 is onnxruntime's own choice (one per physical core). ``log_severity``:
    onnxruntime's ``log_severity_level`` (3: errors only; 4: fatal only). ``profile_prefix``:
    onnxruntime's profiling on, its JSON trace written under this prefix
    (``sess.end_profiling()`` returns the file).

    ``lean``: a session for numerics only (safe mode's whole-model runs): no weight packing,
    no memory arena, and an IR model's large initializers read in place (its arrays are not
    serialized): a session over a model of N bytes of weights adds almost none. ``prepack``:
    onnxruntime packs constant GEMM weights into its own layout (a copy of each); off, its
    kernels read them as stored. ``optimized_model_path``: onnxruntime writes the model its
    optimizer made there (what ``level`` turned the graph into). ``flush_denormals``: runs
    flush denormal floats to zero on every thread that computes them, the caller's only for
    the length of a run (:class:`~graph_autofusion.runtime.ort_core.FlushingSession`,
    ``FuseOptions.denormals``); the opening thread's own setting is kept either way.
    ``placeholder``: with ``in_place`` at a level other than ``disable``, ``"full"`` (the
    default) writes every weight to the placeholder file onnxruntime's optimizer may read while
    the session is created; ``"rewritable"`` only those it may rewrite
    (:func:`~graph_autofusion.runtime.ort_core.kept_as_given`): for a caller that checks the
    session's outputs, and opens it again with ``"full"`` when they differ.
    """
    if options.get("lean") and isinstance(model, Model) and not in_place:
        in_place = model_weights(model)
    src: Any = model  # a path or bytes: open_session reads them as they are
    if isinstance(model, Model):
        from graph_autofusion.frontend.onnx_frontend import to_onnx

        # the weights read in place are not serialized: a fresh proto, the session's own
        src = to_onnx(model, without_data=set(in_place or ()))
    elif not isinstance(model, str | bytes | os.PathLike):
        src = model.SerializeToString()  # a caller's ModelProto is never modified (transB)
    lib = custom_ops_library or (_custom_ops_library(model) if find_library else None)
    return open_session(src, level, threads, spinning, lib, in_place, **options)


def model_weights(model: Any) -> dict[str, np.ndarray]:
    """The initializers of IR ``model`` a session can read in place (:func:`in_place_weights`)."""
    return in_place_weights({n: v.const for n, v in model.graph.initializers.items()})


def _custom_ops_library(model: Any) -> str | None:
    """The library for the custom operators ``model`` uses (None: it uses none, or none is
    known)."""
    path = None
    if isinstance(model, bytes) and co.DOMAIN.encode() not in model:
        return None  # serialized: the domain's name would appear in it
    if isinstance(model, bytes):
        import onnx

        model = onnx.load_from_string(model)
    if isinstance(model, Model):
        ops = co.library_ops(model)
        proto = None
    elif isinstance(model, str | os.PathLike):
        import onnx

        path = os.fspath(model)
        proto = onnx.load(path, load_external_data=False)
        ops = co.custom_ops_of(proto)
    else:
        proto = model
        ops = co.custom_ops_of(proto)
    if not ops:
        return None
    if proto is not None:
        named = co.library_path_from_metadata(proto, path)
        # a relative name without the model's own path would be read in the working
        # directory (another model's kernel folder of the same name): not trusted
        if named and (path is not None or os.path.isabs(named)) and os.path.exists(named):
            return named
    return co.library_for(ops)


def saved_library(proto: Any, path: str | os.PathLike) -> str | None:
    """The custom-operator library a fused model saved at ``path`` names in its metadata
    (resolved next to the file), registered for its operators in this process, so every
    session of the model (or of its parts) made here finds it; ``None`` when it names none.

    Raises:
        MissingFileError: the metadata names a library that is not there.
    """
    lib = co.library_path_from_metadata(proto, os.fspath(path))
    if lib is None:
        return None
    if not os.path.exists(lib):
        raise MissingFileError(
            f"{path} needs its custom-operator library {lib}, which is missing (the kernel "
            f"folder written next to the model must stay next to it)"
        )
    co.register_library(lib, co.custom_ops_of(proto))
    return lib


def fused_session(
    path: str | Path,
    level: str = "all",
    threads: int = 2,
    *,
    denormals: str | None = None,
    **kw: Any,
) -> Any:
    """An onnxruntime session of a fused model saved by graph-autofusion, with the
    custom-operator library its metadata names registered (a model without one opens as is),
    serving as graph-autofusion serves it: ``denormals`` (``"flush"`` or ``"keep"``) defaults to
    the ``FuseOptions.denormals`` the model was fused with (its metadata), else ``"flush"``.

    Raises:
        FileNotFoundError: the metadata names a library that is not there (copy the kernel
            folder along with the model).
    """
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    lib = saved_library(proto, path)
    meta = {p.key: p.value for p in proto.metadata_props}
    flush = denormals_flushed(denormals or meta.get(DENORMALS_METADATA_KEY, "flush"))
    return ort_session(path, level, threads, custom_ops_library=lib, flush_denormals=flush, **kw)
