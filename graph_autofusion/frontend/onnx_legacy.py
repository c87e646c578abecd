"""Older and third-party ONNX spellings normalised to what fresh exports write (issue 13).

Run on the imported IR (``load_onnx(path, normalize=True)``, which
:func:`~graph_autofusion.frontend.loader.load_model` and so ``GraphAutoFusion`` and the command
line use); the user's file is never touched. Every change computes exactly what the file
computes; a fold that cannot be proven (a dynamic shape, an unknown dtype) is skipped, with
its reason in the report, never guessed.

* **Initializers listed as graph inputs, IR version < 4.** The IR-3 rule was that every
  initializer is also a graph input. onnxruntime does not let a feed override those (it
  answers "Invalid input name"; from IR version 4 on a feed does override them), so they are
  constants: the listing is dropped and the model is written as IR version 4, which then
  says the same thing (and, unlike IR 3, allows the new initializers a rewrite adds without
  listing them; every IR < 4 model is raised to 4). From IR version 4 on the listing is kept and shape folding treats such
  initializers as overridable, as before.
* **Constant nodes holding data** (every tensor but the 0-D/1-D integer ones of shape
  programs, which shape folding reads and removes where they end) become initializers of the
  same name, whichever attribute holds the value: ``value``, ``value_float(s)`` (float32),
  ``value_int(s)`` (int64) or ``sparse_value``. ``value_string(s)`` and other attributes are
  left alone (reported).
* **ConstantOfShape of a constant shape** (an initializer, a Constant, or a shape program
  over static shapes, evaluated by :func:`~graph_autofusion.ir.shape_programs.static_ints`)
  becomes the filled initializer, up to :data:`MAX_FOLDED_ELEMENTS` elements.
* **Two-input Sum** becomes ``Add`` (the residual sum of old exporters; Sum-8 broadcasts
  as Add does, and Sum-6's equal shapes are a case of Add's broadcast).

Attribute forms of opsets 7-12 need no rewrite for the rules: the rules and shape folding read
both spellings where they use them (``ReduceMean`` axes attribute, Clip-6 ``min``/``max``,
Squeeze/Unsqueeze ``axes`` and Slice-1 bounds in shape programs). Rewriting a node into its
newer input form would need the whole model's opset raised, which this pass does not do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import AttributeProto

from graph_autofusion.frontend.onnx_types import dtype_of, sparse_to_dense
from graph_autofusion.ir.core import Graph, Model, Node, RawAttribute, Value, const_value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.shape_programs import (
    remove_dead_shape_nodes,
    shape_program_nodes,
    static_ints,
)

__all__ = [
    "MAX_FOLDED_ELEMENTS",
    "LegacyNormalization",
    "initializer_inputs_as_constants",
    "normalize_legacy",
]

#: Largest ConstantOfShape (in elements) folded into an initializer: bigger fills stay nodes
#: (the file would grow by the whole tensor).
MAX_FOLDED_ELEMENTS = 1 << 22

_STANDARD = ("", "ai.onnx")


@dataclass
class LegacyNormalization:
    """What :func:`normalize_legacy` changed, and what it left alone and why."""

    listed_initializers_constant: int = 0  # IR < 4: initializers listed as graph inputs
    constants_to_initializers: int = 0
    constant_of_shape_folded: int = 0
    sums_to_adds: int = 0
    ir_version: tuple[int, int] | None = None  # (before, after) when raised
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (node, reason)

    @property
    def changed(self) -> bool:
        return bool(
            self.listed_initializers_constant
            or self.constants_to_initializers
            or self.constant_of_shape_folded
            or self.sums_to_adds
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "listed_initializers_constant": self.listed_initializers_constant,
            "constants_to_initializers": self.constants_to_initializers,
            "constant_of_shape_folded": self.constant_of_shape_folded,
            "sums_to_adds": self.sums_to_adds,
            "ir_version": list(self.ir_version) if self.ir_version else None,
            "skipped": [{"node": n, "reason": r} for n, r in self.skipped],
        }


def normalize_legacy(model: Model) -> LegacyNormalization:
    """Normalise ``model``'s main graph in place (see the module docstring); returns what it
    did, also kept in ``model.meta["legacy_normalization"]``. Never raises for a node it
    cannot fold: the node stays and the reason is reported."""
    graph = model.graph
    report = LegacyNormalization()
    ir_before = model.ir_version
    report.listed_initializers_constant = initializer_inputs_as_constants(model)
    if model.ir_version != ir_before:
        report.ir_version = (ir_before, model.ir_version)
    overridable = frozenset(graph.meta.get("onnx_initializer_inputs", {}))
    shape_nodes: set[Node] = set()
    for node in list(graph.nodes):
        if node.domain not in _STANDARD or node.graph is not graph:
            continue
        if node.op_type == "Constant":
            _fold_constant(graph, node, report)
        elif node.op_type == "ConstantOfShape":
            shape = node.inputs[0] if node.inputs else None
            got = None if shape is None else _shape_value(shape, overridable)
            if got is None:
                report.skipped.append((node.name, "ConstantOfShape: shape not provably constant"))
                continue
            if shape is not None and shape.producer is not None:
                shape_nodes |= shape_program_nodes(shape)
            _fold_constant_of_shape(graph, node, got, report)
        elif node.op_type == "Sum" and len(node.inputs) == 2 and None not in node.inputs:
            node.op_type = "Add"
            report.sums_to_adds += 1
    remove_dead_shape_nodes(graph, shape_nodes)
    model.meta["legacy_normalization"] = report
    return report


def initializer_inputs_as_constants(model: Model) -> int:
    """For IR version < 4: drop the graph-input listing of the initializers (onnxruntime lets
    no feed override them, so they are constants) and raise the IR version to 4, where an
    initializer needs no listing and a new one (a folded weight) may be added. Returns how
    many listed initializers became plain ones; from IR version 4 on does nothing."""
    if model.ir_version >= 4:
        return 0
    graph = model.graph
    listed = graph.meta.pop("onnx_initializer_inputs", {})
    graph.meta.pop("onnx_input_order", None)
    model.ir_version = 4
    return len(listed)


def _shape_value(shape: Value, overridable: frozenset[str]) -> list[int] | None:
    """``shape``'s entries when provably constant: a constant 1-D integer tensor (not one a
    feed may override) or a shape program over static shapes."""
    if shape.name in overridable:
        return None
    c = const_value(shape)
    if c is not None:
        return c.astype(np.int64).tolist() if c.dtype.kind in "iu" and c.ndim == 1 else None
    got = static_ints(shape, overridable)
    return None if got is None or got[1] else got[0]


def _constant_array(node: Node) -> tuple[np.ndarray | None, str]:
    """The tensor a Constant node holds, with the attribute's ONNX types, or a reason."""
    a = node.attrs
    if len(a) != 1:
        return None, f"Constant with attributes {sorted(a)} (exactly one expected)"
    key, val = next(iter(a.items()))
    if key == "value" and isinstance(val, np.ndarray):
        return val, ""
    if key == "value_float":
        return np.asarray(val, np.float32), ""
    if key == "value_floats":
        return np.asarray(val, np.float32).reshape(-1), ""
    if key == "value_int":
        return np.asarray(val, np.int64), ""
    if key == "value_ints":
        return np.asarray(val, np.int64).reshape(-1), ""
    if key == "sparse_value" and isinstance(val, RawAttribute):
        proto = val.proto
        if proto.type == AttributeProto.SPARSE_TENSOR:
            try:
                return sparse_to_dense(proto.sparse_tensor), ""
            except Exception as exc:  # noqa: BLE001 - malformed sparse tensor: leave the node
                return None, f"Constant sparse_value unreadable: {exc}"
    return None, f"Constant attribute {key!r} is not a numeric tensor; left as a node"


