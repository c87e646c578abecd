"""Float16 value-range analysis for safe mode: rerun a subgraph in float32 and find the values
float16 would have to hold beyond its range (65504)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from graph_autofusion.catalog.precision import FP32_ACCUMULATING  # re-exported
from graph_autofusion.ir.core import Model
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.verify.subgraph import flat_ops, run_session

FP16_MAX = 65504.0


def to_fp32(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` computing in float32 wherever it used float16."""
    m = copy.deepcopy(proto)

    def fix_nodes(nodes: Any) -> None:
        for n in nodes:
            for a in n.attribute:
                if n.op_type in ("Cast", "CastLike") and a.name == "to" and a.i == 10:
                    a.i = TensorProto.FLOAT
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16:
                    arr = numpy_helper.to_array(a.t).astype(np.float32)
                    a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))
                if a.type == onnx.AttributeProto.GRAPH:
                    fix_graph(a.g)

    def fix_graph(g: Any) -> None:
        for vi in (*g.input, *g.output, *g.value_info):
            tt = vi.type.tensor_type
            if tt.elem_type == TensorProto.FLOAT16:
                tt.elem_type = TensorProto.FLOAT
        for i, t in enumerate(g.initializer):
            if t.data_type == TensorProto.FLOAT16:
                arr = numpy_helper.to_array(t).astype(np.float32)
                g.initializer[i].CopyFrom(numpy_helper.from_array(arr, t.name))
        fix_nodes(g.node)

    fix_graph(m.graph)
    for fn in m.functions:
        fix_nodes(fn.node)
    return m


def fp16_analysis(
    original: Model,
    fused: Model,
    record: Any,
    orig_proto: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    internal: list[str],
    weights: Mapping[str, np.ndarray] | None = None,
    own: Mapping[str, np.ndarray] | None = None,
) -> tuple[float | None, str]:
    """Largest fp32-reference magnitude among the values float16 would have to hold, and a
    failure sentence (empty when in range). ``(None, "")`` when no float16 is involved.

    ``own``: the original subgraph's values from its own run (float16 where it computes in
    float16). Where the fused operator holds every intermediate in float16, a value the
    original itself saturates wherever the float32 rerun exceeds the limit (Hugging Face's
    fp16 masks: ``score + finfo.min`` rounds to -65504 or -inf) is the model's own behaviour,
    not an overflow the fusion adds. The largest magnitude is reported either way."""
    half = DType.FLOAT16
    orig_values = {v.name: v for n in record.original_nodes for v in (*n.all_inputs(), *n.outputs)}
    fp16_orig = {name for name, v in orig_values.items() if v.dtype == half}
    fp16_orig |= {k for k in feeds if feeds[k].dtype == np.float16}
    boundary = [v for n in record.new_nodes for v in (*n.all_inputs(), *n.outputs)]
    fp16_fused = any(v.dtype == half for v in boundary) or any(
        feeds[k].dtype == np.float16 for k in feeds
    )
    if not fp16_orig and not fp16_fused:
        return None, ""
    upcasts = any(
        (op == "Cast" and attrs.get("to") in (TensorProto.FLOAT, TensorProto.DOUBLE))
        or op in FP32_ACCUMULATING
        for _, op, attrs in flat_ops(fused, record.new_nodes)
    )
    feeds32 = {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in feeds.items()}
    # ``weights``: the float32 constants ``orig_proto`` declares without data (read in place)
    ref = run_session(ort_session(to_fp32(orig_proto), in_place=weights or None), feeds32)
    if fp16_fused and not upcasts:  # the fused op holds every intermediate in float16
        checked = [*record.outputs, *internal]
        where = "the fused operator computes in float16"
        alike = own or {}
    else:
        checked = [k for k in (*record.outputs, *internal) if k in fp16_orig]
        where = "float16 value"
        # an upcast somewhere in the fused op says nothing of which values it holds in
        # float16: one the original computes in float32 is not checked here, so a value the
        # original saturates is no evidence either
        alike = {}
    biggest, worst, reported = 0.0, "", 0.0
    for name in checked:
        arr = ref.get(name)
        if arr is None or not np.issubdtype(arr.dtype, np.floating) or arr.size == 0:
            continue
        finite = np.abs(arr[np.isfinite(arr)]).astype(np.float64)
        m = float(finite.max()) if finite.size else 0.0
        if not np.isfinite(arr).all():
            m = float("inf")
        reported = max(reported, m)
        if m > FP16_MAX and _saturated_alike(arr, alike.get(name)):
            continue
        if m > biggest:
            biggest, worst = m, name
    if biggest > FP16_MAX:
        return reported, (
            f"{where}: %{worst} reaches {biggest:.4g} in float32, above the float16 limit "
            f"{FP16_MAX:g}"
        )
    return reported, ""


def _saturated_alike(ref32: np.ndarray, own: np.ndarray | None) -> bool:
    """Whether the original's own value ``own`` holds exactly the float16 limit or an infinity
    of the same sign at every position where the float32 rerun ``ref32`` exceeds the limit
    (a float16 value rounded there, or a float32 one cast from it; a float32 value beyond the
    limit but finite is not)."""
    if own is None or not np.issubdtype(own.dtype, np.floating) or own.shape != ref32.shape:
        return False
    over = ~(np.abs(ref32) <= FP16_MAX)  # nan included
    if np.isnan(ref32[over]).any():
        return False
    o = own[over].astype(np.float64)
    held = (np.abs(o) == FP16_MAX) | np.isinf(o)
    return bool(np.all(held & (np.sign(o) == np.sign(ref32[over]))))
