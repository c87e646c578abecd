"""``torch.compile(model, backend="autofusion")``: the PyTorch path's front door.

    compiled = torch.compile(model, backend="autofusion")          # registered entry point
    compiled = torch.compile(model, backend=autofusion_backend)    # the same, by object
    compiled = torch.compile(model, backend=make_backend(preset="llm", safe_mode=False))

Dynamo hands the backend each captured FX graph (torch-level operators, parameters as
inputs). The backend returns a :class:`CompiledGraph` that does the work on its first call,
with the real inputs (an export inside Dynamo's own compilation would add guards to the frame
being compiled): the graph is imported into the IR (:func:`~graph_autofusion.frontend.
torch_frontend.import_fx`; sizes Dynamo made symbolic stay symbolic), planned for the
calibrated ``host`` profile with the cpu target, its fused groups compiled into C kernels,
each verified in safe mode against eager's outputs, and the fused program generated as
straight-line Python (:mod:`graph_autofusion.runtime.pyprogram`): GEMMs and every operator
without a kernel run on torch's own kernels.

Fallbacks: a graph the importer, planner or compiler cannot handle (one that writes into its
parameters or buffers among them) runs as Dynamo captured it (eager), with one warning naming the
graph and the reason; a graph break is Dynamo's business (each piece is compiled apart); a call
autograd must record runs eagerly. Before a compiled program is used, the generated function
itself is run on the first call's inputs and compared with eager's outputs (cosine and
relative error).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from graph_autofusion import defaults, torch_recompiles
from graph_autofusion.errors import AutofusionWarning, GraphAutoFusionError
from graph_autofusion.options import FuseOptions, OptionsError
from graph_autofusion.patterns.library import builtin_rules
from graph_autofusion.runtime.call_gaps import CallGaps
from graph_autofusion.runtime.ort_session import SERVING_MODES
from graph_autofusion.torch_decode_handoff import arg_sources
from graph_autofusion.torch_outputs import (
    SizeOutputs,
    Writes,
    give_back_memory,
    same_as_eager,
    tensor_outputs,
    tolerance,
)
from graph_autofusion.verify.speed import SpeedPolicy

#: The engines a graph may run on, in order of preference when no timing decides; ``auto``
#: builds the first two and keeps the fastest (``eager`` when both are slower than eager).
ENGINES = ("onnxruntime", "torch", "eager")
#: Weight sets one graph compiles for (other modules of the same class) before eager.
MAX_WEIGHT_SETS = 4
#: Compiles a graph makes again for parameters written in place between calls (evaluation
#: during fine-tuning) before it runs eager (``CompiledGraph._drop_stale``)
MAX_STALE_COMPILES = 8
#: A graph's onnxruntime session packs its GEMM weights (onnxruntime's own copy of each) once
#: the graph has been called this many times; until then it runs them unpacked. A
#: ``generate()`` calls its prefill graph and its first decode graph once each: only the
#: decode graph that serves every later step holds a packed copy (the engine is chosen on
#: packed timings, or on unpacked ones where those already settle it:
#: ``CompiledGraph._unpacked_leads``).
PACK_AFTER_CALLS = 2


def graph_fingerprint(model: Any) -> str:
    """A structural fingerprint of an imported graph: its operators in order with their
    attribute names and static output sizes, its inputs' dtypes and sizes (symbolic sizes,
    which Dynamo numbers per process, count as ``?``)."""

    def dims(v: Any) -> str:
        return ",".join(str(d) if isinstance(d, int) else "?" for d in (v.shape or ()))

    parts = [f"{v.dtype}:[{dims(v)}]" for v in model.graph.inputs]
    parts += [
        f"{n.domain}:{n.op_type}:{len(n.inputs)}:{sorted(n.attrs)}:"
        + ";".join(dims(o) for o in n.outputs)
        for n in model.graph.nodes
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


@dataclass
class BackendConfig:
    """What the backend plans with (one per ``make_backend`` call)."""

    preset: str = "all"
    hardware: Any = "host"
    #: ``auto`` (onnxruntime or the torch program, whichever is faster on the first call),
    #: ``onnxruntime``, ``torch``.
    engine: str = "auto"
    options: FuseOptions = field(default_factory=lambda: FuseOptions(target="cpu"))
    rules: Any = None  # a RuleSet; the preset's rules when None
    #: A saved plan: graph fingerprint -> candidate keys to apply (no planning for those).
    saved_plan: dict[str, list[str]] | None = None
    #: A saved plan's engines: graph fingerprint -> the engine the graph ran on.
    saved_engines: dict[str, str] | None = None
    #: A saved plan's compressed layers (``options.weights``): graph fingerprint -> the names
    #: of the contractions that were compressed (the others stay fp32).
    saved_weights: dict[str, list[str]] | None = None
    #: Every graph compiled through this backend, in order (reports and tests read them).
    graphs: list[CompiledGraph] = field(default_factory=list)
    #: Per thread id, a ``torch_decode.Recorder`` every graph call made on that thread is
    #: handed to (the decode loop learns a step from Hugging Face's calls).
    recorders: dict[int, Any] = field(default_factory=dict)
    #: The frames this backend compiled graphs of (Dynamo's frame id, the function), each with
    #: why it now runs in eager ("" while it compiles: ``torch_recompiles``), and the latest
    #: such reason.
    frames: dict[tuple[int, str], str] = field(default_factory=dict)
    eager_reason: str = ""
    #: What the recompile-limit warning calls the compiled function (the drop-in module's
    #: "the fused <class> module's forward"; Dynamo's name of the function when empty).
    label: str = ""

    def ruleset(self) -> Any:
        if self.rules is None:
            self.rules = builtin_rules().preset(self.preset)
        return self.rules


class CompiledGraph:
    """One Dynamo graph: compiled on its first call, then the fused program (or eager).

    The program holds the graph's parameters as constants. Dynamo passes them as arguments and
    may reuse one graph for another module of the same class, so each call checks that the
    constant arguments are the same tensors at the same version over the same memory (cheap
    identity tests) and compiles again for other weights (at most :data:`MAX_WEIGHT_SETS` sets,
    then eager; a program for weights since written in place goes first, :meth:`_drop_stale`).
    Not seen: a write through ``.data`` (``p.data.copy_(...)``: ``.data`` counts its own
    versions) or into an inference tensor (no counter), by a program holding a copy of that
    weight (a packed session, the torch program's derived weights). A call
    that autograd must record (grad enabled and an argument requiring grad) runs eagerly.
    """

    def __init__(self, gm: torch.fx.GraphModule, config: BackendConfig, index: int) -> None:
        self.gm = gm
        #: Dynamo's access path of each argument (read while Dynamo still has them)
        self.sources = arg_sources(gm)
        self.config = config
        self.index = index
        self.result: Any = None  # CpuFuseResult
        self.fallback: str | None = None  # why this graph runs in eager
        self.compile_seconds = 0.0
        self.calls = 0
        self.eager_calls = 0  # calls autograd had to record
        self._lock = threading.Lock()
        self.plan_source = ""  # "planned", or "saved" (a loaded plan's choice)
        self.source = ""  # the generated program
        self._programs: list[Program] = []  # one per weight set (and fixed numbers)
        self._grad_warned = False
        self._stale_compiles = 0  # programs dropped for weights written since (_drop_stale)
        self._ort_warned: set[str] = set()  # the onnxruntime refusals warned of
        self.imported: Any = None  # the graph as imported (IR)
        self.core_gm = gm  # the graph less the sizes it returns (what the engines run)
        self.engine = ""  # onnxruntime, torch or eager: what runs the graph
        self.engine_times: dict[str, float] = {}  # seconds per call of each engine timed
        self.engine_notes: dict[str, str] = {}  # why an engine could not be built
        self.ort_result: Any = None  # the ONNX route's FuseResult (onnxruntime engine)
        self.ort_failures = 0  # calls onnxruntime failed (run in eager instead)
        self._unpacked: list[Any] = []  # onnxruntime programs to pack once the graph is hot
        self._orts: list[Any] = []  # the graph's onnxruntime programs (one per weight set)
        self._gaps: CallGaps | None = None  # spinning="auto": what the process does between calls
        self._looping = False  # serves the drop-in module's decode loop (sessions spin)
        self._writes: Writes | None = None  # the arguments the graph writes into
        self._live: set[int] = set()  # buffers read as inputs (assigned anew between calls)

    def __call__(self, *args: Any) -> Any:
        out = self._call(args)
        if self.config.recorders:
            rec = self.config.recorders.get(threading.get_ident())
            if rec is not None:
                rec.record(self, args, out)
        return out

    def _call(self, args: tuple) -> Any:
        self.calls += 1
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        ):
            self.eager_calls += 1
            if not self._grad_warned:
                self._grad_warned = True
                warnings.warn(
                    f"autofusion: graph {self.index} runs in eager while autograd records "
                    f"(call it under torch.no_grad() or torch.inference_mode())",
                    AutofusionWarning,
                    stacklevel=2,
                )
            return self.gm.forward(*args)
        p = self._match(args)
        if p is not None:
            gaps = self._gaps
            if gaps is not None:
                spin = gaps.start()
                if spin is not None:
                    self._spin(spin, gaps.why)
            out = p.program(*args)
            if self._unpacked and self.calls >= PACK_AFTER_CALLS:
                self._pack()
            if gaps is not None:
                gaps.stop()
            return out
        with self._lock:
            p = self._match(args)  # another thread compiled it while this one waited
            return p.program(*args) if p is not None else self._build(args)

    def _match(self, args: Sequence[Any]) -> Program | None:
        """The program compiled for these constant arguments as they are now, if any."""
        for p in self._programs:  # C-level loops
            refs, scalars, sizes = p.refs, p.scalars, p.sizes
            if (
                all(map(operator.is_, p.pick(args), refs))
                and list(map(_VERSION, p.versioned)) == p.versions
                and (p.ptrs is None or list(map(_DATA_PTR, refs)) == p.ptrs)
                and (not scalars or all(args[i].item() == v for i, v in scalars))
                and (not sizes or all(_size(args[i], axis) == v for i, axis, v in sizes))
            ):
                return p
        return None

    def serve_loop(self) -> None:
        """The graph now serves the drop-in module's decode loop, whose calls come back to
        back: under ``spinning="auto"`` its onnxruntime sessions keep their workers spinning
        between calls (opened again once; each call then finds them awake)."""
        if self.config.options.spinning != "auto":
            return
        with self._lock:
            self._looping = True
            self._gaps = None  # the loop's calls keep them spinning whatever the gaps
            for ort in self._orts:
                ort.set_spinning(True)

    def _spin(self, spin: bool, why: str) -> None:
        """Open the graph's onnxruntime sessions again spinning on after each call (``spin``)
        or with the short tail (``spinning="auto"``'s :class:`~graph_autofusion.runtime.
        call_gaps.CallGaps` decided it; ``engine_notes["spinning"]`` says why)."""
        with self._lock:
            if self._gaps is None:  # the decode loop took the graph over meanwhile
                return
            try:
                for ort in self._orts:
                    ort.set_spinning(True if spin else SERVING_MODES["auto"])
            except Exception as exc:  # noqa: BLE001 - the call goes on; the watch stops
                self._gaps = None
                why = f"not switched ({type(exc).__name__}: {exc})".splitlines()[0][:300]
            self.engine_notes["spinning"] = why

    def _pack(self) -> None:
        """The graph is hot: its onnxruntime sessions pack their weights from now on."""
        with self._lock:
            todo, self._unpacked = self._unpacked, []
            for ort in todo:
                ort.set_packing(True)

    # ------------------------------------------------------------------ compile
    def _build(self, args: Sequence[Any]) -> Any:
        """Compile for these arguments' weights and run this call; a graph that cannot be
        compiled (or a weight set past the limit) runs as Dynamo captured it from now on."""
        self._find_live_buffers(args)
        self._drop_stale(args)
        if self.fallback is None and self._stale_compiles > MAX_STALE_COMPILES:
            self._fail(f"its weights changed in place between calls {self._stale_compiles} times")
        if self.fallback is not None or len(self._programs) >= MAX_WEIGHT_SETS:
            if self.fallback is None:
                self._fail(f"more than {MAX_WEIGHT_SETS} programs (weight sets, or sizes fixed)")
            return self.gm.forward(*args)
        t = time.perf_counter()
        opened = len(self._orts)
        try:
            program, imported, outs = self._compile(args)
        except Exception as exc:  # noqa: BLE001 - a graph we cannot compile runs in eager
            self._fail(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            self.compile_seconds += time.perf_counter() - t
            return self.gm.forward(*args)
        pick = _picker(imported.constant_inputs)
        refs = pick(args)
        versioned = tuple(r for r in refs if not r.is_inference())  # the rest have no counter
        self._programs.append(
            Program(
                pick,
                refs,
                versioned,
                list(map(_VERSION, versioned)),
                _data_ptrs(refs),
                program,
                imported.scalars,
                imported.sizes,
                tuple(imported.constant_inputs),
                self._orts[-1] if len(self._orts) > opened else None,
            )
        )
        self.compile_seconds += time.perf_counter() - t
        return outs

    def _find_live_buffers(self, args: Sequence[Any]) -> None:
        """A call whose constant arguments differ from the last program's only in buffers (no
        parameter, same shapes and dtypes) is a module assigning new tensors to its buffers
        between calls (Hugging Face's dynamic rotary scaling recomputes ``inv_freq`` past the
        trained length): those buffers are read as inputs from now on (``_live``), so the
        program compiled next serves every later value, and the programs that took them as
        constants go (else each value would be a weight set, and past
        :data:`MAX_WEIGHT_SETS` the graph would run eager)."""
        if not self._programs or self.fallback is not None:
            return
        last = self._programs[-1]
        changed = [(i, ref) for i, ref in zip(last.indices, last.refs) if args[i] is not ref]
        if not changed:
            return  # the same tensors (another number, size or version: a new program)
        for i, old in changed:
            new = args[i]
            if (
                isinstance(new, torch.nn.Parameter)
                or not isinstance(new, torch.Tensor)
                or new.shape != old.shape
                or new.dtype != old.dtype
            ):
                return
        self._read_as_inputs(i for i, _ in changed)

    def _read_as_inputs(self, indices: Iterable[int]) -> None:
        """These constant arguments are read as inputs from now on (``_live``): every program
        took them as constants, so every program goes (the next compiled serves any value)."""
        self._live.update(indices)
        self._programs.clear()
        self._orts.clear()
        self._unpacked.clear()

    def _drop_stale(self, args: Sequence[Any]) -> None:
        """Programs compiled for these very tensors, written in place since (a newer version)
        or given other memory (``param.data = ...``), can serve no call again: they go, with
        their sessions (the last references to them). Changed buffers (no parameter: state a module updates itself, such as
        running statistics) are read as inputs from now on (``_live``, as
        :meth:`_find_live_buffers` does for reassigned ones), so the next program serves every
        later value; changed parameters (evaluation during fine-tuning) compile again, at most
        :data:`MAX_STALE_COMPILES` times, then the graph runs eager. Either way such updates
        do not count as weight sets (:data:`MAX_WEIGHT_SETS`)."""
        live = []
        for p in self._programs:
            now = p.pick(args)
            if not all(map(operator.is_, now, p.refs)):
                live.append(p)
                continue
            changed = _changed(p)
            if not changed:
                live.append(p)
                continue
            if all(not isinstance(args[i], torch.nn.Parameter) for i in changed):
                self._read_as_inputs(changed)
                return
            self._orts = [o for o in self._orts if o is not p.ort]
            self._unpacked = [o for o in self._unpacked if o is not p.ort]
            self._stale_compiles += 1
        self._programs = live

    def _fail(self, why: str) -> None:
        self.fallback = why
        self._programs.clear()
        self._orts.clear()
        warnings.warn(
            f"autofusion: graph {self.index} runs in eager ({why})",
            AutofusionWarning,
            stacklevel=4,
        )

    def _compile(self, args: Sequence[Any]) -> tuple[Any, Any, Any]:
        """Import the graph, build each engine the config allows on this call's inputs
        (each checked against eager), time them against eager and keep the fastest. Returns
        the program, the import (``FxImport``: the constant arguments and the numbers the
        program is for) and this call's outputs."""
        from graph_autofusion.frontend.torch_frontend import import_fx

        split = SizeOutputs.of(self.gm)
        core = split.core if split is not None else self.gm
        self.core_gm = core
        # the import has no side effects; a graph that writes into its arguments (a static
        # KV cache) runs eager on copies of them, so the user's tensors are written once, by
        # the program that serves this call
        imported = import_fx(core, args, self._live)
        self.imported = imported.model
        ref_args = args
        n_out = len(imported.model.graph.outputs) - len(imported.mutated)
        self._writes = writes = Writes.of(imported, n_out)
        if writes is not None:
            if split is not None:
                raise GraphAutoFusionError("a graph that writes into its arguments returns sizes")
            ref_args = writes.scratch(args)
        with torch.no_grad():
            expected = core(*ref_args)
        outs = tuple(expected) if isinstance(expected, tuple | list) else (expected,)
        full = outs if writes is None else outs + writes.written(ref_args)
        wanted = ENGINES[:-1] if self.config.engine == "auto" else (self.config.engine,)
        self.plan_source = ""
        if self.config.saved_engines is not None:  # a loaded plan: the engine it ran on
            saved = self.config.saved_engines.get(graph_fingerprint(imported.model))
            if saved in ENGINES[:-1]:
                wanted = (saved,)
                self.plan_source = "saved"
        if self.config.options.weights != "fp32" and "torch" in wanted:  # compressed weights
            wanted = ("onnxruntime",)
            self.engine_notes["torch"] = (
                f"not built: weights={self.config.options.weights} runs on onnxruntime only"
            )
        engine, program = self._build_and_choose(wanted, imported, args, full)
        functional = program
        if writes is not None and engine != "eager":  # eager writes into the arguments itself
            program = writes.wrap(program)
        if engine != "onnxruntime":  # onnxruntime's outputs are row-major already
            program = _row_major(program)
        self.engine = engine
        self.plan_source = self.plan_source or "planned"
        if engine != "torch" and self.result is not None:
            self.result.program = None  # its kernels stay (reports, the kernel folder)
        ort = getattr(functional, "program", None) if engine == "onnxruntime" else None
        if ort is not None:
            self._orts.append(ort)
        if ort is not None and ort.session is None and not ort.can_defer_packing():
            ort.reopen()  # let go while the next engine was built and timed
        if ort is not None and ort.can_defer_packing():
            # packed again on the graph's next calls (PACK_AFTER_CALLS); set_packing collects
            # (the engines not chosen, the packed session) before it opens the unpacked one
            ort.set_packing(False)
            self._unpacked.append(ort)
            give_back_memory(collect=False)  # what opening it freed: no second full collection
        else:
            give_back_memory()
        if ort is not None:
            if self._looping or (self._gaps is not None and self._gaps.spinning):
                ort.set_spinning(True)  # as the graph's other sessions run now
            elif self.config.options.spinning == "auto" and self._gaps is None:
                self._gaps = CallGaps()
        why_not = self.engine_notes.get("onnxruntime")
        if why_not is not None and engine != "onnxruntime" and why_not not in self._ort_warned:
            # once per reason: a graph compiled again (another weight set or fixed size) that
            # onnxruntime refuses for the same reason, timed to another engine, says nothing new
            self._ort_warned.add(why_not)
            warnings.warn(
                f"autofusion: graph {self.index} runs on the {engine} engine, not onnxruntime "
                f"({self.engine_notes['onnxruntime']})",
                AutofusionWarning,
                stacklevel=4,
            )
        with torch.no_grad():
            if writes is not None and engine != "eager":
                # checked before it writes: a program that fails here leaves the arguments
                # as they were for the eager run that then serves the call
                got = functional(*args)
                same_as_eager(got, full, *tolerance(self.config.options))
                got = _row_major_all(writes.apply(args, got))
            else:
                got = program(*args)
                if engine != "eager":
                    same_as_eager(got, outs, *tolerance(self.config.options))
        # this call returns the program's outputs, as every later call will: their layouts
        # feed Dynamo's guards on the next frame (a decode step's cache), and eager's may differ
        wrap = list if isinstance(expected, list) else tuple
        if split is not None:  # sizes and constants the graph also returns: computed apart
            return (
                lambda *a: split.merge(program(*a), a),
                imported,
                split.merge(got, args),
            )
        if not isinstance(expected, tuple | list):
            return program, imported, got[0]
        return (lambda *a: wrap(program(*a))), imported, wrap(got)

    def _build_engine(self, engine: str, imported: Any, args: Sequence[Any], outs: tuple) -> Any:
        """One engine's program for this graph, checked against eager's outputs ``outs``."""
        if engine == "onnxruntime":
            from graph_autofusion.torch_ort import build_ort_program

            keys = layers = None
            if self.config.saved_plan is not None:
                keys = self.config.saved_plan.get(graph_fingerprint(imported.model))
                if self.config.saved_weights is not None:
                    # a graph the plan never saw (another length, a decode step) compresses
                    # afresh, as its fusions are planned afresh; it did not compress at all
                    layers = self.config.saved_weights.get(graph_fingerprint(imported.model))
            program, self.ort_result = build_ort_program(
                imported,
                args,
                self.config.ruleset(),
                self.config.hardware,
                self.config.options,
                keys=keys,
                weight_layers=layers,
            )
        else:
            program = self._torch_program(imported, args, outs)
        with torch.no_grad():
            got = program(*args)
        try:
            same_as_eager(got, outs, *tolerance(self.config.options))
        except GraphAutoFusionError:
            # the session was made without the contraction weights in the file onnxruntime's
            # optimizer reads: one that rewrote a weight read zeros; made again with them
            if engine != "onnxruntime" or not program.write_weights():
                raise
            with torch.no_grad():
                got = program(*args)
            same_as_eager(got, outs, *tolerance(self.config.options))
            self.engine_notes["weights written"] = (
                "onnxruntime's optimizer rewrote a weight left out of its placeholder file: "
                "the session was made again with every weight written"
            )
        return _OrtCall(program, self) if engine == "onnxruntime" else program

    def _torch_program(self, imported: Any, args: Sequence[Any], outs: tuple) -> Any:
        """Today's torch program: generated C kernels for the fused groups, torch for the
        rest (``pipeline.cpu.fuse_model_cpu``)."""
        from graph_autofusion.pipeline.cpu import fuse_model_cpu
        from graph_autofusion.runtime.pyprogram import generate_program

        model = imported.model
        names = [v.name for v in model.graph.inputs]
        feeds = {n: args[i] for n, i in zip(names, imported.user_inputs)}
        chosen = None
        if self.config.saved_plan is not None:
            chosen = self.config.saved_plan.get(graph_fingerprint(model))
        self.plan_source = "saved" if chosen is not None or self.plan_source else "planned"
        reference = {v.name: t for v, t in zip(model.graph.outputs, outs)}
        with torch.no_grad():
            result = fuse_model_cpu(
                model,
                self.config.ruleset(),
                self.config.hardware,
                options=self.config.options,
                feeds=feeds,
                reference=reference,
                chosen_keys=chosen,
            )
        self.result = result
        if result.end_to_end and not result.end_to_end.get("passed", True):
            raise GraphAutoFusionError(
                "the fused graph differs from eager (every fusion rolled back)"
            )
        program = generate_program(result.program, imported.user_inputs, len(args))
        self.source = program.source
        return program

    def _build_and_choose(
        self,
        wanted: Sequence[str],
        imported: Any,
        args: Sequence[Any],
        outs: tuple,
    ) -> tuple[str, Any]:
        """Build the engines ``wanted``, one at a time, and return the fastest on this call's
        inputs: eager when every engine is slower than eager. The engines not chosen, and what
        they hold (derived weights), go when it returns.

        The first engine built is timed against eager by safe mode's one speed policy
        (:meth:`~graph_autofusion.verify.speed.SpeedPolicy.choose`, timed through
        :func:`~graph_autofusion.runtime.timing.current_timer` as ``timer("engine@graph<i>",
        side, fn)``, in a seeded shuffled order each round, each side timed on its second
        consecutive call; eager wins only when a second measurement confirms the engine
        slower by the speed margin). A later engine is measured against the one already
        ahead of eager (:meth:`_against_leader`) and against eager only when it may win; an
        engine built while none is ahead of eager is timed against eager. Engines timed
        against eager are compared by their time relative to eager's in their own
        measurement. An onnxruntime session that packed its weights lets them go before the
        next engine is built, so the compile never holds two engines' packed copies of the
        weights at once (a prefill's: onnxruntime's and oneDNN's, ~110 MB each on the zoo
        Llama); the caller opens it again if it is chosen. The torch program is not built
        when onnxruntime's already leads eager by more than it has ever been beaten
        (:meth:`_torch_cannot_win`). onnxruntime's program is opened without its packed
        weights; a one-call probe (:meth:`_unpacked_may_lead`) decides whether it is measured
        so first (:meth:`_unpacked_leads`: chosen on that measurement when it settles the
        choice) or packed before its measurement. Without speed checks:
        onnxruntime when it was built (the torch program is then not built), else the torch
        program."""
        check = self.config.options.check_speed
        for stale in ("not built", "packing", "onnxruntime"):  # an earlier compile's
            self.engine_notes.pop(stale, None)
        built: dict[str, Any] = {}
        relative: dict[str, float] = {}  # engine -> its median / eager's, where it beat eager
        eager_s: list[float] = []
        for engine in wanted:
            if engine == "torch" and self._torch_cannot_win(built, relative, check):
                continue
            ort = getattr(built.get("onnxruntime"), "program", None)
            if check and ort is not None and ort.prepack:
                # another engine is built next: the packed session lets its weights go first
                ort.release()
                give_back_memory(collect=False)
            try:
                program = self._build_engine(engine, imported, args, outs)
            except Exception as exc:  # noqa: BLE001 - the other engine (or eager) runs it
                self.engine_notes[engine] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                continue
            if check and engine == "onnxruntime":
                program = self._thread_choice(program, args)
            built[engine] = program
            if not check:
                continue
            if relative:
                leader = min(relative, key=relative.__getitem__)
                decided = self._against_leader(leader, engine, built, args)
                if decided is not None:
                    return decided, built[decided]
            ort = getattr(program, "program", None)
            alone = "torch" not in wanted  # onnxruntime or eager: nothing else to build
            if (
                ort is not None
                and ort.timed_unpacked()
                and not alone
                and not self._unpacked_may_lead(program, args)
            ):
                ort.set_packing(True)  # timed as it would serve once hot
            best, medians = self._against_eager(engine, program, args)
            if (
                ort is not None
                and ort.timed_unpacked()
                and not self._unpacked_leads(best, medians, alone)
            ):
                ort.set_packing(True)
                best, medians = self._against_eager(engine, program, args)
            self.engine_times[engine] = medians[engine]
            self.engine_times["eager"] = medians["eager"]  # a later engine may decide
            eager_s.append(medians["eager"])
            if best == engine:
                relative[engine] = medians[engine] / medians["eager"]
        if not built:
            raise GraphAutoFusionError(
                "; ".join(f"{k}: {v}" for k, v in self.engine_notes.items() if k != "spinning")
                or "no engine"
            )
        if not check:
            engine = "onnxruntime" if "onnxruntime" in built else next(iter(built))
            return engine, built[engine]
        self.engine_times["eager"] = statistics.median(eager_s)
        if not relative:
            return "eager", self.core_gm.forward
        engine = min(relative, key=relative.__getitem__)
        times = self.engine_times  # every engine in ``relative`` was timed
        if (
            engine == "torch"
            and "onnxruntime" in relative
            and times["onnxruntime"] <= times["torch"]
        ):
            # the two measurements disagree: the torch program's ratio to eager is lower, its
            # time is not (eager's own spread, or a load change between them); a program that
            # must win twice does not, and onnxruntime reads the parameters in place
            self.engine_notes["disagree"] = (
                f"torch {times['torch'] * 1e3:.3f} ms at {relative['torch']:.2f}x eager, "
                f"onnxruntime {times['onnxruntime'] * 1e3:.3f} ms at "
                f"{relative['onnxruntime']:.2f}x eager"
            )
            engine = "onnxruntime"
        return engine, built[engine]

    def _with_eager(
        self, engine: str, program: Any, args: Sequence[Any]
    ) -> dict[str, Callable[[], Any]]:
        """The two sides of an engine measurement, bound to ``args``: ``program`` and eager
        (on scratch copies of the arguments a graph writes into)."""
        w = self._writes
        eager = self.core_gm.forward
        sides = {engine: program, "eager": eager if w is None else w.on_scratch(eager)}
        return {name: functools.partial(fn, *args) for name, fn in sides.items()}

    def _unpacked_may_lead(self, program: Any, args: Sequence[Any]) -> bool:
        """One call of onnxruntime's unpacked program and one of eager (each called before):
        whether the unpacked program may run at :meth:`_unpacked_leads`'s threshold (times
        :data:`~graph_autofusion.defaults.UNPACKED_PROBE_SLACK`). A graph above it (BERT and
        GPT-2 at s16: 0.92-1.32x eager's time unpacked) is packed before its measurement
        instead of measured twice."""
        calls = self._with_eager("onnxruntime", program, args)
        policy = SpeedPolicy(self.config.options.speed_margin)
        with torch.no_grad():  # one round, each side settled and warm, as the measurement
            times = policy.engine_times(calls, f"probe@graph{self.index}", rounds=1, warmup=False)
        ort_s, eager_s = times["onnxruntime"][0], times["eager"][0]
        limit = self._torch_below(unpacked=True) * defaults.UNPACKED_PROBE_SLACK
        return eager_s > 0 and ort_s / eager_s <= limit

    def _against_eager(
        self, engine: str, program: Any, args: Sequence[Any]
    ) -> tuple[str, dict[str, float]]:
        """``engine``'s program timed against eager by safe mode's speed policy: the winner
        and each side's median."""
        calls = self._with_eager(engine, program, args)
        policy = SpeedPolicy(self.config.options.speed_margin)
        with torch.no_grad():
            return policy.choose(
                calls, "eager", f"engine@graph{self.index}", rounds=defaults.ENGINE_TIMING_ROUNDS
            )

    def _unpacked_leads(self, best: str, medians: dict[str, float], alone: bool = False) -> bool:
        """Whether onnxruntime's program, timed without its packed weights, is chosen as it is
        (``engine_notes["packing"]`` says so): it beat eager and ran at
        :data:`~graph_autofusion.defaults.TORCH_PROGRAM_BELOW` x
        :data:`~graph_autofusion.defaults.UNPACKED_SLOWER` of eager's time or less (scaled
        as :meth:`_torch_cannot_win` scales it), where packed it would not have been slower
        and the torch program would not have been built. Its weights are packed once the
        graph is hot (:data:`PACK_AFTER_CALLS`), never for the first call alone. ``alone``:
        no torch program is to be built (``engine="onnxruntime"``, compressed weights, a
        saved plan's engine): beating eager unpacked settles it whatever the ratio."""
        ratio = medians["onnxruntime"] / medians["eager"]
        limit = float("inf") if alone else self._torch_below(unpacked=True)
        if best != "onnxruntime" or ratio > limit:
            return False
        self.engine_notes["packing"] = (
            f"timed without its packed weights at {ratio:.2f}x eager's time: chosen as it "
            f"is, packed once the graph is hot"
        )
        return True

    def _torch_below(self, unpacked: bool = False) -> float:
        """:data:`~graph_autofusion.defaults.TORCH_PROGRAM_BELOW`, moved with the user's
        ``speed_margin`` over the default's; ``unpacked``: for a ratio measured without the
        packed weights (times :data:`~graph_autofusion.defaults.UNPACKED_SLOWER`: packed,
        the session runs at least that much faster)."""
        margin = self.config.options.speed_margin
        below = defaults.TORCH_PROGRAM_BELOW * margin / defaults.SPEED_MARGIN
        return below * defaults.UNPACKED_SLOWER if unpacked else below

    def _torch_cannot_win(
        self, built: dict[str, Any], relative: dict[str, float], check: bool
    ) -> bool:
        """Whether the torch program is not worth building (``engine_notes["not built"]`` says
        why): onnxruntime's program was built and either nothing is timed (onnxruntime would
        run the graph anyway) or it ran at :data:`~graph_autofusion.defaults.
        TORCH_PROGRAM_BELOW` of eager's time or less (scaled by the user's ``speed_margin``
        over the default's: the torch program must beat onnxruntime by that margin; times
        :data:`~graph_autofusion.defaults.UNPACKED_SLOWER` for a ratio measured without the
        packed weights)."""
        if "onnxruntime" not in built:
            return False
        if check:
            ratio = relative.get("onnxruntime")
            margin = self.config.options.speed_margin
            ort = getattr(built["onnxruntime"], "program", None)
            unpacked = ort is not None and ort.timed_unpacked()
            if ratio is None or ratio > self._torch_below(unpacked):
                return False
            why = (
                f"onnxruntime ran at {ratio:.2f}x eager's time"
                + (" without its packed weights" if unpacked else "")
                + f"; the torch program would have to run at {ratio / margin:.2f}x"
            )
        else:
            why = "no speed check: onnxruntime runs the graph"
        self.engine_notes["not built"] = f"torch program: {why}"
        return True

    def _against_leader(
        self, leader: str, engine: str, built: dict[str, Any], args: Sequence[Any]
    ) -> str | None:
        """``engine`` measured against ``leader``, an engine already faster than eager; eager
        is not timed again (on a BERT-base prefill its calls were a third of the compile's
        timing). Returns the engine chosen, or ``None`` when ``engine`` may be the faster and
        is to be timed against eager too.

        The leader still open (an onnxruntime session that packs nothing, e.g. a decode graph
        on ``Gemv``): the two in one interleaved measurement, which a change of load between
        two separate measurements cannot sway; ``engine`` must beat the leader by the speed
        margin (a tie keeps the leader: onnxruntime reads the parameters in place); the
        winner beat eager, directly or through the leader (``engine_notes["head_to_head"]``).
        The leader's session let go (it packed its weights): ``engine`` timed alone; no
        faster than the leader's time by the margin, the leader stays
        (``engine_notes["alone"]``); else ``None``, and it must then win by its ratio to eager
        and by its time alike."""
        policy = SpeedPolicy(self.config.options.speed_margin)
        call = functools.partial(built[engine], *args)
        key = f"engine@graph{self.index}"
        if _holds_session(built[leader]):
            calls = {engine: call, leader: functools.partial(built[leader], *args)}
            with torch.no_grad():
                best, medians = policy.choose(
                    calls, engine, key, rounds=defaults.ENGINE_TIMING_ROUNDS
                )
            self.engine_times.update(medians)
            self.engine_notes["head_to_head"] = ", ".join(
                f"{k} {v * 1e3:.3f} ms" for k, v in medians.items()
            )
            return best
        with torch.no_grad():
            alone = policy.engine_times({engine: call}, key, rounds=defaults.ENGINE_TIMING_ROUNDS)
        self.engine_times[engine] = median = statistics.median(alone[engine])
        if median * policy.margin < self.engine_times[leader]:
            return None
        self.engine_notes["alone"] = (
            f"{engine} {median * 1e3:.3f} ms alone, not {policy.margin:.2f}x faster than "
            f"{leader}'s {self.engine_times[leader] * 1e3:.3f} ms"
        )
        return leader

    def _thread_choice(self, program: Any, args: Sequence[Any]) -> Any:
        """``program`` (an onnxruntime program), or the same fused model on one thread when
        the graph is small (weights under :data:`~graph_autofusion.defaults.
        FEW_THREADS_WEIGHT_BYTES`, or calls under :data:`~graph_autofusion.defaults.
        FEW_THREADS_BELOW_S`) and one thread measures faster by :data:`~graph_autofusion.
        defaults.FEW_THREADS_MARGIN`: waking sleeping workers costs more than a
        sub-millisecond graph's parallel work saves."""
        from graph_autofusion.torch_ort import OrtGraphProgram

        ort = program.program
        if ort.threads <= 1:
            return program
        small = ort.in_place_bytes < defaults.FEW_THREADS_WEIGHT_BYTES
        if not small:
            quick = []
            with torch.no_grad():
                for _ in range(3):
                    t = time.perf_counter()
                    program(*args)
                    quick.append(time.perf_counter() - t)
            # an unpacked session runs at least UNPACKED_SLOWER slower than it serves packed
            slower = defaults.UNPACKED_SLOWER if ort.timed_unpacked() else 1.0
            small = min(quick) < defaults.FEW_THREADS_BELOW_S * slower
        if not small:
            return program
        solo = _OrtCall(
            OrtGraphProgram(
                ort.model,
                ort.user_inputs,
                1,
                prepack=ort.packs,
                pack_later=not ort.prepack,
                spinning=ort.spinning,
                flush_denormals=ort.flush_denormals,
                placeholder=ort.placeholder,  # what the checked session needed
            ),
            self,
        )
        many = f"{ort.threads} threads"
        sides = {many: program, "1 thread": solo}
        calls = {k: functools.partial(fn, *args) for k, fn in sides.items()}
        with torch.no_grad():
            times = SpeedPolicy(self.config.options.speed_margin).engine_times(
                calls, f"threads@graph{self.index}"
            )
        med = {k: statistics.median(v) for k, v in times.items()}
        if med["1 thread"] * defaults.FEW_THREADS_MARGIN < med[many]:
            self.engine_notes["threads"] = (
                f"onnxruntime on one thread: {med['1 thread'] * 1e3:.3f} ms against "
                f"{med[many] * 1e3:.3f} on {ort.threads}"
            )
            return solo
        return program

    # ------------------------------------------------------------------ facts
    def engine_record(self) -> dict[str, Any]:
        """The engine that runs the graph, as a report shows it (``FuseResult.engine``):
        ``name``, ``why`` (how it was chosen), each engine's ``ms`` on the first call, and
        ``notes`` (the measurements' notes; the engine not chosen, with its fusions)."""
        name = "eager" if self.fallback else self.engine
        failed = [e for e in ENGINES[:-1] if e != name and e in self.engine_notes]
        if self.fallback:
            why = f"fallback: {self.fallback}"
        elif self.plan_source == "saved" and len(self.engine_times) < 2:
            why = "the saved plan's engine"
        elif self.engine_times:
            why = "measured on the first call's inputs"
        elif self.config.engine != "auto":
            why = f"engine={self.config.engine!r} asked for"
        elif failed:
            why = f"the {failed[0]} engine could not be built"
        else:
            why = "no speed check: onnxruntime, built first"
        notes = dict(self.engine_notes)
        for other, res in (("onnxruntime", self.ort_result), ("torch", self.result)):
            if other != name and res is not None:
                codes = ", ".join(sorted({b.code for b in res.rolled_back}))
                notes[f"{other} engine (not chosen)"] = (
                    f"{len(res.lowered)} fused, {len(res.rolled_back)} rolled back"
                    + (f" ({codes})" if codes else "")
                )
        return {
            "name": name,
            "why": why,
            "ms": {k: round(v * 1e3, 4) for k, v in self.engine_times.items()},
            "notes": notes,
            "graph": self.index,
        }

    def summary(self) -> dict[str, Any]:
        """The graph's facts: its engine (and each engine's time on the first call), its
        fusions on that engine, its calls."""
        res = self.ort_result if self.engine == "onnxruntime" else self.result
        return {
            "graph": self.index,
            "fallback": self.fallback,
            "engine": self.engine or ("eager" if self.fallback else ""),
            "engine_ms": {k: round(v * 1e3, 3) for k, v in self.engine_times.items()},
            "engine_notes": dict(self.engine_notes),
            "compile_seconds": round(self.compile_seconds, 3),
            "nodes": len(self.imported.graph.nodes) if self.imported is not None else None,
            "fused_groups": len(res.lowered) if res is not None else 0,
            "rolled_back": [(r.key, r.code) for r in res.rolled_back] if res is not None else [],
            "calls": self.calls,
            "eager_calls": self.eager_calls,
            "onnxruntime_failures": self.ort_failures,
            "weight_sets": len(self._programs),
            "plan": self.plan_source,
        }


_VERSION = operator.attrgetter("_version")
#: A constant argument's memory: ``param.data = other`` keeps the tensor and its version but
#: not its storage, which the program (an onnxruntime session reading it in place, or a packed
#: copy) would no longer see
_DATA_PTR = torch.Tensor.data_ptr


def _data_ptrs(refs: Sequence[Any]) -> list[int] | None:
    """The constant arguments' data pointers; None where one has no storage of its own (a
    wrapper tensor subclass), whose memory is then not checked."""
    try:
        return list(map(_DATA_PTR, refs))
    except (RuntimeError, TypeError):
        return None


def _changed(p: Program) -> list[int]:
    """The arguments (indices) among ``p``'s constants written in place since it was compiled
    (a newer version) or now over other memory; ``p``'s tensors themselves, not a call's."""
    then = dict(zip(map(id, p.versioned), p.versions))
    ptrs = _data_ptrs(p.refs) if p.ptrs is not None else None
    return [
        i
        for k, (i, r) in enumerate(zip(p.indices, p.refs))
        if (id(r) in then and r._version != then[id(r)])
        or (ptrs is not None and ptrs[k] != p.ptrs[k])
    ]


class Program(NamedTuple):
    """A graph's program for one set of constant arguments, and what it was compiled for;
    another weight, number or size there compiles again."""

    pick: Callable[[Sequence[Any]], tuple]  # the constant arguments of a call
    refs: tuple  # the tensors compiled for ...
    versioned: tuple  # (those with a version counter: not inference tensors) ...
    versions: list[int]  # ... at these versions ...
    ptrs: list[int] | None  # ... over this memory (None: not checked, _data_ptrs)
    program: Any
    scalars: tuple  # (index, value): 0-d floats taken as numbers (FxImport.scalars)
    sizes: tuple  # (index, axis, value): sizes the export fixed (FxImport.sizes)
    indices: tuple = ()  # the arguments ``pick`` takes (FxImport.constant_inputs)
    ort: Any = None  # its onnxruntime program (OrtGraphProgram), if it runs on onnxruntime


def _size(arg: Any, axis: int | None) -> Any:
    """An argument's size along ``axis`` (a tensor's), or the argument (an int)."""
    return arg if axis is None else arg.shape[axis]


def _holds_session(program: Any) -> bool:
    """Whether an onnxruntime program (possibly wrapped) still has its session open."""
    ort = getattr(program, "program", program)
    return program is not None and getattr(ort, "session", None) is not None


def _row_major(program: Callable[..., Any]) -> Callable[..., Any]:
    """``program`` returning its tensors row-major (contiguous), as onnxruntime's come back.

    A graph's outputs are the next frame's inputs (a decode step's cache), and Dynamo guards
    their strides: with one graph on onnxruntime (row-major) and the one before it on the
    torch program or eager (a value cache is a transposed view there), every step would fail
    a stride guard and compile again, until Dynamo's recompile limit sends the frame to
    eager. One layout for every engine keeps one compiled frame per shape. A copy is made
    only for an output that is not contiguous (a fresh prefill's cache)."""

    def run(*args: Any) -> Any:
        out = program(*args)
        if isinstance(out, tuple | list):
            fixed = _row_major_all(out)
            return out if fixed is out else type(out)(fixed)
        return out.contiguous() if isinstance(out, torch.Tensor) else out

    return run


def _row_major_all(outs: Sequence[Any]) -> Sequence[Any]:
    """``outs`` with every non-contiguous tensor copied row-major (``outs`` itself when none)."""
    if all(t.is_contiguous() for t in outs if isinstance(t, torch.Tensor)):
        return outs
    return tuple(t.contiguous() if isinstance(t, torch.Tensor) else t for t in outs)


def _picker(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """A function returning the arguments at ``indices`` as a tuple (``itemgetter`` returns a
    bare item for one index and needs at least one)."""
    if not indices:
        return lambda args: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*indices)


class _OrtCall:
    """The onnxruntime program of a graph; a call onnxruntime fails (a shape it cannot run)
    runs in eager, with one warning, and the next call tries onnxruntime again."""

    def __init__(self, program: Any, graph: CompiledGraph) -> None:
        self.program = program
        self.graph = graph

    def __call__(self, *args: Any) -> Any:
        try:
            return self.program(*args)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
            g = self.graph
            g.ort_failures += 1
            if g.ort_failures == 1:
                warnings.warn(
                    f"autofusion: graph {g.index}: onnxruntime failed on this call, which "
                    f"runs in eager ({' '.join(str(exc).split())[:200]})",
                    AutofusionWarning,
                    stacklevel=3,
                )
            out = g.core_gm.forward(*args)  # writes into the arguments itself
            out = _row_major_all(tuple(out) if isinstance(out, tuple | list) else (out,))
            return out if g._writes is None else (*out, *g._writes.written(args))


def make_backend(
    *,
    preset: str = "all",
    hardware: Any = "host",
    safe_mode: bool = True,
    check_speed: bool = True,
    options: FuseOptions | None = None,
    rules: Any = None,
    engine: str = "auto",
) -> Callable[..., Any]:
    """A ``torch.compile`` backend with these settings; ``backend.config.graphs`` lists what
    it compiled. ``check_speed``: safe mode also times each fusion against its operators on
    the real shapes (rolled back when slower) and plans the close calls the cost model marks
    ``maybe``. ``engine``: ``auto`` builds the onnxruntime program for each graph and, unless
    it already leads eager too far for the torch program to win (or speed is not checked;
    ``CompiledGraph._torch_cannot_win``), the torch program, and keeps the faster on the first
    call's inputs (eager when both are slower); ``onnxruntime`` or ``torch`` builds only that
    one."""
    opts = options or FuseOptions(target="cpu", safe_mode=safe_mode, check_speed=check_speed)
    if opts.target != "cpu":
        opts = opts.replace(target="cpu")
    if engine not in ("auto", *ENGINES[:-1]):
        raise OptionsError(f"unknown engine {engine!r}; known: ['auto', 'onnxruntime', 'torch']")
    if engine == "torch" and opts.weights != "fp32":
        raise OptionsError(
            f"weights={opts.weights!r} runs on the onnxruntime engine (MatMulNBits); the torch "
            f"engine's kernels take fp32 weights (use engine='auto' or 'onnxruntime')"
        )
    config = BackendConfig(
        preset=preset, hardware=hardware, options=opts, rules=rules, engine=engine
    )

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        kinds = tensor_outputs(gm)
        if not any(n.op in _COMPUTES for n in gm.graph.nodes) or (kinds and not any(kinds)):
            # nothing to fuse: a graph that returns its inputs, nothing, or only sizes
            return gm.forward
        graph = CompiledGraph(gm, config, len(config.graphs))
        config.graphs.append(graph)
        torch_recompiles.note_frame(config)
        return graph

    backend.config = config  # type: ignore[attr-defined]
    return backend


_DEFAULT: Callable[..., Any] | None = None
#: The FX node kinds that compute something (a graph without any is run as it is).
_COMPUTES = frozenset({"call_function", "call_method", "call_module"})


def autofusion_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Any = None
) -> Any:
    """The registered ``autofusion`` backend (default settings; see :func:`make_backend`).
    ``options``: what ``torch.compile(model, backend="autofusion", options={...})`` passes: a
    dict of :func:`make_backend`'s settings (``preset``, ``hardware``, ``safe_mode``,
    ``check_speed``, ``engine``) and :class:`FuseOptions` fields (``{"weights": "int8"}``),
    or a :class:`FuseOptions`; one backend per distinct dict in a process.

    Raises:
        OptionsError: a key that is neither (named, with the known ones).
    """
    global _DEFAULT
    if options:
        return _options_backend(options)(gm, example_inputs)
    if _DEFAULT is None:
        _DEFAULT = make_backend()
    return _DEFAULT(gm, example_inputs)


#: make_backend's settings that ``torch.compile``'s ``options`` dict may carry besides
#: FuseOptions fields (``safe_mode`` and ``check_speed`` are fields)
_BACKEND_SETTINGS = ("preset", "hardware", "engine")
_BY_OPTIONS: dict[str, Callable[..., Any]] = {}


def _options_backend(options: Any) -> Callable[..., Any]:
    """The backend of ``torch.compile``'s ``options`` (made once per distinct value)."""
    key = repr(sorted(options.items(), key=str) if isinstance(options, Mapping) else options)
    backend = _BY_OPTIONS.get(key)
    if backend is None:
        settings, fields = {}, options
        if isinstance(options, Mapping):
            settings = {k: v for k, v in options.items() if k in _BACKEND_SETTINGS}
            fields = {k: v for k, v in options.items() if k not in _BACKEND_SETTINGS}
        backend = make_backend(options=FuseOptions.coerce(fields), **settings)
        _BY_OPTIONS[key] = backend
    return backend


def default_graphs() -> list[CompiledGraph]:
    """The graphs the registered backend compiled in this process (with ``torch.compile``'s
    ``options`` too: the backend of each distinct dict, after the default one's)."""
    backends = ([_DEFAULT] if _DEFAULT is not None else []) + list(_BY_OPTIONS.values())
    return [g for b in backends for g in b.config.graphs]  # type: ignore[attr-defined]
