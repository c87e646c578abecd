"""Hostile ONNX files (issue 15): each gives one clear error naming the file and the problem
(and the tensor or node where known), through the API (``GraphAutoFusion(path).fuse()``) and
the CLI (``fuse``/``inspect``/``analyze``: exit 2, one line on stderr), allocates nothing of
the declared size (numpy's traced peak stays small) and writes nothing. Graphs that are odd
but valid (a 10,000-deep chain, repeated node names) fuse; random bit flips give a model or
a clear error, never another exception.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from graph_autofusion.api import GraphAutoFusion
from graph_autofusion.cli import main
from graph_autofusion.errors import (
    CycleError,
    FrontendError,
    GraphAutoFusionError,
    ModelLoadError,
    SampleInputError,
)
from graph_autofusion.frontend.onnx_frontend import to_onnx
from graph_autofusion.runtime.ort_session import ort_session

PROFILE = "x86_avx2"
PEAK_LIMIT = 64 << 20  # bytes numpy may allocate while refusing a file
HUGE = [2**20, 2**20]  # 2**40 elements declared


def vi(name, elem=T.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def make(nodes, inputs, outputs, inits=(), sparse=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), sparse_initializer=sparse)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 64)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
        helper.make_node("Relu", ["hb"], ["y"], name="relu"),
    ]
    return make(nodes, [vi("x", shape=["batch", 8])], [vi("y", shape=["batch", 64])], [w, b])


def with_weight(tensor: onnx.TensorProto) -> onnx.ModelProto:
    """The mlp with its weight ``w`` replaced by ``tensor``."""
    m = mlp()
    m.graph.initializer[0].CopyFrom(tensor)
    return m


def declared(name="w", dims=HUGE, data_type=T.FLOAT, raw=None) -> onnx.TensorProto:
    t = onnx.TensorProto(name=name, data_type=data_type, dims=dims)
    if raw is not None:
        t.raw_data = raw
    return t


def external(path, data: bytes | None, dims=(8, 64), location="w.bin", **entries) -> str:
    """The mlp with ``w`` in external data ``location`` (``data`` written there unless None)."""
    m = mlp()
    w = m.graph.initializer[0]
    raw = w.raw_data
    w.ClearField("raw_data")
    del w.dims[:]
    w.dims.extend(dims)
    w.data_location = T.EXTERNAL
    info = {"location": location, "offset": "0", "length": str(len(raw)), **entries}
    for key, value in info.items():
        if value is not None:
            w.external_data.add(key=key, value=str(value))
    if data is not None:
        (path.parent / location).write_bytes(data)
    onnx.save(m, path)
    return str(path)


def saved(proto_fn):
    def build(path):
        onnx.save(proto_fn(), path)
        return str(path)

    return build


def raw_bytes(data_fn):
    def build(path):
        path.write_bytes(data_fn())
        return str(path)

    return build


def oversized(path):
    """A file just over 2 GiB, sparse (no disk used): a valid model, then a hole."""
    with open(path, "wb") as f:
        f.write(mlp().SerializeToString())
        f.truncate(2**31 + 4096)
    return str(path)


def outside_folder(path):
    """The weight's data file exists, but beside the model's folder (``../w.bin``)."""
    (path.parent / "w.bin").write_bytes(mlp().graph.initializer[0].raw_data)
    sub = path.parent / "model"
    sub.mkdir()
    return external(sub / path.name, None, location="../w.bin")


def cycle():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="entry"),
        helper.make_node("Add", ["a", "c"], ["b"], name="loop_add"),
        helper.make_node("Relu", ["b"], ["c"], name="loop_relu"),
        helper.make_node("Neg", ["b"], ["y"], name="after"),
    ]
    return make(nodes, [vi("x", shape=[4])], [vi("y", shape=[4])])


def one_node(*nodes, inputs=("x",), outputs=("y",), inits=()):
    return make(
        list(nodes), [vi(n, shape=[4]) for n in inputs], [vi(n, shape=[4]) for n in outputs], inits
    )


def huge_constant():
    value = helper.make_attribute("value", declared("k"))
    k = helper.make_node("Constant", [], ["k"], name="huge_k")
    k.attribute.append(value)
    return one_node(k, helper.make_node("Add", ["x", "k"], ["y"], name="add"))


def huge_sparse():
    values = numpy_helper.from_array(np.ones(1, np.float32), "s")
    indices = numpy_helper.from_array(np.zeros(1, np.int64), "s_idx")
    sp = helper.make_sparse_tensor(values, indices, [2**30, 2**30])
    nodes = [helper.make_node("Add", ["x", "s"], ["y"], name="add")]
    return make(nodes, [vi("x", shape=[1])], [vi("y")], sparse=[sp])


ONES4 = numpy_helper.from_array(np.ones(4, np.float32), "x")


def not_utf8(path):
    """A node name whose bytes are not UTF-8 (protobuf reads such a field back as bytes)."""
    m = one_node(helper.make_node("Relu", ["x"], ["y"], name="QQ"))
    path.write_bytes(m.SerializeToString().replace(b"QQ", b"\xff\xfe"))
    return str(path)


# case -> (build the file at path, error class, words the message holds besides the file name)
CASES = {
    "truncated": (raw_bytes(lambda: mlp().SerializeToString()[:150]), ModelLoadError, "truncated"),
    "garbage": (
        raw_bytes(lambda: np.random.default_rng(7).integers(0, 256, 4096, np.uint8).tobytes()),
        ModelLoadError,
        "not",
    ),
    "oversized_over_2_GiB": (oversized, ModelLoadError, "over protobuf's 2 GiB limit"),
    "huge_initializer_without_data": (
        saved(lambda: with_weight(declared())),
        ModelLoadError,
        r"initializer 'w' declares shape \[1048576, 1048576\] .*holds no data",
    ),
    "huge_initializer_16_bytes": (
        saved(lambda: with_weight(declared(raw=b"\0" * 16))),
        ModelLoadError,
        r"initializer 'w' .*holds 16 bytes",
    ),
    "huge_constant_attribute": (
        saved(huge_constant),
        ModelLoadError,
        r"node 'huge_k' \(Constant\) attribute 'value' declares shape",
    ),
    "huge_sparse_initializer": (
        saved(huge_sparse),
        ModelLoadError,
        r"sparse initializer 's' declares dense shape \[1073741824, 1073741824\]",
    ),
    "negative_dim": (
        saved(lambda: with_weight(declared(dims=[-5, 64], raw=b"\0" * 2048))),
        ModelLoadError,
        r"initializer 'w' has a negative dimension",
    ),
    "unknown_element_type": (
        saved(lambda: with_weight(declared(dims=[8, 64], data_type=99, raw=b"\0" * 2048))),
        ModelLoadError,
        "element type 99",
    ),
    "external_data_missing": (
        lambda p: external(p, None),
        ModelLoadError,
        r"w\.bin.*is missing",
    ),
    "external_data_short": (
        lambda p: external(p, b"\0" * 100),
        ModelLoadError,
        r"initializer 'w' reads bytes 0\.\.2048 .*has 100 bytes",
    ),
    "external_data_offset_beyond": (
        lambda p: external(p, b"\0" * 2048, offset=2**40),
        ModelLoadError,
        r"reads bytes 1099511627776\.\.",
    ),
    "external_data_huge_declared": (
        lambda p: external(p, b"\0" * 2048, dims=HUGE, length=None),
        ModelLoadError,
        r"declares shape \[1048576, 1048576\] .*holds 2048 bytes",
    ),
    "external_data_outside_folder": (
        outside_folder,
        ModelLoadError,
        r"'\.\./w\.bin' outside the model's folder",
    ),
    "cycle": (saved(cycle), CycleError, "cycle: loop_relu -> loop_add -> loop_relu"),
    "dangling_input": (
        saved(lambda: one_node(helper.make_node("Add", ["x", "ghost"], ["y"], name="adder"))),
        FrontendError,
        r"node 'adder' \(Add\) reads undefined value 'ghost'",
    ),
    "dangling_output": (
        saved(lambda: one_node(helper.make_node("Relu", ["x"], ["y"]), outputs=("y", "z"))),
        FrontendError,
        "graph output 'z' is not defined",
    ),
    "duplicate_value_name": (
        saved(
            lambda: one_node(
                helper.make_node("Relu", ["x"], ["y"], name="r1"),
                helper.make_node("Neg", ["x"], ["y"], name="r2"),
            )
        ),
        FrontendError,
        r"node 'r2' \(Neg\): duplicate value name %y",
    ),
    "duplicate_initializer": (
        saved(
            lambda: one_node(
                helper.make_node("Relu", ["x"], ["y"]), inputs=(), inits=[ONES4, ONES4]
            )
        ),
        FrontendError,
        "duplicate value name %x",
    ),
    "duplicate_graph_input": (
        saved(lambda: one_node(helper.make_node("Relu", ["x"], ["y"]), inputs=("x", "x"))),
        FrontendError,
        "graph input 'x' is listed twice",
    ),
    "name_not_utf8": (not_utf8, FrontendError, r"node #0 \('Relu'\): its name is not valid UTF-8"),
    "attribute_of_wrong_type": (
        saved(lambda: one_node(helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1.5))),
        FrontendError,
        r"node 'sm' \('Softmax'\): attribute 'axis' is of type FLOAT; Softmax takes INT",
    ),
    "absurd_input_dim": (
        saved(
            lambda: make(
                mlp().graph.node, [vi("x", shape=[2**40, 8])], [vi("y")], mlp().graph.initializer
            )
        ),  # fmt: skip
        SampleInputError,
        r"graph input 'x' declares shape \(1099511627776, 8\).*too large.*--inputs",
    ),
}
#: cases whose file loads (``inspect`` succeeds): only making sample inputs fails
LOADS = {"absurd_input_dim"}


def listing(folder) -> dict[str, tuple[int, int]]:
    """Name -> (size, mtime) of everything under ``folder`` (sizes only: no 2 GiB reads)."""
    out = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            st = os.stat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), folder)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_file_api(tmp_path, case):
    build, cls, words = CASES[case]
    path = build(tmp_path / f"{case}.onnx")
    before = listing(tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(cls, match=words) as info:
            GraphAutoFusion(path, hardware=PROFILE).fuse(check_speed=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(info.value)
    assert os.path.basename(path) in msg and "\n" not in msg
    assert peak < PEAK_LIMIT, f"{peak / 2**20:.0f} MiB allocated while refusing the file"
    assert listing(tmp_path) == before


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_file_cli(tmp_path, case, capsys):
    build, _cls, words = CASES[case]
    path = build(tmp_path / f"{case}.onnx")
    before = listing(tmp_path)
    out = str(tmp_path / "fused.onnx")
    commands = {
        "fuse": ["fuse", path, "-o", out, "--hardware", PROFILE, "--no-speed-check"],
        "analyze": ["analyze", path, "--hardware", PROFILE],
        "inspect": ["inspect", path],
    }
    for command, argv in commands.items():
        rc = main(["-q", *argv])
        err = capsys.readouterr().err
        if command == "inspect" and case in LOADS:
            assert rc == 0, err
            continue
        assert rc == 2, f"{command}: {err}"
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"{command}: {err}"
        assert lines[0].startswith("graph-autofusion: error: "), lines[0]
        assert os.path.basename(path) in lines[0]
    assert listing(tmp_path) == before


def deep_chain(n: int) -> onnx.ModelProto:
    ops = ["Relu", "Neg", "Abs", "Sigmoid"]
    nodes = [
        helper.make_node(ops[i % 4], ["x" if i == 0 else f"v{i - 1}"], [f"v{i}"], name=f"n{i}")
        for i in range(n)
    ]
    nodes[-1].output[0] = "y"
    return make(nodes, [vi("x", shape=[1, 16])], [vi("y", shape=[1, 16])])


def test_a_chain_three_times_the_recursion_limit_fuses(tmp_path, capsys):
    """Valid, only deep: ``3 * (limit + 200)`` nodes (3,600 at the default limit of 1,000; the
    chain follows the limit in force, so a raised limit cannot make it shallow), so any
    recursive walk would exceed the limit; every stage walks it without recursion, the fused
    model computes what the original does and ``inspect`` reports every node."""
    import sys

    n = 3 * (sys.getrecursionlimit() + 200)
    path = tmp_path / "deep.onnx"
    onnx.save(deep_chain(n), path)
    gaf = GraphAutoFusion(str(path), hardware=PROFILE)
    fused = gaf.fuse(check_speed=False)
    x = {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(1, 16)}
    want = ort_session(path.read_bytes(), "all").run(None, x)
    got = ort_session(fused, "all").run(None, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert main(["-q", "inspect", str(path)]) == 0
    assert str(n) in capsys.readouterr().out


def test_repeated_node_names_fuse_with_unique_names(tmp_path):
    """onnxruntime refuses two nodes of one name; the import renames the second and the
    fused model keeps the unique name (the first keeps its own)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Neg", ["a"], ["b"], name="r1"),
        helper.make_node("Mul", ["b", "b"], ["y"], name="r1"),
    ]
    path = tmp_path / "dup_names.onnx"
    onnx.save(make(nodes, [vi("x", shape=[2, 4])], [vi("y", shape=[2, 4])]), path)
    fused = GraphAutoFusion(str(path), hardware=PROFILE).fuse(check_speed=False)
    names = [n.name for n in to_onnx(fused).graph.node]
    assert len(names) == len(set(names)) and "r1" in names


