"""Torch implementations of the layout and data-movement operators (ONNX semantics)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.runtime.torch_ops import OpCall, axes_of, ints, to_torch_dtype, torch_op

Tensor = torch.Tensor
_INT64_MAX = 2**63 - 1


@torch_op("Reshape")
def _reshape(call: OpCall, x: Tensor, shape: Tensor | None = None) -> Tensor:
    dims = ints(shape) if shape is not None else list(call.attr("shape"))
    if not call.attr("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@torch_op("Flatten")
def _flatten(call: OpCall, x: Tensor) -> Tensor:
    axis = call.attr("axis", 1) % (x.dim() + 1) if x.dim() else 0
    return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)


@torch_op("Transpose")
def _transpose(call: OpCall, x: Tensor) -> Tensor:
    perm = call.attr("perm")
    return x.permute(*(perm if perm is not None else reversed(range(x.dim()))))


@torch_op("Squeeze")
def _squeeze(call: OpCall, x: Tensor, axes: Tensor | None = None) -> Tensor:
    ax = axes_of(call, axes)
    if ax is None:
        return x.squeeze()
    return x.squeeze(tuple(a % x.dim() for a in ax)) if ax else x


@torch_op("Unsqueeze")
def _unsqueeze(call: OpCall, x: Tensor, axes: Tensor | None = None) -> Tensor:
    ax = axes_of(call, axes) or []
    rank = x.dim() + len(ax)
    for a in sorted(a % rank for a in ax):
        x = x.unsqueeze(a)
    return x


@torch_op("Expand")
def _expand(call: OpCall, x: Tensor, shape: Tensor) -> Tensor:
    out = torch.broadcast_shapes(tuple(x.shape), tuple(ints(shape)))
    return x.expand(out)


@torch_op("Tile")
def _tile(call: OpCall, x: Tensor, repeats: Tensor) -> Tensor:
    return x.repeat(*ints(repeats)) if x.dim() else x


@torch_op("Concat")
def _concat(call: OpCall, *xs: Tensor) -> Tensor:
    return torch.cat([x for x in xs if x is not None], dim=call.attr("axis"))


@torch_op("Split")
def _split(call: OpCall, x: Tensor, split: Tensor | None = None) -> tuple[Tensor, ...]:
    axis = call.attr("axis", 0)
    sizes = ints(split) if split is not None else call.attr("split")
    if not sizes:
        n, total = call.num_outputs, x.shape[axis]
        chunk = -(-total // n)
        sizes = [min(chunk, total - i * chunk) for i in range(n)]
    return tuple(torch.split(x, list(sizes), dim=axis))


def _slice_axis(x: Tensor, axis: int, start: int, end: int, step: int) -> Tensor:
    dim = x.shape[axis]
    if step > 0:
        s = min(max(start + dim if start < 0 else start, 0), dim)
        e = min(max(end + dim if end < 0 else end, 0), dim)
        return x.narrow(axis, s, 0) if e <= s else x[(slice(None),) * axis + (slice(s, e, step),)]
    s = min(max(start + dim if start < 0 else start, -1), dim - 1)
    e = min(max(end + dim if end < 0 else end, -1), dim - 1)
    idx = torch.arange(s, e, step, device=x.device)
    return x.index_select(axis, idx)


@torch_op("Slice")
def _slice(
    call: OpCall,
    x: Tensor,
    starts: Tensor | None = None,
    ends: Tensor | None = None,
    axes: Tensor | None = None,
    steps: Tensor | None = None,
) -> Tensor:
    if call.opset < 10:
        st, en, ax, sp = call.attr("starts"), call.attr("ends"), call.attr("axes"), None
    else:
        st, en = ints(starts), ints(ends)
        ax, sp = (
            (ints(axes) if axes is not None else None),
            (ints(steps) if steps is not None else None),
        )
    ax = list(ax) if ax else list(range(len(st)))
    sp = list(sp) if sp else [1] * len(st)
    for s, e, a, p in zip(st, en, ax, sp):
        x = _slice_axis(x, a % x.dim(), int(s), int(e), int(p))
    return x


@torch_op("Gather")
def _gather(call: OpCall, x: Tensor, idx: Tensor) -> Tensor:
    axis = call.attr("axis", 0) % x.dim()
    idx = idx.long()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    if idx.dim() == 0:
        return x.select(axis, idx) if idx.device.type == "meta" else x.select(axis, int(idx))
    if axis == 0 and x.dim() == 2:
        return F.embedding(idx, x)
    flat = x.index_select(axis, idx.reshape(-1))
    return flat.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])


@torch_op("GatherElements")
def _gather_elements(call: OpCall, x: Tensor, idx: Tensor) -> Tensor:
    axis = call.attr("axis", 0) % x.dim()
    idx = idx.long()
    return torch.gather(x, axis, torch.where(idx < 0, idx + x.shape[axis], idx))


@torch_op("GatherND")
def _gather_nd(call: OpCall, x: Tensor, idx: Tensor) -> Tensor:
    b = call.attr("batch_dims", 0)
    idx = idx.long()
    batch = x.shape[:b]
    nb = int(np.prod(batch, dtype=np.int64))
    k = idx.shape[-1]
    xs = x.reshape((nb,) + x.shape[b:])
    ids = idx.reshape(nb, -1, k)
    dims = torch.tensor(x.shape[b : b + k], device=idx.device)
    ids = torch.where(ids < 0, ids + dims, ids)
    bidx = torch.arange(nb, device=x.device).view(nb, 1).expand(nb, ids.shape[1])
    out = xs[(bidx,) + tuple(ids[..., i] for i in range(k))]
    return out.reshape(idx.shape[:-1] + x.shape[b + k :])


@torch_op("ScatterElements", "Scatter")
def _scatter_elements(call: OpCall, x: Tensor, idx: Tensor, upd: Tensor) -> Tensor:
    axis = call.attr("axis", 0) % x.dim()
    idx = idx.long()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    red = call.attr("reduction", "none")
    if red == "none":
        return x.scatter(axis, idx, upd)
    mode = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[red]
    return x.scatter_reduce(axis, idx, upd, mode)


@torch_op("ScatterND")
def _scatter_nd(call: OpCall, x: Tensor, idx: Tensor, upd: Tensor) -> Tensor:
    out = x.clone()
    k = idx.shape[-1]
    flat = idx.reshape(-1, k).long()
    u = upd.reshape((flat.shape[0],) + x.shape[k:])
    key = tuple(flat[:, i] for i in range(k))
    red = call.attr("reduction", "none")
    if red == "none":
        out[key] = u
    elif red == "add":
        out.index_put_(key, u, accumulate=True)
    else:
        raise UnsupportedOperatorError(f"ScatterND reduction {red!r} is not supported")
    return out


@torch_op("Pad")
def _pad(
    call: OpCall,
    x: Tensor,
    pads: Tensor | None = None,
    value: Tensor | None = None,
    axes: Tensor | None = None,
) -> Tensor:
    p = ints(pads) if pads is not None else list(call.attr("pads"))
    ax = ints(axes) if axes is not None else list(range(x.dim()))
    ax = [a % x.dim() for a in ax]
    n = len(ax)
    full = [0] * (2 * x.dim())
    for i, a in enumerate(ax):
        full[a], full[x.dim() + a] = p[i], p[n + i]
    torch_pads: list[int] = []
    for a in reversed(range(x.dim())):
        torch_pads += [full[a], full[x.dim() + a]]
    mode = call.attr("mode", "constant")
    if mode == "constant":
        v = float(value.reshape(-1)[0]) if value is not None and value.numel() else 0.0
        if call.opset < 11:
            v = call.attr("value", 0.0)
        return F.pad(x, torch_pads, value=v)
    return F.pad(x, torch_pads, mode={"edge": "replicate"}.get(mode, mode))


@torch_op("Shape")
def _shape(call: OpCall, x: Tensor) -> Tensor:
    dims = list(x.shape)
    start, end = call.attr("start", 0), call.attr("end", None)
    return torch.tensor(dims[start:end], dtype=torch.int64)


@torch_op("Size")
def _size(call: OpCall, x: Tensor) -> Tensor:
    return torch.tensor(x.numel(), dtype=torch.int64)


@torch_op("ConstantOfShape")
def _constant_of_shape(call: OpCall, shape: Tensor) -> Tensor:
    val = call.attr("value")
    if val is None:
        return torch.zeros(ints(shape), dtype=torch.float32)
    arr = torch.from_numpy(np.array(val).reshape(-1)[:1].copy())
    return arr.reshape(()).expand(ints(shape)).clone()


@torch_op("Constant")
def _constant(call: OpCall) -> Tensor:
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in call.attrs:
            return torch.from_numpy(np.array(call.attrs[key]).copy())
    raise UnsupportedOperatorError("Constant node without a supported value attribute")


@torch_op("Range")
def _range(call: OpCall, start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
    return torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


@torch_op("Trilu")
def _trilu(call: OpCall, x: Tensor, k: Tensor | None = None) -> Tensor:
    kk = ints(k)[0] if k is not None else 0
    return torch.triu(x, kk) if call.attr("upper", 1) else torch.tril(x, kk)


@torch_op("NonZero")
def _nonzero(call: OpCall, x: Tensor) -> Tensor:
    return torch.nonzero(x).t().contiguous()


@torch_op("OneHot")
def _onehot(call: OpCall, idx: Tensor, depth: Tensor, values: Tensor) -> Tensor:
    d = int(depth.reshape(-1)[0])
    idx = idx.long()
    idx = torch.where(idx < 0, idx + d, idx)
    oh = F.one_hot(idx.clamp(0, d - 1), d).bool() & ((idx >= 0) & (idx < d)).unsqueeze(-1)
    out = torch.where(oh, values[1], values[0])
    axis = call.attr("axis", -1)
    return out.movedim(-1, axis) if axis != -1 else out


@torch_op("EyeLike")
def _eyelike(call: OpCall, x: Tensor) -> Tensor:
    dt = call.attr("dtype")
    dtype = to_torch_dtype(dt) if dt is not None else x.dtype
    n, m = x.shape
    k = call.attr("k", 0)
    return torch.ones(n, m, dtype=dtype).triu(k).tril(k)


@torch_op("DepthToSpace")
def _d2s(call: OpCall, x: Tensor) -> Tensor:
    b = call.attr("blocksize")
    n, c, h, w = x.shape
    if call.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@torch_op("SpaceToDepth")
def _s2d(call: OpCall, x: Tensor) -> Tensor:
    b = call.attr("blocksize")
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@torch_op("Dropout")
def _dropout(call: OpCall, x: Tensor, ratio: Tensor | None = None, training: Tensor | None = None):
    if call.num_outputs > 1:
        return x, torch.ones_like(x, dtype=torch.bool)
    return x
