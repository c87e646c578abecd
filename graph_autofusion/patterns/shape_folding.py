"""Fold a ``Reshape``'s computed target shape into a constant (the shape-plumbing fusion).

Exporters spell ``x.view(b, s, heads, -1)`` as a small integer program that runs on every
call: ``Shape(x) -> Gather(i) -> Unsqueeze -> Concat -> Reshape`` (TorchScript), or
``Shape(x, start, end) -> Concat`` and ``Slice(Shape(y))`` (dynamo). Each of those nodes is a
kernel dispatch in onnxruntime (2-5 us apiece in a real graph on this machine), and a Llama
layer has several of them. onnxruntime's transformer optimizer folds them too (its
``FusionReshape``).

The fold is proven symbolically, never from one sample: every entry of the target shape is
evaluated over the model's symbolic dims (``batch``, ``seq``, ``unk__3`` ...) through
``Shape``, ``Gather``, ``Slice``, ``Unsqueeze``, ``Squeeze``, ``Concat``, ``Cast``,
``Identity`` and constants (opset < 10's ``Slice`` with attribute bounds and opset < 13's
``Squeeze``/``Unsqueeze`` with an ``axes`` attribute included). The entry becomes:

* its integer when it is a constant;
* ``0`` ("copy the input's dim", ``allowzero=0`` only) when it is the very symbol the reshaped
  input has at the same position;
* ``-1`` ("infer") for at most one entry that is neither, when no constant entry is ``-1``
  already.

Otherwise the ``Reshape`` is left alone. A folded ``Reshape`` that provably returns its input
unchanged (same rank; every entry a copy, the input's own static dim, or the single -1) is
removed and its readers read the input. The shape nodes that no longer feed anything are
removed; nothing else changes, and graph input and output names are kept.

Symbols come from onnxruntime's symbolic shape inference where it runs (:func:`symbolic_shapes`,
the inference onnxruntime's own optimizer relies on), else from the model's value shapes.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, field

import numpy as np

from graph_autofusion.ir.core import Model, Node
from graph_autofusion.ir.shape_programs import (
    SHAPE_OPS,
    Entry,
    ShapeEvaluator,
    dead_shape_nodes,
    remove_dead_shape_nodes,
    shape_program_nodes,
    static_ints,
)
from graph_autofusion.patterns.matcher import const_value

__all__ = [  # the shape-program helpers re-exported from graph_autofusion.ir.shape_programs
    "SHAPE_OPS",
    "FoldedReshape",
    "ShapeFolding",
    "fold_reshape_shapes",
    "remove_dead_shape_nodes",
    "shape_program_nodes",
    "static_ints",
]


@dataclass
class FoldedReshape:
    node: str
    before: list[str]  # the evaluated entries (symbols as names)
    after: list[int]  # the constant shape written


@dataclass
class ShapeFolding:
    """What :func:`fold_reshape_shapes` did."""

    folded: list[FoldedReshape] = field(default_factory=list)
    identities_removed: list[str] = field(default_factory=list)  # Reshapes that changed nothing
    nodes_removed: int = 0  # shape-program nodes and identity Reshapes
    nodes_removed_by_op: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "reshapes_folded": len(self.folded),
            "identity_reshapes_removed": len(self.identities_removed),
            "nodes_removed": self.nodes_removed,
            "nodes_removed_by_op": dict(self.nodes_removed_by_op),
            "folded": [{"node": f.node, "before": f.before, "after": f.after} for f in self.folded],
        }


_MIN = re.compile(r"^Min\((\d+), (.+)\)$|^Min\((.+), (\d+)\)$")


def _safe_merge(a: str, b: str) -> bool:
    """Whether merging dims ``a`` and ``b`` (met in a broadcast) holds for every input the
    model accepts: ``X`` and ``Min(c, X)`` with ``c >= 1`` (a sliced position table). They
    differ only when ``X > c``, where the two cannot broadcast (neither is 1) and the original
    fails, and one is 1 exactly when the other is."""
    for x, y in ((a, b), (b, a)):
        m = _MIN.match(x)
        if m:
            c, sym = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            if sym == y and int(c) >= 1:
                return True
    return False


def _run_inference(proto, auto_merge: bool):
    from onnxruntime.tools import symbolic_shape_infer as ssi_mod

    # the inference logs each broadcast it cannot prove ("unsupported broadcast between 4
    # s0") as a warning, which Python prints on stderr when nothing configured logging: an
    # unknown shape is an answer here, not news for the user
    with _quiet(ssi_mod.logger):
        ssi = ssi_mod.SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
        ssi._preprocess(proto)  # works on its own copy of proto
        while ssi.run_:
            ssi._infer_impl()
        ssi._update_output_from_vi()
    return ssi


@contextlib.contextmanager
def _quiet(log: logging.Logger):
    """``log``'s records below ERROR dropped while inside (a filter of this call's own, so
    calls on two threads never restore each other's state)."""

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def symbolic_shapes(model: Model) -> dict[str, tuple[Entry, ...]]:
    """Every value's symbolic shape by onnxruntime's symbolic shape inference (the one its
    transformer optimizer uses): it carries the inputs' dim names through the graph, so two
    values get the same symbol where the model's own (``unk__12`` vs ``batch``) do not.

    Merging two symbols that meet in a broadcast (its ``auto_merge``) is a guess: one may be 1
    at run time. The merged run is used only when every merge it made holds for every input the
    model accepts (:func:`_safe_merge`: BERT's ``seq`` and ``Min(512, seq)``); otherwise the
    run without merging, where a symbol the inference only suggested merging is dropped
    (unknown) and the inference stops at the first such broadcast. Driven step by step rather
    than through ``infer_shapes``, which writes a debugging copy of the model into the working
    directory when some shape stays unknown. Empty when it is unavailable or fails; the IR's
    shapes are used then."""
    try:
        from graph_autofusion.frontend.onnx_frontend import to_onnx

        # the weights' data is never read here (_weights_as_inputs): not serialized either
        weights = {
            n
            for n, v in model.graph.initializers.items()
            if isinstance(v.const, np.ndarray) and v.const.size > 64 and v.const.dtype.kind == "f"
        }
        proto = to_onnx(model, without_data=weights)
        if not any(o.domain in ("", "ai.onnx") and o.version >= 7 for o in proto.opset_import):
            return {}
        _weights_as_inputs(proto)  # the inference copies the model: keep the copies small
        ssi = _run_inference(proto, True)
        merged: set[str] = set()
        if not all(_safe_merge(str(k), str(v)) for k, v in ssi.suggested_merge_.items()):
            ssi = _run_inference(proto, False)
            merged = {str(k) for k in ssi.suggested_merge_}
            merged |= {str(v) for v in ssi.suggested_merge_.values()}
        out = ssi.out_mp_
    except Exception:  # noqa: BLE001 - an optional refinement
        return {}
    shapes: dict[str, tuple[Entry, ...]] = {}
    for vi in (*out.graph.value_info, *out.graph.input, *out.graph.output):
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims: list[Entry] = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param and d.dim_param not in merged:
                dims.append(str(d.dim_param))
            else:
                dims.append(None)
        shapes[vi.name] = tuple(dims)
    return shapes


