"""Model inspection: operator and fusion-kind histograms, parameters, inputs and outputs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from graph_autofusion.catalog.registry import schema_of
from graph_autofusion.ir.core import Model, Value


def _value_info(v: Value) -> dict[str, Any]:
    return {
        "name": v.name,
        "dtype": v.dtype.short if v.dtype is not None else None,
        "shape": list(v.shape) if v.shape is not None else None,
    }


@dataclass
class Inspection:
    """What ``graph-autofusion inspect`` reports about a model."""

    name: str
    nodes: int
    parameters: int
    parameter_bytes: int
    initializers: int
    opsets: dict[str, int]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    op_histogram: dict[str, int]
    kind_histogram: dict[str, int]
    unknown_ops: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        lines = [
            f"model        {self.name}",
            f"nodes        {self.nodes}",
            f"parameters   {self.parameters:,} ({self.parameter_bytes / 2**20:.1f} MiB in "
            f"{self.initializers} initializers)",
            "opsets       " + ", ".join(f"{k or 'ai.onnx'}:{v}" for k, v in self.opsets.items()),
            "inputs",
        ]
        for v in self.inputs:
            lines.append(f"  {v['name']:<28} {v['dtype']}{v['shape']}")
        lines.append("outputs")
        for v in self.outputs:
            lines.append(f"  {v['name']:<28} {v['dtype']}{v['shape']}")
        lines.append("fusion kinds")
        for k, c in self.kind_histogram.items():
            lines.append(f"  {k:<28} {c:>6}")
        lines.append("operators")
        for k, c in self.op_histogram.items():
            lines.append(f"  {k:<28} {c:>6}")
        if self.unknown_ops:
            lines.append("unknown operators (kept opaque): " + ", ".join(self.unknown_ops))
        return "\n".join(lines)


def inspect_model(model: Model, name: str = "") -> Inspection:
    """Summarize ``model``."""
    g = model.graph
    kinds: dict[str, int] = {}
    unknown: set[str] = set()
    for node in g.nodes:
        schema = schema_of(node)
        kinds[schema.kind.value] = kinds.get(schema.kind.value, 0) + 1
        if not schema.known:
            unknown.add(node.qualified_op)
    params = sum(int(v.const.size) for v in g.initializers.values())
    pbytes = sum(int(v.const.nbytes) for v in g.initializers.values())
    return Inspection(
        name=name or g.name,
        nodes=len(g),
        parameters=params,
        parameter_bytes=pbytes,
        initializers=len(g.initializers),
        opsets=dict(model.opset_imports),
        inputs=[_value_info(v) for v in g.inputs if v.name not in g.initializers],
        outputs=[_value_info(v) for v in g.outputs],
        op_histogram=g.op_histogram(),
        kind_histogram=dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        unknown_ops=sorted(unknown),
    )
