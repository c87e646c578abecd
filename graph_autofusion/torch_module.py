"""Drop-in fused PyTorch modules: ``GraphAutoFusion(module).fuse()`` for ``torch.nn.Module``.

    fused = GraphAutoFusion(model).fuse()           # same class, same call signature
    fused.generate(ids, max_new_tokens=50)          # Hugging Face models keep generate()
    fused.save_pretrained("out")                    # weights + autofusion_plan.json
    fused = load_fused(AutoModelForCausalLM.from_pretrained("out"), "out")   # same fusions
    torch.save(fused, "f.pt"); torch.load("f.pt", weights_only=False)   # module + plan

The fused module is a shallow copy of the user's module (the weights are shared, the module
itself is not modified) whose ``forward`` is ``torch.compile(..., backend=<autofusion>)``.
``fuse()`` calls it once on the example inputs, so every graph of that call is compiled,
verified (safe mode: each kernel against its unfused operators on the real activations,
the whole graph against eager) and reported before ``fuse()`` returns; graphs of later calls
(a generate's decode steps) compile on their first call the same way.

The saved plan lists, per compiled graph, a fingerprint of its operators and the fused
groups kept; :func:`load_fused` hands it to the backend, which applies exactly those groups to
the graph with the same fingerprint (matching runs again to find the nodes; the planner's
choice is replaced by the saved one; safe mode checks their numerics but does not time them
again, so timing noise cannot change a saved plan) and plans afresh only a graph it has no
entry for.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import statistics
import types
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from graph_autofusion import defaults, torch_decode
from graph_autofusion.errors import GraphAutoFusionError, ModelLoadError
from graph_autofusion.frontend.loader import as_args
from graph_autofusion.options import FuseOptions
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.patterns.rules import RuleSet
from graph_autofusion.runtime.timing import round_robin
from graph_autofusion.torch_compile import graph_fingerprint, make_backend
from graph_autofusion.torch_outputs import output_tensors
from graph_autofusion.verify.compare import compare_tensors

PLAN_FILE = "autofusion_plan.json"
PLAN_VERSION = 1
#: Samples of the example raw-audio input (``input_values``: wav2vec2, HuBERT, WavLM): one
#: second at 16 kHz, long enough for their convolutional front ends (a 400-sample receptive
#: field)
AUDIO_SAMPLES = 16000
#: The id range of generated token ids for a model whose config has no ``vocab_size`` (bytes).
NO_VOCAB_IDS = 256


def example_inputs_for(module: torch.nn.Module, seq_len: int = 16) -> dict[str, torch.Tensor]:
    """Example inputs of a Hugging Face model built from its config: token ids within the
    vocabulary (bytes, :data:`NO_VOCAB_IDS`, for a model whose config has none: CANINE's code
    points) with an all-ones mask, and decoder ids from the decoder's start token for an
    encoder-decoder; images of the configured size; or a second of audio.

    Raises:
        ModelLoadError: the module is not a Hugging Face model with a known input kind.
    """
    config = getattr(module, "config", None)
    main = getattr(module, "main_input_name", None)
    gen = torch.Generator().manual_seed(0)
    if config is not None and main == "input_ids":
        vocab = int(getattr(config, "vocab_size", None) or NO_VOCAB_IDS)
        ids = torch.randint(0, vocab, (1, seq_len), generator=gen)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if getattr(config, "is_encoder_decoder", False):
            start = getattr(config, "decoder_start_token_id", None)
            start = start if start is not None else getattr(config, "pad_token_id", None) or 0
            dec = torch.randint(0, vocab, (1, seq_len), generator=gen)
            dec[:, 0] = int(start)
            inputs["decoder_input_ids"] = dec
        return inputs
    if config is not None and main == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else 224
        chans = getattr(config, "num_channels", 3)
        return {"pixel_values": torch.randn(1, chans, size, size, generator=gen)}
    if config is not None and main == "input_values":  # raw audio: one second at 16 kHz
        return {"input_values": torch.randn(1, AUDIO_SAMPLES, generator=gen)}
    raise ModelLoadError(
        f"{type(module).__name__}: give example inputs (example_inputs=... or "
        f"example_kwargs=...); they are built automatically only for Hugging Face models "
        f"taking input_ids, pixel_values or input_values"
    )


class _TensorOutputs(torch.nn.Module):
    """The module with its outputs flattened to the tensors among them (for ``torch.export``:
    a model output object, a cache object, ``None`` are left out)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        outs = output_tensors(self.module(*args, **kwargs))
        return outs[0] if len(outs) == 1 else tuple(outs)