def _fold_constant(graph: Graph, node: Node, report: LegacyNormalization) -> None:
    arr, why = _constant_array(node)
    if arr is None:
        report.skipped.append((node.name, why))
        return
    if "value" in node.attrs and arr.dtype.kind in "iu" and arr.ndim <= 1:
        return  # a shape program's constant: shape folding reads it and removes it
    # bfloat16, float8 ...: the IR holds an up-cast copy; the original tensor is written back
    _, proto = node.meta.get("onnx_attr_tensors", {}).get("value", (None, None))
    new = _replace_by_initializer(graph, node, arr, report, "constants_to_initializers")
    if new is not None and proto is not None:
        new.dtype = dtype_of(proto.data_type)
        if new.dtype is None:
            new.meta["onnx_elem_type"] = int(proto.data_type)
        new.meta["onnx_tensor"] = proto
        new.meta["onnx_tensor_const"] = new.const


def _fold_constant_of_shape(
    graph: Graph, node: Node, shape: list[int], report: LegacyNormalization
) -> None:
    if any(d < 0 for d in shape):
        report.skipped.append((node.name, f"ConstantOfShape: negative dim in {shape}"))
        return
    n = int(np.prod(shape, dtype=np.int64))
    if n > MAX_FOLDED_ELEMENTS:
        report.skipped.append((node.name, f"ConstantOfShape: {n} elements, over the limit"))
        return
    fill = node.attrs.get("value")
    if fill is None:
        fill = np.zeros(1, np.float32)
    if not isinstance(fill, np.ndarray) or fill.size != 1:
        report.skipped.append((node.name, "ConstantOfShape: value is not a one-element tensor"))
        return
    _, proto = node.meta.get("onnx_attr_tensors", {}).get("value", (None, None))
    if proto is not None and dtype_of(proto.data_type) in (None, DType.BFLOAT16):
        report.skipped.append((node.name, "ConstantOfShape: fill of a type NumPy lacks"))
        return
    arr = np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype)
    _replace_by_initializer(graph, node, arr, report, "constant_of_shape_folded")


def _replace_by_initializer(
    graph: Graph, node: Node, arr: np.ndarray, report: LegacyNormalization, counter: str
) -> Value | None:
    out = node.outputs[0]
    if graph.is_output(out) or len(node.outputs) != 1:
        report.skipped.append((node.name, f"{node.op_type}: its output is a graph output"))
        return None
    name = out.name
    new = graph.add_initializer(graph.fresh_name(f"{name}_folded"), arr)
    new.doc = out.doc
    graph.replace_all_uses_with(out, new)
    graph.remove_node(node)
    graph.rename_value(new, name)
    setattr(report, counter, getattr(report, counter) + 1)
    return new
