"""The drop-in module's ``generate()``: greedy decoding finished by our own decode loop
(``graph_autofusion/torch_decode.py``), which must give Hugging Face's tokens exactly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graph_autofusion import GraphAutoFusion, torch_decode  # noqa: E402
from graph_autofusion.runtime.ort_core import SPIN_TAIL_US  # noqa: E402
from graph_autofusion.testing.small_hf import SMALL_HF, tiny_causal_lm, tiny_llama  # noqa: E402

pytestmark = pytest.mark.xdist_group("torch_compile")
GREEDY = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _prompt(n: int, seed: int, batch: int = 1, vocab: int = 1000):
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama_pair():
    torch._dynamo.reset()
    model = tiny_llama()
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    return model, fused


def test_the_loop_gives_eager_tokens_on_two_prompt_lengths(llama_pair):
    model, fused = llama_pair
    stats = fused.autofusion.decode
    for n, seed, mask in ((16, 1, False), (9, 2, True)):
        ids = _prompt(n, seed)
        kw = dict(GREEDY, max_new_tokens=24)
        if mask:
            kw["attention_mask"] = torch.ones_like(ids)
        with torch.no_grad():
            want = model.generate(ids, **kw)
        before, known = stats.loop_tokens, bool(stats.plans)
        got = fused.generate(ids, **kw)
        assert torch.equal(got, want)
        probe = torch_decode.KNOWN_PROBE_TOKENS if known else torch_decode.PROBE_TOKENS
        assert stats.loop_tokens - before in (24 - probe, 24 - torch_decode.PROBE_TOKENS)
    # one compiled graph served every token the loop decoded, none in eager
    (plan,) = stats.plans.values()
    assert plan.graph.fallback is None and plan.graph.calls >= 2 * 19
    kinds = {r.kind for r in plan.rules}
    assert {"token", "feed", "const", "count"} <= kinds


#: the bounded spinning tail of a ``run`` session, as its config entry reads
TAIL = str(SPIN_TAIL_US)


def _spinning(graph) -> list[tuple]:
    """(allow_spinning, spin_duration_us) of each onnxruntime session of ``graph`` (None for
    an entry never set: onnxruntime's own spinning tail)."""
    out = []
    for ort in graph._orts:
        opts = ort.session.get_session_options()
        entries = []
        for key in ("session.intra_op.allow_spinning", "session.intra_op.spin_duration_us"):
            try:
                entries.append(opts.get_session_config_entry(key))
            except Exception:  # noqa: BLE001 - onnxruntime raises for an entry never set
                entries.append(None)
        out.append(tuple(entries))
    return out


def test_the_loop_s_graph_keeps_its_workers_spinning_between_calls(llama_pair):
    """spinning="auto": a graph serving the decode loop (calls back to back) spins between
    calls; the prefill graph keeps its bounded spinning tail. An explicit "run" stays."""
    model, fused = llama_pair
    ids = _prompt(12, 5)
    kw = dict(GREEDY, max_new_tokens=10)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    assert torch.equal(fused.generate(ids, **kw), want)
    loop_graphs = [p.graph for p in fused.autofusion.decode.plans.values()]
    assert loop_graphs and all(g._orts for g in loop_graphs)
    assert all(s == ("1", None) for g in loop_graphs for s in _spinning(g))
    others = [g for g in fused.autofusion.backend.config.graphs if g not in loop_graphs]
    assert any(g._orts for g in others)
    assert all(s == ("1", TAIL) for g in others for s in _spinning(g))

    from graph_autofusion.options import FuseOptions

    torch._dynamo.reset()
    run = GraphAutoFusion(
        model, options=FuseOptions(target="cpu", check_speed=False, spinning="run")
    ).fuse()
    assert torch.equal(run.generate(ids, **kw), want)
    (plan,) = run.autofusion.decode.plans.values()
    assert plan.graph._orts and all(s == ("1", TAIL) for s in _spinning(plan.graph))


def _late_token(generated) -> int:
    """A token first made after the probe (the loop, not Hugging Face, must stop on it)."""
    seen = generated[: torch_decode.PROBE_TOKENS + 1].tolist()
    for t in generated[torch_decode.PROBE_TOKENS + 1 :].tolist():
        if t not in seen:
            return t
        seen.append(t)
    raise AssertionError("the model repeats itself: pick another prompt")


def test_later_calls_probe_fewer_tokens_with_the_learnt_step(llama_pair):
    """Once a step is learnt, a call's probe is the prefill and two decode calls (the rules
    must predict the second from the first); the tokens stay eager's."""
    model, fused = llama_pair
    stats = fused.autofusion.decode
    kw = dict(GREEDY, max_new_tokens=18)
    for k, (n, seed) in enumerate(((14, 11), (14, 12), (5, 13))):
        ids = _prompt(n, seed)
        with torch.no_grad():
            want = model.generate(ids, **kw)
        before = stats.loop_tokens
        assert torch.equal(fused.generate(ids, **kw), want)
        if k:  # the first call learnt the step of this call's graph (or knew it already)
            assert stats.loop_tokens - before == 18 - torch_decode.KNOWN_PROBE_TOKENS
    # two rows: another decode graph than the one learnt at one row; Hugging Face decodes
    # the rest of the probe from its cache, and the step is learnt for this graph
    ids = _prompt(9, 14, batch=2)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    before, graphs = stats.loop_tokens, len(stats.plans)
    assert torch.equal(fused.generate(ids, **kw), want)
    assert stats.loop_tokens - before == 18 - torch_decode.PROBE_TOKENS, stats.last_reason
    assert len(stats.plans) == graphs + 1


def test_the_loop_stops_at_eos_and_pads_ended_rows_as_generate_does(llama_pair):
    model, fused = llama_pair
    stats = fused.autofusion.decode
    ids = _prompt(12, 5)
    with torch.no_grad():
        free = model.generate(ids, **dict(GREEDY, max_new_tokens=20))
    kw = dict(GREEDY, max_new_tokens=20, eos_token_id=_late_token(free[0, 12:]))
    with torch.no_grad():
        want = model.generate(ids, **kw)
    loops = stats.loop_calls
    got = fused.generate(ids, **kw)
    assert torch.equal(got, want) and got.shape[1] < 12 + 20
    assert stats.loop_calls == loops + 1

    # two rows, the first left-padded: a row that ends gets the pad token from then on
    batch = _prompt(10, 6, batch=2)
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    batch[0, :3] = 0
    with torch.no_grad():
        free = model.generate(batch, attention_mask=mask, **dict(GREEDY, max_new_tokens=16))
    eos = _late_token(free[0, 10:])
    kw = dict(GREEDY, max_new_tokens=16, eos_token_id=eos, attention_mask=mask)
    with torch.no_grad():
        want = model.generate(batch, **kw)
    assert (want[0, 10:] == 0).any()  # the first row ended and was padded
    assert torch.equal(fused.generate(batch, **kw), want)
    assert stats.loop_calls == loops + 2


def test_a_saved_max_length_gives_way_to_max_new_tokens():
    model = tiny_llama()
    model.generation_config.max_length = 4096  # as many saved generation configs have
    settings, why = torch_decode.greedy_settings(model, dict(GREEDY, max_new_tokens=9))
    assert settings is not None and settings["max_new_tokens"] == 9, why
    settings, why = torch_decode.greedy_settings(model, dict(GREEDY))
    assert settings is None and "max_length" in why


def test_settings_the_loop_does_not_honour_run_generate_unchanged(llama_pair):
    model, fused = llama_pair
    stats = fused.autofusion.decode
    ids = _prompt(11, 7)
    kw = dict(GREEDY, max_new_tokens=12, repetition_penalty=1.3)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    loops = stats.loop_calls
    assert torch.equal(fused.generate(ids, **kw), want)
    assert stats.loop_calls == loops and "repetition_penalty" in stats.last_reason


def test_when_no_step_is_learnt_generate_goes_on_from_its_cache(llama_pair, monkeypatch):
    model, fused = llama_pair
    stats = fused.autofusion.decode
    monkeypatch.setattr(torch_decode, "learn_step", lambda calls: (None, "forced"))
    monkeypatch.setattr(torch_decode, "known_step", lambda plans, calls: (None, "forced"))
    ids = _prompt(13, 8)
    for kw in (
        dict(GREEDY, max_new_tokens=15),
        dict(GREEDY, max_new_tokens=15, attention_mask=torch.ones_like(ids)),
    ):
        with torch.no_grad():
            want = model.generate(ids, **kw)
        loops = stats.loop_calls
        assert torch.equal(fused.generate(ids, **kw), want)
        assert stats.loop_calls == loops and stats.last_reason == "forced"


def test_the_continuation_does_not_mask_a_decoded_pad_token(llama_pair, monkeypatch):
    """Without a mask from the caller, Hugging Face infers one from the pad token: the
    continuation from the probe's cache must not mask a decoded token that is the pad."""
    model, fused = llama_pair
    monkeypatch.setattr(torch_decode, "learn_step", lambda calls: (None, "forced"))
    monkeypatch.setattr(torch_decode, "known_step", lambda plans, calls: (None, "forced"))
    ids = _prompt(10, 21)
    with torch.no_grad():
        free = model.generate(ids, **dict(GREEDY, max_new_tokens=8))
    pad = int(free[0, 10 + 2])  # a token the probe decodes
    assert not bool((ids == pad).any())
    kw = dict(GREEDY, max_new_tokens=14, pad_token_id=pad)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    assert torch.equal(fused.generate(ids, **kw), want)


def test_only_decoder_only_models_with_the_library_generate_get_the_loop():
    from graph_autofusion.torch_module import _can_generate

    t5 = transformers.T5ForConditionalGeneration(
        transformers.T5Config(vocab_size=100, d_model=32, d_ff=64, num_layers=1, num_heads=2)
    )
    assert _can_generate(tiny_llama()) and not _can_generate(t5)
    assert not _can_generate(torch.nn.Linear(2, 2))


def test_another_family_decodes_through_the_loop():
    model, inputs = SMALL_HF["gpt_neox"]()
    model.eval()
    fused = GraphAutoFusion(model, example_kwargs=inputs).fuse(check_speed=False)
    ids = _prompt(7, 9)
    kw = dict(GREEDY, max_new_tokens=14, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        want = model.generate(ids, **kw)
    assert torch.equal(fused.generate(ids, **kw), want)
    assert fused.autofusion.decode.loop_tokens == 14 - torch_decode.PROBE_TOKENS


class _Graph:
    index = 0


def test_a_step_whose_rules_mispredict_is_not_learnt():
    g, w = _Graph(), torch.ones(3)
    cache = [torch.zeros(1, 1, k, 2) for k in (4, 5, 6, 7)]
    logits = [torch.tensor([[[0.0, 1.0, 0.0]]]), torch.tensor([[[2.0, 0.0, 0.0]]])] * 2

    def call(i, pos):
        args = (torch.tensor([[[7, 1, 0][i]]]), w, torch.tensor([[pos]]), cache[i])
        return (g, args, (logits[i], cache[i + 1]))

    calls = [call(0, 4), call(1, 5), call(2, 6)]
    plan, why = torch_decode.learn_step(calls)
    assert plan is not None and [r.kind for r in plan.rules] == ["token", "const", "count", "feed"]
    calls[2] = call(2, 9)  # the position jumps: "count" mispredicts the third call
    plan, why = torch_decode.learn_step(calls)
    assert plan is None and "'count' of argument 2 mispredicted" in why
    plan, why = torch_decode.learn_step([calls[0], calls[1], (_Graph(), *calls[2][1:])])
    assert plan is None and "graph break" in why


def _mistral(window: int):
    return tiny_causal_lm(
        "MistralConfig", "MistralForCausalLM", num_key_value_heads=2, sliding_window=window
    )


def test_a_length_threshold_in_dynamo_guards_hands_the_loop_back_to_generate():
    """Sliding-window attention takes another branch once the cache passes the window:
    Dynamo guards the decode graph on the length, and the loop (which bypasses Dynamo's
    guards) must not run past it: it runs to the step before, writes its state back into
    Hugging Face's cache, and generate() goes on from there (probing anew past it)."""
    model = _mistral(window=20)
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    stats = fused.autofusion.decode
    ids = _prompt(10, 1)
    kw = dict(GREEDY, max_new_tokens=24)  # the cache passes the window of 20
    with torch.no_grad():
        want = model.generate(ids, **kw)
    assert torch.equal(fused.generate(ids, **kw), want)
    assert stats.handoffs >= 1 and stats.loop_tokens > 0, stats
    # the graph of the step where the window fills holds only at that cache length: its
    # export fixes the length Dynamo left symbolic (it had failed, and the graph ran eager)
    graphs = fused.autofusion.backend.config.graphs
    assert [g.index for g in graphs if g.fallback is not None] == []
    pinned = [p.sizes for g in graphs for p in g._programs if p.sizes]
    assert pinned and all(axis == 2 and v >= 18 for s in pinned for _, axis, v in s), pinned
    kw = dict(GREEDY, max_new_tokens=8)  # within the window: the loop decodes
    ids = _prompt(6, 2)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    calls = stats.loop_calls
    assert torch.equal(fused.generate(ids, **kw), want)
    assert stats.loop_calls == calls + 1, stats.last_reason
    plan = stats.plans[min(stats.plans)]  # the graph before the window fills
    assert isinstance(plan.guards, tuple) and plan.guards  # read from Dynamo once, then kept
    step, why = torch_decode.first_unguarded_step(plan, _last_args(plan, ids, 8), 24)
    assert 0 < step <= 24 and "length threshold" in why, (step, why)


def _last_args(plan, ids, decoded):
    """Arguments of a decode call after ``decoded`` tokens of prompt ``ids``: the plan's
    example arguments (Dynamo's placeholders) at that cache length."""
    holders = [n.meta["example_value"] for n in plan.graph.gm.graph.nodes if n.op == "placeholder"]
    length = ids.shape[1] + decoded - 1
    args = []
    for h, d in zip(holders, plan.deltas):
        if isinstance(h, torch.Tensor):
            shape = [length if v else int(n) for n, v in zip(h.shape, d)]
            args.append(torch.zeros(shape, dtype=h.dtype))
        else:
            args.append(length if d else h)
    return args


def test_guard_sizes_have_a_contiguous_tensors_strides():
    for shape in [(1, 8, 0, 64), (2, 3, 4), (5,), ()]:
        t = torch.empty(shape, device="meta")
        s = torch_decode._Sizes(shape)
        assert s.stride() == t.stride() and s.size() == t.size() and s.dim() == t.dim()
        assert all(s.stride(i) == t.stride(i) for i in range(t.dim()))


def test_a_state_that_is_no_cache_object_regenerates_instead_of_resuming():
    """RWKV's generate() carries its recurrent state as a plain list, which generate() does not
    take back as ``past_key_values``: with no step learnt, the drop-in module's generate()
    must give eager's tokens (Hugging Face's generate() from the start), not raise."""
    model = tiny_causal_lm(
        "RwkvConfig", "RwkvForCausalLM", hidden_size=64, attention_hidden_size=64,
        intermediate_size=128, context_length=256,
    )  # fmt: skip
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    for n in (5, 8):
        ids = _prompt(n, seed=n)
        want = model.generate(ids, max_new_tokens=9, do_sample=False)
        assert torch.equal(fused.generate(ids, max_new_tokens=9, do_sample=False), want)
    assert fused.autofusion.decode.loop_calls == 0  # the case under test: nothing learnt


def test_hand_offs_across_a_window_give_eager_tokens_for_several_prompts():
    model = _mistral(window=12)
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    stats = fused.autofusion.decode
    cases = [(_prompt(4, 3), 30, None), (_prompt(7, 4), 20, None)]
    padded = _prompt(9, 5, batch=2)
    mask = torch.ones_like(padded)
    mask[1, :3] = 0  # the second row left-padded
    cases.append((padded, 24, mask))
    for ids, n, m in cases:
        kw = dict(GREEDY, max_new_tokens=n)
        if m is not None:
            kw["attention_mask"] = m
        with torch.no_grad():
            want = model.generate(ids, **kw)
        assert torch.equal(fused.generate(ids, **kw), want), (ids.shape, n)
    assert stats.handoffs >= 2 and stats.loop_tokens >= 20, stats


class _Layer:
    def __init__(self, keys, length):
        self.keys, self.cumulative_length = keys, length


class _Cache:
    def __init__(self, *layers):
        self.layers = list(layers)


class _Sourced:
    index = 0

    def __init__(self, sources):
        self.sources = sources


def test_hand_off_paths_come_from_dynamos_sources_and_are_checked():
    from graph_autofusion import torch_decode_handoff as handoff

    sources = [
        "L['kwargs']['input_ids']",
        "L['args'][0]._modules['lin']._parameters['weight']",
        "L['kwargs']['cache'].layers[0].cumulative_length",
        "L['kwargs']['cache'].layers[0].keys.size()[2]",
        "L['kwargs']['cache'].layers[0].keys",
    ]
    kinds = ["token", "const", "count", "count", "feed"]
    paths, why = handoff.cache_paths(_Sourced(sources), kinds)
    assert why == "" and [i for i, _ in paths] == [2, 4]
    k0, k1 = torch.zeros(1, 2, 5, 4), torch.ones(1, 2, 6, 4)
    cache = _Cache(_Layer(k1, 6))
    nxt = [None, None, 6, 6, k1]
    assert handoff.agrees(paths, cache, nxt)
    assert not handoff.agrees(paths, cache, [None, None, 7, 6, k1])  # a stale length
    assert not handoff.agrees(paths, _Cache(_Layer(k0, 6)), nxt)  # a stale tensor
    handoff.write_back(paths, cache, [None, None, 7, 7, k0])
    assert cache.layers[0].keys is k0 and cache.layers[0].cumulative_length == 7
    # an argument that changes per step and is neither in the cache nor remade by
    # generate() (a module's own counter) refuses the hand-off
    moved = [*sources, "L['args'][0].step_counter"]
    paths, why = handoff.cache_paths(_Sourced(moved), [*kinds, "count"])
    assert paths == [] and "step_counter" in why


def test_an_end_token_on_the_loops_last_step_before_a_hand_off_ends_the_row():
    window, plen, n = 12, 3, 18
    model = _mistral(window=window)
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    base = dict(do_sample=False, pad_token_id=0, max_new_tokens=n)
    warm = _prompt(plen, 1)
    fused.generate(warm, eos_token_id=None, attention_mask=torch.ones_like(warm), **base)
    k = window - plen - 2  # the loop's last token before the hand-off (a probe of 3)
    for seed in range(1000, 1200):  # a prompt whose token k appears there first
        ids = _prompt(plen, seed)
        with torch.no_grad():
            free = model.generate(
                ids, eos_token_id=None, attention_mask=torch.ones_like(ids), **base
            )
        new = free[0, plen:].tolist()
        if new[k] not in new[:k]:
            break
    kw = dict(base, eos_token_id=new[k], attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        want = model.generate(ids, **kw)
    assert want.shape[1] == plen + k + 1  # eager stops at that token
    assert torch.equal(fused.generate(ids, **kw), want)


def test_a_model_that_prepares_its_own_inputs_keeps_hugging_faces_loop():
    # Phi-3 with longrope drops its cache and decodes the whole sequence again once it passes
    # the rotary switch length (its prepare_inputs_for_generation): no learnt rule follows that
    model = tiny_causal_lm(
        "Phi3Config",
        "Phi3ForCausalLM",
        num_key_value_heads=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=256,
        original_max_position_embeddings=16,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0] * 16,
            "long_factor": [4.0] * 16,
            "original_max_position_embeddings": 16,
        },
    )
    fused = GraphAutoFusion(model).fuse(check_speed=False)
    ids = _prompt(12, 142)
    kw = dict(GREEDY, max_new_tokens=22, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        want = model.generate(ids, **kw)
    assert torch.equal(fused.generate(ids, **kw), want)
    stats = fused.autofusion.decode
    assert stats.loop_tokens == 0 and "prepares its own generate() inputs" in stats.last_reason
