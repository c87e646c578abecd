"""The one options record travels: every :class:`FuseOptions` field that ``analyze()`` honours,
``GraphAutoFusion(..., options=FuseOptions(...)).fuse()`` honours too, on the onnxruntime
target (the default) and on the cpu target where the field applies.

Each test toggles one field on a tiny model and asserts what it changes in the fused result.
No wall clock decides anything: the speed checks read a stub timer
(:func:`graph_autofusion.runtime.timing.use_timer`).
"""

from __future__ import annotations

import pytest

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.ort_customop import ort_include_dir
from graph_autofusion.ir.text import parse_model
from graph_autofusion.options import FuseOptions
from graph_autofusion.pipeline import e2e_passed
from graph_autofusion.runtime.timing import use_timer

#: a shipped profile: the plan must not depend on this machine's calibration
PROFILE = "x86_avx2"

# MatMul + bias + erf-GELU (bias_gelu -> BiasGelu on onnxruntime), its output viewed through
# TorchScript's Shape -> Gather -> Unsqueeze -> Concat -> Reshape program (shape folding), and
# an elementwise chain of four operators on two inputs (one automatic cluster on the cpu target)
TEXT = """
model opset {"": 18}
graph g(%x: f32[B,S,64], %u: f32[B,S,64]) -> (%y, %z) {
  init %w: f32[64,64] = randn(0)
  init %b: f32[64] = randn(1)
  init %c: f32[] = [1.4142135381698608]
  init %one: f32[] = [1.0]
  init %half: f32[] = [0.5]
  init %i0: i64[] = [0]
  init %i1: i64[] = [1]
  init %ax: i64[1] = [0]
  init %two: i64[1] = [2]
  init %neg: i64[1] = [-1]
  %m = MatMul(%x, %w) @mm
  %a = Add(%m, %b) @bias
  %s = Div(%a, %c) @div
  %e = Erf(%s) @erf
  %a1 = Add(%e, %one) @add1
  %mg = Mul(%a, %a1) @mul
  %h = Mul(%mg, %half) @gelu_out
  %sh: i64[3] = Shape(%x) @shape
  %gb: i64[] = Gather<axis=0>(%sh, %i0) @g0
  %gs: i64[] = Gather<axis=0>(%sh, %i1) @g1
  %ub: i64[1] = Unsqueeze(%gb, %ax) @u0
  %us: i64[1] = Unsqueeze(%gs, %ax) @u1
  %t: i64[4] = Concat<axis=0>(%ub, %us, %two, %neg) @cat
  %y = Reshape(%h, %t) @view
  %p = Add(%u, %b) @padd
  %q = Mul(%p, %half) @pmul
  %r = Tanh(%q) @ptanh
  %z = Sub(%r, %u) @psub
}
"""

SHAPE_PROGRAM = {"Shape", "Gather", "Unsqueeze", "Concat"}
TARGETS = ["onnxruntime", "cpu"]


def fuse(target: str = "onnxruntime", **fields):
    """Fuse TEXT with ``FuseOptions(target=target, **fields)``; returns the result."""
    gaf = GraphAutoFusion(
        parse_model(TEXT), hardware=PROFILE, options=FuseOptions(target=target, **fields)
    )
    gaf.fuse()
    return gaf.result


def ops(result) -> set[str]:
    return {n.op_type for n in result.model.graph.nodes}


def clusters(result) -> list:
    return [c for c in result.analysis.candidates if c.source.startswith("cluster:")]


def twice_as_slow(key, side, fn):
    """Safe mode's timer: the sessions run, the times are set: every fused side takes twice
    its unfused operators' time."""
    fn()
    return 20e-6 if side == "fused" else 10e-6


# ----------------------------------------------------------------------------- fold_shapes
@pytest.mark.parametrize("target", TARGETS)
def test_fold_shapes_off_keeps_the_reshape_shape_program(target):
    folded = fuse(target, check_speed=False)
    assert folded.shape_folding is not None and folded.shape_folding.folded
    assert not SHAPE_PROGRAM & ops(folded)
    kept = fuse(target, check_speed=False, fold_shapes=False)
    assert kept.shape_folding is None
    assert SHAPE_PROGRAM <= ops(kept)
    assert kept.lowered  # the fusions themselves still happen


# ----------------------------------------------------------------------------- cosine_floor
@pytest.mark.parametrize("target", TARGETS)
def test_a_cosine_floor_above_one_rolls_back_every_fusion(target):
    assert fuse(target, check_speed=False).lowered
    res = fuse(target, check_speed=False, cosine_floor=1.01)
    assert not res.lowered
    assert res.rolled_back and {b.code for b in res.rolled_back} == {"numerics"}
    assert all("1.01" in b.message for b in res.rolled_back), res.rolled_back


