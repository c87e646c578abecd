"""End-to-end accuracy metrics of language models: what a lossy transformation (compressed
weights, half precision) is judged by, beyond the cosine of one output.

A *runner* maps an int64 token array ``(1, T)`` to logits ``(1, T, V)`` (NumPy in, NumPy out).
:func:`ort_logits_runner` makes one from an ONNX causal LM (a no-cache logits export, or a
KV-cache decoder fed an empty past), :func:`torch_logits_runner` from a PyTorch module.

* :func:`perplexity`: teacher-forced perplexity over a token stream cut into windows of
  ``window`` tokens (each window predicts its tokens 2..W from the ones before; no context
  crosses a window boundary), ``exp(mean negative log-likelihood)`` over every prediction.
* :func:`top1_agreement`: the fraction of those predictions (argmax of the logits) on which
  two runners agree.
* :func:`compare_lm`: both, for a reference and a candidate, running each model once.
* :func:`mean_pooled` / :func:`row_cosines`: sentence embeddings (mean over the attention
  mask, as sentence-BERT) and their per-row cosine.

Everything accumulates in float64, so the numbers do not depend on the models' precision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.runtime.ort_session import ort_session

#: ``(1, T)`` int64 token ids -> ``(1, T, V)`` logits.
LogitsRunner = Callable[[np.ndarray], np.ndarray]


def _stream(tokens: Any, window: int) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise GraphAutoFusionError(
            f"tokens must be a 1-D (or (1, T)) integer array, got {arr.dtype} {arr.shape}"
        )
    if window < 2:
        raise GraphAutoFusionError(f"window must be >= 2 tokens, got {window}")
    if arr.size < window:
        raise GraphAutoFusionError(f"{arr.size} tokens are fewer than one window of {window}")
    return arr.astype(np.int64)


def _windows(tokens: Any, window: int) -> Iterator[np.ndarray]:
    """Consecutive non-overlapping ``(1, window)`` slices (a shorter tail of >= 2 tokens too)."""
    arr = _stream(tokens, window)
    for start in range(0, arr.size, window):
        chunk = arr[start : start + window]
        if chunk.size >= 2:
            yield chunk[None]


def _logits(run: LogitsRunner, ids: np.ndarray) -> np.ndarray:
    out = np.asarray(run(ids))
    if out.ndim != 3 or out.shape[:2] != ids.shape:
        raise GraphAutoFusionError(
            f"a logits runner must return (1, {ids.shape[1]}, vocab); got {out.shape}"
        )
    return out[0, :-1].astype(np.float64)  # the predictions of tokens 2..W


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of ``targets`` under each row of ``logits`` (float64)."""
    if targets.max(initial=0) >= logits.shape[-1] or targets.min(initial=0) < 0:
        raise GraphAutoFusionError(
            f"token ids must lie in [0, {logits.shape[-1]}) (the logits' vocabulary)"
        )
    top = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=-1)) + top[:, 0]
    return lse - logits[np.arange(targets.size), targets]


def perplexity(run_logits: LogitsRunner, tokens: Any, window: int) -> float:
    """Teacher-forced perplexity of ``tokens`` under ``run_logits`` (windows of ``window``).

    Raises:
        GraphAutoFusionError: Malformed tokens, a window under 2, fewer tokens than a window,
            logits of the wrong shape, or token ids outside the vocabulary.
    """
    total, count = 0.0, 0
    for ids in _windows(tokens, window):
        nll = _nll(_logits(run_logits, ids), ids[0, 1:])
        total += float(nll.sum())
        count += nll.size
    return math.exp(total / count)


def top1_agreement(run_a: LogitsRunner, run_b: LogitsRunner, tokens: Any, window: int) -> float:
    """Fraction of teacher-forced next-token predictions (argmax) on which two runners agree."""
    same, count = 0, 0
    for ids in _windows(tokens, window):
        a = _logits(run_a, ids).argmax(axis=-1)
        b = _logits(run_b, ids).argmax(axis=-1)
        same += int((a == b).sum())
        count += a.size
    return same / count


