"""A traced associative scan (``torch._higher_order_ops.associative_scan`` in its generic
mode, as Hugging Face's Mamba runs it under ``torch.compile`` on a CPU) is a tree of strided
``Slice``, ``Mul`` and ``Add`` nodes whose lengths halve level by level. One loop nest runs one
length, so clustering keeps each level apart (``loop-shape``), a ``Slice`` that takes a part of a
group's loop stays outside it to become the next level's input view, a view of a group input
that the group also outputs is made by the runtime's own node, and a layout-only rule match
(``reshape_transpose_chain``) no longer refuses a generated kernel holding its nodes. Before,
the whole tree was one 57-node cluster no kernel could run, refused, and every node ran alone
in onnxruntime."""

from __future__ import annotations

import pytest
import torch

from graph_autofusion.codegen.lower import KernelRefused, lower_group
from graph_autofusion.codegen.targets import CpuTarget
from graph_autofusion.ir.text import parse_model
from graph_autofusion.patterns.clustering import cluster, loop_shape
from graph_autofusion.patterns.pairs import PairReason
from graph_autofusion.runtime.torch_runtime import infer_shapes
from graph_autofusion.torch_compile import make_backend

LEVELS = """
graph g(%a: f32[1,4,16,8], %b: f32[1,4,16,8]) -> (%y, %z) {
  init %s0: i64[1] = [0]
  init %s1: i64[1] = [1]
  init %end: i64[1] = [9223372036854775807]
  init %ax: i64[1] = [2]
  init %two: i64[1] = [2]
  %ae = Slice(%a, %s0, %end, %ax, %two) @a_even
  %ao = Slice(%a, %s1, %end, %ax, %two) @a_odd
  %be = Slice(%b, %s0, %end, %ax, %two) @b_even
  %bo = Slice(%b, %s1, %end, %ax, %two) @b_odd
  %a1 = Mul(%ao, %ae) @level1_a
  %t1 = Mul(%ao, %be) @level1_t
  %b1 = Add(%t1, %bo) @level1_b
  %a1e = Slice(%a1, %s0, %end, %ax, %two) @a1_even
  %a1o = Slice(%a1, %s1, %end, %ax, %two) @a1_odd
  %b1e = Slice(%b1, %s0, %end, %ax, %two) @b1_even
  %b1o = Slice(%b1, %s1, %end, %ax, %two) @b1_odd
  %y = Mul(%a1o, %a1e) @level2_a
  %t2 = Mul(%a1o, %b1e) @level2_t
  %z = Add(%t2, %b1o) @level2_b
}
"""


def test_loop_shape_broadcasts_and_refuses_two_lengths():
    assert loop_shape((1, 4, 8, 8), (1, 4, 8, 8)) == (1, 4, 8, 8)
    assert loop_shape((4, 1, 8), (1, 3, 8)) == (4, 3, 8)
    assert loop_shape((8,), (2, 1)) == (2, 8)
    assert loop_shape((1, 4, 8, 8), (1, 4, 4, 8)) is None
    assert loop_shape(("seq", 8), (16, 8)) == (16, 8)  # a symbolic size is checked later


def test_each_level_of_the_scan_is_its_own_cluster():
    model = parse_model(LEVELS)
    infer_shapes(model)
    result = cluster(model.graph)
    by_node = {n.name: c for c in result.clusters for n in c.nodes}
    level1 = by_node["level1_b"]
    level2 = by_node["level2_b"]
    assert level1 is not level2
    assert {n.name for n in level1.nodes} == {
        "a_even", "a_odd", "b_even", "b_odd", "level1_a", "level1_t", "level1_b"
    }  # fmt: skip
    # the next level's slices are its input views, not outputs of level 1
    assert {"a1_even", "a1_odd", "b1_even", "b1_odd"} <= {n.name for n in level2.nodes}
    codes = {r.code for r in result.rejections}
    assert PairReason.LOOP_SHAPE in codes
    for c in result.clusters:  # every cluster computes at one length
        lengths = {n.outputs[0].shape[2] for n in c.nodes if n.op_type in ("Mul", "Add")}
        assert len(lengths) == 1, [n.name for n in c.nodes]


