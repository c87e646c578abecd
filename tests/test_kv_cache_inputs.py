"""KV-cache decoders fuse with no hand-made inputs (issue 24).

The generated sample inputs of a KV-cache decoder agree with each other (past length ``P``,
``S`` new tokens, a mask of ones over ``P + S``, positions ``P .. P+S-1``), derived from the
graph's symbolic dims and input names (:mod:`graph_autofusion.samples.kv_inputs`). On the small
exports of the zoo decoders (Llama MHA and GQA, GPT-2, Qwen2; both torch exporters)
``graph-autofusion fuse`` with no ``--inputs`` succeeds, the fused model gives the original's
outputs (a decode step, a prefill) and PyTorch's 50 greedy tokens, and the other CLI commands
run with no ``--inputs`` (the full-size exports: ``tests/test_kv_cache_fusion.py``); hand-made
decoders cover optimum's and other exporters' names and dims; a decoder whose relations cannot
be told still gets the one clear :class:`SampleInputError`, from every command.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.cli import main
from graph_autofusion.errors import SampleInputError
from graph_autofusion.frontend import load_onnx
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.samples import kv_inputs
from graph_autofusion.samples.inputs import generate_inputs
from graph_autofusion.testing.kv_cache import (
    decoder_module,
    export_decoder,
    greedy_decode_ort,
    greedy_decode_torch,
    small_config,
)

HW = "x86_avx2"
EXPORTS = [
    (name, exporter)
    for name in ("llama", "llama_gqa", "gpt2", "qwen2")
    for exporter in ("dynamo", "torchscript")
]
GREEDY_STEPS = 49  # 50 generated tokens (issue 24)


def _session(model) -> ort.InferenceSession:
    return ort_session(model, "all", 1)


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    """``fused(name, exporter)``: the small export's path, the path of its fusion by
    ``graph-autofusion fuse --json`` with no ``--inputs`` (once per export) and the report."""
    folder = tmp_path_factory.mktemp("fused")

    @functools.cache
    def run(name: str, exporter: str) -> tuple[str, str, dict]:
        path = str(export_decoder(name, exporter, small=True))
        out = str(folder / f"{name}-{exporter}.onnx")
        argv = ["-q", "fuse", path, "-o", out, "--hardware", HW, "--no-speed-check", "--json"]
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            assert main(argv) == 0
        return path, out, json.loads(text.getvalue())

    return run


def _decode_feeds(sess: ort.InferenceSession, past: int, new: int, seed: int) -> dict:
    """A decode step's feeds built by hand (as a deployment does), not by the generator."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 256, (1, new)).astype(np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, past + new), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(past, past + new, dtype=np.int64)[None]
        else:  # (batch, kv_heads, past, head_dim)
            heads, dim = i.shape[1], i.shape[3]
            feeds[i.name] = rng.standard_normal((1, heads, past, dim)).astype(np.float32)
    return feeds


# ----------------------------------------------------------------------------- the zoo's exports
@pytest.mark.parametrize("name, exporter", EXPORTS)
def test_generated_inputs_agree(name: str, exporter: str) -> None:
    model = load_onnx(str(export_decoder(name, exporter, small=True)))
    kv = kv_inputs.plan(model)
    assert isinstance(kv, kv_inputs.KVPlan) and len(kv.past) == 4
    assert set(kv.past.values()) == {2}
    for kw, (b, p, s) in (({}, (1, 12, 4)), ({"batch": 2, "seq_len": 7, "seed": 1}, (2, 6, 1))):
        feeds = generate_inputs(model, **kw)
        assert feeds["input_ids"].shape == (b, s)
        assert feeds["attention_mask"].shape == (b, p + s) and (feeds["attention_mask"] == 1).all()
        want_pos = np.broadcast_to(np.arange(p, p + s), (b, s))
        assert np.array_equal(feeds["position_ids"], want_pos)
        heads = small_config(name).num_key_value_heads if name != "gpt2" else 4
        assert feeds["past_key_values.1.value"].shape == (b, heads, p, 16)
        assert "positions" in feeds.derived["position_ids"]
        _session(model).run(None, feeds)  # the original runs on them


