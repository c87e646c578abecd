"""Bias add followed by GELU, in any spelling:

    y = gelu(x + bias)        bias: a constant broadcast over the last axis

The GELU may be one ``Gelu`` operator (ONNX, ``approximate`` ``none`` or ``tanh``), a
``com.microsoft.Gelu``, or the decomposed erf or tanh form (see ``gelu_erf`` and
``gelu_tanh``). A ``Reshape`` that keeps the last axis may sit between the bias add and the
GELU (the PyTorch frontend's GPT-2 adds the bias on the 2-D ``[batch*seq, hidden]`` view, then
reshapes). Native form: the erf GELU becomes ``com.microsoft.BiasGelu(x, bias)``, the tanh
GELU ``com.microsoft.FastGelu(x, bias)``; both need the bias as a 1-D tensor over the last axis
(a bias of shape ``[1, .., 1, N]`` is flattened), else the match stays unfused.
"""

from __future__ import annotations

from graph_autofusion.patterns.library.gelu_erf import gelu_erf_pattern
from graph_autofusion.patterns.library.gelu_tanh import gelu_tanh_pattern
from graph_autofusion.patterns.library.matmul_bias import bias_var, const_data, last_axis_bias
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"


def gelu_form(nodes) -> str:
    """``"erf"`` or ``"tanh"``: which GELU a matched node list computes."""
    for n in nodes:
        if n.op_type == "Erf":
            return "erf"
        if n.op_type == "Tanh":
            return "tanh"
        if n.op_type == "Gelu":
            if n.domain == MS:
                return "erf"
            return "tanh" if n.attrs.get("approximate", "none") == "tanh" else "erf"
    raise RewriteError("no GELU operator in the match")


def _rewrite(ctx: RewriteContext):
    form = gelu_form(ctx.match.nodes)
    x = ctx.value("x")
    bias = const_data(ctx.value("bias"))
    why = last_axis_bias(bias, ctx.label("bias_add").outputs[0], x)
    if why:
        raise RewriteError(why)
    assert bias is not None
    b = ctx.add_constant("bias_gelu_bias", bias.reshape(-1))
    if "reshape" in ctx.match.labels:
        node = ctx.label("reshape")
        out, n = node.outputs[0], bias.size
        target = const_data(node.inputs[1])
        last = out.shape[-1] if out.shape else None
        if not isinstance(last, int) and target is not None and target.size:
            last = int(target.reshape(-1)[-1])
        if last != n:
            raise RewriteError(f"the Reshape to %{out.name} may change the last axis")
        x = ctx.make_node("Reshape", [x, node.inputs[1]], dict(node.attrs)).outputs[0]
    op = "BiasGelu" if form == "erf" else "FastGelu"
    return ctx.make_node(op, [x, b], domain=MS).outputs


_p = PatternBuilder()
_add = _p.Add(_p.var("x"), bias_var(_p), _label="bias_add")
_h = _p.optional(_p.Reshape(_add, _p.var("shape"), _label="reshape"), _add)

PATTERN = (
    _p.Gelu(_h, _label="gelu", approximate=lambda a: a in ("none", "tanh"))
    | _p.op("Gelu", domain=MS)(_h, _label="gelu")
    | gelu_erf_pattern(_p, _h, "erf_")
    | gelu_tanh_pattern(_p, _h, "tanh_")
)

RULE = FusionRule(
    "bias_gelu",
    pattern=PATTERN,
    fuse_pattern="BiasGelu",
    priority=150,
    presets=("transformer",),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
