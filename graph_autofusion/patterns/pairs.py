"""Adjacent operator pairs (F4a): can a producer fuse with the consumer that reads it?

:func:`operator_pairs` lists every producer -> consumer edge of a graph once, in graph order, with
a verdict decided by the two operators' fusion kinds (the catalog's
:class:`~graph_autofusion.catalog.registry.FusionKind`), after TVM's op patterns::

    for v in operator_pairs(model.graph):
        print(v.producer.name, "->", v.consumer.name, v.fusible, v.code, v.message)

The verdict table (producer row, consumer column; ``PW`` = elementwise or broadcast, ``INJ`` =
injective layout op, ``RED`` = reduction or normalization, ``CON`` = contraction)::

                 PW                    INJ                       RED                  CON
    PW    loop-fusion            loop-fusion              reduction-prologue   contraction-prologue
    INJ   loop-fusion            loop-fusion              reduction-prologue   contraction-prologue
    RED   reduction-epilogue     reduction-epilogue       reduce-after-reduce  contraction-prologue
    CON   contraction-epilogue   not-elementwise-epilogue not-elementwise-ep.  two-contractions

Data-movement operators (Gather, Concat, Split, Pad, Shape, Constant ...) never fuse
(``data-movement``): they change the iteration space in ways a loop kernel does not model, and
upstream AutoFuse gates them chip by chip. Opaque operators (control flow, RNN cells, TopK) and
unknown operators never fuse, nor does any node carrying a subgraph. A producer whose value is
also read elsewhere (or is a graph output) is still fusible, with ``multi_consumer`` set: the
value must stay materialized in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from graph_autofusion import reasons
from graph_autofusion.catalog.registry import FusionKind, schema_of
from graph_autofusion.ir.core import Graph, Node, RawAttribute, Value, topological_order


class PairReason:
    """Reason codes of pair verdicts and cluster merges (documented in docs/clustering.md)."""

    # fusible pairs
    LOOP_FUSION = reasons.LOOP_FUSION
    REDUCTION_PROLOGUE = reasons.REDUCTION_PROLOGUE
    REDUCTION_EPILOGUE = reasons.REDUCTION_EPILOGUE
    CONTRACTION_EPILOGUE = reasons.CONTRACTION_EPILOGUE
    # refused pairs
    HAS_SUBGRAPH = reasons.HAS_SUBGRAPH
    UNKNOWN_OP = reasons.UNKNOWN_OP
    OPAQUE_OP = reasons.OPAQUE_OP
    DATA_MOVEMENT = reasons.DATA_MOVEMENT
    TWO_CONTRACTIONS = reasons.TWO_CONTRACTIONS
    CONTRACTION_PROLOGUE = reasons.CONTRACTION_PROLOGUE
    NOT_ELEMENTWISE_EPILOGUE = reasons.NOT_ELEMENTWISE_EPILOGUE
    REDUCE_AFTER_REDUCE = reasons.REDUCE_AFTER_REDUCE
    # refused merges of groups (clustering only)
    NOT_CONVEX = reasons.NOT_CONVEX
    MAX_NODES = reasons.MAX_NODES
    MAX_INPUTS = reasons.MAX_INPUTS
    REDUCTION_MISMATCH = reasons.REDUCTION_MISMATCH
    LOOP_SHAPE = reasons.LOOP_SHAPE


#: Codes of fusible pairs (the clusterer's phases: see ``clustering.PHASES``).
FUSIBLE_CODES = (
    PairReason.LOOP_FUSION,
    PairReason.REDUCTION_PROLOGUE,
    PairReason.REDUCTION_EPILOGUE,
    PairReason.CONTRACTION_EPILOGUE,
)

POINTWISE = frozenset({FusionKind.ELEMENTWISE, FusionKind.BROADCAST})
LOOP_KINDS = POINTWISE | {FusionKind.INJECTIVE}
REDUCING = frozenset({FusionKind.REDUCTION, FusionKind.NORMALIZATION})


@dataclass(frozen=True)
class PairVerdict:
    """Whether ``producer`` may fuse with ``consumer``, which reads ``values`` from it.

    Attributes:
        producer: The node computing the values.
        consumer: The node reading them.
        fusible: True when the two may live in one fused kernel.
        code: Reason code (a :class:`PairReason` constant); for a fusible pair it names the kind
            of fusion (``loop-fusion``, ``contraction-epilogue`` ...).
        message: One sentence naming both nodes.
        values: The producer outputs the consumer reads.
        multi_consumer: A value in ``values`` is read by another node too or is a graph output,
            so it must stay materialized even when the pair fuses.
    """

    producer: Node
    consumer: Node
    fusible: bool
    code: str
    message: str
    values: tuple[Value, ...] = ()
    multi_consumer: bool = False


def has_subgraph(node: Node) -> bool:
    """True when ``node`` carries a subgraph (If/Loop/Scan bodies, captured outer values)."""
    return bool(node.captures) or any(isinstance(a, RawAttribute) for a in node.attrs.values())


def node_class(node: Node) -> str:
    """The node's class for fusion: ``PW``, ``INJ``, ``RED``, ``CON``, or a refusal code.

    Refusal codes are :attr:`PairReason.HAS_SUBGRAPH`, ``UNKNOWN_OP``, ``OPAQUE_OP`` and
    ``DATA_MOVEMENT``.
    """
    if has_subgraph(node):
        return PairReason.HAS_SUBGRAPH
    schema = schema_of(node)
    if not schema.known:
        return PairReason.UNKNOWN_OP
    kind = schema.kind
    if kind in POINTWISE:
        return "PW"
    if kind is FusionKind.INJECTIVE:
        return "INJ"
    if kind in REDUCING:
        return "RED"
    if kind is FusionKind.CONTRACTION:
        return "CON"
    if kind is FusionKind.DATA_MOVEMENT:
        return PairReason.DATA_MOVEMENT
    return PairReason.OPAQUE_OP


_REFUSAL_TEXT = {
    PairReason.HAS_SUBGRAPH: "carries a subgraph (control flow) and is never fused",
    PairReason.UNKNOWN_OP: "is an operator the catalog does not know, so it stays opaque",
    PairReason.OPAQUE_OP: "is an opaque operator (control flow, RNN cell, TopK ...)",
    PairReason.DATA_MOVEMENT: (
        "is a data-movement operator, which keeps its own kernel (its output becomes a kernel "
        "input)"
    ),
}

# (producer class, consumer class) -> (fusible, code, sentence template)
_TABLE: dict[tuple[str, str], tuple[bool, str, str]] = {
    ("PW", "PW"): (True, PairReason.LOOP_FUSION, "both are elementwise: one loop computes both"),
    ("PW", "INJ"): (
        True,
        PairReason.LOOP_FUSION,
        "the layout op reads the elementwise result through an index map in the same loop",
    ),
    ("INJ", "PW"): (
        True,
        PairReason.LOOP_FUSION,
        "the elementwise op reads through the layout op's index map in the same loop",
    ),
    ("INJ", "INJ"): (True, PairReason.LOOP_FUSION, "two layout ops compose into one index map"),
    ("PW", "RED"): (
        True,
        PairReason.REDUCTION_PROLOGUE,
        "the elementwise op runs as the reduction's prologue",
    ),
    ("INJ", "RED"): (
        True,
        PairReason.REDUCTION_PROLOGUE,
        "the reduction reads through the layout op's index map",
    ),
    ("RED", "PW"): (
        True,
        PairReason.REDUCTION_EPILOGUE,
        "the elementwise op runs as the reduction's epilogue",
    ),
    ("RED", "INJ"): (
        True,
        PairReason.REDUCTION_EPILOGUE,
        "the layout op re-indexes the reduction's result in its epilogue",
    ),
    ("RED", "RED"): (
        False,
        PairReason.REDUCE_AFTER_REDUCE,
        "the consumer reduces the "
        "producer's already reduced output, a second pass over another iteration "
        "space",
    ),
    ("CON", "PW"): (
        True,
        PairReason.CONTRACTION_EPILOGUE,
        "the elementwise op runs as the contraction's epilogue on its output tile",
    ),
    ("CON", "INJ"): (
        False,
        PairReason.NOT_ELEMENTWISE_EPILOGUE,
        "a contraction accepts only an elementwise or broadcast epilogue, not a layout op",
    ),
    ("CON", "RED"): (
        False,
        PairReason.NOT_ELEMENTWISE_EPILOGUE,
        "a contraction accepts only an elementwise or broadcast epilogue, not a reduction",
    ),
    ("CON", "CON"): (False, PairReason.TWO_CONTRACTIONS, "two contractions never share one kernel"),
    ("PW", "CON"): (
        False,
        PairReason.CONTRACTION_PROLOGUE,
        "no prologue is fused into a contraction",
    ),
    ("INJ", "CON"): (
        False,
        PairReason.CONTRACTION_PROLOGUE,
        "no prologue is fused into a contraction",
    ),
    ("RED", "CON"): (
        False,
        PairReason.CONTRACTION_PROLOGUE,
        "no prologue is fused into a contraction",
    ),
}


def class_verdict(producer_class: str, consumer_class: str) -> tuple[bool, str]:
    """``(fusible, code)`` for two node classes (see :func:`node_class`), without messages."""
    for c in (producer_class, consumer_class):
        if c in _REFUSAL_TEXT:
            return False, c
    fusible, code, _ = _TABLE[(producer_class, consumer_class)]
    return fusible, code


def pair_verdict(
    producer: Node,
    consumer: Node,
    *,
    classes: dict[Node, str] | None = None,
    graph: Graph | None = None,
) -> PairVerdict:
    """The verdict for one producer -> consumer edge (see the module docstring's table)."""
    cls = classes if classes is not None else {}
    pc = cls.get(producer) or node_class(producer)
    cc = cls.get(consumer) or node_class(consumer)
    values = tuple(v for v in producer.outputs if any(n is consumer for n, _ in v._users))
    graph = graph if graph is not None else consumer.graph
    outs = {id(v) for v in graph.outputs} if graph is not None else set()
    multi = any(id(v) in outs or any(n is not consumer for n, _ in v._users) for v in values)
    pair = f"{producer.op_type} {producer.name!r} -> {consumer.op_type} {consumer.name!r}"
    for node, c in ((producer, pc), (consumer, cc)):
        if c in _REFUSAL_TEXT:
            who = "producer" if node is producer else "consumer"
            msg = f"{pair}: the {who} {node.op_type} {node.name!r} {_REFUSAL_TEXT[c]}."
            return PairVerdict(producer, consumer, False, c, msg, values, multi)
    fusible, code, text = _TABLE[(pc, cc)]
    msg = f"{pair}: {text}"
    if fusible and multi:
        msg += " (the value is read elsewhere too, so it stays materialized)"
    return PairVerdict(producer, consumer, fusible, code, msg + ".", values, multi)


def graph_order(graph: Graph) -> list[Node]:
    """The graph's nodes in a topological order (the stored order when it is known sorted)."""
    nodes = graph.nodes
    return nodes if graph.is_sorted else topological_order(nodes)


def operator_pairs(graph: Graph) -> list[PairVerdict]:
    """Every adjacent producer -> consumer pair once, in graph order, with its verdict.

    Pairs are ordered by producer, then by consumer position; a consumer reading several
    outputs (or one output twice) of the same producer gives one pair.
    """
    order = graph_order(graph)
    pos = {n: i for i, n in enumerate(order)}
    classes = {n: node_class(n) for n in order}
    verdicts: list[PairVerdict] = []
    for producer in order:
        consumers = sorted((s for s in producer.successors() if s in pos), key=pos.__getitem__)
        for consumer in consumers:
            verdicts.append(pair_verdict(producer, consumer, classes=classes, graph=graph))
    return verdicts


__all__ = [
    "FUSIBLE_CODES",
    "PairReason",
    "PairVerdict",
    "class_verdict",
    "graph_order",
    "has_subgraph",
    "node_class",
    "operator_pairs",
    "pair_verdict",
]
