"""Keep onnxruntime's own session fusions from undoing what the plan measured slower.

onnxruntime's ``SkipLayerNormFusion`` (EXTENDED and ALL levels) turns every ``Add ->
LayerNormalization`` whose ``Add`` reads two 3-D tensors of the same shape (equal numbers or the
same named symbols) and feeds only the norm into ``com.microsoft.SkipLayerNormalization``. In
onnxruntime 1.32 that CPU kernel is a scalar loop with a division per element: 2.5-5x slower
than the ``Add`` and the (vectorized) ``LayerNormalization`` it replaces (215 us against 40 us
on 128 x 768; ``cost.measure_rates`` calibrates both). The plan declines our own
``skip_layernorm`` fusion when the profile prices it so, but the session would make it anyway,
on the fused model as on the original.

:func:`guard_skip_layernorms` keeps those pairs apart where the profile says the fused kernel is
slower: the norm reads the sum through a ``Reshape`` to 2-D (``[-1, H]``; the session's fusion
needs the norm's input to come from the ``Add`` itself) and its result is reshaped back. Both
reshapes alias their input in onnxruntime (no copy); the values are the same, which the
pipeline's end-to-end check confirms. A model whose profile has no rates for these operators is
left as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graph_autofusion.cost.rates import element_rate_ns
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.ir.dtypes import DType


def _same_3d_pair(a: Value | None, b: Value | None) -> bool:
    """onnxruntime's condition on the ``Add``: both inputs 3-D with the same dims (known
    numbers, or the same named symbols)."""
    if a is None or b is None or a.shape is None or b.shape is None:
        return False
    if len(a.shape) != 3 or len(b.shape) != 3:
        return False
    return all(x is not None and x == y for x, y in zip(a.shape, b.shape))


def session_would_fuse(ln: Node, model: Model) -> bool:
    """``ln`` (a ``LayerNormalization``) and the ``Add`` feeding it are what onnxruntime's
    ``SkipLayerNormFusion`` rewrites into a ``SkipLayerNormalization``."""
    if ln.op_type != "LayerNormalization" or ln.domain not in ("", "ai.onnx"):
        return False
    add = ln.inputs[0].producer if ln.inputs and ln.inputs[0] is not None else None
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return False
    out = add.outputs[0]
    if len(out.users) != 1 or model.graph.is_output(out):
        return False
    return _same_3d_pair(add.inputs[0], add.inputs[1]) and out.dtype == DType.FLOAT


def fused_kernel_slower(profile: Any, elements: int | None) -> bool:
    """The profile's calibrated ``SkipLayerNormalization`` costs more per element than ``Add``
    and ``LayerNormalization`` together, at ``elements`` (None: the largest calibrated size);
    False when it has no rate for one of them."""
    rates = [element_rate_ns(profile, op, elements) for op in ("SkipLayerNormalization", "Add")]
    rates.append(element_rate_ns(profile, "LayerNormalization", elements))
    if any(r is None for r in rates):
        return False
    return rates[0] > rates[1] + rates[2]


def _axis_is_last(ln: Node) -> bool:
    axis = int(ln.attrs.get("axis", -1))
    return axis in (-1, 2)


def guard_skip_layernorms(model: Model, profile: Any) -> int:
    """Route each ``Add -> LayerNormalization`` onnxruntime would fuse into a slower kernel
    through a 2-D ``Reshape`` (module docstring); returns how many. Only norms over the last
    axis whose mean and inverse-deviation outputs are unread."""
    graph = model.graph
    done = 0
    for ln in graph.nodes:
        if not session_would_fuse(ln, model) or not _axis_is_last(ln):
            continue
        if any(o.users or graph.is_output(o) for o in ln.outputs[1:]):
            continue
        x, y = ln.inputs[0], ln.outputs[0]
        shape = x.producer.inputs[0].shape  # the Add's operands: 3-D, the sum's dims
        d0, d1, hidden = shape
        static = all(isinstance(d, int) for d in shape)
        if not isinstance(hidden, int):
            continue
        if not fused_kernel_slower(profile, d0 * d1 * hidden if static else None):
            continue
        rows = d0 * d1 if static else None
        flat = graph.add_initializer(graph.fresh_name("guard_2d"), np.array([-1, hidden], np.int64))
        if static:
            back = graph.add_initializer(graph.fresh_name("guard_3d"), np.array(shape, np.int64))
        else:  # the sum's own dims, read at run time
            back = graph.make_node("Shape", [x], name="ort_guard/Shape", before=ln).outputs[0]
            back.dtype, back.shape = DType.INT64, (3,)
        to_2d = graph.make_node("Reshape", [x, flat], name="ort_guard/Reshape", before=ln)
        to_2d.outputs[0].dtype, to_2d.outputs[0].shape = x.dtype, (rows, hidden)
        ln.set_input(0, to_2d.outputs[0])
        to_3d = graph.make_node("Reshape", [y, back], name="ort_guard/Reshape")
        res = to_3d.outputs[0]
        res.dtype, res.shape = y.dtype, y.shape if y.shape is not None else shape
        y.shape = (rows, hidden)
        name = y.name
        graph.replace_all_uses_with(y, res)
        if graph.is_output(res):  # the model's output keeps its name
            graph.rename_value(y, graph.fresh_name(f"{name}_2d"))
            graph.rename_value(res, name)
        done += 1
    if done and not graph.is_sorted:
        graph.topological_sort()
    return done
