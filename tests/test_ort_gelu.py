"""The one-pass ``GeluErf`` / ``GeluTanh`` custom operators: the kernel against a float64
reference, inside onnxruntime against its own ``BiasGelu`` / ``Gelu`` / ``FastGelu``, and in
place of those in the fusions of a model fused with custom operators (checked, timed and rolled
back by safe mode like any fusion)."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess

import numpy as np
import pytest
from scipy.special import ndtr

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.ort_customop import DOMAIN, build_library, ort_include_dir
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.timing import use_timer
from graph_autofusion.testing.gelu_models import gelu_session
from tests.gelu_cases import assert_same_at_other_sizes, fuse_gelu_model, fused_twice_as_slow

pytestmark = pytest.mark.skipif(
    ort_include_dir() is None, reason="onnxruntime C API header not available"
)
MS = "com.microsoft"


def _library():
    return build_library([], gemv=True)


def _reference(v: np.ndarray, tanh: bool) -> np.ndarray:
    v = v.astype(np.float64)
    if tanh:
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
    return v * ndtr(v)


def _gelu(x: np.ndarray, bias: np.ndarray | None, tanh: bool) -> np.ndarray:
    fn = ctypes.CDLL(_library().path).gaf_gelu
    p, i = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes, fn.restype = [p, p, p, i, i, ctypes.c_int], None
    y = np.full_like(x, np.nan)
    b = None if bias is None else bias.ctypes.data
    fn(x.ctypes.data, b, y.ctypes.data, x.shape[0], x.shape[1], int(tanh))
    return y


@pytest.mark.parametrize("tanh", [False, True], ids=["erf", "tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (2, 17), (5, 3072), (1, 100003)])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_the_kernel_matches_a_float64_gelu(tanh, shape, with_bias):
    """Within 4e-7 (1 + |v|) of float64 everywhere, tails and every vector remainder
    included (the erf and tanh fits are good to 3.7e-7 and 3.0e-7 absolute)."""
    rng = np.random.default_rng(shape[1])
    x = (6 * rng.standard_normal(shape)).astype(np.float32)
    x.reshape(-1)[: min(x.size, 9)] = [0, -0.0, 1e-30, -1e-30, 3.9, -4.1, 40, -40, 8][: x.size]
    bias = rng.standard_normal(shape[1]).astype(np.float32) if with_bias else None
    y = _gelu(x, bias, tanh)
    v = x + bias if with_bias else x
    err = np.abs(y - _reference(v, tanh))
    assert np.all(err <= 4e-7 * (1 + np.abs(v))), float(np.max(err / (1 + np.abs(v))))


def test_large_negative_inputs_give_zero():
    """Both forms reach exactly 0 far left (the tanh fit is clamped to exactly 1)."""
    x = np.array([[-9.0, -30.0, -100.0, -1e4, -1e30]], np.float32)
    for tanh in (False, True):
        y = _gelu(x, None, tanh)
        assert np.all(y == 0), (tanh, y)


def test_the_gelu_loops_are_vectorized(tmp_path):
    """gcc vectorizes each of the four one-pass loops (the point of the operators: a clamp
    written as a nested select left gcc 12's loops scalar, 3.5-5.7x slower than onnxruntime's
    FastGelu, and safe mode rolled every GELU back). The library's own source and flags, with
    gcc's report of the loops it vectorized (whatever the vector width: AVX-512, AVX2, SSE)."""
    lib = _library()
    flags = lib.options.flags()
    cc = lib.options.compiler
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    if "Free Software Foundation" not in version:
        pytest.skip(f"{cc} is not gcc (-fopt-info is gcc's report)")
    lines = open(lib.source_path).read().splitlines()
    loops = [
        i + 1 for i, line in enumerate(lines) if "GAF_GE_LOOP(" in line and "#define" not in line
    ]
    assert len(loops) == 4, loops
    out = subprocess.run(
        [cc, *flags, "-fopt-info-vec-optimized", "-o", str(tmp_path / "k.so"), lib.source_path],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    done = {
        int(m.group(1)) for m in re.finditer(r":(\d+):\d+: optimized: loop vectorized", out.stderr)
    }
    assert not [n for n in loops if n not in done], [
        lines[n - 1].strip() for n in loops if n not in done
    ]


def test_the_kernel_propagates_nan():
    x = np.array([[1.0, np.nan, -2.0, np.nan] * 8], np.float32)
    for tanh in (False, True):
        y = _gelu(x, None, tanh)
        assert np.array_equal(np.isnan(y), np.isnan(x)), y


@pytest.mark.parametrize(
    "ours,theirs,with_bias",
    [("GeluErf", "BiasGelu", True), ("GeluErf", "Gelu", False), ("GeluTanh", "FastGelu", True)],
)
#: one chunk; many, on two threads; no rows
@pytest.mark.parametrize("shape", [(2, 5, 48), (3, 40, 1000), (0, 7)])
def test_inside_onnxruntime_it_computes_what_onnxruntimes_own_operator_does(
    ours, theirs, with_bias, shape
):
    rng = np.random.default_rng(len(shape))
    bias = rng.standard_normal(shape[-1]).astype(np.float32) if with_bias else None
    x = np.asarray(3 * rng.standard_normal(shape), np.float32)
    (got,) = gelu_session(ours, DOMAIN, shape, bias).run(None, {"x": x})
    (want,) = gelu_session(theirs, MS, shape, bias).run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * (1 + np.abs(x).max(initial=0)))