def import_for_analysis(module: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """The module in the IR for ``analyze()``: exported without its KV cache (``use_cache=
    False`` where its forward takes it), outputs flattened to tensors."""
    import inspect

    from graph_autofusion.frontend.torch_frontend import from_torch

    kwargs = dict(kwargs)
    try:
        sig = inspect.signature(module.forward)
        bound = sig.bind_partial(*args, **kwargs)  # inputs named after forward's parameters
        named = {k: v for k, v in bound.arguments.items() if not _variadic(sig, k)}
        if len(named) == len(bound.arguments):
            args, kwargs = (), named
        params = sig.parameters
    except (TypeError, ValueError):
        params = {}
    if "use_cache" in params:
        kwargs.setdefault("use_cache", False)
    model = from_torch(_TensorOutputs(module), tuple(args), kwargs)
    model.graph.name = type(module).__name__
    return model


def _variadic(sig: Any, name: str) -> bool:
    import inspect

    kind = sig.parameters[name].kind
    return kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class FusionInfo:
    """What fusing a module did: its backend's compiled graphs, plan and reports."""

    def __init__(self, backend: Any, source_name: str) -> None:
        self.backend = backend
        self.source_name = source_name
        self.decode = torch_decode.DecodeStats()  # what generate()'s decode loop did

    @property
    def graphs(self) -> list[Any]:
        return list(self.backend.config.graphs)

    @property
    def eager_reason(self) -> str:
        """Why calls now run in eager ("" while every call compiles): Dynamo's recompile
        limit reached (``torch_recompiles``)."""
        return self.backend.config.eager_reason

    def results(self) -> list[Any]:
        """The torch program's fuse result of each graph that has one (its kernels): none for a
        graph whose torch program was not built (``CompiledGraph._torch_cannot_win``: every
        graph that onnxruntime runs far ahead of eager, or compiled without speed checks); see
        :meth:`engine_results` for what runs."""
        return [g.result for g in self.graphs if g.result is not None]

    def engine_results(self) -> list[Any]:
        """Each compiled graph's fuse result on the engine that runs it: the ONNX route's
        ``FuseResult`` (onnxruntime) or the torch program's ``CpuFuseResult``; a graph that
        runs eager (both engines measured slower) gives the result of an engine it built.
        Each result's ``engine`` says which engine runs the graph, how it was chosen, each
        engine's time and what the engine not chosen fused (``CompiledGraph.engine_record``)."""
        out = []
        for g in self.graphs:
            res = g.ort_result if g.engine == "onnxruntime" else g.result
            if res is None and g.engine != "onnxruntime":  # eager, or a fallback
                res = g.ort_result
            if res is not None:
                res.engine = g.engine_record()
                out.append(res)
        return out

    def plan(self) -> dict[str, Any]:
        """The fusions kept, per graph fingerprint (what ``save_pretrained`` writes)."""
        graphs = []
        for g in self.graphs:
            res = g.ort_result if g.engine == "onnxruntime" else g.result
            if res is None or g.imported is None:
                continue
            entry = {
                "fingerprint": graph_fingerprint(g.imported),
                "engine": g.engine,
                "fused": [low.key for low in res.lowered],
                "rules": [low.rule for low in res.lowered],
            }
            weights = getattr(res, "weights", None)
            if weights is not None:  # compressed weights: the layers safe mode kept compressed
                entry["compressed"] = {  # "int8+GemvQ": the kernel safe mode timed faster
                    r.name: r.form + ("+GemvQ" if r.kernel == "GemvQ" else "")
                    for r in weights.compressed
                }
            graphs.append(entry)
        cfg = self.backend.config
        return {
            "version": PLAN_VERSION,
            "preset": cfg.preset,
            "safe_mode": cfg.options.safe_mode,
            **(
                {"weights": cfg.options.weights, "weights_policy": cfg.options.weights_policy}
                if cfg.options.weights != "fp32"
                else {}
            ),
            "graphs": graphs,
        }

    def summary(self) -> list[dict[str, Any]]:
        return [g.summary() for g in self.graphs]


def _shallow_copy(module: torch.nn.Module, leave: tuple[str, ...] = ()) -> torch.nn.Module:
    """A new module object sharing the submodules and weights; its own registries and hooks
    (a hook registered on the copy does not fire on the original); the attributes ``leave``
    names are not copied. Built directly (not by ``copy.copy``, which would call a fused
    module's own ``__reduce_ex__``)."""
    cls = type(module)
    fused = cls.__new__(cls)
    for attr, value in module.__dict__.items():
        if attr in leave:
            continue
        if attr.startswith("_") and isinstance(value, dict):
            value = value.copy()  # an OrderedDict stays one
        fused.__dict__[attr] = value
    return fused


#: Flags a Hugging Face model sets on itself once it has installed forward hooks on its
#: submodules (transformers 5 records ``output_hidden_states`` and ``output_attentions`` by
#: hooks it installs on the first call that asks for them, marking only the object called).
#: A fused module shares its submodules with the user's module (and with its own copies), so
#: the hooks one of them installs serve all: the flag is shared too, or each installs its own
#: on the same layers and every layer's output is recorded twice.
HOOK_FLAGS = ("_output_capturing_hooks_installed",)
#: The module objects sharing one set of submodules (the user's, its fused modules and their
#: copies), by the first submodule they share; weak on both sides.
_SHARERS: weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakSet[torch.nn.Module]] = (
    weakref.WeakKeyDictionary()
)