@pytest.mark.parametrize("name, exporter", EXPORTS)
def test_fuse_with_no_inputs_gives_the_originals_outputs(fused, name: str, exporter: str) -> None:
    path, out, report = fused(name, exporter)
    assert report["end_to_end"] and all(v["passed"] for v in report["end_to_end"].values())
    assert report["fused"] > 0
    original, fused = _session(path), _session(out)
    for past, new, seed in ((5, 1, 0), (0, 3, 1), (9, 2, 2)):  # decode, prefill, two new tokens
        feeds = _decode_feeds(original, past, new, seed)
        want, got = original.run(None, feeds), fused.run(None, feeds)
        for w, g in zip(want, got, strict=True):
            assert w.shape == g.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, exporter", EXPORTS)
def test_cli_fuse_with_no_inputs_gives_torch_greedy_tokens(fused, name: str, exporter: str) -> None:
    """``graph-autofusion fuse DECODER.onnx -o out.onnx`` with no ``--inputs``: 50 greedy
    tokens of the fused model are PyTorch's own cached generation's (and the original's)."""
    path, out, _ = fused(name, exporter)
    prompt = np.random.default_rng(3).integers(0, 256, (1, 5))
    want = greedy_decode_torch(decoder_module(name, small=True), prompt, GREEDY_STEPS)
    assert len(want) == GREEDY_STEPS + 1 and len(set(want)) > 1
    got = greedy_decode_ort(_session(out), name, prompt, GREEDY_STEPS, small=True)[0]
    assert got == want
    assert greedy_decode_ort(_session(path), name, prompt, GREEDY_STEPS, small=True)[0] == want


