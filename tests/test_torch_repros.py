"""Repros of what held-out architectures hit on the PyTorch path, each a few-line module
compiled through the real backend: every graph compiled (none in eager), no warning, eager's
outputs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_ort import _sessions  # noqa: E402

from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402

F = torch.nn.functional
pytestmark = pytest.mark.xdist_group("torch_repros")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compile_and_run(module, calls, *, atol=1e-5):
    """Compile ``module`` and call it with each argument tuple of ``calls``: every output
    equal to eager's, no ``AutofusionWarning``; returns the backend's graphs."""
    module.eval()
    backend = make_backend(check_speed=False)
    compiled = torch.compile(module, backend=backend)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for args in calls:
            want = module(*args)
            got = compiled(*args)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
                if w.dtype.is_floating_point:
                    torch.testing.assert_close(g, w, atol=atol, rtol=1e-4)
                else:
                    assert torch.equal(g, w), (g, w)
    ours = [str(w.message) for w in caught if issubclass(w.category, AutofusionWarning)]
    graphs = backend.config.graphs
    assert not ours, ours
    assert graphs and all(g.fallback is None for g in graphs), [g.fallback for g in graphs]
    return graphs


def _ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 100, (2, length), generator=torch.Generator().manual_seed(seed))


# ----- F1: a Python int Dynamo made symbolic that no tensor carries -----------------------------
class _OffsetText(torch.nn.Module):
    """Embedding + linear + softmax; positions start at ``total - len(ids)`` (a cache offset
    passed as a Python int): from the second length on, Dynamo passes ``total`` as its own
    symbolic-size input, carried by no tensor."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.pos = torch.nn.Embedding(64, 16)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, ids, total):
        positions = torch.arange(total - ids.shape[1], total)
        h = self.emb(ids) + self.pos(positions)
        return torch.softmax(self.lin(h) / total, -1)


class _ScaledText(torch.nn.Module):
    """The symbolic size is the ids' own length (a tensor carries it)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, ids):
        h = self.lin(self.emb(ids))
        return torch.softmax(h @ h.transpose(-1, -2) / ids.shape[-1], -1) @ h


def test_symbolic_int_input_carried_by_no_tensor_is_a_graph_input():
    torch.manual_seed(0)
    calls = [(_ids(n, n), n + 3) for n in (8, 12, 16, 5)]
    graphs = _compile_and_run(_OffsetText(), calls)
    assert len(graphs) == 2  # static, then one graph for every later length
    assert graphs[-1].calls == 3


def test_symbolic_size_carried_by_a_tensor_still_compiles():
    torch.manual_seed(0)
    graphs = _compile_and_run(_ScaledText(), [(_ids(n, n),) for n in (8, 12, 16)])
    assert len(graphs) == 2 and graphs[-1].calls == 2


# ----- F2: causal SDPA with a symbolic query length ---------------------------------------------
class _CausalAttention(torch.nn.Module):
    def __init__(self, heads: int = 2, dim: int = 16):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class _CausalCrossAttention(torch.nn.Module):
    """Queries shorter than the keys: torch's ``is_causal`` mask is top-left aligned."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_causal_sdpa_with_a_symbolic_length():
    torch.manual_seed(0)
    calls = [(torch.randn(1, n, 16),) for n in (6, 9, 13)]
    graphs = _compile_and_run(_CausalAttention(), calls)
    assert len(graphs) == 2 and graphs[-1].calls == 2


def test_causal_sdpa_with_more_keys_than_queries():
    torch.manual_seed(0)
    calls = [
        (torch.randn(1, 2, lq, 8), torch.randn(1, 2, lk, 8), torch.randn(1, 2, lk, 8))
        for lq, lk in ((3, 5), (4, 7), (6, 11))
    ]
    _compile_and_run(_CausalCrossAttention(), calls)


# ----- F3: a 0-d constant output ----------------------------------------------------------------
class _SlidingWindow(torch.nn.Module):
    """Returns its window as a 0-d int64 tensor, as Gemma2's attention does."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2.0, torch.tensor(16)


def test_zero_dim_constant_output_stays_zero_dim():
    torch.manual_seed(0)
    _compile_and_run(_SlidingWindow(), [(torch.randn(2, 8),), (torch.randn(2, 8),)])


class _ZeroDimOutputs(torch.nn.Module):
    def forward(self, x):
        return x.sum() * 2.0, x.amax(), (x > 0).sum()


def test_zero_dim_computed_outputs_stay_zero_dim():
    _compile_and_run(_ZeroDimOutputs(), [(torch.randn(3, 5),)])


# ----- F5: operators with a non-default overload ------------------------------------------------
class _FloorDiv(torch.nn.Module):
    """Mixtral's expert bookkeeping: an integer floor division (negatives round down)."""

    def forward(self, x, idx):
        q = torch.div(idx, 3, rounding_mode="floor")
        t = torch.div(idx, -4, rounding_mode="trunc")
        return x * q.float() + t.float(), q, t


