"""One-node GELU sessions: onnxruntime's ``BiasGelu`` / ``Gelu`` / ``FastGelu`` or our
``GeluErf`` / ``GeluTanh`` (:mod:`graph_autofusion.codegen.ort_gelu`) over one input, with the
custom-operator library registered for ours (``tests/test_ort_gelu.py``,
``benchmarks/gelu_kernels.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from graph_autofusion.codegen.ort_customop import DOMAIN, build_library
from graph_autofusion.runtime.ort_session import ort_session


def gelu_session(
    op: str, domain: str, shape: Sequence[Any], bias: np.ndarray | None, threads: int = 2
) -> Any:
    """An onnxruntime session (ALL) of ``y = op(x[, bias])`` with ``x`` of ``shape`` (ints or
    dim names) and ``bias`` an initializer; ours (``domain`` ai.graph_autofusion) with the
    library of the hand-written operators."""
    inputs = ["x", "b"] if bias is not None else ["x"]
    inits = [] if bias is None else [helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias)]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    )
    return ort_session(
        model.SerializeToString(),
        "all",
        threads=threads,
        custom_ops_library=build_library([], gemv=True).path if domain == DOMAIN else None,
        find_library=False,
    )
