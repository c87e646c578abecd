"""qkv_horizontal: sibling projections of one input fuse (generic and native); a lone
projection, a non-constant weight and an MLP gate do not."""

from __future__ import annotations

import pytest

from graph_autofusion.patterns.library.qkv_horizontal import RULE
from graph_autofusion.patterns.matcher import Reason, const_value
from graph_autofusion.testing.rules import check_no_match, check_rule

FUSED = "graph_autofusion.fused::QKVProjection"


def _graph(widths, *, bias=True, opset=18, bias_via_identity=False):
    """x[2,5,16] projected by len(widths) sibling MatMuls (+ bias), one output per branch."""
    outs = ", ".join(f"%y{i}" for i in range(len(widths)))
    lines = [f'model opset {{"": {opset}}}', f"graph g(%x: f32[2,5,16]) -> ({outs}) {{"]
    body = []
    for i, n in enumerate(widths):
        lines.append(f"  init %w{i}: f32[16,{n}] = randn({i})")
        has_bias = bias if isinstance(bias, bool) else bias[i]
        if has_bias:
            lines.append(f"  init %b{i}: f32[{n}] = randn({10 + i})")
            src = f"%b{i}"
            if bias_via_identity:
                body.append(f"  %bi{i} = Identity(%b{i})")
                src = f"%bi{i}"
            body.append(f"  %m{i} = MatMul(%x, %w{i})")
            args = f"%m{i}, {src}" if i % 2 == 0 else f"{src}, %m{i}"  # both operand orders
            body.append(f"  %y{i} = Add({args})")
        else:
            body.append(f"  %y{i} = MatMul(%x, %w{i})")
    return "\n".join(lines + body + ["}"]) + "\n"


NATIVE_BIAS = ["MatMul", "Add", "Split"]
VARIANTS = {
    "qkv_bias": dict(widths=[8, 8, 8]),
    "qkv_no_bias": dict(widths=[8, 8, 8], bias=False),
    "two_branches": dict(widths=[12, 12]),
    "gqa_unequal_widths": dict(widths=[16, 4, 4], bias=False),
    "mixed_bias": dict(widths=[8, 4, 4], bias=[True, False, True]),
    "opset_11_split_attribute": dict(widths=[8, 8, 8], opset=11),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("native", [False, True])
def test_every_variant_matches_and_rewrites(variant, native):
    spec = VARIANTS[variant]
    has_bias = spec.get("bias", True) is not False
    if native:
        ops = NATIVE_BIAS if has_bias else ["MatMul", "Split"]
    else:
        ops = [FUSED]
    model = check_rule(RULE, _graph(**spec), matches=1, ops_after=ops, native=native)
    fused = model.graph.nodes[-1]
    assert len(fused.outputs) == len(spec["widths"])
    if native:
        if spec.get("opset") == 11:
            assert fused.attrs["split"] == spec["widths"] and len(fused.inputs) == 1
        else:
            assert const_value(fused.inputs[1]).tolist() == spec["widths"]


def test_torchscript_identity_biases_match():
    text = _graph([8, 8, 8], bias_via_identity=True)
    # the dead Identity nodes of the other branches' biases stay (dead-code removal is later)
    ops = ["Identity", *NATIVE_BIAS, "Identity", "Identity"]
    check_rule(RULE, text, matches=1, ops_after=ops, native=True)


def test_a_single_projection_is_not_horizontal():
    check_no_match(RULE, _graph([8]), reason=Reason.HORIZONTAL)


def test_non_constant_weights_are_rejected():
    text = (
        _graph([8, 8])
        .replace("init %w0: f32[16,8] = randn(0)\n", "")
        .replace("init %w1: f32[16,8] = randn(1)\n", "")
    )
    text = text.replace("%x: f32[2,5,16]", "%x: f32[2,5,16], %w0: f32[16,8], %w1: f32[16,8]")
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


def test_an_mlp_gate_is_not_a_branch():
    # SwiGLU: silu(x @ Wg) * (x @ Wu): the gate feeds Sigmoid, so only one branch is left
    text = _graph([8, 8], bias=False).replace("-> (%y0, %y1)", "-> (%z)").removesuffix("}\n")
    text += "  %s = Sigmoid(%y0)\n  %g = Mul(%y0, %s)\n  %z = Mul(%g, %y1)\n}\n"
    check_no_match(RULE, text, reason=Reason.CHECK_FAILED)


def test_one_weight_not_constant_leaves_the_others_fused():
    text = _graph([8, 8, 8]).replace("init %w2: f32[16,8] = randn(2)\n", "")
    text = text.replace("%x: f32[2,5,16]", "%x: f32[2,5,16], %w2: f32[16,8]")
    check_rule(
        RULE, text, matches=1, ops_after=["MatMul", "Add", "Split", "MatMul", "Add"], native=True
    )


def test_transposed_parameter_views_are_not_concatenated():
    """The PyTorch route's linear weights are transposed views of the module's parameters
    (read in place, F-contiguous): the native rewrite declines instead of copying them."""
    import numpy as np

    from graph_autofusion.ir.text import parse_model
    from graph_autofusion.patterns.candidates import apply_matches, match_rules
    from graph_autofusion.patterns.rules import RuleSet

    model = parse_model(_graph([8, 8, 8], bias=False))
    for i in range(3):
        w = model.graph.initializers[f"w{i}"]
        w.const = np.ascontiguousarray(w.const.T).T  # same numbers, a parameter's [N, K] memory
    report = match_rules(model.graph, RuleSet((RULE,)))
    assert report.per_rule[RULE.name].kept == 1  # it matches: the decline is the rewrite's
    (applied,) = apply_matches(model, report.kept, native=True)
    assert applied.error and "copy" in str(applied.error)
    assert [n.op_type for n in model.graph.nodes] == ["MatMul"] * 3


@pytest.mark.slow
@pytest.mark.parametrize("source", ["dynamo", "torchscript", "torch"])
@pytest.mark.parametrize(
    ("model", "count"),
    [
        ("bert", 12),
        ("minilm", 6),
        ("llama", 4),  # the MLP's gate/up pair is left to swiglu (the gate feeds Sigmoid)
        ("llama_gqa", 4),
        ("gpt2", 0),  # one fused c_attn projection, then a Split
        ("resnet50", 0),
    ],
)
def test_zoo_models(model, source, count):
    from graph_autofusion.testing.rules import zoo_matches

    assert zoo_matches(RULE, model, source) == count
