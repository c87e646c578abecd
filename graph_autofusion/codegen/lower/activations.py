"""Activation operators with attributes (Gelu, LeakyRelu, Elu, Selu, Celu, HardSigmoid,
HardSwish, ThresholdedRelu, Mish, Softsign), each as elementwise instructions."""

from __future__ import annotations

from graph_autofusion.codegen.lower.builder import Builder
from graph_autofusion.ir.core import Node


def _act_gelu(b: Builder, node: Node, x: int) -> int:
    if node.attr("approximate", "none") == "tanh":
        inner = b.emit(
            "mul",
            (
                b.const(0.7978845608028654),
                b.emit(
                    "add",
                    (
                        x,
                        b.emit(
                            "mul", (b.const(0.044715), b.emit("mul", (x, b.emit("mul", (x, x)))))
                        ),
                    ),
                ),
            ),
        )
        t = b.emit("tanh", (inner,))
    else:
        t = b.emit("erf", (b.emit("mul", (x, b.const(0.7071067811865476))),))
    return b.emit("mul", (b.emit("mul", (x, b.const(0.5))), b.emit("add", (t, b.const(1.0)))))


def _act_leaky(b: Builder, node: Node, x: int) -> int:
    neg = b.emit("lt", (x, b.const(0.0)), "bool")
    return b.emit("where", (neg, b.emit("mul", (x, b.const(node.attr("alpha", 0.01)))), x))


def _act_elu(b: Builder, node: Node, x: int, alpha: float | None = None, scale: float = 1.0) -> int:
    alpha = node.attr("alpha", 1.0) if alpha is None else alpha
    neg = b.emit("lt", (x, b.const(0.0)), "bool")
    em1 = b.emit("sub", (b.emit("exp", (x,)), b.const(1.0)))
    r = b.emit("where", (neg, b.emit("mul", (em1, b.const(alpha))), x))
    return r if scale == 1.0 else b.emit("mul", (r, b.const(scale)))


def _act_selu(b: Builder, node: Node, x: int) -> int:
    return _act_elu(
        b,
        node,
        x,
        node.attr("alpha", 1.67326319217681884765625),
        node.attr("gamma", 1.05070102214813232421875),
    )


def _act_celu(b: Builder, node: Node, x: int) -> int:
    alpha = float(node.attr("alpha", 1.0))
    em1 = b.emit("sub", (b.emit("exp", (b.emit("div", (x, b.const(alpha))),)), b.const(1.0)))
    neg = b.emit("min", (b.const(0.0), b.emit("mul", (em1, b.const(alpha)))))
    return b.emit("add", (b.emit("max", (b.const(0.0), x)), neg))


def _act_hsig(
    b: Builder, node: Node, x: int, alpha: float | None = None, beta: float | None = None
) -> int:
    alpha = node.attr("alpha", 0.2) if alpha is None else alpha
    beta = node.attr("beta", 0.5) if beta is None else beta
    y = b.emit("add", (b.emit("mul", (x, b.const(alpha))), b.const(beta)))
    return b.emit("max", (b.const(0.0), b.emit("min", (b.const(1.0), y))))


def _act_hswish(b: Builder, node: Node, x: int) -> int:
    return b.emit("mul", (x, _act_hsig(b, node, x, 1.0 / 6.0, 0.5)))


def _act_thresholded(b: Builder, node: Node, x: int) -> int:
    keep = b.emit("gt", (x, b.const(node.attr("alpha", 1.0))), "bool")
    return b.emit("where", (keep, x, b.const(0.0)))


def _act_mish(b: Builder, node: Node, x: int) -> int:
    return b.emit("mul", (x, b.emit("tanh", (b.emit("softplus", (x,)),))))


def _act_softsign(b: Builder, node: Node, x: int) -> int:
    return b.emit("div", (x, b.emit("add", (b.const(1.0), b.emit("abs", (x,))))))


ACTIVATIONS = {
    "Gelu": _act_gelu,
    "LeakyRelu": _act_leaky,
    "Elu": _act_elu,
    "Selu": _act_selu,
    "Celu": _act_celu,
    "HardSigmoid": _act_hsig,
    "HardSwish": _act_hswish,
    "ThresholdedRelu": _act_thresholded,
    "Mish": _act_mish,
    "Softsign": _act_softsign,
}