def test_cli_with_no_inputs(tmp_path: Path, capsys) -> None:
    path = str(export_decoder("llama_gqa", "torchscript", small=True))
    out = tmp_path / "fused.onnx"
    assert main(["-q", "fuse", path, "-o", str(out), "--hardware", HW, "--no-speed-check"]) == 0
    capsys.readouterr()
    sess_a, sess_b = _session(path), _session(str(out))
    feeds = _decode_feeds(sess_a, 6, 1, 4)
    for w, g in zip(sess_a.run(None, feeds), sess_b.run(None, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert main(["verify", path, str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report
    assert main(["analyze", path, "--hardware", HW, "--brief"]) == 0
    assert capsys.readouterr().out
    assert main(["bench", path, str(out), "--runs", "1", "--threads", "1"]) == 0


# ----------------------------------------------------------------------------- hand-made decoders
def _decoder(
    *,
    ids=("batch", "seq"),
    mask=("batch", "total"),
    past=("batch", 2, "past", 4),
    present=("batch", 2, "total", 4),
    past_name="past_key_values.0.key",
    extra=(),
) -> onnx.ModelProto:
    """One attention layer's worth: the new tokens' keys concatenated after the past ones
    (``present``), their scores against them plus the mask (``P + S`` must agree), and rotary-like
    position rows gathered from a 64-row table (positions must be in range)."""
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32), "table"
    )
    pos_table = numpy_helper.from_array(np.ones((64, 4), np.float32), "pos_table")
    shape = numpy_helper.from_array(np.array([0, 0, 2, 4], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    n = helper.make_node
    nodes = [
        n("Gather", ["table", "input_ids"], ["emb"], name="embed"),
        n("Reshape", ["emb", "shape"], ["heads"], name="split_heads"),
        n("Transpose", ["heads"], ["k_new"], perm=[0, 2, 1, 3], name="to_bhsd"),
        n("Gather", ["pos_table", "position_ids"], ["rot"], name="rotary"),
        n("Unsqueeze", ["rot", "axes1"], ["rot4"], name="rot_heads"),
        n("Add", ["k_new", "rot4"], ["k_rot"], name="apply_rotary"),
        n("Concat", [past_name, "k_rot"], ["present.0.key"], axis=2, name="cache_concat"),
        n("Transpose", ["present.0.key"], ["k_t"], perm=[0, 1, 3, 2], name="k_t"),
        n("MatMul", ["k_rot", "k_t"], ["scores"], name="qk"),
        n("Cast", ["attention_mask"], ["mask_f"], to=T.FLOAT, name="mask_cast"),
        n("Unsqueeze", ["mask_f", "axes"], ["mask4"], name="mask_heads"),
        n("Add", ["scores", "mask4"], ["masked"], name="add_mask"),
        n("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        n("MatMul", ["probs", "present.0.key"], ["ctx"], name="pv"),
        n("Relu", ["ctx"], ["r"], name="relu"),
        n("Mul", ["r", "r"], ["y"], name="square"),
    ]
    axes1 = numpy_helper.from_array(np.array([1], np.int64), "axes1")
    inputs = [
        helper.make_tensor_value_info("input_ids", T.INT64, list(ids)),
        helper.make_tensor_value_info("attention_mask", T.INT64, list(mask)),
        helper.make_tensor_value_info("position_ids", T.INT64, list(ids)),
        helper.make_tensor_value_info(past_name, T.FLOAT, list(past)),
        *extra,
    ]
    outputs = [
        helper.make_tensor_value_info("y", T.FLOAT, None),
        helper.make_tensor_value_info("present.0.key", T.FLOAT, list(present)),
    ]
    graph = helper.make_graph(
        nodes, "decoder", inputs, outputs, [table, pos_table, shape, axes, axes1]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


DECODERS = {
    # optimum's names: the mask's dim written as the sum
    "optimum": lambda: _decoder(
        ids=("batch_size", "sequence_length"),
        mask=("batch_size", "past_sequence_length + sequence_length"),
        past=("batch_size", 2, "past_sequence_length", 4),
        present=("batch_size", 2, "past_sequence_length + sequence_length", 4),
    ),
    # a torch exporter's generated symbols and flat cache names: only the structure tells
    "generated_symbols": lambda: _decoder(
        ids=("s0", "s1"),
        mask=("s0", "s3"),
        past=("s0", 2, "s2", 4),
        present=("s0", 2, "s2 + s1", 4),
        past_name="past_key_values_0_0",
    ),
    # no dim names at all
    "unnamed_dims": lambda: _decoder(
        ids=(None, None), mask=(None, None), past=(None, 2, None, 4), present=(None, 2, None, 4)
    ),
    # the lengths as inputs too (onnxruntime's GroupQueryAttention form)
    "length_inputs": lambda: _decoder(
        extra=(
            helper.make_tensor_value_info("seqlens_k", T.INT32, ["batch"]),
            helper.make_tensor_value_info("total_sequence_length", T.INT32, []),
            helper.make_tensor_value_info("past_sequence_length", T.INT64, [1]),
            helper.make_tensor_value_info("cache_position", T.INT64, ["seq"]),
        )
    ),
}


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_hand_made_decoders(tmp_path: Path, kind: str) -> None:
    proto = DECODERS[kind]()
    path = tmp_path / f"{kind}.onnx"
    onnx.save(proto, path)
    model = load_onnx(str(path))
    feeds = generate_inputs(model)
    p, s = kv_inputs.new_lengths(16)
    past = [k for k in feeds if k.startswith("past_key")][0]
    assert feeds[past].shape == (1, 2, p, 4)
    assert feeds["input_ids"].shape == (1, s)
    assert feeds["attention_mask"].shape == (1, p + s)
    assert feeds["position_ids"].tolist() == [list(range(p, p + s))]
    if kind == "length_inputs":
        assert feeds["seqlens_k"].tolist() == [p + s - 1]
        assert int(feeds["total_sequence_length"]) == p + s
        assert feeds["past_sequence_length"].tolist() == [p]
        assert feeds["cache_position"].tolist() == list(range(p, p + s))
    else:
        gaf = GraphAutoFusion(str(path), hardware=HW)
        fused = gaf.fuse(check_speed=False)
        want, got = (
            _session(str(path)).run(None, gaf.feeds()),
            _session(fused).run(None, gaf.feeds()),
        )
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_conform_resizes_feeds_drawn_elsewhere() -> None:
    """``planner.analysis.default_feeds`` draws one value per symbol (past = total): the
    derivation step resizes the mask to past + new and sets the positions."""
    from graph_autofusion.planner.analysis import default_feeds

    model = load_onnx(DECODERS["optimum"]())
    feeds = default_feeds(model, symbols={"past_sequence_length": 5, "sequence_length": 2})
    assert feeds["past_key_values.0.key"].shape[2] == 5
    assert feeds["attention_mask"].shape[1] == 7 and (feeds["attention_mask"] == 1).all()
    assert feeds["position_ids"][0].tolist() == [5, 6]
    _session(DECODERS["optimum"]()).run(None, feeds)


def test_relations_that_cannot_be_derived_are_one_clear_error(tmp_path: Path) -> None:
    """Every dim of the cache symbolic, none named like a length: its sequence axis cannot
    be told; the inputs are drawn as before and the original's failure is the one error,
    naming the inputs, ``--inputs`` and why the relations were not derived."""
    proto = _decoder(past=("b", "x", "y", "z"))
    path = tmp_path / "opaque.onnx"
    onnx.save(proto, path)
    kv = kv_inputs.plan(load_onnx(str(path)))
    assert isinstance(kv, kv_inputs.KVRefusal) and "sequence axis cannot be told" in kv.note
    with pytest.raises(SampleInputError) as info:
        GraphAutoFusion(str(path), hardware=HW).fuse(check_speed=False)
    msg = str(info.value)
    assert "opaque.onnx" in msg and "generated from the input specs" in msg
    assert "'past_key_values.0.key'" in msg and "sequence axis cannot be told" in msg
    assert "--inputs" in msg and "\n" not in msg
    rc = main(["-q", "fuse", str(path), "-o", str(tmp_path / "o.onnx"), "--hardware", HW])
    assert rc == 2 and not (tmp_path / "o.onnx").exists()


def test_cli_commands_give_the_one_error_when_relations_cannot_be_derived(
    tmp_path: Path, capfd
) -> None:
    """``verify`` and ``bench`` with no ``--inputs`` run the model on generated inputs: the
    same one error on stderr (naming the cache input and ``--inputs``), not onnxruntime's own
    log line before it; ``analyze`` runs no model and works."""
    path = tmp_path / "opaque.onnx"
    onnx.save(_decoder(past=("b", "x", "y", "z")), path)
    capfd.readouterr()
    for argv in (["verify", str(path), str(path)], ["bench", str(path), "--runs", "1"]):
        assert main(argv) == 2, argv
        out, err = capfd.readouterr()
        assert "onnxruntime" not in err.split("error:")[0], err  # nothing before our error
        assert "'past_key_values.0.key'" in err and "--inputs" in err, err
        assert "sequence axis cannot be told" in err and err.count("\n") == 1, err
    assert main(["analyze", str(path), "--hardware", HW, "--brief"]) == 0


def test_a_model_without_past_inputs_is_unchanged() -> None:
    proto = _decoder()
    for vi in proto.graph.input:
        if vi.name.startswith("past"):
            vi.name = "state"
    for nd in proto.graph.node:
        nd.input[:] = ["state" if x.startswith("past") else x for x in nd.input]
    model = load_onnx(proto)
    assert kv_inputs.plan(model) is None
    feeds = generate_inputs(model)
    assert feeds["attention_mask"].shape == (1, 16) and feeds["position_ids"][0, 0] == 0
