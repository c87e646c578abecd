"""GELU nodes no fusion takes run the one-pass ``GeluErf`` / ``GeluTanh`` with custom
operators on (``graph_autofusion.codegen.ort_gelu_sites``): each its own fusion, checked, timed,
rolled back when slower; fp16 ones and those a fusion takes are left alone."""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.ort_customop import DOMAIN, ort_include_dir
from graph_autofusion.codegen.ort_gelu_sites import our_gelu, plan_gelu_sites
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.text import parse_model
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.runtime.timing import use_timer
from tests.gelu_cases import assert_same_at_other_sizes, fuse_gelu_model, fused_twice_as_slow

pytestmark = pytest.mark.skipif(
    ort_include_dir() is None, reason="onnxruntime C API header not available"
)
MS = "com.microsoft"

# a bias-free linear layer's tanh GELU (Gemma's MLP), an erf GELU of the input, and
# onnxruntime's own FastGelu with its bias (a model its optimizer already rewrote)
MODEL = """
model opset {"": 20, "com.microsoft": 1}
graph g(%x: f32[?,?,64]) -> (%y) {
  init %w: f32[64,96] = randn(1)
  init %w2: f32[96,64] = randn(2)
  init %b: f32[96] = randn(3)
  %h = MatMul(%x, %w)
  %g = Gelu<approximate="tanh">(%h) @gelu_tanh_node
  %f = com.microsoft::FastGelu(%h, %b) @fast_node
  %s = Add(%g, %f)
  %o = MatMul(%s, %w2)
  %e = Gelu(%x) @gelu_erf_node
  %y = Add(%o, %e)
}
"""


