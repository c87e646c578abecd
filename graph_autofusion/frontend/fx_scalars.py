"""Floats Dynamo made symbolic, specialized when ``torch.export`` cannot trace them.

Dynamo passes a module's float attribute that differs between two compiled instances (the
attention ``scaling`` of two decoders with different head sizes, compiled in one process) as
a 0-d tensor it reads with ``item()``. The import keeps such a float an input of the ONNX graph
when it can (:func:`~graph_autofusion.frontend.aten_ops_tensor._item`), but an operator whose
argument must be a number (``scaled_dot_product_attention(scale=...)``) makes the re-export
guard on the unbacked float and fail. Then the float is this call's value: each ``item()`` of
such an input is replaced by the number in a copy of the graph (the input itself unused), and
the caller checks the value on every call (``FxImport.scalars``; another value compiles
again, as other weights do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

_ITEM_OPS = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}


def _is_item(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "item") or (
        node.op == "call_function" and node.target in _ITEM_OPS
    )


def item_scalars(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[int, float]:
    """Placeholder index -> value of each 0-d floating-point input the graph only reads with
    ``item()``."""
    found: dict[int, float] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (ph, x) in enumerate(zip(placeholders, example_inputs)):
        if (
            isinstance(x, torch.Tensor)
            and not isinstance(x, torch.nn.Parameter)
            and x.dim() == 0
            and x.dtype.is_floating_point
            and ph.users
            and all(_is_item(u) for u in ph.users)
        ):
            found[i] = float(x.item())
    return found


def inline_scalars(gm: torch.fx.GraphModule, scalars: dict[int, float]) -> torch.fx.GraphModule:
    """A copy of ``gm`` in which each ``item()`` of the placeholders ``scalars`` names is its
    number (``gm`` itself is unchanged: it stays the eager fallback)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    graph._codegen = gm.graph._codegen
    graph.output(graph.graph_copy(gm.graph, env))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, value in scalars.items():
        for item in [u for u in env[placeholders[i]].users if _is_item(u)]:

            def number(n: torch.fx.Node, it: torch.fx.Node = item, v: float = value) -> Any:
                return v if n is it else n

            for user in list(item.users):
                user.args = torch.fx.node.map_arg(user.args, number)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, number)
            graph.erase_node(item)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)
