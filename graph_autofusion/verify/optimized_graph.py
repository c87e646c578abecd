"""Whether onnxruntime's optimizer makes the same graph of two models.

    same = same_model_after_optimization(original, fused)       # IR models, protos, paths
    same = same_optimized_graph("a.opt.onnx", "b.opt.onnx")     # optimized models on disk

Safe mode times each fusion against its unfused operators at onnxruntime's ``ORT_ENABLE_ALL``.
On a CNN, the fusions the rules make (a Conv and its activation, or its residual Add + Relu,
into one ``FusedConv``; BatchNormalization folded into its Conv) are the ones onnxruntime makes
itself at that level, and then the NCHWc ``Conv`` of both: when the whole fused model
optimizes into the very graph onnxruntime makes of the original, no fusion can change what
runs, the per-fusion times differ only by noise (ResNet-50: 29 of its 35 s fuse, and random
``slower`` rollbacks), and :func:`graph_autofusion.pipeline.fuse_model` checks their numerics
only. (Timed one by one, a residual ``FusedConv`` even looks slower: alone, its residual is a
graph input in NCHW, which keeps onnxruntime from making it an NCHWc ``Conv`` as it does in
the model.)

Two optimized graphs are the same when their nodes, in order, have the same domain, operator,
attributes and inputs, where an input is a graph input (by name), a constant (by dtype, shape
and bytes, whatever its name) or the n-th output of an earlier node; and the same graph
outputs. Anything else (another node order included) is not the same.
"""

from __future__ import annotations

import hashlib
from typing import Any

from graph_autofusion.runtime.ort_session import ort_session


def canonical_graph(path: str) -> tuple[Any, ...] | None:
    """The name-free form of the ONNX graph at ``path`` (``None`` when it cannot be read)."""
    import onnx
    from onnx import numpy_helper

    try:
        proto = onnx.load(path)
    except Exception:  # noqa: BLE001 - not comparable: the fusion is timed
        return None
    g = proto.graph
    canon: dict[str, Any] = {}
    for i in g.input:
        canon[i.name] = ("input", i.name)
    for t in g.initializer:
        digest = hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()
        canon[t.name] = ("const", t.data_type, tuple(t.dims), digest)
    nodes = []
    for k, n in enumerate(g.node):
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in n.attribute):  # fmt: skip
            return None  # subgraphs: not compared
        attrs = tuple(
            sorted((a.name, a.SerializeToString(deterministic=True)) for a in n.attribute)
        )
        ins = tuple(canon.get(x, ("unknown", x)) if x else ("none",) for x in n.input)
        nodes.append((n.domain, n.op_type, attrs, ins))
        for j, o in enumerate(n.output):
            if o:
                canon[o] = ("node", k, j)
    outs = tuple((o.name, canon.get(o.name)) for o in g.output)
    return tuple(nodes), outs


def same_optimized_graph(path_a: str, path_b: str) -> bool:
    """True when the optimized models at ``path_a`` and ``path_b`` are the same graph (see
    the module docstring)."""
    a = canonical_graph(path_a)
    return a is not None and a == canonical_graph(path_b)


def same_model_after_optimization(a: Any, b: Any, level: str = "all", threads: int = 2) -> bool:
    """True when onnxruntime's optimizer at ``level`` makes the same graph of the models
    ``a`` and ``b`` (IR models, protos or paths): then no fusion of ``b`` over ``a`` changes
    what onnxruntime runs at that level, and timing the fusions one by one only measures
    noise. A model onnxruntime cannot open is not the same."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gaf-optimized-") as tmp:
        paths = [f"{tmp}/a.onnx", f"{tmp}/b.onnx"]
        try:
            for model, path in zip((a, b), paths):
                ort_session(model, level, threads, optimized_model_path=path)
        except Exception:  # noqa: BLE001 - not comparable: the fusions are timed
            return False
        return same_optimized_graph(*paths)