def _weights_as_inputs(proto) -> None:
    """Replace ``proto``'s large non-integer initializers by graph inputs of the same type and
    shape: shape inference needs their shapes, and the values of small integer tensors only."""
    from onnx import TensorProto, helper

    keep, moved = [], []
    listed = {i.name for i in proto.graph.input}
    for init in proto.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        if n > 64 and init.data_type not in (TensorProto.INT32, TensorProto.INT64):
            if init.name not in listed:
                moved.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
        else:
            keep.append(init)
    if moved:
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(keep)
        proto.graph.input.extend(moved)


def _constant_shape(
    node: Node, entries: list[Entry], in_shape: tuple[Entry, ...] | None
) -> list[int] | None:
    """The constant equal to ``entries`` for this ``Reshape``, or ``None`` if not provable.

    The result is meant for ``allowzero=0``. A node with ``allowzero=1`` qualifies when no
    constant entry is 0 (then 0 never meant "copy", and a copied dim equals the symbol's value
    even when that value is 0).
    """
    if int(node.attr("allowzero", 0)) != 0 and any(e == 0 for e in entries):
        return None
    out: list[int] = []
    for i, e in enumerate(entries):
        if isinstance(e, int):
            out.append(e)
        elif isinstance(e, str) and in_shape is not None and i < len(in_shape) and in_shape[i] == e:
            out.append(0)
        else:
            # an entry neither constant nor a copy would need a new -1; a -1 fails (or infers
            # another size) on an empty tensor where the original's computed dim does not
            return None
    return out


