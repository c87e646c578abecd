"""One typed, frozen record of the fusion options, shared by the API, the CLI and the pipeline.

    opts = FuseOptions(target="cpu", benefit_threshold=0.1)
    opts = opts.replace(safe_mode=False)

Defaults live in :mod:`graph_autofusion.defaults` and reach every stage through this record:
the 0.2 benefit threshold, the 0.9999 end-to-end cosine floor, the 1.10 speed margin, the 8
Monte-Carlo samples, the 64-node / 8-input cluster limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graph_autofusion import defaults
from graph_autofusion.codegen.compiler import CodegenOptions
from graph_autofusion.codegen.targets import TARGET_NAMES
from graph_autofusion.errors import OptionsError
from graph_autofusion.planner.controls import parse_keep_fp32, parse_size_switch
from graph_autofusion.planner.plan import STRATEGIES
from graph_autofusion.runtime.denormals import DENORMAL_MODES

DEFAULT_BENEFIT_THRESHOLD = defaults.BENEFIT_THRESHOLD
DEFAULT_E2E_COSINE = defaults.E2E_COSINE
DEFAULT_MAX_CLUSTER_NODES = defaults.MAX_CLUSTER_NODES
DEFAULT_MAX_CLUSTER_INPUTS = defaults.MAX_CLUSTER_INPUTS
TARGETS = TARGET_NAMES
#: The weight forms of ``FuseOptions.weights`` (:mod:`graph_autofusion.pipeline.weights`).
WEIGHT_FORMS = ("fp32", "fp16", "int8", "int4")
#: ``FuseOptions.weights_policy``: ``default`` keeps the LM head and the embedding tables at a
#: higher precision (fp16 in an int8 model; in an int4 one the head int8, the tables fp16; fp32
#: in an fp16 one); ``all`` compresses them
#: too (the head at int8 at most, the tables at int8; fp16 in an fp16 model), still verified.
WEIGHT_POLICIES = ("default", "all")
#: ``FuseOptions.weights_kernel``: what runs an int8/int4 contraction. ``auto``: safe mode times
#: onnxruntime's ``MatMulNBits`` against our ``GemvQ`` per layer shape (with ``check_speed``;
#: untimed, ``MatMulNBits``); ``MatMulNBits`` / ``GemvQ``: that kernel, not timed against the
#: other (a layer ``GemvQ`` cannot take stays ``MatMulNBits``, the report's note counts them).
WEIGHT_KERNELS = ("auto", "MatMulNBits", "GemvQ")
#: ``FuseOptions.weights_goal``: ``speed`` keeps a layer fp32 where safe mode times it slower
#: compressed; ``size`` compresses every layer that passes its accuracy checks, timed or not.
WEIGHT_GOALS = ("speed", "size")
#: onnxruntime's idle workers in the sessions that serve a fused model (``FuseOptions.spinning``)
SPINNING = ("auto", "run", "on", "off")


def _known_fields(changes: Mapping[str, Any]) -> None:
    fields = [f.name for f in dataclasses.fields(FuseOptions)]
    unknown = sorted(str(k) for k in changes if k not in fields)
    if unknown:
        raise OptionsError(f"unknown option(s) {unknown}; FuseOptions has {fields}")


@dataclass(frozen=True)
class FuseOptions:
    """How to plan, fuse and verify.

    Attributes:
        target: ``onnxruntime`` (fused operators onnxruntime ships) or ``cpu`` (generated C
            kernels, every other operator on torch's kernels).
        benefit_threshold: Minimum estimated relative saving of a fusion.
        strategy: Planner strategy: ``auto``, ``greedy``, ``dp``, ``evolutionary``.
        max_cluster_nodes, max_cluster_inputs: Limits of automatic clustering.
        clustering: Whether the target's plan includes automatic clusters (the cpu target
            can execute them; onnxruntime cannot).
        safe_mode: Verify every fusion and roll back failures.
        check_speed: Safe mode also times each fusion against its unfused operators.
        speed_margin: A fusion fails the speed check when slower than ``margin`` x unfused.
        cosine_floor: Per-fusion cosine floor (``None``: each rule's own tolerance).
        e2e_cosine_floor: Whole-model cosine floor.
        mc_samples: Monte-Carlo perturbation samples per fusion (onnxruntime target).
        fold_shapes: Fold provable run-time ``Reshape`` shapes to constants first.
        threads: Threads for kernels and timing (``None``: torch's setting).
        backend: ``c`` (compiled kernels) or ``reference`` (NumPy executes the kernel IR;
            only when asked for: it is slow).
        codegen: Compiler options (hashed into the kernel cache key).
        custom_ops: onnxruntime target: planned groups with no onnxruntime operator become
            generated kernels in one custom-operator library per model, which the fused
            model then needs (off by default: ``docs/onnxruntime-kernels.md`` says why).
        size_switches: Rules that apply only when an input's size meets a condition
            (``"attention:input_ids[1]>=128"`` or :class:`~graph_autofusion.planner.controls.
            SizeSwitch`), judged on the sample inputs.
        keep_fp32: Operators that compute in float32 inside float16 / bfloat16 models
            (``("BatchNormalization", "ReduceMean")``; ``("default",)``: BatchNormalization
            and the reductions): a fusion that would compute them in half precision is
            refused, and unfused they get float32 inputs (``planner.controls``).
        weights: How contractions by a constant matrix store their weights: ``fp32`` (as
            given, the default), ``int8`` or ``int4`` (blockwise, onnxruntime's
            ``MatMulNBits``), ``fp16`` (our ``GemvF16`` custom operator, fp32 accumulation);
            each layer verified by safe mode, failures kept fp32. Lossy only when asked for
            (``docs/compressed-weights.md``).
        weights_policy: ``default``: the LM head and the embedding tables stay at a higher
            precision (fp16 in an int8 model; in an int4 model the head int8 and the tables
            fp16; fp32 in an fp16 one); ``all``: they are
            compressed too (head int8 even for int4, fp16 in an fp16 model; tables int8
            ``GatherBlockQuantized`` in int models), each verified like every layer.
        weights_kernel: What runs an ``int8`` / ``int4`` contraction: ``auto`` (the default:
            with ``check_speed``, safe mode times onnxruntime's ``MatMulNBits`` against our
            ``GemvQ`` custom operator per layer shape and keeps the faster; without,
            ``MatMulNBits``), ``MatMulNBits`` or ``GemvQ`` (that kernel, not timed against the
            other; each layer still checked against fp32, a layer that fails going to int8 or
            fp32 as on ``auto``, never to the other kernel; a layer ``GemvQ`` cannot take, N not
            a multiple of 16 or K not in whole blocks, stays ``MatMulNBits``). Only with
            ``weights`` ``int8`` / ``int4``.
        weights_goal: ``speed`` (the default): with ``check_speed``, a layer safe mode times
            slower compressed than fp32 on the sample inputs stays fp32 (a prefill's many rows
            usually are; a decode step's one row is where compressed weights win); ``size``:
            every layer that passes its accuracy checks is compressed whatever its time (the
            times are still measured and reported, and the kernel race still runs), for a
            smaller file or less memory, with the other speed checks left on.
        spinning: onnxruntime's worker threads in the sessions that serve the fused model in
            this process (the PyTorch route's graphs, the cpu target's onnxruntime engine):
            ``auto`` (the default: ``run``, but ``on`` for a graph once it serves the drop-in
            module's decode loop, whose calls come back to back, and for a graph whose last
            few gaps between calls were quiet, until one is not:
            ``runtime.call_gaps``), ``run`` (they spin between
            the operators of a call and for at most a millisecond after it returns,
            so little of a core is taken from the work that follows), ``on`` (onnxruntime's
            own default: they also spin for tens of milliseconds after each call; the lowest
            latency for calls that come now and then in a process that does little else, at
            the cost of a core that work right after the call competes for), ``off`` (they
            block between operators too).
        denormals: ``flush`` (the default): the onnxruntime sessions that serve the fused
            model in this process (the PyTorch route's graphs, the cpu target's onnxruntime
            engine, ``FuseResult.run()``, ``fused_session()``) flush denormal floats (below
            1.18e-38) to zero on every thread that computes them, the caller's only for the
            length of a call; safe mode's speed and end-to-end checks run the fused side so.
            A model with large attention logits or GELU tails makes millions, each a microcode
            assist of ~100 cycles (the zoo MiniLM at s128: 21 -> 17 ms). ``keep``: IEEE
            denormals (onnxruntime's default). Results differ only where a value is itself
            below 1.18e-38 (``docs/denormals.md``).
    """

    target: str = "onnxruntime"
    benefit_threshold: float = DEFAULT_BENEFIT_THRESHOLD
    strategy: str = "auto"
    max_cluster_nodes: int = DEFAULT_MAX_CLUSTER_NODES
    max_cluster_inputs: int = DEFAULT_MAX_CLUSTER_INPUTS
    clustering: bool = True
    safe_mode: bool = True
    check_speed: bool = True
    speed_margin: float = defaults.SPEED_MARGIN
    cosine_floor: float | None = None
    e2e_cosine_floor: float = DEFAULT_E2E_COSINE
    mc_samples: int = defaults.MC_SAMPLES
    fold_shapes: bool = True
    threads: int | None = None
    backend: str = "c"
    codegen: CodegenOptions = field(default_factory=CodegenOptions)
    custom_ops: bool = False
    size_switches: tuple[Any, ...] = ()
    keep_fp32: tuple[str, ...] = ()
    weights: str = "fp32"
    weights_policy: str = "default"
    weights_kernel: str = "auto"
    weights_goal: str = "speed"
    spinning: str = "auto"
    denormals: str = "flush"

    def __post_init__(self) -> None:
        switches = (
            (self.size_switches,) if isinstance(self.size_switches, str) else self.size_switches
        )
        object.__setattr__(self, "size_switches", tuple(parse_size_switch(s) for s in switches))
        object.__setattr__(self, "keep_fp32", parse_keep_fp32(self.keep_fp32))

        if self.target not in TARGETS:
            raise OptionsError(f"unknown target {self.target!r}; known: {list(TARGETS)}")
        if self.strategy not in STRATEGIES:
            raise OptionsError(
                f"unknown planner strategy {self.strategy!r}; known: {list(STRATEGIES)}"
            )
        if self.backend not in ("c", "reference"):
            raise OptionsError(
                f"unknown kernel backend {self.backend!r}; known: ['c', 'reference']"
            )
        if self.weights not in WEIGHT_FORMS:
            raise OptionsError(f"unknown weight form {self.weights!r}; known: {list(WEIGHT_FORMS)}")
        if self.weights_policy not in WEIGHT_POLICIES:
            raise OptionsError(
                f"unknown weights policy {self.weights_policy!r}; known: {list(WEIGHT_POLICIES)}"
            )
        if self.weights_kernel not in WEIGHT_KERNELS:
            raise OptionsError(
                f"unknown weights kernel {self.weights_kernel!r}; known: {list(WEIGHT_KERNELS)}"
            )
        if self.weights_kernel != "auto" and self.weights not in ("int8", "int4"):
            raise OptionsError(
                f"weights_kernel={self.weights_kernel!r} chooses the kernel of int8/int4 "
                f"weights; weights={self.weights!r} has none to choose (use weights='int8' or "
                f"'int4', or leave weights_kernel='auto')"
            )
        if self.weights_goal not in WEIGHT_GOALS:
            raise OptionsError(
                f"unknown weights goal {self.weights_goal!r}; known: {list(WEIGHT_GOALS)}"
            )
        if self.spinning not in SPINNING:
            raise OptionsError(f"unknown spinning mode {self.spinning!r}; known: {list(SPINNING)}")
        if self.denormals not in DENORMAL_MODES:
            raise OptionsError(
                f"unknown denormals mode {self.denormals!r}; known: {list(DENORMAL_MODES)}"
            )
        if not (0.0 <= self.benefit_threshold < 1.0):
            raise OptionsError(f"benefit_threshold must be in [0, 1), got {self.benefit_threshold}")

    def replace(self, **changes: Any) -> FuseOptions:
        _known_fields(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def coerce(cls, value: Any, **defaults: Any) -> FuseOptions | None:
        """``value`` as a :class:`FuseOptions`: itself, ``None`` (kept ``None``), or a mapping
        of its fields (``{"weights": "int8"}``, what ``torch.compile(..., options=...)``
        passes), laid over ``defaults``.

        Raises:
            OptionsError: another type, or a key that is not a field (named, with the fields).
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            _known_fields(value)
            return cls(**{**defaults, **value})
        raise OptionsError(
            f"options must be a FuseOptions or a dict of its fields, got {type(value).__name__}"
        )
