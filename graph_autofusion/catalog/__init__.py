"""Operator catalog (F3): fusion kind, FLOP/byte formulas and NumPy reference per operator."""

# The definition modules register their operators with the registry when imported: loading
# them with the package fills it before any lookup (``registry`` itself never imports them).
from graph_autofusion.catalog import definitions  # noqa: F401
from graph_autofusion.catalog.cost import default_flops, node_bytes, node_flops
from graph_autofusion.catalog.registry import (
    FusionKind,
    OpContext,
    OpSchema,
    all_schemas,
    get_schema,
    op,
    register,
    run_reference,
    schema_of,
)

__all__ = [
    "FusionKind",
    "OpContext",
    "OpSchema",
    "all_schemas",
    "default_flops",
    "get_schema",
    "node_bytes",
    "node_flops",
    "op",
    "register",
    "run_reference",
    "schema_of",
]
