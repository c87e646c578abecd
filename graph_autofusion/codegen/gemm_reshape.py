"""Flattened ``Gemm`` back to a batched ``MatMul``: GPT-2's ``Conv1D`` as exported.

Both exporters write ``x @ W + b`` on a ``[batch, seq, K]`` activation as

    Reshape(x, [-1, K]) -> Gemm(., W, b) -> Reshape(., <shape program: [batch, seq, N]>)

where the final shape is computed at run time from ``Shape`` nodes (a dozen nodes per layer
and projection, which onnxruntime cannot fold with dynamic batch and sequence). When the final
``Reshape`` provably restores ``x``'s leading dims (its inferred output shape is ``x``'s
leading dims followed by ``N``, every dim known or the same named symbol; or its shape program
reads ``x``'s own dims, or dims with ``x``'s symbols, then ``N``), the chain is
``MatMul(x, W) + b``: :func:`flatten_gemms` rewrites it so (``W`` transposed once for
``transB``), and the shape program goes as dead code. GPT-2's KV-cache decoder loses ~400 of its
~1,000 nodes. The pipeline checks the result end to end with the attention layout pass.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.codegen.onnxruntime import drop_dead_initializers, prune_dead_feeders
from graph_autofusion.ir.core import Model, Node, Value, producer_of
from graph_autofusion.patterns.matcher import const_value


def _known(d) -> bool:
    return d is not None and not (isinstance(d, str) and d.startswith("unk__"))


def _same(a, b) -> bool:
    return (
        a is not None
        and b is not None
        and len(a) == len(b)
        and all(_known(x) and x == y for x, y in zip(a, b))
    )


def _pieces(target: Value) -> list[tuple[Value, int] | int] | None:
    """The dims a shape program builds, each ``(tensor, axis)`` (a dim read with ``Shape``) or
    an int: ``Concat`` of ``Shape(t, start, end)``, ``Unsqueeze(Gather(Shape(t), i))`` and
    constants."""
    data = const_value(target)
    if data is not None:
        return [int(v) for v in data.reshape(-1)]
    cat = target.producer
    if cat is None or cat.op_type != "Concat" or cat.attrs.get("axis", 0) != 0:
        return None
    dims: list[tuple[Value, int] | int] = []
    for part in cat.inputs:
        data = const_value(part) if part is not None else None
        node = part.producer if part is not None else None
        if data is not None:
            dims += [int(v) for v in data.reshape(-1)]
        elif node is not None and node.op_type == "Shape" and node.inputs[0].rank is not None:
            src, rank = node.inputs[0], node.inputs[0].rank
            start, end = node.attrs.get("start", 0), node.attrs.get("end", rank)
            start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
            dims += [(src, i) for i in range(start, min(end, rank))]
        elif node is not None and node.op_type == "Unsqueeze":
            gather = node.inputs[0].producer
            index = (
                const_value(gather.inputs[1])
                if gather is not None and gather.op_type == "Gather"
                else None
            )
            shape = gather.inputs[0].producer if index is not None else None
            if (
                shape is None
                or shape.op_type != "Shape"
                or index.size != 1
                or shape.attrs.get("start", 0)
            ):
                return None
            dims.append((shape.inputs[0], int(index.reshape(-1)[0])))
        else:
            return None
    return dims


def _restores(target: Value, x: Value, n: int) -> bool:
    """The shape program ``target`` is ``x.shape[:-1] + [n]``."""
    dims = _pieces(target)
    if dims is None or len(dims) != len(x.shape) or dims[-1] != n:
        return False
    for i, d in enumerate(dims[:-1]):
        if isinstance(d, int):
            if d != x.shape[i] or d <= 0:
                return False
            continue
        src, axis = d
        if src is x and axis == i:
            continue
        if (
            src.shape is None
            or axis >= len(src.shape)
            or not _same((src.shape[axis],), (x.shape[i],))
        ):
            return False
    return True


def _flatten_one(model: Model, gemm: Node) -> bool:
    graph = model.graph
    if gemm.attrs.get("transA", 0) or gemm.attrs.get("alpha", 1.0) != 1.0:
        return False
    if gemm.attrs.get("beta", 1.0) != 1.0 or len(gemm.inputs) < 2:
        return False
    a, w = gemm.inputs[0], gemm.inputs[1]
    bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    inner = producer_of(a, "Reshape")
    if inner is None or len(a.users) != 1:
        return False
    x = inner.inputs[0]
    wdata = const_value(w)
    if wdata is None or wdata.ndim != 2 or x.shape is None or len(x.shape) < 3:
        return False
    bias_data = const_value(bias) if bias is not None else None
    if bias is not None and (bias_data is None or bias_data.ndim > 1):
        return False
    y = gemm.outputs[0]
    if len(y.users) != 1 or graph.is_output(y):
        return False
    outer = y.users[0][0]
    if outer.op_type != "Reshape" or outer.inputs[0] is not y:
        return False
    k = wdata.shape[1] if gemm.attrs.get("transB", 0) else wdata.shape[0]
    n = wdata.shape[0] if gemm.attrs.get("transB", 0) else wdata.shape[1]
    if x.shape[-1] != k:
        return False
    out = outer.outputs[0]
    if not (_same(out.shape, (*x.shape[:-1], n)) or _restores(outer.inputs[1], x, n)):
        return False
    weight = w
    if gemm.attrs.get("transB", 0):
        weight = graph.add_initializer(
            graph.fresh_name(f"{w.name}_t"), np.ascontiguousarray(wdata.T)
        )
    mm = graph.make_node("MatMul", [x, weight], name="gemm_reshape/MatMul", before=outer)
    res = mm.outputs[0]
    res.dtype, res.shape = out.dtype, out.shape
    if bias is not None:
        add = graph.make_node("Add", [res, bias], name="gemm_reshape/Add", before=outer)
        res = add.outputs[0]
        res.dtype, res.shape = out.dtype, out.shape
    name = out.name
    graph.replace_all_uses_with(out, res)
    feeders = [v for node in (inner, gemm, outer) for v in node.inputs if v is not None]
    graph.remove_nodes([inner, gemm, outer])
    prune_dead_feeders(model, feeders)
    if not graph.has_value_name(name):
        graph.rename_value(res, name)
    return True


def flatten_gemms(model: Model) -> int:
    """Rewrite every ``Reshape -> Gemm -> Reshape`` that restores the activation's leading dims
    as ``MatMul (+ Add)``; returns how many."""
    done = 0
    for gemm in [n for n in model.graph.nodes if n.op_type == "Gemm" and n.domain == ""]:
        if gemm.graph is model.graph and _flatten_one(model, gemm):
            done += 1
    if done:
        drop_dead_initializers(model)
        if not model.graph.is_sorted:
            model.graph.topological_sort()
    return done
