"""The native lowering of a matched attention core to the standard ``Attention`` (opset 23).

``Attention(Q, K, V, attn_mask)`` with 4-D ``[batch, heads, seq, head_size]`` inputs computes
``softmax(Q @ K^T * scale + attn_mask) @ V``, with fewer key/value heads than query heads
(grouped-query attention) when ``K`` and ``V`` have them. The matched form gives:

* ``Q``: the bound ``q``;
* ``K``: the bound ``k`` (the match took its last-two-axes Transpose), or the tensor whose
  last two axes ``kt`` swaps: a ``Transpose`` outside the match, or the dynamo exporter's
  ``Reshape -> Transpose(0, 2, 1) -> Reshape`` over merged leading axes; otherwise a
  ``Transpose`` is added;
* grouped-query models repeat K and V to the query head count with
  ``Reshape(Expand(Unsqueeze(x, 2)))`` (``repeat_kv``); the un-repeated K and V are passed
  instead, so the repeat is not computed at all;
* ``scale``: the product of the matched scales (``Div`` by c is a scale of 1/c, the pre-scaled
  ``q * c1`` and ``kT * c2`` give ``c1 * c2``; none is 1);
* ``softcap``: c of a matched ``c * tanh(scores / c)``, which onnxruntime applies to the scaled
  scores before the mask, where the exporters put it;
* the mask: an additive mask is passed as is; a boolean ``Where(cond, scores, fill)`` becomes
  the additive ``Where(cond, 0, fill)`` (added to the additive one when both are there). For a
  finite ``fill`` that is far below every score (exporters use the dtype's lowest value) both
  give the same probabilities; the safe-mode comparison checks every instance anyway.

The ``Where(IsNaN(.), 0, .)`` guards only change rows whose every key is masked by ``-inf``;
onnxruntime's kernel gives such rows zeros as well. A row whose every key is masked by the
exporters' finite fill, float32's lowest value, is another matter: the scores vanish in the
fill, so the matched operators average every value (uniform probabilities), but onnxruntime's
kernel reads that exact value as ``-inf`` and gives zeros (padding positions of a left-padded
batch: 0.2-0.3 apart in a Qwen3's logits). A float32 mask's lowest value is therefore passed as
``-3e38`` (:data:`FINITE_FILL`), which every score vanishes in as well and which the kernel
takes as given: the same probabilities in every row (a constant fill is replaced; a mask
computed at run time gets ``Where(Equal(mask, lowest), -3e38, mask)``). Nodes the lowering no
longer reads (the repeat, the dynamo transpose chain) are removed afterwards as dead code.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.ir.core import Value, producer_of
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.opset_upgrade import ATTENTION_OPSET, upgrade_opset, upgrade_problem
from graph_autofusion.patterns.library._norm_common import reduce_axes
from graph_autofusion.patterns.matcher import const_value
from graph_autofusion.patterns.pattern import MatchContext
from graph_autofusion.patterns.rewrite import RewriteContext, RewriteError

_FLOATS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16)


def swaps_last_two(perm) -> bool:
    """True for a Transpose ``perm`` that swaps the last two axes and keeps the others."""
    if perm is None or len(perm) < 2:
        return False
    n = len(perm)
    return list(perm) == [*range(n - 2), n - 1, n - 2]


def _same_dims(a, b) -> bool:
    return (
        a is not None
        and b is not None
        and len(a) == len(b)
        and all(x is not None and x == y for x, y in zip(a, b))
    )


def untransposed_key(kt: Value) -> Value | None:
    """The 4-D tensor whose last two axes ``kt`` swaps, when the graph shows it."""
    t = producer_of(kt, "Transpose")
    if t is not None and swaps_last_two(t.attrs.get("perm")) and t.inputs[0].rank == 4:
        return t.inputs[0]
    outer = producer_of(kt, "Reshape")
    t = producer_of(outer.inputs[0] if outer is not None else None, "Transpose")
    if t is None or list(t.attrs.get("perm") or ()) != [0, 2, 1]:
        return None
    inner = producer_of(t.inputs[0], "Reshape")
    if inner is None:
        return None
    k, merged = inner.inputs[0], inner.outputs[0]
    if k.shape is None or kt.shape is None or merged.shape is None or len(k.shape) != 4:
        return None
    # [b, h, t, d] -> [b*h, t, d] -> [b*h, d, t] -> [b, h, d, t]
    if not _same_dims(merged.shape[1:], k.shape[2:]):
        return None
    if not _same_dims(kt.shape, (*k.shape[:2], k.shape[3], k.shape[2])):
        return None
    return k


def unrepeated(x: Value) -> Value | None:
    """``x0`` when ``x`` is ``repeat_kv(x0)``: ``Reshape(Expand(Unsqueeze(x0, 2)))`` that
    repeats each of ``x0``'s heads ``n`` times in place."""
    reshape = producer_of(x, "Reshape")
    expand = producer_of(reshape.inputs[0] if reshape is not None else None, "Expand")
    unsq = producer_of(expand.inputs[0] if expand is not None else None, "Unsqueeze")
    if unsq is None or reduce_axes(unsq) not in ([2], [-3]):
        return None
    x0, wide = unsq.inputs[0], expand.outputs[0]
    if x0.shape is None or x.shape is None or len(x0.shape) != 4 or len(x.shape) != 4:
        return None
    if wide.shape is None or (len(wide.shape) == 5 and not isinstance(wide.shape[1], int)):
        return _unrepeated_by_ends(x0, x, expand.inputs[1])
    if len(wide.shape) != 5:
        return None
    kv, rep, heads = wide.shape[1], wide.shape[2], x.shape[1]
    if not all(isinstance(d, int) for d in (kv, heads)) or x0.shape[1] != kv or heads % kv:
        return None
    if not _same_dims(x.shape[2:], x0.shape[2:]) or wide.shape[4] != x0.shape[3]:
        return None
    if isinstance(rep, int):
        return x0 if kv * rep == heads and _same_dims(wide.shape[3:], x0.shape[2:]) else None
    # TorchScript expands to a shape computed at run time (its dims are unknown): the
    # unsqueezed axis is 1 and the merge gives heads = kv * n; safe mode checks the numbers
    ushape = unsq.outputs[0].shape
    return x0 if ushape is not None and len(ushape) == 5 and ushape[2] == 1 else None