def _is_identity(shape: list[int], in_shape: tuple[Entry, ...] | None) -> bool:
    """``Reshape(x, shape)`` (``allowzero=0``) returns ``x`` unchanged: same rank, and every
    entry copies (0) or equals the input's dim, but for at most one -1, which then must too."""
    if in_shape is None or len(in_shape) != len(shape) or shape.count(-1) > 1:
        return False
    return all(c in (0, -1) or (isinstance(d, int) and c == d) for c, d in zip(shape, in_shape))


def fold_reshape_shapes(model: Model, *, symbolic: bool = True) -> ShapeFolding:
    """Rewrite every provable ``Reshape`` target shape of ``model``'s main graph to a constant
    and remove the shape nodes left unused. Mutates ``model``; returns what it did.

    ``symbolic``: refine the IR's shapes with onnxruntime's symbolic shape inference
    (:func:`symbolic_shapes`)."""
    graph = model.graph
    # an initializer also listed as a graph input can be fed another value from IR version 4
    # on; before, onnxruntime refuses such a feed (:mod:`graph_autofusion.frontend.onnx_legacy`)
    listed = graph.meta.get("onnx_initializer_inputs", {}) if model.ir_version >= 4 else {}
    overridable = frozenset(listed)
    # one proof uses one source of symbols: onnxruntime's inference first, then the IR's
    evaluators = [ShapeEvaluator(None, overridable)]
    table = symbolic_shapes(model) if symbolic else {}
    if table:
        evaluators.insert(0, ShapeEvaluator(table, overridable))
    report = ShapeFolding()
    for node in list(graph.nodes):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        target = node.inputs[1]
        if const_value(target) is not None:
            continue  # already constant
        for ev in evaluators:
            got = ev(target)
            if got is None or got[1]:
                continue
            in_shape = ev.shape(node.inputs[0])
            shape = _constant_shape(node, got[0], in_shape)
            if shape is not None:
                break
        else:
            continue
        report.folded.append(
            FoldedReshape(node.name, [str(e) if e is not None else "?" for e in got[0]], shape)
        )
        if _is_identity(shape, in_shape) and not graph.is_output(node.outputs[0]):
            graph.replace_all_uses_with(node.outputs[0], node.inputs[0])
            graph.remove_node(node)
            report.identities_removed.append(node.name)
            continue
        if model.ir_version < 4:  # IR 3 lists every initializer as a graph input
            from graph_autofusion.frontend.onnx_legacy import initializer_inputs_as_constants

            initializer_inputs_as_constants(model)
        name = graph.fresh_name(f"{node.name or 'reshape'}_shape")
        const = graph.add_initializer(name, np.asarray(shape, dtype=np.int64))
        node.set_input(1, const)
        if "allowzero" in node.attrs:
            node.attrs["allowzero"] = 0
    dead = dead_shape_nodes(graph, set().union(*(ev.visited for ev in evaluators)))
    read = {x.name for n in dead for x in n.inputs if x is not None and x.is_const}
    for n in dead:
        report.nodes_removed_by_op[n.op_type] = report.nodes_removed_by_op.get(n.op_type, 0) + 1
    if dead:
        graph.remove_nodes(dead)
    if report.identities_removed:
        report.nodes_removed_by_op["Reshape"] = len(report.identities_removed)
    report.nodes_removed = len(dead) + len(report.identities_removed)
    inputs = {v.name for v in graph.inputs}
    for k in sorted(read - overridable):
        v = graph.initializers.get(k)
        if v is not None and not v.users and not graph.is_output(v) and k not in inputs:
            graph.remove_initializer(k)
    return report
