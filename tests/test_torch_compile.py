"""``torch.compile(backend="autofusion")``: real Dynamo graphs, real kernels, eager as the judge."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graph_autofusion.testing.small_hf import SMALL_HF, tiny_llama  # noqa: E402
from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402
from graph_autofusion.verify.compare import compare_tensors  # noqa: E402

pytestmark = pytest.mark.xdist_group("torch_compile")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return compare_tensors(a.detach().float().numpy(), b.detach().float().numpy())["cosine"]


def test_backend_is_registered_by_entry_point():
    assert "autofusion" in torch._dynamo.list_backends()


#: Greedy tokens per generate: the prefill, the first decode step and 8 calls of the graph
#: with a symbolic cache length (the KV-cache path, after Dynamo's one dynamic recompile).
NEW_TOKENS = 10


def _generate_eager_then_compiled(model, ids, backend=None):
    """Greedy :data:`NEW_TOKENS`-token generate in eager, then with the forward compiled by
    ``backend`` (default: our backend without the engine timing; the timed choice is
    test_torch_ort's)."""
    kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    backend = backend or make_backend(check_speed=False)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    model.forward = torch.compile(model.forward, backend=backend)
    with torch.no_grad():
        got = model.generate(ids, **kw)
    return want, got, backend.config.graphs if hasattr(backend, "config") else []


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_llama_generate_same_tokens_without_recompiling(kv_heads):
    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    model = tiny_llama(kv_heads)
    # the torch program's own decode path (its GEMV): the onnxruntime engine is test_torch_ort's
    want, got, graphs = _generate_eager_then_compiled(
        model, ids, make_backend(engine="torch", check_speed=False)
    )
    assert torch.equal(got, want)

    def model_generate(_graphs, ids):
        return model.generate(
            ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )

    # prefill, the first decode step, then one graph with symbolic cache length for the rest
    assert 1 <= len(graphs) <= 3, [g.summary() for g in graphs]
    assert all(g.fallback is None for g in graphs), [g.fallback for g in graphs]
    assert graphs[-1].calls >= NEW_TOKENS - 5  # the decode graph serves the rest
    assert sum(g.result.kernel_counts()["groups"] for g in graphs) > 0
    decode = graphs[-1].result.program
    assert decode.gemv_nodes > 0 and sum(k.kernel_calls for k in decode.gemv) > 0
    # a second generate compiles nothing: the first call returned the program's own outputs,
    # whose layouts Dynamo's guards on the next step were built from
    n = len(graphs)
    with torch.no_grad():
        again = model_generate(graphs, ids)
    assert torch.equal(again, want) and len(graphs) == n


def test_a_graph_it_cannot_import_runs_in_eager_with_one_warning():
    class Inverse(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.inv(x) @ x + 1

    x = torch.randn(4, 4) + 4 * torch.eye(4)
    backend = make_backend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(Inverse(), backend=backend)(x)
    assert torch.allclose(got, Inverse()(x), atol=1e-5)
    ours = [w for w in caught if issubclass(w.category, AutofusionWarning)]
    assert len(ours) == 1 and "runs in eager" in str(ours[0].message)
    assert backend.config.graphs[0].fallback


def test_graph_break_compiles_each_piece():
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 32)
            self.b = torch.nn.Linear(32, 32)

        def forward(self, x):
            y = torch.nn.functional.gelu(self.a(x)) * 2 + 1
            torch._dynamo.graph_break()
            return torch.sigmoid(self.b(y)) * y

    torch.manual_seed(0)
    m = Broken().eval()
    x = torch.randn(4, 32)
    backend = make_backend()
    with torch.no_grad():
        got = torch.compile(m, backend=backend)(x)
        want = m(x)
    assert len(backend.config.graphs) == 2
    assert all(g.fallback is None for g in backend.config.graphs)
    assert _cos(got, want) >= 0.9999 and torch.allclose(got, want, atol=1e-4)


def test_non_contiguous_and_channels_last_inputs():
    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(8, 16, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(16)

        def forward(self, x, y):
            return torch.relu(self.bn(self.c(x))) + y.mean()

    torch.manual_seed(0)
    m = Conv().eval()
    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
    y = torch.randn(12, 6).t()  # a transposed view
    with torch.no_grad():
        got = torch.compile(m, backend=make_backend())(x, y)
        want = m(x, y)
    assert torch.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_model(dtype):
    model = tiny_llama(2).to(dtype)
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
        got = torch.compile(model, backend=make_backend())(ids).logits
    assert got.dtype == dtype
    assert _cos(got, want) >= 0.999


@pytest.mark.parametrize("name", ["qwen2", "gemma", "phi", "gpt_neox"])
def test_unseen_decoders_match_eager(name):
    torch.manual_seed(0)
    model, inputs = SMALL_HF[name]()
    model.eval()
    backend = make_backend(check_speed=False)  # eager's answer, not the engine's speed
    with torch.no_grad():
        want = model(**inputs).logits
        got = torch.compile(model, backend=backend)(**inputs).logits
    assert _cos(got, want) >= 0.9999
    assert all(g.fallback is None for g in backend.config.graphs), [
        g.fallback for g in backend.config.graphs
    ]


def test_qwen2_generate_same_tokens():
    """Through the registered name, as a user writes it."""
    torch.manual_seed(0)
    model, inputs = SMALL_HF["qwen2"]()
    want, got, _ = _generate_eager_then_compiled(model.eval(), inputs["input_ids"], "autofusion")
    assert torch.equal(got, want)


def test_gpt2_generate_same_tokens():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128)
    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(4))
    want, got, graphs = _generate_eager_then_compiled(transformers.GPT2LMHeadModel(cfg).eval(), ids)
    assert torch.equal(got, want)
    assert all(g.fallback is None for g in graphs)


