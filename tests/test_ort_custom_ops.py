"""Generated kernels inside onnxruntime: custom operators in one library per model, built and
loaded for real, checked against the unfused model in real onnxruntime sessions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.lower import lower_group
from graph_autofusion.codegen.ort_customop import (
    DOMAIN,
    ENV_CFLAGS,
    META_LIBRARY,
    build_library,
    op_name,
    ort_include_dir,
)
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.text import parse_model
from graph_autofusion.pipeline.cpu_kernels import finalize_kernel
from graph_autofusion.runtime.kernels import load_library
from graph_autofusion.runtime.ort_session import fused_session, ort_session
from graph_autofusion.testing.fused_groups import RngChooser, random_group

# SwiGLU (gate and up projections kept on onnxruntime's GEMM), then a tanh-GELU chain with a
# residual: an automatic cluster after the down projection's bias
TEXT = """
model opset {"": 17}
graph g(%x: f32[B,S,256]) -> (%y) {
  init %wg: f32[256,512] = randn(0)
  init %wu: f32[256,512] = randn(1)
  init %wd: f32[512,256] = randn(2)
  init %b: f32[256] = randn(3)
  %g: f32[B,S,512] = MatMul(%x, %wg)
  %u: f32[B,S,512] = MatMul(%x, %wu)
  %sg: f32[B,S,512] = Sigmoid(%g)
  %sw: f32[B,S,512] = Mul(%g, %sg)
  %h: f32[B,S,512] = Mul(%sw, %u)
  %d: f32[B,S,256] = MatMul(%h, %wd)
  %e: f32[B,S,256] = Mul(%d, %b)
  %c: f32[B,S,256] = Mul(%e, %e)
  %c3: f32[B,S,256] = Mul(%c, %e)
  %k: f32[B,S,256] = Mul(%c3, %b)
  %i: f32[B,S,256] = Add(%e, %k)
  %t: f32[B,S,256] = Tanh(%i)
  %t1: f32[B,S,256] = Add(%t, %b)
  %q: f32[B,S,256] = Mul(%t1, %e)
  %y: f32[B,S,256] = Add(%q, %x)
}
"""

needs_header = pytest.mark.skipif(
    ort_include_dir() is None, reason="onnxruntime C API header not available"
)


def _feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": (0.5 * rng.standard_normal((batch, seq, 256))).astype(np.float32)}


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Equal up to fp32 rounding at the output's scale (the random weights make it ~1e3)."""
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def _plain(proto_or_path, library=None):
    """The session plain onnxruntime makes (no library found for the user: only ``library``,
    registered by its path as a user registers it)."""
    return ort_session(proto_or_path, "all", custom_ops_library=library, find_library=False)


def _gaf(model) -> GraphAutoFusion:
    # a shipped profile: what is planned must not depend on this machine's calibration
    gaf = GraphAutoFusion(
        model,
        preset="all",
        hardware="x86_avx2",
        sample_inputs=_feeds(1, 64),
        benefit_threshold=0.01,
    )
    gaf.options = gaf.options.replace(custom_ops=True)
    return gaf


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    model = parse_model(TEXT)
    gaf = _gaf(model)
    gaf.fuse(check_speed=False)
    path = str(tmp_path_factory.mktemp("fused") / "fused.onnx")
    gaf.save(path)
    return gaf, model, path


def test_the_set_up_installs_the_c_api_header():
    inc = ort_include_dir()
    assert inc is not None, "run `make` (tools/ort_headers.sh) to install onnxruntime_c_api.h"
    assert os.path.isfile(os.path.join(inc, "onnxruntime_c_api.h"))


@needs_header
def test_swiglu_and_a_gelu_chain_become_custom_operators_that_match_the_original(fused):
    gaf, model, path = fused
    result = gaf.result
    custom = [n for n in result.model.graph.nodes if n.domain == DOMAIN]
    assert len(custom) == 2, result.skipped_by_reason()
    keys = {low.key for low in result.lowered}
    assert any(k.startswith("swiglu@") for k in keys) and any(k.startswith("cluster") for k in keys)
    # the SwiGLU's projections stay onnxruntime MatMuls feeding the operator
    assert [n.op_type for n in result.model.graph.nodes].count("MatMul") == 3
    assert all(result.safety[k].passed for k in keys)
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta[META_LIBRARY] == "fused.onnx.kernels/libgaf_custom_ops.so"
    assert sorted(os.listdir(path + ".kernels")) == [
        "custom_ops.c",
        "libgaf_custom_ops.so",
        "manifest.json",
    ]
    sess = fused_session(path)
    ref = _plain(to_onnx(model))
    for batch, seq in ((1, 64), (3, 7), (2, 129)):  # other sizes than the sample's
        feeds = _feeds(batch, seq, seed=batch)
        (want,) = ref.run(None, feeds)
        (got,) = sess.run(None, feeds)
        _close(got, want)


