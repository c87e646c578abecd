"""The few-row ``MatMul`` lowering of the onnxruntime target (with custom operators on).

    sites, refused = plan_sites(model)           # the MatMuls it applies to
    lowered = apply_sites(model, keys, groups)   # each one rewritten (keys None: all)

A decoder runs one graph for both phases of generation: a prefill (many rows) and decode
steps (one row per sequence). A decode step's ``MatMul`` by a constant weight is bound by how
fast the weight streams from memory, where onnxruntime's MLAS path is slower than the
``ai.graph_autofusion`` ``Gemv`` operator (:mod:`graph_autofusion.codegen.ort_gemv`,
``benchmarks/gemv_ort.py``); a prefill's is a real GEMM, where MLAS on its prepacked weight
is the fastest there is. So each eligible ``y = MatMul(x, W)`` becomes::

    few = LessOrEqual(Size(x), 8 * K)               # once per leading shape of x
    y = If(few,
           then: Gemv(x, Wt),                        # M = prod(x.shape[:-1]) <= 8 rows
           else: com.microsoft.FusedMatMul(x, Wt, transB=1))

with ``Wt = W.T`` (``[N, K]``, contiguous) *replacing* ``W``: the same bytes, not a copy.
Both branches read ``Wt`` as an outer-scope constant initializer, which onnxruntime still
prepacks for ``FusedMatMul`` (its ``MatMul`` kernel with ``transB``): prefill keeps MLAS's
packed GEMM. ``If`` costs ~2 us per run at M=1 (measured, ``benchmarks/gemv_ort.py``).

A graph whose row count is static (a decode step's graph at fixed shapes: an export at one
cache length, or a Dynamo graph) and at most 8 gets the direct form ``y = Gemv(x, Wt)``: no
``If``, no GEMM branch, so onnxruntime packs nothing and holds no copy of the weight.

Eligible: a default-domain ``MatMul`` whose ``B`` is a float32 ``[K, N]`` initializer read
only by such ``MatMul`` nodes (they are rewritten together or not at all: the weight is
transposed once), whose ``x`` is a float32 activation of rank >= 2 with a static last dim
``K`` and either a dynamic row count (a symbolic leading dim: one graph for prefill and
decode; the ``If`` form) or a static one of at most 8 rows (the direct form).

Measured (``benchmarks/gemv_ort.py``, 2 threads, weights cold as in a decode step, workers not
spinning): the ``If`` form is 1.2-1.35x faster than ``MatMul`` at M=1 on the Llama decoder's
1-3 MB layer weights, a tie on its 65 MB LM head, and within a few percent of ``MatMul`` at
M=128 (prepacking kept). Safe mode times each site warm and spinning, where the two tie, so it
keeps a varying subset.

Each site is its own fusion (``gemv_matmul@<node>``, counted as
``ai.graph_autofusion::Gemv``), checked and timed by safe mode like every other (except a
one-row direct site, checked but not timed alone: :func:`timed_alone`); a site whose
``MatMul`` a custom-operator group keeps before its kernel (SwiGLU's gate and up projections)
is rewritten inside that group's fusion instead, and checked with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graph_autofusion.codegen.onnxruntime import Lowered
from graph_autofusion.codegen.ort_customop_c import DOMAIN
from graph_autofusion.codegen.ort_gemv import MAX_ROWS, OP
from graph_autofusion.ir.core import Node, RawAttribute, Value
from graph_autofusion.ir.dtypes import DType

RULE = "gemv_matmul"
MS_DOMAIN = "com.microsoft"
FUSED_OP = f"{DOMAIN}::{OP}"


@dataclass(frozen=True)
class GemvSite:
    """One ``MatMul`` the lowering rewrites."""

    key: str
    node: str  # the MatMul's name
    weight: str  # its B initializer
    x: str
    output: str
    k: int
    n: int
    rows: int | None = None  # x's row count when it is static (the direct form), else None


def _key(node_name: str) -> str:
    return f"{RULE}@{node_name}"


def _site_refusal(node: Any, g: Any) -> str | None:
    """Why ``node`` (a MatMul) is no site (``None``: it is one)."""

    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    x, w = node.inputs
    if w.name not in g.initializers or any(v.name == w.name for v in g.inputs):
        return "B is not a constant initializer"
    if w.const is None or w.const.ndim != 2 or w.const.dtype != np.float32:
        return "B is not a float32 matrix"
    if x.is_const or x.dtype != DType.FLOAT or x.shape is None or len(x.shape) < 2:
        return "x is not a float32 activation of rank >= 2"
    if x.shape[-1] != int(w.const.shape[0]):
        return "x's last dim is not static or differs from B's rows"
    rows = _static_rows(x)
    if rows is not None and rows > MAX_ROWS:
        return f"x's row count is static and above {MAX_ROWS} (no decode step to serve)"
    return None


def timed_alone(low: Any) -> bool:
    """Whether safe mode times this lowering on its own. A one-row site of the direct form
    (a decode step's static shape) is not: it streams its weight from memory once per call,
    and timed with the weight cold, as a decode step runs it, ``Gemv`` is 1.04-1.51x faster
    than onnxruntime's packed GEMM at one row on an AVX2 and an AVX-512 machine
    (``benchmarks/results/gemv_ort.md``, ``gemv_ort_avx512.md``: 1.04x on a 65 MB LM head,
    1.2-1.5x on 1-3 MB layer weights), while
    safe mode's warm timing (the weight in cache) calls the two a tie either way; the packed
    GEMM also holds a copy of the weight. Its numerics are checked as every fusion's; on the
    torch route the engine choice then times the whole graph against the torch program and
    eager, on the ONNX route nothing times it further."""
    site = low.payload if getattr(low, "rule", None) == RULE else None
    return not (isinstance(site, GemvSite) and site.rows == 1)


def _static_rows(x: Any) -> int | None:
    """``x``'s row count (the product of its leading dims) when every one is static."""
    lead = x.shape[:-1]
    return int(np.prod(lead)) if all(isinstance(d, int) for d in lead) else None


def plan_sites(
    model: Any, sample_shape: Callable[[str], Sequence[int] | None] | None = None
) -> tuple[list[GemvSite], list[tuple[str, str, str, str]]]:
    """The sites of ``model`` and ``(key, rule, code, message)`` of the MatMuls by a float32
    constant matrix that are none. ``sample_shape``: a value's shape on the sample inputs;
    given, a site's ``x`` must have at most :data:`MAX_ROWS` rows there (the sample is the
    workload the user fuses for, a decode step: there safe mode times the ``Gemv`` branch)."""
    g = model.graph
    sites: list[GemvSite] = []
    refused: list[tuple[str, str, str, str]] = []
    by_weight: dict[str, list[Any]] = {}
    for n in g.nodes:
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and len(n.inputs) == 2:
            w = n.inputs[1]
            if w is not None and w.name in g.initializers and w.const is not None:
                if w.const.ndim == 2 and w.const.dtype == np.float32:
                    by_weight.setdefault(w.name, []).append(n)
    for wname, nodes in by_weight.items():
        w = g.initializers[wname]
        why = None
        if any(u.op_type != "MatMul" or i != 1 for u, i in w.users) or g.is_output(w):
            why = "the weight is read by other nodes than MatMuls as their B"
        for n in nodes:
            why = why or _site_refusal(n, g)
            if why is None and sample_shape is not None:
                shape = sample_shape(n.inputs[0].name)
                rows = int(np.prod(shape[:-1])) if shape else None
                if rows is None or rows > MAX_ROWS:
                    why = (
                        f"the sample inputs give {rows if rows is not None else 'unknown'} rows "
                        f"(a few-row Gemv serves at most {MAX_ROWS}: fuse for a decode step)"
                    )
        if why:
            for n in nodes:
                refused.append((_key(n.name), RULE, "gemv-not-eligible", why))
            continue
        k, nn = (int(d) for d in w.const.shape)
        for n in nodes:
            x = n.inputs[0]
            sites.append(
                GemvSite(_key(n.name), n.name, wname, x.name, n.outputs[0].name, k, nn,
                         _static_rows(x))
            )  # fmt: skip
    return sites, refused


def _branch(nodes: list[Any], out: str) -> Any:
    from onnx import TensorProto, helper

    return helper.make_graph(
        nodes, "branch", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
    )


def apply_sites(
    model: Any,
    keys: Iterable[str] | None,
    groups: Sequence[Any] = (),
    allowed: Iterable[str] | None = None,
) -> list[Any]:
    """Rewrite the sites of ``model`` (those with these ``keys``; ``None``: all; and only
    those in ``allowed`` when given: the keys planned on the sample shapes). ``groups``:
    the custom-operator groups' ``Lowered`` records already applied; a site whose MatMul one
    of them keeps is rewritten inside it (its ``new_nodes`` get the ``If`` and the condition,
    or the direct ``Gemv``; its ``fused_ops`` ``Gemv``). Returns the sites' own ``Lowered``
    records."""
    g = model.graph
    sites, _ = plan_sites(model)
    keyset = None if keys is None else set(keys)
    by_name = {n.name: n for n in g.nodes}
    owner: dict[str, Any] = {}  # MatMul name -> the group Lowered keeping it
    for low in groups:
        for n in low.new_nodes:
            if n.op_type == "MatMul" and n.graph is g:
                owner[n.name] = low
    if allowed is not None:
        allowed = set(allowed)
        sites = [s for s in sites if s.key in allowed]
    chosen = [s for s in sites if keyset is None or s.key in keyset or s.node in owner]
    # a weight is transposed once: every MatMul reading it is rewritten, or none
    per_weight: dict[str, int] = {}
    for s in sites:
        per_weight[s.weight] = per_weight.get(s.weight, 0) + 1
    for s in chosen:
        per_weight[s.weight] -= 1
    chosen = [s for s in chosen if per_weight[s.weight] == 0]
    if not chosen:
        return []
    order = {n.name: i for i, n in enumerate(g.nodes)}
    chosen.sort(key=lambda s: order[s.node])
    transposed: dict[str, Value] = {}
    conds: dict[tuple, tuple[Value, list[Any]]] = {}
    out: list[Any] = []
    for s in chosen:
        node = by_name[s.node]
        x, w = node.inputs
        wt = transposed.get(s.weight)
        if wt is None:
            name = s.weight + "_t"
            while g.has_value_name(name):
                name += "_"
            wt = g.add_initializer(name, np.ascontiguousarray(w.const.T))
            transposed[s.weight] = wt
        y = node.outputs[0]
        if _static_rows(x) is not None:  # at most MAX_ROWS rows, always: Gemv alone
            gemv = g.make_node(OP, [x, wt], domain=DOMAIN, name=f"{s.node}_gemv", before=node)
            g.replace_all_uses_with(y, gemv.outputs[0])
            g.remove_node(node)
            g.rename_value(gemv.outputs[0], y.name)
            gemv.outputs[0].dtype, gemv.outputs[0].shape = y.dtype, y.shape
            new_nodes = [gemv]
        else:
            new_nodes = _if_form(g, node, x, wt, s, conds)
        if _kept_by_group(owner.get(s.node), node, new_nodes):
            continue
        out.append(
            Lowered(s.key, RULE, [s.node], new_nodes, [x.name], [y.name], [FUSED_OP], 0.9999, s)
        )
    model.opset_imports.setdefault(DOMAIN, 1)
    model.opset_imports.setdefault(MS_DOMAIN, 1)
    return out


def _kept_by_group(grp: Any, node: Any, new_nodes: list[Any]) -> bool:
    """A site whose MatMul the custom-operator group ``grp`` keeps is checked (and rolled
    back) with that group: its new nodes replace the MatMul among the group's. Returns
    whether there was such a group."""
    if grp is None:
        return False
    kept = [n for n in grp.new_nodes if n is not node]
    grp.new_nodes = [*(c for c in new_nodes[:-1] if c not in kept), *kept, new_nodes[-1]]
    if FUSED_OP not in grp.fused_ops:
        grp.fused_ops = [*grp.fused_ops, FUSED_OP]
    return True


def _if_form(g: Any, node: Any, x: Value, wt: Value, s: GemvSite, conds: dict) -> list[Any]:
    """Replace ``node`` (the site's MatMul) by ``If(few rows, Gemv, FusedMatMul)`` reading
    ``wt``; ``conds``: the row conditions made so far, one per leading shape of x (made here
    for the first x of a shape). Returns the condition's nodes, then the ``If``."""
    from onnx import helper

    y = node.outputs[0]
    # the condition, once per leading shape (the first x of that shape computes it; any
    # row count gives the right result, the condition only picks the faster branch)
    lead = tuple(d if d is not None else f"?{x.name}" for d in x.shape[:-1])
    ck = (lead, s.k)
    if ck not in conds:
        limit = g.add_initializer(
            g.fresh_name("gemv_rows_limit"), np.array(MAX_ROWS * s.k, np.int64)
        )
        size = g.make_node("Size", [x], name=f"{s.node}_gemv_size", before=node)
        size.outputs[0].dtype, size.outputs[0].shape = DType.INT64, ()
        few = g.make_node(
            "LessOrEqual", [size.outputs[0], limit], name=f"{s.node}_gemv_few", before=node
        )
        few.outputs[0].dtype, few.outputs[0].shape = DType.BOOL, ()
        conds[ck] = (few.outputs[0], [size, few])
    cond, cond_nodes = conds[ck]
    t_out, e_out = g.fresh_name(f"{y.name}_gemv"), g.fresh_name(f"{y.name}_matmul")
    then_g = _branch([helper.make_node(OP, [x.name, wt.name], [t_out], domain=DOMAIN)], t_out)
    else_g = _branch(
        [helper.make_node("FusedMatMul", [x.name, wt.name], [e_out], domain=MS_DOMAIN, transB=1)],
        e_out,
    )
    caps = [x.name, wt.name]
    new_y = Value(g.fresh_name(f"{y.name}_if"), y.dtype, y.shape)
    if_node = Node(
        "If",
        [cond],
        {
            "then_branch": RawAttribute(then_g, captures=caps),
            "else_branch": RawAttribute(else_g, captures=caps),
        },
        name=f"{s.node}_gemv_if",
        outputs=[new_y],
    )
    g.add_node(if_node, before=node)
    if_node.set_captures([x, wt])
    if_node.meta["onnx_capture_names"] = list(caps)
    g.replace_all_uses_with(y, new_y)
    g.remove_node(node)
    g.rename_value(new_y, y.name)
    return [*cond_nodes, if_node]
