"""Cost model (F8): roofline arithmetic, fusion verdicts per profile, tiling, shapes, ORT profile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graph_autofusion.cost import model as cm
from graph_autofusion.cost.hardware import HardwareProfile
from graph_autofusion.cost.model import Verdict, fusion_cost, kernel_cost
from graph_autofusion.cost.shapes import bind_shapes, bind_symbols
from graph_autofusion.cost.tiling import plan_tiles
from graph_autofusion.ir.text import parse_model, print_model


def profile(
    name: str = "test",
    *,
    kind: str = "npu",
    bw_gbs: float = 100.0,
    gflops: float = 1000.0,
    overhead_us: float = 5.0,
    local_kb: float = 256.0,
    l2_kb: float | None = None,
) -> HardwareProfile:
    """A hand-made profile; no cache (``l2_kb`` None, no ``l3_kb``) unless asked."""
    return HardwareProfile(
        name=name,
        description="test profile",
        kind=kind,
        memory_bandwidth_gbs=bw_gbs,
        peak_gflops={"f32": gflops},
        launch_overhead_us=overhead_us,
        local_memory_kb=local_kb,
        cores=1,
        vector_width_bytes=64,
        l2_kb=l2_kb,
    )


def nodes_of(model, *names):
    by = {n.name: n for n in model.graph.nodes}
    return [by[n] for n in names]


# ----------------------------------------------------------------------------- roofline
ADD = """
graph g(%x: f32[1024,1024], %b: f32[1024]) -> (%y) {
  %y: f32[1024,1024] = Add(%x, %b) @add
}
"""


def test_roofline_memory_bound_elementwise():
    m = parse_model(ADD)
    p = profile(bw_gbs=100.0, gflops=1000.0, overhead_us=5.0)
    c = kernel_cost(m.graph.nodes[0], p)
    n = 1024 * 1024
    assert c.flops == n
    assert c.bytes_read == 4 * n + 4 * 1024
    assert c.bytes_written == 4 * n
    assert c.hbm_accesses == 3
    memory = (8 * n + 4 * 1024) / 100e9
    compute = n / (1000e9 * cm.VECTOR_EFFICIENCY)
    assert c.memory_s == pytest.approx(memory)
    assert c.compute_s == pytest.approx(compute)
    assert c.time_s == pytest.approx(memory + 5e-6)
    assert c.bound == "memory"
    assert c.gflops == pytest.approx(n / (memory + 5e-6) / 1e9)


MATMUL = """
graph g(%x: f32[512,1024]) -> (%y) {
  init %w: f32[1024,1024] = zeros
  %y: f32[512,1024] = MatMul(%x, %w) @mm
}
"""


def test_roofline_compute_bound_matmul_with_efficiency_curve():
    m = parse_model(MATMUL)
    p = profile(bw_gbs=1000.0, gflops=100.0, overhead_us=1.0)
    c = kernel_cost(m.graph.nodes[0], p)
    flops = 2 * 512 * 1024 * 1024
    assert c.flops == flops
    eff = cm.contraction_efficiency(flops, 100e9)
    assert 0 < eff <= cm.CONTRACTION_MAX_EFFICIENCY
    assert c.compute_s == pytest.approx(flops / (100e9 * eff))
    assert c.bound == "compute"
    assert c.time_s == pytest.approx(c.compute_s + 1e-6)
    # the curve: small contractions run further below peak than large ones
    assert cm.contraction_efficiency(1e4, 100e9) < cm.contraction_efficiency(1e9, 100e9)


def test_views_cost_overhead_only_and_gather_reads_rows():
    m = parse_model(
        """
        graph g(%ids: i64[4], %x: f32[8,256]) -> (%y, %r) {
          init %table: f32[10000,256] = zeros
          init %shape: i64[2] = [4, 512]
          %y: f32[4,256] = Gather(%table, %ids) @gather
          %r: f32[4,512] = Reshape(%x, %shape) @reshape
        }
        """
    )
    p = profile(overhead_us=2.0)
    gather, reshape = m.graph.nodes
    r = kernel_cost(reshape, p)
    assert r.time_s == pytest.approx(2e-6) and r.hbm_accesses == 0 and r.bytes == 0
    g = kernel_cost(gather, p)
    assert g.bytes_read == 4 * 256 * 4 + 4 * 8  # the 4 gathered rows + the indices
    assert g.bytes_read < 10000 * 256 * 4


def test_transpose_pays_strided_access_factor():
    m = parse_model(
        """
        graph g(%x: f32[64,128,256]) -> (%y, %z) {
          %y: f32[64,256,128] = Transpose<perm=[0, 2, 1]>(%x) @t
          %z: f32[64,128,256] = Relu(%x) @relu
        }
        """
    )
    p = profile()
    t, relu = (kernel_cost(n, p) for n in m.graph.nodes)
    assert t.strided_factor == cm.STRIDED_ACCESS_FACTOR
    assert relu.strided_factor == 1.0
    assert t.memory_s == pytest.approx(relu.memory_s * (cm.STRIDED_ACCESS_FACTOR + 1) / 2)


def test_cache_resident_activations_move_faster_than_weights():
    text = """
    graph g(%x: f32[64,64]) -> (%z) {
      %y: f32[64,64] = Relu(%x) @a
      %z: f32[64,64] = Relu(%y) @b
    }
    """
    m = parse_model(text)
    cold = profile(kind="cpu", l2_kb=None)
    hot = profile(kind="cpu", l2_kb=1024)
    first, second = m.graph.nodes
    # %y is produced by a kernel and fits the cache: read at the cache bandwidth
    assert kernel_cost(second, hot).memory_s < kernel_cost(second, cold).memory_s
    # a graph input is not cache resident, only the output written is
    assert kernel_cost(first, hot).memory_s > kernel_cost(second, hot).memory_s


# ----------------------------------------------------------------------------- fusions
def test_elementwise_chain_fusion_before_after():
    m = parse_model(
        """
        graph g(%x: f32[1024,1024], %b: f32[1024]) -> (%z) {
          %y: f32[1024,1024] = Add(%x, %b) @add
          %z: f32[1024,1024] = Relu(%y) @relu
        }
        """
    )
    p = profile(bw_gbs=100.0, gflops=1000.0, overhead_us=5.0)
    fc = fusion_cost(m.graph.nodes, p)
    n = 1024 * 1024 * 4
    assert fc.hbm_accesses_before == 5 and fc.hbm_accesses_after == 3
    assert fc.bytes_before == (2 * n + 4096) + 2 * n
    assert fc.bytes_after == 2 * n + 4096
    assert fc.time_after_s == pytest.approx((2 * n + 4096) / 100e9 + 5e-6)
    assert fc.saving == pytest.approx(1 - fc.time_after_s / fc.time_before_s)
    assert fc.verdict == Verdict.FUSE
    assert fc.gflops_after > fc.gflops_before
    assert fc.local_memory_bytes <= p.local_memory_bytes()
    assert fc.to_dict()["verdict"] == "fuse"


def test_value_read_outside_the_group_is_still_written():
    m = parse_model(
        """
        graph g(%x: f32[256,256]) -> (%z, %y) {
          %y: f32[256,256] = Exp(%x) @exp
          %z: f32[256,256] = Relu(%y) @relu
        }
        """
    )
    fc = fusion_cost(m.graph.nodes, profile())
    assert fc.hbm_accesses_after == 3  # x read, y and z written
    assert fc.bytes_after == 3 * 256 * 256 * 4


SOFTMAX_ROW = """
graph g(%x: f32[64,8192]) -> (%y) {
  init %scale: f32[] = [0.125]
  %s: f32[64,8192] = Mul(%x, %scale) @scale
  %y: f32[64,8192] = Softmax<axis=-1>(%s) @softmax
}
"""


def test_local_memory_decides_fuse_vs_overflow():
    m = parse_model(SOFTMAX_ROW)
    ample = profile("ample", local_kb=1024)
    small = profile("small", local_kb=16)
    fits = fusion_cost(m.graph.nodes, ample)
    assert fits.verdict == Verdict.FUSE, fits.reason
    assert fits.tile.tile[-1] == 8192  # a softmax row is never split
    assert fits.local_memory_bytes <= ample.local_memory_bytes()
    over = fusion_cost(m.graph.nodes, small)
    assert over.verdict == Verdict.SKIP_LOCAL_MEMORY_OVERFLOW
    assert "local memory" in over.reason and "16.0 KiB" in over.reason
    # one row: input double-buffered + the scaled intermediate + output, 32 KiB each
    assert over.tile.minimal_bytes >= 4 * 8192 * 4
    assert over.saving == fits.saving  # same roofline; only the fit differs


MATMUL_BIAS = """
graph g(%x: f32[256,1024]) -> (%y) {
  init %w: f32[1024,1024] = zeros
  init %b: f32[1024] = zeros
  %t: f32[256,1024] = MatMul(%x, %w) @mm
  %y: f32[256,1024] = Add(%t, %b) @bias
}
"""


def test_launch_overhead_makes_small_fusion_worth_it():
    m = parse_model(MATMUL_BIAS)
    cpu = profile("cpu", kind="cpu", bw_gbs=20.0, gflops=200.0, overhead_us=0.5, local_kb=1024)
    npu = profile("npu", kind="npu", bw_gbs=1600.0, gflops=300_000.0, overhead_us=20.0)
    on_cpu = fusion_cost(m.graph.nodes, cpu)
    on_npu = fusion_cost(m.graph.nodes, npu)
    assert on_cpu.verdict == Verdict.SKIP_LOW_BENEFIT, on_cpu.reason
    assert on_npu.verdict == Verdict.FUSE, on_npu.reason
    assert on_npu.saving > 0.4 > on_cpu.saving
    # same HBM traffic change on both: the win on the NPU is the saved launch
    assert on_cpu.hbm_accesses_before == on_npu.hbm_accesses_before == 6
    assert on_cpu.hbm_accesses_after == on_npu.hbm_accesses_after == 4


def test_unknown_sizes_give_maybe_and_binding_resolves_them():
    text = """
    graph g(%x: f32[B,S,64], %b: f32[64]) -> (%z) {
      %y: f32[B,S,64] = Add(%x, %b) @add
      %z: f32[B,S,64] = Relu(%y) @relu
    }
    """
    m = parse_model(text)
    p = profile()
    fc = fusion_cost(m.graph.nodes, p)
    assert fc.verdict == Verdict.MAYBE and "unknown" in fc.reason
    binding = bind_shapes(m, input_shapes={"x": (2, 512, 64), "b": (64,)}, execute=False)
    fc2 = fusion_cost(m.graph.nodes, p, binding=binding)
    assert fc2.verdict != Verdict.MAYBE
    assert fc2.bytes_after == (2 * 512 * 64 * 2 + 64) * 4
    assert m.graph.nodes[0].outputs[0].shape == ("B", "S", 64)  # model untouched


def test_threshold_band_gives_maybe():
    m = parse_model(ADD)
    p = profile()
    fc = fusion_cost(m.graph.nodes, p)  # one node: nothing to save
    assert fc.saving == pytest.approx(0.0)
    assert fc.verdict == Verdict.SKIP_LOW_BENEFIT
    near = fusion_cost(m.graph.nodes, p, benefit_threshold=0.01)
    assert near.verdict == Verdict.MAYBE


# ----------------------------------------------------------------------------- tiling
def test_tiling_contraction_prefers_balanced_tiles_and_k_chunks():
    m = parse_model(MATMUL_BIAS)
    from graph_autofusion.cost.model import group_io

    io = group_io(m.graph.nodes)
    plan = plan_tiles(
        io.nodes,
        64 * 1024,
        inputs=io.inputs,
        outputs=io.outputs,
        intermediates=io.intermediates,
    )
    assert plan is not None and plan.fits
    assert plan.working_set_bytes <= 64 * 1024
    tm, tn = plan.tile
    assert plan.k_tile is not None and plan.k_tile < 1024
    assert 0.25 <= tm / tn <= 4  # square-ish output tiles minimise operand re-reads
    assert plan.n_tiles == math.ceil(256 / tm) * math.ceil(1024 / tn)
    big = plan_tiles(
        io.nodes, 64 << 20, inputs=io.inputs, outputs=io.outputs, intermediates=io.intermediates
    )
    assert big.traffic_bytes <= plan.traffic_bytes


# ----------------------------------------------------------------------------- shapes
def test_bind_shapes_executes_data_dependent_reshape_without_mutation():
    text = """
    graph g(%x: f32[B,S,8]) -> (%y) {
      init %idx: i64[1] = [0]
      init %tail: i64[1] = [-1]
      %shp = Shape(%x) @shape
      %b = Gather<axis=0>(%shp, %idx) @gather
      %new = Concat<axis=0>(%b, %tail) @concat
      %y = Reshape(%x, %new) @reshape
    }
    """
    m = parse_model(text)
    before = print_model(m)
    feeds = {"x": np.zeros((3, 5, 8), np.float32)}
    assert bind_symbols(m, {"x": (3, 5, 8)}) == {"B": 3, "S": 5}
    b = bind_shapes(m, feeds)
    assert b.method == "execute"
    y = m.graph.nodes[-1].outputs[0]
    assert b.shape(y) == (3, 40)
    shadow = b.node(m.graph.nodes[-1])
    assert shadow.outputs[0].shape == (3, 40) and shadow is not m.graph.nodes[-1]
    assert print_model(m) == before


def test_bind_symbols_rejects_inconsistent_inputs():
    m = parse_model(
        """
        graph g(%a: f32[B,4], %b: f32[B,4]) -> (%y) {
          %y = Add(%a, %b) @add
        }
        """
    )
    with pytest.raises(ValueError, match="symbol 'B'"):
        bind_symbols(m, {"a": (2, 4), "b": (3, 4)})


@pytest.mark.slow
def test_bind_shapes_on_zoo_bert_makes_every_node_sizable():
    from graph_autofusion.catalog.cost import node_bytes, node_flops
    from graph_autofusion.testing import example_feeds
    from graph_autofusion.testing.rules import zoo_model

    m = zoo_model("bert", "dynamo")
    symbolic_before = sum(
        1 for n in m.graph.nodes for v in n.outputs if v.shape is None or not v.is_static
    )
    b = bind_shapes(m, example_feeds("bert"))
    assert b.symbols == {"batch": 1, "seq": 16}
    shadows = b.nodes(m.graph.nodes)
    assert all(node_bytes(s) is not None and node_flops(s) is not None for s in shadows)
    symbolic_after = sum(
        1 for n in m.graph.nodes for v in n.outputs if v.shape is None or not v.is_static
    )
    assert symbolic_before > 0 and symbolic_after == symbolic_before  # model untouched
    p = profile(kind="cpu", bw_gbs=20.0, gflops=200.0, overhead_us=0.2, local_kb=1024)
    costs = cm.model_costs(m.graph.nodes, p, b)
    total = cm.predicted_total_s(costs)
    assert total is not None and 1e-3 < total < 1.0


# ----------------------------------------------------------------------------- ORT profile
def test_ort_profile_parses_per_node_times():
    from graph_autofusion.frontend.onnx_export import to_onnx
    from graph_autofusion.runtime.ort_profile import parse_profile, profile_nodes

    m = parse_model(
        """
        graph g(%x: f32[64,256]) -> (%z) {
          init %w: f32[256,256] = randn(0)
          %y: f32[64,256] = MatMul(%x, %w) @mm
          %z: f32[64,256] = Relu(%y) @relu
        }
        """
    )
    proto = to_onnx(m).SerializeToString()
    feeds = {"x": np.ones((64, 256), np.float32)}
    prof = profile_nodes(proto, feeds, runs=3, warmup=1)
    assert set(prof.node_us) == {"mm", "relu"}
    assert prof.op_type == {"mm": "MatMul", "relu": "Relu"}
    assert all(len(v) == 3 for v in prof.samples.values())
    assert all(t >= 0 for t in prof.node_us.values())
    assert prof.total_us == pytest.approx(sum(prof.node_us.values()))
    assert prof.wall_us > 0
    events = [
        {"cat": "Node", "name": "a_kernel_time", "dur": d, "args": {"op_name": "Add"}}
        for d in (100, 5, 7, 6)
    ] + [{"cat": "Session", "name": "model_run", "dur": 1000}]
    samples, ops = parse_profile(events, warmup=1)
    assert samples == {"a": [5.0, 7.0, 6.0]} and ops == {"a": "Add"}
    # the trimmed mean keeps the sub-microsecond fraction a median of whole-us samples loses
    from graph_autofusion.runtime.ort_profile import trimmed_mean

    assert trimmed_mean([3, 4, 3, 4, 3, 40, 3, 3, 4, 3]) == pytest.approx(3.25)
    assert trimmed_mean([9.0]) == 9.0
    tm = prof.node_trimmed_mean_us()
    assert set(tm) == {"mm", "relu"} and all(t <= max(prof.samples[k]) for k, t in tm.items())


def test_transpose_behind_a_view_is_strided_and_shape_inputs_are_not_accesses():
    text = """
    graph g(%x: f32[16,768]) -> (%y) {
      init %shape: i64[3] = [16, 12, 64]
      %r: f32[16,12,64] = Reshape(%x, %shape) @reshape
      %y: f32[12,16,64] = Transpose<perm=[1, 0, 2]>(%r) @transpose
    }
    """
    m = parse_model(text)
    p = profile()
    fc = fusion_cost(m.graph.nodes, p)
    # the Reshape is a view: before = the Transpose's read and write; after the same two
    assert fc.hbm_accesses_before == 2 and fc.hbm_accesses_after == 2
    after = fc.kernels[-1]
    assert after.strided_factor == pytest.approx(cm.STRIDED_ACCESS_FACTOR, rel=1e-3)
    # fusing a view into a Transpose saves one launch only
    assert fc.time_before_s - fc.time_after_s == pytest.approx(p.launch_overhead_s(), rel=1e-6)


def test_per_op_type_dispatch_overhead_from_the_profile():
    """A profile's measured ``op_overhead_us`` prices each operator type's dispatch; types
    it does not list, and a fused kernel, pay ``launch_overhead_us``."""
    import dataclasses

    m = parse_model(
        """
        graph g(%x: f32[4,16]) -> (%z, %s) {
          init %shape: i64[2] = [16, 4]
          %r: f32[16,4] = Reshape(%x, %shape) @reshape
          %y: f32[16,4] = Relu(%r) @relu
          %z: f32[16,4] = Neg(%y) @neg
          %s: i64[2] = Shape(%x) @shape
        }
        """
    )
    base = profile(overhead_us=1.0)
    table = {"Reshape": 0.25, "Relu": 3.0, "Shape": 0.5}
    p = dataclasses.replace(base, op_overhead_us=table)
    reshape, relu, neg, shape = m.graph.nodes
    # views and metadata ops cost their own type's overhead only
    assert kernel_cost(reshape, p).time_s == pytest.approx(0.25e-6)
    assert kernel_cost(shape, p).time_s == pytest.approx(0.5e-6)
    # a kernel with work: the roofline term plus its type's overhead
    r_base, r = kernel_cost(relu, base), kernel_cost(relu, p)
    assert r.overhead_s == pytest.approx(3e-6)
    assert r.time_s - r_base.time_s == pytest.approx(2e-6)
    # not in the table: the launch overhead
    assert kernel_cost(neg, p).overhead_s == pytest.approx(1e-6)
    assert cm.dispatch_overhead_s(p, "Neg") == cm.dispatch_overhead_s(base, "Relu") == 1e-6
    # a duck-typed profile without the attribute still works
    assert cm.dispatch_overhead_s(type("P", (), {"launch_overhead_s": lambda s: 7e-6})()) == 7e-6
    # fusing: before = each kernel with its own overhead, after = one launch overhead
    fc = fusion_cost([reshape, relu, neg], p)
    assert fc.kernels[-1].overhead_s == pytest.approx(1e-6)
    before = sum(k.time_s for k in fc.kernels[:-1])
    assert fc.time_before_s == pytest.approx(before)
    # overheads 0.25 + 3 + 1 us instead of 3 x 1 us
    assert before == pytest.approx(
        sum(kernel_cost(n, base).time_s for n in (reshape, relu, neg)) + 1.25e-6
    )


def test_measured_knee_overlap_and_batched_gemms():
    """A calibrated profile's GEMM knee and compute/memory overlap change the contraction
    time as documented; a batched MatMul pays the knee once per batch item."""
    import dataclasses

    m = parse_model(
        """
        graph g(%x: f32[16,2048], %a: f32[8,16,64], %b: f32[8,64,16]) -> (%y, %z) {
          init %w: f32[2048,2048] = zeros
          %y: f32[16,2048] = MatMul(%x, %w) @mm
          %z: f32[8,16,16] = MatMul(%a, %b) @bmm
        }
        """
    )
    mm, bmm = m.graph.nodes
    assert cm.gemm_count(mm) == 1 and cm.gemm_count(bmm) == 8
    base = profile(kind="cpu", bw_gbs=40.0, gflops=400.0, overhead_us=0.2)
    c0 = kernel_cost(mm, base)
    # shipped-style profile: 4 us knee, full overlap (the plain roofline)
    f = 2 * 16 * 2048 * 2048
    assert c0.compute_s == pytest.approx((f + 400e9 * 4e-6) / (0.9 * 400e9))
    assert c0.time_s == pytest.approx(max(c0.compute_s, c0.memory_s) + 0.2e-6)
    knee = dataclasses.replace(base, extra={"contraction_half_time_us": 0.1})
    c1 = kernel_cost(mm, knee)
    assert c1.compute_s == pytest.approx((f + 400e9 * 0.1e-6) / (0.9 * 400e9))
    # the batched MatMul: 8 GEMMs of 32 KFLOP, each paying the knee
    fb = 2 * 8 * 16 * 64 * 16
    assert kernel_cost(bmm, knee).compute_s == pytest.approx(
        (fb + 8 * 400e9 * 0.1e-6) / (0.9 * 400e9)
    )
    # no overlap: compute and memory add up; half overlap: half the smaller term is added
    for ov in (0.0, 0.5):
        p = dataclasses.replace(base, extra={"compute_memory_overlap": ov})
        c = kernel_cost(mm, p)
        lo, hi = sorted((c.compute_s, c.memory_s))
        assert c.time_s == pytest.approx(hi + (1 - ov) * lo + 0.2e-6)
        assert cm.roofline_time(c.compute_s, c.memory_s, p) == pytest.approx(hi + (1 - ov) * lo)
    # an out-of-range value is ignored (the plain roofline)
    bad = dataclasses.replace(base, extra={"compute_memory_overlap": 1.5})
    assert cm.compute_memory_overlap(bad) == 1.0


def test_measured_per_element_rate_prices_operators_apart():
    text = """
    graph g(%x: f32[256,1024]) -> (%y) {
      %s: f32[256,1024] = Sin(%x) @sin
      %y: f32[256,1024] = Add(%s, %x) @add
    }
    """
    model = parse_model(text)
    flat = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.0)
    sin, add = nodes_of(model, "sin", "add")
    # one FLOP rate: both cost the same compute
    assert kernel_cost(sin, flat).compute_s == pytest.approx(kernel_cost(add, flat).compute_s)
    import dataclasses

    rated = dataclasses.replace(flat, extra={"op_ns_per_element": {"Sin": 1.2, "Add": 0.1}})
    assert kernel_cost(sin, rated).compute_s == pytest.approx(256 * 1024 * 1.2e-9)
    assert kernel_cost(add, rated).compute_s == pytest.approx(256 * 1024 * 0.1e-9)
    # a fused kernel pays the same measured rates for its members
    fused = cm.fused_kernel(cm.group_io([sin, add]), rated)[0]
    assert fused.compute_s == pytest.approx(256 * 1024 * 1.3e-9)


def test_element_rate_follows_the_measured_size_curve():
    """A calibrated size curve prices each node at its own size: the time is interpolated
    between the measured sizes around it, the nearest end's rate outside them, and the flat
    rate where the curve has no entry."""
    import dataclasses

    base = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.0)
    # one thread up to 16 Ki elements (0.24 ns), split over the pool at 64 Ki (0.12 ns)
    curve = {"Sigmoid": [[2048, 0.24], [16384, 0.24], [65536, 0.12]]}
    p = dataclasses.replace(
        base,
        extra={
            "op_ns_per_element": {"Sigmoid": 0.12, "Add": 0.1},
            "op_ns_per_element_curve": curve,
        },
    )
    assert cm.element_rate_ns(p, "Sigmoid", 1024) == pytest.approx(0.24)
    assert cm.element_rate_ns(p, "Sigmoid", 8192) == pytest.approx(0.24)
    assert cm.element_rate_ns(p, "Sigmoid", 1 << 20) == pytest.approx(0.12)
    # 40 Ki: halfway between 16 Ki (3.93 us) and 64 Ki (7.86 us) in time
    t = (16384 * 0.24 + 65536 * 0.12) / 2
    assert cm.element_rate_ns(p, "Sigmoid", 40960) * 40960 == pytest.approx(t)
    # no curve for Add: the flat rate at any size; no size: the flat rate
    assert cm.element_rate_ns(p, "Add", 100) == cm.element_rate_ns(p, "Add", 10**7) == 0.1
    assert cm.element_rate_ns(p, "Sigmoid") == pytest.approx(0.12)
    assert cm.element_rate_ns(p, "MatMul", 4096) is None
    model = parse_model(
        """
        graph g(%x: f32[16,1376], %z: f32[64,1024]) -> (%y, %w) {
          %y: f32[16,1376] = Sigmoid(%x) @small
          %w: f32[64,1024] = Sigmoid(%z) @large
        }
        """
    )
    small, large = nodes_of(model, "small", "large")
    n = 16 * 1376
    t_small = 16384 * 0.24 + (65536 * 0.12 - 16384 * 0.24) * (n - 16384) / (65536 - 16384)
    assert kernel_cost(small, p).compute_s == pytest.approx(t_small * 1e-9)
    assert kernel_cost(large, p).compute_s == pytest.approx(65536 * 0.12e-9)
    # the size a fused kernel is priced at is its largest output's
    fused = cm.fused_kernel(cm.group_io([small]), p, native_op="Sigmoid")[0]
    assert fused.compute_s == pytest.approx(t_small * 1e-9)


def test_row_wise_operator_pays_per_row_beyond_the_curve():
    """A softmax over short rows pays the calibrated per-row cost for each row beyond the
    curve's 1024-long ones; over 1024-long rows, or over a leading axis, it does not."""
    import dataclasses

    base = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.0)
    p = dataclasses.replace(
        base, extra={"op_ns_per_element": {"Softmax": 0.1}, "op_ns_per_row": {"Softmax": 8.0}}
    )
    model = parse_model(
        """
        graph g(%a: f32[128,16], %b: f32[2,1024], %c: f32[16,128]) -> (%x, %y, %z) {
          %x: f32[128,16] = Softmax<axis=-1>(%a) @short
          %y: f32[2,1024] = Softmax<axis=-1>(%b) @long
          %z: f32[16,128] = Softmax<axis=0>(%c) @lead
        }
        """
    )
    short, long_, lead = nodes_of(model, "short", "long", "lead")
    n = 128 * 16
    # 128 rows, of which n / 1024 = 2 the curve already counts
    assert cm.row_time_s(short, p) == pytest.approx((128 - 2) * 8e-9)
    assert kernel_cost(short, p).compute_s == pytest.approx(n * 0.1e-9 + 126 * 8e-9)
    assert cm.row_time_s(long_, p) == 0.0
    assert cm.row_time_s(lead, p) == 0.0
    # no per-row entry: the per-element rate alone
    flat = dataclasses.replace(base, extra={"op_ns_per_element": {"Softmax": 0.1}})
    assert kernel_cost(short, flat).compute_s == pytest.approx(n * 0.1e-9)