@needs_header
def test_a_saved_plan_lowers_its_custom_operators_where_the_cost_model_would_not(fused):
    """``fuse_model(keys=...)`` (``load_fused``'s saved plan) applies the saved keys to our
    kernels as to native rewrites: a plan whose cost model chooses nothing here (a threshold
    no fusion passes, as a close call this machine leaves to timing) still gets its swiglu and
    cluster operators; they were dropped without a reason."""
    from graph_autofusion.pipeline import fuse_model

    gaf, model, _path = fused
    keys = [low.key for low in gaf.result.lowered]
    opts = gaf.options.replace(benefit_threshold=0.99, check_speed=False)
    assert not fuse_model(model, gaf.rules, "x86_avx2", options=opts, feeds=_feeds(1, 64)).lowered
    again = fuse_model(
        model, gaf.rules, "x86_avx2", options=opts, feeds=_feeds(1, 64), keys=[*keys, "gone@x"]
    )
    assert sorted(low.key for low in again.lowered) == sorted(keys)
    assert sum(n.domain == DOMAIN for n in again.model.graph.nodes) == 2
    # the report says so: the saved set is the chosen one, with its estimate; a saved key that
    # matches nothing is a note
    chosen = {a.key: a for a in again.analysis.candidates if a.chosen}
    assert set(chosen) == set(keys) and {a.code for a in chosen.values()} == {"chosen"}
    assert again.analysis.time_after_s < again.analysis.time_before_s
    assert any("saved plan: 1 fusion(s) match nothing" in n and "gone@x" in n for n in again.notes)
    # a candidate the cost model chooses but the saved plan leaves out is not fused, and why
    swiglu = [k for k in keys if k.startswith("swiglu@")]
    only = fuse_model(model, gaf.rules, "x86_avx2", options=gaf.options.replace(
        check_speed=False), feeds=_feeds(1, 64), keys=swiglu)  # fmt: skip
    assert [low.key for low in only.lowered] == swiglu
    dropped = [a for a in only.analysis.candidates if a.code == "not-in-saved-plan"]
    assert dropped and all(not a.chosen and a.key not in swiglu for a in dropped)
    assert "not-in-saved-plan" in only.skipped_by_reason()


@needs_header
def test_a_plain_session_without_the_library_fails_naming_the_domain(fused):
    _gaf, _model, path = fused
    with pytest.raises(Exception, match=DOMAIN):
        _plain(path)
    # with the library registered by its path, as a user registers it, it runs
    _plain(path, library=path + ".kernels/libgaf_custom_ops.so").run(None, _feeds(1, 5))


