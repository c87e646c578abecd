"""How an onnxruntime CPU session is made: the options every session of the project gets, and
weights read in place (:func:`open_session`).

This is the part of the one session helper (:func:`graph_autofusion.runtime.ort_session.
ort_session`) that needs nothing above the IR: it takes a serialized model, a path or a
``ModelProto``, and the custom-operator library to register, if any. ``ort_session`` adds what
needs the layers above (an IR model's conversion, finding the library of the model's custom
operators) and is what callers use; the host calibration (``cost/measure_ort.py``), which sits
below the code generator, calls this directly.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from graph_autofusion.runtime.denormals import SUPPORTED as DENORMALS_PER_CALL
from graph_autofusion.runtime.denormals import flushing_denormals, keeping_denormal_mode

_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


#: ``open_session``'s spinning modes: ``False`` (idle workers block), ``True`` (onnxruntime's
#: default: workers spin after each task, also for ~40 ms after a run returns, taking a core
#: from whatever runs next), ``"run"`` (``session.intra_op.spin_duration_us``: they spin between
#: the operators of a run and for at most :data:`SPIN_TAIL_US` after it returns, then block).
SPINNING_MODES = (False, True, "run")
#: ``"run"``'s spinning tail in microseconds: long enough that the gaps between a run's
#: parallel operators, and between calls that come back to back or a Dynamo frame apart
#: (~0.5-1 ms on the zoo's text models), find the workers awake; short enough that little of a
#: core is taken from the code after the call. MiniLM s16's export on a 2-core EPYC VM
#: (``/work/scratch/spin_tail.py``, 2026-12-04): 3.1-3.9 ms a call with 500 or 1000
#: (onnxruntime's default spinning: 3.1-3.8), 7.7-8.1 with 100, 4.7-9.7 with
#: ``session.force_spinning_stop`` (this mode before 2026-12-04); an eager forward right after
#: took about what it takes after a session that never spins with 500 or 1000 (+0.1-0.6 ms;
#: +43-45 ms after onnxruntime's default; in a run through the torch route, 2000 added 1.7 ms
#: and 5000 6.7 ms over 500). A blocked worker's wake-up
#: cost milliseconds now and then on that VM, which is what the tail keeps a call from paying.
SPIN_TAIL_US = 1000
#: The mode of the sessions that serve a user's calls inside a process that runs other work
#: (the torch route's programs, the cpu target's onnxruntime engine): each parallel operator
#: finds its workers awake, and no worker spins on for long into the code that follows the call
#: (after onnxruntime's default spinning, an eager BERT s16 forward right after took 69 ms, not
#: 37).
SERVING_SPINNING = "run"
#: ``FuseOptions.spinning``'s names for the modes of the serving sessions
SERVING_MODES = {"auto": SERVING_SPINNING, "run": "run", "on": True, "off": False}


def open_session(
    src: Any,
    level: str = "disable",
    threads: int = 2,
    spinning: bool | str = False,
    library: str | None = None,
    in_place: Mapping[str, np.ndarray] | None = None,
    *,
    log_severity: int = 3,
    profile_prefix: str | None = None,
    lean: bool = False,
    prepack: bool = True,
    optimized_model_path: str | None = None,
    flush_denormals: bool = False,
    placeholder: str = "full",
) -> Any:
    """An onnxruntime CPU session of ``src`` (serialized bytes, a path or a ``ModelProto``,
    which is read as is and may be modified when ``in_place`` transposes an operand); the
    arguments are :func:`~graph_autofusion.runtime.ort_session.ort_session`'s (``library``:
    the custom-operator library to register)."""
    import onnxruntime as ort

    flush_denormals = flush_denormals and DENORMALS_PER_CALL  # pool and caller alike, or neither

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = log_severity
    if spinning not in SPINNING_MODES:
        raise ValueError(f"spinning must be one of {SPINNING_MODES}, got {spinning!r}")
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if spinning == "run":  # spin inside a run and briefly after it, then block
        so.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_TAIL_US))
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    if lean:
        so.enable_cpu_mem_arena = False
    if lean or not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if flush_denormals:
        so.add_session_config_entry("session.set_denormal_as_zero", "1")
    if isinstance(src, os.PathLike):
        src = os.fspath(src)
    if library:
        so.register_custom_ops_library(library)
    if not in_place and not isinstance(src, str | bytes):
        src = src.SerializeToString()
    # onnxruntime sets the flush-to-zero bits of the thread that opens a process's first
    # session, for good, to that session's ``set_denormal_as_zero``: the user's thread keeps
    # its own; a flushing session sets them on its pool threads and, per run, on the caller's
    with keeping_denormal_mode():
        if in_place:
            sess = _session_in_place(src, so, in_place, level, placeholder)
        else:
            sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    return FlushingSession(sess) if flush_denormals else sess


def _flushing(method: str) -> Any:
    """``FlushingSession``'s ``method``: the session's own, run with denormals flushed on the
    calling thread."""

    def call(self: FlushingSession, *args: Any, **kwargs: Any) -> Any:
        with flushing_denormals():
            return getattr(self.session, method)(*args, **kwargs)

    call.__name__ = method
    return call


class FlushingSession:
    """An onnxruntime session whose runs flush denormal floats to zero on every thread: its
    pool threads by onnxruntime's ``session.set_denormal_as_zero``, the calling thread (which
    runs its share of each parallel operator) for the length of each run
    (:func:`~graph_autofusion.runtime.denormals.flushing_denormals`). Everything else is the
    session's own (``get_inputs``, ``io_binding``, ``end_profiling``, ...)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    run = _flushing("run")
    run_with_iobinding = _flushing("run_with_iobinding")
    run_with_ort_values = _flushing("run_with_ort_values")
    run_with_ortvaluevector = _flushing("run_with_ortvaluevector")

    def __getattr__(self, name: str) -> Any:
        if name == "session":  # not set yet (a copy or an unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.session, name)


