"""Gemm followed by an activation:

    y = act(alpha * op(A) @ op(B) + beta * C)      act: Relu | Sigmoid | Tanh | LeakyRelu
                                                        | HardSigmoid

``C`` may be absent. Native form: ``com.microsoft.FusedGemm(A, B[, C])`` with ``alpha``,
``beta``, ``transA``, ``transB`` copied, ``activation`` naming the activation and its
parameters as ``activation_alpha`` (LeakyRelu, HardSigmoid) and ``activation_beta``
(HardSigmoid), as onnxruntime's GemmActivationFusion writes them.
"""

from __future__ import annotations

from graph_autofusion.patterns.pattern import ATTR_DEFAULTS, PatternBuilder
from graph_autofusion.patterns.rewrite import RewriteContext
from graph_autofusion.patterns.rules import EPILOGUE_THRESHOLD, FusionRule

MS = "com.microsoft"

#: Activations FusedGemm runs, with their attributes and defaults (copied to activation_*).
ACTIVATIONS: dict[str, tuple[tuple[str, str, float], ...]] = {
    "Relu": (),
    "Sigmoid": (),
    "Tanh": (),
    "LeakyRelu": (("alpha", "activation_alpha", 0.01),),
    "HardSigmoid": (("alpha", "activation_alpha", 0.2), ("beta", "activation_beta", 0.5)),
}

#: Gemm attributes FusedGemm keeps.
GEMM_ATTRS = ("alpha", "beta", "transA", "transB")


def _rewrite(ctx: RewriteContext):
    gemm, act = ctx.label("gemm"), ctx.label("act")
    attrs = {k: gemm.attrs.get(k, ATTR_DEFAULTS[("Gemm", k)]) for k in GEMM_ATTRS}
    attrs["activation"] = act.op_type
    for src, dst, default in ACTIVATIONS[act.op_type]:
        attrs[dst] = float(act.attrs.get(src, default))
    ins = list(gemm.inputs)
    while ins and ins[-1] is None:
        ins.pop()
    return ctx.make_node("FusedGemm", ins, attrs, domain=MS).outputs


_p = PatternBuilder()
_gemm = _p.Gemm(_p.var("a"), _p.var("b"), _label="gemm", _exact=False)

RULE = FusionRule(
    "gemm_activation",
    pattern=_p.op(*ACTIVATIONS)(_gemm, _label="act"),
    fuse_pattern="FusedGemm",
    priority=140,
    # The native form keeps the contraction as it is and removes the epilogue's memory
    # pass: the saving is small next to the contraction's time, but any saving counts.
    benefit_threshold=EPILOGUE_THRESHOLD,
    presets=("transformer", "cnn"),
    rewrite=_rewrite,
    fused_domain=MS,
    doc=__doc__.strip().splitlines()[0],
)
