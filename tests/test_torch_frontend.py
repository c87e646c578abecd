"""PyTorch frontend + torch runtime: import real modules, run the IR with torch, compare to eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tr = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from graph_autofusion.frontend.aten_ops import get_converter  # noqa: E402
from graph_autofusion.frontend.torch_frontend import from_fx, from_torch  # noqa: E402
from graph_autofusion.ir.core import Model  # noqa: E402
from graph_autofusion.runtime.ort_session import ort_session  # noqa: E402
from graph_autofusion.runtime.torch_ops import get_impl  # noqa: E402
from graph_autofusion.runtime.torch_runtime import TorchRunner, to_torch_module  # noqa: E402

TOL = 1e-5


def _first(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple | list):
        return out[0]
    return next(iter(out.values()))


def _check(module, args=(), kwargs=None, *, tol=TOL, canonical=True) -> Model:
    """Import, run with the torch runtime, compare every output with eager."""
    module.eval()
    kwargs = kwargs or {}
    model = from_torch(module, args, kwargs)
    with torch.no_grad():
        ref = module(*args, **kwargs)
    if not isinstance(ref, torch.Tensor | tuple | list):
        ref = tuple(ref.values())  # Hugging Face ModelOutput
    refs = [r for r in torch.utils._pytree.tree_leaves(ref) if isinstance(r, torch.Tensor)]
    flat = torch.utils._pytree.tree_leaves((args, kwargs))
    feeds = dict(zip([v.name for v in model.graph.inputs], flat))
    outs = list(TorchRunner(model).run(feeds).values())
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert (o - r).abs().max().item() <= tol
    if canonical:
        aten = {n.op_type for n in model.graph.nodes if n.domain == "aten"}
        assert not aten, f"opaque aten nodes left: {aten}"
        assert all(n.domain == "" and get_impl(n.op_type) for n in model.graph.nodes)
    for v in model.graph.values():  # every value typed, shapes static here
        assert v.dtype is not None and v.shape is not None, v
    return model


def test_mlp_linear_becomes_matmul_with_pretransposed_weight():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 4), nn.SiLU())
    model = _check(m, (torch.randn(3, 8),))
    hist = model.graph.op_histogram()
    assert hist == {"Add": 2, "MatMul": 2, "Mul": 1, "Gelu": 1, "Sigmoid": 1}
    mm = next(n for n in model.graph.nodes if n.op_type == "MatMul")
    w = mm.inputs[1]
    assert w.is_const and w.shape == (8, 16)  # W^T stored pre-transposed
    assert torch.allclose(torch.from_numpy(w.const), m[0].weight.detach().t())
    gelu = next(n for n in model.graph.nodes if n.op_type == "Gelu")
    assert gelu.attrs["approximate"] == "tanh"
    assert mm.meta["aten"] == "aten.linear.default" and mm.meta["source"] == "0"
    assert "0.bias" in model.graph.initializers


class ConvBnReluPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding="valid", groups=2)
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.avg = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        y = self.avg(self.conv2(y) + 1.0)
        return F.adaptive_avg_pool2d(y, 1).flatten(1), F.adaptive_avg_pool2d(y, (2, 2))


def test_conv_bn_relu_pool():
    torch.manual_seed(0)
    m = ConvBnReluPool()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    model = _check(m, (torch.randn(2, 3, 17, 17),))
    hist = model.graph.op_histogram()
    for op in ("Conv", "BatchNormalization", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool"):
        assert op in hist, hist
    conv2 = [n for n in model.graph.nodes if n.op_type == "Conv"][1]
    assert conv2.attrs["group"] == 2 and conv2.attrs["strides"] == [2, 2]


class Attention(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, q, k, v, mask):
        if self.mode == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.mode == "gqa":
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3
            )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("mode", ["bool_mask", "float_mask", "causal", "gqa"])
def test_sdpa_decomposed_like_the_onnx_exporter(mode):
    torch.manual_seed(0)
    hk = 2 if mode == "gqa" else 4
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, hk, 6, 8), torch.randn(2, hk, 6, 8)
    mask = torch.rand(2, 1, 5, 6) > 0.3
    mask[1, 0, 2] = False  # a fully masked query row: aten returns zeros there
    if mode == "float_mask":
        mask = torch.randn(2, 1, 5, 6)
    if mode == "causal":
        q, k, v = q[..., :6, :], k, v
        q = torch.randn(2, 4, 6, 8)
    model = _check(Attention(mode), (q, k, v, mask))
    ops = [n.op_type for n in model.graph.nodes]
    assert ops.count("MatMul") == 2 and ops.count("Softmax") == 1
    assert "Transpose" in ops and "Mul" in ops
    if mode == "gqa":
        assert "Expand" in ops


def test_layer_norm_embedding_and_to_torch_module():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(50, 16), nn.LayerNorm(16), nn.Linear(16, 16, bias=False))
    ids = torch.randint(0, 50, (2, 7))
    model = _check(m, (ids,))
    assert model.graph.op_histogram() == {"Gather": 1, "LayerNormalization": 1, "MatMul": 1}
    ln = next(n for n in model.graph.nodes if n.op_type == "LayerNormalization")
    assert ln.attrs == {"axis": -1, "epsilon": 1e-5}
    tm = to_torch_module(model)
    with torch.no_grad():
        assert (tm(ids) - m(ids)).abs().max().item() <= TOL


def test_lstm_becomes_onnx_lstm():
    torch.manual_seed(0)
    m = nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)
    model = _check(m, (torch.randn(3, 5, 8), (torch.randn(4, 3, 16), torch.randn(4, 3, 16))))
    assert model.graph.op_histogram().get("LSTM") == 2


def test_unknown_aten_op_becomes_opaque_node_run_by_torch():
    class CumMax(nn.Module):
        def forward(self, x):
            return torch.cummax(x * 2, dim=1)[0] + 1

    model = _check(CumMax(), (torch.randn(3, 5),), canonical=False)
    opaque = [n for n in model.graph.nodes if n.domain == "aten"]
    assert len(opaque) == 1 and opaque[0].op_type.startswith("aten::cummax")
    assert len(opaque[0].outputs) == 2 and opaque[0].outputs[0].shape == (3, 5)
    assert get_converter(torch.ops.aten.cummax.default) is None


def test_histogram_over_the_data_s_own_range_stays_opaque():
    class Hist(nn.Module):
        def forward(self, x):
            return torch.histc(x, bins=6) + torch.histc(x, bins=6, min=-1, max=1)

    model = _check(Hist(), (torch.randn(40),), canonical=False)
    opaque = [n.op_type for n in model.graph.nodes if n.domain == "aten"]
    assert opaque == ["aten::histc.default"]  # min == max: torch's own; a fixed range: ONNX


def _ids(vocab=256):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids, mask


def _small_llama_config(kv_heads: int, **extra) -> tr.LlamaConfig:
    return tr.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=256,
        use_cache=False,
        **extra,
    )


@pytest.mark.parametrize("kv_heads,attn", [(4, "sdpa"), (2, "sdpa"), (2, "eager")])
def test_hf_llama(kv_heads, attn):
    torch.manual_seed(0)
    cfg = _small_llama_config(kv_heads, attn_implementation=attn)
    ids, mask = _ids()
    model = _check(tr.LlamaForCausalLM(cfg), (), {"input_ids": ids, "attention_mask": mask})
    assert [v.name for v in model.graph.outputs] == ["logits"]
    hist = model.graph.op_histogram()
    assert hist["Softmax"] == 2 and hist["Sqrt"] == 5 and hist["ReduceMean"] == 5


def test_hf_bert():
    torch.manual_seed(0)
    cfg = tr.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=64,
    )
    ids, mask = _ids()
    model = _check(tr.BertModel(cfg), (), {"input_ids": ids, "attention_mask": mask})
    hist = model.graph.op_histogram()
    assert hist["LayerNormalization"] == 5 and hist["Gelu"] == 2


def test_hf_gpt2():
    torch.manual_seed(0)
    cfg = tr.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, use_cache=False
    )
    ids, mask = _ids()
    model = _check(tr.GPT2LMHeadModel(cfg), (), {"input_ids": ids, "attention_mask": mask})
    assert model.graph.op_histogram()["Tanh"] == 2  # gelu_new stays decomposed (tanh form)


def test_hf_resnet():
    torch.manual_seed(0)
    cfg = tr.ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="bottleneck",
        num_labels=10,
    )
    model = _check(tr.ResNetForImageClassification(cfg), (torch.randn(2, 3, 32, 32),))
    hist = model.graph.op_histogram()
    assert hist["Conv"] == hist["BatchNormalization"] and "MaxPool" in hist


def test_from_fx_inside_a_torch_compile_backend():
    torch.manual_seed(0)
    torch._dynamo.reset()
    m = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
    ).eval()
    captured: list[Model] = []

    def backend(gm, example_inputs):
        captured.append(from_fx(gm, example_inputs))
        return gm.forward

    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        compiled = torch.compile(m, backend=backend)
        ref = compiled(x)
    assert len(captured) == 1
    model = captured[0]
    assert [v.shape for v in model.graph.inputs] == [(2, 3, 8, 8)]  # weights are initializers
    assert {"Conv", "BatchNormalization", "Relu", "MatMul"} <= set(model.graph.op_histogram())
    out = _first(TorchRunner(model)(x))
    assert (out - ref).abs().max().item() <= TOL


def test_numpy_reference_interpreter_matches_eager_on_small_llama():
    from graph_autofusion.runtime.interpreter import run_model

    torch.manual_seed(0)
    cfg = _small_llama_config(2)
    m = tr.LlamaForCausalLM(cfg).eval()
    ids, mask = _ids()
    model = from_torch(m, (), {"input_ids": ids, "attention_mask": mask})
    out = run_model(model, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=mask).logits
    assert abs(torch.from_numpy(out["logits"]) - ref).max().item() <= 1e-4


@pytest.mark.parametrize("kind", ["resnet", "lstm"])
def test_torch_runtime_runs_onnx_imported_graphs_like_onnxruntime(kind):
    """The same runtime executes ONNX-file IR (opset 17 forms) with ONNX semantics."""
    import io

    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from graph_autofusion.frontend.onnx_import import load_onnx

    torch.manual_seed(0)
    if kind == "resnet":
        cfg = tr.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])
        m, x = tr.ResNetForImageClassification(cfg), torch.randn(1, 3, 32, 32)
    else:
        m, x = nn.LSTM(8, 16, num_layers=2, bidirectional=True), torch.randn(5, 3, 8)
    f = io.BytesIO()
    torch.onnx.export(m.eval(), (x,), f, input_names=["x"], opset_version=17, dynamo=False)
    model = load_onnx(onnx.load_from_string(f.getvalue()))
    ref = ort_session(f.getvalue(), "all").run(None, {"x": x.numpy()})
    outs = list(TorchRunner(model).run({"x": x}).values())
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert abs(o - torch.from_numpy(r)).max().item() <= TOL


def test_constant_cache_never_aliases_freed_temporaries():
    """Constants are cached by id(); a freed temporary's id must not return another's value."""
    from graph_autofusion.frontend.torch_convert import ConvertContext
    from graph_autofusion.ir import Graph

    cx = ConvertContext(Graph())
    values = [cx.v(torch.full((3,), float(i))) for i in range(64)]
    assert len({id(v) for v in values}) == 64
    assert [float(v.const[0]) for v in values] == [float(i) for i in range(64)]


def test_opaque_node_of_a_non_default_overload_runs_by_torch():
    """The node's op_type names the overload once (``aten::bitwise_left_shift.Tensor_Scalar``),
    as torch.ops spells it."""

    class Shift(nn.Module):
        def forward(self, x):
            return torch.bitwise_left_shift(x * 2, 1) + 1

    model = _check(Shift(), (torch.arange(15).reshape(3, 5),), canonical=False)
    (opaque,) = [n for n in model.graph.nodes if n.domain == "aten"]
    assert opaque.op_type == "aten::bitwise_left_shift.Tensor_Scalar"


def test_opaque_node_reads_a_symbolic_size_argument_as_a_number():
    """An IR value where the schema wants an ``int`` (a symbolic size) is passed as a number."""
    from graph_autofusion.frontend.torch_convert import ConvertContext
    from graph_autofusion.ir import Graph
    from graph_autofusion.ir.core import Value
    from graph_autofusion.ir.dtypes import DType

    graph = Graph("roll")
    cx = ConvertContext(graph)
    x = graph.add_input(Value("x", DType.FLOAT, (3, 7)))
    n = graph.add_input(Value("n", DType.INT64, ()))
    out = cx.opaque(torch.ops.aten.roll.default, (x, [n], [1]), {})
    out.dtype, out.shape = DType.FLOAT, (3, 7)
    graph.set_outputs([out])
    model = Model(graph, {"": 20})
    t = torch.randn(3, 7)
    for shift in (2, -3):
        got = TorchRunner(model).run({"x": t, "n": shift})[out.name]
        assert torch.equal(got, torch.roll(t, shift, 1))
    assert graph.nodes[0].op_type == "aten::roll.default"


def test_from_fx_symbolic_int_input_carried_by_no_tensor():
    """A Python int Dynamo made symbolic that no tensor's size carries is a 0-d int64 input."""
    from graph_autofusion.frontend.torch_frontend import import_fx
    from graph_autofusion.ir.dtypes import DType

    torch._dynamo.reset()

    class Scaled(nn.Module):
        def forward(self, n, x):  # the graph takes the int first, then a size of x, then x
            r = torch.arange(n).float().sum()
            return torch.softmax(x / n, -1) * x.shape[0] + r

    imports = []

    def capture(gm, example_inputs):
        imports.append(gm)
        return gm.forward

    m = Scaled()
    compiled = torch.compile(m, backend=capture)
    for n, rows in ((3, 2), (5, 4)):  # the second call recompiles with n and rows symbolic
        compiled(n, torch.randn(rows, 4))
    gm = imports[-1]
    phs = [p for p in gm.graph.nodes if p.op == "placeholder"]
    x = torch.randn(4, 4)
    args = [5 if p.name.endswith("n_") else 4 if "SymInt" in str(p.type) else x for p in phs]
    imp = import_fx(gm, args)
    inputs = imp.model.graph.inputs
    (ints,) = [v for v in inputs if v.shape == ()]
    assert ints.dtype == DType.INT64 and len(inputs) == 2
    assert [args[i] for i in imp.user_inputs] == ([5, x] if inputs[0] is ints else [x, 5])
    for n, rows in ((5, 4), (9, 3)):
        t = torch.randn(rows, 4)
        feeds = {v.name: n if v is ints else t for v in inputs}
        out = _first(TorchRunner(imp.model).run(feeds))
        assert torch.allclose(out, m(n, t), atol=TOL)
    torch._dynamo.reset()
