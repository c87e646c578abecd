"""Lone GELU operators of the onnxruntime target, with custom operators on.

    sites = plan_gelu_sites(model)                        # the GELU nodes it applies to
    lowered = apply_gelu_sites(model, keys, allowed)      # each one rewritten (keys None: all)

A GELU that a fusion takes (a bias add before it: ``bias_gelu``; a decomposed form:
``gelu_erf``, ``gelu_tanh``) gets the one-pass ``GeluErf`` / ``GeluTanh`` through that fusion's
native form (:func:`graph_autofusion.pipeline.ort_kernels.swap_gelus`). The others are single
operators no rule fuses: an ONNX ``Gelu`` (opset 20, what torch's exporter and the PyTorch
route make of ``F.gelu``) after a linear layer without bias (Gemma's and Falcon's MLPs), after
a convolution, or onnxruntime's own ``Gelu`` / ``FastGelu`` / ``BiasGelu`` in a model an
optimizer already rewrote. Each such node over float32 becomes ours, same inputs, its own fusion
(``gelu_kernel@<node>``, counted as ``ai.graph_autofusion::GeluErf`` or ``GeluTanh``), which
safe mode checks and times against the node as onnxruntime runs it and rolls back when slower
(``benchmarks/gelu_kernels.py``: ``GeluErf`` 0.67-0.95x onnxruntime's ``Gelu``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from graph_autofusion.codegen.onnxruntime import Lowered
from graph_autofusion.codegen.ort_customop_c import DOMAIN
from graph_autofusion.codegen.ort_gelu import OP_ERF, OP_TANH
from graph_autofusion.ir.dtypes import DType

RULE = "gelu_kernel"
MS = "com.microsoft"


@dataclass(frozen=True)
class GeluSite:
    """One GELU node the lowering rewrites into ``op``."""

    key: str
    node: str
    op: str


def our_gelu(node: Any) -> str | None:
    """The one-pass operator that computes ``node``, if it is a GELU over float32 that ours
    computes with the same inputs (``x``, and a bias over the last axis where it has one)."""
    if node.domain in ("", "ai.onnx") and node.op_type == "Gelu":
        form = node.attrs.get("approximate", "none")
        op = {"none": OP_ERF, "tanh": OP_TANH}.get(form)
        n_inputs = 1
    elif node.domain == MS and node.op_type in ("Gelu", "BiasGelu", "FastGelu"):
        op = OP_TANH if node.op_type == "FastGelu" else OP_ERF
        n_inputs = 2 if node.op_type == "BiasGelu" else len(node.inputs)
    else:
        return None
    if op is None or not 1 <= len(node.inputs) <= 2 or len(node.inputs) != n_inputs:
        return None
    if any(v is None for v in node.inputs) or len(node.outputs) != 1:
        return None
    x = node.inputs[0]
    # ours are float32 only: the output's type where the input's is not known
    if (x.dtype or node.outputs[0].dtype) != DType.FLOAT:
        return None
    if len(node.inputs) == 2:
        b = node.inputs[1]
        if b.shape is None or len(b.shape) != 1 or x.shape is None or not x.shape:
            return None
        if not isinstance(b.shape[0], int) or b.shape[0] != x.shape[-1]:
            return None
    return op


def plan_gelu_sites(model: Any) -> list[GeluSite]:
    """The GELU nodes of ``model`` that :func:`our_gelu` computes."""
    out = []
    for n in model.graph.nodes:
        op = our_gelu(n)
        if op is not None:
            out.append(GeluSite(f"{RULE}@{n.name}", n.name, op))
    return out


def apply_gelu_sites(
    model: Any, keys: Iterable[str] | None, allowed: Iterable[str] | None = None
) -> list[Lowered]:
    """Rewrite the GELU sites of ``model`` (those with these ``keys``; ``None``: all; and only
    those in ``allowed`` when given: the sites planned before the fusions were applied, so a
    GELU a fusion made is not one). Returns their ``Lowered`` records."""
    g = model.graph
    keyset = None if keys is None else set(keys)
    allowed = None if allowed is None else set(allowed)
    by_name = {n.name: n for n in g.nodes}
    out: list[Lowered] = []
    for s in plan_gelu_sites(model):
        if (keyset is not None and s.key not in keyset) or (
            allowed is not None and s.key not in allowed
        ):
            continue
        node = by_name[s.node]
        y = node.outputs[0]
        # the activations it reads (a bias that is no constant too)
        reads = [v.name for v in node.inputs if not v.is_const and v.name not in g.initializers]
        new = g.make_node(s.op, list(node.inputs), domain=DOMAIN, name=f"{s.node}_ours",
                          before=node)  # fmt: skip
        g.replace_all_uses_with(y, new.outputs[0])
        g.remove_node(node)
        g.rename_value(new.outputs[0], y.name)
        new.outputs[0].dtype, new.outputs[0].shape = y.dtype, y.shape
        out.append(
            Lowered(s.key, RULE, [s.node], [new], reads, [y.name], [f"{DOMAIN}::{s.op}"],
                    payload=s)
        )  # fmt: skip
    if out:
        model.opset_imports.setdefault(DOMAIN, 1)
    return out
