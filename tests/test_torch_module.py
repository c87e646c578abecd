"""``GraphAutoFusion(module).fuse()``: a drop-in fused module, its plan saved and reapplied."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graph_autofusion import GraphAutoFusion  # noqa: E402
from graph_autofusion.runtime.timing import use_timer  # noqa: E402
from graph_autofusion.testing.small_hf import tiny_llama  # noqa: E402
from graph_autofusion.torch_module import PLAN_FILE, load_fused  # noqa: E402

pytestmark = pytest.mark.xdist_group("torch_compile")
GEN = dict(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)


def _kernel_is_faster(key, side, fn):
    """Safe mode's timer: the kernels and their operators run, the times are set (the kernel
    twice as fast; the engines and eager alike, so the first engine built runs): what is
    fused does not depend on this machine's load."""
    fn()
    return 5e-6 if side == "fused" else 10e-6


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_fuse_returns_a_drop_in_module_that_generates_the_same_tokens(tmp_path):
    model = tiny_llama()
    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want_tokens = model.generate(ids, **GEN)
        want_logits = model(ids).logits
    gaf = GraphAutoFusion(model)  # example inputs built from the config
    with use_timer(_kernel_is_faster):  # generate() compiles its other shapes in here too
        fused = gaf.fuse()
        assert type(fused) is type(model) and fused is not model
        assert "forward" not in model.__dict__  # the user's module is untouched
        info = fused.autofusion
        assert info.graphs and info.graphs[0].fallback is None
        assert info.results()[0].lowered  # something was fused, and verified
        with torch.no_grad():
            assert torch.equal(fused.generate(ids, **GEN), want_tokens)
            assert torch.allclose(fused(ids).logits, want_logits, atol=1e-4)

    precision = gaf.verify_precision()
    assert precision["cosine"] >= 0.9999 and precision["layers"]
    perf = gaf.verify_performance(runs=2, warmup=1, new_tokens=4)
    assert perf["fused"]["latency_ms"] > 0 and perf["fused"]["tokens_per_s"] > 0
    reports = gaf.safe_fusion_report()
    assert reports and reports[0].to_dict()["fusions"]
    kernels = gaf.compile_fused_operators(tmp_path / "kernels")
    assert kernels and (tmp_path / "kernels" / "graph0" / "manifest.json").exists()

    # save_pretrained writes the weights and the plan; loading reapplies the same fusions
    out = tmp_path / "saved"
    fused.save_pretrained(out)
    assert (out / PLAN_FILE).exists() and (out / "config.json").exists()
    torch._dynamo.reset()
    # a saved plan applies its fusions without timing them again, the close calls the cost
    # model leaves to timing on this machine included (swiglu on a 2-core Xeon)
    loaded = load_fused(transformers.LlamaForCausalLM.from_pretrained(out), out)
    graph, saved = loaded.autofusion.graphs[0], info.graphs[0]
    assert graph.plan_source == "saved" and graph.engine == saved.engine  # the same engine
    assert [low.key for low in info.engine_results()[0].lowered] == [
        low.key for low in loaded.autofusion.engine_results()[0].lowered
    ]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, want_logits, atol=1e-4)
        assert torch.equal(loaded.generate(ids, **GEN), want_tokens)