def test_row_cost_reads_reduction_axes_from_a_constant_node():
    """TorchScript feeds ReduceMean its axes from a Constant node: those are the last axis
    (per-row cost), while axes computed at run time are unknown (no per-row cost)."""
    import dataclasses

    import onnx
    from onnx import TensorProto, helper

    from graph_autofusion.frontend.onnx_import import load_onnx

    def reduce_model(axes_from: str):
        nodes = []
        if axes_from == "constant":
            axes = helper.make_tensor("axes_value", TensorProto.INT64, [1], [-1])
            nodes.append(helper.make_node("Constant", [], ["axes"], value=axes))
        else:  # computed: Shape(x)[-1:] - 1 is the last axis, but only at run time
            nodes.append(helper.make_node("Size", ["x"], ["n"]))
            nodes.append(helper.make_node("Reshape", ["n", "one"], ["axes"]))
        nodes.append(helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1, name="rm"))
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [helper.make_tensor("one", TensorProto.INT64, [1], [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        return load_onnx(onnx.load_from_string(model.SerializeToString()))

    base = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.0)
    p = dataclasses.replace(
        base,
        extra={"op_ns_per_element": {"ReduceMean": 0.03}, "op_ns_per_row": {"ReduceMean": 2.0}},
    )
    const = next(n for n in reduce_model("constant").graph.nodes if n.op_type == "ReduceMean")
    assert cm.reduced_axes(const) == (1,)
    assert cm.row_time_s(const, p) == pytest.approx((128 - 2048 / 1024) * 2e-9)
    dyn = next(n for n in reduce_model("computed").graph.nodes if n.op_type == "ReduceMean")
    assert cm.reduced_axes(dyn, unknown_as_all=False) is None
    assert cm.reduced_axes(dyn) == (0, 1)  # a tile must hold it all
    assert cm.row_time_s(dyn, p) == 0.0


def test_layernorm_rows_and_the_native_kernel_pay_the_same_per_row_cost():
    """A LayerNormalization over the last axis pays per row beyond the curve, and the fused
    kernel a rule lowers to a row-wise native operator pays that operator's per-row cost on
    its largest output's rows, so before and after are priced alike."""
    import dataclasses

    model = parse_model(SKIP_LN)
    base = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.0, local_kb=4096)
    rows = {"LayerNormalization": 10.0, "SkipLayerNormalization": 4.0}
    rates = {"Add": 0.1, "LayerNormalization": 0.2, "SkipLayerNormalization": 0.3}
    p = dataclasses.replace(base, extra={"op_ns_per_element": rates, "op_ns_per_row": rows})
    add, ln = model.graph.nodes
    n = 128 * 768
    beyond = 128 - n / 1024
    assert cm.row_time_s(ln, p) == pytest.approx(beyond * 10e-9)
    assert cm.row_time_s(add, p) == 0.0
    fc = fusion_cost(model.graph.nodes, p, native_op="SkipLayerNormalization")
    assert fc.kernels[-1].compute_s == pytest.approx(n * 0.3e-9 + beyond * 4e-9)
    # without a per-row entry for the native operator, its rate alone
    q = dataclasses.replace(
        p, extra={"op_ns_per_element": rates, "op_ns_per_row": {"LayerNormalization": 10.0}}
    )
    fq = fusion_cost(model.graph.nodes, q, native_op="SkipLayerNormalization")
    assert fq.kernels[-1].compute_s == pytest.approx(n * 0.3e-9)


def test_native_kernel_is_priced_at_its_largest_output():
    """A multi-output group lowered to a native operator is priced at its largest output's
    size on the curve, whatever the output order."""
    import dataclasses

    base = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.0)
    curve = {"QuickGelu": [[2048, 1.0], [65536, 0.1]]}
    p = dataclasses.replace(base, extra={"op_ns_per_element_curve": curve})
    model = parse_model(
        """
        graph g(%a: f32[4,512], %b: f32[64,1024]) -> (%x, %y) {
          %x: f32[4,512] = Sigmoid(%a) @small
          %y: f32[64,1024] = Sigmoid(%b) @large
        }
        """
    )
    small, large = nodes_of(model, "small", "large")
    for order in ([small, large], [large, small]):
        fused = cm.fused_kernel(cm.group_io(order), p, native_op="QuickGelu")[0]
        assert fused.compute_s == pytest.approx(65536 * 0.1e-9)
    # no size known: the flat rate, else the curve's largest size
    assert cm.element_rate_ns(p, "QuickGelu") == pytest.approx(0.1)


