"""Operator pairs (F4a): every producer -> consumer edge once, with a verdict by fusion kind."""

from __future__ import annotations

import pytest

from graph_autofusion.ir.core import Graph, RawAttribute, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.pairs import PairReason, operator_pairs

R = PairReason

# (producer line, consumer line, fusible, code); the producer reads %x, the consumer reads %p.
CASES = {
    "elementwise-elementwise": ("Add(%x, %x)", "Mul(%p, %x)", True, R.LOOP_FUSION),
    "layout-elementwise": ("Transpose<perm=[1, 0]>(%x)", "Relu(%p)", True, R.LOOP_FUSION),
    "elementwise-layout": ("Relu(%x)", "Transpose<perm=[1, 0]>(%p)", True, R.LOOP_FUSION),
    "matmul-epilogue": ("MatMul(%x, %x)", "Relu(%p)", True, R.CONTRACTION_EPILOGUE),
    "reduction-prologue": ("Exp(%x)", "ReduceSum<keepdims=1>(%p, %ax)", True, R.REDUCTION_PROLOGUE),
    "softmax-prologue": ("Div(%x, %x)", "Softmax<axis=-1>(%p)", True, R.REDUCTION_PROLOGUE),
    "reduction-epilogue": (
        "ReduceMean<keepdims=1>(%x, %ax)",
        "Sqrt(%p)",
        True,
        R.REDUCTION_EPILOGUE,
    ),
    "two-contractions": ("MatMul(%x, %x)", "MatMul(%p, %x)", False, R.TWO_CONTRACTIONS),
    "contraction-prologue": ("Relu(%x)", "MatMul(%p, %x)", False, R.CONTRACTION_PROLOGUE),
    "matmul-layout": (
        "MatMul(%x, %x)",
        "Transpose<perm=[1, 0]>(%p)",
        False,
        R.NOT_ELEMENTWISE_EPILOGUE,
    ),
    "matmul-softmax": ("MatMul(%x, %x)", "Softmax<axis=-1>(%p)", False, R.NOT_ELEMENTWISE_EPILOGUE),
    "reduce-reduce": (
        "ReduceSum<keepdims=1>(%x, %ax)",
        "ReduceMax<keepdims=1>(%p, %ax)",
        False,
        R.REDUCE_AFTER_REDUCE,
    ),
    "data-movement": ("Concat<axis=0>(%x, %x)", "Relu(%p)", False, R.DATA_MOVEMENT),
    "opaque": ("CumSum(%x, %zero)", "Relu(%p)", False, R.OPAQUE_OP),
    "unknown": ("custom::Foo(%x)", "Relu(%p)", False, R.UNKNOWN_OP),
    "unknown-consumer": ("Relu(%x)", "custom::Foo(%p)", False, R.UNKNOWN_OP),
}

GRAPH = """
model opset {{"": 20, "custom": 1}}
graph g(%x: f32[4,4]) -> (%y) {{
  init %ax: i64[1] = [1]
  init %zero: i64[] = [0]
  %p = {producer} @producer
  %y = {consumer} @consumer
}}
"""


@pytest.mark.parametrize("case", sorted(CASES))
def test_verdict_by_kind(case):
    producer, consumer, fusible, code = CASES[case]
    graph = parse_model(GRAPH.format(producer=producer, consumer=consumer)).graph
    (v,) = operator_pairs(graph)
    assert (v.producer.name, v.consumer.name) == ("producer", "consumer")
    assert (v.fusible, v.code) == (fusible, code)
    assert "'producer'" in v.message and "'consumer'" in v.message
    assert not v.multi_consumer
    assert [x.name for x in v.values] == ["p"]


def test_each_edge_once_in_graph_order_and_multi_consumer_flag():
    graph = parse_model(
        """
        graph g(%x: f32[4]) -> (%y, %a) {
          %a = Relu(%x) @a
          %b = Mul(%a, %a) @b
          %c = Neg(%a) @c
          %y = Add(%b, %c) @y
        }
        """
    ).graph
    pairs = [(v.producer.name, v.consumer.name, v.multi_consumer) for v in operator_pairs(graph)]
    # b reads a twice: one pair; a also feeds c and is a graph output: multi_consumer.
    assert pairs == [("a", "b", True), ("a", "c", True), ("b", "y", False), ("c", "y", False)]
    assert all(v.fusible for v in operator_pairs(graph))
    assert "materialized" in operator_pairs(graph)[0].message


def test_node_with_subgraph_is_never_fused():
    g = Graph("g")
    x = g.add_input(Value("x", DType.FLOAT, (4,)))
    cond = g.add_input(Value("cond", DType.BOOL, ()))
    a = g.make_node("Relu", [x], name="a").outputs[0]
    branch = g.make_node(
        "If",
        [cond],
        {"then_branch": RawAttribute(None, ("a",)), "else_branch": RawAttribute(None, ("a",))},
        name="branch",
    )
    branch.set_captures([a])
    y = g.make_node("Exp", [branch.outputs[0]], name="y").outputs[0]
    g.set_outputs([y])
    verdicts = {(v.producer.name, v.consumer.name): v for v in operator_pairs(g)}
    assert set(verdicts) == {("a", "branch"), ("branch", "y")}
    for v in verdicts.values():
        assert (v.fusible, v.code) == (False, R.HAS_SUBGRAPH)


def test_every_pair_of_a_zoo_model_is_decided():
    from graph_autofusion.testing.synthetic import synthetic_transformer

    graph = synthetic_transformer(60).graph
    pairs = operator_pairs(graph)
    edges = {(p, c) for p in graph.nodes for c in p.successors()}
    assert len(pairs) == len(edges)
    assert {(v.producer, v.consumer) for v in pairs} == edges
    codes = {v.code for v in pairs}
    assert {R.LOOP_FUSION, R.CONTRACTION_EPILOGUE, R.TWO_CONTRACTIONS} <= codes
