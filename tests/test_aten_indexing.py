"""Converters for windows, strided views, indexed writes, bags and boolean reductions
(`frontend/aten_ops_indexing.py`): the operators a held-out sweep found sending whole graphs
off onnxruntime (PatchTST's ``unfold``, Longformer's ``index_put`` / ``any`` / ``as_strided``,
``nn.EmbeddingBag``). Each form is checked against eager in onnxruntime and in the torch
runtime, with no opaque node left, and at a second length where sizes are symbolic."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from graph_autofusion.frontend.torch_frontend import from_torch  # noqa: E402
from graph_autofusion.runtime.torch_runtime import TorchRunner  # noqa: E402
from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402

pytestmark = pytest.mark.xdist_group("torch_ort")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Unfold(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.unfold(self.dim, 4, 3) * 2.0


class Patches(torch.nn.Module):  # PatchTST: patches of a series, then a linear per patch
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 8)

    def forward(self, x):
        return self.lin(x.unfold(dimension=-1, size=4, step=2)).relu()


class PutMask(torch.nn.Module):
    def __init__(self, accumulate: bool, row: bool) -> None:
        super().__init__()
        self.accumulate, self.row = accumulate, row

    def forward(self, x, m):
        v = torch.arange(x.shape[-1], dtype=x.dtype) if self.row else torch.tensor(-3.0)
        y = x.clone()
        if self.accumulate:
            return torch.index_put(y, (m,), v, accumulate=True) * 2
        y[m] = v
        return y * 2


class PutMaskAxis1(torch.nn.Module):
    def forward(self, x, m):
        y = x.clone()
        y[:, m] = 5.0
        return y + 1


class PutInts(torch.nn.Module):
    """Integer indices at the given axes: adjacent from 0, adjacent later, apart."""

    def __init__(self, where: str, accumulate: bool) -> None:
        super().__init__()
        self.where, self.accumulate = where, accumulate

    def forward(self, x, i, j, v):
        key = {
            "front": (i, j),
            "middle": (slice(None), i, j),
            "apart": (i, slice(None), j),
        }[self.where]
        if self.accumulate:  # duplicates add up
            idx = [None if isinstance(k, slice) else k for k in key]
            return torch.ops.aten.index_put(x, idx, v, True) - 1
        y = x.clone()
        y[key] = v
        return y - 1


class AnyAll(torch.nn.Module):
    def forward(self, x):
        pos = x > 0
        return (
            pos.any(-1).float()
            + x.all(dim=0, keepdim=True).float().sum()
            + pos.all().float()
            + torch.any(x, dim=(0, 1)).float()
        )


class AsStrided(torch.nn.Module):
    def __init__(self, view: str) -> None:
        super().__init__()
        self.view = view

    def forward(self, x):
        y = x.exp()
        if self.view == "transposed":  # dense in memory, in another axis order
            y = y.t()
        elif self.view == "sliced":  # its storage holds more than its values: stays opaque
            y = y[:, :5]
        return torch.as_strided(y, (3, 4), (2, 1), 1) + 1


class Bag(torch.nn.Module):
    def __init__(self, mode: str, **kw) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bag = torch.nn.EmbeddingBag(50, 8, mode=mode, **kw)

    def forward(self, ids, offsets, weights=None):
        return self.bag(ids, offsets, per_sample_weights=weights) * 2


X = torch.randn(5, 6, 7)
MASK = X[..., 0] > 0
IDS = torch.tensor([3, 0, 7, 7, 12, 49, 1, 0, 5])
CASES = {
    "unfold_last": (Unfold(-1), (torch.randn(2, 3, 13),)),
    "unfold_mid": (Unfold(1), (torch.randn(2, 11, 3),)),
    "patches": (Patches(), (torch.randn(2, 3, 16),)),
    "mask_scalar": (PutMask(False, False), (X, MASK)),
    "mask_row": (PutMask(False, True), (X, MASK)),
    "mask_accumulate": (PutMask(True, False), (X, MASK)),
    "mask_axis1": (PutMaskAxis1(), (X, X[0, :, 0] > 0)),
    "ints_front": (
        PutInts("front", False),
        (X, torch.tensor([0, -1, 2]), torch.tensor([1, 2, -3]), torch.randn(3, 7)),
    ),
    "ints_middle": (
        PutInts("middle", False),
        (X, torch.tensor([[0], [2]]), torch.tensor([1, 3, 5]), torch.randn(5, 2, 3)),
    ),
    "ints_front_accumulate": (
        PutInts("front", True),
        (X, torch.tensor([0, 2, 0, -5]), torch.tensor([1, 2, 1, 1]), torch.randn(4, 7)),
    ),
    "ints_apart": (
        PutInts("apart", False),
        (X, torch.tensor([4, 1]), torch.tensor([6, 0]), torch.tensor(9.0)),
    ),
    "any_all": (AnyAll(), (torch.randn(4, 6).masked_fill(torch.rand(4, 6) > 0.7, 0),)),
    "as_strided": (AsStrided("contiguous"), (torch.randn(4, 6),)),
    "as_strided_transposed": (AsStrided("transposed"), (torch.randn(4, 6),)),
    "bag_sum": (Bag("sum"), (IDS, torch.tensor([0, 2, 2, 6]))),
    "bag_mean_padding": (Bag("mean", padding_idx=7), (IDS, torch.tensor([0, 2, 5]))),
    "bag_last_offset": (
        Bag("sum", include_last_offset=True),
        (IDS, torch.tensor([0, 4, 4, 9]), torch.rand(9)),
    ),
}


def _eager(m, args):
    with torch.no_grad():
        return m(*[a.clone() for a in args])


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_form_runs_on_onnxruntime_with_eager_answer(case):
    m, args = CASES[case]
    backend = make_backend(engine="onnxruntime", check_speed=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        with torch.no_grad():
            got = torch.compile(m, backend=backend)(*args)
    torch.testing.assert_close(got, _eager(m, args), rtol=1e-5, atol=1e-5)
    assert [g.engine for g in backend.config.graphs] == ["onnxruntime"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_form_imports_with_no_opaque_node_and_runs_on_the_torch_runtime(case):
    m, args = CASES[case]
    model = from_torch(m, args)
    opaque = {n.op_type for n in model.graph.nodes if n.domain == "aten"}
    assert not opaque, opaque
    feeds = dict(zip([v.name for v in model.graph.inputs], args))
    (got,) = TorchRunner(model).run(feeds).values()
    torch.testing.assert_close(got, _eager(m, args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "m, make",
    [
        (Patches(), lambda n: (torch.randn(2, 3, n),)),
        (PutMask(False, True), lambda n: (torch.randn(n, 7), torch.randn(n) > 0)),
        (
            PutInts("middle", True),
            lambda n: (
                torch.randn(2, n, 5),
                torch.tensor([1, 0]),
                torch.tensor([4, -1]),
                torch.randn(2, 2),
            ),
        ),
    ],
    ids=["unfold", "mask", "ints"],
)
def test_symbolic_lengths_are_served_by_one_onnxruntime_graph(m, make):
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(m, backend=backend, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n in (9, 14, 22):
            args = make(n)
            with torch.no_grad():
                got = c(*args)
            torch.testing.assert_close(got, _eager(m, args), rtol=1e-5, atol=1e-5)
    assert [g.engine for g in backend.config.graphs] == ["onnxruntime"]


def test_as_strided_over_memory_its_values_do_not_hold_stays_opaque_and_exact():
    m, x = AsStrided("sliced"), torch.randn(4, 6)
    model = from_torch(m, (x,))
    assert [n.op_type for n in model.graph.nodes if n.domain == "aten"] == [
        "aten::as_strided.default"
    ]
    with torch.no_grad():
        got = torch.compile(m, backend=make_backend(check_speed=False))(x)
    torch.testing.assert_close(got, _eager(m, (x,)))


def test_a_max_bag_stays_opaque_and_exact():
    m = Bag("max")
    args = (IDS, torch.tensor([0, 3, 6]))
    model = from_torch(m, args)
    assert any(n.domain == "aten" for n in model.graph.nodes)
    with torch.no_grad():
        got = torch.compile(m, backend=make_backend(check_speed=False))(*args)
    torch.testing.assert_close(got, _eager(m, args))