@pytest.mark.parametrize("name", ["minilm", "lstm"])
def test_zoo_models_match_eager(name):
    from graph_autofusion.testing.builders import build_model

    module, inputs = build_model(name, seq_len=32)
    backend = make_backend(check_speed=False)  # eager's answer, not the engine's speed
    with torch.no_grad():
        want = module(**inputs)
        got = torch.compile(module, backend=backend)(**inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert all(_cos(g, w) >= 0.9999 for g, w in zip(got, want))
    assert all(g.fallback is None for g in backend.config.graphs), [
        g.fallback for g in backend.config.graphs
    ]


def test_resnet_convolutions_take_their_native_forms():
    """Conv + BatchNorm (+ Relu) groups no kernel can hold run as the conv rules' native
    rewrites (BatchNorm folded into the weights, FusedConv on oneDNN), verified like kernels."""
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck"
    )
    model = transformers.ResNetForImageClassification(cfg).eval()
    with torch.no_grad():  # non-trivial statistics, so a wrong fold would show
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.75, 1.25)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    backend = make_backend(engine="torch")  # the torch program's fusions are asserted
    with torch.no_grad():
        want = model(pixel_values=x).logits
        got = torch.compile(model, backend=backend)(pixel_values=x).logits
    assert _cos(got, want) >= 0.9999 and torch.allclose(got, want, atol=1e-4)
    (graph,) = backend.config.graphs
    res = graph.result
    planned = {low.rule for low in res.lowered} | {b.rule for b in res.rolled_back}
    assert planned & {"conv_bn", "conv_bn_relu"}, planned
    assert all(b.code == "slower" for b in res.rolled_back), res.rolled_back
    natives = [low for low in res.lowered if low.rule.startswith("conv_bn")]
    assert all("BatchNormalization" not in " ".join(low.fused_ops) for low in natives)


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)) * 2.0 + 1.0)


