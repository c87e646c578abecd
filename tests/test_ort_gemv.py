"""The few-row MatMul lowering of the onnxruntime target: ``If(M <= 8)`` between the ``Gemv``
custom operator and onnxruntime's prepacked GEMM, built, loaded and run for real."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.ort_customop import (
    DOMAIN,
    build_library,
    custom_ops_of,
    ort_include_dir,
)
from graph_autofusion.runtime.ort_session import fused_session, ort_session
from graph_autofusion.runtime.timing import use_timer

pytestmark = pytest.mark.skipif(
    ort_include_dir() is None, reason="onnxruntime C API header not available"
)
K, H, N = 64, 96, 200
#: A shipped profile: the plan must not depend on this machine's calibrated ``host`` profile
PROFILE = "x86_avx2"


def _model(path: str, x_shape: tuple = ("batch", "seq", K)) -> onnx.ModelProto:
    """A decoder-shaped block: two projections by constant weights on a dynamic sequence
    (``x_shape``: a static one is a decode step's graph)."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((K, H)) / 8).astype(np.float32)
    w2 = (rng.standard_normal((H, N)) / 8).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
            helper.make_node("Relu", ["h"], ["r"], name="act"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="down"),
        ],
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*x_shape[:-1], N])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(m, path)
    return m


def _x(batch: int, seq: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, seq, K)).astype(np.float32)


def _fuse(path: str, out: str, *, safe_mode: bool = True, seq: int = 1, **kw) -> GraphAutoFusion:
    gaf = GraphAutoFusion(path, hardware=PROFILE, sample_inputs={"x": _x(1, seq)})
    gaf.options = gaf.options.replace(safe_mode=safe_mode)
    gaf.fuse(**kw)
    gaf.save(out)
    return gaf


def _init_bytes(proto: onnx.ModelProto) -> int:
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemv")
    src, out = str(d / "block.onnx"), str(d / "fused.onnx")
    model = _model(src)
    # numerics checked, not timed: these tiny weights lose to If's overhead (timed below)
    gaf = _fuse(src, out, custom_ops=True, check_speed=False)
    return gaf, model, src, out


def test_both_matmuls_become_ifs_between_gemv_and_the_gemm(fused):
    gaf, model, _src, out = fused
    keys = sorted(low.key for low in gaf.result.lowered)
    assert keys == ["gemv_matmul@down", "gemv_matmul@up"], gaf.result.skipped_by_reason()
    assert gaf.result.fused_op_counts() == {f"{DOMAIN}::Gemv": 2}
    assert all(gaf.result.safety[k].passed for k in keys)
    proto = onnx.load(out)
    onnx.checker.check_model(proto)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("If") == 2 and "MatMul" not in ops
    assert custom_ops_of(proto) == ["Gemv"]
    # one condition per shape of x ([batch, seq, 64] and [batch, seq, 96])
    assert ops.count("LessOrEqual") == 2
    for n in proto.graph.node:
        if n.op_type == "If":
            branches = {a.name: a.g for a in n.attribute}
            assert [b.op_type for b in branches["then_branch"].node] == ["Gemv"]
            assert [b.op_type for b in branches["else_branch"].node] == ["FusedMatMul"]
    # the weights are transposed, not duplicated
    assert abs(_init_bytes(proto) - _init_bytes(model)) < 64
    inits = {t.name: list(t.dims) for t in proto.graph.initializer}
    assert inits["w1_t"] == [H, K] and inits["w2_t"] == [N, H] and "w1" not in inits


@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 3), (1, 40), (2, 1), (2, 3), (2, 40)])
def test_the_fused_model_matches_the_original_on_both_branches(fused, batch, seq):
    _gaf, _model, src, out = fused
    sess, ref = fused_session(out), ort_session(src, "all")
    x = _x(batch, seq, seed=batch * 100 + seq)
    (got,) = sess.run(None, {"x": x})
    (want,) = ref.run(None, {"x": x})
    assert got.shape == (batch, seq, N)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_a_plain_session_without_the_library_fails_naming_the_domain(fused):
    _gaf, _model, _src, out = fused
    with pytest.raises(Exception, match=DOMAIN):
        ort_session(out, "all", find_library=False).run(None, {"x": _x(1, 1)})


def test_custom_ops_off_changes_nothing(tmp_path):
    src = str(tmp_path / "block.onnx")
    model = _model(src)
    gaf = _fuse(src, str(tmp_path / "plain.onnx"), custom_ops=False)
    assert gaf.result.lowered == [] and gaf.result.custom_ops is None
    proto = onnx.load(str(tmp_path / "plain.onnx"))
    assert [n.op_type for n in proto.graph.node] == [n.op_type for n in model.graph.node]


