"""IR graphs as the JSON the HTML report draws (F14): nodes, edges, repeated blocks, groups.

    view = graph_view(model.graph, {"node_gelu": 0, "node_linear_4": 0})
    view["nodes"]    # [[name, op, block, group, kind], ...]  (block/group: index or -1)
    view["edges"]    # [[producer index, consumer index], ...], one per connected pair
    view["blocks"]   # ["model.encoder.layer.0", ...]

**Blocks** are the repeated parts of a model (transformer layers, ResNet stages), found from
where each node comes from, in this order:

1. ``node.meta["source"]``: the module path the PyTorch importer records
   (``model.layers.0.self_attn``);
2. the ``pkg.torch.onnx.name_scopes`` metadata torch's dynamo exporter writes on each node
   (``['', 'model', 'model.encoder', 'model.encoder.layer.1', ...]``);
3. a hierarchical node name (``/encoder/layer.0/attention/self/MatMul``: TorchScript
   exports, most converters).

A node's block is its path up to the first numbered component (``model.encoder.layer.1``,
``encoder.layer.0``, ``h.3``). Nodes outside any numbered component stay at the top level;
when more than :data:`TOP_LEVEL_LIMIT` do, their second-level modules (``model.embeddings``)
of :data:`MIN_MODULE_NODES` nodes or more become blocks as well.
A graph with no such names and more than :data:`SECTION_THRESHOLD` nodes is cut into
sections of :data:`SECTION_SIZE` nodes in graph order instead, so that it still collapses.

Edges from a node read by many others (a mask, a shape value) into other blocks are listed
apart (``hidden_edges``), not drawn. Graph inputs and outputs are nodes of kind 1 and 2 (constants and initializers are left out:
they are operands, not steps).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from typing import Any

from graph_autofusion.ir.core import Graph, Node

__all__ = [
    "NODE_OP",
    "NODE_INPUT",
    "NODE_OUTPUT",
    "SECTION_SIZE",
    "SECTION_THRESHOLD",
    "block_of",
    "graph_view",
    "node_scope",
]

NODE_OP, NODE_INPUT, NODE_OUTPUT = 0, 1, 2
#: A graph without block names and more nodes than this is cut into sections.
SECTION_THRESHOLD = 150
SECTION_SIZE = 40
#: Edges of a value read by more than this many nodes are not drawn between blocks.
FANOUT_LIMIT = 8
#: With more top-level nodes than this, modules of MIN_MODULE_NODES or more become blocks too.
TOP_LEVEL_LIMIT = 60
MIN_MODULE_NODES = 4

_SPLIT = re.compile(r"[./\[\]'\"]+")
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def _metadata_scopes(node: Node) -> str | None:
    props = node.meta.get("onnx_metadata_props")
    if not props:
        return None
    for key, value in props:
        if key != _SCOPES_KEY:
            continue
        try:
            scopes = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
        # the last entry names the operation itself; the one before is its module path
        paths = [s for s in scopes[:-1] if isinstance(s, str) and s]
        return paths[-1] if paths else None
    return None


def node_scope(node: Node) -> list[str]:
    """The module path a node comes from, as components (``['model', 'encoder', 'layer',
    '1', 'attention']``); empty when nothing says."""
    source = node.meta.get("source")
    text = source if isinstance(source, str) and source else _metadata_scopes(node)
    if text is None:
        name = node.name or ""
        if "/" not in name.strip("/"):
            return []
        text = name.strip("/").rsplit("/", 1)[0]  # the last part names the operation
    return [t for t in _SPLIT.split(text) if t]


def block_of(node: Node) -> str | None:
    """The repeated block a node belongs to (its path up to the first numbered component),
    or ``None``."""
    parts = node_scope(node)
    for i in range(1, len(parts)):
        if parts[i].isdigit():
            return ".".join(parts[: i + 1])
    return None


def _module_of(node: Node) -> str | None:
    """The second-level module of a node outside any block (``model.embeddings``)."""
    parts = node_scope(node)
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def _blocks(nodes: list[Node], inherited: Mapping[str, str]) -> tuple[list[str], list[int]]:
    """Block labels and each node's block index (-1: top level)."""
    labels: list[str] = []
    index: dict[str, int] = {}
    out: list[int] = []
    for n in nodes:
        key = inherited.get(n.name) or block_of(n)
        if key is None:
            out.append(-1)
            continue
        if key not in index:
            index[key] = len(labels)
            labels.append(key)
        out.append(index[key])
    loose = [i for i, b in enumerate(out) if b < 0]
    if labels and len(loose) > TOP_LEVEL_LIMIT:  # many nodes outside the blocks: by module
        by_module: dict[str, list[int]] = {}
        for i in loose:
            key = _module_of(nodes[i])
            if key is not None and key not in index:
                by_module.setdefault(key, []).append(i)
        for key, members in by_module.items():
            if len(members) >= MIN_MODULE_NODES:
                index[key] = len(labels)
                labels.append(key)
                for i in members:
                    out[i] = index[key]
    if labels or len(nodes) <= SECTION_THRESHOLD:
        return labels, out
    count = (len(nodes) + SECTION_SIZE - 1) // SECTION_SIZE
    labels = [
        f"nodes {k * SECTION_SIZE + 1}-{min(len(nodes), (k + 1) * SECTION_SIZE)}"
        for k in range(count)
    ]
    return labels, [i // SECTION_SIZE for i in range(len(nodes))]


def graph_view(
    graph: Graph,
    groups: Mapping[str, int] | None = None,
    *,
    inherited_blocks: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The drawing data of ``graph``.

    Args:
        graph: The graph to draw (not modified).
        groups: Node name -> index of the fused group it belongs to (outlined in the page).
        inherited_blocks: Node name -> block key for nodes that carry no origin themselves
            (a fused operator takes the block of the nodes it replaced).

    Returns:
        ``{"nodes": [[name, op, block, group, kind]], "edges": [[src, dst]], "hidden_edges":
        [[src, dst]], "blocks": [label], "ops": number of operator nodes}``. ``hidden_edges``
        leave a node read by more than :data:`FANOUT_LIMIT` nodes (the attention mask, shape
        values) for another block: drawn, they would cross every block between (and make the
        layout many times slower); the page lists them in the node's details.
    """
    groups = groups or {}
    nodes = list(graph.nodes)
    labels, block_idx = _blocks(nodes, inherited_blocks or {})
    rows: list[list[Any]] = []
    producer: dict[int, int] = {}  # id(value) -> row of its producer
    for n, b in zip(nodes, block_idx):
        op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        row = len(rows)
        rows.append([n.name, op, b, int(groups.get(n.name, -1)), NODE_OP])
        for v in n.outputs:
            producer[id(v)] = row
    inits = set(graph.initializers)
    for v in graph.inputs:
        if v.name not in inits and v.const is None:
            producer[id(v)] = len(rows)
            rows.append([v.name, "input", -1, -1, NODE_INPUT])
    edges: dict[tuple[int, int], None] = {}
    for row, n in enumerate(nodes):
        for v in _read(n):
            src = producer.get(id(v))
            if src is not None and src != row:
                edges[(src, row)] = None
    for v in graph.outputs:
        src = producer.get(id(v))
        out = len(rows)
        rows.append([v.name, "output", -1, -1, NODE_OUTPUT])
        if src is not None:
            edges[(src, out)] = None
    fanout: dict[int, int] = {}
    for src, _ in edges:
        fanout[src] = fanout.get(src, 0) + 1
    drawn, hidden = [], []
    for src, dst in edges:  # a hub feeding every block would drag long edges through them all
        far = rows[src][2] != rows[dst][2]
        (hidden if far and fanout[src] > FANOUT_LIMIT else drawn).append([src, dst])
    return {
        "nodes": rows,
        "edges": drawn,
        "hidden_edges": hidden,
        "blocks": labels,
        "ops": len(nodes),
    }


def _read(n: Node) -> Iterable[Any]:
    yield from (v for v in n.inputs if v is not None)
    yield from n.captures
