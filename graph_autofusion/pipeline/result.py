"""What a fuse returns and the pieces every target shares: :class:`FuseResult`,
:class:`RolledBack`, :func:`clone_model`, and each stage's artifact (``dump_dir``).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.codegen.onnxruntime import Lowered, NotLowered
from graph_autofusion.ir.core import Graph, Model, Node, Value


def clone_model(model: Model, *, infer_types: bool = True) -> Model:
    """An independent copy of ``model``: its own graph, nodes and values; constant arrays are
    shared (the pipeline never writes into one). A graph with subgraph attributes (If, Loop)
    or with untyped values is copied through its ONNX form, whose import infers the types
    (``infer_types=False``: untyped values stay untyped, an exact copy of the IR)."""
    g = model.graph
    subgraphs = any(isinstance(a, Graph) for n in g.nodes for a in _attr_leaves(n.attrs))
    # The ONNX round trip also runs onnx's shape inference, which a hand-built IR may need. A
    # torch import is typed from the FX metadata (what stays untyped has symbolic sizes the
    # inference cannot improve on), and the round trip would copy its weights.
    from_torch = model.producer_name == "graph-autofusion.torch"
    untyped = not from_torch and any(
        v.dtype is None or v.shape is None for n in g.nodes for v in n.outputs
    )
    if subgraphs or (untyped and infer_types):
        from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx  # heavy: onnx

        return load_onnx(to_onnx(model))
    vmap: dict[int, Value] = {}

    def value(v: Value) -> Value:
        nv = Value(v.name, v.dtype, v.shape, const=v.const)
        nv.meta, nv.doc = dict(v.meta), v.doc
        vmap[id(v)] = nv
        return nv

    ng = Graph(g.name)
    ng.doc, ng.meta = g.doc, copy.copy(g.meta)
    for v in g.inputs:
        ng.add_input(vmap.get(id(v)) or value(v))
    for name, v in g.initializers.items():
        nv = vmap.get(id(v)) or value(v)
        if not ng.has_value_name(nv.name):
            ng._claim_value_name(nv)
        ng.initializers[name] = nv
    for n in g.nodes:
        ins = [vmap[id(v)] if v is not None else None for v in n.inputs]
        node = Node(
            n.op_type,
            ins,
            copy.deepcopy(n.attrs),
            domain=n.domain,
            name=n.name,
            outputs=[value(o) for o in n.outputs],
        )
        node.attr_types, node.meta = dict(n.attr_types), dict(n.meta)
        node.doc, node.overload = n.doc, n.overload
        if n.captures:  # outer values a subgraph body reads (an If branch): users too
            node.set_captures([vmap[id(v)] for v in n.captures])
        ng.add_node(node)
    ng.set_outputs([vmap[id(v)] for v in g.outputs])
    ng.value_info = {k: vmap.get(id(v)) or value(v) for k, v in g.value_info.items()}
    out = Model(ng, dict(model.opset_imports))
    for attr in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, attr, getattr(model, attr))
    out.doc = model.doc
    out.metadata_props = dict(model.metadata_props)
    out.functions = list(model.functions)
    out.meta = copy.copy(model.meta)
    return out


def _attr_leaves(attrs: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for a in attrs.values():
        out.extend(a if isinstance(a, list | tuple) else [a])
    return out


def e2e_passed(e2e: Mapping[str, Any]) -> bool:
    """Whether an end-to-end comparison passed: ``{"outputs": {...}, "passed": bool}`` (the
    cpu target's), or output name -> ``{"cosine", ..., "passed"}`` (the onnxruntime target's,
    :func:`graph_autofusion.verify.safety.end_to_end`): every output passed."""
    if "passed" in e2e:
        return bool(e2e["passed"])
    outs = e2e.get("outputs", e2e)
    return all(bool(v.get("passed", True)) for v in outs.values() if isinstance(v, Mapping))


@dataclass
class RolledBack:
    key: str
    rule: str
    code: str
    message: str
    result: Any = None  # the SafetyResult


@dataclass
class FuseResult:
    """What the fuse pipeline did, and the fused model."""

    model: Model
    original: Model
    analysis: Any
    lowered: list[Lowered]
    not_lowered: list[NotLowered]
    safety: dict[str, Any] = field(default_factory=dict)  # key -> SafetyResult
    rolled_back: list[RolledBack] = field(default_factory=list)
    end_to_end: dict[str, Any] | None = None
    safe_mode: bool = True
    feeds: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    shape_folding: Any = None  # patterns.shape_folding.ShapeFolding, when it ran
    #: the custom-operator library the fused model needs (codegen.ort_customop), or None
    custom_ops: Any = None
    #: F17 controls: size-switch decisions (``size_switches``), ``keep_fp32`` operators
    controls: dict[str, Any] = field(default_factory=dict)
    fp32_islands: int = 0  # unfused operators made to compute in float32 (keep_fp32)
    #: the target asked for, when it is not the pipeline's own (the cpu target's onnxruntime
    #: engine); "" for the pipeline's
    target: str = ""
    #: the cpu target on an ONNX model: the engine that runs it (``pipeline/cpu_engines.py``:
    #: ``name``, ``why``, measured ``ms`` per engine, ``notes``); empty otherwise
    engine: dict[str, Any] = field(default_factory=dict)
    #: compressed weights (``options.weights``): pipeline.weights.WeightsReport, or None (fp32)
    weights: Any = None

    @property
    def fused(self) -> list[Lowered]:
        return self.lowered

    def skipped_by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.not_lowered:
            out[n.code] = out.get(n.code, 0) + 1
        for r in self.rolled_back:
            out[f"rolled-back:{r.code}"] = out.get(f"rolled-back:{r.code}", 0) + 1
        for c in self.analysis.candidates if self.analysis is not None else ():
            if not c.chosen:
                out[c.code or reasons.NOT_CHOSEN] = out.get(c.code or reasons.NOT_CHOSEN, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def fused_op_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for low in self.lowered:
            for op in low.fused_ops:
                out[op] = out.get(op, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> dict[str, Any]:
        est = self.analysis.performance_improvement if self.analysis is not None else None
        return {
            "candidates": len(self.analysis.candidates) if self.analysis is not None else 0,
            "planned": len(self.analysis.chosen) if self.analysis is not None else 0,
            "fused": len(self.lowered),
            "fused_ops": self.fused_op_counts(),
            "skipped": self.skipped_by_reason(),
            "rolled_back": len(self.rolled_back),
            "estimated_improvement": est,
            "measured_improvement": self.measured_improvement(),
            "end_to_end": self.end_to_end,
            "safe_mode": self.safe_mode,
            **({"weights": self.weights.to_dict()} if self.weights is not None else {}),
            "shape_folding": (
                {k: v for k, v in self.shape_folding.to_dict().items() if k != "folded"}
                if self.shape_folding is not None
                else None
            ),
            **({"engine": self.engine} if self.engine else {}),
        }

    def measured_improvement(self) -> float | None:
        """Sum of the unfused / fused subgraph times safe mode measured, minus 1 (None without
        safe mode's speed check)."""
        before = after = 0.0
        for low in self.lowered:
            r = self.safety.get(low.key)
            if r is not None and r.details.get("same_optimized_graph"):
                continue  # onnxruntime runs the same graph either way: not timed
            if r is None or r.time_unfused_us is None or r.time_fused_us is None:
                return None
            before += r.time_unfused_us
            after += r.time_fused_us
        return before / after - 1.0 if after > 0 else None


def to_onnx_bytes(model: Model) -> bytes:
    from graph_autofusion.frontend.onnx_frontend import to_onnx  # heavy: onnx

    return to_onnx(model).SerializeToString()


def to_json(data: Any) -> str:
    return json.dumps(data, indent=1, default=str)


def dump_artifact(dump_dir: Any, name: str, make: Callable[[], Any]) -> None:
    """Write one stage's artifact to ``dump_dir`` (nothing when it is None)."""
    if dump_dir is None:
        return
    os.makedirs(dump_dir, exist_ok=True)
    data = make()
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(os.path.join(dump_dir, name), mode) as f:
        f.write(data)
