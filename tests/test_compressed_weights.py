"""Compressed weights (``FuseOptions.weights``): contractions as onnxruntime's ``MatMulNBits``,
each layer verified by safe mode, failures kept fp32 with their reason."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion import GraphAutoFusion
from graph_autofusion.codegen.ort_customop import ort_include_dir
from graph_autofusion.codegen.weights import KEPT_FP16, KEPT_HEAD, find_sites, quantize
from graph_autofusion.frontend.onnx_frontend import load_onnx, to_onnx
from graph_autofusion.options import FuseOptions, OptionsError
from graph_autofusion.runtime.ort_session import ort_session
from tests.tiny_models import matmul_chain

FAST = dict(check_speed=False)
#: fp16 weights (and an int model's LM head) are the GemvF16 custom operator: its library needs
#: onnxruntime's C API header (``make venv`` fetches it)
needs_library = pytest.mark.skipif(
    ort_include_dir() is None, reason="onnxruntime C API header not available"
)
K0 = 5  # the hidden feature the sensitive layer's outlier sits on


def _mlp(*, outlier: float = 0.0, head: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x[b, s, 64] -> MatMul 64x128 -> Relu -> MatMul 128x128 -> Relu -> MatMul 128x64 -> Add
    (``head``: the last MatMul gives the output itself). ``outlier``: the second matrix's row
    K0 holds it, a feature the first layer never produces (its column K0 is zero): the
    outlier changes nothing in fp32, but per-block quantization flattens the rest of its
    blocks."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((64, 128)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((128, 128)) * 0.1).astype(np.float32)
    w3 = (rng.standard_normal((128, 64)) * 0.1).astype(np.float32)
    if outlier:
        w1[:, K0] = 0.0
        w2[K0, :] = outlier
    return matmul_chain([w1, w2, w3], bias=None if head else np.full(64, 0.1, np.float32))


def _feeds(seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((2, 8, 64)).astype(np.float32)}


def _run(model, feeds):
    sess = ort_session(model, "all")
    return sess.run(None, feeds)[0]


def _cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ops(model) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in model.graph.nodes:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def test_matmulnbits_layout_matches_the_dequantized_weight_in_onnxruntime():
    """The packing (4 bits two to a byte, low nibble first; zero points packed alike) is
    what onnxruntime's kernel reads: at accuracy_level 0 it computes A @ dequantized."""
    from graph_autofusion.codegen.weights_probe import probe_model

    rng = np.random.default_rng(0)
    w = rng.standard_normal((100, 48)).astype(np.float32)  # K not a whole number of blocks
    a = rng.standard_normal((3, 100)).astype(np.float32)
    for bits, block, zp in ((8, 32, False), (8, 16, True), (4, 32, False), (4, 32, True)):
        p = quantize(w, bits, block, zp)
        assert p.b.shape == (48, 4 if block == 32 else 7, block * bits // 8)
        y = ort_session(probe_model([("w", a, p, None)], 0), "disable").run(None, {"a0": a})[0]
        np.testing.assert_allclose(y, a @ p.dequantized, rtol=1e-4, atol=1e-4)
        err = np.linalg.norm(p.dequantized - w) / np.linalg.norm(w)
        assert err < (0.01 if bits == 8 else 0.15)


def test_fp32_default_is_unchanged():
    src = _mlp()
    plain = GraphAutoFusion(src, sample_inputs=_feeds())
    plain.fuse(**FAST)
    explicit = GraphAutoFusion(src, sample_inputs=_feeds(), options=FuseOptions(weights="fp32"))
    explicit.fuse(**FAST)
    assert FuseOptions().weights == "fp32"
    assert plain.result.weights is None and explicit.result.weights is None
    assert "weights" not in plain.safe_fusion_report().to_dict()
    a = to_onnx(plain.result.model).SerializeToString()
    assert a == to_onnx(explicit.result.model).SerializeToString()
    assert "MatMulNBits" not in _ops(plain.result.model)


@pytest.mark.parametrize("form, floor", [("int8", 0.999), ("int4", 0.98)])
def test_int8_and_int4_compress_every_layer_and_stay_close(form, floor):
    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights=form, **FAST))
    fused = gaf.fuse()
    assert _ops(fused).get("MatMulNBits") == 3 and "MatMul" not in _ops(fused)
    assert _cosine(_run(fused, feeds), _run(src, feeds)) >= floor
    rep = gaf.safe_fusion_report().to_dict()["weights"]
    assert rep["form"] == form and rep["compressed"] == 3 and rep["verified"]
    for layer in rep["layers"]:
        assert layer["form"] == form and layer["block_size"] == 32
        assert layer["cosine"] >= floor and 0 < layer["rel_err"] < 0.2
        assert layer["bytes"] < 0.3 * layer["fp32_bytes"]
    e2e = rep["end_to_end"]["y"]
    assert e2e["passed"] and e2e["cosine"] >= floor
    text = gaf.safe_fusion_report().to_text()
    assert f"weights {form}: 3 contractions compressed" in text


