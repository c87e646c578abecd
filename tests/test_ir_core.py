"""Unit tests of the graph IR: use-def, mutation, order, convexity, text form, verifier."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.errors import CycleError, IRError, TextParseError
from graph_autofusion.ir import DType, Graph, Node, Value, is_convex
from graph_autofusion.ir.text import parse_model, print_model
from graph_autofusion.ir.verify import verify, verify_problems

DIAMOND = """
model opset {"": 20}
graph g(%x: f32[B,4]) -> (%y) {
  init %w: f32[4,4] = randn(0)
  init %two: f32[] = [2.0]
  %a: f32[B,4] = MatMul(%x, %w) @mm
  %b = Relu(%a) @relu
  %c = Mul(%a, %two) @mul
  %y = Add(%b, %c) @add
}
"""


def nodes_by_name(graph: Graph) -> dict[str, Node]:
    return {n.name: n for n in graph.nodes}


def test_parse_builds_use_def_and_types():
    model = parse_model(DIAMOND)
    g = model.graph
    verify(g)
    n = nodes_by_name(g)
    a = n["mm"].outputs[0]
    assert a.type_str() == "f32[B,4]"
    assert [u.name for u in a.user_nodes] == ["relu", "mul"]
    assert n["add"].predecessors() == [n["relu"], n["mul"]]
    assert g.initializers["w"].const.shape == (4, 4)
    assert g.initializers["w"].dtype == DType.FLOAT
    assert g.op_histogram() == {"Add": 1, "MatMul": 1, "Mul": 1, "Relu": 1}


def test_print_parse_round_trip_is_stable():
    model = parse_model(DIAMOND)
    text = print_model(model)
    again = print_model(parse_model(text, allow_elided=True))
    assert text == again
    assert "%a: f32[B,4] = MatMul(%x, %w) @mm" in text
    assert 'model opset {"": 20}' in text


def test_attributes_round_trip_through_text():
    src = """
    graph g(%x: f32[2,3]) -> (%y) {
      %y = Foo<axis=-1, eps=1e-05, mode="tanh", perm=[1, 0], scales=[0.5, 2.0], t=tensor(i64[2]: [3, 4])>(%x, _) @foo
    }
    """
    g = parse_model(src).graph
    node = g.nodes[0]
    assert node.attrs["axis"] == -1 and isinstance(node.attrs["axis"], int)
    assert node.attrs["eps"] == pytest.approx(1e-5)
    assert node.attrs["mode"] == "tanh"
    assert node.attrs["perm"] == [1, 0]
    assert node.attrs["scales"] == [0.5, 2.0]
    np.testing.assert_array_equal(node.attrs["t"], np.array([3, 4], dtype=np.int64))
    assert node.inputs[1] is None
    assert print_model(parse_model(print_model(parse_model(src)))) == print_model(parse_model(src))


@pytest.mark.parametrize(
    "text, message",
    [
        ("graph g(%x: f32[2]) -> (%y) {\n  %y = Relu(%z)\n}", "line 2: %z is used before"),
        ("graph g(%x: f32[2]) -> (%y) {\n  %y = Relu(%x)\n", "missing closing"),
        ("graph g(%x: q99[2]) -> (%y) {\n}", "unknown dtype"),
        (
            "graph g(%x: f32[2]) -> (%y) {\n  init %w: f32[2] = [1.0]\n}",
            "line 2: initializer has 1",
        ),
        ("graph g(%x: f32[2]) -> (%y) {\n  %y = Relu(%x\n}", "line 2: cannot parse"),
        ("graph g(%x: f32[2]) -> (%q) {\n  %y = Relu(%x)\n}", "outputs ['q'] are never"),
        ("graph g(%x: f32[2]) -> (%y) {\n  %y = Relu(%x)\n  %y = Relu(%x)\n}", "line 3: duplicate"),
    ],
)
def test_parse_errors_name_the_line(text, message):
    with pytest.raises(TextParseError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_model(text)


def test_replace_all_uses_and_remove_keep_use_def():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    a = n["mm"].outputs[0]
    # Replace Relu's output by a new node's output, then remove Relu.
    new = g.make_node("Sigmoid", [a], name="sig", before=n["add"])
    g.replace_all_uses_with(n["relu"].outputs[0], new.outputs[0])
    g.remove_node(n["relu"])
    verify(g)
    assert n["add"].inputs[0] is new.outputs[0]
    assert [u.name for u in a.user_nodes] == ["mul", "sig"]
    assert "relu" not in [x.name for x in g.nodes]


def test_remove_node_refuses_while_used():
    g = parse_model(DIAMOND).graph
    with pytest.raises(IRError, match="still used by"):
        g.remove_node(nodes_by_name(g)["mm"])
    with pytest.raises(IRError, match="graph output"):
        g.remove_node(nodes_by_name(g)["add"])
    verify(g)


def test_iteration_is_safe_during_mutation():
    g = parse_model(DIAMOND).graph
    for node in g.nodes:
        if node.op_type == "Relu":
            g.replace_all_uses_with(node.outputs[0], node.inputs[0])
            g.remove_node(node)
    verify(g)
    assert len(g) == 3


def test_replace_graph_output():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    tail = g.make_node("Neg", [n["add"].outputs[0]], name="neg")
    g.replace_all_uses_with(n["add"].outputs[0], tail.outputs[0])
    # the Neg node itself now reads its own output: restore its input to the Add
    tail.set_input(0, n["add"].outputs[0])
    verify(g)
    assert g.outputs == [tail.outputs[0]]


def test_convexity():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    assert is_convex([n["mm"], n["relu"], n["mul"], n["add"]])
    # mm -> mul -> add and mm -> relu -> add: {mm, add} leaves via relu and comes back.
    assert not is_convex([n["mm"], n["add"]])
    assert is_convex([n["mm"], n["relu"]])
    assert not is_convex([n["mm"], n["relu"], n["add"]])
    assert is_convex([n["relu"], n["mul"], n["add"]])
    assert g.is_convex([n["mm"]])


def test_topological_sort_and_cycle_error():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    # Move the Add to the front, then sort back.
    g._nodes = dict.fromkeys([n["add"], n["mm"], n["relu"], n["mul"]])
    assert verify_problems(g)
    g.topological_sort()
    verify(g)
    assert [x.name for x in g.nodes] == ["mm", "relu", "mul", "add"]
    # Create a cycle: mm reads add's output.
    n["mm"].set_input(0, n["add"].outputs[0])
    with pytest.raises(CycleError, match="cycle"):
        g.topological_sort()


def test_verifier_catches_corruption():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    # Break a back-link behind the API's back.
    a = n["mm"].outputs[0]
    a._users.pop((n["relu"], 0))
    problems = verify_problems(g)
    assert any("does not list node 'relu'" in p for p in problems)
    with pytest.raises(IRError, match="failed verification"):
        verify(g)


def test_value_helpers():
    v = Value("x", DType.FLOAT16, (2, "S", 3))
    assert v.rank == 3 and not v.is_static and v.numel() is None
    w = Value("w", const=np.ones((2, 3), np.float32))
    assert w.is_const and w.numel() == 6 and w.nbytes() == 24 and w.type_str() == "f32[2,3]"


def test_remove_unused_drops_dead_nodes_and_initializers():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    g.set_outputs([n["relu"].outputs[0]])
    removed = g.remove_unused()
    verify(g)
    assert removed == 3  # mul, add, and the initializer %two
    assert [x.name for x in g.nodes] == ["mm", "relu"]
    assert list(g.initializers) == ["w"]


def test_set_captures_twice_same_value_keeps_use_def():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    a = n["mm"].outputs[0]
    n["add"].set_captures([a, a])
    n["add"].set_captures([])
    assert all(idx >= 0 for _, idx in a.users)
    g.topological_sort()
    verify(g)


def test_failed_add_node_leaves_graph_unchanged():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    a = n["mm"].outputs[0]
    users_before = a.users
    with pytest.raises(IRError, match="duplicate value name %a"):
        g.make_node("Split", [a], output_names=["s0", "a"])
    with pytest.raises(IRError, match="not in the graph"):
        g.make_node("Neg", [a], before=Node("Relu"))
    assert a.users == users_before and not g.has_value_name("s0")
    verify(g)


def test_remove_nodes_is_atomic():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    g.set_outputs([n["mm"].outputs[0]])
    stray = Node("Relu")
    with pytest.raises(IRError, match="not in graph"):
        g.remove_nodes([n["relu"], stray, n["mul"]])
    verify(g)
    assert len(g) == 4


def test_convexity_is_right_after_edits_that_break_order():
    text = """
    graph g(%a: f32[4]) -> (%d) {
      %b = Relu(%a) @n1
      %d = Add(%b, %a) @n3
    }
    """
    g = parse_model(text).graph
    n = nodes_by_name(g)
    m = g.make_node("Abs", [n["n1"].outputs[0]], name="m")  # appended after n3
    n["n3"].set_input(1, m.outputs[0])
    assert not g.is_sorted
    assert not is_convex([n["n1"], n["n3"]])  # n1 -> m -> n3 leaves the set and comes back
    g.topological_sort()
    assert g.is_sorted and not is_convex([n["n1"], n["n3"]])


def test_insert_after_with_replace_all_uses():
    g = parse_model(DIAMOND).graph
    n = nodes_by_name(g)
    a = n["mm"].outputs[0]
    neg = g.make_node("Neg", [a], name="neg", before=n["relu"])
    g.replace_all_uses_with(a, neg.outputs[0])
    assert neg.inputs[0] is a  # no self-loop
    assert n["relu"].inputs[0] is neg.outputs[0] and n["mul"].inputs[0] is neg.outputs[0]
    verify(g)


def test_text_strings_with_quotes_hash_and_elided_tensors():
    src = (
        "graph g(%x: f32[2]) -> (%y) {  # header comment\n"
        '  %y = Foo<s="a \\"q\\" # not a comment, x">(%x) @foo  # trailing comment\n'
        "}"
    )
    node = parse_model(src).graph.nodes[0]
    assert node.attrs["s"] == 'a "q" # not a comment, x'
    big = "graph g(%x: f32[2]) -> (%y) {\n  %y = Foo<t=tensor(f32[20]: elided)>(%x)\n}"
    with pytest.raises(TextParseError, match="line 2: tensor attribute data is elided"):
        parse_model(big)
    assert parse_model(big, allow_elided=True).graph.nodes[0].attrs["t"].shape == (20,)
