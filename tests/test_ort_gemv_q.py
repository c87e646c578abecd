"""The ``GemvQ`` custom operator (8- and 4-bit weights, the dequantization inside the
contraction, fp32 activations): its kernel on every ISA path against numpy, inside onnxruntime,
and as the kernel safe mode picks per layer over ``MatMulNBits`` when it times faster."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.ort_customop import DOMAIN, build_library, ort_include_dir
from graph_autofusion.codegen.ort_gemv_q import to_panels
from graph_autofusion.codegen.weights import quantize
from graph_autofusion.options import FuseOptions
from graph_autofusion.runtime.ort_session import fused_session, ort_session
from graph_autofusion.runtime.timing import use_timer
from tests.tiny_models import matmul_chain

pytestmark = pytest.mark.skipif(
    ort_include_dir() is None, reason="onnxruntime C API header not available"
)

#: (bits, zero point): the stage's int8 (symmetric) and int4 (zero point) forms, and the others
FORMS = [(8, False), (4, True), (8, True), (4, False)]
#: (rows, K, N, block): one row (a decode step), tiles of 8 with rests, blocks of 16-128
SHAPES = [(1, 64, 32, 32), (2, 96, 16, 16), (3, 512, 48, 32), (9, 256, 64, 128), (17, 160, 32, 32)]


def _kernel(path: str | None = None):
    """``gaf_gemv_q`` on numpy arrays: ``(x, wq, s, z, zfull, y, M, N, K, nb, bits)``, ``s``
    fp16 or fp32 (the entry point is told which)."""
    fn = ctypes.CDLL(path or build_library([], gemv=True).path).gaf_gemv_q
    p, i = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, ctypes.c_int, p, i, i, i, i, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int

    def call(x, wq, s, z, zfull, y, *dims):
        assert s.dtype in (np.float16, np.float32)
        ptr = [a.ctypes.data for a in (x, wq, s, z, y)]
        return fn(*ptr[:4], zfull, ptr[4], *dims, int(s.dtype == np.float16))

    return call


#: The kernel's error against numpy on the dequantized weight, relative (L2) to the product:
#: its AVX-512 VNNI path multiplies the weights by two int8 digits of each activation (x to
#: 1 / 64516 of its block's largest); the fp32 paths round in fp32 alone
REL = 4e-5
#: The AVX2 int8 path's (digits within 63: x to 1 / 7938 of its block's largest; Gaussian
#: blocks of 16-128 measured 0.5-1.1e-4 on the shapes below)
REL_AVX2_INT = 4e-4


@functools.lru_cache(maxsize=1)
def _native_rel() -> float:
    """The error bound of the path this machine's library runs (``gaf_gemv_q_vnni``: 2 VNNI,
    1 AVX2 int8 digits, 0 fp32 products)."""
    path = ctypes.CDLL(build_library([], gemv=True).path).gaf_gemv_q_vnni()
    return REL_AVX2_INT if path == 1 else REL


def _assert_close(
    y: np.ndarray, want: np.ndarray, what: str = "", rel_max: float | None = None
) -> None:
    assert np.all(np.isfinite(y)), what
    rel = float(np.linalg.norm(y - want) / np.linalg.norm(want))
    assert rel < (rel_max or _native_rel()), f"{what}: relative error {rel:.2e}"


def _check(
    fn, bits: int, zp: bool, m: int, k: int, n: int, block: int, what: str = "", rel=None
) -> None:
    """``gaf_gemv_q`` on a quantized random weight against numpy on its dequantized values."""
    rng = np.random.default_rng(m * k + n + bits)
    p = quantize(rng.standard_normal((k, n)).astype(np.float32), bits, block, zp)
    wq, s, z = to_panels(p.b, p.scales, p.zero_points, bits, k, n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :block] *= 1e3  # a block far larger than the rest: each block its own digits' scale
    want = x.astype(np.float64) @ p.dequantized.astype(np.float64)
    assert s.dtype == np.float16  # quantize's scales are fp16 values: S fp16, and fp32 too
    for scales in (s, s.astype(np.float32)):
        y = np.full((m, n), np.nan, np.float32)
        assert fn(x, wq, scales, z, int(z.size > 1), y, m, n, k, s.shape[1], bits) == 0
        if m > 1:
            _assert_close(y[1:], want[1:], what, rel)  # rows of ordinary size
        _assert_close(y[:1], want[:1], what, rel)


@pytest.mark.parametrize("bits,zp", FORMS)
@pytest.mark.parametrize("m,k,n,block", SHAPES)
def test_the_kernel_matches_numpy_on_the_dequantized_weight(bits, zp, m, k, n, block):
    _check(_kernel(), bits, zp, m, k, n, block)


def _values(wq: np.ndarray, bits: int) -> np.ndarray:
    """``GemvQ``'s panels ``[P, K / 4, 64 or 32]`` back to the quantized values ``[N, K]`` (the
    layout the module docstring gives, in numpy)."""
    if bits == 4:
        wq = np.concatenate([wq & 15, wq >> 4], axis=-1)
    p, groups, _ = wq.shape
    return wq.reshape(p, groups, 16, 4).transpose(0, 2, 1, 3).reshape(16 * p, 4 * groups)


def _blobs(q: np.ndarray, z: np.ndarray, bits: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantized values ``q [N, K]`` and zero points ``z [N, nb]`` as ``MatMulNBits`` stores
    them (4 bits: two a byte, the first in the low nibble)."""
    n = q.shape[0]
    if bits == 8:
        return q.reshape(n, nb, -1), z
    if nb % 2:
        z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, nb, -1), z[:, 0::2] | (z[:, 1::2] << 4)