def _unrepeated_by_ends(x0: Value, x: Value, expand_shape: Value) -> Value | None:
    """``repeat_kv`` whose expanded shape is not known (the PyTorch route expands to sizes
    computed from Dynamo's symbolic lengths, a ``Concat`` of one-element pieces): the Expand's
    shape must have five entries with the constant ``heads / kv`` third, and the merge back to
    ``x`` must keep ``b``, ``t`` and ``d``. ``Unsqueeze(x0, 2)`` is ``[b, kv, 1, t, d]``; an
    Expand can only grow its size-1 axes, so the Reshape's element count (``b * heads * t * d``
    = ``b * kv * (heads / kv) * t * d``) leaves no other axis grown: the heads are repeated in
    place, not tiled (a grown batch axis merged into the heads would pass the ends alone)."""
    kv, heads = x0.shape[1], x.shape[1]
    if not isinstance(kv, int) or not isinstance(heads, int) or kv <= 0 or heads % kv:
        return None
    entries = _shape_entries(expand_shape)
    if entries is None or len(entries) != 5 or entries[2] != heads // kv:
        return None
    ends = (x.shape[0], *x.shape[2:]), (x0.shape[0], *x0.shape[2:])
    return x0 if _same_dims(*ends) else None


def _shape_entries(shape: Value) -> list[int | None] | None:
    """The entries of a 1-D shape tensor (``None`` where computed at run time): a constant,
    or a ``Concat`` of constants and one-element pieces; ``None`` when its length is unknown."""
    data = const_value(shape)
    if data is not None:
        return [int(v) for v in np.asarray(data).reshape(-1)]
    concat = producer_of(shape, "Concat")
    if concat is None:
        return None
    out: list[int | None] = []
    for piece in concat.inputs:
        data = const_value(piece)
        if data is not None:
            out.extend(int(v) for v in np.asarray(data).reshape(-1))
        elif piece.shape is not None and tuple(piece.shape) == (1,):
            out.append(None)
        else:
            return None
    return out


def _scalar(ctx: RewriteContext, name: str) -> float | None:
    if name not in ctx.match.values:
        return None
    data = ctx.const(name)
    if data is None or data.size != 1:
        raise RewriteError(f"the {name} is not a scalar constant")
    return float(np.asarray(data, dtype=np.float64).reshape(-1)[0])


