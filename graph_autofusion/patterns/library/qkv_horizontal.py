"""Horizontal fusion of sibling projections that read the same input (Q/K/V):

    [y_1, ..., y_n] = split(x @ concat(W_1, ..., W_n) + concat(b_1, ..., b_n), axis=-1)

Each branch is ``MatMul(x, W_i)``, optionally ``+ b_i`` (weights and biases constant); two or
more branches that read the same ``x`` fuse. Unequal output widths (grouped-query attention,
where K and V are narrower than Q) are fine. A projection whose output feeds an activation
(the gate of a SwiGLU/GeGLU MLP, a dense + GELU) is not a branch: the vertical fusions of that
activation need the MatMul, so an MLP's gate/up pair is left to them.

Native form: one ``MatMul`` with the concatenated weights (``[K, sum N_i]``), one ``Add`` of the
concatenated biases when any branch has a bias (zeros for those without), then ``Split`` on the
last axis into the branch widths, in branch order. It needs 2-D weights with equal input
dimension and 1-D biases. Weights that are not C-contiguous (the PyTorch route's transposed
views of a module's parameters, read in place) are left unfused: the concatenation would be a
copy of the parameters.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Value
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext, Pattern, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule

#: Operators whose input is an activation's: a projection feeding one is not a Q/K/V branch.
ACTIVATIONS = frozenset(
    {
        "Sigmoid",
        "Relu",
        "Gelu",
        "Tanh",
        "Silu",
        "Swish",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Softplus",
        "Mish",
        "FastGelu",
        "QuickGelu",
        "BiasGelu",
    }
)


def _constant(value: Value) -> str | None:
    return None if const_value(value) is not None else f"%{value.name} is not a constant"


def projection_pattern(p: PatternBuilder, x: Pattern) -> Pattern:
    """``MatMul(x, W) + b`` or ``MatMul(x, W)`` with constant ``W`` and ``b``."""
    mm = p.MatMul(x, p.var("w", check=_constant), _label="mm")
    return p.Add(mm, p.var("b", check=_constant), _label="bias_add") | mm


def not_an_activation_input(ctx: MatchContext) -> str | None:
    """Reject a projection whose output feeds an activation (an MLP gate, dense + GELU)."""
    root = ctx.nodes.get("bias_add") or ctx.nodes["mm"]
    acts = sorted({u.op_type for u in root.outputs[0].user_nodes if u.op_type in ACTIVATIONS})
    if acts:
        return f"the projection {root.name!r} feeds {', '.join(acts)}: an MLP gate, not Q/K/V"
    return None


def _branches(ctx: RewriteContext) -> int:
    n = 0
    while f"b{n}.w" in ctx.match.values:
        n += 1
    return n


def _rewrite(ctx: RewriteContext):
    n = _branches(ctx)
    weights = [const_value(ctx.value(f"b{i}.w")) for i in range(n)]
    if any(w is None or w.ndim != 2 for w in weights):
        raise RewriteError("every branch weight must be a 2-D constant")
    if len({w.shape[0] for w in weights}) != 1 or len({w.dtype for w in weights}) != 1:
        raise RewriteError("branch weights differ in input dimension or dtype")
    if any(not w.flags.c_contiguous for w in weights):
        # the PyTorch importer's linear weights are transposed views of the module's
        # parameters, which the engine reads in place: concatenating them would copy them
        raise RewriteError(
            "the branch weights are a module's parameters read in place (transposed views); "
            "concatenating them would copy them"
        )
    widths = [int(w.shape[1]) for w in weights]
    biases = []
    for i, width in enumerate(widths):
        if f"b{i}.b" not in ctx.match.values:
            biases.append(None)
            continue
        b = const_value(ctx.value(f"b{i}.b"))
        if b is None or b.ndim != 1 or b.shape[0] != width:
            raise RewriteError(f"branch {i}'s bias is not a 1-D constant of width {width}")
        biases.append(b)
    x = ctx.value("x")
    w_cat = ctx.add_constant("qkv_weight", np.concatenate(weights, axis=1))
    y = ctx.make_node("MatMul", [x, w_cat]).outputs[0]
    if any(b is not None for b in biases):
        dtype = weights[0].dtype
        parts = [
            b.astype(dtype) if b is not None else np.zeros(wd, dtype)
            for b, wd in zip(biases, widths)
        ]
        b_cat = ctx.add_constant("qkv_bias", np.concatenate(parts))
        y = ctx.make_node("Add", [y, b_cat]).outputs[0]
    if ctx.model.opset_imports.get("", 13) >= 13:
        sizes = ctx.add_constant("qkv_split", np.asarray(widths, dtype=np.int64))
        split = ctx.make_node("Split", [y, sizes], {"axis": -1}, num_outputs=n)
    else:
        split = ctx.make_node("Split", [y], {"axis": -1, "split": widths}, num_outputs=n)
    return list(split.outputs)


_p = PatternBuilder()

RULE = FusionRule(
    "qkv_horizontal",
    pattern=projection_pattern(_p, _p.var("x")),
    fuse_pattern="QKVProjection",
    priority=195,
    presets=("transformer", "llm"),
    checks=(not_an_activation_input,),
    horizontal="x",
    min_branches=2,
    rewrite=_rewrite,
    doc=__doc__.strip().splitlines()[0],
)