# ----------------------------------------------------------------------------- e2e_cosine_floor
@pytest.mark.parametrize("target", TARGETS)
def test_an_end_to_end_floor_above_one_fails_end_to_end(target):
    ok = fuse(target, check_speed=False)
    assert e2e_passed(ok.end_to_end) and not ok.rolled_back
    res = fuse(target, check_speed=False, e2e_cosine_floor=1.01)
    assert not e2e_passed(res.end_to_end)
    assert not res.lowered
    assert res.rolled_back and {b.code for b in res.rolled_back} == {"end-to-end"}
    assert any("end-to-end comparison failed" in n for n in res.notes), res.notes


def test_the_end_to_end_floor_also_judges_the_shape_folding():
    """onnxruntime: safe mode checks the folding against the original with the same floor."""
    res = fuse(check_speed=False, e2e_cosine_floor=1.01)
    assert any(n.startswith("shape folding rolled back") for n in res.notes), res.notes


# ----------------------------------------------------------------------------- speed_margin
@pytest.mark.parametrize("target", TARGETS)
def test_speed_margin_decides_whether_a_twice_as_slow_fusion_stays(target):
    with use_timer(twice_as_slow):
        strict = fuse(target)  # the default margin, 1.10: 2x is slower
        lenient = fuse(target, speed_margin=3.0)
    assert not strict.lowered
    assert strict.rolled_back and {b.code for b in strict.rolled_back} == {"slower"}
    assert lenient.lowered and not lenient.rolled_back
    for low in lenient.lowered:
        r = lenient.safety[low.key]
        assert (r.time_unfused_us, r.time_fused_us) == pytest.approx((10, 20))


@pytest.mark.parametrize("target", TARGETS)
def test_check_speed_off_in_the_record_times_nothing(target):
    calls = []

    def timer(key, side, fn):
        calls.append((key, side))
        return twice_as_slow(key, side, fn)

    with use_timer(timer):
        res = fuse(target, check_speed=False)
    assert res.lowered and not res.rolled_back
    assert calls == []


# ----------------------------------------------------------------------------- mc_samples
@pytest.mark.parametrize("samples", [0, 3])
def test_mc_samples_is_the_number_of_perturbed_runs(samples):
    res = fuse(check_speed=False, mc_samples=samples)
    assert res.lowered
    for low in res.lowered:
        cosines = res.safety[low.key].details.get("mc_cosines", [])
        assert len(cosines) == samples


# ----------------------------------------------------------------------------- clustering
@pytest.mark.parametrize("target", ["cpu", "onnxruntime+custom_ops"])
def test_clustering_off_plans_no_cluster(target):
    fields = _target_fields(target)
    on = fuse(check_speed=False, **fields)
    assert clusters(on) and any(low.key.startswith("cluster#") for low in on.lowered)
    off = fuse(check_speed=False, clustering=False, **fields)
    assert not clusters(off)
    assert not [low for low in off.lowered if low.key.startswith("cluster#")]


@pytest.mark.parametrize("target", ["cpu", "onnxruntime+custom_ops"])
def test_max_cluster_nodes_bounds_every_cluster(target):
    fields = _target_fields(target)
    big = fuse(check_speed=False, **fields)
    assert max(len(c.payload.nodes) for c in clusters(big)) > 2
    small = fuse(check_speed=False, max_cluster_nodes=2, **fields)
    assert clusters(small)
    assert max(len(c.payload.nodes) for c in clusters(small)) <= 2


@pytest.mark.parametrize("target", ["cpu", "onnxruntime+custom_ops"])
def test_max_cluster_inputs_bounds_every_cluster(target):
    fields = _target_fields(target)
    wide = fuse(check_speed=False, **fields)
    assert max(c.payload.num_inputs for c in clusters(wide)) > 1
    narrow = fuse(check_speed=False, max_cluster_inputs=1, **fields)
    assert clusters(narrow)
    assert max(c.payload.num_inputs for c in clusters(narrow)) <= 1
    assert {c.key for c in clusters(narrow)} != {c.key for c in clusters(wide)}


def _target_fields(target: str) -> dict:
    if target == "cpu":
        return {"target": "cpu"}
    if ort_include_dir() is None:
        pytest.skip("onnxruntime C API header not available (sh tools/ort_headers.sh)")
    return {"target": "onnxruntime", "custom_ops": True}


# ----------------------------------------------------------------------------- progressive
def test_progressive_stages_read_the_record():
    """fuse_progressive runs each stage through the same record: a cosine floor above one
    fails stage 1, which is rolled back (nothing fused)."""
    gaf = GraphAutoFusion(
        parse_model(TEXT),
        hardware=PROFILE,
        options=FuseOptions(check_speed=False, cosine_floor=1.01),
    )
    prog = gaf.fuse_progressive([["bias_gelu"]])
    assert prog.stopped_at == 1
    assert prog.stages[0].failures and prog.stages[0].failures[0]["code"] == "numerics"
    assert not gaf.result.lowered