def test_each_module_and_each_weight_update_gets_its_own_answer():
    """Dynamo passes parameters as arguments and reuses one graph for modules of one class:
    the program must not answer with the weights it was compiled for."""
    torch.manual_seed(0)
    m1, m2 = _MLP().eval(), _MLP().eval()
    x = torch.randn(4, 16)
    backend = make_backend(check_speed=False)
    c1, c2 = torch.compile(m1, backend=backend), torch.compile(m2, backend=backend)
    with torch.no_grad():
        assert torch.allclose(c1(x), m1(x), atol=1e-5)
        assert torch.allclose(c2(x), m2(x), atol=1e-5)
        assert torch.allclose(c1(x), m1(x), atol=1e-5)
        m1.a.weight.mul_(0.5)  # an in-place update after compiling
        assert torch.allclose(c1(x), m1(x), atol=1e-5)


def test_with_torchs_nn_module_guard_filter_every_weight_is_still_seen():
    """``options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}``
    (torch's filter against guard overhead; ``benchmarks/dynamo_call_overhead.py``) reaches
    Dynamo and the rest of the dict our backend. Without the modules' guards, a second module
    of the class and a parameter replaced by another reuse the first compiled frame: the
    answers must still be each module's own (our programs are keyed by the weights)."""
    from graph_autofusion.torch_compile import _options_backend

    torch.manual_seed(0)
    m1, m2 = _MLP().eval(), _MLP().eval()
    x = torch.randn(4, 16)

    def compiled(m):
        skip = torch.compiler.skip_guard_on_all_nn_modules_unsafe
        options = {"guard_filter_fn": skip, "check_speed": False}  # torch pops the filter
        return torch.compile(m, backend="autofusion", options=options)

    c1, c2 = compiled(m1), compiled(m2)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", AutofusionWarning)
        assert torch.allclose(c1(x), m1(x), atol=1e-5)
        assert torch.allclose(c2(x), m2(x), atol=1e-5)
        m1.a.weight = torch.nn.Parameter(torch.randn(32, 16))  # another parameter object
        assert torch.allclose(c1(x), m1(x), atol=1e-5)
        m2.b.weight.mul_(0.5)  # an in-place update
        assert torch.allclose(c2(x), m2(x), atol=1e-5)
    graphs = _options_backend({"check_speed": False}).config.graphs
    assert graphs and all(g.fallback is None and g.engine == "onnxruntime" for g in graphs)


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_a_weight_given_other_memory_is_seen_and_updates_never_exhaust_the_weight_sets(engine):
    """``param.data = other`` keeps the parameter object and its version but not its memory:
    the program (reading the old memory in place, or a copy of it) must not answer with the
    old weight. Weights updated between calls (evaluation during fine-tuning) compile again
    each time without counting as new weight sets: the graph never falls back to eager."""
    torch.manual_seed(0)
    m = _MLP().eval()
    x = torch.randn(4, 16)
    backend = make_backend(engine=engine, check_speed=False)
    compiled = torch.compile(m, backend=backend)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", AutofusionWarning)
        assert torch.allclose(compiled(x), m(x), atol=1e-5)
        version = m.a.weight._version
        m.a.weight.data = torch.randn(32, 16)  # same tensor object, same version, new memory
        assert m.a.weight._version == version
        assert torch.allclose(compiled(x), m(x), atol=1e-5)
        for _ in range(6):  # more updates than MAX_WEIGHT_SETS
            m.b.weight.add_(0.25)
            assert torch.allclose(compiled(x), m(x), atol=1e-5)
    (graph,) = backend.config.graphs
    assert graph.fallback is None and graph.engine == engine, graph.summary()
    assert len(graph._programs) == 1 and len(graph._orts) == (engine == "onnxruntime")


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_a_model_made_under_inference_mode_runs_fused(engine):
    """Weights made under ``torch.inference_mode()`` (a model loaded there) have no version
    counter (reading ``_version`` raises): the per-call weight checks and the derived-weight
    caches must not read it, and the model runs fused in either grad mode."""
    torch.manual_seed(0)
    with torch.inference_mode():
        m = _MLP().eval()
    assert m.a.weight.is_inference()
    x = torch.randn(4, 16)
    backend = make_backend(engine=engine, check_speed=False)
    compiled = torch.compile(m, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode):
            with mode():
                for _ in range(3):  # compiled, then served
                    assert torch.allclose(compiled(x), m(x), atol=1e-5)
    assert backend.config.graphs
    for graph in backend.config.graphs:
        assert graph.fallback is None and graph.engine == engine, graph.summary()


