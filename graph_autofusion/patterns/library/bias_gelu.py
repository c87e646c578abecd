"""Bias add followed by GELU, in any spelling:

    y = gelu(x + bias)        bias: a constant broadcast over the last axis

The GELU may be one ``Gelu`` operator (ONNX, ``approximate`` ``none`` or ``tanh``), a
``com.microsoft.Gelu``, or the decomposed erf or tanh form (see ``gelu_erf`` and
``gelu_tanh``). A ``Reshape`` that keeps the last axis may sit between the bias add and the
GELU (the PyTorch frontend's GPT-2 adds the bias on the 2-D ``[batch*seq, hidden]`` view, then
reshapes). Native form: the erf GELU becomes ``com.microsoft.BiasGelu(x, bias)``, the tanh
GELU ``com.microsoft.FastGelu(x, bias)``; both need the bias as a 1-D tensor over the last axis
(a bias of shape ``[1, .., 1, N]`` is flattened), else the match stays unfused.

The bias may also be the ``C`` input of a ``Gemm`` (TorchScript exports GPT-2's ``Conv1D`` as
``Gemm(x, W, b)``): then the match takes in the Gemm, and the native form is the Gemm without
``C`` followed by ``FastGelu``/``BiasGelu`` with the bias.
"""

from __future__ import annotations

from graph_autofusion.patterns.library.gelu_erf import gelu_erf_pattern
from graph_autofusion.patterns.library.gelu_tanh import gelu_tanh_pattern
from graph_autofusion.patterns.library.matmul_bias import bias_var, last_axis_bias
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError
from graph_autofusion.patterns.rules import EPILOGUE_THRESHOLD, FusionRule

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
    bias = const_value(ctx.value("bias"))
    if "bias_gemm" in ctx.match.labels:
        gemm = ctx.label("bias_gemm")
        w = gemm.inputs[1]
        n = None
        if w is not None and w.shape is not None and len(w.shape) == 2:
            n = w.shape[0] if gemm.attrs.get("transB", 0) else w.shape[1]
        if bias is None or not isinstance(n, int) or bias.size != n or bias.shape[-1] != n:
            raise RewriteError(f"Gemm bias is not a vector over the {n} output columns")
        attrs = {k: v for k, v in gemm.attrs.items() if k != "beta"}
        x = ctx.make_node("Gemm", list(gemm.inputs[:2]), attrs).outputs[0]
    else:
        x = ctx.value("x")
        why = last_axis_bias(bias, ctx.label("bias_add").outputs[0], x)
        if why:
            raise RewriteError(why)
    assert bias is not None
    b = ctx.add_constant("bias_gelu_bias", bias.reshape(-1))
    if "reshape" in ctx.match.labels:
        node = ctx.label("reshape")
        out, n = node.outputs[0], bias.size
        target = const_value(node.inputs[1])
        last = out.shape[-1] if out.shape else None
        if not isinstance(last, int) and target is not None and target.size:
            last = int(target.reshape(-1)[-1])
        if last != n:
            raise RewriteError(f"the Reshape to %{out.name} may change the last axis")
        x = ctx.make_node("Reshape", [x, node.inputs[1]], dict(node.attrs)).outputs[0]
    op = "BiasGelu" if form == "erf" else "FastGelu"
    return ctx.make_node(op, [x, b], domain=MS).outputs


_p = PatternBuilder()
_add = _p.Add(_p.var("x"), bias_var(_p), _label="bias_add") | _p.Gemm(
    _p.var("a"), _p.var("w"), bias_var(_p), _label="bias_gemm"
)
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
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("transformer",),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