def _softcap(const, inner_op: str) -> tuple[float | None, str | None]:
    """``(c, None)`` for a matched ``c * tanh(s / c)`` (or ``c * tanh(s * (1/c))``), given the
    matched constants by name; ``(None, why)`` when they do not make one."""
    cap, inner = const("softcap"), const("softcap_in")
    if cap is None or inner is None or cap.size != 1 or inner.size != 1:
        return None, "the soft-cap factors are not scalar constants"
    c = float(np.asarray(cap, np.float64).reshape(-1)[0])
    d = float(np.asarray(inner, np.float64).reshape(-1)[0])
    if not (np.isfinite(c) and c > 0):
        return None, f"soft-cap {c!r} is not a positive number"
    expected = c if inner_op == "Div" else 1.0 / c
    # a half-precision constant holds 1/c to ~1e-3 (1/50 in float16: 2e-4 off)
    rtol = 1e-6 if np.asarray(inner).dtype.itemsize >= 4 else 4e-3
    if abs(d - expected) > rtol * abs(expected):
        return None, f"tanh's input is scaled by {d!r} ({inner_op}), the output by {c!r}"
    return c, None


def softcap_agrees(ctx: MatchContext) -> str | None:
    """Reject ``a * tanh(s / b)`` with ``a != b``: only ``c * tanh(s / c)`` is a soft-cap."""
    if "softcap_tanh" not in ctx.nodes:
        return None
    return _softcap(ctx.const, ctx.nodes["softcap_in"].op_type)[1]


def softcap_unpriced(match) -> str | None:
    """Why the cost model cannot price a soft-capped attention's native form (``None`` for
    the others): onnxruntime's ``Attention`` caps the scores in a pass of its own."""
    if "softcap_tanh" not in match.labels:
        return None
    return "onnxruntime's Attention caps the scores in a pass the cost model does not price"


def attention_scale(ctx: RewriteContext) -> float:
    scale = _scalar(ctx, "scale")
    if scale is not None:
        if ctx.label("scale").op_type == "Div":
            if scale == 0.0:
                raise RewriteError("the attention scale divides by zero")
            scale = 1.0 / scale
    else:
        scale = 1.0
    for name in ("q_scale", "k_scale"):
        factor = _scalar(ctx, name)
        if factor is not None:
            scale *= factor
    return scale


#: What a float32 attention mask's lowest value (the exporters' fill) is passed to
#: onnxruntime's ``Attention`` as: onnxruntime takes that exact value for ``-inf`` (a row masked
#: everywhere gives zeros, where the matched operators average the values), and takes this one
#: as given; every score vanishes in either (|score| << ulp(3e38) / 2).
FINITE_FILL = -3e38
_LOWEST = float(np.finfo(np.float32).min)


def _additive_mask(ctx: RewriteContext, dtype) -> Value | None:
    labels = ctx.match.labels
    mask = ctx.value("mask") if "mask_add" in labels else None
    if mask is not None:
        mask = _finite_fill(ctx, mask)
    if "mask_where" not in labels:
        return mask
    cond, fill = ctx.value("mask_cond"), ctx.value("mask_fill")
    if cond.dtype != DType.BOOL:
        raise RewriteError("the attention mask condition is not boolean")
    zero = ctx.add_constant("attention_mask_zero", np.zeros((), dtype=dtype.to_numpy()))
    where = ctx.make_node("Where", [cond, zero, _finite_fill(ctx, fill)]).outputs[0]
    if mask is None:
        return where
    return ctx.make_node("Add", [where, mask]).outputs[0]