def test_integer_floor_division():
    idx = torch.arange(-10, 10).reshape(4, 5)
    _compile_and_run(_FloorDiv(), [(torch.randn(4, 5), idx)])


class _Upsample(torch.nn.Module):
    """Segformer's decode head: a convolution, then a bilinear resize."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = F.interpolate(self.conv(x), size=(12, 10), mode="bilinear", align_corners=False)
        z = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=True)
        return torch.relu(y), z


def test_bilinear_interpolation():
    torch.manual_seed(0)
    _compile_and_run(_Upsample(), [(torch.randn(1, 4, 6, 5),)])


# ----- F4: a graph that returns a size besides its tensors --------------------------------------
class _ReturnsItsLength(torch.nn.Module):
    """Returns a tensor and a size computed from the input's (symbolic) length, as Gemma2's
    decode graphs return the cache length."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor):
        return torch.relu(self.lin(x)) * 2.0, x.shape[1] * 2 + 1


def test_a_graph_returning_a_size_runs_fused():
    m = _ReturnsItsLength().eval()
    backend = make_backend(check_speed=False)
    compiled = torch.compile(m, backend=backend)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in (4, 6, 9):  # the second length makes the size symbolic: a SymInt output
            x = torch.randn(1, n, 32, generator=torch.Generator().manual_seed(n))
            got, size = compiled(x)
            want, want_size = m(x)
            torch.testing.assert_close(got, want)
            assert size == want_size == 2 * n + 1
    assert not [w for w in caught if issubclass(w.category, AutofusionWarning)]
    graphs = backend.config.graphs
    assert all(g.fallback is None for g in graphs), [g.summary() for g in graphs]
    assert graphs[-1].calls == 2 and graphs[-1].engine in ("onnxruntime", "torch")
    assert graphs[-1].core_gm is not graphs[-1].gm  # the size was returned apart


# ----- F6: Dynamo's per-code-object recompile limit, shared by every module of a class ----------
def test_two_fused_decoders_of_one_class_beside_torch_compile_stay_compiled():
    transformers = pytest.importorskip("transformers")
    del transformers
    from torch._dynamo.utils import counters

    from graph_autofusion import GraphAutoFusion
    from graph_autofusion.testing.small_hf import tiny_llama

    # 4 tokens: a prefill, the first decode step (static) and two steps of the dynamic decode
    # graph per prompt; the second prompt length recompiles the prefill dynamic. Dynamo's cache
    # of the class's forward gets the same 9 graphs as with more tokens. Not about speed: no
    # engine timing (check_speed=False).
    gen = dict(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    prompts = (5, 9)
    a, b = tiny_llama(2, seed=0), tiny_llama(2, seed=1)
    counters.clear()
    with torch.no_grad():  # the user's own compile of the same class first
        torch.compile(a, backend="autofusion")(torch.randint(0, 1000, (1, 16)))
    fused = [(GraphAutoFusion(m).fuse(check_speed=False), m) for m in (a, b)]
    with torch.no_grad():
        for f, m in fused:
            for n in prompts:
                ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
                assert torch.equal(f.generate(ids, **gen), m.generate(ids, **gen))
    # no frame gave up (the recompile limit sends a frame to eager without a graph)
    assert counters["frames"]["total"] == counters["frames"]["ok"], dict(counters["frames"])
    calls = 1 + len(prompts) * gen["max_new_tokens"]  # the example call, one per generated token
    for f, _m in fused:  # all through our graphs
        graphs = f.autofusion.graphs
        assert sum(g.calls for g in graphs) == calls, [g.summary() for g in graphs]
        assert all(g.fallback is None for g in graphs)


# ----- F7: fp16 weights read in place by onnxruntime --------------------------------------------
class _HalfHead(torch.nn.Module):
    """An fp16 norm and a 128 KB fp16 linear head (large enough to be read in place)."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.head = torch.nn.Linear(64, 1000, bias=False)

    def forward(self, x):
        return self.head(self.norm(x) * 2.0)


def test_fp16_weights_in_the_onnxruntime_session_are_the_model_s():
    """onnxruntime's ``all`` optimizations read an fp16 MatMul's initializer from the model's
    bytes, not from the value added in place (the placeholder's zeros: cosine 0 with eager)."""
    torch.manual_seed(0)
    m = _HalfHead().half()
    graphs = _compile_and_run(m, [(torch.randn(1, 12, 64).half(),)], atol=2e-2)
    assert [g.engine for g in graphs] == ["onnxruntime"], [g.summary() for g in graphs]


# ----- F8: index.Tensor with several index tensors of symbolic size -----------------------------
class _PaddingMaskLookup(torch.nn.Module):
    """transformers' mask construction: the padding mask read at ``[batch, kv positions]``
    with index tensors of symbolic length (GPT-2's graph after the first length)."""

    def forward(self, x, mask):
        n = x.shape[1]
        b = torch.arange(mask.shape[0]).view(-1, 1, 1, 1)
        kv = torch.arange(n).view(1, 1, 1, -1)
        keep = mask.bool()[b, kv]  # (B, 1, 1, n)
        scores = (x @ x.transpose(-1, -2)).unsqueeze(1)
        return torch.softmax(scores.masked_fill(~keep, -1e4), -1), x[b[:, 0], kv[:, 0]]


def test_index_with_several_symbolic_index_tensors_runs_on_onnxruntime():
    torch.manual_seed(0)
    calls = []
    for n in (5, 8, 11):
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, -2:] = 0
        calls.append((torch.randn(2, n, 8), mask))
    graphs = _compile_and_run(_PaddingMaskLookup(), calls)
    assert len(graphs) == 2 and graphs[-1].calls == 2
    assert [g.engine for g in graphs] == ["onnxruntime"] * 2, [g.summary() for g in graphs]


# ----- F9: a sliding-window cache's sizes: sym_max, sym_sum, a size Dynamo specialized -----------
class _SlidingPositions(torch.nn.Module):
    """Positions start at ``max(total - window, 0)`` and end at a sum of three sizes
    (``torch.sym_max`` and ``torch.sym_sum`` once the ints are symbolic), and a branch on
    ``total == 9`` makes Dynamo specialize the symbolic ``total`` of that call's graph to 9
    while still passing it as a graph input (Gemma2's and Mistral's sliding-window
    ``cumulative_length`` in ``generate()``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.pos = torch.nn.Embedding(64, 8)

    def forward(self, x, total: int, extra: int):
        start = max(total - 6, 0)
        end = sum([start, x.shape[1], extra])
        y = self.lin(x) + self.pos(torch.arange(start + extra, end))
        if total == 9:
            y = y * 2
        return torch.relu(y) * total


def test_sliding_window_sizes_compile():
    torch.manual_seed(0)
    calls = [
        (torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(t)), t, t // 4)
        for t in (4, 9, 11, 12)
    ]
    graphs = _compile_and_run(_SlidingPositions(), calls)
    assert len(graphs) == 3 and graphs[-1].calls == 2  # static, total fixed to 9, symbolic
    assert "sym_sum" in graphs[-1].gm.code and "sym_max" in graphs[-1].gm.code


# ----- F10: functionalized slice assignment (slice_scatter, copy) -------------------------------
class _ShiftRight(torch.nn.Module):
    """BART's ``shift_tokens_right``: ids written one place to the right into a new tensor,
    a start token at 0 (``slice_scatter`` and ``copy`` once functionalized)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 8)

    def forward(self, ids):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 2
        middle = torch.zeros(ids.shape[0], ids.shape[1], 8)
        middle[:, 1:-1] = self.emb(ids)[:, 1:-1]
        return self.emb(shifted) + middle, shifted