def _sharing_hook_flags(compiled: Any, user: torch.nn.Module, fused: torch.nn.Module) -> Any:
    """``compiled`` (the fused forward, its signature kept: ``generate()`` reads it) with
    :data:`HOOK_FLAGS` taken from the modules sharing its submodules before each call and given
    to them after."""
    first = next(iter(fused.children()), None)
    if first is None:  # no submodules: no hooks to share
        return compiled
    sharers = _SHARERS.setdefault(first, weakref.WeakSet())
    sharers.update((user, fused))

    def forward(*args: Any, **kwargs: Any) -> Any:
        _take_flags(fused, sharers)
        try:
            return compiled(*args, **kwargs)
        finally:
            for other in sharers:
                _take_flags(other, (fused,))

    return functools.update_wrapper(forward, compiled, updated=())


def _take_flags(dst: torch.nn.Module, sources: Any) -> None:
    for flag in HOOK_FLAGS:
        if not dst.__dict__.get(flag) and any(m.__dict__.get(flag) for m in sources):
            dst.__dict__[flag] = True


def _own_code(fn: Any) -> Any:
    """``fn`` with a code object of its own. Dynamo keeps its compiled frames per code object
    (at most ``recompile_limit`` of them): every module of one class shares its ``forward``'s
    code, and Hugging Face's decorators share one wrapper's code among every class's forward,
    so two fused decoders (or a fused one beside the user's own ``torch.compile``) used to
    exhaust that limit and run the rest in eager."""
    import functools

    own = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    own.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(own, fn)
    return own


