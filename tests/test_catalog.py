"""Operator catalog: every operator's NumPy reference against onnxruntime, kinds, FLOP formulas."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import numpy_helper

from graph_autofusion.catalog import FusionKind, all_schemas, get_schema, node_bytes, node_flops
from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.ir.core import Graph, Model, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.runtime.interpreter import run_model
from graph_autofusion.runtime.ort_session import ort_session
from tests.catalog_cases import CASES, MS, Case

# Operators tested elsewhere (control flow needs subgraphs: tests/test_interpreter.py).
NOT_IN_TABLE = {("", "If"), ("", "Loop"), ("", "Scan")}


def _onnx_model(case: Case) -> onnx.ModelProto:
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(case.inputs)]
    inputs = [
        oh.make_tensor_value_info(n, DType.from_numpy(a.dtype).value, a.shape)
        for n, a in zip(names, case.inputs)
        if a is not None
    ]
    attrs = {
        k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
        for k, v in case.attrs.items()
    }
    outs = [f"out{i}" for i in range(case.n_out)]
    node = oh.make_node(case.op, names, outs, domain=case.domain, **attrs)
    graph = oh.make_graph(
        [node], "g", inputs, [oh.make_value_info(o, onnx.TypeProto()) for o in outs]
    )
    opsets = [oh.make_opsetid("", case.opset if not case.domain else 20)]
    if case.domain:
        opsets.append(oh.make_opsetid(case.domain, 1))
    model = oh.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _run_ort(case: Case) -> list[np.ndarray]:
    sess = ort_session(_onnx_model(case), "disable")
    feeds = {f"in{i}": a for i, a in enumerate(case.inputs) if a is not None}
    return sess.run(None, feeds)


def _run_ours(case: Case) -> list[np.ndarray]:
    g = Graph("single")
    ins: list[Value | None] = []
    feeds = {}
    for i, a in enumerate(case.inputs):
        if a is None:
            ins.append(None)
            continue
        v = g.add_input(Value(f"in{i}", DType.from_numpy(a.dtype), a.shape))
        ins.append(v)
        feeds[v.name] = np.asarray(a)
    node = g.make_node(
        case.op,
        ins,
        dict(case.attrs),
        domain=case.domain,
        num_outputs=case.n_out,
        output_names=[f"out{i}" for i in range(case.n_out)],
    )
    g.set_outputs(list(node.outputs))
    opsets = {"": case.opset if not case.domain else 20}
    if case.domain:
        opsets[case.domain] = 1
    res = run_model(Model(g, opsets), feeds)
    return [res[f"out{i}"] for i in range(case.n_out)]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_matches_onnxruntime(case: Case) -> None:
    expected = _run_ort(case)
    got = _run_ours(case)
    for i, (e, o) in enumerate(zip(expected, got)):
        o = np.asarray(o)
        assert o.dtype == e.dtype, f"output {i}: dtype {o.dtype}, onnxruntime {e.dtype}"
        assert o.shape == e.shape, f"output {i}: shape {o.shape}, onnxruntime {e.shape}"
        if e.dtype.kind in "fc":
            ef, of = e.astype(np.float64), o.astype(np.float64)
            assert np.array_equal(np.isnan(ef), np.isnan(of)), f"output {i}: NaN positions differ"
            finite = ~np.isnan(ef)
            diff = np.abs(ef[finite] - of[finite]) if finite.any() else np.zeros(1)
            diff = np.where(np.isinf(ef[finite]) & (ef[finite] == of[finite]), 0, diff)
            assert float(np.max(diff, initial=0.0)) <= case.tol, (
                f"output {i}: max diff {diff.max()}"
            )
        else:
            np.testing.assert_array_equal(o, e, err_msg=f"output {i}")


def test_every_registered_operator_has_an_onnxruntime_case() -> None:
    tested = {(c.domain, c.op) for c in CASES}
    missing = [
        (s.domain, s.op_type)
        for s in all_schemas()
        if (s.domain, s.op_type) not in tested and (s.domain, s.op_type) not in NOT_IN_TABLE
    ]
    assert not missing, f"operators without a test case: {missing}"


def test_catalog_size_and_kinds() -> None:
    schemas = all_schemas()
    assert len(schemas) >= 100
    for s in schemas:
        assert isinstance(s.kind, FusionKind), s.op_type
        assert s.known
    assert get_schema("Add").kind == FusionKind.BROADCAST and get_schema("Add").commutative
    assert get_schema("Relu").kind == FusionKind.ELEMENTWISE
    assert get_schema("Transpose").kind == FusionKind.INJECTIVE
    assert get_schema("ReduceMean").kind == FusionKind.REDUCTION
    assert get_schema("LayerNormalization").kind == FusionKind.NORMALIZATION
    assert get_schema("Conv").kind == FusionKind.CONTRACTION
    assert get_schema("Gather").kind == FusionKind.DATA_MOVEMENT
    assert get_schema("LSTM").kind == FusionKind.OPAQUE
    assert get_schema("FusedMatMul", MS).kind == FusionKind.CONTRACTION
    assert get_schema("MatMul", "ai.onnx") is get_schema("MatMul")


def test_unknown_operator_is_opaque_and_not_executable() -> None:
    s = get_schema("FrobnicateTensor", "custom.domain")
    assert s.kind == FusionKind.OPAQUE and not s.known and s.reference is None
    g = Graph()
    x = g.add_input(Value("x", DType.FLOAT, (2,)))
    n = g.make_node("FrobnicateTensor", [x], domain="custom.domain", name="frob0")
    g.set_outputs([n.outputs[0]])
    with pytest.raises(UnsupportedOperatorError, match=r"frob0.*custom\.domain::FrobnicateTensor"):
        run_model(Model(g, {"": 20, "custom.domain": 1}), {"x": np.ones(2, np.float32)})


def _node(op: str, shapes: list[tuple], out_shape: tuple, attrs: dict | None = None, **kw):
    g = Graph()
    ins = [g.add_input(Value(f"i{k}", DType.FLOAT, s)) for k, s in enumerate(shapes)]
    n = g.make_node(op, ins, attrs or {}, **kw)
    n.outputs[0].dtype = DType.FLOAT
    n.outputs[0].shape = out_shape
    return n


def test_flop_formulas_exact() -> None:
    assert (
        node_flops(_node("MatMul", [(2, 3, 4, 5), (5, 6)], (2, 3, 4, 6))) == 2 * 2 * 3 * 4 * 6 * 5
    )
    gemm = _node("Gemm", [(8, 4), (6, 8), (6,)], (4, 6), {"transA": 1, "transB": 1})
    assert node_flops(gemm) == 2 * 4 * 6 * 8 + 4 * 6
    assert node_flops(_node("Gemm", [(4, 8), (8, 6)], (4, 6))) == 2 * 4 * 6 * 8
    conv = _node("Conv", [(1, 64, 56, 56), (128, 32, 3, 3)], (1, 128, 28, 28), {"group": 2})
    assert node_flops(conv) == 2 * (128 * 28 * 28) * 32 * 9
    assert node_flops(_node("Add", [(4, 5), (5,)], (4, 5))) == 20
    assert node_flops(_node("Sum", [(4, 5), (5,), (4, 5)], (4, 5))) == 40
    assert node_flops(_node("ReduceSum", [(4, 5)], (4, 1))) == 20
    assert node_flops(_node("Transpose", [(4, 5)], (5, 4))) == 0
    assert node_flops(_node("Gather", [(4, 5)], (5, 4))) == 0
    assert node_flops(_node("FrobnicateTensor", [(4, 5)], (5, 4), domain="x")) == 0


def test_flops_and_bytes_unknown_for_symbolic_dims() -> None:
    n = _node("MatMul", [("batch", 5), (5, 6)], ("batch", 6))
    assert node_flops(n) is None
    assert node_bytes(n) is None
    relu = _node("Relu", [(3, 4)], (3, 4))
    assert node_bytes(relu) == (48, 48)
    add = _node("Add", [(4, 5), (5,)], (4, 5))
    assert node_bytes(add) == (100, 80)