def test_slice_assignment_into_a_new_tensor():
    calls = [(_ids(n, n),) for n in (6, 9, 13)]
    graphs = _compile_and_run(_ShiftRight(), calls)
    assert len(graphs) == 2 and graphs[-1].calls == 2
    assert [g.engine for g in graphs] == ["onnxruntime"] * 2, [g.summary() for g in graphs]


# ----- F11: nearest interpolation ---------------------------------------------------------------
class _NearestUp(torch.nn.Module):
    """A UNet decoder's nearest upsampling, by size and by scale."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x, skip):
        y = F.interpolate(self.conv(x), size=skip.shape[-2:], mode="nearest")
        z = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return torch.relu(y + skip), z * 2.0


def test_nearest_interpolation():
    torch.manual_seed(0)
    graphs = _compile_and_run(_NearestUp(), [(torch.randn(1, 4, 5, 6), torch.randn(1, 4, 11, 13))])
    assert [g.engine for g in graphs] == ["onnxruntime"], [g.summary() for g in graphs]


# ----- F12: a pointwise convolution's weight read in place by onnxruntime -----------------------
class _Pointwise(torch.nn.Module):
    """MobileNet's expansion: a 1x1 convolution with a 96 KB weight (read in place), then
    BatchNorm (folded into it) and ReLU6. onnxruntime's ``all`` level transforms a 1x1 Conv's
    weight while it creates the session, from the model's bytes: before the placeholder held
    the real bytes, that gave zeros (MobileNetV2 and ViT's onnxruntime engines, cosine 0)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(96, 256, 1)
        self.bn = torch.nn.BatchNorm2d(256)

    def forward(self, x):
        return F.relu6(self.bn(self.conv(x)))


def test_pointwise_convolution_weights_in_the_onnxruntime_session_are_the_model_s():
    torch.manual_seed(0)
    m = _Pointwise()
    m.bn.running_mean.uniform_(-0.5, 0.5)
    m.bn.running_var.uniform_(0.5, 2.0)
    graphs = _compile_and_run(m, [(torch.randn(1, 96, 8, 8),)])
    assert [g.engine for g in graphs] == ["onnxruntime"], [g.summary() for g in graphs]


# ----- F13: routed experts (mixture of experts): sort, histc, grouped matrix products ----------
class _RoutedExperts(torch.nn.Module):
    """Hugging Face's ``grouped_mm`` experts in a few lines: the top-2 experts of each token
    sorted by expert (``sort``), counted (``histc``, float on CPU), their rows multiplied by
    each expert's weight (``transformers::grouped_mm_fallback``, one weight handed over
    transposed as the experts do), back in token order (``empty_like`` + ``index_put``
    once the length is symbolic). Every MoE family of ``transformers`` runs this."""

    def __init__(self, experts: int = 4, dim: int = 64, inner: int = 256):
        super().__init__()
        self.experts = experts
        self.router = torch.nn.Linear(dim, experts, bias=False)
        # each expert's matrix 64 KB: large enough to be read in place
        self.up = torch.nn.Parameter(torch.randn(experts, dim, inner) * 0.1)  # [E, K, N]
        self.down = torch.nn.Parameter(torch.randn(experts, dim, inner) * 0.1)  # [E, N, K]

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        weights, ids = torch.topk(torch.softmax(self.router(h), -1), 2, -1)
        ids_g, perm = torch.sort(ids.reshape(-1))
        rows = h[perm // 2]
        counts = torch.histc(ids_g.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        grouped = torch.ops.transformers.grouped_mm_fallback
        y = grouped(torch.relu(grouped(rows, self.up, offs)), self.down.transpose(-2, -1), offs)
        y = y * weights.reshape(-1)[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.shape[0])
        return y[inv].view(-1, 2, x.shape[-1]).sum(1).view(x.shape)


def test_routed_experts_run_on_onnxruntime_with_the_weights_in_place():
    pytest.importorskip("transformers.integrations.moe")  # registers grouped_mm_fallback
    torch.manual_seed(0)
    m = _RoutedExperts()
    calls = [(torch.randn(1, n, 64),) for n in (9, 6, 13)]
    graphs = _compile_and_run(m, calls)
    assert len(graphs) == 2 and graphs[-1].calls == 2  # one dynamic graph for later lengths
    assert [g.engine for g in graphs] == ["onnxruntime"] * 2, [g.summary() for g in graphs]
    # each expert's weight is a view of its parameter (the transposed one too), not a copy
    for ort in _sessions(graphs):
        arrays = list(ort.session._autofusion_in_place[1].values())
        for p in (m.up, m.down):
            held = [a for a in arrays if np.shares_memory(a, p.detach().numpy())]
            assert len(held) == 4, (p.shape, [a.shape for a in arrays])


def test_histc_bins_match_torch_at_the_bin_edges():
    """Values on and next to every bin edge, outside the range and at its ends."""

    class Hist(torch.nn.Module):
        def forward(self, x):
            return torch.histc(x, bins=7, min=-1.5, max=2.0), torch.histc(x * 3, 5, 0, 1)

    edges = torch.linspace(-1.5, 2.0, 8)
    x = torch.cat([edges, edges + 1e-7, edges - 1e-7, torch.tensor([-9.0, 9.0, 0.3])])
    _compile_and_run(Hist(), [(x[torch.randperm(x.numel())],)], atol=0)


# ----- F14: PhiMoE's router: tensor clamp bounds, a scalar scatter of symbolic size -------------
class _SparseMixerBits(torch.nn.Module):
    """``clamp`` with tensor bounds that are not 0-d (ONNX Clip takes scalars only), a
    scatter of a scalar into a mask whose index has a symbolic length, and ``new_zeros``
    of a symbolic size."""

    def __init__(self):
        super().__init__()
        self.register_buffer("lo", torch.tensor([-0.5]))
        self.register_buffer("hi", torch.tensor([0.3, 0.6, 0.9, 1.2]))

    def forward(self, x):
        c = torch.clamp(x, min=self.lo, max=self.hi)
        idx = x.argmax(-1, keepdim=True)
        mask = torch.zeros_like(x).scatter(-1, idx, 1.0)
        pad = x.new_zeros(x.shape[0], x.shape[1], 2)
        return torch.cat([c * mask, pad], -1)


def test_tensor_clamp_bounds_and_a_symbolic_scalar_scatter():
    torch.manual_seed(0)
    calls = [(torch.randn(2, n, 4),) for n in (5, 8, 11)]
    graphs = _compile_and_run(_SparseMixerBits(), calls)
    assert len(graphs) == 2 and graphs[-1].calls == 2
    assert [g.engine for g in graphs] == ["onnxruntime"] * 2, [g.summary() for g in graphs]


# ----- F15: a float attribute Dynamo made symbolic (two instances, two epsilons) ----------------
class _EpsNorm(torch.nn.Module):
    """RMSNorm with its epsilon a Python float: a second instance with another epsilon makes
    Dynamo pass the float as a 0-d tensor read by ``item()`` (and Python arithmetic on it),
    as two decoders with different ``rms_norm_eps`` compiled in one process do."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
        self.w = torch.nn.Parameter(torch.randn(16))
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.lin(x * torch.rsqrt(v + self.eps) * self.w) / (1.0 + self.eps * 1000)


def test_a_symbolic_float_attribute_runs_on_onnxruntime_in_double():
    torch.manual_seed(0)
    backend = make_backend(check_speed=False)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for eps in (1e-5, 1e-6, 1e-3):  # the last: (1 + eps * 1000) = 2, not 1 as an int
            m = _EpsNorm(eps).eval()
            x = torch.randn(2, 5, 16)
            torch.testing.assert_close(torch.compile(m, backend=backend)(x), m(x))
    assert not [w for w in caught if issubclass(w.category, AutofusionWarning)]
    graphs = backend.config.graphs
    assert [g.engine for g in graphs] == ["onnxruntime"] * 2, [g.summary() for g in graphs]
    assert graphs[-1].calls == 2  # the symbolic float serves both later epsilons


# ----- F16: Mamba's softplus (log1p) and a negated symbolic size -------------------------------
class _ConvStateWindow(torch.nn.Module):
    """The last ``n`` positions of a rolling state (``-x.shape[1]``: ``operator.neg`` on a
    symbolic size) and ``log1p(exp(x))`` (ONNX has no Log1p), tiny inputs included."""

    def forward(self, x, state):
        window = torch.cat([state, x], 1)[:, -x.shape[1] :]
        return window * torch.log1p(torch.exp(x)), torch.log1p(x * 1e-6)


def test_log1p_and_a_negated_symbolic_size():
    torch.manual_seed(0)
    calls = [(torch.randn(1, n, 8), torch.randn(1, 4, 8)) for n in (5, 8, 11)]
    # log(1 + x) in float32 would be 6% off at x ~ 1e-6: rtol 1e-4 with no absolute slack
    graphs = _compile_and_run(_ConvStateWindow(), calls, atol=1e-12)
    assert len(graphs) == 2 and graphs[-1].calls == 2
    assert [g.engine for g in graphs] == ["onnxruntime"] * 2, [g.summary() for g in graphs]


def test_stable_sorts_with_ties_give_torch_s_indices():
    """``sort(stable=True)`` ascending and descending over an axis full of ties: ONNX's TopK
    (ties by the lower index) gives torch's indices exactly, on both engines."""

    class Sorts(torch.nn.Module):
        def forward(self, x):
            v0, i0 = torch.sort(x, dim=0, stable=True)
            v1, i1 = torch.sort(x, dim=-1, descending=True, stable=True)
            return v0 + 1, i0, v1 * 2, i1

    x = torch.randint(0, 3, (6, 9)).float()
    _compile_and_run(Sorts(), [(x,)], atol=0)


# ----- F17: a symbolic float an operator needs as a number (two attention scalings) ------------
class _ScaledAttention(torch.nn.Module):
    """``sdpa(scale=self.scaling)``: a second instance with another head size makes Dynamo
    pass ``scaling`` as a 0-d tensor read by ``item()``, and the re-export cannot guard on
    the unbacked float (three decoders of different head sizes in one process)."""

    def __init__(self, head: int):
        super().__init__()
        self.head = head
        self.scaling = head**-0.5
        self.qkv = torch.nn.Linear(16, 3 * 16)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, -1, self.head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        return y.transpose(1, 2).reshape(b, n, 16)


def test_a_symbolic_float_an_operator_needs_as_a_number_is_this_call_s_value():
    torch.manual_seed(0)
    backend = make_backend(check_speed=False)
    models = [_ScaledAttention(h).eval() for h in (8, 4, 2)]
    compiled = [torch.compile(m, backend=backend) for m in models]
    x = torch.randn(1, 6, 16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(2):  # alternating: each call runs the program of its own scaling
            for m, c in zip(models, compiled):
                torch.testing.assert_close(c(x), m(x))
    assert not [w for w in caught if issubclass(w.category, AutofusionWarning)]
    graphs = backend.config.graphs
    assert all(g.engine == "onnxruntime" and g.fallback is None for g in graphs), [
        g.summary() for g in graphs
    ]
    # the later two scalings were taken as numbers, one program each, checked on every call
    taken = sorted(v for g in graphs for p in g._programs for _i, v in p.scalars)
    assert taken == pytest.approx([4**-0.5, 2**-0.5]), taken


# ----- group normalization (wav2vec2's feature extractor, diffusion U-Nets) ---------------------
class _GroupNorms(torch.nn.Module):
    """A convolution, then group norms with and without their affine weights (1-d and 2-d)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 16, 3, padding=1)
        self.gn = torch.nn.GroupNorm(4, 16)
        self.plain = torch.nn.GroupNorm(16, 16, affine=False)
        self.gn2d = torch.nn.GroupNorm(2, 4, eps=1e-3)

    def forward(self, x: torch.Tensor, img: torch.Tensor):
        return F.gelu(self.plain(self.gn(self.conv(x)))), self.gn2d(img) * 2.0


def test_group_norm_runs_on_onnxruntime_at_every_length():
    """``native_group_norm`` had no ONNX form: the graph ran in eager, not in onnxruntime."""
    gen = torch.Generator().manual_seed(0)
    calls = [
        (torch.randn(2, 8, n, generator=gen), torch.randn(1, 4, 5, n, generator=gen))
        for n in (8, 13, 21)
    ]
    graphs = _compile_and_run(_GroupNorms(), calls)
    assert all(g.engine == "onnxruntime" for g in graphs), [g.summary() for g in graphs]
    ops = {n.op_type for g in graphs for n in g.ort_result.model.graph.nodes}
    assert "InstanceNormalization" in ops and not any(
        n.domain == "aten" for g in graphs for n in g.imported.graph.nodes
    )


class _Norms(torch.nn.Module):
    """ConvNeXtV2's global response norm (``torch.norm`` over two dims) and Swinv2's cosine
    attention (``F.normalize``), plus the other orders of ``torch.linalg.vector_norm``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor):
        h = self.lin(x)
        grn = h * (torch.norm(h, p=2, dim=(1, 2), keepdim=True) + 1.0)
        q, k = torch.nn.functional.normalize(h, dim=-1), torch.nn.functional.normalize(x, dim=-1)
        cos = q @ k.transpose(-1, -2)
        vn = torch.linalg.vector_norm
        others = torch.stack([vn(h, o, dim=-1) for o in (1, 3, float("inf"), float("-inf"), 0)])
        return grn, cos, others, vn(h), vn(h, keepdim=True)


def test_vector_norms_run_on_onnxruntime():
    """``linalg_vector_norm`` had no ONNX form: ConvNeXtV2 and Swinv2 graphs ran in eager."""
    gen = torch.Generator().manual_seed(0)
    calls = [(torch.randn(2, n, 16, generator=gen).round(decimals=1),) for n in (6, 9, 13)]
    graphs = _compile_and_run(_Norms(), calls)
    assert all(g.engine == "onnxruntime" for g in graphs), [g.summary() for g in graphs]
    ops = {n.op_type for g in graphs for n in g.imported.graph.nodes}
    assert {"ReduceL2", "ReduceL1"} <= ops and not any(
        n.domain == "aten" for g in graphs for n in g.imported.graph.nodes
    )


# ----- torch's fused transformer fast paths (nn.TransformerEncoder, nn.MultiheadAttention) ------
class _Encoder(torch.nn.Module):
    """``nn.TransformerEncoder`` in eval mode: each layer one ``_transformer_encoder_layer_fwd``."""

    def __init__(self, norm_first: bool, activation: str) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
        )
        # nested tensors off: with them eager zeroes the padded positions, a path Dynamo's
        # graph (torch.compile's own eager backend too) does not take
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, pad: torch.Tensor):
        return self.enc(x, src_key_padding_mask=pad), self.enc(x)


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_fast_path_runs_on_onnxruntime(norm_first, activation):
    """``aten::_transformer_encoder_layer_fwd`` had no ONNX form: the graph ran in eager."""
    gen = torch.Generator().manual_seed(0)
    calls = []
    for n in (5, 8, 11):
        pad = torch.zeros(2, n, dtype=torch.bool)
        pad[1, n - 2 :] = True  # the second sequence's last two positions are padding
        calls.append((torch.randn(2, n, 16, generator=gen), pad))
    torch.manual_seed(0)
    graphs = _compile_and_run(_Encoder(norm_first, activation), calls)
    assert all(g.engine == "onnxruntime" for g in graphs), [g.summary() for g in graphs]
    assert not any(n.domain == "aten" for g in graphs for n in g.imported.graph.nodes)


class _Attention(torch.nn.Module):
    """``nn.MultiheadAttention`` in eval mode: self-attention with a key-padding mask (one
    row for every query: the fused Attention must expand it) and cross-attention."""

    def __init__(self) -> None:
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor, pad: torch.Tensor):
        own = self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return own, self.mha(x, y, y, need_weights=False)[0]


