"""Safe mode's standalone models of compressed contractions (the per-layer check and timing of
:mod:`graph_autofusion.pipeline.weights`): each layer on its real activation, compressed
(``MatMulNBits`` or ``GemvQ`` as the packed weight's kernel says, ``GemvF16`` for fp16) and
fp32 (``MatMul``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graph_autofusion.codegen.ort_customop_c import DOMAIN
from graph_autofusion.codegen.ort_gemv_f16 import OP as F16_OP
from graph_autofusion.codegen.ort_gemv_q import OP as Q_OP
from graph_autofusion.codegen.weights import Packed, nbits_attrs


def probe_model(
    items: list[tuple[str, np.ndarray, Packed, np.ndarray | None]], accuracy_level: int
) -> Any:
    """An ONNX model computing each ``(name, activation, packed, bias)`` with its own
    ``MatMulNBits`` (``GemvF16`` for an fp16 one): inputs ``a<i>`` (the activation's shape),
    outputs ``y<i>`` (safe mode's per-layer check runs every compressed layer of a model in
    one session)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, ins, outs = [], [], [], []
    for i, (_name, act, p, bias) in enumerate(items):
        ins.append(helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, list(act.shape)))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        if p.op in (F16_OP, Q_OP):
            arrays = [p.b] if p.bits == 16 else list(p.panels())
            names = [f"{t}{i}" for t in "bsz"[: len(arrays)]]
            inits += [numpy_helper.from_array(v, n) for v, n in zip(arrays, names)]
            out = f"y{i}" if bias is None else f"m{i}"
            nodes.append(helper.make_node(p.op, [f"a{i}", *names], [out], domain=DOMAIN))
            if bias is not None:
                inits.append(numpy_helper.from_array(bias, f"c{i}"))
                nodes.append(helper.make_node("Add", [out, f"c{i}"], [f"y{i}"]))
            continue
        names = [f"a{i}", f"b{i}", f"s{i}"]
        inits += [numpy_helper.from_array(p.b, f"b{i}"), numpy_helper.from_array(p.scales, f"s{i}")]
        names.append(f"z{i}" if p.zero_points is not None else "")
        if p.zero_points is not None:
            inits.append(numpy_helper.from_array(p.zero_points, f"z{i}"))
        if bias is not None:
            names += ["", f"c{i}"]
            inits.append(numpy_helper.from_array(bias, f"c{i}"))
        while names[-1] == "":
            names.pop()
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                names,
                [f"y{i}"],
                domain="com.microsoft",
                **nbits_attrs(p, accuracy_level),
            )
        )
    graph = helper.make_graph(nodes, "weights_probe", ins, outs, inits)
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid(DOMAIN, 1),
        ],
    )


def reference_model(items: list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]]) -> Any:
    """The fp32 twin of :func:`probe_model`: ``y<i> = a<i> @ W (+ bias)`` with ``MatMul``
    (safe mode's per-layer timing of the uncompressed side)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, ins, outs = [], [], [], []
    for i, (_name, act, w, bias) in enumerate(items):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w, np.float32), f"w{i}"))
        out = f"y{i}" if bias is None else f"m{i}"
        nodes.append(helper.make_node("MatMul", [f"a{i}", f"w{i}"], [out]))
        if bias is not None:
            inits.append(numpy_helper.from_array(bias, f"c{i}"))
            nodes.append(helper.make_node("Add", [out, f"c{i}"], [f"y{i}"]))
        ins.append(helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, list(act.shape)))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "weights_reference", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
