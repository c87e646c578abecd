"""Functions compiled with our backend and Dynamo's recompile limit (torch_recompiles).

A Python loop over an int argument makes Dynamo compile one variant of the forward per count
(it guards ``steps == k``), as a sliding-window decoder's mask code does per cache length
near its window. The drop-in fused module compiles its forward with a limit of its own
(``defaults.RECOMPILE_LIMIT``); reaching a limit, there or in the user's own
``torch.compile(..., backend=...)``, gives one warning and an ``eager_reason``, never a
silent eager model or a wrong answer.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from graph_autofusion import GraphAutoFusion, defaults  # noqa: E402
from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402


class Steps(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):  # one compiled variant per count
            x = torch.relu(self.lin(x))
        return x


def _run(fused, model, x, counts):
    """Call both with every count; the AutofusionWarnings raised meanwhile."""
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        for k in counts:
            with torch.no_grad():
                torch.testing.assert_close(fused(x, k), model(x, k), atol=1e-5, rtol=1e-5)
    return [w for w in ws if issubclass(w.category, AutofusionWarning)]


def _fused(model, x):
    return GraphAutoFusion(model, example_inputs=(x, 1)).fuse(check_speed=False)


def test_more_variants_than_torchs_default_limit_stay_compiled():
    torch.manual_seed(0)
    model, x = Steps().eval(), torch.randn(4, 16)
    fused = _fused(model, x)
    limit = torch._dynamo.config.recompile_limit
    assert limit < defaults.RECOMPILE_LIMIT
    ours = _run(fused, model, x, range(2, limit + 3))
    assert not ours and not fused.autofusion.eager_reason
    assert len(fused.autofusion.graphs) == limit + 2  # every count compiled, none in eager
    assert torch._dynamo.config.recompile_limit == limit  # the global setting is untouched


def test_reaching_the_limit_warns_once_and_answers_right(monkeypatch):
    monkeypatch.setattr(defaults, "RECOMPILE_LIMIT", 3)
    torch.manual_seed(0)
    model, x = Steps().eval(), torch.randn(4, 16)
    fused = _fused(model, x)  # compiles steps=1
    ours = _run(fused, model, x, [2, 3, 4, 5, 6, 4, 1])
    assert len(ours) == 1, [str(w.message) for w in ours]
    text = str(ours[0].message)
    assert "the fused Steps module's forward reached Dynamo's recompile_limit (3)" in text
    assert "steps == 3" in text  # Dynamo's last reason
    assert "recompile_limit (3) was reached" in fused.autofusion.eager_reason
    assert len(fused.autofusion.graphs) == 3  # counts 1-3 compiled; 4-6 ran in eager


def test_the_users_own_compile_of_the_class_is_not_taken_for_ours():
    torch.manual_seed(0)
    model, x = Steps().eval(), torch.randn(4, 16)
    fused = _fused(model, x)
    plain = torch.compile(Steps().eval(), backend="eager")  # torch's default limit
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        with torch.no_grad():
            for k in range(1, torch._dynamo.config.recompile_limit + 3):
                plain(x, k)
    assert not [w for w in ws if issubclass(w.category, AutofusionWarning)]
    assert not fused.autofusion.eager_reason


class OwnSteps(Steps):
    """Steps with a forward of its own: Dynamo marks a code that reached its limit to be
    skipped for the rest of the process (another test reaches Steps.forward's)."""

    def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):
            x = torch.relu(self.lin(x))
        return x


def test_the_backend_in_the_users_own_compile_warns_at_torchs_limit():
    torch.manual_seed(0)
    model, x = OwnSteps().eval(), torch.randn(4, 16)
    backend = make_backend(check_speed=False)
    compiled = torch.compile(model, backend=backend)
    limit = torch._dynamo.config.recompile_limit
    ours = _run(compiled, model, x, range(1, limit + 4))
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "compiled with the autofusion backend, reached Dynamo's recompile_limit" in str(
        ours[0].message
    )
    assert f"recompile_limit ({limit}) was reached on 'forward'" in backend.config.eager_reason
    assert len(backend.config.graphs) == limit
