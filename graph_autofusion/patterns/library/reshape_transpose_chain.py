"""Chains of two or three consecutive layout operators (Reshape, Transpose, Squeeze, Unsqueeze,
Flatten), each intermediate read only by the next:

    y = L3(L2(L1(x)))        or        y = L2(L1(x))

None of them computes anything; they only move or relabel elements. Native form:

* all Transposes: one ``Transpose`` with the composed permutation
  (``perm[i] = perm1[perm2[i]]`` for two);
* all reshape-like (Reshape, Squeeze, Unsqueeze, Flatten, element order unchanged): one
  ``Reshape`` to the chain's static output shape, or, for Reshapes whose last target shape is
  constant and has no ``0`` copying a dimension of the intermediate, to that target shape;
* anything else (a Transpose between reshapes): the generic local-function form.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Node, Value
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule

LAYOUT = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")
RESHAPE_LIKE = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")
FUSED = "LayoutChain"


def _layout(p: PatternBuilder, inner: Pattern, label: str) -> Pattern:
    # Only the data input is constrained; shapes / axes inputs are read as they are.
    return p.op(*LAYOUT)(inner, _label=label, _exact=False)


def chain_pattern(p: PatternBuilder) -> Pattern:
    """Three layout ops in a row, else two (the longest chain at a root wins)."""
    three = _layout(p, _layout(p, _layout(p, p.var("x"), "first"), "mid"), "last")
    two = _layout(p, _layout(p, p.var("x"), "first"), "last")
    return three | two


def _chain(ctx: RewriteContext) -> list[Node]:
    return [ctx.match.labels[k] for k in ("first", "mid", "last") if k in ctx.match.labels]


def _composed_perm(nodes: list[Node], rank: int | None) -> list[int] | None:
    perm: list[int] | None = list(range(rank)) if rank is not None else None
    for n in nodes:
        p = n.attrs.get("perm")
        if p is None:
            if perm is None:
                return None
            p = list(reversed(range(len(perm))))
        p = [int(i) for i in p]
        perm = list(range(len(p))) if perm is None else perm
        if len(p) != len(perm):
            return None
        perm = [perm[i] for i in p]
    return perm


def _target_shape(nodes: list[Node], out: Value) -> np.ndarray | None:
    if out.shape is not None and out.is_static:
        return np.asarray([int(d) for d in out.shape], dtype=np.int64)
    last = nodes[-1]
    if not all(n.op_type == "Reshape" for n in nodes) or len(last.inputs) < 2:
        return None
    shape = const_value(last.inputs[1])
    if shape is None:
        return None
    shape = np.asarray(shape, dtype=np.int64).reshape(-1)
    if int(last.attrs.get("allowzero", 0)) == 0 and (shape == 0).any():
        return None  # a 0 copies a dimension of the intermediate
    return shape


def _rewrite(ctx: RewriteContext) -> list[Value]:
    nodes = _chain(ctx)
    x = nodes[0].inputs[0]  # read live: a binding may name a value an earlier rewrite replaced
    out = nodes[-1].outputs[0]
    if all(n.op_type == "Transpose" for n in nodes):
        perm = _composed_perm(nodes, x.rank)
        if perm is not None:
            return ctx.make_node("Transpose", [x], {"perm": perm}).outputs
    elif all(n.op_type in RESHAPE_LIKE for n in nodes):
        shape = _target_shape(nodes, out)
        if shape is not None:
            attrs = {"allowzero": 1} if (shape == 0).any() else {}
            target = ctx.add_constant("layout_chain_shape", shape)
            return ctx.make_node("Reshape", [x, target], attrs).outputs
    raise RewriteError("the chain does not fold into one layout operator")


_p = PatternBuilder()

RULE = FusionRule(
    "reshape_transpose_chain",
    pattern=chain_pattern(_p),
    fuse_pattern=FUSED,
    priority=50,
    presets=("transformer", "llm", "cnn"),
    rewrite=_rewrite,
    doc=" ".join(__doc__.strip().split("\n\n")[0].split()),
)
