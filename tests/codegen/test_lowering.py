"""Lowering of named fusion groups into kernels: structure, numerics against torch, refusals
with reason codes, dynamic shapes, strided inputs, the MatMul epilogue."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_autofusion.codegen.compiler import compile_library
from graph_autofusion.codegen.kernel_ir import ROW
from graph_autofusion.codegen.lower import KernelReason, KernelRefused, lower_group
from graph_autofusion.codegen.reference import run_reference
from graph_autofusion.ir.text import parse_model
from graph_autofusion.pipeline.cpu import finalize_kernel
from graph_autofusion.runtime.cpu_runtime import kernel_step
from graph_autofusion.runtime.kernels import load_library
from graph_autofusion.runtime.torch_runtime import TorchRunner, infer_shapes

GROUPS = {
    "layernorm_residual": """
graph g(%x: f32[2,8,64], %r: f32[2,8,64]) -> (%y, %s) {
  init %gamma: f32[64] = randn(1)
  init %beta: f32[64] = randn(2)
  %s = Add(%x, %r)
  %y = LayerNormalization<axis=-1, epsilon=1e-5>(%s, %gamma, %beta)
}""",
    "rmsnorm_decomposed": """
graph g(%x: f32[2,8,64]) -> (%y) {
  init %w: f32[64] = randn(3)
  init %two: f32[] = [2.0]
  init %eps: f32[] = [1e-6]
  init %one: f32[] = [1.0]
  %p = Pow(%x, %two)
  %m = ReduceMean<axes=[-1], keepdims=1>(%p)
  %a = Add(%m, %eps)
  %q = Sqrt(%a)
  %r = Div(%one, %q)
  %n = Mul(%x, %r)
  %y = Mul(%w, %n)
}""",
    "scale_mask_softmax": """
graph g(%s: f32[1,4,16,16], %mask: f32[1,1,1,16]) -> (%p) {
  init %scale: f32[] = [0.125]
  %d = Mul(%s, %scale)
  %a = Add(%d, %mask)
  %p = Softmax<axis=-1>(%a)
}""",
    "bias_gelu_erf": """
graph g(%x: f32[4,128]) -> (%y) {
  init %b: f32[128] = randn(4)
  init %sq2: f32[] = [1.4142135623730951]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  %h = Add(%x, %b)
  %d = Div(%h, %sq2)
  %e = Erf(%d)
  %p = Add(%e, %one)
  %m = Mul(%h, %p)
  %y = Mul(%m, %half)
}""",
    "gelu_tanh": """
graph g(%x: f32[4,128]) -> (%y) {
  %y = Gelu<approximate="tanh">(%x)
}""",
    "swiglu": """
graph g(%gate: f32[1,16,172], %up: f32[1,16,172]) -> (%y) {
  %s = Sigmoid(%gate)
  %silu = Mul(%gate, %s)
  %y = Mul(%silu, %up)
}""",
    "transposed_input": """
graph g(%x: f32[8,32], %t: f32[32,8]) -> (%y) {
  %tt = Transpose<perm=[1, 0]>(%t)
  %a = Add(%x, %tt)
  %y = Tanh(%a)
}""",
    "rotary_half_split": """
graph g(%x: f32[1,4,16,64], %cos: f32[1,1,16,64], %sin: f32[1,1,16,64]) -> (%y) {
  init %zero: i64[1] = [0]
  init %half: i64[1] = [32]
  init %big: i64[1] = [9223372036854775807]
  init %last: i64[1] = [-1]
  %x1 = Slice(%x, %zero, %half, %last)
  %x2 = Slice(%x, %half, %big, %last)
  %n2 = Neg(%x2)
  %rot = Concat<axis=-1>(%n2, %x1)
  %a = Mul(%x, %cos)
  %c = Mul(%rot, %sin)
  %y = Add(%a, %c)
}""",
    "transpose_of_a_computed_value": """
graph g(%x: f32[4,8,16], %z: f32[4,16,8]) -> (%y) {
  init %b: f32[16] = randn(7)
  %a = Add(%x, %b)
  %e = Exp(%a)
  %t = Transpose<perm=[0, 2, 1]>(%e)
  %m = Mul(%t, %z)
  %y = Tanh(%m)
}""",
    "reshape_then_slice_of_computed_values": """
graph g(%x: f32[2,6,8]) -> (%y) {
  init %s: i64[3] = [2, 48, 1]
  init %st: i64[1] = [4]
  init %en: i64[1] = [40]
  init %ax: i64[1] = [1]
  %a = Sigmoid(%x)
  %r = Reshape(%a, %s)
  %c = Slice(%r, %st, %en, %ax)
  %y = Neg(%c)
}""",
    "flatten_at_rank_output_view": """