def test_multi_head_attention_with_a_key_padding_mask_runs_on_onnxruntime():
    gen = torch.Generator().manual_seed(0)
    calls = []
    for n in (5, 9):
        pad = torch.zeros(2, n, dtype=torch.bool)
        pad[0, n - 2 :] = True
        calls.append(
            (torch.randn(2, n, 16, generator=gen), torch.randn(2, n + 3, 16, generator=gen), pad)
        )
    torch.manual_seed(0)
    graphs = _compile_and_run(_Attention(), calls)
    assert all(g.engine == "onnxruntime" for g in graphs), [g.summary() for g in graphs]
    assert not any(n.domain == "aten" for g in graphs for n in g.imported.graph.nodes)


# ----- a bfloat16 weight folded once, read again by the dynamic-length graph --------------------
class _Bf16Rope(torch.nn.Module):
    """A bfloat16 linear times a rotary table from a bfloat16 buffer read in float32."""

    def __init__(self) -> None:
        super().__init__()
        inv = 1.0 / 10000 ** (torch.arange(0, 16, 2) / 16)
        self.register_buffer("inv", inv.to(torch.bfloat16), persistent=False)
        self.lin = torch.nn.Linear(16, 16).to(torch.bfloat16)

    def forward(self, x: torch.Tensor, pos: torch.Tensor):
        f = self.inv.float()[None, :, None] @ pos.float()[:, None, :]
        e = torch.cat([f, f], 1).transpose(1, 2)
        return self.lin(x) * e.cos().to(x.dtype)


