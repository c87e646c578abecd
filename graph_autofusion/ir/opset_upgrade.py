"""A checked upgrade of a model's ONNX opset, for lowerings to operators of a newer opset.

Opset 23 adds the standard ``Attention``, ``RotaryEmbedding`` and ``RMSNormalization``
operators. A model exported at opset 18-22 can use them only after its default-domain import is
raised to 23, and that is only sound when every other node means the same at 23. This module
decides that node by node from the ONNX schemas: an operator whose schema did not change
between the model's opset and the target, or whose newer versions keep every attribute (name,
type, default), input and output and only widen the element types, is unchanged in meaning.
The few operators whose later versions add an attribute whose default keeps the old behaviour
are listed in :data:`COMPATIBLE`. Anything else (``GroupNormalization`` 21 changed what its
scale means, ``GridSample`` 20 renamed its modes, ``DFT`` 20 moved an attribute to an input,
and every opset < 18 form of the reductions and ``Split``) refuses the upgrade, with the
operator named, and the lowering that needed it stays unfused.

The upgrade itself only rewrites the import (no node changes) and raises the IR version to the
one onnx pairs with the new opset, so it cannot change what the model computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from graph_autofusion.ir.core import Model, RawAttribute

#: Opset of the standard Attention, RotaryEmbedding and RMSNormalization operators.
ATTENTION_OPSET = 23

#: Lowest opset this module upgrades from (below it, reductions and Split take axes as
#: attributes, which the newer schemas moved to inputs).
MIN_SOURCE_OPSET = 18

#: Operators whose later versions only add attributes that default to the old behaviour:
#: ``Cast``/``CastLike`` 19+ (``saturate``, for float8 targets only; 24 adds ``round_mode``,
#: same default), ``AveragePool`` 19 (``dilations``, default 1).
COMPATIBLE = frozenset({"Cast", "CastLike", "AveragePool"})

#: IR version onnx pairs with each opset this module upgrades to.
_IR_FOR_OPSET = {23: 11, 24: 11, 25: 12}


def _signature(schema: Any) -> tuple:
    attrs = tuple(
        sorted(
            (a.name, int(a.type), bool(a.required), a.default_value.SerializeToString())
            for a in schema.attributes.values()
        )
    )
    ins = tuple((i.name, int(i.option)) for i in schema.inputs)
    outs = tuple((o.name, int(o.option)) for o in schema.outputs)
    return attrs, ins, outs


def _op_problem(op: str, source: int, target: int) -> str | None:
    import onnx.defs

    try:
        old = onnx.defs.get_schema(op, source, "")
    except Exception:
        return f"{op} is not an ONNX operator at opset {source}"
    try:
        new = onnx.defs.get_schema(op, target, "")
    except Exception:  # pragma: no cover - schemas are never removed
        return f"{op} has no opset-{target} schema"
    if old.since_version == new.since_version or op in COMPATIBLE:
        return None
    if old.deprecated or new.deprecated:
        return f"{op} is deprecated at opset {target}"
    if _signature(old) != _signature(new):
        return (
            f"{op} changed between opset {old.since_version} and {new.since_version} "
            f"(attributes or inputs differ)"
        )
    return None


def _subgraph_ops(proto: Any) -> Iterator[tuple[str, str]]:
    """``(domain, op_type)`` of every node in the graphs a raw attribute holds, recursively."""
    graphs = []
    if hasattr(proto, "g") and proto.HasField("g"):
        graphs.append(proto.g)
    graphs.extend(getattr(proto, "graphs", ()))
    if hasattr(proto, "node"):  # a GraphProto itself
        graphs.append(proto)
    for g in graphs:
        for n in g.node:
            yield n.domain, n.op_type
            for a in n.attribute:
                yield from _subgraph_ops(a)


def _default_domain_ops(model: Model) -> set[str]:
    ops: set[str] = set()
    for node in model.graph.nodes:
        if node.domain in ("", "ai.onnx"):
            ops.add(node.op_type)
        for value in node.attrs.values():
            if isinstance(value, RawAttribute):
                ops.update(op for d, op in _subgraph_ops(value.proto) if d in ("", "ai.onnx"))
    for fn in model.functions:
        ops.update(n.op_type for n in fn.node if n.domain in ("", "ai.onnx"))
    return ops


def upgrade_problem(model: Model, target: int = ATTENTION_OPSET) -> str | None:
    """Why ``model`` cannot be raised to opset ``target`` unchanged, or ``None`` if it can."""
    source = int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0)) or 0)
    if source >= target:
        return None
    if source < MIN_SOURCE_OPSET:
        return f"the model's opset {source} is below {MIN_SOURCE_OPSET}; not upgraded"
    if target not in _IR_FOR_OPSET:
        return f"no known IR version for opset {target}"
    made_here = {"Attention", "RotaryEmbedding", "RMSNormalization"}
    for op in sorted(_default_domain_ops(model) - made_here):
        problem = _op_problem(op, source, target)
        if problem is not None:
            return f"opset {source} -> {target}: {problem}"
    return None


def upgrade_opset(model: Model, target: int = ATTENTION_OPSET) -> None:
    """Raise ``model``'s default-domain opset to ``target`` (after :func:`upgrade_problem`).

    Raises:
        ValueError: the upgrade would change the meaning of a node.
    """
    problem = upgrade_problem(model, target)
    if problem is not None:
        raise ValueError(problem)
    key = "" if "" in model.opset_imports or "ai.onnx" not in model.opset_imports else "ai.onnx"
    if int(model.opset_imports.get(key, 0)) >= target:
        return
    model.opset_imports[key] = target
    model.ir_version = max(model.ir_version, _IR_FOR_OPSET[target])
    model.meta["opset_upgraded"] = target