def test_a_sensitive_layer_is_rolled_back_alone_and_reported():
    src, feeds = _mlp(outlier=50.0), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST))
    fused = gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert layers["fc2"].form == "fp32" and "layer check" in layers["fc2"].reason
    assert layers["fc2"].cosine < 0.999  # measured, and below the floor
    assert layers["fc1"].form == "int8" and layers["fc3"].form == "int8"
    assert _ops(fused).get("MatMulNBits") == 2 and _ops(fused).get("MatMul") == 1
    # the fp32 model does not see the outlier (its feature is always zero): neither does ours
    assert _cosine(_run(fused, feeds), _run(src, feeds)) >= 0.999
    # unchecked (safe mode off) the same layer is compressed, and the output is worse
    unsafe = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8"))
    lossy = unsafe.fuse(safe_mode=False)
    assert _ops(lossy).get("MatMulNBits") == 3 and not unsafe.result.weights.verified
    assert _cosine(_run(lossy, feeds), _run(src, feeds)) < _cosine(
        _run(fused, feeds), _run(src, feeds)
    )


def test_policy_and_unsupported_weights_stay_fp32_with_a_reason():
    # the layer producing the output (an LM head) stays fp32 by policy
    sites = {s.name: s for s in find_sites(load_onnx(_mlp(head=True)))}
    assert sites["fc3"].reason == KEPT_HEAD and not sites["fc1"].reason
    # a weight that is a graph input, a tiny matrix, a Gemm with transB, MatMul(x, W^T)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "wv"], ["a"], name="variable"),
        helper.make_node("MatMul", ["x", "tiny"], ["b"], name="tiny"),
        helper.make_node("Gemm", ["x2", "wt", "bias"], ["c"], name="gemm", transB=1),
        helper.make_node("Transpose", ["wt"], ["wtt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wtt"], ["d"], name="transposed"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [4, 64]),
            helper.make_tensor_value_info("wv", TensorProto.FLOAT, [64, 96]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abcd"],
        [
            numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "tiny"),
            numpy_helper.from_array(np.ascontiguousarray(w.T), "wt"),
            numpy_helper.from_array(np.ones(96, np.float32), "bias"),
        ],
    )
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    sites = {s.name: s for s in find_sites(model, keep_head=False)}
    assert "not a constant" in sites["variable"].reason
    assert "tiny matrix" in sites["tiny"].reason
    assert not sites["gemm"].reason and sites["gemm"].bias is not None
    np.testing.assert_array_equal(sites["gemm"].weight, w)
    assert not sites["transposed"].reason
    np.testing.assert_array_equal(sites["transposed"].weight, w)


def test_gemm_and_transposed_weights_compress_to_close_outputs():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 96)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "wt", "bias"], ["c"], name="gemm", transB=1),
        helper.make_node("Transpose", ["wt"], ["wtt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wtt"], ["d"], name="transposed"),
        helper.make_node(
            "FusedMatMul", ["x", "wt"], ["f"], name="fused", domain="com.microsoft", transB=1
        ),
        helper.make_node("Add", ["c", "d"], ["cd"]),
        helper.make_node("Add", ["cd", "f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 96])],
        [
            numpy_helper.from_array(np.ascontiguousarray(w.T), "wt"),
            numpy_helper.from_array(np.linspace(-1, 1, 96).astype(np.float32), "bias"),
        ],
    )
    src = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32)}
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST))
    fused = gaf.fuse()
    assert _ops(fused).get("MatMulNBits") == 3 and "Gemm" not in _ops(fused)
    assert "FusedMatMul" not in _ops(fused)
    assert _cosine(_run(fused, feeds), _run(src, feeds)) >= 0.999