def test_a_prefill_sample_leaves_the_matmuls_alone(tmp_path):
    """The sample shapes are the workload: 40 rows are no decode step to time Gemv on."""
    src = str(tmp_path / "block.onnx")
    _model(src)
    gaf = _fuse(src, str(tmp_path / "f.onnx"), seq=40, custom_ops=True, check_speed=False)
    assert not [low for low in gaf.result.lowered if low.rule == "gemv_matmul"]


def _down_is_slower(key, side, fn):
    """Safe mode's timer (``runtime.timing.use_timer``): both sides run for real, the times
    are set: the ``down`` Gemv rewrite takes 2x its MatMul, every other fusion 0.5x."""
    fn()
    if side == "unfused":
        return 20e-6
    return 40e-6 if key == "gemv_matmul@down" else 10e-6


def test_safe_mode_times_the_gemv_and_rolls_back_the_slower(tmp_path):
    """Safe mode times each rewrite at the sample's one row and keeps only what is not slower
    (the verdict from a set timer: which one wins on this machine is the benchmark's question,
    ``benchmarks/gemv_ort.py``): ``down`` goes back to its MatMul on its original weight."""
    src = str(tmp_path / "block.onnx")
    model = _model(src)
    with use_timer(_down_is_slower):
        gaf = _fuse(src, str(tmp_path / "f.onnx"), custom_ops=True)
    r = gaf.result
    assert [(b.key, b.code) for b in r.rolled_back] == [("gemv_matmul@down", "slower")]
    assert r.rolled_back[0].message == "fused 40.0 us > unfused 20.0 us x 1.1 on the real shapes"
    assert "gemv_matmul@down" not in {low.key for low in r.lowered}
    assert r.lowered and all(r.safety[low.key].passed for low in r.lowered)
    for low in r.lowered:  # the kept ones were timed too, with the set times
        got = (r.safety[low.key].time_unfused_us, r.safety[low.key].time_fused_us)
        assert got == pytest.approx((20, 10))
    proto = onnx.load(str(tmp_path / "f.onnx"))
    down = next(n for n in proto.graph.node if n.name == "down")
    assert down.op_type == "MatMul" and list(down.input) == ["r", "w2"]
    inits = {t.name for t in proto.graph.initializer}
    assert "w2" in inits and "w2_t" not in inits
    x = _x(2, 3)
    (got,) = fused_session(str(tmp_path / "f.onnx")).run(None, {"x": x})
    (want,) = ort_session(model, "all").run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert abs(_init_bytes(proto) - _init_bytes(model)) < 64


def _every_fusion_slower(key, side, fn):
    """Safe mode's timer: every fused side takes 2x its unfused operators."""
    fn()
    return 20e-6 if side == "unfused" else 40e-6


def test_a_static_one_row_graph_gets_gemv_alone_checked_and_not_timed_alone(tmp_path):
    """A decode step's static graph (one row): each MatMul becomes ``Gemv`` itself (no ``If``,
    no GEMM branch, so no packed copy of the weight); its numerics are checked, but it is not
    timed alone (warm, the two tie; cold, as a decode step runs it, it streams the weight
    once): a timer calling every fusion slower keeps it, and the report says why."""
    src = str(tmp_path / "step.onnx")
    model = _model(src, (1, 1, K))
    with use_timer(_every_fusion_slower):
        gaf = _fuse(src, str(tmp_path / "f.onnx"), custom_ops=True)
    r = gaf.result
    keys = sorted(low.key for low in r.lowered)
    assert keys == ["gemv_matmul@down", "gemv_matmul@up"], r.skipped_by_reason()
    for k in keys:
        assert r.safety[k].passed and r.safety[k].time_fused_us is None
        assert "one-row Gemv" in r.safety[k].details["timed_with_graph"]
    proto = onnx.load(str(tmp_path / "f.onnx"))
    assert [n.op_type for n in proto.graph.node] == ["Gemv", "Relu", "Gemv"]
    assert abs(_init_bytes(proto) - _init_bytes(model)) < 64
    x = _x(1, 1)
    (got,) = fused_session(str(tmp_path / "f.onnx")).run(None, {"x": x})
    (want,) = ort_session(model, "all").run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_a_static_graph_of_more_rows_than_gemv_serves_is_left_alone(tmp_path):
    src = str(tmp_path / "step.onnx")
    _model(src, (1, 12, K))
    gaf = _fuse(src, str(tmp_path / "f.onnx"), seq=12, custom_ops=True, check_speed=False)
    assert not [low for low in gaf.result.lowered if low.rule == "gemv_matmul"]
    proto = onnx.load(str(tmp_path / "f.onnx"))
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "Relu", "MatMul"]