def test_a_bfloat16_weight_reused_by_the_dynamic_graph_keeps_its_dtype():
    """The second compile (symbolic length) reused the weight's folded transpose from the
    first import as float32 (the IR holds bfloat16 as float32 arrays): MatMul(bf16, float)
    failed in the torch program and the graph ran in eager. (onnxruntime refuses bfloat16,
    with its one warning: the torch program runs every graph.)"""
    module = _Bf16Rope().eval()
    backend = make_backend(check_speed=False)
    compiled = torch.compile(module, backend=backend)
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in (8, 13, 21):
            x = torch.randn(1, n, 16, generator=gen).to(torch.bfloat16)
            pos = torch.arange(n)[None]
            torch.testing.assert_close(compiled(x, pos), module(x, pos), atol=2e-2, rtol=1e-2)
    ours = [str(w.message) for w in caught if issubclass(w.category, AutofusionWarning)]
    assert not [w for w in ours if "bfloat16 values" not in w], ours
    graphs = backend.config.graphs
    assert len(graphs) == 2 and all(g.engine == "torch" for g in graphs), [
        g.summary() for g in graphs
    ]


class _Rescaled(torch.nn.Module):
    """A buffer the module assigns anew between calls (Hugging Face's dynamic rotary scaling
    recomputes ``inv_freq`` past the trained length)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("freq", torch.ones(8), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(self.lin(x) * self.freq)


def test_a_buffer_assigned_anew_between_calls_is_read_as_an_input():
    """Each new ``freq`` tensor was a new weight set: compiled again, and after four the graph
    ran in eager. Now the buffer becomes an input of one program that serves every value."""
    module = _Rescaled().eval()
    backend = make_backend(check_speed=False)
    compiled = torch.compile(module, backend=backend)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for step in range(7):
            module.freq = torch.full((8,), 1.0 + step / 4)
            torch.testing.assert_close(compiled(x), module(x), atol=1e-5, rtol=1e-4)
    assert not [w for w in caught if issubclass(w.category, AutofusionWarning)]
    (graph,) = backend.config.graphs
    assert graph.fallback is None and len(graph._programs) == 1
    assert graph.engine == "onnxruntime"


def test_a_graph_with_no_operator_runs_as_it_is():
    """A Dynamo graph that computes nothing (it returns an input, or nothing) is run as
    Dynamo captured it, with no warning: onnxruntime cannot open a session without a node,
    and the graph fell back to eager with a warning about it."""
    backend = make_backend(check_speed=False)
    gm = torch.fx.symbolic_trace(lambda x: x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = backend(gm, [torch.ones(2)])
        assert torch.equal(run(torch.ones(2)), torch.ones(2))
    assert not backend.config.graphs and not caught


# ----- B5b: a mask made before a graph break, one longer than the cache ------------------------
class _MaskThenBreak(torch.nn.Module):
    """Makes a mask as long as the cache plus one, breaks the graph (Hugging Face's dynamic
    rotary update does), then appends a key and value to the cache and attends with that
    mask: the second graph's mask size is ``s + 1`` of the cache's ``s``."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x, keys, values):
        length = keys.shape[2] + 1
        mask = torch.ones(1, 1, 1, length, dtype=torch.bool).tril(length - 1)
        torch._dynamo.graph_break()
        q, k, v = self.qkv(x).unsqueeze(1).split(8, dim=-1)
        keys = torch.cat([keys, k], dim=2)
        values = torch.cat([values, v], dim=2)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask), keys


