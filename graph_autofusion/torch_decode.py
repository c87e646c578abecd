"""Greedy ``generate()`` of a fused causal LM with a decode loop of our own.

Hugging Face's ``generate()`` spends about 0.3 ms of Python per token outside the model
(logits processors, stopping criteria, input preparation), and Dynamo's compiled frame another
0.45 ms (guards, gathering the graph's arguments, rebuilding the outputs and the cache): on a
small decoder that is a fifth of a token. Those two costs are what separated the PyTorch
route's decode from a loop of onnxruntime session runs (``docs/torch.md``).

The loop is not written for one model family. It watches Hugging Face's own ``generate()``
decode the first tokens (:data:`PROBE_TOKENS`) and learns, from the arguments and outputs of
the compiled graph that serves every later step, how one call's arguments follow from the
previous call's:

* ``const``: the same tensor or number (parameters, flags);
* ``feed``: one of the previous call's outputs, the very tensor (the KV cache);
* ``token``: the greedy token, ``argmax`` of an output's last position (the logits);
* ``count``: the previous value plus one (cache position, position ids, symbolic lengths);
* ``grow``: the previous tensor with one more column of ones (the attention mask);
* ``same``: a new tensor equal to the previous one.

Rules learnt between the first two probed calls must predict the third call's arguments
exactly and the last recorded call must be the probe's last step, or the loop is not used
(``generate()`` continues as Hugging Face's, from its cache). The loop runs while Dynamo's
shape guards of the graph pass; a step they refuse (a length threshold: a sliding window)
is Hugging Face's again: the loop writes its state back into the cache object
(:mod:`~graph_autofusion.torch_decode_handoff`, where the cache's entries are known and
checked) and ``generate()`` goes on from there, probing anew past the threshold; without
such a hand-off, the loop is not used. Then each further token is one
call of the compiled graph (its weight checks and fallbacks included) plus an ``argmax``.

Only plain greedy decoding takes the loop: ``max_new_tokens`` given, no sampling, beams,
logits processors, streamers or dictionary outputs (:data:`GREEDY_KEYS` lists the settings the
loop honours), of a model that leaves ``prepare_inputs_for_generation`` to the library (an
override may do between steps what no rule follows: Phi-3 drops its cache at the rotary
switch); anything else is Hugging Face's ``generate()`` unchanged.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from graph_autofusion import torch_decode_handoff as handoff

#: Tokens Hugging Face's generate() decodes before the loop takes over: the prefill, the first
#: decode graph (static cache length), then three calls of the graph with the length symbolic.
PROBE_TOKENS = 5
#: ... and on later calls, once a step is learnt: the prefill and two calls of the decode
#: graph (the learnt rules must predict the second from the first).
KNOWN_PROBE_TOKENS = 3
#: Hand-offs to Hugging Face's generate() one call may make before a length threshold, each
#: followed by a new probe past it (``torch_decode_handoff``).
MAX_HANDOFFS = 4

#: generate() settings (keywords or the model's generation config) the loop honours, with the
#: values it accepts (None: any). Anything else runs Hugging Face's generate().
GREEDY_KEYS: dict[str, Any] = {
    "max_new_tokens": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "bos_token_id": None,
    "do_sample": False,
    "num_beams": 1,
    "use_cache": True,
    "output_attentions": False,
    "output_hidden_states": False,
    "return_dict_in_generate": False,
    # sampling settings greedy decoding ignores
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "_from_model_config": None,
    "transformers_version": None,
}


@dataclass
class Rule:
    """How one argument of a decode call follows from the previous call."""

    kind: str  # const, feed, token, count, grow, same
    src: int = -1  # feed: the output it is; token: the logits output


@dataclass
class StepPlan:
    """A decode step learnt from Hugging Face's calls of one compiled graph."""

    graph: Any  # the CompiledGraph (its __call__ keeps the weight checks and fallbacks)
    rules: list[Rule]
    logits: int  # the output whose last position's argmax is the next token
    #: per argument, how its sizes (a tensor) or value (an int) change per step
    deltas: list[Any] = field(default_factory=list)
    #: Dynamo's shape guards of the graph, compiled on first use (``_guard_code``)
    guards: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        kinds: dict[str, list[int]] = collections.defaultdict(list)
        for i, r in enumerate(self.rules):
            kinds[r.kind].append(i)
        self._feeds = [(i, self.rules[i].src) for i in kinds["feed"]]
        self._tokens, self._counts, self._grows = kinds["token"], kinds["count"], kinds["grow"]

    def advance(self, args: list[Any], outs: Any, token: torch.Tensor) -> list[Any]:
        """The next call's arguments from this call's arguments, outputs and next token."""
        nxt = list(args)
        for i, j in self._feeds:
            nxt[i] = outs[j]
        for i in self._tokens:
            nxt[i] = token
        for i in self._counts:
            nxt[i] = args[i] + 1
        for i in self._grows:
            a = args[i]
            nxt[i] = torch.cat((a, a.new_ones((*a.shape[:-1], 1))), dim=-1)
        return nxt


