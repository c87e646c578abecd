"""MatMul, constant bias, activation (a linear layer with its activation):

    y = act(x @ W + bias)      act: Relu | Sigmoid | Tanh | LeakyRelu | HardSigmoid | Elu
                                    | Softplus | Gelu (ONNX or com.microsoft operator, or
                                    the decomposed erf / tanh forms) | SiLU x * sigmoid(x)

The matrix product may be a ``MatMul`` or a ``Gemm`` without ``C``; the bias is a constant
vector over the last axis (an initializer, ``Constant`` or ``Identity`` of one). A ``Reshape``
may sit between the bias add and the activation (the PyTorch frontend's GPT-2 computes the
linear layer on a 2-D view). Generic form only: onnxruntime has no single N-D operator for it.
"""

from __future__ import annotations

from graph_autofusion.patterns.library.gelu_erf import gelu_erf_pattern
from graph_autofusion.patterns.library.gelu_tanh import gelu_tanh_pattern
from graph_autofusion.patterns.library.matmul_bias import bias_var, check_bias
from graph_autofusion.patterns.pattern import Pattern, PatternBuilder
from graph_autofusion.patterns.rules import FusionRule

MS = "com.microsoft"

#: Single-operator activations (ONNX domain).
ACTIVATION_OPS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Elu", "Softplus", "Gelu")


def activation_pattern(p: PatternBuilder, h: Pattern) -> Pattern:
    """Any supported activation of ``h``; single operators are labelled ``act``."""
    return (
        p.op(*ACTIVATION_OPS)(h, _label="act")
        | p.op("Gelu", domain=MS)(h, _label="act")
        | gelu_erf_pattern(p, h, "erf_")
        | gelu_tanh_pattern(p, h, "tanh_")
        | p.Mul(h, p.Sigmoid(h, _label="silu_sigmoid"))
    )


_p = PatternBuilder()
_mm = _p.MatMul(_p.var("x"), _p.var("w"), _label="matmul") | _p.Gemm(
    _p.var("x"), _p.var("w"), _label="matmul"
)
_add = _p.Add(_mm, bias_var(_p), _label="bias_add")
_h = _p.optional(_p.Reshape(_add, _p.var("shape"), _label="reshape"), _add)

RULE = FusionRule(
    "matmul_bias_activation",
    pattern=activation_pattern(_p, _h),
    fuse_pattern="MatMulBiasActivation",
    priority=145,
    presets=("transformer", "cnn"),
    checks=(check_bias,),
    doc=__doc__.strip().splitlines()[0],
)
