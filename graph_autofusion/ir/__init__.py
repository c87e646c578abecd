"""Graph IR (F2): values, nodes, graphs, models, text form and verifier."""

from graph_autofusion.ir.core import (
    Graph,
    Model,
    Node,
    RawAttribute,
    Shape,
    Value,
    is_convex,
    topological_order,
)
from graph_autofusion.ir.dtypes import DType

__all__ = [
    "DType",
    "Graph",
    "Model",
    "Node",
    "RawAttribute",
    "Shape",
    "Value",
    "is_convex",
    "topological_order",
]