@dataclass
class DecodeStats:
    """What the loop did over a module's generate() calls (``fused.autofusion.decode``)."""

    calls: int = 0  # generate() calls
    loop_calls: int = 0  # loops run (a call with hand-offs runs several)
    loop_tokens: int = 0  # tokens the loop decoded
    handoffs: int = 0  # times the loop handed its state to generate() before a threshold
    reprobes: int = 0  # times generate() went on from its cache to learn a step again
    last_reason: str = ""  # why the last call that did not use the loop did not
    plans: dict[int, StepPlan] = field(default_factory=dict, repr=False)  # per graph index


class Recorder:
    """Keeps the last compiled-graph calls made on the thread that created it, while it is
    in its backend's ``recorders`` (keyed by thread: concurrent generate() calls on one
    module each record their own thread's calls)."""

    def __init__(self, keep: int = 3) -> None:
        self.thread = threading.get_ident()
        self.calls: collections.deque = collections.deque(maxlen=keep)

    def record(self, graph: Any, args: tuple, outs: Any) -> None:
        self.calls.append((graph, args, outs))


def _argmax_token(out: Any) -> torch.Tensor | None:
    """The greedy token of each row, ``[batch, 1]`` int64 (the first of equal maxima, as
    ``torch.argmax``), or None when ``out`` is not logits-like."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.dim() != 3:
        return None
    last = out[:, -1, :]
    if last.dtype == torch.float32 and last.device.type == "cpu" and not last.requires_grad:
        return torch.from_numpy(last.numpy().argmax(axis=-1)[:, None].astype("int64"))
    return last.argmax(dim=-1, keepdim=True)


def _rule(x: Any, y: Any, outs: Any) -> Rule | None:
    """The rule that makes ``y`` (this call's argument) from ``x`` and ``outs`` (the previous
    call's argument and outputs), or None."""
    if y is x:
        return Rule("const")
    if isinstance(y, bool) or isinstance(x, bool):
        return Rule("const") if x == y else None
    if isinstance(y, int) and isinstance(x, int):
        return Rule("const") if y == x else Rule("count") if y == x + 1 else None
    if not isinstance(y, torch.Tensor) or not isinstance(x, torch.Tensor):
        return None
    for j, o in enumerate(outs):
        if y is o:
            return Rule("feed", j)
    if y.dtype != x.dtype or y.is_floating_point():
        return Rule("same") if y.shape == x.shape and torch.equal(x, y) else None
    if y.dim() == 2 and y.shape[1] == 1 and y.dtype == torch.int64:
        for j, o in enumerate(outs):
            t = _argmax_token(o)
            if t is not None and t.shape == y.shape and torch.equal(t, y):
                return Rule("token", j)
    if y.shape == x.shape:
        if torch.equal(y, x + 1):
            return Rule("count")
        return Rule("same") if torch.equal(x, y) else None
    if (
        y.dim() >= 1
        and y.shape[:-1] == x.shape[:-1]
        and y.shape[-1] == x.shape[-1] + 1
        and torch.equal(y[..., :-1], x)
        and bool((y[..., -1] == 1).all())
    ):
        return Rule("grow")
    return None


def _delta(x: Any, y: Any) -> Any:
    """How ``y``'s sizes (or value) differ from ``x``'s: a tuple, an int, or None (not by 0 or
    1 per dimension)."""
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.dim() != y.dim():
            return None
        d = tuple(b - a for a, b in zip(x.shape, y.shape))
        return d if all(v in (0, 1) for v in d) else None
    if isinstance(x, int) and isinstance(y, int) and not isinstance(x, bool):
        return y - x if y - x in (0, 1) else None
    return 0 if x is y or x == y else None


def first_unguarded_step(plan: StepPlan, args: Sequence[Any], steps: int) -> tuple[int, str]:
    """The first of the next ``steps`` calls whose sizes Dynamo's shape guards for the graph
    would refuse (a length threshold where the model's Python takes another branch, and Dynamo
    would compile another graph), or 0 when none would; the loop bypasses those guards, so it
    runs only when every step passes them. Sizes are simulated (nothing runs), and the guards
    are read from Dynamo once per plan."""
    try:
        return _first_unguarded_step(plan, args, steps)
    except Exception as exc:  # noqa: BLE001 - Dynamo's internals: no loop then
        return 1, f"Dynamo's shape guards could not be evaluated ({type(exc).__name__})"


def _first_unguarded_step(plan: StepPlan, args: Sequence[Any], steps: int) -> tuple[int, str]:
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    if plan.guards is None:
        plan.guards = _guard_code(plan)
    guards = plan.guards
    if isinstance(guards, str):
        return 1, guards
    if not guards:
        return 0, ""
    check, used = guards
    moving = [i for i in used if _moves(plan.deltas[i])]
    named = {f"t{i}": args[i] for i in used}
    for k in range(1, steps + 1):
        for i in moving:
            a, d = args[i], plan.deltas[i]
            if isinstance(a, torch.Tensor):
                named[f"t{i}"] = _Sizes([n + k * v for n, v in zip(a.shape, d)])
            else:
                named[f"t{i}"] = a + k * d
        try:
            ok = eval(check, SYMPY_INTERP, {"L": named})  # noqa: S307 - Dynamo's own guard code
        except AttributeError:  # a guard on more than sizes and strides: real (meta) tensors
            for i in moving:
                if isinstance(named[f"t{i}"], _Sizes):
                    size = named[f"t{i}"].shape
                    named[f"t{i}"] = torch.empty(size, dtype=args[i].dtype, device="meta")
            ok = eval(check, SYMPY_INTERP, {"L": named})  # noqa: S307
        if not ok:
            return k, f"Dynamo's shape guards refuse decode step {k} (a length threshold)"
    return 0, ""


def _guard_code(plan: StepPlan) -> Any:
    """Dynamo's shape guards of the plan's graph, compiled once per plan (reading them from
    the shape environment costs milliseconds): ``(code, the arguments it reads)``, ``()``
    when nothing is guarded, or the reason they cannot be read."""
    from torch._guards import detect_fake_mode

    holders = [
        n.meta.get("example_value") for n in plan.graph.gm.graph.nodes if n.op == "placeholder"
    ]
    if len(holders) != len(plan.rules) or any(h is None for h in holders):
        return "the graph's placeholders carry no example values"
    mode = detect_fake_mode([h for h in holders if isinstance(h, torch.Tensor)])
    if mode is None or mode.shape_env is None:
        return ()  # static shapes: nothing symbolic to guard
    try:
        code = mode.shape_env.produce_guards_expression(holders, ignore_static=True)
    except Exception as exc:  # noqa: BLE001 - Dynamo's internals: no loop then
        return f"Dynamo's shape guards could not be read ({type(exc).__name__})"
    if not code:
        return ()
    used = [i for i in range(len(holders)) if f"L['t{i}']" in code]
    return compile(code, "<decode shape guards>", "eval"), used


class _Sizes:
    """What a decode step's shape guards read of a tensor that is not made yet: its sizes
    and a contiguous layout's strides (the loop's tensors are onnxruntime's or torch's fresh,
    contiguous outputs)."""

    __slots__ = ("shape",)

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim: int | None = None) -> Any:
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= max(n, 1)
        strides = tuple(reversed(out))
        return strides if dim is None else strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    def storage_offset(self) -> int:
        return 0


