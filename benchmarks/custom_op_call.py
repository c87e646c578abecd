"""Per-call cost: one generated custom op vs the built-in Sigmoid+Mul it replaces (1 thread)."""

import time

import numpy as np
from onnx import TensorProto as T
from onnx import helper

from graph_autofusion.codegen.lower import lower_group
from graph_autofusion.codegen.ort_customop import DOMAIN, build_library, op_name
from graph_autofusion.cost.shapes import bind_shapes
from graph_autofusion.ir.text import parse_model
from graph_autofusion.pipeline.cpu import finalize_kernel
from graph_autofusion.runtime.ort_session import ort_session

m = parse_model(
    'model opset {"": 17}\ngraph g(%a: f32[N], %b: f32[N]) -> (%y) {\n  %s: f32[N] = Sigmoid(%a)\n  %y: f32[N] = Mul(%s, %b)\n}\n'
)
k = finalize_kernel(
    lower_group(
        list(m.graph.nodes),
        list(m.graph.outputs),
        bind_shapes(m, input_shapes={"a": (16,), "b": (16,)}),
    ).kernel,
    [(16,), (16,)],
)
lib = build_library([k]).path


def model(n, custom):
    nodes, cur = [], "a"
    for i in range(n):
        if custom:
            nodes.append(helper.make_node(op_name(k), [cur, "b"], [f"y{i}"], domain=DOMAIN))
        else:
            nodes += [
                helper.make_node("Sigmoid", [cur], [f"s{i}"]),
                helper.make_node("Mul", [f"s{i}", "b"], [f"y{i}"]),
            ]
        cur = f"y{i}"
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(x, T.FLOAT, ["N"]) for x in "ab"],
        [helper.make_tensor_value_info(cur, T.FLOAT, ["N"])],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    ).SerializeToString()


def t(n, custom, size):
    # onnxruntime's default optimizations and spinning workers, as before
    s = ort_session(
        model(n, custom), "all", 1, spinning=True, custom_ops_library=lib if custom else None
    )
    f = {
        "a": np.random.randn(size).astype(np.float32),
        "b": np.random.randn(size).astype(np.float32),
    }
    for _ in range(200):
        s.run(None, f)
    reps = 2000 if size < 1000 else 30
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            s.run(None, f)
        best.append((time.perf_counter() - t0) / reps * 1e6)
    return min(best)


for size in (16, 1 << 20):
    for n in (1, 8):
        print(
            f"{size:>8} elems, chain of {n}: custom op {t(n, True, size):9.1f} us   built-in Sigmoid+Mul {t(n, False, size):9.1f} us"
        )