def _kernel(name: str, library: str | None = None):
    """``name(x, w, y, M, N, K)`` of the Gemv library (this machine's build, or the one at
    ``library``), called on numpy arrays (one thread)."""
    fn = getattr(ctypes.CDLL(library or build_library([], gemv=True).path), name)
    fn.restype = None

    def call(x, w, y, m, n, k):
        ptrs = (ctypes.c_void_p(a.ctypes.data) for a in (x, w, y))
        fn(*ptrs, *map(ctypes.c_int64, (m, n, k)))

    return call


# one row and several; blocks of four weight rows with a rest of 1-3; K with vector tails
GEMV_SHAPES = [(1, 200, 64), (3, 13, 37), (8, 1, 5), (11, 40, 8), (1, 203, 520), (5, 130, 100)]


def _check_gemv(fn, m: int, n: int, k: int, what: str = "") -> None:
    """``gaf_gemv_nk_f32`` (``fn``, from :func:`_kernel`) against numpy in float64."""
    rng = np.random.default_rng(m * n * k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    wt = rng.standard_normal((n, k)).astype(np.float32)
    y = np.empty((m, n), np.float32)
    fn(x, wt, y, m, n, k)
    want = x.astype(np.float64) @ wt.astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4, err_msg=what)


@pytest.mark.parametrize("m,n,k", GEMV_SHAPES)
def test_the_kernel_matches_numpy(m, n, k):
    _check_gemv(_kernel("gaf_gemv_nk_f32"), m, n, k)


@pytest.mark.parametrize(
    "n,k,chunks,rows",
    [
        (100, 100, 1, 100),  # 10K weights: one thread
        (4, 100_000, 1, 4),  # under 8 rows: one thread
        (512, 512, 2, 256),  # 256K weights (1 MB): two chunks from 64K
        (700, 100, 2, 352),  # 70K: two chunks, whole four-row blocks
        (1376, 512, 2, 688),  # 2.8 MB: two chunks of 1 MB-ish
        (1400, 1000, 6, 236),  # five 1 MB chunks become six (even shares)
        (32000, 512, 15, 2136),  # the 65 MB head: 4 MB chunks
    ],
)
def test_the_operator_plans_its_thread_pool_chunks(n, k, chunks, rows):
    fn = ctypes.CDLL(build_library([], gemv=True).path).gaf_gemv_plan
    fn.restype = ctypes.c_int64
    got = ctypes.c_int64(0)
    assert fn(ctypes.c_int64(n), ctypes.c_int64(k), ctypes.byref(got)) == chunks
    assert got.value == rows
    assert rows % 4 == 0 or chunks == 1


@pytest.mark.parametrize(
    "m,n,k", [(1, 700, 100), (1, 1376, 512), (3, 517, 260), (2, 1400, 1000), (1, 4100, 520)]
)
def test_the_operator_in_onnxruntime_splits_a_matrix_into_chunks_and_matches_numpy(m, n, k):
    """Through onnxruntime's thread pool (the chunks of the plan above), the last chunk short."""
    rng = np.random.default_rng(m + n + k)
    wt = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((1, m, k)).astype(np.float32)
    _check_operator("Gemv", wt, wt, x)