def _moves(delta: Any) -> bool:
    return any(delta) if isinstance(delta, tuple) else bool(delta)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def learn_step(calls: Any) -> tuple[StepPlan | None, str]:
    """A step plan from the last three calls of one graph, or None and why not."""
    if len(calls) < 3:
        return None, f"{len(calls)} compiled-graph calls seen while probing, need 3"
    (g1, a1, o1), (g2, a2, o2), (g3, a3, o3) = calls
    if not (g1 is g2 is g3):
        return None, (
            "the decode steps ran more than one compiled graph (a graph break, or a variant "
            "Dynamo compiled for a new length: a sliding window's threshold)"
        )
    if not (len(a1) == len(a2) == len(a3)):
        return None, "the decode calls' argument counts differ"
    rules = []
    for i, (x, y) in enumerate(zip(a1, a2)):
        r = _rule(x, y, o1)
        if r is None:
            return None, f"argument {i} of graph {g1.index} follows no rule"
        rules.append(r)
    logits = {r.src for r in rules if r.kind == "token"}
    if len(logits) != 1 or not any(r.kind == "feed" for r in rules):
        return None, "no single token argument and cache fed back: not a KV-cache decode step"
    plan = StepPlan(g1, rules, logits.pop())
    plan.deltas = [_delta(x, y) for x, y in zip(a1, a2)]
    if any(d is None for d in plan.deltas):
        return None, "the arguments' sizes do not grow by 0 or 1 per call"
    why = _mispredicts(plan, a2, o2, a3)  # the next call, its sizes growing by the same steps
    return (None, why) if why else (plan, "")