def test_safe_mode_rolls_back_a_wrong_kernel_alone(monkeypatch):
    """A kernel that computes a wrong answer (its outputs negated after the real call) fails
    safe mode's comparison on the real activations and is rolled back alone."""
    from graph_autofusion.pipeline import cpu as pipeline_cpu

    real = pipeline_cpu.kernel_functions
    victims: list[str] = []

    def one_wrong(library, groups, options):
        fns = real(library, groups, options)
        name = groups[0].kernel.name
        victims.append(name)
        good = fns[name]

        def wrong(*xs):
            return [-o for o in good(*xs)]

        wrong.kernel = good.kernel
        return {**fns, name: wrong}

    monkeypatch.setattr(pipeline_cpu, "kernel_functions", one_wrong)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(64)
            self.fc = torch.nn.Linear(64, 128)

        def forward(self, x):
            h = self.ln(x)
            return torch.nn.functional.gelu(self.fc(h)) * 2.0 + torch.sigmoid(h).sum(-1, True)

    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(2, 8, 64)
    # onnxruntime's program not far enough ahead of eager for the torch program to be skipped
    # (defaults.TORCH_PROGRAM_BELOW); each fusion's own timing: a tie, kept
    speed = {"onnxruntime": 2.8e-3, "torch": 2.9e-3, "eager": 3e-3}

    def timer(key, side, fn):
        fn()
        return speed.get(side, 1e-3)

    gaf = GraphAutoFusion(m, example_inputs=(x,))
    with use_timer(timer):
        fused = gaf.fuse()
    (result,) = fused.autofusion.results()
    bad = [b for b in result.rolled_back if b.code == "numerics"]
    assert bad, result.rolled_back
    assert all(low.payload.kernel.name not in victims for low in result.lowered), (
        "the wrong kernel stayed"
    )
    with torch.no_grad():
        assert torch.allclose(fused(x), m(x), atol=1e-4)
    # the report is of the engine that runs the graph (onnxruntime, the faster); the torch
    # program's rollback is named as the engine not chosen
    text = gaf.safe_fusion_report()[0].to_text()
    assert fused.autofusion.graphs[0].engine == "onnxruntime"
    assert "engine: onnxruntime (measured on the first call" in text
    assert "torch engine (not chosen): " in text and "(numerics)" in text
    assert gaf.result is fused.autofusion.graphs[0].ort_result


@pytest.mark.parametrize("name", ["phi", "gemma"])
def test_unseen_decoders_fuse_as_drop_in_modules(name):
    from graph_autofusion.testing.small_hf import SMALL_HF

    torch.manual_seed(0)
    model, inputs = SMALL_HF[name]()
    model.eval()
    with torch.no_grad():
        want = model(**inputs).logits
    fused = GraphAutoFusion(model, example_kwargs=inputs).fuse(check_speed=False)
    assert type(fused) is type(model)
    with torch.no_grad():
        got = fused(**inputs).logits
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cos) >= 0.9999


def test_an_audio_model_fuses_without_example_inputs():
    """wav2vec2 (``input_values``, a group-normed convolutional front end): the drop-in
    module builds its own example (a second of 16 kHz audio); it asked for one before."""
    cfg = transformers.Wav2Vec2Config(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        conv_stride=(5, 4, 4),
        conv_kernel=(10, 4, 4),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        feat_extract_norm="group",
    )
    torch.manual_seed(0)
    model = transformers.Wav2Vec2Model(cfg).eval()
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    audio = torch.randn(1, 3000, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(audio).last_hidden_state
        got = fused(audio).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_an_encoder_decoder_and_a_model_with_no_vocabulary_fuse_without_example_inputs():
    """T5 (its decoder needs decoder_input_ids: built from the decoder's start token) and
    CANINE (input_ids are code points: its config has no vocab_size); both asked for
    inputs, T5 with the model's own ValueError."""
    torch.manual_seed(0)
    t5 = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=100,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_heads=4,
            decoder_start_token_id=0,
        )  # fmt: skip
    ).eval()
    canine = transformers.CanineModel(
        transformers.CanineConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            num_hash_buckets=256,
        )  # fmt: skip
    ).eval()
    ids = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    for model, kwargs in (
        (t5, {"input_ids": ids, "decoder_input_ids": ids[:, :5]}),
        (canine, {"input_ids": ids}),
    ):
        fused = GraphAutoFusion(model).fuse(check_speed=False)
        with torch.no_grad():
            want, got = model(**kwargs)[0], fused(**kwargs)[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _tiny_bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    # eager attention: the SDPA form records no attention weights
    return transformers.BertModel._from_config(cfg, attn_implementation="eager").eval()


@pytest.mark.parametrize("first", ["fused", "user", "copy"])
def test_recorded_hidden_states_and_attentions_are_eagers_on_both_modules(first):
    """transformers 5 records hidden states and attentions by hooks it installs on the
    layers on the first call that asks for them, marking only the model object called. The
    fused module shares its layers with the user's (and a copy of it with both): each used to
    install its own, and all then recorded every layer twice (5 hidden states of a 2-layer
    BERT instead of 3). The fused forward keeps the model's signature (generate() reads it)."""
    import copy
    import inspect

    model = _tiny_bert()
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    dup = copy.copy(fused)
    for m in (fused, dup):
        assert inspect.signature(m.forward) == inspect.signature(model.forward)
    ids = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(2))
    kw = dict(input_ids=ids, output_hidden_states=True, output_attentions=True)
    order = {"fused": [fused, model, dup], "user": [model, fused, dup], "copy": [dup, model, fused]}
    order = order[first]
    ref = _tiny_bert()  # a model no fused module shares layers with
    with torch.no_grad():
        want = ref(**kw)
        for m in [*order, *order]:
            got = m(**kw)
            assert len(got.hidden_states) == 3 and len(got.attentions) == 2
            for g, w in zip(
                got.hidden_states + got.attentions,
                want.hidden_states + want.attentions,
                strict=True,
            ):
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    hooks = [len(mod._forward_hooks) for mod in model.modules()]
    assert hooks == [len(mod._forward_hooks) for mod in ref.modules()] and sum(hooks) > 0