def attributed() -> onnx.ModelProto:
    """A small model whose nodes carry attributes (strides, perm, axes) and constants."""
    rng = np.random.default_rng(2)

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a), name)

    inits = [
        init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
        init("shape", np.array([1, 4, 36], np.int64)),
        init("idx", np.array([0, 2], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["rs"], name="reshape"),
        helper.make_node("Transpose", ["rs"], ["tr"], name="tr", perm=[0, 2, 1]),
        helper.make_node("Softmax", ["tr"], ["sm"], name="sm", axis=-1),
        helper.make_node("Gather", ["sm", "idx"], ["ga"], name="ga", axis=2),
        helper.make_node("ReduceMean", ["ga"], ["y"], name="rm", axes=[-1], keepdims=1),
    ]
    return make(nodes, [vi("x", shape=["batch", 3, 6, 6])], [vi("y", shape=None)], inits)


def test_bit_flipped_files_load_or_fail_clearly(tmp_path):
    """300 seeded files with 1-3 flipped bits: each loads or raises a GraphAutoFusionError;
    the first few that load also fuse (or raise one). Found this way: names that are not
    UTF-8 (read back as bytes), attributes of the wrong type, a 573-dim tensor."""
    good = attributed().SerializeToString()
    rng = np.random.default_rng(15)
    outcomes: dict[str, int] = {}
    fused = 0
    for k in range(300):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        path = tmp_path / f"flip{k}.onnx"
        path.write_bytes(bytes(data))
        try:
            gaf = GraphAutoFusion(str(path), hardware=PROFILE)
            if fused < 6:
                fused += 1
                gaf.fuse(check_speed=False)
            kind = "ok"
        except GraphAutoFusionError as exc:
            kind = type(exc).__name__
            assert path.name in str(exc), str(exc)
        outcomes[kind] = outcomes.get(kind, 0) + 1
        path.unlink()
    assert outcomes.get("ok", 0) > 0 and len(outcomes) > 1, outcomes