def test_the_panels_hold_the_same_quantized_values():
    """``to_panels`` re-lays ``MatMulNBits``' blocks: dequantized back from the panels, the
    weight ``quantize`` rounded to."""
    rng = np.random.default_rng(0)
    for bits, zp in FORMS:
        k, n = 96, 48
        p = quantize(rng.standard_normal((k, n)).astype(np.float32), bits, 32, zp)
        wq, s, z = to_panels(p.b, p.scales, p.zero_points, bits, k, n)
        assert wq.shape == (n // 16, k // 4, 64 if bits == 8 else 32)
        assert s.shape == (n // 16, 3, 16) and z.shape == ((n // 16, 3, 16) if zp else (1,))
        q = _values(wq, bits).astype(np.float32)  # [N, K]
        zz = np.broadcast_to(z if z.size > 1 else z[0], s.shape)  # [P, nb, 16]
        zn = zz.transpose(0, 2, 1).reshape(n, 3).astype(np.float32)
        sn = s.transpose(0, 2, 1).reshape(n, 3)
        blocks = np.arange(k) // 32
        w = (q - zn[:, blocks]) * sn[:, blocks]
        np.testing.assert_array_equal(w.T, p.dequantized)


@pytest.mark.parametrize("m,block", [(3, 12), (1, 20), (2, 20)])
def test_a_block_that_is_not_a_vector_multiple_takes_the_tail_paths(m, block):
    """The kernel takes any block of whole groups of 4 that divides K (the stage writes powers
    of two >= 16): blocks of 12 (all tail) and 20 (a vector and a tail, five groups: four in
    flight and one more for one or two rows) run the loops' tails; a block of 9 is refused."""
    fn = _kernel()
    rng = np.random.default_rng(5)
    nb, n = 3, 32
    k = nb * block
    for bits in (8, 4):
        q = rng.integers(0, 2**bits, (n, k), dtype=np.uint8)
        z = rng.integers(0, 2**bits, (n, nb), dtype=np.uint8)
        scales = rng.random((n, nb), dtype=np.float32)
        b, zb = _blobs(q, z, bits, nb)
        wq, s, zq = to_panels(b, scales, zb, bits, k, n)
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = np.empty((m, n), np.float32)
        arrays = [x, wq, s, zq]
        assert fn(*arrays, 1, y, m, n, k, nb, bits) == 0
        blocks = np.arange(k) // block
        w = (q.astype(np.float64) - z[:, blocks]) * scales[:, blocks]  # [N, K]
        _assert_close(y, x.astype(np.float64) @ w.T, f"bits {bits}")
    k, nb = 36, 4  # blocks of 9
    x = np.ones((1, k), np.float32)
    wq = np.zeros((2, k // 4, 64), np.uint8)
    s, z = np.ones((2, nb, 16), np.float32), np.zeros(1, np.uint8)
    y = np.empty((1, 32), np.float32)
    arrays = [x, wq, s, z]
    assert fn(*arrays, 0, y, 1, 32, k, nb, 8) == -1


def test_a_nan_or_infinite_activation_gives_a_non_finite_row():
    """As the fp32 product does (the VNNI path's digits would otherwise clamp a NaN to a
    finite value): that row's outputs are not finite, the other rows exact."""
    fn = _kernel()
    rng = np.random.default_rng(6)
    k, n = 96, 32
    p = quantize(rng.standard_normal((k, n)).astype(np.float32), 8, 32)
    wq, s, z = to_panels(p.b, p.scales, p.zero_points, 8, k, n)
    for bad in (np.nan, np.inf):
        for pos in (3, 40, 95):
            x = rng.standard_normal((2, k)).astype(np.float32)
            x[0, pos] = bad
            y = np.zeros((2, n), np.float32)
            arrays = [x, wq, s, z]
            assert fn(*arrays, 0, y, 2, n, k, 3, 8) == 0
            assert not np.isfinite(y[0]).any()
            _assert_close(y[1:], x[1:].astype(np.float64) @ p.dequantized.astype(np.float64))


def _host_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (set(ln.split(":", 1)[1].split()) for ln in f if ln.startswith("flags")), set()
            )
    except OSError:  # pragma: no cover - not Linux
        return set()


def _check_largest_sums(fn, what: str) -> None:
    """Every 4-bit weight at its largest code (15) against activations all at the largest
    digit (+-1 with one block scale): the sums the integer paths accumulate are as large as
    they get (the AVX2 path adds 16 groups' pairs in int16: 30240 of 32767), in blocks of 128
    and 512 (2 and 8 such runs a block); the answer is exact up to fp32 rounding."""
    k, n = 1024, 16
    w = np.ones((k, n), np.float32)
    for block in (128, 512):
        w[::block] = 0.0  # each block's minimum: zero point 0, the ones at code 15
        for zp in (True, False):
            p = quantize(w, 4, block, zp)
            wq, s, z = to_panels(p.b, p.scales, p.zero_points, 4, k, n)
            for sign in (1.0, -1.0):
                x = np.full((1, k), sign, np.float32)
                y = np.full((1, n), np.nan, np.float32)
                arrays = [x, wq, s, z]
                assert fn(*arrays, int(z.size > 1), y, 1, n, k, k // block, 4) == 0
                want = x.astype(np.float64) @ p.dequantized.astype(np.float64)
                np.testing.assert_allclose(y, want, rtol=1e-5, err_msg=f"{what} block {block}")


#: the builds (ISA level, defines), the CPU flags a host needs to run each, the path's error
MARCH_NEEDS = {
    ("x86-64-v4", ""): ({"avx512f", "avx512bw"}, REL_AVX2_INT),  # int8 digits by vpmaddubsw
    ("x86-64-v4", "-DGAF_GQ_NO_I2"): ({"avx512f", "avx512bw"}, REL),  # fp32 products
    ("x86-64-v3", ""): ({"avx2", "fma"}, REL_AVX2_INT),
    ("x86-64-v3", "-DGAF_GQ_NO_I2"): ({"avx2", "fma"}, REL),
    ("x86-64-v3", "-mno-f16c"): ({"avx2", "fma"}, REL_AVX2_INT),  # fp16 scales widened in C
    ("x86-64", ""): (set(), REL),
}


@pytest.mark.parametrize("march,define", list(MARCH_NEEDS))
def test_the_kernel_is_right_on_avx512_without_vnni_avx2_and_plain_c(march, define, tmp_path):
    """Compiled per machine (``-march=native``): AVX-512 without VNNI and AVX2 (int8 digits by
    vpmaddubsw, and fp32 products where built so) and plain C, built here for another ISA
    level (the other tests run this machine's path); a level this CPU cannot execute is not
    run (it would die of an illegal instruction)."""
    from graph_autofusion.codegen.ort_customop_c import customop_library_source

    needs, rel = MARCH_NEEDS[(march, define)]
    missing = needs - _host_flags()
    if missing:
        pytest.skip(f"this CPU cannot run {march} code (no {', '.join(sorted(missing))})")
    gcc = shutil.which("gcc")
    if gcc is None:  # pragma: no cover - the suite's kernels need it too
        pytest.fail("no gcc")
    (tmp_path / "k.c").write_text(customop_library_source([], gemv=True))
    so = tmp_path / f"k_{march}.so"
    subprocess.run(
        [gcc, "-O2", "-fPIC", "-shared", "-std=gnu11", f"-march={march}", *define.split(),
         f"-I{ort_include_dir()}", str(tmp_path / "k.c"), "-o", str(so)],
        check=True,
    )  # fmt: skip
    lib = ctypes.CDLL(str(so))
    want_path = 1 if rel == REL_AVX2_INT else 0
    assert lib.gaf_gemv_q_vnni() == want_path  # the path this build runs
    fn = _kernel(str(so))
    for bits, zp in FORMS:
        for m, k, n, block in SHAPES:
            _check(fn, bits, zp, m, k, n, block, f"{march}{define} bits {bits} zp {zp} m {m}", rel)
    _check_largest_sums(fn, f"{march}{define}")
    # a block of activations near the float range's bottom (a digit scale there would be
    # denormal, its inverse infinite): finite, about zero, on every path
    p = quantize(np.ones((32, 16), np.float32), 8, 32, False)
    wq, s, z = to_panels(p.b, p.scales, p.zero_points, 8, 32, 16)
    x = np.full((1, 32), 1e-38, np.float32)
    x[0, 3] = 0.0
    y = np.full((1, 16), np.nan, np.float32)
    assert fn(x, wq, s, z, 0, y, 1, 16, 32, 1, 8) == 0
    assert np.all(np.isfinite(y)) and np.all(np.abs(y) < 1e-30)
    if want_path:  # a NaN or infinite activation: that row's outputs non-finite, not the next
        p = quantize(np.ones((64, 16), np.float32), 8, 32, False)
        wq, s, z = to_panels(p.b, p.scales, p.zero_points, 8, 64, 16)
        for bad in (np.nan, np.inf):
            x = np.ones((2, 64), np.float32)
            x[0, 3] = bad
            y = np.zeros((2, 16), np.float32)
            arrays = [x, wq, s, z]
            assert fn(*arrays, 0, y, 2, 16, 64, 2, 8) == 0
            assert not np.isfinite(y[0]).any() and np.allclose(y[1], 64.0, rtol=1e-3)


def _one_node(k: int, arrays, x_shape) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(a, name) for a, name in zip(arrays, ("w", "s", "z"))]
    graph = helper.make_graph(
        [helper.make_node("GemvQ", ["x", "w", "s", "z"], ["y"], domain=DOMAIN)],
        "gemvq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )


@pytest.mark.parametrize("bits,zp", FORMS)
@pytest.mark.parametrize("lead", [(1, 1), (1, 3), (2, 5), (1, 64)])
def test_the_operator_in_onnxruntime_matches_numpy(bits, zp, lead):
    """Through onnxruntime's thread pool (the zoo Llama's up projection splits into chunks),
    any leading shape, one row or a prefill's."""
    k, n = 512, 1376
    rng = np.random.default_rng(bits + lead[1])
    p = quantize(rng.standard_normal((k, n)).astype(np.float32), bits, 32, zp)
    model = _one_node(k, to_panels(p.b, p.scales, p.zero_points, bits, k, n), ["b", "s", k])
    lib = build_library([], gemv=True)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    y = ort_session(model, "all", 2, custom_ops_library=lib.path).run(None, {"x": x})[0]
    assert y.shape == (*lead, n) and y.dtype == np.float32
    want = x.astype(np.float64) @ p.dequantized.astype(np.float64)
    _assert_close(y, want)


def test_scales_in_fp16_where_exact_give_the_fp32_scales_answer():
    """``quantize`` rounds the block scales to fp16 (in its normal range) and the codes against
    them, so ``GemvQ`` stores ``S`` in half the bytes: the same products as the same scales in
    fp32, in onnxruntime and through the entry point (a weight whose scales fp16 would round
    keeps fp32 ``S``, as do scales below fp16's normal range); an ``S`` of another type is
    refused by name."""
    k, n = 256, 48
    rng = np.random.default_rng(11)
    lib = build_library([], gemv=True)
    fn = _kernel()
    x = rng.standard_normal((3, k)).astype(np.float32)
    for bits, zp in FORMS:
        w = rng.standard_normal((k, n)).astype(np.float32)
        # a block whose scale lies just above an fp16 value (1/16): rounded to nearest, its
        # scale would shrink and both ends (7.5 steps from zero each) round outwards past
        # the 4-bit range, the top clipped by more than half a step
        w[:32, 0], a = 0.0, 7.5 * 0.0625 * (1 + 2**-12)
        w[0, 0], w[1, 0] = -a, a
        p = quantize(w, bits, 32, zp)
        assert np.array_equal(p.scales.astype(np.float16).astype(np.float32), p.scales)
        # rounded up, so every weight is within half a step of its code (none clipped)
        step = np.repeat(p.scales.T, 32, axis=0)  # [K, N]
        assert np.all(np.abs(w - p.dequantized) <= 0.5 * step * (1 + 1e-6)), (bits, zp)
        wq, s, z = to_panels(p.b, p.scales, p.zero_points, bits, k, n)
        assert s.dtype == np.float16
        s32 = s.astype(np.float32)
        ys = []
        for scales in (s, s32):
            sess = ort_session(_one_node(k, (wq, scales, z), [3, k]), "all", 2,
                               custom_ops_library=lib.path)  # fmt: skip
            ys.append(sess.run(None, {"x": x})[0])
            y = np.full((3, n), np.nan, np.float32)
            assert fn(x, wq, scales, z, int(z.size > 1), y, 3, n, k, k // 32, bits) == 0
            ys.append(y)
        for y in ys[1:]:
            np.testing.assert_array_equal(y, ys[0])
        _assert_close(ys[0], x.astype(np.float64) @ p.dequantized.astype(np.float64))
    tiny = quantize(rng.standard_normal((k, n)).astype(np.float32) * 1e-6, 8, 32)
    assert to_panels(tiny.b, tiny.scales, None, 8, k, n)[1].dtype == np.float32
    wq, s, z = to_panels(p.b, p.scales, p.zero_points, bits, k, n)
    bad = _one_node(k, (wq, s.astype(np.float64), z), [3, k])
    sess = ort_session(bad, "all", 1, custom_ops_library=lib.path)
    with pytest.raises(Exception, match="GemvQ.*S must be float16 or float32"):
        sess.run(None, {"x": x})


def test_a_malformed_operator_fails_naming_it():
    k, n = 64, 32
    p = quantize(np.ones((k, n), np.float32), 8, 32)
    wq, s, z = to_panels(p.b, p.scales, p.zero_points, 8, k, n)
    lib = build_library([], gemv=True)
    bad = _one_node(k, (wq, s[:1].copy(), z), [1, k])  # scales for one panel of two
    sess = ort_session(bad, "all", 1, custom_ops_library=lib.path)
    with pytest.raises(Exception, match="GemvQ.*S must be"):
        sess.run(None, {"x": np.ones((1, k), np.float32)})
    bad = _one_node(k, (wq, s, np.zeros(2, np.uint8)), [1, k])
    sess = ort_session(bad, "all", 1, custom_ops_library=lib.path)
    with pytest.raises(Exception, match="GemvQ.*Z must be"):
        sess.run(None, {"x": np.ones((1, k), np.float32)})


def _mlp() -> onnx.ModelProto:
    """x[b, s, 64] -> 64x128 -> Relu -> 128x128 -> Relu -> 128x64 (+ bias): three layers that
    fit GemvQ (16 divides N, whole blocks of 32 along K)."""
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in ((64, 128), (128, 128))]
    ws.append((rng.standard_normal((128, 64)) * 0.1).astype(np.float32))
    return matmul_chain(ws, bias=np.full(64, 0.1, np.float32))


def _timer(gemvq_faster: bool):
    """Compressed faster than fp32; GemvQ faster than MatMulNBits or not (each call still
    runs, so a wrong answer or a crash would show)."""

    def timer(key, side, fn):
        fn()
        if key.startswith("weights-kernel@"):
            return (1e-5 if gemvq_faster else 3e-5) if side == "fused" else 2e-5
        return 1e-5 if side == "fused" else 2e-5

    return timer


def _ops(model) -> dict[str, int]:
    """Operator counts of a fused (IR) model."""
    out: dict[str, int] = {}
    for node in model.graph.nodes:
        out[node.op_type] = out.get(node.op_type, 0) + 1
    return out


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_safe_mode_puts_a_layer_on_gemvq_where_it_times_faster(form, tmp_path):
    src = _mlp()
    x = np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32)
    gaf = GraphAutoFusion(src, sample_inputs={"x": x}, options=FuseOptions(weights=form))
    with use_timer(_timer(True)):
        fused = gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert {r.kernel for r in layers.values()} == {"GemvQ"}
    assert all(set(r.kernel_times_us) == {"MatMulNBits", "GemvQ"} for r in layers.values())
    assert _ops(fused).get("GemvQ") == 3 and "MatMulNBits" not in _ops(fused)
    assert "3 contractions are GemvQ" in " ".join(gaf.result.weights.notes)
    # the same quantized values as MatMulNBits, the activations kept fp32: the product with
    # the dequantized weights, up to rounding order
    path = str(tmp_path / "m.onnx")
    gaf.save(path)  # the library beside it, named in the manifest
    manifest = json.loads(open(os.path.join(gaf.kernel_dir, "manifest.json")).read())
    assert "GemvQ" in {op["name"] for op in manifest["operators"]}
    got = fused_session(path, threads=2).run(None, {"x": x})[0]
    ref = GraphAutoFusion(src, sample_inputs={"x": x}, options=FuseOptions(weights=form))
    with use_timer(_timer(False)):
        nbits = ref.fuse()
    assert _ops(nbits).get("MatMulNBits") == 3 and "GemvQ" not in _ops(nbits)
    assert {r.kernel for r in ref.result.weights.layers} == {"MatMulNBits"}
    ref.save(str(tmp_path / "nbits.onnx"))
    other = fused_session(str(tmp_path / "nbits.onnx"), threads=2).run(None, {"x": x})[0]
    want = ort_session(src, "disable", 2).run(None, {"x": x})[0]

    def cos(a):
        return float((a * want).sum() / np.linalg.norm(a) / np.linalg.norm(want))

    # the weights' rounding alone (MatMulNBits also rounds the activations to int8)
    assert cos(got) > (0.9999 if form == "int8" else 0.99) and cos(got) >= cos(other) - 1e-5
    again = fused_session(path, threads=2).run(None, {"x": np.concatenate([x] * 5, 1)})[0]
    np.testing.assert_allclose(again, np.concatenate([got] * 5, 1), rtol=1e-5, atol=1e-6)


def test_the_drop_in_module_saves_its_gemvq_layers_and_an_untimed_reload_keeps_them(tmp_path):
    """The torch route: the layers safe mode put on GemvQ are saved as ``"int8+GemvQ"`` in the
    plan, and a reload, which does not time them (``load_fused`` fuses with ``check_speed``
    off), keeps that kernel (each layer's output still checked)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from graph_autofusion.testing.small_hf import tiny_llama
    from graph_autofusion.torch_module import PLAN_FILE, load_fused

    model = tiny_llama()
    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(3))
    call = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    torch._dynamo.reset()
    try:
        gaf = GraphAutoFusion(model, options=FuseOptions(weights="int8"))
        with use_timer(_timer(True)):
            fused = gaf.fuse()
            with torch.no_grad():
                got = fused(**call).logits
        on_q = {r.name for r in gaf.result.weights.compressed if r.kernel == "GemvQ"}
        assert on_q and all(
            r.form == "int8" for r in gaf.result.weights.compressed if r.name in on_q
        )
        fused.save_pretrained(tmp_path)
        plan = json.loads((tmp_path / PLAN_FILE).read_text())
        saved = plan["graphs"][0]["compressed"]
        assert {n for n, f in saved.items() if f == "int8+GemvQ"} == on_q
        torch._dynamo.reset()
        loaded = load_fused(transformers.LlamaForCausalLM.from_pretrained(tmp_path), tmp_path)
        with torch.no_grad():
            again = loaded(**call).logits
        (graph,) = loaded.autofusion.graphs
        kernels = {r.name: r.kernel for r in graph.ort_result.weights.compressed}
        assert {n for n, k in kernels.items() if k == "GemvQ"} == on_q
        np.testing.assert_allclose(again.numpy(), got.numpy(), rtol=0, atol=1e-5)
    finally:
        torch._dynamo.reset()


def test_layers_gemvq_cannot_run_stay_on_matmulnbits():
    """N not a multiple of 16 (64x120) and K not whole blocks (120x64): MatMulNBits, however
    the timer ranks GemvQ; the 64x64 layer goes to GemvQ; the saved model runs."""
    rng = np.random.default_rng(4)
    ws = [
        (rng.standard_normal(s) * 0.1).astype(np.float32) for s in ((64, 120), (120, 64), (64, 64))
    ]
    src = matmul_chain(ws, x_shape=[1, 1, 64])  # fc1, fc2, fc3
    feeds = {"x": rng.standard_normal((1, 1, 64)).astype(np.float32)}
    opts = FuseOptions(weights="int8", weights_policy="all")
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=opts)
    with use_timer(_timer(True)):
        fused = gaf.fuse()
    kernels = {r.name: r.kernel for r in gaf.result.weights.layers}
    assert kernels == {"fc1": "MatMulNBits", "fc2": "MatMulNBits", "fc3": "GemvQ"}
    assert _ops(fused).get("GemvQ") == 1 and _ops(fused).get("MatMulNBits") == 2
    note = " ".join(gaf.result.weights.notes)
    assert "3 contractions are MatMulNBits (2) and GemvQ (1)" in note
    got = fused_session_of(gaf, feeds)
    want = ort_session(src, "disable", 2).run(None, feeds)[0]
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def fused_session_of(gaf, feeds):
    """The fused model saved and run as a deployment opens it."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        gaf.save(path)
        return fused_session(path, threads=2).run(None, feeds)[0]
