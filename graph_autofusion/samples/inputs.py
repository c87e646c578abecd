"""Sample inputs for safe mode, generated from a model's input specs with realistic ranges.

* integer inputs named like ``*ids*`` (``input_ids``, ``decoder_input_ids``): token ids in
  ``[0, vocab)``; the vocabulary is the row count of the embedding table the input is gathered
  from (found by following the input through Cast/Reshape/... to a ``Gather`` on a constant
  table), else ``vocab_size``, else the largest 2-D gathered table, else 100;
* ``*token_type*`` / ``*segment*``: zeros; ``*mask*``: ones; ``*position*``: ``arange`` along the
  last axis; other integers: ``[0, min(vocab, seq_len))``; booleans: ``True``;
* floating inputs (images included): ``N(0, 1)``, cast to the input's dtype.

Symbolic or unknown dims become ``batch`` (the first axis, or a dim named like ``batch``) or
``seq_len`` (every other one). String inputs get ``"a"``; a sequence of tensors, two tensors.

A KV-cache decoder (graph inputs named like ``past_key_values.0.key``) gets inputs that agree
(:mod:`graph_autofusion.samples.kv_inputs`): a past length ``P`` and ``S`` new tokens with
``P + S == seq_len`` (``S = seq_len // 4``, at least 1), the past inputs ``P`` long on their
sequence axis, a mask of ones over ``P + S``, positions ``P .. P+S-1``.

Inputs an operator reads as a shape, sizes, bounds or indices (an ``Expand`` target shape, a
``SplitToSequence`` split, ``Gather`` indices, ...) then get values the model accepts
(:func:`graph_autofusion.samples.sample_inputs.derive_shape_inputs`). An input too large to
allocate, or of a type no sample can be made for (optional, map), is a
:class:`~graph_autofusion.errors.SampleInputError` naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graph_autofusion.errors import SampleInputError
from graph_autofusion.ir.core import Model, Node, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.samples import kv_inputs
from graph_autofusion.samples import sample_inputs as si
from graph_autofusion.samples.run_failure import failed_node
from graph_autofusion.samples.sample_inputs import check_input_size, source_of

_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"}


def generate_inputs(
    model: Model,
    *,
    seed: int = 0,
    batch: int = 1,
    seq_len: int = 16,
    vocab_size: int | None = None,
    flag: bool = True,
) -> dict[str, np.ndarray]:
    """Seeded sample feeds for every graph input of ``model`` (initializers excluded);
    boolean inputs are all ``flag`` (safe mode's second shape takes the sample inputs' value:
    :func:`other_shape_inputs`)."""

    rng = np.random.default_rng(seed)
    graph = model.graph
    fallback_vocab = vocab_size or _largest_table(model) or 100
    feeds = si.SampleInputs()
    kv = kv_inputs.plan(model)
    kv = kv if isinstance(kv, kv_inputs.KVPlan) else None
    kv_dims = kv.values(batch, *kv_inputs.new_lengths(seq_len)) if kv else {}
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        raw = v.meta.get("onnx_type") if v.dtype is None else None
        if raw is not None:
            feeds[v.name] = _non_tensor(model, v, raw, rng, batch, seq_len)
            continue
        shape = _concrete_shape(v, batch, seq_len)
        if kv is not None:
            shape = kv.shape(v, kv_dims, shape)
        dtype = v.dtype.to_numpy() if v.dtype is not None else np.dtype(np.float32)
        si.check_input_size(model, v, shape, dtype)
        name = v.name.lower()
        if v.dtype == DType.STRING:
            feeds[v.name] = np.full(shape, "a", dtype=object)
        elif np.issubdtype(dtype, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[v.name] = np.full(shape, flag, dtype=np.bool_)
        elif "token_type" in name or "segment" in name:
            feeds[v.name] = np.zeros(shape, dtype=dtype)
        elif "mask" in name:
            feeds[v.name] = np.ones(shape, dtype=dtype)
        elif "position" in name:
            last = shape[-1] if shape else 1
            feeds[v.name] = np.broadcast_to(np.arange(last), shape).astype(dtype).copy()
        elif "ids" in name or "token" in name:
            vocab = vocab_size or _gathered_table_rows(v) or fallback_vocab
            feeds[v.name] = rng.integers(0, vocab, shape).astype(dtype)
        else:
            high = max(1, min(fallback_vocab, seq_len))
            feeds[v.name] = rng.integers(0, high, shape).astype(dtype)
    feeds.derived = si.derive_shape_inputs(model, feeds, seed=seed, seq_len=seq_len)
    return feeds


def _non_tensor(
    model: Model, v: Value, raw: Any, rng: np.random.Generator, batch: int, seq_len: int
) -> Any:
    """Two tensors for a sequence-of-tensors input; any other non-tensor type is refused."""
    from graph_autofusion.frontend.onnx_types import dtype_of, shape_of

    kind = raw.WhichOneof("value")
    elem = raw.sequence_type.elem_type if kind == "sequence_type" else None
    if elem is None or elem.WhichOneof("value") != "tensor_type":
        what = kind.replace("_type", "") if kind else "unknown"
        raise SampleInputError(
            f"{source_of(model)}: graph input {v.name!r} is of {what} type: no sample input can "
            f"be generated for it; pass sample inputs with the API (sample_inputs={{...}})"
        )
    item = Value(v.name, dtype_of(elem.tensor_type.elem_type), shape_of(elem.tensor_type))
    shape = _concrete_shape(item, batch, seq_len)
    dtype = item.dtype.to_numpy() if item.dtype is not None else np.dtype(np.float32)
    check_input_size(model, item, shape, dtype)
    if np.issubdtype(dtype, np.floating):
        return [rng.standard_normal(shape).astype(dtype) for _ in range(2)]
    return [rng.integers(0, max(1, seq_len), shape).astype(dtype) for _ in range(2)]


def _concrete_shape(v: Value, batch: int, seq_len: int) -> tuple[int, ...]:
    if v.shape is None:
        return (batch, seq_len)
    out = []
    for i, d in enumerate(v.shape):
        if isinstance(d, int) and d >= 0:
            out.append(d)
        elif i == 0 or (isinstance(d, str) and "batch" in d.lower()):
            out.append(batch)
        else:
            out.append(seq_len)
    return tuple(out)


def _gathered_table_rows(v: Value, depth: int = 6) -> int | None:
    """Rows of the constant table a ``Gather`` indexes with ``v`` (followed through casts and
    reshapes), or ``None``."""
    frontier: list[Value] = [v]
    for _ in range(depth):
        nxt: list[Value] = []
        for value in frontier:
            for node, idx in value.users:
                rows = _table_rows(node, idx)
                if rows is not None:
                    return rows
                if node.op_type in _PASS_THROUGH and idx == 0:
                    nxt.extend(node.outputs)
        frontier = nxt
    return None


def _table_rows(node: Node, idx: int) -> int | None:
    if node.op_type != "Gather" or idx != 1 or int(node.attr("axis", 0) or 0) != 0:
        return None
    table = node.inputs[0]
    if table is None or table.shape is None or len(table.shape) != 2:
        return None
    rows = table.shape[0]
    return rows if isinstance(rows, int) and table.is_const else None


def _largest_table(model: Model) -> int | None:
    best = None
    for node in model.graph.nodes:
        rows = _table_rows(node, 1)
        if rows is not None and (best is None or rows > best):
            best = rows
    return best


#: Lengths of every dynamic axis tried, in turn, when the generated sample inputs (16 long)
#: make the original fail in a windowed operator: an audio model's convolutional front end
#: needs hundreds of samples (wav2vec2: 400); a second of 16 kHz audio is the last try.
LONGER_SAMPLE_LENGTHS = (64, 512, 4096, 16000)
#: Operators whose window may be longer than a short generated axis.
_WINDOWED = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool"}


def retry_longer(model: Model, exc: BaseException, run: Any) -> tuple[Any, Any] | None:
    """``(run(model, feeds), feeds)`` for the first generated ``feeds`` of
    :data:`LONGER_SAMPLE_LENGTHS` the model runs on, when ``exc`` (its failure on the 16-long
    generated ones) is a failure in a convolution or a pooling; ``None`` otherwise
    (a decoder failing elsewhere is not run again at thousands of positions)."""
    if failed_node(exc)[1] not in _WINDOWED:
        return None
    for length in LONGER_SAMPLE_LENGTHS:
        try:  # too large to generate, or failing again: the next length
            feeds = generate_inputs(model, seq_len=length)
            return run(model, feeds), feeds
        except Exception:  # noqa: BLE001 - onnxruntime's own exception types
            continue
    return None


def nonfinite_outputs(model: Model, acts: Any) -> list[str]:
    """The floating tensor outputs of ``model`` that are NaN or infinite in every element of
    the captured activations ``acts`` (a sequence output is not looked at)."""
    bad = []
    for v in model.graph.outputs:
        a = acts.get(v.name)
        if isinstance(a, np.ndarray) and a.size and np.issubdtype(a.dtype, np.floating):
            if not np.isfinite(a).any():
                bad.append(v.name)
    return bad


def finite_outputs(model: Model, feeds: Any, bad: list[str], run: Any) -> tuple[Any, Any, str]:
    """``(acts, feeds, note)`` for sample inputs on which the original's outputs ``bad``
    (:func:`nonfinite_outputs`) are NaN or infinite in every element, where safe mode's
    checks of what computes them would compare nothing (a position NaN on both sides agrees).
    Generated boolean inputs are all ``True``; for a padding mask (``src_key_padding_mask``:
    ``True`` is a padded position) that pads every position and an attention's output is NaN:
    they are set ``False`` (the other inputs kept) and kept when that makes the outputs
    finite; otherwise the original ``feeds`` are run again (``run(model, feeds)`` gives the
    activations; the caller dropped the first ones, so two sets are never held at once) and
    ``note`` says which outputs are not finite and what to do."""
    flags = sorted(_booleans(feeds))
    if flags and si.is_generated(feeds):
        other = si.own_copy(feeds)
        for k in flags:
            other[k] = np.zeros_like(feeds[k])
        try:
            acts = run(model, other)
        except Exception:  # noqa: BLE001 - onnxruntime's own exception types
            acts = None
        if acts is not None and not nonfinite_outputs(model, acts):
            note = (
                f"sample inputs: the boolean inputs {', '.join(flags)} generated False, not "
                f"True: with True every element of {', '.join(bad)} was NaN or infinite (a "
                f"padding mask padding every position)"
            )
            return acts, other, note
        acts = None
    note = (
        f"the sample inputs make every element of the original's output(s) {', '.join(bad)} "
        f"NaN or infinite: safe mode's checks of what computes them compare nothing; give "
        f"sample inputs on which the model's outputs are finite (sample_inputs=, --inputs)"
    )
    return run(model, feeds), feeds, note


def _booleans(feeds: Any) -> dict[str, np.ndarray]:
    """The boolean arrays of ``feeds``, by input name."""
    return {k: x for k, x in feeds.items() if isinstance(x, np.ndarray) and x.dtype == np.bool_}


def _flag_of(feeds: Any) -> bool:
    """The value generated boolean inputs take beside ``feeds``: ``False`` where ``feeds``
    has boolean inputs and all are ``False`` (:func:`finite_outputs` set them so)."""
    flags = _booleans(feeds).values()
    return not flags or any(x.any() for x in flags)


#: Safe mode's second shape (:func:`other_shape_inputs`): a batch and a sequence length that
#: differ from the generated sample inputs' (1 and 16).
OTHER_BATCH = 2
OTHER_SEQ_LEN = 7


def other_shape_inputs(model: Model, feeds: Any) -> tuple[str, dict[str, Any]] | None:
    """Inputs of another shape than ``feeds`` for safe mode's second end-to-end comparison
    (and the shape folding's check), generated like the sample inputs with batch
    :data:`OTHER_BATCH` and sequence :data:`OTHER_SEQ_LEN` (a KV-cache decoder's past and new
    lengths agreeing; masks of ones). Returns ``(what, inputs)``, ``what`` saying the shape in
    words, or ``None`` when there is no such shape to compare at: the model has no dynamic dim
    (the inputs would have the sample inputs' shapes), inputs cannot be generated, or a scalar
    integer input no operator's use explains (a size, e.g. a Dynamo graph's symbolic length:
    a random value would disagree with the tensors' dims).

    No mask is padded: a model whose mask hides query rows too (query x key) has fully masked
    rows at the padding, where a fused attention kernel (zeros) and the decomposed softmax (the
    mean of the values) legitimately differ."""
    try:
        other = generate_inputs(
            model, seed=1, batch=OTHER_BATCH, seq_len=OTHER_SEQ_LEN, flag=_flag_of(feeds)
        )
    except Exception:  # noqa: BLE001 - no second shape: the sample inputs' check stands
        return None
    scalars = [
        v.name
        for v in model.graph.inputs
        if v.name in other
        and np.ndim(other[v.name]) == 0
        and np.issubdtype(np.asarray(other[v.name]).dtype, np.integer)
        and v.name not in other.derived
    ]
    if scalars:
        return None
    if not any(_shape(other.get(k)) not in (None, _shape(v)) for k, v in feeds.items()):
        return None
    return f"batch {OTHER_BATCH}, sequence {OTHER_SEQ_LEN}", dict(other)


def _shape(v: Any) -> tuple[int, ...] | None:
    """An array's shape; ``None`` for anything else (a sequence of tensors, a string)."""
    return tuple(v.shape) if isinstance(v, np.ndarray) else None


__all__ = [
    "finite_outputs",
    "generate_inputs",
    "nonfinite_outputs",
    "other_shape_inputs",
    "retry_longer",
]