def _scan_module():
    from torch._higher_order_ops.associative_scan import associative_scan

    class Scan(torch.nn.Module):
        """h_t = a_t * h_{t-1} + b_t along axis 2 (Mamba's selective-scan recurrence)."""

        def forward(self, a, b):
            def combine(left, right):
                return left[0] * right[0], right[0] * left[1] + right[1]

            _, h = associative_scan(combine, (a, b), dim=2, combine_mode="generic")
            return h * 2.0

    return Scan()


def _recurrence(a, b):
    h = torch.zeros(a.shape[0], a.shape[1], a.shape[3])
    outs = []
    for t in range(a.shape[2]):
        h = a[:, :, t] * h + b[:, :, t]
        outs.append(h)
    return torch.stack(outs, 2) * 2.0


def test_a_traced_associative_scan_runs_as_generated_kernels_level_by_level():
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(1, 32, 32, 8, generator=gen) * 0.9 + 0.05
    b = torch.randn(1, 32, 32, 8, generator=gen)
    backend = make_backend(engine="onnxruntime", check_speed=False)
    with torch.no_grad():
        got = torch.compile(_scan_module(), backend=backend)(a, b)
    torch.testing.assert_close(got, _recurrence(a, b), rtol=1e-5, atol=1e-5)
    (graph,) = backend.config.graphs
    assert graph.engine == "onnxruntime"
    res = graph.ort_result
    kernels = [x.key for x in res.lowered if x.key.startswith("cluster")]
    assert len(kernels) >= 6, [(c.key, c.code, c.message) for c in res.analysis.candidates]
    assert len(res.model.graph.nodes) < 0.7 * len(res.original.graph.nodes)


VIEW_OUT = """
graph g(%x: f32[2,3,8], %w: f32[8]) -> (%r, %y) {
  init %shape: i64[2] = [6, 8]
  %r = Reshape(%x, %shape) @view
  %m = Mul(%r, %w) @mul
  %y = Tanh(%m) @tanh
}
"""


class _Static:
    def shape(self, v):
        return v.shape

    def dtype(self, v):
        return v.dtype


def test_a_view_of_a_group_input_that_the_group_outputs_is_the_runtimes_node():
    model = parse_model(VIEW_OUT)
    nodes, outs = list(model.graph.nodes), list(model.graph.outputs)
    low = lower_group(nodes, outs, _Static())
    assert [n.name for n in low.prologue] == ["view"]
    assert [o.name for o in low.kernel.outputs] == ["y"]
    # the torch runner's fused step returns the kernel's outputs only: refused there
    target = CpuTarget()
    group = cluster(model.graph).clusters[0]
    assert {n.name for n in group.nodes} == {"view", "mul", "tanh"}
    with pytest.raises(KernelRefused, match="view of one"):
        target.lower_uncached(group, _Static())


BOUNDS_INSIDE = """
graph g(%q: f32[1,6,8], %cos: f32[16,8]) -> (%y, %c) {
  init %z: i64[1] = [0]
  init %one: i64[1] = [1]
  init %i1: i64[] = [1]
  %sh = Shape(%q) @shape
  %n = Gather(%sh, %i1) @take_len
  %nu = Unsqueeze(%n, %z) @unsq
  %e = Add(%nu, %one) @end
  %c = Slice(%cos, %z, %e, %z) @rows
  %y = Mul(%c, %q) @mul
}
"""


def test_a_view_whose_bounds_the_group_computes_stays_in_the_kernel():
    """Only a view all of whose inputs come from outside the group can be the runtime's node:
    a Slice whose end the group computes (rotary's ``cos[:seq_len]`` at a symbolic length)
    would still read that end after the group's nodes are replaced (review of 7a057d0)."""
    model = parse_model(BOUNDS_INSIDE)
    infer_shapes(model)
    nodes = [n for n in model.graph.nodes if n.name in ("unsq", "end", "rows", "mul")]
    outs = [v for v in model.graph.outputs]
    with pytest.raises(KernelRefused, match="computed inside the group"):
        lower_group(nodes, outs, _Static())