def test_cast_to_its_own_dtype_is_free_only_in_place():
    """Exporters wrap every RMSNorm in float -> float casts. onnxruntime runs one in place,
    moving no data, when its input dies there: dispatch only. When the input lives on (read
    later, or a graph input) it copies the tensor, and a real conversion moves its bytes."""
    model = parse_model(
        """
        graph g(%x: f32[64,1024], %i: i64[64,1024]) -> (%d, %e, %b) {
          %t: f32[64,1024] = Relu(%x) @relu
          %u: f32[64,1024] = Relu(%x) @relu2
          %a: f32[64,1024] = Cast<to=1>(%t) @dies
          %c: f32[64,1024] = Cast<to=1>(%u) @lives
          %d: f32[64,1024] = Add(%a, %u) @add
          %e: f32[64,1024] = Cast<to=1>(%x) @graph_input
          %b: f32[64,1024] = Cast<to=1>(%i) @convert
        }
        """
    )
    dies, lives, graph_input, convert = nodes_of(model, "dies", "lives", "graph_input", "convert")
    p = profile(kind="cpu", bw_gbs=10, gflops=100, overhead_us=0.5)
    c = kernel_cost(dies, p)
    assert c.time_s == pytest.approx(c.overhead_s) and c.bytes == 0 and c.bound == "overhead"
    for copy in (lives, graph_input):
        k = kernel_cost(copy, p)
        assert k.bytes == 64 * 1024 * 8 and k.time_s > k.overhead_s + 1e-6
    d = kernel_cost(convert, p)
    assert d.bytes == 64 * 1024 * (8 + 4) and d.time_s > d.overhead_s + 1e-6
    # inside a fused kernel a value-preserving cast costs nothing either way
    alone = cm.fused_kernel(cm.group_io(nodes_of(model, "relu2")), p)[0]
    with_cast = cm.fused_kernel(cm.group_io(nodes_of(model, "relu2", "lives")), p)[0]
    assert with_cast.compute_s == pytest.approx(alone.compute_s)


