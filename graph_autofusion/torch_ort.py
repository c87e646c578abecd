"""The PyTorch route on onnxruntime: one Dynamo graph, fused by the ONNX route, run by one
onnxruntime session over the module's own parameters.

    program = build_ort_program(imported, args, reference, rules, profile, options)
    outs = program(*args)          # Dynamo's arguments in, a tuple of torch tensors out

The graph, imported into the IR (:func:`~graph_autofusion.frontend.torch_frontend.import_fx`:
parameters as initializers over the parameters' memory, Dynamo's symbolic sizes as symbolic
dims), goes through exactly the ONNX route's planning, native operators, lowering and safe mode
(:func:`graph_autofusion.pipeline.fuse_model`, the plan ``analyze()`` shows), with the call's
real inputs as the sample inputs. The fused model becomes one onnxruntime session (CPU
provider, the user's thread setting) whose large fp32/fp64 initializers are onnxruntime values
over the parameters (``ort_session(in_place=...)``): the weights are not copied (a linear
weight's transpose is read from the parameter through ``transB``), beyond what onnxruntime's
GEMM packs: none for a decode step's few rows, and none until the graph is called a second
time (``torch_compile.PACK_AFTER_CALLS``). Nor are they written to disk while the session is
made: the placeholder file onnxruntime's optimizer reads holds only the weights it may rewrite
(``placeholder="rewritable"``); a session that came out wrong that way is made again with
every weight written (:meth:`OrtGraphProgram.write_weights`, after the first call's check).
Symbolic sizes stay symbolic in the ONNX graph, so
one session serves every sequence, batch and cache length.

Inputs cross without copies (numpy views of the tensors); outputs come back as torch tensors
over onnxruntime's result arrays. A graph onnxruntime cannot run (an opaque ``aten`` operator,
bfloat16) raises :class:`OrtEngineRefused`; the caller keeps the torch program.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from graph_autofusion import defaults
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.node import from_constants
from graph_autofusion.runtime.denormals import denormals_flushed
from graph_autofusion.runtime.ort_session import (
    SERVING_MODES,
    SERVING_SPINNING,
    model_weights,
    ort_session,
)


class OrtEngineRefused(GraphAutoFusionError):
    """onnxruntime cannot run this graph (the reason says why); another engine runs it."""


class OrtGraphProgram:
    """A fused IR model in one onnxruntime session, called with Dynamo's arguments.

    ``user_inputs[j]`` is the argument feeding the model's graph input ``j``; the other
    arguments are the parameters the session reads in place (or sizes it reads from tensors).
    A run that fails on a new shape raises; the caller falls back for that call.
    """

    def __init__(
        self,
        model: Any,
        user_inputs: Sequence[int],
        threads: int | None,
        prepack: bool = True,
        spinning: bool | str = SERVING_SPINNING,
        flush_denormals: bool = True,
        placeholder: str = "full",
        pack_later: bool = False,
    ) -> None:
        self.model = model
        self.user_inputs = tuple(user_inputs)
        self.input_names = [v.name for v in model.graph.inputs]
        self.output_names = [v.name for v in model.graph.outputs]
        self.in_place_bytes = sum(a.nbytes for a in model_weights(model).values())
        self.threads = threads or torch.get_num_threads()
        # ``packs``: the form the graph serves once hot; ``prepack``: the open session's.
        # ``pack_later``: opened without the packed weights, packed when the caller decides
        self.packs = prepack
        self.prepack = prepack and not (pack_later and self._deferrable())
        self.spinning = spinning  # the session's mode (FuseOptions.spinning)
        self.flush_denormals = flush_denormals  # FuseOptions.denormals == "flush"
        # ort_session's placeholder; "rewritable" (build_ort_program's, where the first call
        # is checked): the weights the optimizer reads as given are not written out while a
        # session is created, and the caller calls write_weights() if the outputs differ
        self.placeholder = placeholder
        # held while the session is opened again: a call from another thread that finds no
        # session waits for the new one instead of failing
        self._reopening = threading.Lock()
        self.session = self._open(self.prepack)

    def _deferrable(self) -> bool:
        """No ``MatMulNBits`` (which, unpacked, dequantizes its whole weight on every call),
        and packed weights large enough to be worth a second session once the graph is hot
        (:data:`~graph_autofusion.defaults.PACK_LATER_MIN_BYTES`)."""
        nodes = self.model.graph.nodes
        if any(n.op_type == "MatMulNBits" for n in nodes):
            return False
        return packable_bytes(self.model) >= defaults.PACK_LATER_MIN_BYTES

    def timed_unpacked(self) -> bool:
        """Whether the open session lacks the packed weights its graph serves with once hot."""
        return self.packs and not self.prepack

    def _open(self, prepack: bool) -> Any:
        return ort_session(
            self.model,
            level="all",
            threads=self.threads,
            spinning=self.spinning,
            in_place=model_weights(self.model),
            prepack=prepack,
            flush_denormals=self.flush_denormals,
            placeholder=self.placeholder,
        )

    def write_weights(self) -> bool:
        """Open the session again with every weight in the placeholder file its optimizer reads
        (``placeholder="full"``); False when nothing was left out of it (nothing to try)."""
        if self.placeholder == "full" or not getattr(self.session, "_autofusion_holes", 0):
            return False
        self.placeholder = "full"
        self.session = None
        self.session = self._open(self.prepack)
        return True

    def set_packing(self, prepack: bool) -> None:
        """Open the session again with (or without) onnxruntime's packed copy of the constant
        GEMM weights. The old session goes first, so the two never hold weights at once."""
        if prepack != self.prepack:
            self._reopen(prepack, self.spinning)

    def set_spinning(self, spinning: bool | str) -> None:
        """Open the session again with another spinning mode (``ort_session``'s); no garbage
        collection first (a serving call waits for it; the old session goes when its count
        drops, after any call still inside it on another thread)."""
        if spinning != self.spinning:
            self._reopen(self.prepack, spinning, collect=False)

    def _reopen(self, prepack: bool, spinning: bool | str, collect: bool = True) -> None:
        from graph_autofusion.torch_outputs import give_back_memory

        with self._reopening:
            old = self.prepack, self.spinning
            self.session = None  # (a call still inside the old one keeps it until it returns)
            give_back_memory(collect=collect)
            try:
                self.prepack, self.spinning = prepack, spinning
                self.session = self._open(prepack)
            except Exception:  # noqa: BLE001 - the session it had opens again
                self.prepack, self.spinning = old
                self.session = self._open(self.prepack)

    def release(self) -> None:
        """Let the session (and its packed weights) go; :meth:`reopen` opens it again."""
        self.session = None

    def reopen(self) -> None:
        """Open the session again after :meth:`release` (as it was: packed or not)."""
        if self.session is None:
            self.session = self._open(self.prepack)

    def can_defer_packing(self) -> bool:
        """Whether the session may run unpacked until the graph proves hot: it packs (or will),
        and :meth:`_deferrable`."""
        return self.packs and self._deferrable()

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        feeds = {n: _as_numpy(args[i]) for n, i in zip(self.input_names, self.user_inputs)}
        session = self.session
        if session is None:  # opened again on another thread: wait for it
            with self._reopening:
                session = self.session
            if session is None:
                raise GraphAutoFusionError("the onnxruntime session is not open")
        outs = session.run(self.output_names, feeds)
        return tuple(torch.from_numpy(np.asarray(o)) for o in outs)


def _as_numpy(x: Any) -> np.ndarray:
    """A numpy view of a CPU tensor (a copy only when it is not contiguous)."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        return t.numpy()
    return np.asarray(x)


def refusal(model: Any) -> str | None:
    """Why onnxruntime cannot run ``model`` as imported, or ``None``."""
    opaque = sorted({n.op_type for n in model.graph.nodes if n.domain == "aten"})
    if opaque:
        return f"operators with no ONNX form: {', '.join(opaque[:5])}"
    values = list(model.graph.inputs) + list(model.graph.outputs)
    if any(v.dtype == DType.BFLOAT16 for v in values):
        return "bfloat16 values (onnxruntime's CPU kernels lack most of them)"
    return None


def build_ort_program(
    imported: Any,
    args: Sequence[Any],
    rules: Any,
    profile: Any,
    options: Any,
    keys: Sequence[str] | None = None,
    weight_layers: Sequence[str] | None = None,
) -> tuple[OrtGraphProgram, Any]:
    """Fuse the imported graph with the ONNX route (safe mode on this call's inputs) and open
    its session (``keys``: a saved plan's fusions instead of planning; ``weight_layers``: the
    contractions a saved plan compressed, the only ones compressed now). Returns the program
    and the ONNX route's ``FuseResult``.

    Raises:
        OrtEngineRefused: onnxruntime cannot run the graph, or the fused model fails to load.
    """
    from graph_autofusion.pipeline import fuse_model

    model = imported.model
    why = refusal(model)
    if why is not None:
        raise OrtEngineRefused(why)
    feeds = {v.name: _as_numpy(args[i]) for v, i in zip(model.graph.inputs, imported.user_inputs)}
    # the session lives in this process, on this machine: the custom-operator library (our
    # kernels, and the few-row Gemv reading a linear weight in place) needs no shipping
    opts = options.replace(target="onnxruntime", custom_ops=True)
    try:
        with torch.no_grad():
            result = fuse_model(
                model,
                rules,
                profile,
                options=opts,
                feeds=feeds,
                keys=keys,
                weight_layers=weight_layers,
            )
    except GraphAutoFusionError as exc:
        raise OrtEngineRefused(f"the ONNX route failed: {exc}") from exc
    try:
        program = OrtGraphProgram(
            result.model,
            imported.user_inputs,
            options.threads,
            prepack=_worth_packing(result),
            spinning=SERVING_MODES[options.spinning],
            flush_denormals=denormals_flushed(options.denormals),
            placeholder=_placeholder(options),
            pack_later=True,  # packed once the caller decides (timed, or hot)
        )
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
        raise OrtEngineRefused(
            f"onnxruntime refuses the fused graph: {' '.join(str(exc).split())[:300]}"
        ) from exc
    return program, result


def _placeholder(options: Any) -> str:
    """``"rewritable"`` (weights the optimizer reads as given left out of the file its session
    is made from) only where the first call's check against eager is the fp32 one, which a
    weight read as zeros cannot pass; compressed weights, or a looser floor the user set, are
    checked more loosely: every weight is written."""
    strict = options.weights == "fp32" and options.e2e_cosine_floor >= defaults.E2E_COSINE
    return "rewritable" if strict else "full"


#: A static graph whose contractions by a constant matrix have at most this many rows (the
#: first decode step, at one cache length) runs them unpacked: packing would give its session
#: a copy of every weight for the one call such a graph serves in a ``generate()``. Dynamic
#: graphs (every later step) pack: unpacked, a decode step measured ~20% slower.
FEW_ROWS = 8


def _worth_packing(result: Any) -> bool:
    nodes = list(result.model.graph.nodes)
    if any(n.op_type == "MatMulNBits" for n in nodes):
        return True  # unpacked, MatMulNBits dequantizes its whole weight on every call
    if not any(_packable(n) for n in nodes):
        return False  # e.g. every contraction by a weight is a Gemv over the parameter
    static = all(isinstance(d, int) for v in result.model.graph.inputs for d in (v.shape or ()))
    return not (static and few_rows(result))


#: Operators onnxruntime may pack a constant operand of (a copy in its own layout): every
#: contraction, convolution and recurrence, and the control flow whose bodies may hold them.
_PACKING_OPS = frozenset(
    "MatMul Gemm FusedMatMul FusedGemm MatMulNBits MatMulInteger DynamicQuantizeMatMul "
    "Conv FusedConv ConvTranspose LSTM GRU RNN Attention QAttention If Loop Scan".split()
)


def _packable(node: Any) -> bool:
    """Whether onnxruntime may pack a weight for ``node``. Conservative: control flow (its
    bodies may hold contractions), and any operator of :data:`_PACKING_OPS` whose first or
    second operand is constant data (a GEMM's ``B``, a convolution's or a recurrence's ``W``,
    contrib ``Attention``'s weights); not a product of two activations (attention's)."""
    if node.op_type not in _PACKING_OPS:
        return False
    if node.op_type in ("If", "Loop", "Scan"):
        return True
    return any(from_constants(v) for v in node.inputs[:2] if v is not None)


def packable_bytes(model: Any) -> float:
    """The bytes of the weights onnxruntime may pack a copy of (:func:`_packable` nodes'
    constant operands); infinite when one is computed from constants (size not known here)."""
    total = 0.0
    seen: set[str] = set()
    for n in model.graph.nodes:
        if not _packable(n):
            continue
        if n.op_type in ("If", "Loop", "Scan"):
            return float("inf")
        for v in n.inputs[:2]:  # the packed operands (a bias is read as it is)
            if v is None or v.name in seen or not from_constants(v):
                continue
            seen.add(v.name)
            if not isinstance(v.const, np.ndarray):
                return float("inf")
            total += v.const.nbytes
    return total


def few_rows(result: Any) -> bool:
    """Whether every contraction by a constant matrix in the fused model has at most
    :data:`FEW_ROWS` rows on the sample inputs (the analysis' shape binding)."""
    binding = getattr(getattr(result, "analysis", None), "binding", None)
    types = getattr(binding, "types", None) or {}
    rows = []
    for n in result.model.graph.nodes:
        if n.op_type not in ("MatMul", "Gemm", "FusedMatMul") or len(n.inputs) < 2:
            continue
        b = n.inputs[1]
        if b is None or b.const is None or n.inputs[0] is None:
            continue
        t = types.get(n.inputs[0].name)
        if t is None or t[1] is None:
            return False
        rows.append(int(np.prod(t[1][:-1])) if len(t[1]) > 1 else 1)
    return bool(rows) and max(rows) <= FEW_ROWS
