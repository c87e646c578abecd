"""The PyTorch route on onnxruntime (issue 21): each Dynamo graph fused by the ONNX route and
run in one onnxruntime session over the module's own parameters; the engine chosen by timing
on the first call's inputs; symbolic sizes kept, so new lengths compile nothing."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graph_autofusion import GraphAutoFusion  # noqa: E402
from graph_autofusion.runtime.timing import use_timer  # noqa: E402
from graph_autofusion.testing.small_hf import tiny_llama  # noqa: E402
from graph_autofusion.torch_compile import AutofusionWarning, make_backend  # noqa: E402
from graph_autofusion.torch_ort import OrtGraphProgram  # noqa: E402

pytestmark = pytest.mark.xdist_group("torch_ort")

GEN = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _TextModel(torch.nn.Module):
    """Embedding, two linears, a softmax over the sequence: a text model in a few lines."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(500, 128)
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = self.down(torch.nn.functional.gelu(self.up(h))) + h
        return torch.softmax(h @ h.transpose(-1, -2), dim=-1) @ h


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 500, (1, n), generator=torch.Generator().manual_seed(seed))


def _sessions(graphs) -> list[OrtGraphProgram]:
    """The onnxruntime programs the graphs' compiled calls run."""
    found = (_find_ort(prog) for g in graphs for _i, _r, _v, prog in g._programs)
    return [p for p in found if p is not None]


def _find_ort(prog):
    """The OrtGraphProgram under a compiled graph's program (wrapped for its container)."""
    seen = [prog]
    while seen:
        p = seen.pop()
        if isinstance(p, OrtGraphProgram):
            return p
        inner = getattr(p, "program", None)
        if inner is not None:
            seen.append(inner)
        for cell in getattr(p, "__closure__", None) or ():
            seen.append(cell.cell_contents)
    return None