def _plan_backend(
    plan: Mapping[str, Any] | None, *, preset: str, hardware: Any, options: Any, rules: Any
) -> Any:
    """The backend of a fused module; with a saved ``plan``, one that applies its fusions."""
    options = FuseOptions.coerce(options)  # a dict of its fields too
    if plan is not None:  # the saved fusions were timed when planned: numerics only now
        options = options or FuseOptions(target="cpu")
        weights = plan.get("weights", "fp32")
        options = options.replace(
            check_speed=False,
            weights=weights,
            weights_policy=plan.get("weights_policy", "default"),
            # a kernel choice applies to int weights only: a plan of others ignores it
            weights_kernel=options.weights_kernel if weights in ("int8", "int4") else "auto",
        )
    backend = make_backend(preset=preset, hardware=hardware, options=options, rules=rules)
    if plan is not None:
        _check_plan(plan)
        backend.config.saved_plan = {g["fingerprint"]: list(g["fused"]) for g in plan["graphs"]}
        backend.config.saved_engines = {
            g["fingerprint"]: g.get("engine", "torch") for g in plan["graphs"]
        }
        if plan.get("weights", "fp32") != "fp32":  # the layers compressed when it was saved
            backend.config.saved_weights = {  # {layer: form} (a list of names before 12-06)
                g["fingerprint"]: _saved_forms(g.get("compressed", [])) for g in plan["graphs"]
            }
    return backend


#: What a fused module holds beside the user's module's own state (its instance dict).
_OURS = ("forward", "autofusion", "save_pretrained", "generate", "__reduce_ex__")


def _wire(module: torch.nn.Module, backend: Any, source_name: str) -> torch.nn.Module:
    """A shallow copy of ``module`` whose ``forward`` is compiled by ``backend``."""
    fused = _shallow_copy(module)
    own = _own_code(type(module).forward)
    compiled = torch.compile(
        types.MethodType(own, fused), backend=backend, recompile_limit=defaults.RECOMPILE_LIMIT
    )
    fused.forward = _sharing_hook_flags(compiled, module, fused)
    fused.__dict__["autofusion"] = FusionInfo(backend, source_name)
    backend.config.label = f"the fused {source_name} module's forward"
    if hasattr(type(module), "save_pretrained"):
        fused.__dict__["save_pretrained"] = types.MethodType(_save_pretrained, fused)
    if _can_generate(module):  # greedy decoding finished by our own loop (torch_decode)
        fused.__dict__["generate"] = types.MethodType(_generate, fused)
    # pickle (torch.save), copy and deepcopy look __reduce_ex__ up on the object: the fused
    # module travels as the user's module plus its plan (a compiled forward does not pickle)
    fused.__dict__["__reduce_ex__"] = types.MethodType(_reduce_fused, fused)
    return fused


def _reduce_fused(self: torch.nn.Module, protocol: int) -> tuple[Any, tuple[Any, ...]]:
    """``torch.save(fused)`` / ``pickle`` / ``copy``: the module without what fusing added,
    the plan of the fusions kept and the backend's settings; :func:`_restore_fused` wires it
    again, and its graphs compile on their first call with the saved fusions (numerics
    checked, not timed again), as :func:`load_fused` does."""
    info: FusionInfo = self.__dict__["autofusion"]
    plain = _shallow_copy(self, leave=_OURS)
    cfg = info.backend.config
    settings = {"preset": cfg.preset, "hardware": cfg.hardware, "options": cfg.options}
    settings["rules"] = _rules_by_name(cfg.rules)
    return _restore_fused, (plain, info.plan(), settings, info.source_name)


def _rules_by_name(rules: Any) -> list[Any] | None:
    """A rule set as it pickles: built-in rules by name (their checks are lambdas), the
    user's own rules as they are (refused with the rule's name when one cannot pickle)."""
    if rules is None:
        return None
    builtin = _builtin_by_name()
    spec: list[Any] = []
    for rule in rules:
        if builtin.get(rule.name) is rule:
            spec.append(rule.name)
            continue
        try:
            pickle.dumps(rule)
        except Exception as exc:  # noqa: BLE001 - pickle's errors vary by what it met
            raise pickle.PicklingError(
                f"the fused module's rule {rule.name!r} holds what pickle cannot store ({exc}); "
                f"save it with save_pretrained() and fuse again with the rule"
            ) from exc
        spec.append(rule)
    return spec


def _builtin_by_name() -> dict[str, Any]:
    return {r.name: r for r in builtin_rules()}


