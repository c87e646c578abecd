"""Reading ONNX files (external data included) and running shape inference for the importer."""

from __future__ import annotations

import logging
import os
from typing import Any

import onnx
from onnx import ModelProto, TypeProto, ValueInfoProto, external_data_helper

from graph_autofusion.errors import ModelLoadError
from graph_autofusion.frontend.onnx_checks import check_file_size, check_tensors, check_text

log = logging.getLogger(__name__)

# Initializers with more elements than this are described to shape inference as typed inputs
# instead of data: inference then never copies large weights, and > 2 GB models still fit.
_INFERENCE_DATA_LIMIT = 4096
_PROTO_LIMIT = 2**31 - 2**20


def read_model(source: str | os.PathLike[str] | ModelProto) -> tuple[ModelProto, str]:
    """Load ``source`` with its external data; returns the proto and a label for messages.

    Raises:
        ModelLoadError: unreadable/non-ONNX file, or missing or truncated external data.
    """
    if isinstance(source, ModelProto):
        label = f"<ModelProto graph {source.graph.name!r}>"
        _check_model_proto(source, label)
        _require_no_external(source, label)
        check_tensors(source, label, None)
        check_text(source, label)
        return source, label
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load_onnx expects a path or onnx.ModelProto, got {type(source).__name__}")
    path = os.fspath(source)
    label = path
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: not a regular file")
    check_file_size(path)
    try:
        proto = onnx.load_model(path, load_external_data=False)
    except Exception as exc:  # DecodeError, OSError, ...
        raise ModelLoadError(
            f"{path}: not a readable ONNX model (truncated or not ONNX): {type(exc).__name__}: {exc}"
        ) from exc
    _check_model_proto(proto, label)
    base_dir = os.path.dirname(os.path.abspath(path))
    check_tensors(proto, label, base_dir)
    check_text(proto, label)
    _load_external(proto, base_dir, label)
    return proto, label


def _check_model_proto(proto: ModelProto, label: str) -> None:
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelLoadError(
            f"{label}: not an ONNX model (no ir_version or no graph; file truncated or garbage?)"
        )


def _external_tensors(proto: ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in external_data_helper._get_all_tensors(proto)
        if external_data_helper.uses_external_data(t)
    ]


def _require_no_external(proto: ModelProto, label: str) -> None:
    tensors = _external_tensors(proto)
    if tensors:
        loc = {e.key: e.value for e in tensors[0].external_data}.get("location", "?")
        raise ModelLoadError(
            f"{label}: tensor {tensors[0].name!r} refers to external data file {loc!r} that is not "
            "loaded; pass the model's file path to load_onnx instead of a ModelProto"
        )


def _load_external(proto: ModelProto, base_dir: str, label: str) -> None:
    tensors = _external_tensors(proto)
    if not tensors:
        return
    for t in tensors:
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        full = os.path.join(base_dir, loc)
        if not loc or not os.path.isfile(full):
            raise ModelLoadError(
                f"{label}: external data file {full!r} (tensor {t.name!r}) is missing"
            )
    try:
        external_data_helper.load_external_data_for_model(proto, base_dir)
    except Exception as exc:
        raise ModelLoadError(
            f"{label}: cannot read external data ({type(exc).__name__}: {exc})"
        ) from exc


def _initializer_as_input(t: onnx.TensorProto) -> ValueInfoProto:
    vi = ValueInfoProto(name=t.name)
    tt = vi.type.tensor_type
    tt.elem_type = t.data_type
    tt.shape.SetInParent()
    for d in t.dims:
        tt.shape.dim.add().dim_value = d
    return vi


def inference_skeleton(proto: ModelProto) -> ModelProto:
    """A light copy of ``proto`` for shape inference: large initializers become typed inputs."""
    skel = ModelProto()
    skel.ir_version = max(proto.ir_version, 4)
    skel.opset_import.extend(proto.opset_import)
    # Unknown domains without an opset import would abort inference of the whole graph.
    imported = {op.domain for op in proto.opset_import} | {f.domain for f in proto.functions}
    for domain in dict.fromkeys(n.domain for n in proto.graph.node):
        if domain not in imported and domain not in ("", "ai.onnx"):
            skel.opset_import.add(domain=domain, version=1)
            imported.add(domain)
    skel.functions.extend(proto.functions)
    g, sg = proto.graph, skel.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    sg.sparse_initializer.extend(g.sparse_initializer)
    listed = {vi.name for vi in g.input}
    for t in g.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if n <= _INFERENCE_DATA_LIMIT:
            sg.initializer.append(t)
        elif t.name not in listed:
            sg.input.append(_initializer_as_input(t))
    return skel


def infer_types(proto: ModelProto, label: str) -> tuple[dict[str, TypeProto], str]:
    """Run ONNX shape inference; returns inferred types by name and how inference went.

    Never raises: failures are logged and reported in the status string.
    """
    try:
        skel = inference_skeleton(proto)
        if skel.ByteSize() > _PROTO_LIMIT:
            return {}, "skipped: graph too large for shape inference"
    except Exception as exc:  # pragma: no cover - defensive
        return {}, f"failed: {exc}"
    errors = []
    for data_prop in (True, False):
        try:
            inferred = onnx.shape_inference.infer_shapes(
                skel, check_type=False, strict_mode=False, data_prop=data_prop
            )
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        types: dict[str, Any] = {}
        for vi in inferred.graph.value_info:
            types[vi.name] = vi.type
        for vi in inferred.graph.output:
            types[vi.name] = vi.type
        return types, "data_prop" if data_prop else "basic"
    log.warning("%s: shape inference failed, types left as given: %s", label, errors[-1])
    return {}, f"failed: {errors[-1]}"
