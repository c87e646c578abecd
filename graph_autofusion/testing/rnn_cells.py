"""Recurrent cells written out by hand, as custom RNN code does (test models for the
``lstm_gates`` and ``gru_gates`` rules).

``nn.LSTM`` / ``nn.GRU`` export as one ONNX ``LSTM`` / ``GRU`` operator, already a fused
kernel; these modules instead spell each timestep's gate math with ``torch.sigmoid``,
``torch.tanh`` and ``chunk``, so an exporter writes it as elementwise operators::

    ManualLSTM:  gates = x_t W + h U + b;  i, f, g, o = chunk(gates, 4)
                 c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')
    ManualGRU:   gi = x_t W + b_i;  gh = h U + b_h;  chunk each into r, z, n parts
                 r = sigmoid(gi_r + gh_r);  z = sigmoid(gi_z + gh_z)
                 n = tanh(gi_n + r * gh_n);  h' = (1 - z) * n + z * h

    module, args = manual_lstm()          # seeded module and (x, h0, c0)
"""

from __future__ import annotations

import torch
from torch import nn

#: Defaults: batch, timesteps, input features, hidden size.
BATCH, STEPS, FEATURES, HIDDEN = 2, 4, 8, 16


class ManualLSTM(nn.Module):
    """An LSTM cell unrolled over the timesteps of ``x`` (batch, steps, features)."""

    def __init__(self, features: int = FEATURES, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.wx = nn.Linear(features, 4 * hidden)
        self.wh = nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        for t in range(x.shape[1]):
            gates = self.wx(x[:, t]) + self.wh(h)
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return h, c


class ManualGRU(nn.Module):
    """A GRU cell (PyTorch's gate equations) unrolled over the timesteps of ``x``."""

    def __init__(self, features: int = FEATURES, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.wx = nn.Linear(features, 3 * hidden)
        self.wh = nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor, h: torch.Tensor):
        for t in range(x.shape[1]):
            xr, xz, xn = self.wx(x[:, t]).chunk(3, dim=-1)
            hr, hz, hn = self.wh(h).chunk(3, dim=-1)
            r = torch.sigmoid(xr + hr)
            z = torch.sigmoid(xz + hz)
            n = torch.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
        return h


def _inputs(n_states: int, steps: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(BATCH, steps, FEATURES, generator=gen)
    states = tuple(torch.randn(BATCH, HIDDEN, generator=gen) for _ in range(n_states))
    return (x, *states)


def manual_lstm(steps: int = STEPS, seed: int = 0) -> tuple[ManualLSTM, tuple[torch.Tensor, ...]]:
    """A seeded eval-mode :class:`ManualLSTM` and example ``(x, h0, c0)``."""
    torch.manual_seed(seed)
    return ManualLSTM().eval(), _inputs(2, steps, seed)


def manual_gru(steps: int = STEPS, seed: int = 0) -> tuple[ManualGRU, tuple[torch.Tensor, ...]]:
    """A seeded eval-mode :class:`ManualGRU` and example ``(x, h0)``."""
    torch.manual_seed(seed)
    return ManualGRU().eval(), _inputs(1, steps, seed)


#: Where a cell's graph comes from (as in :data:`graph_autofusion.testing.rules.SOURCES`).
SOURCES = ("dynamo", "torchscript", "torch")


def cell_model(module: nn.Module, args: tuple[torch.Tensor, ...], source: str, directory):
    """The cell as IR from ``source``: an ONNX export written under ``directory`` (dynamo:
    ``torch.onnx.export(dynamo=True)``; torchscript: ``dynamo=False``, opset 18, as the zoo
    exports) and loaded, or our PyTorch frontend (``torch``)."""
    import contextlib
    import io
    import warnings
    from pathlib import Path

    if source == "torch":
        from graph_autofusion.frontend.torch_frontend import from_torch

        return from_torch(module, args, {})
    from graph_autofusion.frontend.onnx_frontend import load_onnx
    from graph_autofusion.testing.export import TORCHSCRIPT_OPSET, quiet

    path = Path(directory) / f"{type(module).__name__}-{source}.onnx"
    with quiet(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with torch.no_grad():
            if source == "dynamo":
                torch.onnx.export(module, args, str(path), dynamo=True, verbose=False)
            elif source == "torchscript":
                torch.onnx.export(
                    module, args, str(path), dynamo=False, opset_version=TORCHSCRIPT_OPSET
                )
            else:
                raise ValueError(f"unknown source {source!r}; choose one of {SOURCES}")
    return load_onnx(path)
