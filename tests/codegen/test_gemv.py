"""The gemv kernel and the oneDNN path of constant-weight MatMul, against torch.matmul."""

from __future__ import annotations

import functools
import os

import pytest

torch = pytest.importorskip("torch")

from graph_autofusion.runtime.gemv import GemvMatMul, LazyConstMatMul, load_gemv  # noqa: E402


@functools.cache
def _loaded():
    """The gemv kernel and its call shim. One that fails to build or load fails the test
    (never a skip: production would silently fall back to torch's kernels)."""
    got = load_gemv()
    if got is None:
        from graph_autofusion.runtime.shim import _load_shim

        try:
            why = f"the shim loader returned {_load_shim()!r}"
        except Exception as exc:  # noqa: BLE001 - what load_shim() swallowed
            why = f"{type(exc).__name__}: {exc}"
        pytest.fail(
            f"the gemv kernel or its call shim did not build or load ({why}; "
            f"GRAPH_AUTOFUSION_NO_SHIM={os.environ.get('GRAPH_AUTOFUSION_NO_SHIM')!r})"
        )
    return got


@pytest.mark.parametrize(
    "n,k,rows",
    [(1, 1, 1), (7, 3, 1), (8, 8, 1), (9, 17, 2), (33, 100, 3), (512, 512, 1), (1376, 512, 8),
     (1000, 1376, 4), (64, 40, 9), (300, 64, 128)],
)  # fmt: skip
def test_constant_matmul_matches_torch(n, k, rows):
    loaded = _loaded()
    gen = torch.Generator().manual_seed(n * 131 + k)
    w = torch.randn(k, n, generator=gen)  # MatMul's right operand, [K, N]
    x = torch.randn(1, rows, k, generator=gen)
    g = GemvMatMul(w, loaded, 2)
    got = g(None, x, w)
    assert got.shape == (1, rows, n)
    torch.testing.assert_close(got, x @ w, atol=1e-4, rtol=1e-4)
    assert g.kernel_calls == (1 if rows <= 8 else 0)  # more rows: oneDNN or torch


def test_strided_or_other_dtype_inputs_take_torch():
    loaded = _loaded()
    w = torch.randn(16, 8)
    g = GemvMatMul(w, loaded, 2)
    xt = torch.randn(16, 2).t()  # not contiguous
    torch.testing.assert_close(g(None, xt, w), xt @ w)
    xd = torch.randn(2, 16, dtype=torch.float64)
    torch.testing.assert_close(g(None, xd, w.double()), xd @ w.double())
    assert g.kernel_calls == 0


def test_lazy_matmul_follows_the_weight_it_is_given():
    lazy = LazyConstMatMul(threads=2)
    x = torch.randn(1, 32)
    for _ in range(2):
        w = torch.randn(32, 24)
        torch.testing.assert_close(lazy(None, x, w), x @ w, atol=1e-4, rtol=1e-4)