def _check_operator(op: str, stored: np.ndarray, wt: np.ndarray, x: np.ndarray) -> None:
    """``op`` (``Gemv`` or ``GemvF16``) on the weight as ``stored`` in a one-node model, run by
    onnxruntime with 2 threads on ``x [1, m, K]``, against numpy on ``wt [N, K]``."""
    from onnx import numpy_helper

    k = x.shape[-1]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w"], ["y"], domain=DOMAIN)],
        op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(stored, "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )
    lib = build_library([], gemv=True)
    y = ort_session(model, "all", 2, custom_ops_library=lib.path).run(None, {"x": x})[0]
    assert y.shape == (*x.shape[:-1], wt.shape[0]) and y.dtype == np.float32
    want = x.astype(np.float64) @ wt.astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


# (rows, weight rows, K): one row (the one-pass dot), groups of four weight rows with a rest,
# K with vector tails, and enough work to split into thread-pool chunks
F16_SHAPES = [(1, 200, 64), (3, 13, 37), (8, 1, 5), (5, 130, 100), (16, 4100, 520), (9, 4096, 520)]


@pytest.mark.parametrize("m,n,k", F16_SHAPES)
def test_the_fp16_kernel_matches_numpy_on_the_rounded_weight(m, n, k):
    fn = _kernel("gaf_gemv_f16_nk")
    rng = np.random.default_rng(m * n * k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    wt = rng.standard_normal((n, k)).astype(np.float16)
    y = np.empty((m, n), np.float32)
    fn(x, wt, y, m, n, k)
    want = x.astype(np.float64) @ wt.astype(np.float64).T
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,n,k", F16_SHAPES)
def test_the_fp16_operator_in_onnxruntime_matches_numpy(m, n, k):
    """Through onnxruntime (its thread pool splits the larger shapes), any leading shape."""
    rng = np.random.default_rng(m + n + k)
    wt = rng.standard_normal((n, k)).astype(np.float16)
    x = rng.standard_normal((1, m, k)).astype(np.float32)
    if n % 16 == 0:  # the panel layout where it applies, else nn.Linear's rows
        stored = np.ascontiguousarray(wt.reshape(n // 16, 16, k).transpose(0, 2, 1))
    else:
        stored = wt
    _check_operator("GemvF16", stored, wt, x)


@pytest.mark.parametrize(
    "m,n,k", [(1, 32, 64), (3, 16, 37), (8, 48, 5), (13, 160, 100), (17, 4096, 520)]
)
def test_the_fp16_panel_kernel_matches_numpy(m, n, k):
    """The panel layout (16 weight rows interleaved along K): tiles of 8 rows, the rest 1-7."""
    from graph_autofusion.codegen.weights import to_half

    fn = _kernel("gaf_gemv_f16_panels")
    rng = np.random.default_rng(m + n * k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = to_half(w, panels=True)
    assert packed.b.shape == (n // 16, k, 16) and packed.b.dtype == np.float16
    y = np.empty((m, n), np.float32)
    fn(x, packed.b, y, m, n, k)
    want = x.astype(np.float64) @ packed.dequantized.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])
def test_the_kernels_are_right_on_avx2_and_plain_c(march, tmp_path):
    """The library compiles per machine (``-march=native``): its AVX2(+F16C) and plain-C paths
    are built here for another ISA level and checked against numpy (this machine may have
    AVX-512, whose path the other tests run)."""
    import shutil
    import subprocess

    from graph_autofusion.codegen.ort_customop_c import customop_library_source
    from graph_autofusion.codegen.weights import to_half

    gcc = shutil.which("gcc")
    if gcc is None:  # pragma: no cover - the suite's kernels need it too
        pytest.fail("no gcc")
    (tmp_path / "k.c").write_text(customop_library_source([], gemv=True))
    so = tmp_path / f"k_{march}.so"
    one_row = tmp_path / f"k1_{march}.so"  # the one-row build gemv_chain.py compares with
    for out, flags in ((so, []), (one_row, ["-DGAF_GV_ROWS=1"])):
        subprocess.run(
            [gcc, "-O2", "-fPIC", "-shared", "-std=gnu11", f"-march={march}", *flags,
             f"-I{ort_include_dir()}", str(tmp_path / "k.c"), "-o", str(out)],
            check=True,
        )  # fmt: skip
    for lib in (so, one_row):  # the fp32 Gemv's four-row and one-row dots
        fn = _kernel("gaf_gemv_nk_f32", str(lib))
        for m, n, k in GEMV_SHAPES:
            _check_gemv(fn, m, n, k, lib.name)
    for name, panels in (("gaf_gemv_f16_panels", True), ("gaf_gemv_f16_nk", False)):
        fn = _kernel(name, str(so))
        for m, n, k in [(1, 32, 64), (1, 48, 103), (2, 16, 9), (6, 48, 37), (13, 160, 100)]:
            rng = np.random.default_rng(m * n + k)
            x = rng.standard_normal((m, k)).astype(np.float32)
            packed = to_half(rng.standard_normal((k, n)).astype(np.float32), panels=panels)
            y = np.empty((m, n), np.float32)
            fn(x, packed.b, y, m, n, k)
            want = x.astype(np.float64) @ packed.dequantized.astype(np.float64)
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4, err_msg=f"{name} {march}")
