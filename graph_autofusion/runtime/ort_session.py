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
    model: Any, level: str = "disable", threads: int = 2, spinning: bool = False
) -> Any:
    """An onnxruntime CPU session of an IR :class:`Model`, a ``ModelProto`` or a path.

    ``level``: ``disable``, ``basic``, ``extended`` or ``all``. ``spinning``: let idle worker
    threads spin (onnxruntime's default, what deployments run); off by default because
    sessions here are often used side by side, and an idle session's spinning threads take the
    cores from the one being timed.
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
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