def _finite_fill(ctx: RewriteContext, mask: Value) -> Value:
    """``mask`` (float32) with its lowest value as :data:`FINITE_FILL`: a constant's data
    replaced (one new constant per mask, shared by every layer reading it), else
    ``Where(Equal(mask, lowest), FINITE_FILL, mask)`` (``-inf`` stays), also for an
    initializer a feed may override (listed as a graph input)."""
    if mask.dtype != DType.FLOAT:
        return mask
    graph = ctx.model.graph
    overridable = ctx.model.ir_version >= 4 and mask.name in graph.meta.get(
        "onnx_initializer_inputs", {}
    )
    data = None if overridable else const_value(mask)
    if data is not None:
        if not np.any(data == _LOWEST):
            return mask
        fixed = np.where(data == _LOWEST, np.float32(FINITE_FILL), data).astype(np.float32)
        name = f"{mask.name}_finite_fill"
        made = graph.initializers.get(name)  # another layer's rewrite made it
        if made is not None and np.array_equal(const_value(made), fixed):
            return made
        free = made is None and not graph.has_value_name(name)
        return graph.add_initializer(name if free else graph.fresh_name(name), fixed)
    lowest = ctx.add_constant("attention_mask_lowest", np.array(_LOWEST, np.float32))
    fill = ctx.add_constant("attention_mask_finite", np.array(FINITE_FILL, np.float32))
    hit = ctx.make_node("Equal", [mask, lowest]).outputs[0]
    hit.dtype, hit.shape = DType.BOOL, mask.shape
    out = ctx.make_node("Where", [hit, fill, mask]).outputs[0]
    out.dtype, out.shape = mask.dtype, mask.shape
    return out


def _query_rows(ctx: RewriteContext, mask: Value, q: Value) -> Value:
    """``mask`` with a row per query: onnxruntime's ``Attention`` kernel requires the mask's
    second-to-last dim to be the query length (it does not broadcast a 1 there, as the
    standard allows), so a mask with one row for every query (a key-padding mask
    ``[B, 1, 1, S]``) is expanded to ``[..., L, S]`` (:meth:`RewriteContext.expand_to`). A
    symbolic row count is taken to be the query length (the exporters' causal masks): the
    ``Shape`` of ``q`` the expansion reads would keep the layout pass from taking the head
    split and the cache into the operator."""
    rank = mask.rank
    if rank is None or rank < 2 or mask.shape[-2] != 1 or q.shape[2] == 1:
        return mask
    return ctx.expand_to(mask, -2, q, 2)


def rewrite_attention(ctx: RewriteContext) -> list[Value]:
    model = ctx.model
    problem = upgrade_problem(model, ATTENTION_OPSET)
    if problem is not None:
        raise RewriteError(f"Attention needs opset {ATTENTION_OPSET}: {problem}")
    q, v = ctx.value("q"), ctx.value("v")
    if q.dtype not in _FLOATS:
        raise RewriteError(f"Attention needs a floating-point q, not {q.type_str()}")
    if "k" in ctx.match.values:
        k = ctx.value("k")
    else:
        kt = ctx.value("kt")
        k = untransposed_key(kt)
        if k is None:
            if kt.rank != 4:
                raise RewriteError(f"kT %{kt.name} is not 4-D")
            k = ctx.make_node("Transpose", [kt], {"perm": [0, 1, 3, 2]}).outputs[0]
            k.dtype, k.shape = kt.dtype, (*kt.shape[:2], kt.shape[3], kt.shape[2])
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.rank != 4:
            raise RewriteError(f"Attention needs 4-D [batch, heads, seq, head] {name}: %{x.name}")
        if x.dtype != q.dtype:
            raise RewriteError(f"{name} %{x.name} is {x.type_str()}, q is {q.type_str()}")
    k0, v0 = unrepeated(k), unrepeated(v)
    if k0 is not None and v0 is not None and k0.shape[1] == v0.shape[1]:
        k, v = k0, v0
    heads, kv_heads = q.shape[1], k.shape[1]
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise RewriteError(f"{heads} query heads are not a multiple of {kv_heads} key heads")
    mask = _additive_mask(ctx, q.dtype)
    if mask is not None:
        mask = _query_rows(ctx, mask, q)
    attrs = {"scale": attention_scale(ctx)}
    if "softcap_tanh" in ctx.match.labels:
        cap, why = _softcap(ctx.const, ctx.label("softcap_in").op_type)
        if cap is None:
            raise RewriteError(why or "not a soft-cap")
        attrs["softcap"] = cap
    upgrade_opset(model, ATTENTION_OPSET)
    node = ctx.make_node("Attention", [q, k, v, mask] if mask is not None else [q, k, v], attrs)
    out = node.outputs[0]
    out.dtype, out.shape = q.dtype, ctx.match.outputs[0].shape
    return [out]