def test_autograd_calls_run_in_eager_and_train():
    torch.manual_seed(0)
    m = _MLP()
    x = torch.randn(4, 16)
    compiled = torch.compile(m, backend=make_backend(check_speed=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutofusionWarning)
        out = compiled(x)
    out.sum().backward()
    assert m.a.weight.grad is not None and m.a.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_a_graph_writing_into_its_input_runs_fused_and_writes_exactly_once(engine):
    """A write into an argument (``add_``) is imported functional: the engine returns the
    written value and the call copies it into the argument, once per call (the compile's
    own eager run and timings work on copies)."""

    def accumulate(x, acc):
        acc.add_(x)
        return acc * 2

    acc, x = torch.zeros(4), torch.ones(4)
    backend = make_backend(engine=engine, check_speed=False)  # the engine, not eager
    compiled = torch.compile(accumulate, backend=backend)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", AutofusionWarning)
        assert compiled(x, acc).tolist() == [2.0] * 4 and acc.tolist() == [1.0] * 4
        assert compiled(x, acc).tolist() == [4.0] * 4 and acc.tolist() == [2.0] * 4
    (graph,) = backend.config.graphs
    assert graph.fallback is None and graph.engine == engine, graph.summary()


def test_a_static_cache_write_runs_on_onnxruntime_like_eager():
    """A static KV cache's update (``index_copy_`` at the step's positions, a length's
    ``add_``, the written length returned): ScatterElements in onnxruntime, the cache and the
    length written in place, the returned length the argument itself (eager's aliasing)."""

    def step(cache, length, k, q):
        pos = torch.arange(k.shape[2]) + length
        length.add_(k.shape[2])
        cache.index_copy_(2, pos, k)
        return torch.softmax(q @ cache.transpose(-1, -2), dim=-1) @ cache, length

    gen = torch.Generator().manual_seed(0)
    backend = make_backend(engine="onnxruntime", check_speed=False)
    compiled = torch.compile(step, backend=backend)
    caches = [torch.zeros(1, 2, 12, 8), torch.zeros(1, 2, 12, 8)]
    lengths = [torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (3, 1, 1, 1):
            k, q = torch.randn(1, 2, n, 8, generator=gen), torch.randn(1, 2, n, 8, generator=gen)
            want, want_len = step(caches[0], lengths[0], k, q)
            got, got_len = compiled(caches[1], lengths[1], k, q)
            assert torch.allclose(got, want, atol=1e-5)
            assert torch.equal(caches[1], caches[0]) and int(lengths[1]) == int(lengths[0])
            assert got_len is lengths[1]
    graphs = backend.config.graphs
    assert all(g.fallback is None and g.engine == "onnxruntime" for g in graphs), [
        g.summary() for g in graphs
    ]
    ops = {n.op_type for g in graphs for n in g.ort_result.model.graph.nodes}
    assert "ScatterElements" in ops and not any(
        n.domain == "aten" for g in graphs for n in g.imported.graph.nodes
    )


def test_a_graph_writing_into_a_buffer_runs_in_eager_exactly_once():
    """A write into a module's buffer (which the program reads as a constant) keeps eager,
    with one warning naming it."""

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count.add_(1)
            return x * self.count

    m = Counter()
    compiled = torch.compile(m, backend=make_backend(check_speed=False))
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always", AutofusionWarning)
        assert compiled(torch.ones(2)).tolist() == [1.0, 1.0]
        assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]
    msgs = [str(w.message) for w in seen if issubclass(w.category, AutofusionWarning)]
    assert len(msgs) == 1 and "parameters or buffers" in msgs[0], msgs
    assert float(m.count) == 2.0


def test_an_output_computed_from_constants_is_a_new_tensor_each_call():
    def f(x):
        return x + 1, torch.zeros(4)

    compiled = torch.compile(f, backend=make_backend(check_speed=False))
    with torch.no_grad():
        _, z = compiled(torch.ones(4))
        z.add_(7)
        _, z2 = compiled(torch.ones(4))
    assert z2.tolist() == [0.0] * 4


def test_a_graph_returning_only_sizes_runs_as_captured_without_a_warning():
    """A Dynamo graph whose outputs are all sizes or numbers (Longformer's) has no tensor work
    to fuse: the backend hands it back as captured, with no compile and no warning (it used to
    compile, fail with "the graph returns no tensor, only sizes" and warn for each)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["example_value"] = torch.zeros(2, 3)
    y = g.call_function(torch.ops.aten.add.Tensor, (x, 1.0))
    y.meta["example_value"] = torch.zeros(2, 3)
    n = g.call_function(torch.ops.aten.sym_size.int, (y, 1))
    n.meta["example_value"] = 3
    g.output((n,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    backend = make_backend(check_speed=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        fn = backend(gm, [torch.zeros(2, 3)])
        assert fn(torch.zeros(2, 3)) == (3,)
    assert fn == gm.forward and not backend.config.graphs


class _Bessel(torch.nn.Module):
    """A Bessel function (no ONNX form) between two linear layers."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.special.bessel_j0(self.a(x)))


def test_onnxruntime_s_refusal_is_warned_once_per_graph_and_reason():
    """A graph onnxruntime cannot run, compiled again for a second module's weights (Dynamo
    reuses one graph for both), warns once: the second compile's engine choice says nothing
    new (Longformer's graphs each warned twice, naming two engines)."""
    torch.manual_seed(0)
    m1, m2 = _Bessel().eval(), _Bessel().eval()
    x = torch.randn(2, 3, 16)
    backend = make_backend(check_speed=False)
    c1, c2 = torch.compile(m1, backend=backend), torch.compile(m2, backend=backend)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always", AutofusionWarning)
        for _ in range(2):
            assert torch.allclose(c1(x), m1(x), atol=1e-5)
            assert torch.allclose(c2(x), m2(x), atol=1e-5)
    (graph,) = backend.config.graphs
    assert len(graph._programs) == 2 and "onnxruntime" in graph.engine_notes
    refusals = [w for w in seen if "not onnxruntime" in str(w.message)]
    assert len(refusals) == 1, [str(w.message) for w in seen]


class _Normalizer(torch.nn.Module):
    """Running statistics (buffers) the caller updates in place between calls."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("mean", torch.zeros(8))

    def forward(self, x):
        return self.lin(x - self.mean)


def test_a_buffer_written_in_place_between_calls_becomes_an_input_not_a_compile_per_call():
    """A buffer updated in place before each call (observation normalisation) makes the
    compiled program stale each time; it is read as an input from then on, so the graph
    compiles at most twice, not on every call, and never falls back."""
    torch.manual_seed(0)
    m = _Normalizer().eval()
    x = torch.randn(4, 8)
    backend = make_backend(check_speed=False)
    compiled = torch.compile(m, backend=backend)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", AutofusionWarning)
        for _ in range(12):
            m.mean.add_(0.5)
            assert torch.allclose(compiled(x), m(x), atol=1e-5)
    (graph,) = backend.config.graphs
    assert graph.fallback is None and graph.engine == "onnxruntime", graph.summary()
    assert graph._live and len(graph._programs) == 1
    assert graph._stale_compiles == 0  # made live, not compiled again per update


def test_a_graph_that_only_writes_into_its_argument_is_still_compiled():
    """No outputs at all (the write is the result) is not 'only sizes': it is compiled."""

    def accumulate(x, acc):
        acc.add_(x * 2)

    acc, x = torch.zeros(4), torch.ones(4)
    backend = make_backend(check_speed=False)
    compiled = torch.compile(accumulate, backend=backend)
    with torch.no_grad():
        compiled(x, acc)
        compiled(x, acc)
    assert acc.tolist() == [4.0] * 4
    assert len(backend.config.graphs) == 1, "the graph was handed back uncompiled"
