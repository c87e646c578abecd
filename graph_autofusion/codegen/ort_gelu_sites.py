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
(``benchmarks/gelu_kernels.py``: ``GeluErf`` 0.61-0.95x onnxruntime's ``Gelu``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


def gelu_form(node: Any) -> str | None:
    """The one-pass operator with ``node``'s inputs and math, if ``node`` is a GELU: an ONNX
    ``Gelu`` (``x``), onnxruntime's ``Gelu`` (``x``), ``BiasGelu`` (``x``, bias) or
    ``FastGelu`` (``x``[, bias])."""
    if node.domain in ("", "ai.onnx") and node.op_type == "Gelu":
        op = {"none": OP_ERF, "tanh": OP_TANH}.get(node.attrs.get("approximate", "none"))
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
    return op


#: a value's (dtype, shape) on the sample inputs (the pipeline's binding), or None
TypeOf = Callable[[str], "tuple[Any, Any] | None"]


def our_gelu(node: Any, type_of: TypeOf | None = None) -> str | None:
    """The one-pass operator that computes ``node``, if it is a GELU over float32 that ours
    computes with the same inputs (``x``, and a bias over the last axis where it has one).
    Types and shapes are the graph's, else ``type_of``'s (the sample inputs': a value after
    another contrib operator has none in the graph)."""
    op = gelu_form(node)
    if op is None:
        return None

    def known(v: Any) -> tuple[Any, Any]:
        got = type_of(v.name) if type_of is not None else None
        dtype, shape = got if got is not None else (None, None)
        return v.dtype or dtype, v.shape if v.shape is not None else shape

    x_type, x_shape = known(node.inputs[0])
    # ours are float32 only: the output's type where the input's is not known
    if (x_type or known(node.outputs[0])[0]) != DType.FLOAT:
        return None
    if len(node.inputs) == 2:
        b_shape = known(node.inputs[1])[1]
        if b_shape is None or len(b_shape) != 1 or not x_shape:
            return None
        last = x_shape[-1]
        if not isinstance(last, int) and type_of is not None:  # symbolic: the sample's
            got = type_of(node.inputs[0].name)
            last = got[1][-1] if got is not None and got[1] else None
        if not isinstance(b_shape[0], int) or b_shape[0] != last:
            return None
    return op


def plan_gelu_sites(model: Any, type_of: TypeOf | None = None) -> list[GeluSite]:
    """The GELU nodes of ``model`` that :func:`our_gelu` computes."""
    out = []
    for n in model.graph.nodes:
        op = our_gelu(n, type_of)
        if op is not None:
            out.append(GeluSite(f"{RULE}@{n.name}", n.name, op))
    return out


def apply_gelu_sites(
    model: Any,
    keys: Iterable[str] | None,
    allowed: Iterable[str] | None = None,
    made: Iterable[Lowered] = (),
) -> list[Lowered]:
    """Rewrite the GELU sites of ``model`` (those with these ``keys``; ``None``: all; and only
    those in ``allowed`` when given: the sites planned before the fusions were applied, so a
    GELU a fusion made is not one, nor is a node of ``made``'s lowerings, whatever its name).
    Returns their ``Lowered`` records."""
    g = model.graph
    keyset = None if keys is None else set(keys)
    if allowed is None:
        sites = plan_gelu_sites(model)
    else:  # planned with the sample's types: the GELUs of those names that are still there
        allowed = set(allowed)
        forms = ((n, gelu_form(n)) for n in g.nodes)
        sites = [GeluSite(f"{RULE}@{n.name}", n.name, op) for n, op in forms if op is not None]
        sites = [s for s in sites if s.key in allowed]
    by_name = {n.name: n for n in g.nodes}
    theirs = {id(n) for low in made for n in low.new_nodes}
    out: list[Lowered] = []
    for s in sites:
        if (keyset is not None and s.key not in keyset) or id(by_name[s.node]) in theirs:
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