def test_a_mask_longer_than_the_cache_keeps_the_cache_length_symbolic():
    """The mask's size, ``s + 1``, was exported as a fixed number, which fixed the cache's
    length ``s``: one program per decode step, and after four the graph ran in eager."""
    g = torch.Generator().manual_seed(0)
    calls = [
        (
            torch.randn(1, 1, 8, generator=g),
            torch.randn(1, 1, n, 8, generator=g),
            torch.randn(1, 1, n, 8, generator=g),
        )
        for n in range(3, 10)
    ]
    graphs = _compile_and_run(_MaskThenBreak(), calls)
    attends = [g for g in graphs if "scaled_dot_product_attention" in g.gm.code]
    assert attends and all(len(g._programs) == 1 for g in attends), [
        (len(g._programs), g.calls) for g in attends
    ]
    assert attends[-1].calls == len(calls) - 1  # the symbolic graph served every later step


def test_a_derived_size_the_export_refuses_is_fixed_as_before(monkeypatch):
    """Should the export fail with a derived size kept symbolic, the graph is exported with
    that size fixed (one program per value, as before), not sent to eager."""
    from graph_autofusion.frontend import torch_frontend

    real_export, failed = torch_frontend._export, []

    def export(wrapper, args, dynamic):
        derived = any(
            isinstance(h, dict) and isinstance(a, torch.Tensor) and a.dim() == 4 and 3 in h
            for h, a in zip(dynamic, args)
        )
        if derived and not failed:
            failed.append(True)
            raise RuntimeError("injected: the export cannot relate this size")
        return real_export(wrapper, args, dynamic)

    monkeypatch.setattr(torch_frontend, "_export", export)
    g = torch.Generator().manual_seed(0)
    calls = [
        (
            torch.randn(1, 1, 8, generator=g),
            torch.randn(1, 1, n, 8, generator=g),
            torch.randn(1, 1, n, 8, generator=g),
        )
        for n in (3, 4, 5)
    ]
    graphs = _compile_and_run(_MaskThenBreak(), calls)
    attends = [g for g in graphs if "scaled_dot_product_attention" in g.gm.code]
    assert failed and len(attends[-1]._programs) == 2  # lengths 4 and 5, each fixed