graph g(%x: f32[3,16]) -> (%c, %y) {
  %c = Relu(%x)
  %y = Flatten<axis=2>(%c)
}""",
    "reduce_axis0_no_keepdims": """
graph g(%x: f32[6,5,7]) -> (%y) {
  %e = Exp(%x)
  %y = ReduceSum<axes=[0], keepdims=0>(%e)
}""",
}


def _build(text: str):
    m = parse_model(text)
    g = m.graph
    feeds = {}
    rng = np.random.default_rng(0)
    for v in g.inputs:
        feeds[v.name] = rng.standard_normal(v.shape).astype(np.float32)
    return m, feeds


def _kernel(m, feeds, opset=20):
    g = m.graph
    low = lower_group(g.nodes, list(g.outputs), None, opset=opset)
    shapes = [
        feeds[i.name].shape if i.name in feeds else g.initializers[i.name].const.shape
        for i in low.kernel.inputs
    ]
    return low, finalize_kernel(low.kernel, shapes)


def _values(m, feeds, kernel):
    g = m.graph
    return [
        feeds[i.name] if i.name in feeds else g.initializers[i.name].const for i in kernel.inputs
    ]


@pytest.fixture(scope="module")
def compiled():
    built = {}
    for name, text in GROUPS.items():
        m, feeds = _build(text)
        low, k = _kernel(m, feeds)
        built[name] = (m, feeds, k)
    lib = load_library(compile_library([k for _, _, k in built.values()]))
    return built, lib


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_group_kernel_equals_the_operators_in_torch(compiled, name):
    built, lib = compiled
    m, feeds, k = built[name]
    want = TorchRunner(m).run({n: torch.from_numpy(v) for n, v in feeds.items()})
    got = lib.kernel(k.name)(
        *[torch.from_numpy(np.ascontiguousarray(a)) for a in _values(m, feeds, k)]
    )
    for o, t in zip(k.outputs, got):
        np.testing.assert_allclose(t.numpy(), want[o.name].numpy(), rtol=2e-5, atol=2e-5)
    for a, b in zip(got, run_reference(k, _values(m, feeds, k))):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-5)


def test_one_kernel_per_group_with_the_right_structure(compiled):
    built, _ = compiled
    ln = built["layernorm_residual"][2]
    assert ln.reduce_axes == (2,) and len(ln.outputs) == 2
    assert sum(b.op == "reduce" for b in ln.body) == 2  # mean, variance
    sm = built["scale_mask_softmax"][2]
    assert [b.attr("kind") for b in sm.body if b.op == "reduce"] == ["max", "sum"]
    red = built["reduce_axis0_no_keepdims"][2]
    assert red.reduce_axes == (0,) and red.outputs[0].level == ROW
    assert not red.outputs[0].keepdims
    rot = built["rotary_half_split"][2]
    assert rot.concat is not None and sum(i.branch is not None for i in rot.inputs) == 2
    view = built["transposed_input"][2]
    assert [v.op for v in view.inputs[1].views] == ["transpose"]


def test_dynamic_shapes_one_kernel_serves_every_size(compiled):
    """Sizes are run-time arguments: the LayerNorm kernel compiled for [2, 8, 64] runs on
    other batch, sequence and hidden sizes (its rank and broadcast signature)."""
    built, lib = compiled
    m, _, k = built["layernorm_residual"]
    fn = lib.kernel(k.name)
    g = m.graph
    for shape in [(1, 1, 64), (3, 7, 64), (1, 5, 96)]:
        x = torch.randn(shape)
        r = torch.randn(shape)
        gamma = torch.randn(shape[-1])
        beta = torch.randn(shape[-1])
        args = {"x": x, "r": r, "gamma": gamma, "beta": beta}
        y, s = fn(*[args[i.name] for i in k.inputs])
        want = torch.nn.functional.layer_norm(x + r, (shape[-1],), gamma, beta, 1e-5)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(s, x + r)
    assert g is m.graph


def test_strided_and_broadcast_inputs_take_the_generic_variant(compiled):
    built, lib = compiled
    _, _, k = built["swiglu"]
    fn = lib.kernel(k.name)
    base = torch.randn(1, 16, 344)
    gate, up = base[..., ::2], base[..., 1::2]  # inner stride 2: not what the fast path has
    (y,) = fn(gate, up)
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up)
    plan = list(fn._plans.values())[-1]  # the plan of this call's strides
    assert not plan.fast
    (y2,) = fn(gate.contiguous(), up.contiguous())
    torch.testing.assert_close(y2, y)


def test_half_and_bfloat16_inputs_compute_in_fp32_inside():
    text = GROUPS["layernorm_residual"].replace("f32[2,8,64]", "f16[2,8,64]")
    text = text.replace("f32[64]", "f16[64]")
    m = parse_model(text)
    infer_shapes(m)
    low = lower_group(m.graph.nodes, list(m.graph.outputs), None)
    k = finalize_kernel(low.kernel, [(2, 8, 64), (2, 8, 64), (64,), (64,)])
    assert [i.dtype for i in k.inputs] == ["f16"] * 4 and k.outputs[0].dtype == "f16"
    fn = load_library(compile_library([k])).kernel(k.name)
    x, r = torch.randn(2, 8, 64).half(), torch.randn(2, 8, 64).half()
    gamma, beta = torch.randn(64).half(), torch.randn(64).half()
    y, _ = fn(x, r, gamma, beta)
    want = torch.nn.functional.layer_norm((x + r).float(), (64,), gamma.float(), beta.float())
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), want, rtol=2e-3, atol=4e-3)


def test_matmul_epilogue_runs_the_gemm_in_torch_then_one_pass():
    m = parse_model("""
