"""The one onnxruntime CPU session helper of the project.

sess = ort_session(model_or_path_or_proto, level="all", threads=2)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def ort_session(
    model: Any,
    level: str = "disable",
    threads: int = 2,
    spinning: bool = False,
    custom_ops_library: str | None = None,
) -> Any:
    """An onnxruntime CPU session of an IR :class:`Model`, a ``ModelProto`` or a path.

    ``level``: ``disable``, ``basic``, ``extended`` or ``all``. ``spinning``: let idle worker
    threads spin (onnxruntime's default, what deployments run); off by default because
    sessions here are often used side by side, and an idle session's spinning threads take the
    cores from the one being timed.

    A model using graph-autofusion's custom operators gets their library registered:
    ``custom_ops_library``, else the one its metadata names (next to a saved file), else the
    one this process built for those operators. Without any, onnxruntime refuses the model
    with a message naming the ``ai.graph_autofusion`` domain.
    """
    import onnxruntime as ort

    from graph_autofusion.ir.core import Model

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if isinstance(model, str | Path):
        src: Any = str(model)
    elif isinstance(model, Model):
        from graph_autofusion.frontend.onnx_frontend import to_onnx

        src = to_onnx(model).SerializeToString()
    else:
        src = model.SerializeToString()
    lib = custom_ops_library or _custom_ops_library(model)
    if lib:
        so.register_custom_ops_library(lib)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _custom_ops_library(model: Any) -> str | None:
    """The library for the custom operators ``model`` uses (None: it uses none, or none is
    known)."""
    import os

    from graph_autofusion.codegen import ort_customop as co
    from graph_autofusion.ir.core import Model

    path = None
    if isinstance(model, Model):
        ops = co.library_ops(model)
        proto = None
    elif isinstance(model, str | Path):
        import onnx

        path = str(model)
        proto = onnx.load(path, load_external_data=False)
        ops = co.custom_ops_of(proto)
    else:
        proto = model
        ops = co.custom_ops_of(proto)
    if not ops:
        return None
    if proto is not None:
        named = co.library_path_from_metadata(proto, path)
        if named and os.path.exists(named):
            return named
    return co.library_for(ops)


def fused_session(path: str | Path, level: str = "all", threads: int = 2, **kw: Any) -> Any:
    """An onnxruntime session of a fused model saved by graph-autofusion, with the
    custom-operator library its metadata names registered (a model without one opens as is).

    Raises:
        FileNotFoundError: the metadata names a library that is not there (copy the kernel
            folder along with the model).
    """
    import os

    import onnx

    from graph_autofusion.codegen import ort_customop as co

    proto = onnx.load(str(path), load_external_data=False)
    lib = co.library_path_from_metadata(proto, str(path))
    if lib is not None and not os.path.exists(lib):
        from graph_autofusion.errors import MissingFileError

        raise MissingFileError(
            f"{path} needs its custom-operator library {lib}, which is missing (the kernel "
            f"folder written next to the model must stay next to it)"
        )
    return ort_session(path, level, threads, custom_ops_library=lib, **kw)