def _feeds(batch: int = 2, seq: int = 24, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": (2 * rng.standard_normal((batch, seq, 64))).astype(np.float32)}


def _fuse(custom_ops: bool, check_speed: bool = False) -> GraphAutoFusion:
    return fuse_gelu_model(MODEL, _feeds(), custom_ops, check_speed)


def _ours(gaf: GraphAutoFusion) -> list[str]:
    return sorted(n.qualified_op for n in gaf.result.model.graph.nodes if n.domain == DOMAIN)


def test_lone_gelus_run_ours_and_compute_what_onnxruntime_does(tmp_path):
    gaf = _fuse(custom_ops=True)
    assert _ours(gaf) == [f"{DOMAIN}::GeluErf", f"{DOMAIN}::GeluTanh", f"{DOMAIN}::GeluTanh"]
    sites = {low.key: low for low in gaf.result.lowered if low.rule == "gelu_kernel"}
    assert set(sites) == {
        "gelu_kernel@gelu_tanh_node",
        "gelu_kernel@fast_node",
        "gelu_kernel@gelu_erf_node",
    }
    assert sites["gelu_kernel@gelu_erf_node"].fused_ops == [f"{DOMAIN}::GeluErf"]
    assert all(gaf.result.safety[k].passed for k in sites)
    path = str(tmp_path / "fused.onnx")
    gaf.save(path)
    assert_same_at_other_sizes(MODEL, path, _feeds)


def test_without_custom_operators_the_gelus_stay_onnxruntimes():
    gaf = _fuse(custom_ops=False)
    assert _ours(gaf) == []
    assert not [low for low in gaf.result.lowered if low.rule == "gelu_kernel"]


def test_a_lone_gelu_that_times_slower_is_rolled_back():
    with use_timer(fused_twice_as_slow):
        gaf = _fuse(custom_ops=True, check_speed=True)
    back = [r for r in gaf.result.rolled_back if r.rule == "gelu_kernel"]
    assert len(back) == 3 and {r.code for r in back} == {"slower"}
    assert _ours(gaf) == []
    ops = {n.qualified_op for n in gaf.result.model.graph.nodes}
    assert {"Gelu", f"{MS}::FastGelu"} <= ops


@pytest.mark.parametrize(
    "node, op",
    [
        ("Gelu(%x)", "GeluErf"),
        ('Gelu<approximate="tanh">(%x)', "GeluTanh"),
        ("com.microsoft::Gelu(%x)", "GeluErf"),
        ("com.microsoft::BiasGelu(%x, %b)", "GeluErf"),
        ("com.microsoft::FastGelu(%x)", "GeluTanh"),
        ("com.microsoft::FastGelu(%x, %c)", None),  # a bias not over the last axis
        ("Gelu(%h)", None),  # fp16
        ("Relu(%x)", None),
    ],
)
def test_which_nodes_are_sites(node, op):
    model = parse_model(
        f"""
model opset {{"": 20, "com.microsoft": 1}}
graph g(%x: f32[2,8], %h: f16[2,8]) -> (%y) {{
  init %b: f32[8] = randn(1)
  init %c: f32[2] = randn(2)
  %y = {node}
}}
"""
    )
    (n,) = model.graph.nodes
    assert our_gelu(n) == op


def test_a_gelu_a_fusion_takes_is_not_also_a_site():
    """``bias_gelu`` takes the Add and the Gelu: one lowering, the fusion's, runs ours."""
    text = """
model opset {"": 20}
graph g(%x: f32[?,64]) -> (%y) {
  init %w: f32[64,64] = randn(1)
  init %b: f32[64] = randn(2)
  %m = MatMul(%x, %w)
  %a = Add(%m, %b)
  %y = Gelu(%a) @g
}
"""
    typed = parse_model(text)
    for n in typed.graph.nodes:  # the pipeline's binding types every value
        n.outputs[0].dtype = DType.FLOAT
    assert [s.key for s in plan_gelu_sites(typed)] == ["gelu_kernel@g"]  # a site before fusion
    gaf = fuse_gelu_model(text, {"x": np.ones((4, 64), np.float32)}, custom_ops=True)
    rules = [low.rule for low in gaf.result.lowered]
    assert "bias_gelu" in rules and "gelu_kernel" not in rules, rules
    assert _ours(gaf) == [f"{DOMAIN}::GeluErf"]


def test_the_torch_route_runs_ours_for_a_bias_free_mlp():
    """``torch.compile``: F.gelu after a linear layer without bias (no fusion takes it)."""
    import torch

    from graph_autofusion.torch_compile import make_backend

    torch.manual_seed(0)
    gate = torch.nn.Linear(64, 128, bias=False).eval()
    up = torch.nn.Linear(64, 128, bias=False).eval()

    def mlp(x):
        return torch.nn.functional.gelu(gate(x), approximate="tanh") * up(x)

    backend = make_backend(engine="onnxruntime", check_speed=False)
    compiled = torch.compile(mlp, backend=backend)
    with torch.no_grad():
        x = torch.randn(1, 20, 64)
        assert (compiled(x) - mlp(x)).abs().max().item() < 1e-5
    torch._dynamo.reset()
    (graph,) = backend.config.graphs
    ops = {n.qualified_op for n in graph.ort_result.model.graph.nodes}
    assert f"{DOMAIN}::GeluTanh" in ops, ops


def test_a_gelu_whose_input_the_graph_leaves_untyped_is_a_site_by_the_samples_types():
    """After another contrib operator (a model onnxruntime's optimizer rewrote) ONNX shape
    inference gives the GELU's input no type; the sample inputs' types decide. A bias over a
    symbolic last dim counts by the sample's size."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    w = nh.from_array((0.2 * rng.standard_normal((64, 96))).astype(np.float32), "w")
    b = nh.from_array(rng.standard_normal(96).astype(np.float32), "b")
    c = nh.from_array(rng.standard_normal(40).astype(np.float32), "c")
    nodes = [
        h.make_node("FusedMatMul", ["x", "w"], ["m"], domain=MS, name="fmm", alpha=1.0),
        h.make_node("FastGelu", ["m", "b"], ["g"], domain=MS, name="untyped"),
        h.make_node("BiasGelu", ["z", "c"], ["e"], domain=MS, name="symbolic_last"),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [
            h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", 64]),
            h.make_tensor_value_info("z", TP.FLOAT, ["R", "C"]),
        ],
        [
            h.make_tensor_value_info("g", TP.FLOAT, ["B", "S", 96]),
            h.make_tensor_value_info("e", TP.FLOAT, ["R", "C"]),
        ],
        initializer=[w, b, c],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    model.ir_version = 9
    feeds = {
        "x": rng.standard_normal((2, 8, 64)).astype(np.float32),
        "z": rng.standard_normal((3, 40)).astype(np.float32),
    }
    gaf = GraphAutoFusion(model, sample_inputs=feeds, clustering=False)
    gaf.options = gaf.options.replace(custom_ops=True)
    gaf.fuse(check_speed=False)
    keys = {low.key for low in gaf.result.lowered if low.rule == "gelu_kernel"}
    assert keys == {"gelu_kernel@untyped", "gelu_kernel@symbolic_last"}
    want = ort_session(model.SerializeToString(), "all").run(None, feeds)
    got = ort_session(gaf.result.model, "all").run(None, feeds)
    for a, b_ in zip(got, want):
        np.testing.assert_allclose(a, b_, rtol=0, atol=2e-6 * float(np.abs(b_).max()))


def test_a_saved_plan_applies_its_gelu_sites_without_calling_them_unmatched():
    """``fuse_model(keys=...)`` (what ``load_fused`` and saved plans do): the sites' keys are
    the custom-operator stage's, not the planner's candidates; no 'matches nothing' note."""
    from graph_autofusion.pipeline import fuse_model

    gaf = _fuse(custom_ops=True)
    keys = [low.key for low in gaf.result.lowered]
    assert any(k.startswith("gelu_kernel@") for k in keys)
    again = fuse_model(
        parse_model(MODEL), gaf.rules, "x86_avx2", options=gaf.options, feeds=_feeds(), keys=keys
    )
    assert sorted(low.key for low in again.lowered) == sorted(keys)
    assert not [n for n in again.notes if "match nothing" in n], again.notes


def test_a_gelu_with_a_computed_bias_is_checked_with_its_bias_fed():
    """A BiasGelu whose bias is computed (no constant): safe mode's subgraph reads it too."""
    text = """
model opset {"": 17, "com.microsoft": 1}
graph g(%x: f32[?,64], %c: f32[64]) -> (%y) {
  %b = Mul(%c, %c)
  %y = com.microsoft::BiasGelu(%x, %b) @bg
}
"""
    rng = np.random.default_rng(3)
    feeds = {
        "x": rng.standard_normal((5, 64)).astype(np.float32),
        "c": rng.standard_normal(64).astype(np.float32),
    }
    gaf = fuse_gelu_model(text, feeds, custom_ops=True)
    (low,) = [lw for lw in gaf.result.lowered if lw.rule == "gelu_kernel"]
    assert set(low.inputs) == {"x", "b"} and gaf.result.safety[low.key].passed
    (want,) = ort_session(to_onnx(parse_model(text)), "all").run(None, feeds)
    (got,) = ort_session(gaf.result.model, "all").run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))