def _restore_fused(
    plain: torch.nn.Module, plan: Mapping[str, Any], settings: Mapping[str, Any], name: str
) -> torch.nn.Module:
    """The fused module :func:`_reduce_fused` took apart (unpickled, or a copy)."""
    settings = dict(settings)
    spec = settings.pop("rules")
    rules = None
    if spec is not None:
        builtin = _builtin_by_name()
        rules = RuleSet(tuple(builtin[r] if isinstance(r, str) else r for r in spec))
    return _wire(plain, _plan_backend(plan, rules=rules, **settings), name)


def fuse_module(
    module: torch.nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    rules: Any = None,
    preset: str = "all",
    hardware: Any = "host",
    options: Any = None,
    plan: Mapping[str, Any] | None = None,
    source_name: str = "",
) -> torch.nn.Module:
    """A drop-in fused copy of ``module`` (see the module docstring); ``module`` itself is not
    modified. ``plan``: a saved plan (:data:`PLAN_FILE`) to apply instead of planning."""
    backend = _plan_backend(plan, preset=preset, hardware=hardware, options=options, rules=rules)
    fused = _wire(module, backend, source_name or type(module).__name__)
    modes = [(m, m.training) for m in fused.modules()]  # restored one by one (shared)
    fused.eval()
    try:
        with torch.no_grad():
            fused(*args, **dict(kwargs or {}))
    except GraphAutoFusionError:
        raise
    except Exception as exc:  # the model's own: it does not take these inputs
        given = ", ".join([*(f"#{i} {_kind(a)}" for i, a in enumerate(args)),
                           *(f"{k} {_kind(v)}" for k, v in (kwargs or {}).items())])  # fmt: skip
        raise ModelLoadError(
            f"{source_name or type(module).__name__}: the example call failed in the model "
            f"itself ({type(exc).__name__}: {' '.join(str(exc).split())[:300]}) with the inputs "
            f"{given or 'none'}; give inputs it takes (example_inputs=... or example_kwargs=...)"
        ) from exc
    finally:
        for m, mode in modes:
            m.training = mode
    return fused


def _kind(x: Any) -> str:
    """An example argument in a few words (a tensor's dtype and shape)."""
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    return type(x).__name__


def _can_generate(module: torch.nn.Module) -> bool:
    """A decoder-only Hugging Face model with the library's own ``generate()`` (a class that
    overrides it, or an encoder-decoder, keeps its own)."""
    can = getattr(module, "can_generate", None)
    try:
        from transformers import GenerationMixin

        config = getattr(module, "config", None)
        return (
            getattr(type(module), "generate", None) is GenerationMixin.generate
            and not getattr(config, "is_encoder_decoder", False)
            and callable(can)
            and bool(can())
        )
    except Exception:  # noqa: BLE001 - a model's own check, or no transformers: no loop then
        return False