def test_onnxruntime_engine_matches_eager_and_reads_the_parameters_in_place():
    m = _TextModel().eval()
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(m, backend=backend)
    ids = _ids(16)
    with torch.no_grad():
        got, want = c(ids), m(ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    (g,) = backend.config.graphs
    assert g.engine == "onnxruntime" and g.fallback is None, g.summary()
    (ort,) = _sessions([g])
    arrays = ort.session._autofusion_in_place[1]
    emb = m.emb.weight.detach().numpy()
    # the embedding table is the session's initializer memory, not a copy
    assert any(np.shares_memory(a, emb) for a in arrays.values()), list(arrays)
    # a write into the parameter is seen by the session itself (no recompile involved)
    with torch.no_grad():
        m.emb.weight.mul_(2.0)
        (direct,) = ort.session.run(None, {ort.input_names[0]: ids.numpy()})
        torch.testing.assert_close(torch.from_numpy(direct), m(ids), rtol=1e-4, atol=1e-5)
        # and through the compiled module (a new weight version compiles again, as before)
        torch.testing.assert_close(c(ids), m(ids), rtol=1e-4, atol=1e-5)


def test_new_sequence_lengths_compile_nothing_after_the_dynamic_graph():
    m = _TextModel().eval()
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(m, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        with torch.no_grad():
            for n in (8, 12, 16, 20, 5):
                torch.testing.assert_close(c(_ids(n, n)), m(_ids(n, n)), rtol=1e-4, atol=1e-5)
    graphs = backend.config.graphs
    # the static first graph, then Dynamo's one dynamic graph serves every later length
    assert len(graphs) == 2, [g.summary() for g in graphs]
    assert all(g.fallback is None and g.engine == "onnxruntime" for g in graphs)
    assert graphs[1].calls == 4 and len(graphs[1]._programs) == 1
    dims = [d for v in graphs[1].imported.graph.inputs for d in (v.shape or ())]
    assert any(isinstance(d, str) for d in dims), dims  # symbolic in the ONNX graph


def test_generate_gives_eager_tokens_on_two_prompt_lengths():
    model = tiny_llama(2)
    fused = GraphAutoFusion(model).fuse()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutofusionWarning)
        for n, new in ((12, 20), (7, 12)):
            ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
            with torch.no_grad():
                want = model.generate(ids, max_new_tokens=new, **GEN)
                got = fused.generate(ids, max_new_tokens=new, **GEN)
            assert torch.equal(got, want)
    graphs = fused.autofusion.graphs
    # prefill and first decode step (static), the dynamic decode graph, the second prompt's
    # dynamic prefill: nothing after that, and nothing in eager
    assert len(graphs) <= 5, [g.summary() for g in graphs]
    assert all(g.fallback is None for g in graphs), [g.summary() for g in graphs]
    assert max(g.calls for g in graphs) >= 20


def test_the_engine_is_chosen_by_timing_and_reported():
    m = _TextModel().eval()
    ids = _ids(16)

    def timer(want_fastest: str):
        speed = {"onnxruntime": 3e-3, "torch": 3e-3, "eager": 3e-3, want_fastest: 1e-3}

        def t(key, side, fn):  # safe mode's own fused/unfused timings: equal, kept
            fn()
            return speed.get(side, 1e-3)

        return t

    for fastest in ("onnxruntime", "torch", "eager"):
        torch._dynamo.reset()
        backend = make_backend()
        with use_timer(timer(fastest)), torch.no_grad():
            torch.testing.assert_close(
                torch.compile(m, backend=backend)(ids), m(ids), rtol=1e-4, atol=1e-5
            )
        (g,) = backend.config.graphs
        assert g.engine == fastest, g.summary()
        s = g.summary()
        assert s["engine"] == fastest
        assert set(s["engine_ms"]) == {"onnxruntime", "torch", "eager"}
        assert s["engine_ms"][fastest] == 1.0


def test_a_graph_onnx_cannot_express_keeps_the_torch_program_with_one_warning():
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.special.bessel_j0(self.lin(x)) + 1.0

    m = M().eval()
    x = torch.randn(4, 64)
    backend = make_backend(check_speed=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = torch.compile(m, backend=backend)(x)
    torch.testing.assert_close(got, m(x))
    (g,) = backend.config.graphs
    assert g.engine == "torch" and g.fallback is None
    ours = [w for w in caught if issubclass(w.category, AutofusionWarning)]
    assert len(ours) == 1 and "bessel_j0" in str(ours[0].message), [str(w.message) for w in ours]


def test_onnxruntime_failing_on_a_call_falls_back_for_that_call_only():
    m = _TextModel().eval()
    backend = make_backend(engine="onnxruntime", check_speed=False)
    c = torch.compile(m, backend=backend)
    ids = _ids(16)
    with torch.no_grad():
        c(ids)
    (g,) = backend.config.graphs
    (ort,) = _sessions([g])
    real_run = ort.session.run
    failures = {"left": 1}

    def flaky(*a, **k):  # onnxruntime refusing one call (fault injection)
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("injected: cannot run this shape")
        return real_run(*a, **k)

    ort.session.run = flaky
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            first, second = c(ids), c(ids)
    torch.testing.assert_close(first, m(ids), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(second, m(ids), rtol=1e-4, atol=1e-5)
    assert g.ort_failures == 1 and failures["left"] == 0
    ours = [w for w in caught if issubclass(w.category, AutofusionWarning)]
    assert len(ours) == 1 and "onnxruntime failed" in str(ours[0].message)


def test_saved_plan_reloads_on_the_same_engine(tmp_path):
    model = tiny_llama(2)
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(3))
    fused = GraphAutoFusion(model).fuse()
    (saved,) = [g.engine for g in fused.autofusion.graphs]  # the example call's graph
    fused.save_pretrained(tmp_path)
    plan = json.loads((tmp_path / "autofusion_plan.json").read_text())
    assert [g["engine"] for g in plan["graphs"]] == [saved]
    from graph_autofusion.torch_module import load_fused

    again = load_fused(transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval(), tmp_path)
    first = again.autofusion.graphs[0]
    assert first.engine == saved and first.plan_source == "saved"
    # only the saved engine was built for the saved graph (no timing, no second engine)
    assert first.engine_times == {} and set(first.engine_notes) == set()
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, **GEN)
        got = again.generate(ids, max_new_tokens=8, **GEN)
    assert torch.equal(got, want)


def test_graphs_of_one_module_share_the_folded_weights_until_one_is_updated():
    """The importer folds each linear weight's transpose once per module, not once per graph
    (a generate() compiles three); an in-place update of the weight folds it again."""
    model = tiny_llama(2)
    backend = make_backend(engine="onnxruntime", check_speed=False, safe_mode=False)
    c = torch.compile(model, backend=backend)
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        c(ids)
        c(ids, use_cache=False)  # a second graph of the same module

    def big(g):
        return [v.const for v in g.imported.graph.initializers.values() if v.const.size > 4096]

    first, second = backend.config.graphs[:2]
    assert all(any(np.shares_memory(a, b) for b in big(second)) for a in big(first))
    head = model.lm_head.weight
    old = [a for a in big(first) if a.shape == tuple(head.shape[::-1])]
    assert old  # the head's folded transpose
    with torch.no_grad():
        head.mul_(-1.0)
        got = c(ids, use_cache=False).logits
        torch.testing.assert_close(got, model(ids, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    third = backend.config.graphs[-1]
    new = [a for a in big(third) if a.shape == tuple(head.shape[::-1])]
    assert new and not any(np.shares_memory(a, b) for a in new for b in old)
