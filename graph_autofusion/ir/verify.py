"""IR verifier: checks the invariants every pass must keep. Tests run it after every pass."""

from __future__ import annotations

from graph_autofusion.errors import IRError
from graph_autofusion.ir.core import Graph, Model


def verify_problems(graph: Graph) -> list[str]:
    """Return every invariant violation in ``graph`` as a sentence (empty list: valid)."""
    problems: list[str] = []
    defined: set[int] = set()
    names: dict[str, str] = {}

    def claim(value, where: str) -> None:
        if value.name in names:
            problems.append(
                f"value name %{value.name} defined twice ({names[value.name]}, {where})"
            )
        names[value.name] = where
        defined.add(id(value))

    for v in graph.inputs:
        claim(v, "graph input")
        if v.producer is not None:
            problems.append(f"graph input %{v.name} has producer {v.producer.name!r}")
    for k, v in graph.initializers.items():
        if k != v.name:
            problems.append(f"initializer key {k!r} differs from its value name %{v.name}")
        if v.const is None:
            problems.append(f"initializer %{v.name} holds no data")
        claim(v, "initializer")

    seen_nodes = set()
    for node in graph.nodes:
        if node.graph is not graph:
            problems.append(f"node {node.name!r} does not point back to graph {graph.name!r}")
        if node.name in seen_nodes:
            problems.append(f"node name {node.name!r} used twice")
        seen_nodes.add(node.name)
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if id(v) not in defined:
                problems.append(
                    f"node {node.name!r} input {i} reads %{v.name} before it is defined "
                    f"(not topologically sorted, or a dangling value)"
                )
            if (node, i) not in v._users:
                problems.append(f"%{v.name} does not list node {node.name!r} input {i} as a user")
        for j, v in enumerate(node.captures):
            if id(v) not in defined:
                problems.append(f"node {node.name!r} captures %{v.name} before it is defined")
            if (node, -1 - j) not in v._users:
                problems.append(f"%{v.name} does not list node {node.name!r} capture {j}")
        for i, out in enumerate(node.outputs):
            if out.producer is not node or out.index != i:
                problems.append(f"output %{out.name} of node {node.name!r} has a wrong producer")
            claim(out, f"output of {node.name!r}")

    node_set = set(graph.nodes)
    for v in graph.values():
        for user, idx in v._users:
            if user not in node_set:
                problems.append(f"%{v.name} lists user {user.name!r} that is not in the graph")
                continue
            if idx >= 0:
                if idx >= len(user._inputs) or user._inputs[idx] is not v:
                    problems.append(f"%{v.name} lists {user.name!r} input {idx} which is not it")
            elif -1 - idx >= len(user._captures) or user._captures[-1 - idx] is not v:
                problems.append(f"%{v.name} lists a capture of {user.name!r} which is not it")
    for v in graph.outputs:
        if id(v) not in defined:
            problems.append(f"graph output %{v.name} is not defined in the graph")
    return problems


def verify(target: Graph | Model) -> None:
    """Raise :class:`IRError` listing every invariant violation, if any."""
    graph = target.graph if isinstance(target, Model) else target
    problems = verify_problems(graph)
    if problems:
        head = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise IRError(f"graph {graph.name!r} failed verification:\n  {head}{more}")