@needs_header
def test_the_cli_verifies_and_benches_a_fused_file_with_its_kernels_in_a_new_process(
    fused, tmp_path
):
    """``verify`` and ``bench`` of a file written with custom operators, in a process that did
    not fuse it: the library its metadata names is registered (they failed with "not a
    registered function/op", bench with a traceback); without the kernel folder, one line
    naming the missing library."""
    _gaf, model, path = fused
    orig = str(tmp_path / "orig.onnx")
    onnx.save(to_onnx(model), orig)
    copy = str(tmp_path / "fused.onnx")
    shutil.copy(path, copy)
    shutil.copytree(path + ".kernels", copy + ".kernels")

    def cli(*args):
        cmd = [sys.executable, "-m", "graph_autofusion", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    verify = cli("verify", orig, copy)
    assert verify.returncode == 0 and "PASS" in verify.stdout, verify.stdout + verify.stderr
    bench = cli("bench", orig, copy, "--runs", "3")
    assert bench.returncode == 0 and "improvement" in bench.stdout, bench.stdout + bench.stderr
    shutil.rmtree(copy + ".kernels")
    gone = cli("verify", orig, copy)
    assert gone.returncode == 2 and "Traceback" not in gone.stderr, gone.stderr
    assert "custom-operator library" in gone.stderr and "missing" in gone.stderr, gone.stderr


@needs_header
def test_the_kernel_folder_never_takes_the_users_files(fused, tmp_path):
    gaf, _model, _path = fused
    dest = str(tmp_path / "m.onnx")
    os.makedirs(dest + ".kernels")
    with open(dest + ".kernels/notes.txt", "w") as f:
        f.write("mine")
    gaf.save(dest)
    assert gaf.kernel_dir == dest + ".kernels-2"
    assert os.listdir(dest + ".kernels") == ["notes.txt"]
    meta = {p.key: p.value for p in onnx.load(dest).metadata_props}
    assert meta[META_LIBRARY] == "m.onnx.kernels-2/libgaf_custom_ops.so"
    gaf.save(dest)  # our own folder is reused
    assert gaf.kernel_dir == dest + ".kernels-2"
    fused_session(dest).run(None, _feeds(1, 3))


@needs_header
def test_a_library_that_fails_to_build_falls_back_to_a_runnable_model(monkeypatch):
    monkeypatch.setenv(ENV_CFLAGS, "-fno-such-flag-graph-autofusion")
    model = parse_model(TEXT)
    gaf = _gaf(model)
    fused = gaf.fuse(check_speed=False)
    assert not [n for n in fused.graph.nodes if n.domain == DOMAIN]
    assert gaf.result.custom_ops is None
    assert any("custom operators off" in n and "failed to build" in n for n in gaf.result.notes)
    feeds = _feeds(2, 9)
    (got,) = _plain(to_onnx(fused)).run(None, feeds)
    (want,) = _plain(to_onnx(model)).run(None, feeds)
    _close(got, want)


@needs_header
def test_the_operator_refuses_shapes_it_cannot_serve_with_a_clear_error():
    model = parse_model(
        """
model opset {"": 17}
graph g(%a: f32[N,64], %b: f32[N,64]) -> (%y) {
  %s: f32[N,64] = Sigmoid(%a)
  %y: f32[N,64] = Mul(%s, %b)
}
"""
    )
    from graph_autofusion.cost.shapes import bind_shapes

    nodes = list(model.graph.nodes)
    binding = bind_shapes(model, input_shapes={"a": (4, 64), "b": (4, 64)})
    low = lower_group(nodes, list(model.graph.outputs), binding)
    kernel = finalize_kernel(low.kernel, [(4, 64), (4, 64)])
    lib = build_library([kernel])
    dims = ["N", "M"]
    g = helper.make_graph(
        [helper.make_node(op_name(kernel), ["a", "b"], ["y"], domain=DOMAIN)],
        "g",
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [d, None])
            for n, d in zip("ab", dims)
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )
    sess = ort_session(proto, custom_ops_library=lib.path)
    a = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    (y,) = sess.run(None, {"a": a, "b": a[:1]})  # broadcasting, as ONNX does
    np.testing.assert_allclose(y, a[:1] / (1 + np.exp(-a)), rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match=f"{op_name(kernel)}: input shapes do not broadcast"):
        sess.run(None, {"a": a, "b": a[:, :32].copy()})


_ORT_TYPE = {DType.FLOAT: TensorProto.FLOAT, DType.FLOAT16: TensorProto.FLOAT16}


@needs_header
def test_random_groups_as_custom_operators_match_the_cpu_kernels():
    """Views, broadcasts, reductions, fp16: the wrapper's run-time plan (C) against the cpu
    target's (Python) calling the same kernels, one library for all groups."""
    groups, kernels = [], []
    for seed in range(40):
        g = random_group(RngChooser(seed), name=f"g{seed}")
        if g.dtype not in _ORT_TYPE:
            continue
        low = lower_group(g.nodes, g.outputs, None, name="k", opset=20)
        shapes = [g.feeds[i.name].shape for i in low.kernel.inputs]
        groups.append(g)
        kernels.append(finalize_kernel(low.kernel, shapes))
    assert len(groups) >= 15
    lib = build_library(kernels)
    from graph_autofusion.codegen.compiler import compile_library

    unique = list({k.name: k for k in kernels}.values())
    cpu = load_library(compile_library(unique))
    for g, k in zip(groups, kernels):
        np_dt = np.float32 if g.dtype == DType.FLOAT else np.float16
        feeds = {i.name: np.ascontiguousarray(g.feeds[i.name]).astype(np_dt) for i in k.inputs}
        graph = helper.make_graph(
            [
                helper.make_node(
                    op_name(k),
                    [i.name for i in k.inputs],
                    [o.name for o in k.outputs],
                    domain=DOMAIN,
                )
            ],
            "g",
            [
                helper.make_tensor_value_info(i.name, _ORT_TYPE[g.dtype], feeds[i.name].shape)
                for i in k.inputs
            ],
            [helper.make_tensor_value_info(o.name, _ORT_TYPE[g.dtype], None) for o in k.outputs],
        )
        proto = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, 1)]
        )
        got = ort_session(proto, custom_ops_library=lib.path).run(None, feeds)
        want = cpu.kernel(k.name)(*[feeds[i.name] for i in k.inputs])
        for o, a, b in zip(k.outputs, got, want):
            assert a.shape == tuple(b.shape), f"{g.description}: {o.name} {a.shape} vs {b.shape}"
            np.testing.assert_allclose(
                a.astype(np.float64),
                np.asarray(b, np.float64),
                rtol=1e-6,
                atol=1e-6,
                err_msg=f"{g.description}\n{k.to_text()}",
            )