#: Only float initializers at least this large are read in place: onnxruntime reads small
#: integer initializers (shapes, indices) from the model's bytes while it optimizes the graph.
IN_PLACE_MIN_BYTES = 1 << 16


def in_place_weights(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of ``arrays`` (initializer name -> array) that a session can read in place:
    contiguous floating-point arrays of at least :data:`IN_PLACE_MIN_BYTES`, and transposed
    matrices (a parameter's transposed view: read through ``transB``, see
    :func:`_transposed_operands`)."""
    return {
        name: a
        for name, a in arrays.items()
        if isinstance(a, np.ndarray)
        and a.dtype.kind == "f"
        and (a.flags.c_contiguous or (a.ndim == 2 and a.flags.f_contiguous))
        and a.nbytes >= IN_PLACE_MIN_BYTES
    }


def _session_in_place(
    src: Any,
    so: Any,
    arrays: Mapping[str, np.ndarray],
    level: str = "all",
    placeholder: str = "full",
) -> Any:
    """A session whose initializers ``arrays`` are onnxruntime values over the arrays' memory
    (``SessionOptions.add_initializer``). The model declares them as external data in a
    placeholder file holding the same bytes, which lives in a temporary folder only while the
    session is created: the session runs on the values given here, but onnxruntime's graph
    optimizer reads some initializers from the model's own data (an fp16 MatMul's weight, whose
    Cast to float32 it makes at every level), so the placeholder must hold the real bytes, not
    zeros. With the optimizer off (``level="disable"``: safe mode's whole-model sessions),
    nothing reads a float32 initializer there: those stay a hole in a sparse file (no copy of
    the weights written). ``placeholder="rewritable"`` (:data:`PLACEHOLDERS`): at the other
    levels too, only the float32 weights the optimizer may rewrite are written
    (:func:`kept_as_given`); the caller checks the session's outputs and opens it again with
    ``"full"`` when they differ (an optimizer that read a hole as zeros)."""
    if placeholder not in PLACEHOLDERS:
        raise ValueError(f"placeholder must be one of {PLACEHOLDERS}, got {placeholder!r}")
    import onnx
    import onnxruntime as ort

    if isinstance(src, onnx.ModelProto):
        proto = src  # the caller's own copy (made for this session)
    else:
        proto = onnx.load_from_string(src) if isinstance(src, bytes) else onnx.load(src)
    present = {init.name for init in proto.graph.initializer}
    arrays = _transposed_operands(proto, {n: a for n, a in arrays.items() if n in present})
    if level == "disable":  # nothing reads a float32 weight there
        holes = {n for n, a in arrays.items() if a.dtype == np.float32}
    elif placeholder == "rewritable":
        holes = {n for n in kept_as_given(proto, arrays) if arrays[n].dtype == np.float32}
    else:
        holes = set()
    values = {}
    offsets: dict[str, int] = {}
    end = 0
    for init in proto.graph.initializer:
        a = arrays.get(init.name)
        if a is None:
            continue
        offsets[init.name] = end
        end += -(-a.nbytes // 4096) * 4096
        init.ClearField("raw_data")
        for field in ("float_data", "double_data", "int32_data", "int64_data"):
            init.ClearField(field)
        init.data_location = onnx.TensorProto.EXTERNAL
        del init.external_data[:]
        place = (("location", "weights.bin"), ("offset", str(offsets[init.name])))
        for key, val in (*place, ("length", str(a.nbytes))):
            entry = init.external_data.add()
            entry.key, entry.value = key, val
        values[init.name] = ort.OrtValue.ortvalue_from_numpy(a)
        so.add_initializer(init.name, values[init.name])
    with tempfile.TemporaryDirectory(prefix="autofusion-ort-") as d:
        with open(os.path.join(d, "weights.bin"), "wb") as f:
            for name, offset in offsets.items():
                a = arrays[name]
                if name in holes:
                    continue  # read from the given values only (see above)
                f.seek(offset)
                f.write(memoryview(a).cast("B"))
            f.truncate(end)  # every declared range lies inside the file
        path = os.path.join(d, "model.onnx")
        onnx.save(proto, path)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    # onnxruntime keeps raw pointers: the values (and the arrays under them) must outlive it
    sess._autofusion_in_place = (values, dict(arrays))
    # how many weights the optimizer could not read from the file (it reads zeros there)
    sess._autofusion_holes = 0 if level == "disable" else len(holes)
    return sess


#: ``open_session``'s ``placeholder`` modes: ``"full"`` writes every weight read in place to the
#: placeholder file while a session is created (the optimizer may read any); ``"rewritable"``
#: writes only those :func:`kept_as_given` does not name. A 618 MB GPT-2 written for each of a
#: compile's two serving sessions took 0.7-6.7 s of a 17 s first call (the disk's write-back).
PLACEHOLDERS = ("full", "rewritable")

#: Operand positions the optimizer reads as given (it may fuse the node, but keeps the operand
#: as its own input): a contraction's right operand, a table ``Gather`` reads.
_AS_GIVEN = {("MatMul", 1), ("FusedMatMul", 1), ("Gemm", 1), ("Gather", 0)}
#: Operator domains the optimizer never rewrites (graph-autofusion's own operators).
_OPAQUE_DOMAINS = ("ai.graph_autofusion",)


def kept_as_given(proto: Any, arrays: Mapping[str, np.ndarray]) -> set[str]:
    """The initializers of ``arrays`` whose every use is an operand the optimizer reads as given
    (:data:`_AS_GIVEN`, or an operator of :data:`_OPAQUE_DOMAINS`): no graph output, no use
    inside a subgraph. A heuristic: some onnxruntime fusions do read a contraction's weight (a
    ``MatMul`` followed by ``BatchNormalization``, BERT's attention), which is why a session
    opened with ``placeholder="rewritable"`` must have its outputs checked."""
    outputs = {o.name for o in proto.graph.output}
    return {
        name
        for name, used in _uses(proto, arrays).items()
        if used
        and name not in outputs
        and all(
            i >= 0 and (n.domain in _OPAQUE_DOMAINS or (n.op_type, i) in _AS_GIVEN) for n, i in used
        )
    }


def _uses(proto: Any, names: Iterable[str]) -> dict[str, list[tuple[Any, int]]]:
    """Each of ``names``'s uses in ``proto``'s graph: ``(node, operand index)``, or
    ``(node, -1)`` for a read inside one of the node's subgraphs (an ``If`` branch, a ``Loop``
    body)."""
    import onnx

    subgraphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    uses: dict[str, list[tuple[Any, int]]] = {n: [] for n in names}
    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name in uses:
                uses[name].append((node, i))
        if any(a.type in subgraphs for a in node.attribute):
            for name in _subgraph_names(node) & uses.keys():
                uses[name].append((node, -1))  # read inside a subgraph
    return uses


#: The contractions whose right operand may be given transposed (``transB``), by operator.
_TRANS_B = {"MatMul": "FusedMatMul", "Gemm": "Gemm"}


def _transposed_operands(proto: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with each transposed matrix (an F-contiguous ``[K, N]`` array: a linear
    weight's transposed view of its ``[N, K]`` parameter) replaced by its C-contiguous transpose,
    the parameter's own memory, which ``proto`` (modified) then reads through ``transB``: a
    ``MatMul`` becomes ``com.microsoft.FusedMatMul(transB=1)`` and a ``Gemm`` flips ``transB``.
    onnxruntime packs both from that layout, as it packs a ``MatMul``'s weight. A transposed
    matrix read any other way (or not fp32) is given as a contiguous copy."""
    odd = {n for n, a in arrays.items() if not a.flags.c_contiguous}
    if not odd:
        return dict(arrays)
    import onnx

    out = dict(arrays)
    uses = _uses(proto, odd)  # a read inside a subgraph (index -1) is not rewritten
    outputs = {o.name for o in proto.graph.output}
    rewritten = False
    for name in odd:
        a = arrays[name]
        ok = (
            a.dtype == np.float32
            and name not in outputs
            and bool(uses[name])
            and all(
                i == 1 and n.op_type in _TRANS_B and n.domain in ("", "ai.onnx")
                for n, i in uses[name]
            )
        )
        if not ok:
            out[name] = np.ascontiguousarray(a)
            continue
        for node, _ in uses[name]:
            if node.op_type == "Gemm":
                trans = next((t for t in node.attribute if t.name == "transB"), None)
                if trans is None:
                    node.attribute.append(onnx.helper.make_attribute("transB", 1))
                else:
                    trans.i = 1 - trans.i
            else:
                node.op_type, node.domain = "FusedMatMul", "com.microsoft"
                node.attribute.append(onnx.helper.make_attribute("transB", 1))
        out[name] = a.T
        for init in proto.graph.initializer:
            if init.name == name:
                del init.dims[:]
                init.dims.extend(a.T.shape)
        for vi in (*proto.graph.value_info, *proto.graph.input):
            if vi.name == name and vi.type.tensor_type.HasField("shape"):
                vi.type.tensor_type.ClearField("shape")
        rewritten = True
    if rewritten and not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return out


def _subgraph_names(node: Any) -> set[str]:
    """Every value name a node's subgraphs (If branches, Loop bodies) read."""
    import onnx

    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for n in g.node:
                names.update(n.input)
                names.update(_subgraph_names(n))
    return names