SKIP_LN = """
graph g(%x: f32[128,768], %r: f32[128,768], %g: f32[768], %b: f32[768]) -> (%y) {
  %s: f32[128,768] = Add(%x, %r) @add
  %y: f32[128,768] = LayerNormalization<axis=-1>(%s, %g, %b) @ln
}
"""


def test_native_operator_rate_prices_the_fused_kernel():
    """A runtime-native fused operator costs what calibration measured for it, not the sum of
    its pieces' rates: a slow contrib kernel makes the fusion a measured loss."""
    import dataclasses

    model = parse_model(SKIP_LN)
    rates = {"Add": 0.1, "LayerNormalization": 0.2}
    base = profile(kind="cpu", bw_gbs=1e6, gflops=1e6, overhead_us=0.5, local_kb=4096)
    p = dataclasses.replace(base, extra={"op_ns_per_element": rates})
    n = 128 * 768
    pieces = fusion_cost(model.graph.nodes, p)
    assert pieces.kernels[-1].compute_s == pytest.approx(n * 0.3e-9)
    # no calibrated rate for the native operator: the members' rates, as before
    same = fusion_cost(model.graph.nodes, p, native_op="SkipLayerNormalization")
    assert same.time_after_s == pytest.approx(pieces.time_after_s)
    slow = dataclasses.replace(
        p, extra={"op_ns_per_element": {**rates, "SkipLayerNormalization": 2.0}}
    )
    fc = fusion_cost(model.graph.nodes, slow, native_op="SkipLayerNormalization")
    assert fc.kernels[-1].compute_s == pytest.approx(n * 2.0e-9)
    assert fc.saving < 0 and fc.verdict == Verdict.SKIP_LOW_BENEFIT
    assert "measured SkipLayerNormalization kernel is estimated slower" in fc.reason
    fast = dataclasses.replace(
        p, extra={"op_ns_per_element": {**rates, "SkipLayerNormalization": 0.1}}
    )
    fc = fusion_cost(model.graph.nodes, fast, native_op="SkipLayerNormalization")
    assert fc.kernels[-1].compute_s == pytest.approx(n * 0.1e-9)
    assert fc.verdict == Verdict.FUSE
    # a contraction's cost stays the roofline's
    assert cm.native_rate_ns(slow, "MatMul") is None
