"""A legacy-form ResNet-50 (opset 9, IR version 3) built from the zoo's ``resnet50_bn``.

Older exporters and third-party converters wrote files that compute the same model as a fresh
export but spell it differently. :func:`legacy_resnet50_bn` exports the zoo's ``resnet50_bn``
module with the TorchScript exporter at opset 9 (``do_constant_folding=False``, so the
BatchNormalizations stay) and rewrites the file into those older spellings:

* every BatchNorm's running mean and variance is a per-layer uniform fill (set on the module
  before the export: each buffer is replaced by its own mean), written as
  ``ConstantOfShape(Constant(shape))``;
* Conv weights and BatchNorm scales and biases are ``Constant`` nodes (opset 9 has only the
  ``value`` attribute; the newer forms are tested on small graphs);
* the classifier's Gemm weight and bias stay initializers, also listed as graph inputs, and the
  file says IR version 3 (where every initializer had to be a graph input);
* the residual ``Add`` nodes are two-input ``Sum`` nodes;
* ``Flatten`` is TorchScript's old ``x.view(x.size(0), -1)`` program:
  ``Shape -> Gather -> Unsqueeze(axes attribute) -> Concat -> Reshape``.

The file is cached under :func:`~graph_autofusion.testing.export.cache_dir` like the zoo's
exports (same locking and atomic move), keyed by the model's configuration, the library
versions and :data:`LEGACY_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import ModelProto, TensorProto, helper, numpy_helper

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.testing.builders import build_model
from graph_autofusion.testing.export import cache_dir, export_lock, quiet, tool_versions
from graph_autofusion.testing.specs import config_fingerprint, model_spec

__all__ = ["LEGACY_OPSET", "LEGACY_VERSION", "legacy_form", "legacy_resnet50_bn"]

#: Opset of the legacy export.
LEGACY_OPSET = 9
#: Bump when :func:`legacy_form` writes a different file.
LEGACY_VERSION = 1


def legacy_path() -> Path:
    """Where :func:`legacy_resnet50_bn` caches its file (it may not exist yet)."""
    key = json.dumps(
        {"fp": config_fingerprint("resnet50_bn"), "versions": tool_versions(), "v": LEGACY_VERSION},
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"resnet50_bn-legacy-opset{LEGACY_OPSET}-{digest}.onnx"


def legacy_resnet50_bn() -> Path:
    """The legacy-form ResNet-50 file (built once, then cached); its input is
    ``pixel_values`` (1x3x224x224) as in :func:`~graph_autofusion.testing.example_feeds`.

    Raises:
        GraphAutoFusionError: the export or the rewrite failed.
    """
    path = legacy_path()
    if path.is_file():
        return path
    with export_lock(path):
        if path.is_file():
            return path
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            proto = legacy_form(_export_opset9())
            onnx.checker.check_model(proto)
            onnx.save_model(proto, str(tmp))
            os.replace(tmp, path)
        except Exception as exc:
            raise GraphAutoFusionError(f"building the legacy ResNet-50 failed: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
    return path


def _export_opset9() -> ModelProto:
    module, inputs = build_model("resnet50_bn")
    spec = model_spec("resnet50_bn")
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.fill_(float(m.running_mean.mean()))
                m.running_var.fill_(float(m.running_var.mean()))
    tmp = cache_dir() / f".legacy-export-{os.getpid()}-{uuid.uuid4().hex[:8]}.onnx"
    try:
        with quiet(), torch.no_grad():
            torch.onnx.export(
                module,
                tuple(inputs[n] for n in spec.input_names),
                str(tmp),
                dynamo=False,
                opset_version=LEGACY_OPSET,
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                do_constant_folding=False,
            )
        return onnx.load_model(str(tmp))
    finally:
        tmp.unlink(missing_ok=True)


def legacy_form(proto: ModelProto) -> ModelProto:
    """Rewrite a fresh ResNet export (initializer weights, ``Add``, ``Flatten``) into the
    legacy spellings listed in the module docstring; returns a new proto."""
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    role: dict[str, tuple[str, int]] = {}
    for n in g.node:
        for i, name in enumerate(n.input):
            if name in inits:
                role.setdefault(name, (n.op_type, i))
    nodes: list[onnx.NodeProto] = []
    kept: list[TensorProto] = []
    for name, t in inits.items():
        arr = numpy_helper.to_array(t)
        op, idx = role.get(name, ("", -1))
        if op == "BatchNormalization" and idx in (3, 4) and arr.size > 1 and np.all(arr == arr[0]):
            shape = numpy_helper.from_array(np.asarray(arr.shape, np.int64), f"{name}_shape")
            fill = numpy_helper.from_array(arr.reshape(-1)[:1].copy(), "")
            nodes.append(helper.make_node("Constant", [], [f"{name}__shape"], value=shape))
            nodes.append(
                helper.make_node("ConstantOfShape", [f"{name}__shape"], [name], value=fill)
            )
        elif op in ("Conv", "BatchNormalization"):
            nodes.append(helper.make_node("Constant", [], [name], value=t))
        else:
            kept.append(t)
    for n in g.node:
        nodes.extend(_legacy_node(n, inits))
    out = ModelProto()
    out.CopyFrom(proto)
    og = out.graph
    del og.node[:]
    og.node.extend(nodes)
    del og.initializer[:]
    og.initializer.extend(kept)
    listed = {vi.name for vi in og.input}
    for t in kept:
        if t.name not in listed:
            og.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del og.value_info[:]
    out.ir_version = 3
    return out


def _legacy_node(n: onnx.NodeProto, inits: dict[str, TensorProto]) -> list[onnx.NodeProto]:
    if n.op_type == "Add" and len(n.input) == 2 and not any(i in inits for i in n.input):
        sum_node = onnx.NodeProto()
        sum_node.CopyFrom(n)
        sum_node.op_type = "Sum"
        return [sum_node]
    if n.op_type == "Flatten" and all(a.name != "axis" or a.i == 1 for a in n.attribute):
        x, y, p = n.input[0], n.output[0], n.name or "flatten"
        zero = numpy_helper.from_array(np.asarray(0, np.int64), "")
        minus_one = numpy_helper.from_array(np.asarray([-1], np.int64), "")
        return [
            helper.make_node("Shape", [x], [f"{p}_shape"], name=f"{p}_Shape"),
            helper.make_node("Constant", [], [f"{p}_zero"], value=zero),
            helper.make_node("Gather", [f"{p}_shape", f"{p}_zero"], [f"{p}_n"], axis=0),
            helper.make_node("Unsqueeze", [f"{p}_n"], [f"{p}_n1"], axes=[0]),
            helper.make_node("Constant", [], [f"{p}_minus_one"], value=minus_one),
            helper.make_node("Concat", [f"{p}_n1", f"{p}_minus_one"], [f"{p}_target"], axis=0),
            helper.make_node("Reshape", [x, f"{p}_target"], [y], name=n.name),
        ]
    return [n]
