"""Sample inputs the model rejects (issue 15): graph inputs that carry shapes, sizes or indices.

Each small model reads a graph input as an operand whose value must fit the data (an
``Expand`` target shape, ``SplitToSequence`` split sizes, ``Gather`` indices, ...). The drawn
inputs used to make the original fail in onnxruntime with its traceback; now ``fuse`` derives
values the model accepts (the original runs on them, and the fused model gives the same
outputs), or stops with one :class:`SampleInputError` naming the input and ``--inputs``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.cli import main
from graph_autofusion.errors import AutofusionWarning, SampleInputError
from graph_autofusion.frontend import load_onnx
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.runtime.ort_session import ort_session
from graph_autofusion.samples.inputs import generate_inputs

I64 = T.INT64


def vi(name, elem=T.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or f"{op.lower()}_{outs[0]}", **attrs)


def model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tail(x):
    """Relu then Mul: a fusible pair after the shape-carrying operator."""
    return [node("Relu", [x], ["t_r"]), node("Mul", ["t_r", "t_r"], ["y"])]


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.int64), name)


MODELS = {
    # the two third-party shapes of the issue
    "expand": lambda: model(
        [node("Expand", ["x", "shape"], ["e"], name="exp"), *tail("e")],
        [vi("x", shape=[3, 1, 4]), vi("shape", I64, [3])],
        [vi("y")],
    ),
    "split_to_sequence": lambda: model(
        [
            node("Relu", ["x"], ["r"]),
            node("SplitToSequence", ["r", "split"], ["seq"], name="sts", axis=1),
            node("ConcatFromSequence", ["seq"], ["c"], axis=1),
            *tail("c"),
        ],
        [vi("x", shape=[2, 10]), vi("split", I64, [3])],
        [vi("y")],
    ),
    "split_to_sequence_scalar": lambda: model(
        [
            node("SplitToSequence", ["x", "split"], ["seq"], name="sts", axis=0),
            node("SequenceAt", ["seq", "zero"], ["first"]),
            *tail("first"),
        ],
        [vi("x", shape=[7, 3]), vi("split", I64, [])],
        [vi("y")],
        [const("zero", 0)],
    ),
    "reshape_symbolic_batch": lambda: model(
        [node("Relu", ["x"], ["r"]), node("Reshape", ["r", "shape"], ["s"], name="rs"), *tail("s")],
        [vi("x", shape=["batch", 3, 4]), vi("shape", I64, [2])],
        [vi("y")],
    ),
    # two rounds: the Expand's data shape is known only once the Reshape's shape is derived
    "reshape_then_expand": lambda: model(
        [
            node("Reshape", ["x", "s1"], ["a"], name="rs"),
            node("Expand", ["a", "s2"], ["b"], name="exp"),
            *tail("b"),
        ],
        [vi("x", shape=[2, 6]), vi("s1", I64, [3]), vi("s2", I64, [3])],
        [vi("y")],
    ),
    "gather_axis1": lambda: model(
        [node("Relu", ["x"], ["r"]), node("Gather", ["r", "idx"], ["g"], name="ga", axis=1)]
        + tail("g"),
        [vi("x", shape=[2, 5, 4]), vi("idx", I64, [7])],
        [vi("y")],
    ),
    "gather_elements": lambda: model(
        [node("GatherElements", ["x", "idx"], ["g"], name="ge", axis=1), *tail("g")],
        [vi("x", shape=[3, 4]), vi("idx", I64, [3, "n"])],
        [vi("y")],
    ),
    "slice_bounds": lambda: model(
        [node("Slice", ["x", "starts", "ends", "axes"], ["s"], name="sl"), *tail("s")],
        [vi("x", shape=[4, 6]), vi("starts", I64, [1]), vi("ends", I64, [1])],
        [vi("y")],
        [const("axes", [1])],
    ),
    "topk_k": lambda: model(
        [node("TopK", ["x", "k"], ["v", "i"], name="tk", axis=-1), *tail("v")],
        [vi("x", shape=[2, 9]), vi("k", I64, [1])],
        [vi("y")],
    ),
    "onehot_depth": lambda: model(
        [
            node("OneHot", ["idx", "depth", "vals"], ["o"], name="oh"),
            *tail("o"),
        ],
        [vi("idx", I64, [5]), vi("depth", I64, [])],
        [vi("y")],
        [numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "vals")],
    ),
    "tile_and_pad": lambda: model(
        [
            node("Tile", ["x", "reps"], ["t"], name="ti"),
            node("Pad", ["t", "pads"], ["p"], name="pa"),
            *tail("p"),
        ],
        [vi("x", shape=[2, 3]), vi("reps", I64, [2]), vi("pads", I64, [4])],
        [vi("y")],
    ),
    "strings_and_sequence": lambda: model(
        [
            node("ConcatFromSequence", ["seq"], ["c"], axis=0),
            *tail("c"),
            node("Identity", ["s"], ["s_out"]),
        ],
        [helper.make_tensor_sequence_value_info("seq", T.FLOAT, [2, 4]), vi("s", T.STRING, [3])],
        [vi("y"), vi("s_out", T.STRING)],
    ),
}


def _ort(proto: onnx.ModelProto, feeds) -> list[np.ndarray]:
    sess = ort_session(proto, "all", 1, log_severity=4)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fuse_derives_inputs_the_model_accepts(tmp_path, name):
    proto = MODELS[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(proto, path)
    gaf = GraphAutoFusion(str(path), hardware="x86_avx2")
    fused = gaf.fuse(check_speed=False)
    feeds = gaf.feeds()
    want = _ort(proto, feeds)  # the original runs on the derived inputs
    got = _ort(to_onnx(fused), feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if a.dtype == object:
            assert a.tolist() == b.tolist()
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert gaf.result.end_to_end is not None


def test_derived_values_fit_their_operators():
    def feeds(name):
        return generate_inputs(load_onnx(MODELS[name]()))

    f = feeds("expand")
    assert np.broadcast_shapes((3, 1, 4), tuple(f["shape"])) == (3, 1, 4)
    assert f.derived == {"shape": "Expand 'exp' target shape"}
    f = feeds("split_to_sequence")
    assert f["split"].shape == (3,) and f["split"].sum() == 10 and (f["split"] > 0).all()
    f = feeds("split_to_sequence_scalar")
    assert f["split"].shape == () and 1 <= int(f["split"]) <= 7
    f = feeds("reshape_symbolic_batch")
    assert f["x"].shape[0] == 1 and int(np.prod(f["shape"])) == f["x"].size
    f = feeds("reshape_then_expand")
    assert int(np.prod(f["s1"])) == 12 and len(f["s2"]) == 3
    assert np.broadcast_shapes(tuple(f["s1"]), tuple(f["s2"]))
    f = feeds("gather_axis1")
    assert f["idx"].shape == (7,) and f["idx"].min() >= 0 and f["idx"].max() < 5
    f = feeds("gather_elements")
    assert f["idx"].shape == (3, 4) and f["idx"].max() < 4
    f = feeds("slice_bounds")
    assert (f["starts"].tolist(), f["ends"].tolist()) == ([0], [6])
    f = feeds("topk_k")
    assert f["k"].tolist() == [4]
    f = feeds("onehot_depth")
    assert f["idx"].max() < int(f["depth"])
    f = feeds("strings_and_sequence")
    assert f["s"].tolist() == ["a"] * 3 and [a.shape for a in f["seq"]] == [(2, 4), (2, 4)]


def test_token_ids_drawn_within_the_table_are_kept():
    """A drawn value that is already valid (ids within an embedding table) is not redrawn."""
    table = numpy_helper.from_array(np.ones((50, 4), np.float32), "table")
    proto = model(
        [node("Gather", ["table", "input_ids"], ["emb"], name="embed")],
        [vi("input_ids", I64, ["batch", "seq"])],
        [vi("emb")],
        [table],
    )
    f = generate_inputs(load_onnx(proto))
    assert f.derived == {}
    assert f["input_ids"].shape == (1, 16) and f["input_ids"].max() < 50


def _not_derivable() -> onnx.ModelProto:
    """Gather indices computed from the input (an Add): no derivation reaches them."""
    return model(
        [
            node("Add", ["idx", "forty"], ["i2"]),
            node("Gather", ["x", "i2"], ["g"], name="ga", axis=1),
            *tail("g"),
        ],
        [vi("x", shape=[2, 5, 4]), vi("idx", I64, [7])],
        [vi("y")],
        [const("forty", 40)],
    )


@pytest.mark.parametrize("target", ["onnxruntime", "cpu"])
def test_inputs_that_cannot_be_derived_are_one_clear_error(tmp_path, target):
    path = tmp_path / "gather_add.onnx"
    onnx.save(_not_derivable(), path)
    with pytest.raises(SampleInputError) as info:
        GraphAutoFusion(str(path), hardware="x86_avx2", target=target).fuse(check_speed=False)
    msg = str(info.value)
    assert "gather_add.onnx" in msg and "'ga' (Gather)" in msg and "'idx'" in msg
    assert "generated from the input specs" in msg and "--inputs" in msg
    assert "\n" not in msg and "'x'" not in msg  # the float data input is not suspected
    assert ("torch" if target == "cpu" else "onnxruntime") in msg


def test_given_inputs_the_model_rejects_are_one_clear_error(tmp_path):
    path = tmp_path / "expand.onnx"
    onnx.save(MODELS["expand"](), path)
    bad = {"x": np.ones((3, 1, 4), np.float32), "shape": np.array([5, 7, 4], np.int64)}
    with pytest.raises(SampleInputError, match=r"inputs given .*'exp' \(Expand\).*'shape'"):
        GraphAutoFusion(str(path), hardware="x86_avx2", sample_inputs=bad).fuse()


def test_given_inputs_leaving_one_out_are_one_clear_error(tmp_path):
    """A misspelled key or a left-out input used to fail deep in safe mode's capture (``no
    value for input %shape``), naming neither ``sample_inputs`` nor the key. Keys that name
    no input are ignored (onnxruntime ignores them: a tokenizer's whole output), and an
    initializer also listed as an input may be fed."""
    path = tmp_path / "expand.onnx"
    onnx.save(MODELS["expand"](), path)
    x, shape = np.ones((3, 1, 4), np.float32), np.array([3, 2, 4], np.int64)
    with pytest.raises(SampleInputError) as info:
        GraphAutoFusion(str(path), sample_inputs={"x": x, "shp": shape}).fuse()
    msg = str(info.value)
    assert "no value for 'shape'; 'shp' is not an input of the model" in msg, msg
    assert "its inputs: x, shape" in msg and "--inputs" in msg and "expand.onnx" in msg
    extra = {"x": x, "shape": shape, "token_type_ids": shape}
    assert GraphAutoFusion(str(path), sample_inputs=extra).fuse() is not None

    m = MODELS["expand"]()  # 'shape' also an initializer (keep_initializers_as_inputs)
    m.graph.initializer.append(numpy_helper.from_array(shape, "shape"))
    path2 = tmp_path / "expand_default.onnx"
    onnx.save(m, path2)
    fed = {"x": x, "shape": np.array([3, 5, 4], np.int64)}
    gaf = GraphAutoFusion(str(path2), sample_inputs=fed)
    assert gaf.fuse() is not None
    assert GraphAutoFusion(str(path2), sample_inputs={"x": x}).fuse() is not None


def test_an_input_of_the_wrong_type_is_the_one_named(tmp_path):
    """onnxruntime's "Unexpected input data type" names no input; the message used to
    suspect the other, correctly typed integer input before the float data one."""
    path = tmp_path / "expand.onnx"
    onnx.save(MODELS["expand"](), path)
    bad = {"x": np.ones((3, 1, 4), np.float64), "shape": np.array([3, 2, 4], np.int64)}
    with pytest.raises(SampleInputError) as info:
        GraphAutoFusion(str(path), sample_inputs=bad).fuse()
    msg = str(info.value)
    assert "check input 'x' (float64 (3, 1, 4); the model declares float32)" in msg, msg


def test_cli_fuse_exit_2_one_line_and_nothing_written(tmp_path, capsys):
    path = tmp_path / "gather_add.onnx"
    onnx.save(_not_derivable(), path)
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(["-q", "fuse", str(path), "-o", str(tmp_path / "out.onnx"), "--hardware", "x86_avx2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("graph-autofusion: error:") and "'idx'" in err and "--inputs" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # the same model with inputs that fit: --inputs makes it fuse
    np.savez(
        tmp_path / "feeds.npz",
        x=np.ones((2, 5, 4), np.float32),
        idx=np.array([-40, -39, -38, -37, -36, -40, -39], np.int64),
    )
    out = tmp_path / "out.onnx"
    args = ["-q", "fuse", str(path), "-o", str(out), "--inputs", str(tmp_path / "feeds.npz")]
    assert main([*args, "--hardware", "x86_avx2"]) == 0
    assert out.exists()


@pytest.mark.parametrize(
    "make_input, match",
    [
        (lambda: vi("x", shape=[2, 2**40]), r"'x' declares shape .*too large.*--inputs"),
        (
            lambda: helper.make_value_info(
                "x", helper.make_optional_type_proto(helper.make_tensor_type_proto(T.FLOAT, [2]))
            ),
            r"'x' is of optional type.*sample_inputs",
        ),
    ],
)
def test_inputs_no_sample_can_be_made_for(tmp_path, make_input, match):
    nodes = [node("Identity", ["x"], ["y"])]
    path = tmp_path / "m.onnx"
    onnx.save(model(nodes, [make_input()], [vi("y")], opset=18), path)
    with pytest.raises(SampleInputError, match=match) as info:
        GraphAutoFusion(str(path), hardware="x86_avx2").fuse()
    assert "m.onnx" in str(info.value)


def test_verify_and_bench_on_inputs_the_model_rejects_are_one_clear_error(tmp_path):
    """verify_precision / verify_performance / run (the CLI's verify and bench) name the node
    and the input instead of showing onnxruntime's traceback."""
    from graph_autofusion.errors import GraphAutoFusionError

    shape = numpy_helper.from_array(np.array([4, 5], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [shape],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    bad = {"x": np.ones((2, 3), np.float32)}
    gaf = GraphAutoFusion(str(path), sample_inputs=bad)
    for call in (
        lambda: gaf.verify_precision(str(path), str(path)),
        lambda: gaf.verify_performance(str(path), runs=1, warmup=1),
    ):
        with pytest.raises(GraphAutoFusionError, match="reshape|Reshape"):
            call()
    npz = tmp_path / "bad.npz"
    np.savez(npz, **bad)
    assert main(["verify", str(path), str(path), "--inputs", str(npz)]) == 2
    assert main(["bench", str(path), "--inputs", str(npz), "--runs", "1"]) == 2


def test_a_dynamic_axis_too_short_for_a_convolution_is_generated_longer(tmp_path):
    """An audio front end (a 32-wide convolution, then a second one of stride 4) fails on the
    16-long generated input; ``fuse`` generates it again longer (64 here) instead of
    stopping, and keeps those inputs."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 1, 32)) / 8).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 4, 4)) / 4).astype(np.float32), "w2")
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["h"], kernel_shape=[32], strides=[1]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[4], strides=[4]),
        ],
        "audio",
        [vi("x", T.FLOAT, [1, 1, "samples"])],
        [vi("y", T.FLOAT, [1, 4, "frames"])],
        [w1, w2],
    )
    path = str(tmp_path / "audio.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    gaf = GraphAutoFusion(path)
    gaf.fuse()
    assert gaf.sample_inputs["x"].shape == (1, 1, 64)
    assert gaf.result.feeds["x"].shape == (1, 1, 64)


def _masked_attention(tmp_path, name: str, nan_anyway: bool = False) -> str:
    """``softmax(x x^T, masked where pad) x``: ``pad`` True is a padded key (PyTorch's
    ``src_key_padding_mask``), so an all-True mask makes every row NaN; ``nan_anyway``
    also takes the log of a negative number at the end (NaN whatever the mask)."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xt"], ["s"]),
        helper.make_node("Unsqueeze", ["pad", "one"], ["p3"]),
        helper.make_node("Where", ["p3", "ninf", "s"], ["m"]),
        helper.make_node("Softmax", ["m"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "x"], ["o"]),
    ]
    out = "o"
    if nan_anyway:
        nodes += [
            helper.make_node("Exp", ["o"], ["e"]),
            helper.make_node("Neg", ["e"], ["n"]),
            helper.make_node("Log", ["n"], ["y"]),
        ]
        out = "y"
    g = helper.make_graph(
        nodes,
        name,
        [vi("x", T.FLOAT, [1, "seq", 8]), vi("pad", T.BOOL, [1, "seq"])],
        [vi(out, T.FLOAT, [1, "seq", 8])],
        [
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"),
        ],
    )
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_padding_mask_that_pads_every_position_is_generated_again(tmp_path):
    """Generated booleans are True; for a padding mask that pads every key, so the original's
    output was NaN everywhere and safe mode compared NaN with NaN (agreeing) on every check.
    The mask is generated again False, the model's output is finite, and that is said."""
    import warnings

    gaf = GraphAutoFusion(_masked_attention(tmp_path, "pad_attention"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)  # none: the inputs were made finite
        gaf.fuse()
    result = gaf.result
    assert not gaf.sample_inputs["pad"].any() and not result.feeds["pad"].any()
    out = ort_session(result.model).run(None, dict(result.feeds))[0]
    assert np.isfinite(out).all()
    assert any("pad generated False" in n for n in result.notes), result.notes
    # safe mode's second shape (batch 2, sequence 7) takes the same False: finite there too
    from graph_autofusion.samples.inputs import other_shape_inputs

    what, other = other_shape_inputs(gaf.model, result.feeds)
    assert other["pad"].shape[-1] == 7 and not other["pad"].any(), what


def test_sample_inputs_on_which_an_output_is_nan_everywhere_are_warned_of(tmp_path):
    """An output NaN whatever the inputs: the fuse goes on (the fused model is as correct as
    before) with one warning and a note naming the output and what to do."""
    path = _masked_attention(tmp_path, "nan_out", nan_anyway=True)
    gaf = GraphAutoFusion(path)
    with pytest.warns(AutofusionWarning, match=r"every element of the original's output\(s\) y"):
        gaf.fuse()
    result = gaf.result
    assert any("--inputs" in n and "NaN" in n for n in result.notes), result.notes
    # inputs the caller gave (a Dynamo graph's real ones too) are theirs: a note, no warning
    import warnings

    given = GraphAutoFusion(path, sample_inputs=dict(result.feeds))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        given.fuse()
    assert any("NaN" in n for n in given.result.notes), given.result.notes
