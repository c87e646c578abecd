"""Repros of size checks, empty tensors and bfloat16 casts that sent held-out graphs off
onnxruntime (Longformer: torch.export's run-time size checks, ``s0 >= 2``, had no converter; a
graph over its empty global-attention tensors divided by zero in the tiling search), and
Longformer itself, whose graphs now all run on onnxruntime."""

from __future__ import annotations

import logging
import warnings

import pytest

torch = pytest.importorskip("torch")

from test_torch_repros import _compile_and_run  # noqa: E402

from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402

pytestmark = pytest.mark.xdist_group("torch_repros")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class SizeChecked(torch.nn.Module):
    def forward(self, x):
        n = x.shape[1]
        torch._check(n >= 2)  # the export keeps it as _assert_scalar(ge(s0, 2))
        return x[:, : n // 2] * 2 + x[:, n - n // 2 :]


def test_a_checked_size_compiles_on_onnxruntime_at_every_length():
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(SizeChecked(), backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (6, 10, 15):
            x = torch.randn(2, n)
            with torch.no_grad():
                torch.testing.assert_close(c(x), SizeChecked()(x))
    assert [g.engine for g in backend.config.graphs] == ["onnxruntime"]


class SizeBits(torch.nn.Module):
    def forward(self, x):  # n & 1 and n | 4 are bitwise (torch traces them as operator.and_)
        n = x.shape[0]
        return x * 2 + (n & 1) + (n | 4)


def test_bitwise_operators_of_sizes_stay_bitwise():
    """They were converted as logical And / Or: n & 1 was 1 for every n > 0, a wrong answer
    at even lengths once the graph was compiled at an odd one."""
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(SizeBits(), backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (7, 8, 9, 10):
            x = torch.randn(n, 3)
            with torch.no_grad():
                torch.testing.assert_close(c(x), SizeBits()(x))
    assert [g.engine for g in backend.config.graphs] == ["onnxruntime"]


class EmptyBranch(torch.nn.Module):
    def forward(self, x, g):
        e = torch.nn.functional.gelu(g * 2 + 1).relu() - 3  # a fusable chain over [0, 8]
        return x * 2 + e.sum()


def test_a_fusable_chain_over_an_empty_tensor_compiles():
    graphs = _compile_and_run(EmptyBranch(), [(torch.randn(4, 8), torch.randn(0, 8))])
    assert all(g.engine for g in graphs)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_longformer_runs_every_graph_on_onnxruntime_quietly():
    """Every graph on onnxruntime, and the symbolic shape inference's "unsupported
    broadcast" warnings (printed on stderr where logging is not configured) kept in."""
    tr = pytest.importorskip("transformers")
    shape_log = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    seen = _Records()
    shape_log.addHandler(seen)
    torch.manual_seed(0)
    cfg = tr.LongformerConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=128,
        attention_window=[8],
        vocab_size=100,
        max_position_embeddings=80,
    )
    m = tr.LongformerModel(cfg).eval()
    ids = torch.randint(0, 100, (1, 32), generator=torch.Generator().manual_seed(0))
    glob = torch.zeros(1, 32, dtype=torch.long)
    glob[:, 0] = 1
    backend = make_backend(engine="onnxruntime", check_speed=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", AutofusionWarning)
            with torch.no_grad():
                got = torch.compile(m, backend=backend)(input_ids=ids, global_attention_mask=glob)
                want = m(input_ids=ids, global_attention_mask=glob)
    finally:
        shape_log.removeHandler(seen)
    assert not [r.getMessage() for r in seen.records if r.levelno >= logging.WARNING]
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=1e-4)
    engines = [g.engine for g in backend.config.graphs]
    assert len(engines) > 1 and set(engines) == {"onnxruntime"}, engines


class SizeFilled(torch.nn.Module):
    def forward(self, x):
        n = x.shape[1]
        idx = torch.zeros(n, n, dtype=torch.long)
        idx[0, :] = n - 3  # a size written into a tensor: aten.scalar_tensor(s0 - 3) (BEiT)
        return x + idx + torch.full((n,), n - 1, dtype=torch.float32) + torch.full_like(x, n)


def test_a_size_used_as_a_fill_value_compiles_on_onnxruntime_at_every_length():
    backend = make_backend(engine="onnxruntime", check_speed=False)
    m = SizeFilled()
    c = torch.compile(m, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (8, 13, 21):
            x = torch.randn(2, n, n)
            with torch.no_grad():
                torch.testing.assert_close(c(x), m(x))
    assert [g.engine for g in backend.config.graphs] == ["onnxruntime"]


class ThroughBfloat16(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):  # a float32 graph rounding one value through bfloat16
        h = self.lin(x).bfloat16().float()
        return torch.nn.functional.gelu(h * 2 + 1) + x


def test_a_bfloat16_intermediate_in_a_float32_graph_runs_on_onnxruntime():
    """Safe mode's capture of every intermediate asked numpy for a bfloat16 array
    ("No corresponding Numpy type"), and the graph went to the torch engine."""
    backend = make_backend(engine="onnxruntime", check_speed=False)
    m = ThroughBfloat16().eval()
    x = torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(m, backend=backend)(x), m(x))
    assert [g.engine for g in backend.config.graphs] == ["onnxruntime"]


class KeyPadded(torch.nn.Module):
    def forward(self, q, k, v, keep):  # keep: bool [B, T], True attends
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=keep[:, None, None, :]
        )


def _key_padded(t):
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(2, 4, t, 16, generator=g) for _ in range(3))
    keep = torch.ones(2, t, dtype=torch.bool)
    keep[1, -3:] = False
    return q, k, v, keep


def test_a_boolean_key_padding_mask_keeps_attention_fused_at_a_symbolic_length():
    """The boolean mask's ``Where`` (frontend ``_sdpa``) had no shape once the length was
    symbolic, so the attention lowering could not give the ``[B, 1, 1, T]`` mask a row per
    query; onnxruntime refused the ``Attention`` node and safe mode rolled it back (``error``)
    on every graph after Dynamo's switch to dynamic sizes."""
    from graph_autofusion.runtime.timing import use_timer

    def fused_is_faster(key, side, fn):  # keep the fusions (the dynamic graph's is a close call)
        fn()
        return 5e-6 if side == "fused" else 10e-6

    backend = make_backend(engine="onnxruntime")
    m = KeyPadded().eval()
    c = torch.compile(m, backend=backend)
    with torch.no_grad(), use_timer(fused_is_faster):
        for t in (12, 20, 7):
            args = _key_padded(t)
            torch.testing.assert_close(c(*args), m(*args), rtol=1e-5, atol=1e-5)
    assert len(backend.config.graphs) == 2  # the static graph, then the dynamic one
    for graph in backend.config.graphs:
        res = graph.ort_result
        assert any(x.key.startswith("attention@") for x in res.lowered), [
            (r.key, r.code, r.message[:200]) for r in res.rolled_back
        ]