def test_an_example_call_the_model_refuses_is_a_clear_error():
    from graph_autofusion.errors import ModelLoadError

    model = tiny_llama()
    with pytest.raises(ModelLoadError, match=r"example call failed in the model itself .* inputs "
                       r"#0 float32\[1, 4\]; give inputs it takes"):  # fmt: skip
        GraphAutoFusion(model, example_inputs=(torch.zeros(1, 4),)).fuse(check_speed=False)


def test_a_fused_module_pickles_copies_and_reloads_fused(tmp_path):
    """``torch.save(fused)`` / ``torch.load`` (here and in a fresh process), ``copy`` and
    ``deepcopy``: the module travels with its plan; the copy runs the saved fusions on the
    saved engines, a deep copy owns its weights, a shallow copy shares them."""
    import copy
    import subprocess
    import sys

    model = tiny_llama()
    ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want_logits = model(ids).logits
        want_tokens = model.generate(ids, **GEN)
    fused = GraphAutoFusion(model, example_inputs=ids).fuse(check_speed=False)
    saved = {g["fingerprint"]: (g["engine"], g["fused"]) for g in fused.autofusion.plan()["graphs"]}
    path = tmp_path / "fused.pt"
    torch.save(fused, path)
    torch._dynamo.reset()
    loaded = torch.load(path, weights_only=False)
    assert type(loaded) is type(model) and loaded.autofusion.graphs == []
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, want_logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(loaded.generate(ids, **GEN), want_tokens)
    again = {
        g["fingerprint"]: (g["engine"], g["fused"]) for g in loaded.autofusion.plan()["graphs"]
    }
    same = saved.keys() & again.keys()  # the graphs both calls met: same engine, same fusions
    assert same and all(saved[k] == again[k] for k in same)
    assert {g.plan_source for g in loaded.autofusion.graphs} >= {"saved"}

    deep, shallow = copy.deepcopy(fused), copy.copy(fused)
    for m in (deep, shallow):
        assert m.autofusion is not fused.autofusion and "forward" in m.__dict__
    weight = fused.lm_head.weight
    assert deep.lm_head.weight is not weight and shallow.lm_head.weight is weight
    with torch.no_grad():
        torch.testing.assert_close(deep(ids).logits, want_logits, atol=1e-4, rtol=1e-4)

    code = (
        "import torch, sys; m = torch.load(sys.argv[1], weights_only=False); "
        "ids = torch.load(sys.argv[2]); print(m(ids).logits.sum().item(), len(m.autofusion.graphs))"
    )
    torch.save(ids, tmp_path / "ids.pt")
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(tmp_path / "ids.pt")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    total, graphs = out.stdout.split()
    assert abs(float(total) - want_logits.sum().item()) < 1e-2 and int(graphs) >= 1


def test_a_fused_module_whose_rule_cannot_pickle_says_which_rule():
    import pickle

    from graph_autofusion.patterns.library import builtin_rules

    rule = builtin_rules().get("bias_gelu")
    own = type(rule)(**{**rule.__dict__, "name": "my_bias_gelu", "checks": (lambda ctx: None,)})
    model = tiny_llama()
    fused = GraphAutoFusion(model, rules=[own]).fuse(check_speed=False)
    with pytest.raises(pickle.PicklingError, match="my_bias_gelu"):
        pickle.dumps(fused)