# ----- held-out sweep 3, B1: Python's floor division of a size --------------------------------
class _NegativeQuotient(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        k = (x.shape[1] - 20) // 3  # Python floors: (13 - 20) // 3 == -3
        return F.gelu(self.lin(x)) + k


def test_floor_division_of_a_size_floors_negative_quotients():
    """``//`` of a symbolic size was imported as ONNX's integer ``Div``, which truncates: a
    graph verified where the quotient was not negative added -2 where eager adds -3."""
    g = torch.Generator().manual_seed(0)
    calls = [(torch.randn(2, n, 16, generator=g),) for n in (8, 23, 26, 13, 5)]
    graphs = _compile_and_run(_NegativeQuotient(), calls)
    assert graphs[-1].calls == len(calls) - 1  # one symbolic graph served the later lengths


# ----- held-out sweep 3, B2: Python's number functions on sizes -------------------------------
class _SizeFunctions(torch.nn.Module):
    """TF-style "SAME" padding takes ``math.ceil`` of a size over the stride; ``floor``,
    ``round`` (half to even), ``int()`` of a float and ``**`` are its relatives."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = x.shape[1]
        y = self.lin(x)
        return (
            y + math.ceil(h / 3),
            y + math.floor(h / 3),
            y + round(h / 4),
            y + int(h * 0.5),
            y + (h - 9) ** 2,
        )


def test_number_functions_of_a_size_run_fused():
    """``math.ceil`` and the others had no converter: the dynamic graph ran in eager (BiT,
    EfficientNet-style padding at a second image size). Lengths 10, 14 and 6 put ``h / 4``
    on a half, where ``round`` goes to the even neighbour."""
    g = torch.Generator().manual_seed(0)
    calls = [(torch.randn(2, n, 16, generator=g),) for n in (8, 10, 14, 6, 13)]
    graphs = _compile_and_run(_SizeFunctions(), calls)
    assert graphs[-1].calls == len(calls) - 1 and graphs[-1].engine == "onnxruntime"


def test_a_float_the_export_cannot_trace_compiles_without_printing_the_failed_trace(capfd):
    """``dynamic=True`` hands a module's float attributes over as 0-d tensors read with
    ``item()``; one an operator needs as a number (the embedding's ``norm_type``) fails the
    first re-export on a data-dependent guard, and the import retries with the number. The
    failed attempt's partial graph (``torch.export`` prints hundreds of lines of it to stderr)
    and torch's unbacked-symbol warning must not reach the user's console; nor torch's own
    pytree deprecation warning from ``torch.export``'s internal copy."""
    from graph_autofusion.testing.small_hf import tiny_llama

    model = tiny_llama()
    backend = make_backend(check_speed=False)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    capfd.readouterr()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (5, 9):
            ids = torch.randint(0, 1000, (1, n))
            assert torch.allclose(compiled(ids).logits, model(ids).logits, atol=1e-5)
    err = capfd.readouterr().err
    assert "def forward(" not in err and "Unable to find user code" not in err, err[:2000]

    # torch.export's pytree FutureWarning: hidden when reported from copyreg (torch's own
    # copy), shown from anywhere else (pytest resets the filters between tests, so the one
    # installed at import is installed again here, ahead of "always")
    from graph_autofusion.frontend.torch_frontend import hide_torch_export_noise

    leaf = "`isinstance(treespec, LeafSpec)` is deprecated, use ... instead."
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        hide_torch_export_noise()
        warnings.warn_explicit(leaf, FutureWarning, "copyreg.py", 105, module="copyreg")
        warnings.warn_explicit(leaf, FutureWarning, "user.py", 1, module="user")
    assert [w.filename for w in rec] == ["user.py"]
    (graph,) = backend.config.graphs
    assert graph.engine == "onnxruntime" and graph.fallback is None, graph.summary()
    assert graph._programs[0].scalars  # the retry with the float taken as a number ran