def _mispredicts(plan: StepPlan, args: Sequence[Any], outs: Any, nxt: Sequence[Any]) -> str:
    """Why ``plan`` does not make the call ``nxt`` from the call (``args``, ``outs``), or ""."""
    if not len(args) == len(nxt) == len(plan.rules):
        return "the decode calls' argument counts differ"
    predicted = plan.advance(list(args), outs, _argmax_token(outs[plan.logits]))
    for i, (r, p, y) in enumerate(zip(plan.rules, predicted, nxt)):
        ok = p is y if r.kind in ("const", "feed") else _same_value(p, y)
        if not ok:
            return f"the rule {r.kind!r} of argument {i} mispredicted the next call"
    if any(d != _delta(x, y) for d, x, y in zip(plan.deltas, args, nxt)):
        return "the arguments' sizes do not grow by the learnt steps"
    return ""


def known_step(plans: dict[int, StepPlan], calls: Any) -> tuple[StepPlan | None, str]:
    """The plan learnt earlier for the graph of the last two calls, when it predicts the
    second from the first, or None and why not."""
    if len(calls) < 2:
        return None, "fewer than two compiled-graph calls seen while probing"
    (g1, a1, o1), (g2, a2, _) = list(calls)[-2:]
    plan = plans.get(g2.index)
    if g1 is not g2 or plan is None or plan.graph is not g2:
        return None, "the decode graph has no learnt step yet"
    why = _mispredicts(plan, a1, o1, a2)
    return (None, why) if why else (plan, "")