graph g(%x: f32[4,32]) -> (%y) {
  init %w: f32[32,16] = randn(5)
  init %b: f32[16] = randn(6)
  %mm = MatMul(%x, %w)
  %a = Add(%mm, %b)
  %y = Relu(%a)
}""")
    g = m.graph
    low = lower_group(g.nodes, [g.outputs[0]], None)
    assert [n.op_type for n in low.prologue] == ["MatMul"]
    k = finalize_kernel(low.kernel, [(4, 16), (16,)])
    fn = load_library(compile_library([k])).kernel(k.name)
    step = kernel_step(fn, ["x", "w", "b"], low.prologue, 20)
    x = torch.randn(4, 32)
    w = torch.from_numpy(g.initializers["w"].const)
    b = torch.from_numpy(g.initializers["b"].const)
    torch.testing.assert_close(step(None, x, w, b), torch.relu(x @ w + b))


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (
            """graph g(%x: f32[4,8]) -> (%y) {
  init %b: f32[8] = randn(1)
  init %s: i64[1] = [32]
  %a = Add(%x, %b)
  %t = Reshape(%a, %s)
  %y = Relu(%t)
}""",
            KernelReason.LAYOUT_INSIDE,
        ),
        (
            """graph g(%x: i64[4,8], %z: i64[4,8]) -> (%y) {
  %y = Div(%x, %z)
}""",
            KernelReason.UNSUPPORTED_DTYPE,
        ),
        (
            """graph g(%x: f32[4,8]) -> (%y) {
  init %w: f32[8,8] = randn(1)
  %a = Relu(%x)
  %y = MatMul(%a, %w)
}""",
            KernelReason.CONTRACTION,
        ),
        (
            """graph g(%x: f64[4,8]) -> (%y) {
  %y = Relu(%x)
}""",
            KernelReason.UNSUPPORTED_DTYPE,
        ),
        (
            """graph g(%x: f32[4,8]) -> (%y, %m) {
  %m = ReduceMax<axes=[1], keepdims=1>(%x)
  %s = ReduceSum<axes=[0], keepdims=1>(%x)
  %y = Add(%m, %s)
}""",
            KernelReason.REDUCTION_MISMATCH,
        ),
        (
            """graph g(%x: f32[4,8]) -> (%y) {
  %y = TopK(%x)
}""",
            KernelReason.UNSUPPORTED_OP,
        ),
    ],
)
def test_unsupported_groups_are_refused_with_a_reason_code(text, code):
    m = parse_model(text)
    with pytest.raises(KernelRefused) as info:
        lower_group(m.graph.nodes, list(m.graph.outputs), None)
    assert info.value.code == code
    assert info.value.message


def test_outputs_are_reused_only_when_nothing_references_them(compiled):
    """A call reuses an earlier output tensor when neither it nor any view of its storage is
    alive (no page faults on every call of a large kernel); never while something reads it."""
    built, lib = compiled
    _, _, k = built["gelu_tanh"]
    fn = lib.kernel(k.name)
    x = torch.randn(4, 128)
    fn(x)  # builds the call plan
    (a,) = fn(x)
    ptr = a.data_ptr()
    del a
    (b,) = fn(x)
    assert b.data_ptr() == ptr  # reused: nothing held it
    view = b.view(-1)
    kept = b.data_ptr()
    del b
    (c,) = fn(x)
    assert c.data_ptr() != kept  # a view still reads the storage
    arr = c.numpy()
    (d,) = fn(x)
    assert not np.shares_memory(arr, d.numpy())
    torch.testing.assert_close(view.view(4, 128), d)
