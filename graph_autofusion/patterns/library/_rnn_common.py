"""Shared check of the RNN gate rules: gate pre-activations come from one chunked tensor.

Not a rule module (the leading underscore keeps it out of rule discovery).

``chunk`` is written as one multi-output ``Split`` (dynamo, the torch frontend) or as several
``Slice`` nodes of the same tensor (TorchScript). The pattern language matches one output of a
node per pattern operator, so the Split itself stays outside the match; the rules bind the
pre-activations as variables and check their common origin here.
"""

from __future__ import annotations

from graph_autofusion.ir.core import Value


def chunk_source(v: Value) -> tuple[str, int] | None:
    """Identity of the chunked tensor ``v`` is a piece of (``None``: not a chunk)."""
    p = v.producer
    if p is None:
        return None
    if p.op_type == "Split":
        return ("split", id(p))
    if p.op_type == "Slice" and p.inputs and p.inputs[0] is not None:
        return ("slice", id(p.inputs[0]))
    return None


def same_chunked_tensor(values: list[Value], what: str) -> str | None:
    """Rejection sentence unless ``values`` are distinct pieces of one Split / Slice group."""
    sources = {chunk_source(v) for v in values}
    if None in sources or len(sources) != 1:
        names = ", ".join(f"%{v.name}" for v in values)
        return f"the {what} ({names}) are not pieces of one Split/Slice of a gates tensor"
    if len({id(v) for v in values}) != len(values):
        return f"the {what} reuse one piece of the gates tensor"
    return None