def test_a_scalar_as_onnxruntimes_gelu_computes_it():
    for v in (-3.0, 0.5, 7.0):
        x = np.asarray(v, np.float32)
        (got,) = gelu_session("GeluErf", DOMAIN, (), None).run(None, {"x": x})
        (want,) = gelu_session("Gelu", MS, (), None).run(None, {"x": x})
        assert got.shape == () and abs(float(got) - float(want)) < 4e-6


def test_a_bias_of_the_wrong_length_is_an_error_naming_the_operator():
    sess = gelu_session("GeluErf", DOMAIN, ("B", "N"), np.ones(8, np.float32))
    sess.run(None, {"x": np.ones((2, 8), np.float32)})
    with pytest.raises(Exception, match="GeluErf: bias must be 1-D, as long as x's last"):
        sess.run(None, {"x": np.ones((2, 9), np.float32)})


# MatMul + bias + erf GELU (bias_gelu) and a tanh GELU (gelu_tanh) after it
MODEL = """
model opset {"": 17}
graph g(%x: f32[B,S,64]) -> (%y) {
  init %w: f32[64,128] = randn(0)
  init %b: f32[128] = randn(1)
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  init %k: f32[] = [0.044715]
  init %r: f32[] = [0.7978845834732056]
  %m = MatMul(%x, %w)
  %a = Add(%m, %b)
  %s = Div(%a, %c)
  %e = Erf(%s)
  %a1 = Add(%e, %one)
  %mg = Mul(%a, %a1)
  %h = Mul(%mg, %half)
  %h2 = Mul(%h, %h)
  %h3 = Mul(%h2, %h)
  %t0 = Mul(%h3, %k)
  %t1 = Add(%h, %t0)
  %t2 = Mul(%t1, %r)
  %t3 = Tanh(%t2)
  %t4 = Add(%t3, %one)
  %t5 = Mul(%h, %t4)
  %y = Mul(%t5, %half)
}
"""


def _feeds(batch: int = 2, seq: int = 24, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, seq, 64)).astype(np.float32)}


def _fuse(custom_ops: bool, check_speed: bool = False) -> GraphAutoFusion:
    return fuse_gelu_model(MODEL, _feeds(), custom_ops, check_speed)


def _ops(gaf: GraphAutoFusion) -> list[str]:
    return sorted(n.qualified_op for n in gaf.result.model.graph.nodes if n.domain)


