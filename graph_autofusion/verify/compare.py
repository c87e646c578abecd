"""Tensor comparison used by safe mode and the tests: cosine similarity, max absolute and
relative error, robust to zeros and non-finite values; computed in float64, a pair of float32
tensors in float32 with the cosine's dot products accumulated in float64.

    stats = compare_tensors(fused_out, original_out)
    stats["cosine"], stats["max_abs"], stats["max_rel"]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Elements whose reference magnitude is below this fraction of the tensor's largest magnitude
#: are measured against that floor, so near-zero references do not blow up ``max_rel``.
REL_FLOOR = 1e-3


def compare_tensors(actual: Any, expected: Any) -> dict[str, float]:
    """Compare ``actual`` with the reference ``expected``.

    Returns:
        ``cosine``: cosine similarity of the flattened tensors (1.0 when both are all zeros,
        0.0 when exactly one is, or when their shapes differ, or when the positions or values
        of non-finite elements differ); ``max_abs``: largest ``|actual - expected|`` over the
        finite elements (``inf`` for a non-finite mismatch); ``max_rel``: largest
        ``|actual - expected| / max(|expected|, REL_FLOOR * max|expected|)``;
        ``nonfinite``: 1.0 when ``actual`` has inf/nan where ``expected`` does not, else 0.0.
    """
    a = np.asarray(actual)
    b = np.asarray(expected)
    if a.dtype == object or b.dtype == object:
        same = a.shape == b.shape and all(x == y for x, y in zip(a.ravel(), b.ravel()))
        return _stats(1.0 if same else 0.0, 0.0 if same else math.inf, 0.0 if same else math.inf)
    if a.shape != b.shape:
        return _stats(0.0, math.inf, math.inf, nonfinite=0.0)
    # float32 pairs are measured in float32 (the difference of two float32 values is exact
    # to half an ulp of itself), with the dot products of the cosine accumulated in float64:
    # a third of the time of widening both (a GPT-2 s128 logits pair: 35 against 89 ms)
    dtype = np.float32 if a.dtype == np.float32 and b.dtype == np.float32 else np.float64
    a = a.astype(dtype, copy=False).ravel()
    b = b.astype(dtype, copy=False).ravel()
    fa, fb = np.isfinite(a), np.isfinite(b)
    all_a, all_b = bool(fa.all()), bool(fb.all())
    if not (all_a and all_b):  # rare: compare the positions and values of inf/nan
        bad_new = bool(np.any(~fa & fb))
        if not np.array_equal(fa, fb):
            return _stats(0.0, math.inf, math.inf, nonfinite=1.0 if bad_new else 0.0)
        na, nb = a[~fa], b[~fb]
        if not np.array_equal(np.isnan(na), np.isnan(nb)) or not np.array_equal(
            np.nan_to_num(na), np.nan_to_num(nb)
        ):
            return _stats(0.0, math.inf, math.inf)
        a, b = a[fa], b[fb]
    if a.size == 0:
        return _stats(1.0, 0.0, 0.0)
    diff = np.subtract(a, b)
    np.abs(diff, out=diff)
    max_abs = float(diff.max())
    if max_abs == 0.0:  # the same values: nothing more to measure
        return _stats(1.0, 0.0, 0.0)
    mag = np.abs(b)
    scale = float(mag.max())
    np.maximum(mag, max(REL_FLOOR * scale, float(np.finfo(dtype).tiny)), out=mag)
    np.divide(diff, mag, out=diff)
    max_rel = float(diff.max())
    # dot products by einsum, not BLAS: a BLAS call wakes (and leaves spinning) a thread pool
    # that competes with the onnxruntime sessions safe mode runs between comparisons
    aa, bb = _dot(a, a), _dot(b, b)
    if aa == 0.0 and bb == 0.0:
        cosine = 1.0
    elif aa == 0.0 or bb == 0.0:
        cosine = 0.0
    else:
        cosine = _dot(a, b) / (math.sqrt(aa) * math.sqrt(bb))
        cosine = max(-1.0, min(1.0, cosine))
    return _stats(cosine, max_abs, max_rel)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a . b`` accumulated in float64 (einsum casts through its small buffers, not whole
    copies)."""
    return float(np.einsum("i,i->", a, b, dtype=np.float64))


def _stats(cosine: float, max_abs: float, max_rel: float, nonfinite: float = 0.0) -> dict:
    return {"cosine": cosine, "max_abs": max_abs, "max_rel": max_rel, "nonfinite": nonfinite}


__all__ = ["REL_FLOOR", "compare_tensors"]