def compare_lm(
    run_ref: LogitsRunner, run_test: LogitsRunner, tokens: Any, window: int
) -> dict[str, float]:
    """Perplexity of both runners, the candidate's relative change and their top-1 agreement,
    running each model once per window.

    Returns:
        ``ppl_ref``, ``ppl_test``, ``ppl_rel_change`` (``ppl_test / ppl_ref - 1``),
        ``top1_agreement``, ``min_logits_cosine`` (the lowest per-position cosine of the two
        logit vectors) and ``predictions`` (how many positions were compared).
    """
    nll_ref = nll_test = 0.0
    same = count = 0
    min_cos = 1.0
    for ids in _windows(tokens, window):
        ref, test = _logits(run_ref, ids), _logits(run_test, ids)
        nll_ref += float(_nll(ref, ids[0, 1:]).sum())
        nll_test += float(_nll(test, ids[0, 1:]).sum())
        same += int((ref.argmax(-1) == test.argmax(-1)).sum())
        count += ref.shape[0]
        min_cos = min(min_cos, float(row_cosines(ref, test).min()))
    ppl_ref, ppl_test = math.exp(nll_ref / count), math.exp(nll_test / count)
    return {
        "ppl_ref": ppl_ref,
        "ppl_test": ppl_test,
        "ppl_rel_change": ppl_test / ppl_ref - 1.0,
        "top1_agreement": same / count,
        "min_logits_cosine": min_cos,
        "predictions": count,
    }


# ------------------------------------------------------------------------------------ runners


def _past_feeds(inputs: list[Any]) -> dict[str, np.ndarray]:
    """Empty (length-0) past key/values for the ``past_key_values.*`` inputs of a decoder."""
    feeds = {}
    for i in inputs:
        if not i.name.startswith("past_key_values."):
            continue
        shape = list(i.shape)
        if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1::2]):
            raise GraphAutoFusionError(
                f"decoder input {i.name!r} has shape {shape}; expected (batch, heads, past, dim) "
                "with static heads and dim"
            )
        feeds[i.name] = np.zeros((1, shape[1], 0, shape[3]), np.float32)
    return feeds


def ort_logits_runner(model: Any, *, threads: int = 2, level: str = "all") -> LogitsRunner:
    """A runner over an ONNX causal LM in onnxruntime (``model``: a path, ``ModelProto`` or IR
    ``Model``; one session, reused).

    Feeds ``input_ids``, an all-ones ``attention_mask`` and ``position_ids`` 0..T-1 where the
    model declares them, and an empty past to a KV-cache decoder's ``past_key_values.*``;
    returns the ``logits`` output (the first output when none is named so).
    """

    sess = ort_session(model, level, threads)
    inputs = sess.get_inputs()
    names = {i.name for i in inputs}
    if "input_ids" not in names:
        raise GraphAutoFusionError(
            f"the model has no 'input_ids' input (inputs: {', '.join(sorted(names))})"
        )
    outputs = [o.name for o in sess.get_outputs()]
    want = "logits" if "logits" in outputs else outputs[0]
    past = _past_feeds(inputs)

    def run(ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        t = ids.shape[1]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, t), np.int64),
            "position_ids": np.arange(t, dtype=np.int64)[None],
            **past,
        }
        return sess.run([want], {k: v for k, v in feeds.items() if k in names})[0]

    return run


def torch_logits_runner(module: Any) -> LogitsRunner:
    """A runner over a PyTorch causal LM: a Hugging Face model (its ``.logits``) or a module
    returning the logits tensor (or a tuple starting with it), called without gradients."""
    import torch

    def run(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = module(torch.from_numpy(np.asarray(ids, dtype=np.int64)))
        out = getattr(out, "logits", out)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.float().numpy()

    return run


# ---------------------------------------------------------------------------- embeddings


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Sentence embeddings: ``hidden (batch, seq, dim)`` averaged over ``mask (batch, seq)``."""
    h = np.asarray(hidden, dtype=np.float64)
    m = np.asarray(mask, dtype=np.float64)[..., None]
    return (h * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row (last axis) of ``a`` with the same row of ``b``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise GraphAutoFusionError(f"shapes differ: {a.shape} vs {b.shape}")
    num = (a * b).sum(axis=-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return num / np.maximum(den, 1e-300)