def test_with_custom_operators_the_gelu_fusions_run_the_one_pass_kernels(tmp_path):
    gaf = _fuse(custom_ops=True)
    assert _ops(gaf) == [f"{DOMAIN}::GeluErf", f"{DOMAIN}::GeluTanh"]
    by_rule = {low.rule: low for low in gaf.result.lowered}
    assert by_rule["bias_gelu"].fused_ops == [f"{DOMAIN}::GeluErf"]
    assert by_rule["gelu_tanh"].fused_ops == [f"{DOMAIN}::GeluTanh"]
    assert all(gaf.result.safety[k].passed for k in (low.key for low in gaf.result.lowered))
    path = str(tmp_path / "fused.onnx")
    gaf.save(path)
    manifest = json.loads(open(path + ".kernels/manifest.json").read())
    names = {op["name"] for op in manifest["operators"]}
    assert {"GeluErf", "GeluTanh"} <= names, names
    assert_same_at_other_sizes(MODEL, path, _feeds)


def test_without_custom_operators_onnxruntimes_own_gelus_stay():
    assert _ops(_fuse(custom_ops=False)) == [f"{MS}::BiasGelu", f"{MS}::FastGelu"]


def test_a_one_pass_gelu_that_times_slower_is_rolled_back():
    with use_timer(fused_twice_as_slow):
        gaf = _fuse(custom_ops=True, check_speed=True)
    assert {r.code for r in gaf.result.rolled_back} == {"slower"}
    assert {r.rule for r in gaf.result.rolled_back} == {"bias_gelu", "gelu_tanh"}
    assert not [n for n in gaf.result.model.graph.nodes if n.domain == DOMAIN]
    assert gaf.result.custom_ops is None  # no library needed by what is left


@pytest.mark.parametrize("dtype, swapped", [("f32", 1), ("f16", 0), ("untyped input", 1)])
def test_only_float32_gelus_are_swapped(dtype, swapped):
    """Ours take float32: an fp16 model's GELU stays onnxruntime's. An input of unknown type (a
    value a rewrite made in a graph of symbolic sizes) is judged by the output's."""
    from graph_autofusion.codegen.onnxruntime import Lowered
    from graph_autofusion.pipeline.ort_kernels import swap_gelus

    model = parse_model(
        f"""
model opset {{"": 17, "com.microsoft": 1}}
graph g(%x: {"f32" if dtype == "untyped input" else dtype}[2,8]) -> (%y) {{
  %y = com.microsoft::Gelu(%x) @gelu
}}
"""
    )
    (node,) = model.graph.nodes
    if dtype == "untyped input":
        node.inputs[0].dtype = None
        node.outputs[0].dtype = node.outputs[0].dtype or DType.FLOAT
    low = Lowered("gelu_erf@gelu", "gelu_erf", ["gelu"], [node], ["x"], ["y"], [node.qualified_op])
    assert swap_gelus(model, [low]) == swapped
    assert node.qualified_op == (f"{DOMAIN}::GeluErf" if swapped else f"{MS}::Gelu")
    assert low.fused_ops == [node.qualified_op]


def test_the_torch_routes_dynamic_graph_gets_them_too():
    """Dynamo's second graph (symbolic sizes, after a new shape) runs ours as its first did."""
    import torch

    from graph_autofusion.torch_compile import make_backend

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).eval()
    backend = make_backend(engine="onnxruntime", check_speed=False)
    compiled = torch.compile(lambda x: torch.nn.functional.gelu(lin(x)) * 1.5, backend=backend)
    with torch.no_grad():
        for shape in ((2, 30, 64), (3, 17, 64), (4, 9, 64)):
            x = torch.randn(*shape) * 3
            want = torch.nn.functional.gelu(lin(x)) * 1.5
            assert (compiled(x) - want).abs().max().item() < 1e-5
    torch._dynamo.reset()
    assert len(backend.config.graphs) == 2
    for graph in backend.config.graphs:
        ops = {n.qualified_op for n in graph.ort_result.model.graph.nodes}
        assert f"{DOMAIN}::GeluErf" in ops, (graph.index, ops)