def _linear_bias_model(*, product_read_twice: bool = False, bias_shape=(96,)) -> onnx.ModelProto:
    """x[b, s, 64] -> MatMul 64x96 -> Add bias (a ``Linear`` as exported for 3-D input) -> y;
    ``product_read_twice``: the product is also read by a Relu, a second output."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 96)) * 0.1).astype(np.float32)
    bias = np.linspace(-1, 1, 96).astype(np.float32).reshape(bias_shape)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"], name="fc"),
        helper.make_node("Add", ["bias", "p"], ["y"]),  # the constant first: either order
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if product_read_twice:
        nodes.append(helper.make_node("Relu", ["p"], ["r"]))
        outs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
        outs,
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_linear_bias_add_becomes_the_matmulnbits_bias_input():
    src = _linear_bias_model()
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 8, 64)).astype(np.float32)}
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST))
    fused = gaf.fuse()
    ops = _ops(fused)
    assert ops == {"MatMulNBits": 1}, ops  # the Add went into the kernel
    (node,) = fused.graph.nodes
    assert len(node.inputs) == 6 and node.inputs[5] is not None  # [A, B, scales, -, -, bias]
    assert [o.name for o in fused.graph.outputs] == ["y"]
    got, want = _run(fused, feeds), _run(src, feeds)
    assert got.shape == want.shape and _cosine(got, want) >= 0.9999
    # the per-layer check compared the layer with its bias against the Add's output
    (layer,) = gaf.result.weights.compressed
    assert layer.cosine >= 0.999 and layer.rel_err < 0.05


@pytest.mark.parametrize("case", ["read_twice", "broadcast_up"])
def test_a_bias_add_is_left_alone_where_folding_would_change_the_graph(case):
    if case == "read_twice":
        src = _linear_bias_model(product_read_twice=True)
    else:  # a [1, 1, 1, 96] constant makes the 3-D product 4-D: not a bias
        src = _linear_bias_model(bias_shape=(1, 1, 1, 96))
    sites = find_sites(load_onnx(src), min_elements=0)
    assert len(sites) == 1 and sites[0].bias is None and sites[0].tail is None
    feeds = {"x": np.random.default_rng(4).standard_normal((2, 8, 64)).astype(np.float32)}
    fused = GraphAutoFusion(
        src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST)
    ).fuse()
    assert {k: v for k, v in _ops(fused).items() if k != "Relu"} == {"MatMulNBits": 1, "Add": 1}
    for got, want in zip(
        ort_session(fused, "all").run(None, feeds), ort_session(src).run(None, feeds)
    ):
        assert got.shape == want.shape and _cosine(got, want) >= 0.9999


def _gemv_f16_ops(model) -> int:
    return sum(n.op_type == "GemvF16" for n in model.graph.nodes)


@needs_library
def test_fp16_weights_run_on_gemvf16_and_match_the_fp16_rounded_weights():
    """Every contraction becomes GemvF16 over an fp16 copy of its weight (the bias Add kept
    after it); the outputs are those of the fp16-rounded weights in float64, to fp32's
    accumulation error, and the weights take half the bytes."""
    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="fp16", **FAST))
    fused = gaf.fuse()
    assert _gemv_f16_ops(fused) == 3 and "MatMul" not in _ops(fused)
    halves = [v for v in fused.graph.initializers.values() if v.const.dtype == np.float16]
    assert len(halves) == 3
    rep = gaf.safe_fusion_report().to_dict()["weights"]
    assert rep["form"] == "fp16" and rep["compressed"] == 3 and rep["verified"]
    for layer in rep["layers"]:
        assert layer["form"] == "fp16" and layer["block_size"] is None
        assert layer["cosine"] >= 0.99999 and layer["rel_err"] < 1e-3
        assert layer["bytes"] == layer["fp32_bytes"] // 2
    # the model's own arithmetic, with each weight rounded to fp16, in float64
    ws = {n: numpy_helper.to_array(i) for n, i in ((i.name, i) for i in src.graph.initializer)}
    x = feeds["x"].astype(np.float64)
    h = np.maximum(x @ ws["w1"].astype(np.float16).astype(np.float64), 0)
    h = np.maximum(h @ ws["w2"].astype(np.float16).astype(np.float64), 0)
    want = h @ ws["w3"].astype(np.float16).astype(np.float64) + ws["b3"]
    np.testing.assert_allclose(_run(fused, feeds), want, rtol=1e-4, atol=1e-5)
    assert "3 contractions are GemvF16" in " ".join(gaf.result.notes)


@needs_library
def test_fp16_saved_model_reloads_with_its_library(tmp_path):
    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="fp16", **FAST))
    fused = gaf.fuse()
    gaf.save(tmp_path / "fp16.onnx")
    assert gaf.kernel_dir and os.path.isdir(gaf.kernel_dir)
    manifest = json.loads(open(os.path.join(gaf.kernel_dir, "manifest.json")).read())
    assert "GemvF16" in {op["name"] for op in manifest["operators"]}
    from graph_autofusion.runtime.ort_session import fused_session

    sess = fused_session(str(tmp_path / "fp16.onnx"))
    np.testing.assert_array_equal(sess.run(None, feeds)[0], _run(fused, feeds))


@needs_library
def test_fp16_keeps_the_head_fp32_by_default_and_rounds_it_under_policy_all():
    src, feeds = _mlp(head=True), _feeds()
    default = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="fp16", **FAST))
    default.fuse()
    forms = {r.name: (r.form, r.reason) for r in default.result.weights.layers}
    assert forms["fc3"] == ("fp32", KEPT_HEAD) and forms["fc1"][0] == "fp16"
    every = GraphAutoFusion(
        src, sample_inputs=feeds, options=FuseOptions(weights="fp16", weights_policy="all", **FAST)
    )
    every.fuse()
    assert all(r.form == "fp16" for r in every.result.weights.layers)


@needs_library
def test_fp16_a_weight_beyond_fp16_range_stays_fp32_with_the_reason():
    src, feeds = _mlp(outlier=1e6), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="fp16", **FAST))
    fused = gaf.fuse()
    forms = {r.name: r for r in gaf.result.weights.layers}
    assert forms["fc2"].form == "fp32" and "layer check" in forms["fc2"].reason
    assert forms["fc1"].form == forms["fc3"].form == "fp16"
    np.testing.assert_allclose(_run(fused, feeds), _run(src, feeds), rtol=1e-3, atol=1e-3)


def test_fp16_without_a_buildable_library_is_kept_fp32_with_the_reason(monkeypatch):
    from graph_autofusion.pipeline import ort_kernels

    monkeypatch.setattr(ort_kernels, "ort_include_dir", lambda: None)
    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="fp16", **FAST))
    fused = gaf.fuse()
    assert _gemv_f16_ops(fused) == 0
    layers = gaf.result.weights.layers
    assert len(layers) == 3 and all(r.form == "fp32" and r.reason == KEPT_FP16 for r in layers)
    np.testing.assert_allclose(_run(fused, feeds), _run(src, feeds), rtol=1e-5, atol=1e-5)


def test_unknown_weight_form_is_one_clear_error():
    with pytest.raises(OptionsError, match=r"unknown weight form 'int3'.*'fp32', 'fp16', 'int8'"):
        FuseOptions(weights="int3")


def test_saved_model_carries_the_packed_weights_and_reloads_to_the_same_outputs(tmp_path):
    src, feeds = _mlp(), _feeds()
    plain = GraphAutoFusion(src, sample_inputs=feeds)
    plain.fuse(**FAST)
    plain.save(tmp_path / "fp32.onnx")
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST))
    fused = gaf.fuse()
    gaf.save(tmp_path / "int8.onnx")
    size = (tmp_path / "int8.onnx").stat().st_size
    assert size <= 0.3 * (tmp_path / "fp32.onnx").stat().st_size
    saved = onnx.load(tmp_path / "int8.onnx")
    assert sum(n.op_type == "MatMulNBits" for n in saved.graph.node) == 3
    assert {i.data_type for i in saved.graph.initializer} >= {TensorProto.UINT8}
    np.testing.assert_array_equal(_run(str(tmp_path / "int8.onnx"), feeds), _run(fused, feeds))


def test_cli_fuse_with_weights_int8(tmp_path, capsys):
    from graph_autofusion.cli import main

    onnx.save(_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.int8.onnx"
    code = main(
        ["fuse", str(tmp_path / "mlp.onnx"), "-o", str(out), "--weights", "int8",
         "--no-speed-check", "--json"]
    )  # fmt: skip
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["weights"]["compressed"] == 3
    assert sum(n.op_type == "MatMulNBits" for n in onnx.load(out).graph.node) == 3
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 5, 64)).astype(np.float32)}
    assert _cosine(_run(str(out), feeds), _run(str(tmp_path / "mlp.onnx"), feeds)) >= 0.999
    assert main(["fuse", str(tmp_path / "mlp.onnx"), "-o", str(out), "--weights", "int3"]) == 2
    assert "invalid choice: 'int3'" in capsys.readouterr().err
    bad = ["fuse", str(tmp_path / "mlp.onnx"), "-o", str(out), "--weights", "int8"]
    assert main([*bad, "--target", "cpu"]) == 2
    assert "onnxruntime-target option" in capsys.readouterr().err


@needs_library
def test_custom_ops_on_do_not_hide_the_contractions_from_the_weights_stage():
    """With custom operators on, a decode-step sample (one row, the row count dynamic) would
    put every MatMul in an ``If`` between Gemv and the GEMM, where the stage finds no
    contraction: they stayed fp32, unlisted. Compressed weights leave that form out."""
    src = _mlp()
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 1, 64)).astype(np.float32)}
    plain = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(custom_ops=True))
    assert _ops(plain.fuse(**FAST)).get("If") == 3  # the few-row form, without weights
    opts = FuseOptions(weights="int8", custom_ops=True, **FAST)
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=opts)
    fused = gaf.fuse()
    assert _ops(fused).get("MatMulNBits") == 3 and "If" not in _ops(fused)
    assert len(gaf.result.weights.compressed) == 3


@needs_library
def test_cli_fuse_with_weights_fp16_writes_the_library_beside_the_model(tmp_path, capsys):
    from graph_autofusion.cli import main

    onnx.save(_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.fp16.onnx"
    code = main(
        ["fuse", str(tmp_path / "mlp.onnx"), "-o", str(out), "--weights", "fp16",
         "--no-speed-check", "--json"]
    )  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out)["weights"]["compressed"] == 3
    assert sum(n.op_type == "GemvF16" for n in onnx.load(out).graph.node) == 3
    assert os.path.isfile(tmp_path / "mlp.fp16.onnx.kernels" / "manifest.json")
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 5, 64)).astype(np.float32)}
    assert _cosine(_run(str(out), feeds), _run(str(tmp_path / "mlp.onnx"), feeds)) >= 0.99999


@pytest.mark.xdist_group("torch_compile")
def test_torch_compile_backend_compresses_on_the_onnxruntime_engine():
    torch = pytest.importorskip("torch")
    from graph_autofusion.torch_compile import make_backend

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.LayerNorm(64),
    ).eval()
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        want = module(x)
    torch._dynamo.reset()
    try:
        backend = make_backend(options=FuseOptions(weights="int4", check_speed=False))
        compiled = torch.compile(module, backend=backend)
        with torch.no_grad():
            got4 = compiled(x)
        assert _cosine(got4.numpy(), want.numpy()) >= 0.98
        graph = backend.config.graphs[0]
        assert graph.engine == "onnxruntime" and "torch" in graph.engine_notes
        assert _ops(graph.ort_result.model).get("MatMulNBits") == 3
        assert graph.ort_result.weights.form == "int4"
        with pytest.raises(OptionsError, match="onnxruntime engine"):
            make_backend(options=FuseOptions(weights="int8"), engine="torch")
    finally:
        torch._dynamo.reset()


@pytest.mark.xdist_group("torch_compile")
@needs_library
def test_drop_in_module_fp16_compresses_the_decode_steps_gemv_and_keeps_the_tokens():
    """A decode step's linears are our fp32 Gemv on the torch route (one row, static): the
    weights stage takes them as contractions too, so generate()'s decode graphs run GemvF16
    (before, they kept every weight fp32 whatever ``weights`` said)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from graph_autofusion.testing.small_hf import tiny_llama

    model = tiny_llama()
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(5))
    gen = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, **gen)
    torch._dynamo.reset()
    try:
        fused = GraphAutoFusion(model, options=FuseOptions(weights="fp16")).fuse(check_speed=False)
        with torch.no_grad():
            got = fused.generate(ids, **gen)
        assert torch.equal(got, want)
        steps = [
            g for g in fused.autofusion.graphs
            if g.ort_result is not None and g.ort_result.feeds["user_0"].shape[-1] == 1
        ]  # fmt: skip
        assert steps, [g.summary() for g in fused.autofusion.graphs]
        for g in steps:
            ops, w = _ops(g.ort_result.model), g.ort_result.weights
            assert ops.get("GemvF16", 0) >= 4 and ops["GemvF16"] == len(w.compressed), ops
            # what stays fp32 Gemv is what the report keeps, with its reason (the LM head)
            kept = [r for r in w.kept if r.op != "Gather"]
            assert ops.get("Gemv", 0) == len(kept) and all(r.reason for r in kept)
            assert any(r.reason == KEPT_HEAD for r in kept)
    finally:
        torch._dynamo.reset()