def _generate(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The class's ``generate()``; plain greedy decoding is finished by the decode loop of
    :mod:`graph_autofusion.torch_decode` (the same tokens, without generate()'s and Dynamo's
    per-token Python)."""
    info: FusionInfo = self.__dict__["autofusion"]
    return torch_decode.generate(self, info.backend.config, info.decode, *args, **kwargs)


def _saved_forms(compressed: Any) -> Any:
    """A saved graph's compressed layers: ``{name: form}``, or the plain list of names plans
    saved before 2026-12-06 wrote (each at the model's form)."""
    return dict(compressed) if isinstance(compressed, Mapping) else list(compressed)


def _check_plan(plan: Mapping[str, Any]) -> None:
    if not isinstance(plan, Mapping) or plan.get("version") != PLAN_VERSION:
        raise ModelLoadError(
            f"not an autofusion plan of version {PLAN_VERSION}: {str(plan)[:80]!r}"
        )
    for g in plan.get("graphs", []):
        if not isinstance(g, Mapping) or "fingerprint" not in g or "fused" not in g:
            raise ModelLoadError(f"autofusion plan: malformed graph entry {str(g)[:80]!r}")


def _save_pretrained(self: torch.nn.Module, save_directory: str | os.PathLike[str], **kw: Any):
    """The class's ``save_pretrained`` (without our ``forward``), then the fusion plan."""
    info: FusionInfo = self.__dict__["autofusion"]
    forward = self.__dict__.pop("forward", None)
    try:
        out = type(self).save_pretrained(self, save_directory, **kw)
    finally:
        if forward is not None:
            self.__dict__["forward"] = forward
    path = os.path.join(os.fspath(save_directory), PLAN_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info.plan(), f, indent=1)
    os.replace(tmp, path)
    return out


def load_fused(
    module: torch.nn.Module,
    directory: str | os.PathLike[str],
    *,
    example_inputs: Any = None,
    example_kwargs: Mapping[str, Any] | None = None,
) -> torch.nn.Module:
    """Reapply the fusions saved by a fused module's ``save_pretrained`` to ``module`` (loaded
    from the same directory): ``load_fused(AutoModelForCausalLM.from_pretrained(d), d)``.

    Raises:
        ModelLoadError: the directory has no readable plan.
    """
    path = os.path.join(os.fspath(directory), PLAN_FILE)
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read the autofusion plan ({exc})") from exc
    args, kwargs = example_call(module, example_inputs, example_kwargs)
    return fuse_module(module, args, kwargs, preset=plan.get("preset", "all"), plan=plan)


def example_call(module, example_inputs, example_kwargs) -> tuple[tuple, dict]:
    """The positional and keyword arguments of ``module``'s example call: the ones given, else
    (none given) :func:`example_inputs_for`'s."""
    if example_inputs is None and example_kwargs is None:
        return (), example_inputs_for(module)
    return as_args(example_inputs), dict(example_kwargs or {})


# ---------------------------------------------------------------------- verification
def verify_precision(
    original: torch.nn.Module, fused: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Eager and fused outputs on the example inputs: per output cosine and errors, and each
    fused group's own check (from safe mode) per graph."""
    with torch.no_grad():
        want = output_tensors(original(*args, **kwargs))
        got = output_tensors(fused(*args, **kwargs))
    outputs = {
        f"output_{i}": compare_tensors(g.detach().float().numpy(), w.detach().float().numpy())
        for i, (g, w) in enumerate(zip(got, want))
    }
    layers = {}
    info: FusionInfo | None = fused.__dict__.get("autofusion")
    for g in info.graphs if info is not None else []:
        result = g.ort_result if g.engine == "onnxruntime" else g.result
        if result is None:
            continue
        for key, res in (result.safety or {}).items():
            layers[f"graph{g.index}:{key}"] = {
                "cosine": res.cosine,
                "max_abs": res.max_abs,
                "passed": res.passed,
            }
    return {
        "cosine": min((v["cosine"] for v in outputs.values()), default=1.0),
        "max_abs": max((v["max_abs"] for v in outputs.values()), default=0.0),
        "outputs": outputs,
        "layers": layers,
    }


def verify_performance(
    original: torch.nn.Module,
    fused: torch.nn.Module,
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    runs: int = 20,
    warmup: int = 3,
    new_tokens: int = 0,
) -> dict[str, Any]:
    """Eager against fused, alternating: median forward latency; with ``new_tokens`` (a
    generative model) also tokens/s of greedy ``generate(max_new_tokens=new_tokens)``."""

    def fwd(m):
        def run():
            with torch.no_grad():
                m(*args, **kwargs)

        return run

    out: dict[str, Any] = {"runs": runs, "threads": torch.get_num_threads()}
    times = round_robin({"baseline": fwd(original), "fused": fwd(fused)}, runs, warmup)
    for k, ts in times.items():
        out[k] = {"latency_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts)}
    out["improvement"] = out["baseline"]["latency_ms"] / out["fused"]["latency_ms"] - 1.0
    if new_tokens and hasattr(original, "generate"):
        ids = kwargs.get("input_ids", args[0] if args else None)
        kw = dict(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)

        def gen(m):
            def run():
                with torch.no_grad():
                    m.generate(ids, **kw)

            return run

        g = round_robin({"baseline": gen(original), "fused": gen(fused)}, runs, warmup)
        for k, ts in g.items():
            out[k]["tokens_per_s"] = new_tokens / statistics.median(ts)
    return out