def greedy_settings(module: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The generate() settings (model's generation config and the call's keywords), or None
    and why the loop cannot honour them."""
    config = getattr(module, "generation_config", None)
    settings = dict(config.to_diff_dict()) if config is not None else {}
    settings.update(kwargs)
    for key, value in settings.items():
        if key == "max_length" and isinstance(settings.get("max_new_tokens"), int):
            continue  # generate() lets max_new_tokens take precedence over it
        if key not in GREEDY_KEYS:
            return None, f"generate() setting {key!r}"
        want = GREEDY_KEYS[key]
        if want is not None and value != want:
            return None, f"generate() setting {key}={value!r}"
    if not isinstance(settings.get("max_new_tokens"), int):
        return None, "no max_new_tokens"
    return settings, ""


#: Why a model whose class overrides ``prepare_inputs_for_generation`` keeps Hugging Face's loop.
OWN_INPUTS = (
    "the model prepares its own generate() inputs (prepare_inputs_for_generation overridden: "
    "Phi-3 drops its cache at the rotary switch, which the loop would not)"
)


def _prepares_own_inputs(module: Any) -> bool:
    """Whether the model's class overrides ``prepare_inputs_for_generation``: Python that
    runs between the steps and may do what no learnt rule follows (Phi-3 and PhiMoE drop the
    cache and decode the whole sequence again when it passes the rotary switch length)."""
    try:
        from transformers import GenerationMixin
    except ImportError:  # pragma: no cover - the loop serves Hugging Face models only
        return True
    own = getattr(type(module), "prepare_inputs_for_generation", None)
    return own is not GenerationMixin.prepare_inputs_for_generation


def _eos_ids(settings: dict[str, Any]) -> list[int]:
    eos = settings.get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in torch.as_tensor(eos).flatten().tolist()]


def generate(module: Any, backend_config: Any, stats: DecodeStats, *args: Any, **kwargs: Any):
    """``module.generate(*args, **kwargs)``, greedy decoding finished by the loop where it can
    be; otherwise the class's own ``generate()``."""
    stats.calls += 1
    return _generate(module, backend_config, stats, args, kwargs)


def _generate(
    module: Any,
    backend_config: Any,
    stats: DecodeStats,
    args: tuple,
    kwargs: dict[str, Any],
    resume: dict[str, Any] | None = None,
    depth: int = 0,
) -> Any:
    """:func:`generate`; ``resume``: ``{cache key: cache}`` a hand-off goes on from (``args``
    then hold the whole sequence so far and ``kwargs`` its mask), ``depth`` hand-offs made."""
    hf_generate = type(module).generate
    given = dict(kwargs, **(resume or {}))  # what Hugging Face's generate() is called with
    ids = args[0] if args else kwargs.get("input_ids")
    rest = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask")}
    settings, why = greedy_settings(module, rest)
    if settings is not None and _prepares_own_inputs(module):
        settings, why = None, OWN_INPUTS
    if settings is None or len(args) > 1 or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        stats.last_reason = why or "input_ids not a [batch, length] tensor"
        return hf_generate(module, *args, **given)
    n = settings["max_new_tokens"]
    eos = _eos_ids(settings)
    pad = settings.get("pad_token_id")
    if n <= PROBE_TOKENS or (eos and pad is None and ids.shape[0] > 1):
        stats.last_reason = f"{n} new tokens" if n <= PROBE_TOKENS else "eos without pad"
        return hf_generate(module, *args, **given)
    one_row_or_no_eos = ids.shape[0] == 1 or not eos
    probe_n = KNOWN_PROBE_TOKENS if stats.plans and one_row_or_no_eos else PROBE_TOKENS
    recorder = Recorder()
    backend_config.recorders[recorder.thread] = recorder
    try:
        out = hf_generate(
            module, *args, **dict(given, max_new_tokens=probe_n, return_dict_in_generate=True)
        )
        plan, why = (
            known_step(stats.plans, recorder.calls) if probe_n < PROBE_TOKENS else (None, "")
        )
        key = _cache_key(out)
        if (
            plan is None
            and probe_n < PROBE_TOKENS
            and not _ended(out, ids, eos, probe_n)
            and _resumable(getattr(out, key))
        ):
            # another graph than the one learnt: Hugging Face decodes the rest of the probe
            more = dict(kwargs, return_dict_in_generate=True)
            cache = {key: getattr(out, key)}
            out = _continue(
                module, ids, out.sequences, cache, more, PROBE_TOKENS - probe_n, settings
            )
            del cache
            probe_n = PROBE_TOKENS
    finally:
        backend_config.recorders.pop(recorder.thread, None)
    seq = out.sequences
    cache_key = _cache_key(out)
    cache = getattr(out, cache_key)
    plen = ids.shape[1]
    done = _finished(seq[:, plen:], eos)
    if _ended(out, ids, eos, probe_n):
        stats.last_reason = "finished while probing"
        return seq
    if plan is None and probe_n == PROBE_TOKENS:
        plan, why = learn_step(list(recorder.calls))
    last = recorder.calls[-1] if plan is not None else None
    if plan is not None and not _is_last_step(plan, last, seq):
        plan, why = None, "the last recorded call is not the probe's last decode step"
    steps, paths = n - probe_n, None
    # Hugging Face's generate() may go on from its cache for another level of this one: a
    # row that ends is carried to no next level, and RWKV's list is no cache it takes back
    may_resume = depth < MAX_HANDOFFS and one_row_or_no_eos and _resumable(cache)
    if plan is not None:
        step, why = first_unguarded_step(plan, last[1], steps)
        if step:  # the loop up to the step before, then Hugging Face's from its cache
            if step == 1:
                paths, more_why = None, ""
            elif not may_resume:
                paths, more_why = (
                    None,
                    (
                        f"no hand-off ({depth} made, or rows that may end, or a state generate() "
                        f"cannot resume)"
                    ),
                )
            else:
                paths, more_why = _handoff(plan, last, seq, cache)
            plan, steps = (plan, step - 1) if paths else (None, steps)
            why = f"{why}; {more_why}" if more_why else why
    if plan is None:
        last = None
        recorder.calls.clear()
        stats.last_reason = why
        if (eos and bool(done.any())) or not _resumable(cache):
            # a row ended while probing (HF would not know it), or a model state generate()
            # takes back only from its own loop (RWKV's list): Hugging Face's from the start
            del out, cache
            return hf_generate(module, *args, **given)
        if may_resume and n - probe_n > PROBE_TOKENS:
            # Hugging Face's generate() goes on from its cache and probes anew: past a
            # threshold the probe crossed, or the step the guards refused first, a step may
            # be learnt again
            del out
            stats.reprobes += 1
            return _resume(module, backend_config, stats, ids, seq, {cache_key: cache},
                           kwargs, n - probe_n, settings, depth)  # fmt: skip
        return _continue(module, ids, seq, {cache_key: cache}, kwargs, n - probe_n, settings)
    # the probe's tensors go: the loop holds one step's arguments and outputs at a time
    # (and, for a hand-off, the emptied cache object it writes back into)
    state = [list(last[1]), last[2]]
    del out, last
    if paths is None:
        del cache
    else:  # the cache's entries are written back after the loop: its old tensors go now
        handoff.write_back(paths, cache, [None] * len(plan.rules))
    recorder.calls.clear()
    stats.plans[plan.graph.index] = plan
    stats.loop_calls += 1
    serve = getattr(plan.graph, "serve_loop", None)
    if serve is not None:
        serve()
    final: list[Any] = []
    with torch.no_grad():
        tokens = _loop(plan, state, seq[:, -1:], steps, eos, pad, done, final)
    stats.loop_tokens += tokens.shape[1]
    seq = torch.cat((seq, tokens), dim=-1)
    left = n - probe_n - tokens.shape[1]
    ended = bool((done | _finished(tokens, eos)).all())  # every row, its last token included
    if paths is None or left <= 0 or ended:
        return seq
    handoff.write_back(paths, cache, plan.advance(*final))
    final.clear()  # the loop's last arguments (the cache one token shorter) go
    stats.handoffs += 1
    return _resume(
        module, backend_config, stats, ids, seq, {cache_key: cache}, kwargs, left, settings, depth
    )


def _resume(module, backend_config, stats, ids, seq, cache, kwargs, left, settings, depth):
    """:func:`_generate` for ``left`` more tokens after ``seq`` from ``cache`` (``{key:
    cache object}``)."""
    more = _going_on(ids, seq, kwargs, left, settings)
    return _generate(module, backend_config, stats, (seq,), more, cache, depth + 1)


def _handoff(plan: StepPlan, last: Any, seq: torch.Tensor, cache: Any) -> tuple[Any, str]:
    """Where the loop's state goes in Hugging Face's ``cache`` when it stops before a length
    threshold (``torch_decode_handoff``), or None and why not."""
    paths, why = handoff.cache_paths(plan.graph, [r.kind for r in plan.rules])
    if not paths:
        return None, why
    nxt = plan.advance(list(last[1]), last[2], seq[:, -1:])
    if not handoff.agrees(paths, cache, nxt):
        return None, "the cache does not hold what the learnt step predicts"
    return paths, ""


def _cache_key(out: Any) -> str:
    """The name of a generate() output's cache (``cache``; ``past_key_values`` before 5.x)."""
    return "cache" if getattr(out, "cache", None) is not None else "past_key_values"


def _resumable(cache: Any) -> bool:
    """Whether generate() may be handed ``cache`` back as ``past_key_values``: anything but a
    plain list (RWKV's state, which generate() refuses there; a cache object, a legacy tuple
    or None it takes)."""
    return not isinstance(cache, list)


def _ended(out: Any, ids: torch.Tensor, eos: list[int], probed: int) -> bool:
    """Whether a probe's generate() ended early, or every row has ended."""
    new = out.sequences[:, ids.shape[1] :]
    return new.shape[1] < probed or bool(_finished(new, eos).all())


def _is_last_step(plan: StepPlan, last: Any, seq: torch.Tensor) -> bool:
    """Whether ``last`` is the probe's last decode call: it was fed the token before the
    last, and its logits give the last."""
    fed = [last[1][i] for i, r in enumerate(plan.rules) if r.kind == "token"]
    made = _argmax_token(last[2][plan.logits])
    return all(torch.equal(t, seq[:, -2:-1]) for t in fed) and torch.equal(made, seq[:, -1:])


def _prompt_mask(ids: torch.Tensor, settings: dict[str, Any]) -> torch.Tensor:
    """The attention mask Hugging Face's generate() makes for a prompt given without one
    (``_prepare_attention_mask_for_generation``): pad tokens masked when the pad token is in
    the prompt and is not an end-of-sequence token, else all ones."""
    pad = settings.get("pad_token_id")
    ones = torch.ones(ids.shape[:2], dtype=torch.long)
    if pad is None or not bool((ids == pad).any()) or int(pad) in _eos_ids(settings):
        return ones
    return ids.ne(pad).long()


def _continue(module, ids, seq, cache: dict, kwargs: dict, n: int, settings: dict) -> Any:
    """Hugging Face's generate() decoding ``n`` more tokens after ``seq`` (``ids`` and the
    tokens decoded so far) from its cache."""
    more = _going_on(ids, seq, kwargs, n, settings)
    return type(module).generate(module, seq, **more, **cache)


def _going_on(ids, seq, kwargs: dict, n: int, settings: dict) -> dict[str, Any]:
    """The call's keywords for ``n`` more tokens after ``seq`` (``ids`` and the tokens
    decoded so far), with the mask the uninterrupted generate() would hold (the prompt's,
    then ones): given explicitly, so a decoded token that happens to be the pad token is not
    masked as padding."""
    mask = kwargs.get("attention_mask")
    mask = _prompt_mask(ids, settings) if mask is None else mask
    grown = mask.new_ones((mask.shape[0], seq.shape[1] - mask.shape[1]))
    more = dict(kwargs, max_new_tokens=n, attention_mask=torch.cat((mask, grown), dim=-1))
    more.pop("input_ids", None)
    return more


def _finished(generated: torch.Tensor, eos: list[int]) -> torch.Tensor:
    if not eos:
        return torch.zeros(generated.shape[0], dtype=torch.bool)
    return torch.isin(generated, torch.tensor(eos)).any(dim=1)


def _loop(plan, state, token, n, eos, pad, done, final=None) -> torch.Tensor:
    """``n`` more greedy tokens (fewer when every row has ended), as Hugging Face's greedy
    search makes them: an ended row gets ``pad``. ``state``: the last probed call's
    arguments and outputs (emptied: only the loop refers to them); ``final``, a list: given
    the last call's arguments, outputs and token."""
    args, outs = state
    state.clear()
    eos_t = torch.tensor(eos) if eos else None
    new = []
    for _ in range(n):
        args = plan.advance(args, outs, token)
        outs = plan.graph(*args)
        token = _argmax_token(outs[plan.logits])
        if eos_t is not None:
            if pad is not None:
                token = torch.where(done[:, None], torch.full_like(token, pad), token)
            done = done | torch.isin(token[:, 0], eos_t)
        new.append(token)
        if bool(done.all()):
            break
    if final is not None:
        final[:] = [args, outs, token]
    return torch.cat(new, dim=-1)
