"""The first call of a compiled graph times its onnxruntime program without the packed GEMM
weights, and packs them for that timing only when the unpacked measurement does not settle the
engine (``CompiledGraph._unpacked_leads``): a graph far ahead of eager unpacked is chosen as it
is and packed once hot, so no first call holds a packed copy of the weights it may never use
again (a ``generate()``'s prefill)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from graph_autofusion import defaults  # noqa: E402
from graph_autofusion.runtime.timing import use_timer  # noqa: E402
from graph_autofusion.torch_compile import make_backend  # noqa: E402
from graph_autofusion.torch_ort import OrtGraphProgram  # noqa: E402
from tests.test_torch_ort import _ids, _TextModel  # noqa: E402 - its text model, 16 rows pack


def _timer(speed: dict[str, float], timed: list[tuple[str, bool]], probe=None):
    """Engines at ``speed`` (seconds) in the engine measurements (and in the one-call probe
    before the unpacked measurement, unless ``probe`` gives its own), recording for each timed
    onnxruntime call whether its session was packed; safe mode's own timings equal."""

    def t(key, side, fn):
        fn()
        if key.startswith("engine@") and side == "onnxruntime":
            timed.append((side, _packed[-1] if _packed else None))
        if key.startswith("probe@"):
            return (probe or speed).get(side, 1e-3)
        return speed.get(side, 1e-3) if key.startswith("engine@") else 1e-3

    return t


_packed: list[bool] = []  # the packing of each session opened, in order


@pytest.fixture(autouse=True)
def _defer_any_size(monkeypatch):
    """The text model's weights (0.4 MB) as if large enough to pack later."""
    monkeypatch.setattr(defaults, "PACK_LATER_MIN_BYTES", 0)


@pytest.fixture
def opens(monkeypatch):
    """Every onnxruntime session the torch route opens, as ``True`` (packed) or ``False``."""
    _packed.clear()
    real = OrtGraphProgram._open

    def record(self, prepack):
        _packed.append(bool(prepack))
        return real(self, prepack)

    monkeypatch.setattr(OrtGraphProgram, "_open", record)
    yield _packed
    _packed.clear()


def _compile_and_call(speed: dict[str, float], calls: int = 1, probe=None):
    m = _TextModel().eval()
    backend = make_backend()
    c = torch.compile(m, backend=backend)
    ids = _ids(16)
    timed: list[tuple[str, bool]] = []
    with use_timer(_timer(speed, timed, probe)), torch.no_grad():
        outs = [c(ids) for _ in range(calls)]
        want = m(ids)
    for out in outs:
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    (g,) = backend.config.graphs
    return g, timed


def test_a_graph_far_ahead_of_eager_unpacked_is_chosen_without_packing(opens):
    """onnxruntime at 0.25x eager's time without its packed weights: chosen on that
    measurement, the torch program not built, no packed session opened during the first call;
    the graph's later calls pack the weights (the session opened again) with the same
    answers."""
    g, timed = _compile_and_call({"onnxruntime": 1e-3, "eager": 4e-3, "torch": 0.5e-3})
    assert g.engine == "onnxruntime", g.summary()
    assert timed and all(packed is False for _, packed in timed), timed
    assert True not in opens, opens  # not even for the timing
    assert "packing" in g.engine_notes, g.engine_notes
    assert "without its packed weights" in g.engine_notes["not built"], g.engine_notes
    assert g.engine_times["onnxruntime"] == pytest.approx(1e-3)
    torch._dynamo.reset()

    g, _ = _compile_and_call({"onnxruntime": 1e-3, "eager": 4e-3}, calls=3)
    assert opens[-1] is True  # hot: packed from the second call on


@pytest.mark.parametrize(
    ("ort_s", "chosen", "unpacked"),
    [(3.6e-3, "onnxruntime", True), (3.6e-3, "onnxruntime", False), (5e-3, "eager", False)],
)
def test_a_graph_not_far_enough_ahead_unpacked_is_packed_and_timed_again(
    opens, ort_s, chosen, unpacked
):
    """onnxruntime at 0.9x eager's time unpacked (ahead, but where packing may decide whether
    the torch program is worth building), the one-call probe having seen it at 0.5x: measured
    unpacked, then packed and measured again. The probe seeing it as measured (0.9x, or 1.25x:
    past the probe's limit, 0.75 x 1.13): packed before any measurement. Either way the torch
    program is built and timed, and the faster engine is chosen."""
    probe = {"onnxruntime": 2e-3, "eager": 4e-3} if unpacked else None
    g, timed = _compile_and_call({"onnxruntime": ort_s, "eager": 4e-3, "torch": 6e-3}, probe=probe)
    packed = [p for _, p in timed]
    assert True in packed and (False in packed) == unpacked, timed
    if unpacked:  # unpacked first, then packed
        assert packed.index(True) > packed.index(False)
    assert "packing" not in g.engine_notes, g.engine_notes
    assert "not built" not in g.engine_notes and "torch" in g.engine_times, g.engine_notes
    assert g.engine == chosen, g.summary()


def test_the_threshold_moves_with_torch_program_below(opens, monkeypatch):
    """The unpacked measurement decides only where the packed one would not have built the
    torch program: ``TORCH_PROGRAM_BELOW`` x ``UNPACKED_SLOWER`` of eager's time."""
    monkeypatch.setattr(defaults, "TORCH_PROGRAM_BELOW", 0.2)  # 0.226 unpacked
    g, timed = _compile_and_call({"onnxruntime": 1e-3, "eager": 4e-3, "torch": 5e-3})
    assert True in [p for _, p in timed], timed  # 0.25 > 0.226: packed and timed again
    assert g.engine == "onnxruntime" and "packing" not in g.engine_notes, g.engine_notes


def test_with_no_torch_program_to_build_the_unpacked_measurement_settles_it(opens):
    """``engine="onnxruntime"``: onnxruntime against eager is the only choice, so beating
    eager unpacked (0.9x) settles it; no packed session during the first call."""
    m = _TextModel().eval()
    backend = make_backend(engine="onnxruntime")
    timed: list[tuple[str, bool]] = []
    speed = {"onnxruntime": 3.6e-3, "eager": 4e-3}
    with use_timer(_timer(speed, timed)), torch.no_grad():
        out = torch.compile(m, backend=backend)(_ids(16))
        torch.testing.assert_close(out, m(_ids(16)), rtol=1e-4, atol=1e-5)
    (g,) = backend.config.graphs
    assert g.engine == "onnxruntime" and "packing" in g.engine_notes, g.engine_notes
    assert True not in opens and all(p is False for _, p in timed), (opens, timed)
