"""ONNX frontend (F1): import (:func:`load_onnx`), export (:func:`to_onnx`), atomic saving.

The import lives in :mod:`onnx_import`, the export in :mod:`onnx_export`; this module re-exports
both and adds :func:`save_onnx` (atomic, external data for large models) and :func:`check_model`.
"""

from __future__ import annotations

import os
import uuid
from typing import BinaryIO

import onnx
from onnx import ModelProto, TensorProto, external_data_helper

from graph_autofusion.errors import IRError, ModelWriteError
from graph_autofusion.frontend.onnx_export import to_onnx
from graph_autofusion.frontend.onnx_import import import_model, load_onnx
from graph_autofusion.ir.core import Model

__all__ = ["check_model", "import_model", "load_onnx", "save_onnx", "to_onnx"]

EXTERNAL_DATA_THRESHOLD_BYTES = int(1.8 * 2**30)
"""Models whose serialized size exceeds this are saved with external data automatically."""
_MIN_EXTERNAL_TENSOR = 1024


def save_onnx(
    model: Model | ModelProto,
    path: str | os.PathLike[str],
    *,
    external_data: bool | None = None,
    overwrite: bool = True,
) -> None:
    """Write ``model`` to ``path`` atomically.

    The model (and its external data file ``<file name>.data`` beside it, if used) is written to
    temporary files in the destination folder and moved into place with ``os.replace``; on any
    failure the temporary files are removed and nothing is left at the destination.

    Args:
        model: An IR :class:`Model` (exported with :func:`to_onnx`) or a ModelProto (not modified).
        path: Destination file; its folder must exist.
        external_data: Store tensors of 1 KiB or more in ``<file name>.data``. ``None`` decides
            automatically (external when the model is larger than about 1.8 GB).
        overwrite: Replace an existing file; if False an existing destination is an error.

    Raises:
        ModelWriteError: the destination is not writable, exists (``overwrite=False``), or the
            model cannot be serialized; the message names the path.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    data_name = base + ".data"
    data_path = os.path.join(folder, data_name)
    if not base or os.path.isdir(path):
        raise ModelWriteError(f"{path}: is a directory, not a file path")
    if os.path.exists(path) and not os.path.isfile(path):  # os.replace would remove a device
        raise ModelWriteError(f"{path}: exists and is not a regular file (a device or a pipe)")
    if not os.path.isdir(folder):
        raise ModelWriteError(f"{path}: destination folder {folder!r} does not exist")
    if not overwrite and os.path.exists(path):
        raise ModelWriteError(f"{path}: file exists and overwrite=False")
    temps: list[str] = []
    try:
        owned = isinstance(model, Model)
        proto = to_onnx(model) if isinstance(model, Model) else model
        if not isinstance(proto, ModelProto):
            raise TypeError(f"expected Model or onnx.ModelProto, got {type(model).__name__}")
        use_external = (
            external_data
            if external_data is not None
            else estimate_size(proto) > EXTERNAL_DATA_THRESHOLD_BYTES
        )
        stale_data = None
        if use_external:
            if os.path.exists(data_path) and not os.path.isfile(data_path):
                raise IsADirectoryError(f"external data path {data_path!r} is not a file")
            if os.path.exists(data_path):
                if not overwrite:
                    raise FileExistsError(f"external data file {data_path!r} exists")
                # Never overwrite the data an existing model points to: write the new data
                # under a fresh name, switch the model file last, then drop the old data.
                stale_data = data_path
                data_name = f"{base}.{uuid.uuid4().hex[:8]}.data"
                data_path = os.path.join(folder, data_name)
            if not owned:
                copy = ModelProto()
                copy.CopyFrom(proto)
                proto = copy
            tmp_data = _temp_path(folder, data_name)
            temps.append(tmp_data)
            with _create(tmp_data) as f:
                _write_external(proto, f, data_name)
        payload = proto.SerializeToString()
        tmp_model = _temp_path(folder, base)
        temps.append(tmp_model)
        with _create(tmp_model) as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        del payload
        if use_external:
            os.replace(temps[0], data_path)
            temps.pop(0)
        os.replace(tmp_model, path)
        temps.clear()
        if stale_data is not None:
            try:
                os.remove(stale_data)
            except OSError:
                pass
    except Exception as exc:
        for tmp in temps:
            try:
                os.remove(tmp)
            except OSError:
                pass
        raise ModelWriteError(
            f"{path}: cannot write model ({type(exc).__name__}: {exc}); nothing was written"
        ) from exc


def estimate_size(proto: ModelProto) -> int:
    """Approximate serialized size of ``proto`` in bytes, without serializing it."""
    size = 0
    for t in external_data_helper._get_all_tensors(proto):
        size += len(t.raw_data) + 8 * (
            len(t.float_data) + len(t.int32_data) + len(t.int64_data) + len(t.double_data)
        )
        size += 8 * len(t.uint64_data) + sum(len(s) for s in t.string_data)
    return size + 256 * len(proto.graph.node) + 1024


def _temp_path(folder: str, name: str) -> str:
    return os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")


def _create(path: str) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    return os.fdopen(fd, "wb")


def _write_external(proto: ModelProto, f: BinaryIO, location: str) -> None:
    """Move the raw data of every initializer >= 1 KiB into ``f``; tensors then point at it.

    Constant-node attribute tensors stay inline (as ``onnx.save`` does by default).
    """
    offset = 0
    for t in external_data_helper._get_initializer_tensors(proto):  # incl. subgraph ones
        if not t.HasField("raw_data"):
            continue
        data = t.raw_data
        if len(data) < _MIN_EXTERNAL_TENSOR:
            continue
        align = 65536 if len(data) >= 2**20 else 64
        pad = (-offset) % align
        if pad:
            f.write(b"\0" * pad)
            offset += pad
        f.write(data)
        t.ClearField("raw_data")
        del t.external_data[:]
        for key, value in (("location", location), ("offset", offset), ("length", len(data))):
            entry = t.external_data.add()
            entry.key = key
            entry.value = str(value)
        t.data_location = TensorProto.EXTERNAL
        offset += len(data)
    f.flush()
    os.fsync(f.fileno())


def check_model(model: Model | ModelProto, *, full_check: bool = True) -> None:
    """Run ``onnx.checker.check_model`` (with strict shape inference when ``full_check``).

    Not run on import: models using unknown domains import fine but may fail here.

    Raises:
        IRError: the checker rejected the model; the message carries the checker's text.
    """
    proto = to_onnx(model) if isinstance(model, Model) else model
    try:
        onnx.checker.check_model(proto, full_check=full_check)
    except onnx.checker.ValidationError as exc:
        raise IRError(f"onnx.checker rejected graph {proto.graph.name!r}: {exc}") from exc
    except onnx.shape_inference.InferenceError as exc:
        raise IRError(f"onnx shape inference rejected graph {proto.graph.name!r}: {exc}") from exc