@pytest.mark.xdist_group("torch_compile")
@needs_library
def test_drop_in_module_int8_reports_its_layers_and_save_pretrained_keeps_them(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from graph_autofusion.testing.small_hf import tiny_llama
    from graph_autofusion.torch_module import PLAN_FILE, load_fused

    model = tiny_llama()
    # the example call's shape and arguments (input_ids and an all-ones mask, 16 tokens): each
    # module compiles one graph, the one fuse() planned and compressed, not a second length
    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(3))
    call = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        want = model(**call).logits
    torch._dynamo.reset()
    try:
        gaf = GraphAutoFusion(model, options=FuseOptions(weights="int8"))
        fused = gaf.fuse(check_speed=False)
        with torch.no_grad():
            got = fused(**call).logits
        assert len(fused.autofusion.graphs) == 1  # the fused graph itself, not a recompile
        assert _cosine(got.numpy(), want.numpy()) >= 0.99
        compressed = [r.name for r in gaf.result.weights.compressed]
        assert compressed  # the projections (64x64 and up) int8; LM head, table fp16 (policy)
        forms = {r.form for r in gaf.result.weights.compressed}
        assert forms == {"int8", "fp16"}
        half = sorted(r.op for r in gaf.result.weights.compressed if r.form == "fp16")
        assert len(half) == 2 and half[0] == "Gather"
        rep = gaf.safe_fusion_report()[0].to_dict()["weights"]
        assert rep["compressed"] == len(compressed) and rep["form"] == "int8"
        assert all(r["cosine"] >= 0.999 for r in rep["layers"] if r["form"] == "int8")
        fused.save_pretrained(tmp_path)
        plan = json.loads((tmp_path / PLAN_FILE).read_text())
        assert plan["weights"] == "int8"
        assert plan["graphs"][0]["compressed"] == {
            r.name: r.form for r in gaf.result.weights.compressed
        }
        torch._dynamo.reset()
        loaded = load_fused(transformers.LlamaForCausalLM.from_pretrained(tmp_path), tmp_path)
        with torch.no_grad():
            again = loaded(**call).logits
        (graph,) = loaded.autofusion.graphs
        assert [r.name for r in graph.ort_result.weights.compressed] == compressed
        np.testing.assert_allclose(again.numpy(), got.numpy(), rtol=0, atol=1e-5)
        # a shape the plan never saw (held-out sweep 3, B3): its graph compresses afresh, as
        # the module that was saved does; it ran in fp32 after the reload
        other = torch.randint(0, 1000, (2, 13), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            new_fused, new_loaded = fused(other).logits, loaded(other).logits
            fp32 = model(other).logits
        assert len(loaded.autofusion.graphs) > 1
        assert all(g.ort_result.weights.compressed for g in loaded.autofusion.graphs[1:])
        np.testing.assert_allclose(new_loaded.numpy(), new_fused.numpy(), rtol=0, atol=1e-4)
        assert float((new_loaded - fp32).abs().max()) > 1e-4  # compressed, not fp32
    finally:
        torch._dynamo.reset()


def _tiny_lm() -> onnx.ModelProto:
    """ids -> Gather(table 300x64) -> MatMul 64x128 -> Relu -> MatMul 128x300 (the LM head)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((300, 64))).astype(np.float32), "emb"),
        numpy_helper.from_array((rng.standard_normal((64, 128)) * 0.1).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((128, 300)) * 0.1).astype(np.float32), "wh"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w1"], ["h"], name="fc"),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "wh"], ["logits"], name="lm_head"),
    ]
    graph = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", 300])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_library
def test_the_default_policy_keeps_head_and_table_higher_and_all_compresses_them_at_int8():
    src = _tiny_lm()
    feeds = {"ids": np.random.default_rng(1).integers(0, 300, (1, 12)).astype(np.int64)}
    keep = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST))
    kept = keep.fuse()
    layers = {r.name: r for r in keep.result.weights.layers}
    assert layers["lm_head"].form == "fp16" and layers["lm_head"].cosine > 0.99999
    assert layers["emb"].op == "Gather" and layers["emb"].form == "fp16"
    assert layers["emb"].cosine > 0.99999 and layers["emb"].bytes == 300 * 64 * 2
    assert layers["fc"].form == "int8"
    ops = _ops(kept)
    assert ops.get("GemvF16") == 1 and ops.get("MatMulNBits") == 1 and ops.get("Cast") == 1
    table = [v.const for v in kept.graph.initializers.values() if v.const.shape == (300, 64)]
    assert len(table) == 1 and table[0].dtype == np.float16  # the fp32 table is gone
    assert "LM head fp16" in " ".join(keep.result.notes)
    assert "1 embedding tables fp16" in " ".join(keep.result.notes)
    np.testing.assert_allclose(_run(kept, feeds), _run(src, feeds), rtol=0.2, atol=0.2)
    assert _cosine(_run(kept, feeds), _run(src, feeds)) >= 0.99
    # an int4 model keeps its head at 8 bits (the largest weight a decode step reads) and its
    # table fp16
    four = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    small = four.fuse()
    layers = {r.name: r for r in four.result.weights.layers}
    assert layers["lm_head"].form == "int8" and layers["lm_head"].cosine > 0.999
    assert layers["emb"].form == "fp16" and layers["fc"].form == "int4"
    ops = _ops(small)
    assert ops.get("MatMulNBits") == 2 and "GemvF16" not in ops and ops.get("Cast") == 1
    assert "LM head int8" in " ".join(four.result.notes)
    assert _cosine(_run(small, feeds), _run(src, feeds)) >= 0.98
    # an fp16 model keeps its table fp32 (the higher precision), and compresses it under all
    half = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="fp16", **FAST))
    half.fuse()
    assert {r.name: r.form for r in half.result.weights.layers}["emb"] == "fp32"
    opts = FuseOptions(weights="fp16", weights_policy="all", **FAST)
    every = GraphAutoFusion(src, sample_inputs=feeds, options=opts)
    every.fuse()
    assert {r.name: r.form for r in every.result.weights.layers} == {
        "emb": "fp16", "fc": "fp16", "lm_head": "fp16"
    }  # fmt: skip
    opts = FuseOptions(weights="int4", weights_policy="all", **FAST)
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=opts)
    fused = gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert layers["lm_head"].form == "int8" and layers["fc"].form == "int4"
    assert layers["emb"].form == "int8" and layers["emb"].cosine > 0.9999
    assert _ops(fused).get("GatherBlockQuantized") == 1 and "Gather" not in _ops(fused)
    assert _ops(fused).get("MatMulNBits") == 2
    assert _cosine(_run(fused, feeds), _run(src, feeds)) >= 0.98
    with pytest.raises(OptionsError, match="unknown weights policy"):
        FuseOptions(weights_policy="most")


def _compressed_slower(layers: str):
    """A timer: the weights checks of layers whose key starts ``weights@<layers>`` take 90 us
    compressed against 10 us fp32; everything else is faster fused (each call still runs)."""

    def timer(key, side, fn):
        fn()
        if key.startswith(f"weights@{layers}"):
            return 9e-5 if side == "fused" else 1e-5
        return 1e-5 if side == "fused" else 2e-5

    return timer


def test_a_layer_slower_compressed_stays_fp32_and_its_times_are_reported():
    from graph_autofusion.runtime.timing import use_timer

    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8"))
    with use_timer(_compressed_slower("fc2")):
        gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert layers["fc2"].form == "fp32" and "slower compressed" in layers["fc2"].reason
    assert layers["fc2"].time_us == pytest.approx(90.0)
    assert layers["fc2"].time_fp32_us == pytest.approx(10.0)
    assert layers["fc1"].form == "int8" and layers["fc1"].time_us == pytest.approx(10.0)
    notes = " ".join(gaf.result.weights.notes)
    assert "1 contraction kept fp32 as slower compressed" in notes
    assert "weights_goal='size'" in notes


def test_the_size_goal_compresses_a_layer_timed_slower_and_reports_its_times(tmp_path):
    """``weights_goal="size"``: the layer timed slower compressed is compressed anyway (its
    times still measured and reported, no speed note); the saved file is the smaller one."""
    from graph_autofusion.runtime.timing import use_timer

    src, feeds = _mlp(), _feeds()
    sizes = {}
    for goal in ("speed", "size"):
        opts = FuseOptions(weights="int8", weights_goal=goal)
        gaf = GraphAutoFusion(src, sample_inputs=feeds, options=opts)
        with use_timer(_compressed_slower("")):  # every layer
            fused = gaf.fuse()
        layers = {r.name: r for r in gaf.result.weights.layers}
        forms = {r.form for r in layers.values()}
        assert forms == ({"fp32"} if goal == "speed" else {"int8"}), (goal, forms)
        assert all(r.time_us == pytest.approx(90.0) for r in layers.values())
        assert all(r.time_fp32_us == pytest.approx(10.0) for r in layers.values())
        notes = " ".join(gaf.result.weights.notes)
        assert ("kept fp32 as slower compressed" in notes) == (goal == "speed")
        if goal == "size":
            assert _cosine(_run(fused, feeds), _run(src, feeds)) >= 0.999
        gaf.save(tmp_path / f"{goal}.onnx")
        sizes[goal] = (tmp_path / f"{goal}.onnx").stat().st_size
    assert sizes["size"] < 0.5 * sizes["speed"]
    with pytest.raises(OptionsError, match="unknown weights goal 'small'"):
        FuseOptions(weights="int8", weights_goal="small")


def test_the_end_to_end_floor_rolls_back_the_worst_layers(monkeypatch):
    from graph_autofusion import defaults

    src, feeds = _mlp(), _feeds()
    monkeypatch.setitem(defaults.WEIGHTS_E2E_COSINE, "int4", 0.999999)
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    fused = gaf.fuse()
    w = gaf.result.weights
    assert not w.compressed and "MatMulNBits" not in _ops(fused)
    assert all("rolled back by the end-to-end check" in r.reason for r in w.layers)
    assert not any("demoted" in r.reason for r in w.layers)  # int8 everywhere failed it too
    assert all(r.cosine is not None for r in w.layers)  # each passed its own check first
    np.testing.assert_allclose(_run(fused, feeds), _run(src, feeds), rtol=1e-5, atol=1e-5)


def _int4_and_int8_cosines(monkeypatch) -> tuple[float, float, dict[str, float]]:
    """The MLP's end-to-end cosine with every layer int4, then every layer int8, and each
    layer's own int4 relative error."""
    from graph_autofusion import defaults

    src, feeds = _mlp(), _feeds()
    monkeypatch.setitem(defaults.WEIGHTS_E2E_COSINE, "int4", 0.0)
    every = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    every.fuse()
    four = min(v["cosine"] for v in every.result.weights.end_to_end.values())
    errs = {r.name: r.rel_err for r in every.result.weights.layers}
    assert len(every.result.weights.compressed) == 3
    eight = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int8", **FAST))
    eight.fuse()
    return four, min(v["cosine"] for v in eight.result.weights.end_to_end.values()), errs


def test_the_end_to_end_check_demotes_the_fewest_worst_int4_layers_to_int8(monkeypatch):
    """A floor the int4 model misses and the int8 one meets: the int4 layers of largest
    relative error become int8, as few as make the model pass (one fewer fails), the rest
    stay int4, none goes back to fp32."""
    import re

    from graph_autofusion import defaults

    four, eight, errs = _int4_and_int8_cosines(monkeypatch)
    assert four < eight < 1.0
    floor = (four + eight) / 2
    monkeypatch.setitem(defaults.WEIGHTS_E2E_COSINE, "int4", floor)
    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    fused = gaf.fuse()
    w = gaf.result.weights
    low = {r.name for r in w.layers if r.form == "int8"}
    assert not w.kept and 0 < len(low) <= 3
    ranked = sorted(errs, key=lambda n: -errs[n])
    assert low == set(ranked[: len(low)])  # the worst by their own int4 error
    assert all(v["passed"] and v["cosine"] >= floor for v in w.end_to_end.values())
    for r in w.layers:
        if r.name in low:  # checked on its own at int8, its reason quotes the failing count
            assert r.cosine >= 0.999 and r.rel_err < errs[r.name]
            m = re.search(rf"with {len(low) - 1} demoted: output cosine ([0-9.]+)", r.reason)
            assert m and float(m.group(1)) < floor, r.reason
        else:
            assert r.form == "int4" and not r.reason
    note = f"{len(low)} layers int8 ({len(low)} by the end-to-end check)"
    assert note in " ".join(gaf.result.notes)
    assert _ops(fused).get("MatMulNBits") == 3
    assert _cosine(_run(fused, feeds), _run(src, feeds)) >= floor


def test_the_end_to_end_check_rolls_back_the_fewest_worst_layers(monkeypatch):
    """Without the int8 step (an int8 or fp16 model's path; an int4 model's where demoting
    every layer does not pass is the floor test above): the layers of largest relative error
    go back to fp32, as few as make the model pass (one fewer fails), the rest stay int4."""
    import re

    from graph_autofusion import defaults
    from graph_autofusion.pipeline import weights

    four, _eight, errs = _int4_and_int8_cosines(monkeypatch)
    monkeypatch.setattr(weights, "FALLBACK", {})
    floor = (four + 1) / 2
    monkeypatch.setitem(defaults.WEIGHTS_E2E_COSINE, "int4", floor)
    src, feeds = _mlp(), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    fused = gaf.fuse()
    w = gaf.result.weights
    back = {r.name for r in w.kept}
    assert 0 < len(back) < 3 and len(w.compressed) == 3 - len(back)
    assert all(r.form == "int4" for r in w.compressed)
    ranked = sorted(errs, key=lambda n: -errs[n])
    assert back == set(ranked[: len(back)])  # the worst by their own error
    assert all(v["passed"] and v["cosine"] >= floor for v in w.end_to_end.values())
    # one fewer rolled back was measured and failed (the reason quotes that check)
    for r in w.kept:
        m = re.search(rf"with {len(back) - 1} rolled back: output cosine ([0-9.]+)", r.reason)
        assert m and float(m.group(1)) < floor, r.reason
    assert _ops(fused).get("MatMulNBits") == 3 - len(back)


def test_an_int4_layer_failing_its_check_falls_back_to_int8_then_fp32():
    """The sensitive layer (an outlier that flattens its blocks) misses int4's floors: it is
    tried at int8, which it passes at this outlier; at int8's own floors a larger outlier
    fails too and the layer stays fp32, its reason naming both checks."""
    src, feeds = _mlp(outlier=2.0), _feeds()
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    fused = gaf.fuse()
    layers = {r.name: r for r in gaf.result.weights.layers}
    assert layers["fc2"].form == "int8" and layers["fc2"].block_size == 32
    assert layers["fc2"].reason.startswith("int8: its int4 form failed the layer check")
    assert layers["fc2"].cosine >= 0.999 and not layers["fc2"].zero_point  # int8: symmetric
    assert 0.25 < layers["fc2"].bytes / layers["fc2"].fp32_bytes < 0.3  # int4's is ~0.16
    assert "1 layers int8 (1 after their int4 layer check)" in " ".join(gaf.result.notes)
    assert layers["fc1"].form == "int4" and layers["fc3"].form == "int4"
    assert _ops(fused).get("MatMulNBits") == 3 and "MatMul" not in _ops(fused)
    assert _cosine(_run(fused, feeds), _run(src, feeds)) >= 0.98
    src = _mlp(outlier=50.0)
    gaf = GraphAutoFusion(src, sample_inputs=feeds, options=FuseOptions(weights="int4", **FAST))
    fused = gaf.fuse()
    fc2 = {r.name: r for r in gaf.result.weights.layers}["fc2"]
    assert fc2.form == "fp32" and fc2.reason.startswith("kept fp32: layer check")
    assert "(at int8); at int4: layer check" in fc2.reason
    assert fc2.cosine < 0.99  # the record keeps int4's figures, which its reason quotes
    assert _ops(fused).get("MatMulNBits") == 2 and _ops(fused).get("MatMul") == 1
