"""Mixed-precision islands (F17): unfused operators of a half-precision model that must compute
in float32 get float32 inputs, and their outputs are rounded back to the original type.

    n = keep_fp32_islands(model, ("BatchNormalization", "ReduceMean"))

For each node of a listed type with a float16 / bfloat16 input: a float16 constant input is
replaced by a float32 copy (converted once, here); any other half input goes through
``Cast(to=FLOAT)``; each half output is computed in float32 under a new name and a
``Cast`` back to its type takes the original name (readers and graph outputs see the same
names and types as before). Integer inputs (``axes``) are untouched. The policy that chooses the
operators is :mod:`graph_autofusion.planner.controls`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.node import float_dtype  # re-exported: the query lives with the IR

HALF = (DType.FLOAT16, DType.BFLOAT16)

__all__ = ["float_dtype", "fp32_island_nodes", "keep_fp32_islands"]


def fp32_island_nodes(model: Model, ops: Iterable[str], exclude: Iterable[str] = ()) -> list[Node]:
    """The nodes :func:`keep_fp32_islands` would change."""
    keep, skip = frozenset(ops), frozenset(exclude)
    return [
        n
        for n in model.graph.nodes
        if n.op_type in keep
        and n.domain in ("", "ai.onnx")
        and n.name not in skip
        and any(float_dtype(v) in HALF for v in n.inputs)
    ]


def keep_fp32_islands(model: Model, ops: Iterable[str], exclude: Iterable[str] = ()) -> int:
    """Make every unfused node of ``ops`` (not named in ``exclude``) compute in float32 (see
    the module docstring); returns how many nodes changed. ``model`` is modified in place."""
    g = model.graph
    nodes = fp32_island_nodes(model, ops, exclude)
    fp32_consts: dict[str, Value] = {}
    for node in nodes:
        half_in = next(float_dtype(u) for u in node.inputs if float_dtype(u) in HALF)
        for i, v in enumerate(node.inputs):
            if v is None or float_dtype(v) not in HALF:
                continue
            v.dtype = float_dtype(v)
            if v.const is not None and v.dtype == DType.FLOAT16:
                up = fp32_consts.get(v.name)
                if up is None:
                    up = g.add_initializer(
                        g.fresh_name(f"{v.name}_fp32"), np.asarray(v.const, dtype=np.float32)
                    )
                    fp32_consts[v.name] = up
                node.set_input(i, up)
                continue
            cast = g.make_node(
                "Cast",
                [v],
                {"to": int(DType.FLOAT)},
                name=g.fresh_name(f"{node.name or node.op_type}/to_fp32_{i}"),
                before=node,
            )
            out = cast.outputs[0]
            out.dtype, out.shape = DType.FLOAT, v.shape
            node.set_input(i, out)
        for out in node.outputs:
            if out.dtype is None and half_in in HALF and node.op_type != "Cast":
                out.dtype = half_in  # an untyped output of a half node: of the same type
            if out.dtype not in HALF:
                continue
            dtype, name = out.dtype, out.name
            g.rename_value(out, g.fresh_name(f"{name}_fp32"))
            back = g.make_node(
                "Cast",
                [out],
                {"to": int(dtype)},
                name=g.fresh_name(f"{node.name or node.op_type}/from_fp32"),
                output_names=[name],
            )
            res = back.outputs[0]
            res.dtype, res.shape = dtype, out.shape
            out.dtype = DType.FLOAT
            g.replace_all_uses_with(out, res)
    for name in fp32_consts:  # the half copies nothing reads any more
        v = g.initializers.get(name)
        if v is not None and not v.users and not g.is_output(v):
            g.remove_initializer(name)
    if nodes:
        g.topological_sort()
    return len(nodes)
