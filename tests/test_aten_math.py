"""Converters for statistics, distances and elementwise functions ONNX composes
(`frontend/aten_ops_math.py`), ``logical_not`` of numbers and a max pool's indices: each ran on the torch engine or in
eager in a held-out sweep (a var over a symbolic axis raised a TypeError). Each is checked
against eager on onnxruntime at three lengths with symbolic sizes, and imported with no opaque
node."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from graph_autofusion.frontend.torch_frontend import from_torch  # noqa: E402
from graph_autofusion.runtime.torch_runtime import TorchRunner  # noqa: E402
from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402

F = torch.nn.functional
pytestmark = pytest.mark.xdist_group("torch_ort")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _small(x):  # values near 0 too, where expm1 must not cancel
    return torch.cat([x, x * 1e-6], dim=-1)


def _grid(x):
    g = x[:, :, :2].tanh().unsqueeze(1) * 1.2  # some points outside [-1, 1]
    return g


def _pool_unpool(x):  # SegNet: the indices of a max pool feed max_unpool
    y, idx = F.max_pool2d(x.unsqueeze(1), 2, return_indices=True)
    _, idx1 = F.max_pool1d(x, 3, 2, padding=1, return_indices=True)
    return F.max_unpool2d(y * 2, idx, 2, output_size=x.shape[-2:]), idx, idx1


def _scatter_reduce(x):
    idx = (torch.arange(x.shape[1]) % 3).view(1, -1, 1).expand(x.shape[0], -1, 6)
    outs = []
    for how in ("sum", "prod", "amax", "amin", "mean"):
        for self_too in (True, False):
            base = torch.ones(x.shape[0], 4, 6)
            outs.append(base.scatter_reduce(1, idx, x, how, include_self=self_too))
    return tuple(outs)


SEQ = torch.linspace(-2, 2, 9)
CASES = {
    "var": lambda x: x.var(1) + x.var(),
    "std_keepdim": lambda x: x.std((1, 2), keepdim=True) * x,
    "var_mean": lambda x: torch.stack(torch.var_mean(x, 1, correction=0)),
    "expm1": lambda x: torch.expm1(_small(x)),
    "trunc": lambda x: (x * 3).trunc(),
    "round_decimals": lambda x: (x * 7).round(decimals=1),
    "selu_celu": lambda x: F.selu(x) + F.celu(x, 0.5),
    "atan2": lambda x: torch.atan2(x.round(), x.flip(-1).round()),
    "cdist2": lambda x: torch.cdist(x, x.flip(1) + 1),
    "diagonal": lambda x: torch.diagonal(x @ x.transpose(1, 2), 0, 1, 2),
    "diagonal_offset": lambda x: torch.diagonal(x, 1, 1, 2) + torch.diagonal(x, -2, 1, 2).sum(),
    "searchsorted": lambda x: torch.searchsorted(SEQ, x) + torch.searchsorted(SEQ, x, right=True),
    "instance_norm": lambda x: F.instance_norm(x, weight=torch.ones(x.shape[1]), bias=None),
    "grid_sample": lambda x: F.grid_sample(x.unsqueeze(1), _grid(x), align_corners=False),
    "grid_sample_nearest": lambda x: F.grid_sample(
        x.unsqueeze(1), _grid(x), mode="nearest", padding_mode="border", align_corners=True
    ),
    "logical_not": lambda x: torch.logical_not(x.round()),
    "scatter_reduce": _scatter_reduce,
    "bucketize": lambda x: torch.bucketize(x, SEQ) + torch.bucketize(x, SEQ, right=True),
    "median_kth": lambda x: (
        x.median(),
        x.median(1).values,
        torch.median(x, -1, keepdim=True)[0],
        x.kthvalue(2, 1).values,
        torch.median(torch.where(x > 1.5, math.nan, x), 2).values,
    ),
    "copysign_signbit_hypot": lambda x: (
        torch.copysign(x, x.flip(-1).round()),
        torch.signbit(x.round()),
        torch.hypot(x, x.flip(1)),
    ),
    "nan_inputs": lambda x: (
        torch.atan2(torch.where(x > 1, math.nan, x), torch.where(x < -1, 0.0, x)),
        torch.searchsorted(SEQ, torch.where(x > 1, math.nan, x)),
    ),
    "any_all_empty": lambda x: ((x[:, :0] > 0).any(1), (x[:, :0] > 0).all(1), x[:, :0].any()),
    "var_0d": lambda x: x.sum().var(0, correction=0) + x.sum().std(),
    "max_pool_indices": _pool_unpool,
    "adaptive_pools": lambda x: (
        F.adaptive_avg_pool2d(x.unsqueeze(1), (3, 4)),
        F.adaptive_max_pool2d(x.unsqueeze(1), (5, 4)),
        F.adaptive_avg_pool1d(x.transpose(1, 2), 1),
        F.adaptive_avg_pool1d(x[:, :, :5], 3),
    ),
    "all_decomposed": lambda x: (x.aminmax(dim=1)[0], x.round().all(-1)),
}


#: p other than 2 spreads the pairs out, static sizes only (symbolic ones stay opaque)
STATIC_CASES = {
    "cdist1": lambda x: torch.cdist(x, x * 2, p=1),
    "cdist_inf": lambda x: torch.cdist(x, -x, p=math.inf),
    "cdist3": lambda x: torch.cdist(x, x + 0.5, p=3),
}


def _eager(m, x):
    with torch.no_grad():
        return m(x)


def _same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            assert torch.equal(g, w)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_form_runs_on_onnxruntime_at_every_length(case):
    m = Fn(CASES[case]).eval()
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(m, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (7, 12, 20):
            x = torch.randn(2, n, 6, generator=torch.Generator().manual_seed(n))
            with torch.no_grad():
                _same(c(x), _eager(m, x))
    assert {g.engine for g in backend.config.graphs} == {"onnxruntime"}


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_each_static_form_runs_on_onnxruntime(case):
    m = Fn(STATIC_CASES[case]).eval()
    backend = make_backend(engine="onnxruntime", check_speed=False)
    x = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        with torch.no_grad():
            _same(torch.compile(m, backend=backend)(x), _eager(m, x))
    assert {g.engine for g in backend.config.graphs} == {"onnxruntime"}


@pytest.mark.parametrize("case", sorted(CASES | STATIC_CASES))
def test_each_form_imports_with_no_opaque_node(case):
    m = Fn({**CASES, **STATIC_CASES}[case]).eval()
    x = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(1))
    model = from_torch(m, (x,))
    opaque = {n.op_type for n in model.graph.nodes if n.domain == "aten"}
    assert not opaque, opaque
    feeds = {model.graph.inputs[0].name: x}
    got = tuple(TorchRunner(model).run(feeds).values())
    _same(got if len(got) > 1 else got[0], _eager(m, x))
