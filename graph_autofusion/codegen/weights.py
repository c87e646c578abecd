"""Compressed weights on onnxruntime: contractions by a constant matrix as ``MatMulNBits``
or graph-autofusion's ``GemvQ`` (int8, int4: the same quantized values, safe mode times both;
:mod:`graph_autofusion.codegen.ort_gemv_q`) or ``GemvF16`` (fp16, :func:`to_half`; the
operator is :mod:`graph_autofusion.codegen.ort_gemv_f16`).

    sites, kept = find_sites(model)                  # what could be compressed, what cannot
    packed = quantize(site.weight, bits=8, block_size=32)
    compress_site(model, site, packed, accuracy_level=4)   # the node becomes MatMulNBits

onnxruntime's ``com.microsoft.MatMulNBits`` (contrib schema, onnxruntime 1.32) multiplies an
fp32 activation ``A[..., K]`` by a weight stored blockwise along ``K``: ``B`` uint8
``[N, k_blocks, blob_size]`` (``blob_size = block_size * bits / 8``; 4-bit values two to a
byte, the first in the low nibble), ``scales`` fp32 ``[N, k_blocks]``, optional
``zero_points`` (uint8, packed like ``B`` for 4 bits: ``[N, ceil(k_blocks * bits / 8)]``;
absent: ``2^(bits-1)``), optional ``bias [N]``; attributes ``K``, ``N``, ``bits``,
``block_size`` (a power of two >= 16) and ``accuracy_level`` (4: the CPU kernel quantizes
``A`` per block to int8 and runs an integer dot product). Dequantization happens inside the
kernel: the weight is read once per call in its compressed form.

Quantization needs no calibration data: round to nearest per block of ``block_size`` weights
along ``K``, symmetric (``scale = max|w| / (2^(bits-1) - 1)``, zero point ``2^(bits-1)``) or
with a zero point (``scale = (max - min) / (2^bits - 1)``, the range always holding 0); the
scales are rounded up to fp16 (and the codes against them) where all of a weight's are in
fp16's normal range, which ``GemvQ`` then stores in half the bytes.

The sites: ``MatMul(A, W)``, ``MatMul(A, Transpose(W))``, ``Gemm(A, W, bias)`` (``transB``,
alpha and beta 1, no ``transA``) and ``com.microsoft.FusedMatMul`` (``transB``, alpha 1) with a
constant float32 ``W`` of rank 2. :func:`find_sites` gives the others a reason (the LM head and
tiny matrices by policy, non-constant or non-float32 weights because no form takes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graph_autofusion.codegen.onnxruntime import prune_dead_feeders
from graph_autofusion.codegen.ort_customop_c import DOMAIN
from graph_autofusion.codegen.ort_gemv import OP as GEMV_OP
from graph_autofusion.codegen.ort_gemv_f16 import OP as F16_OP
from graph_autofusion.codegen.ort_gemv_q import OP as Q_OP
from graph_autofusion.codegen.ort_gemv_q import eligible, half_exact, to_panels
from graph_autofusion.ir.core import Model, Node, Value, const_value
from graph_autofusion.ir.dtypes import DType

#: Bits of each compressed form.
BITS = {"int8": 8, "int4": 4}
#: Operators that only move or retype values (a contraction whose output reaches a graph output
#: through them alone computes the model's output: the LM head).
_SHAPE_ONLY = ("Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Cast")

# reasons a contraction stays fp32
KEPT_HEAD = "kept fp32: LM head (policy: the layer producing the model's output, or vocabulary-sized with no layer after it, stays fp32)"
KEPT_EMBEDDING = "kept fp32: embedding table (policy: an fp16 model keeps its tables fp32)"
KEPT_FP16 = (
    "kept fp32: the fp16 form is graph-autofusion's GemvF16 custom operator, and its library "
    "could not be built here"
)


@dataclass
class Packed:
    """A weight ``[K, N]`` quantized for ``MatMulNBits`` (``bits`` 4 or 8), or rounded to
    fp16 (``bits`` 16: ``b`` is the fp16 weight in ``GemvF16``'s layout, no scales;
    :func:`to_half`)."""

    bits: int
    block_size: int
    k: int
    n: int
    b: np.ndarray  # uint8 [N, k_blocks, blob_size]
    scales: np.ndarray  # float32 [N, k_blocks]
    zero_points: np.ndarray | None  # uint8 [N, k_blocks] (8 bits) or packed (4 bits)
    dequantized: np.ndarray  # float32 [K, N]: what the kernel multiplies by
    kernel: str = "MatMulNBits"  # or GemvQ (bits 4 and 8, where :meth:`gemvq` holds)

    @property
    def half_scales(self) -> bool:
        """Whether the scales are fp16 values (:func:`quantize` rounds them so where it can),
        which ``GemvQ`` then stores as fp16 (:func:`~graph_autofusion.codegen.ort_gemv_q.
        to_panels`)."""
        return half_exact(self.scales)

    @property
    def nbytes(self) -> int:
        scales = self.scales.nbytes
        if self.kernel == Q_OP:  # GemvQ's zero points: a byte per block, or one for all
            zp = self.scales.size if self.zero_points is not None else 1
            scales //= 2 if self.half_scales else 1
        else:
            zp = self.zero_points.nbytes if self.zero_points is not None else 0
        return int(self.b.nbytes + scales + zp)

    @property
    def op(self) -> str:
        """The operator a contraction by this weight runs on: ``GemvF16`` for fp16, else
        :attr:`kernel`."""
        return F16_OP if self.bits == 16 else self.kernel

    @property
    def gemvq(self) -> bool:
        """Whether ``GemvQ`` can run this weight (8 or 4 bits, 16 dividing N, whole blocks)."""
        return self.bits in (4, 8) and eligible(self.k, self.n, self.block_size)

    def panels(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``GemvQ``'s ``(Wq, S, Z)`` of this weight (:func:`~graph_autofusion.codegen.
        ort_gemv_q.to_panels`)."""
        return to_panels(self.b, self.scales, self.zero_points, self.bits, self.k, self.n)


@dataclass
class Site:
    """One contraction by a constant matrix: ``y = a @ weight (+ bias)``."""

    node: Node
    name: str
    op: str
    a: Value
    y: Value
    weight: np.ndarray | None  # float [K, N] (None: not constant)
    bias: np.ndarray | None = None
    k: int = 0
    n: int = 0
    reason: str = ""  # why it stays fp32 ("" : it can be compressed)
    head: bool = False  # the LM head (the model's output, or vocabulary-sized)
    extra: list[Node] = field(default_factory=list)  # the Transpose of a transposed weight
    tail: Node | None = None  # the bias Add folded in (its output is then ``y``)

    @property
    def fp32_bytes(self) -> int:
        return 4 * self.k * self.n


def quantize(w: np.ndarray, bits: int, block_size: int, zero_point: bool = False) -> Packed:
    """Round-to-nearest blockwise quantization of ``w [K, N]`` along ``K`` (see the module
    docstring); ``K`` is padded with zeros to whole blocks."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    w = np.asarray(w, dtype=np.float32)
    k, n = w.shape
    nb = -(-k // block_size)
    padded = np.zeros((nb * block_size, n), np.float32)
    padded[:k] = w
    blocks = np.ascontiguousarray(padded.T).reshape(n, nb, block_size)
    top, half = 2**bits - 1, 2 ** (bits - 1)
    if zero_point:
        lo = np.minimum(blocks.min(-1), 0.0)
        scale = (np.maximum(blocks.max(-1), 0.0) - lo) / top
    else:
        scale = np.abs(blocks).max(-1) / (half - 1)
    scale[scale == 0] = 1.0
    scale = _half_where_normal(scale.astype(np.float32))
    if zero_point:
        zp = np.clip(np.round(-lo / scale), 0, top)
        q = np.clip(np.round(blocks / scale[..., None]) + zp[..., None], 0, top)
    else:
        zp = np.full(scale.shape, float(half))
        q = np.clip(np.round(blocks / scale[..., None]), 1 - half, half - 1) + half
    q = q.astype(np.uint8)
    deq = (q.astype(np.float32) - zp[..., None].astype(np.float32)) * scale[..., None]
    deq = np.ascontiguousarray(deq.reshape(n, nb * block_size)[:, :k].T)
    zps = None
    if bits == 4:
        b = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
        if zero_point:
            z = zp.astype(np.uint8)
            if nb % 2:
                z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
            zps = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
    else:
        b = q
        zps = zp.astype(np.uint8) if zero_point else None
    return Packed(bits, block_size, k, n, np.ascontiguousarray(b), scale, zps, deq)


def _half_where_normal(scale: np.ndarray) -> np.ndarray:
    """``scale`` rounded up to fp16 where every value is in fp16's normal range (``GemvQ`` then
    stores them in half the bytes), else as it is. Up, so a block's range still fits its codes
    and the codes, rounded against the rounded scales, keep each weight within half a step."""
    with np.errstate(over="ignore"):
        s16 = scale.astype(np.float16)
        s16 = np.where(s16.astype(np.float32) < scale, np.nextafter(s16, np.float16(np.inf)), s16)
    if np.all(np.isfinite(s16)) and np.all(np.abs(s16) >= np.finfo(np.float16).tiny):
        return s16.astype(np.float32)
    return scale


def to_half(w: np.ndarray, *, panels: bool = False) -> Packed:
    """``w [K, N]`` rounded to fp16, ``b`` as ``GemvF16`` reads it: nn.Linear's ``[N, K]``, or
    with ``panels`` (and 16 dividing N) ``[N / 16, K, 16]``, sixteen rows interleaved along K
    (:mod:`graph_autofusion.codegen.ort_gemv_f16`). A weight beyond fp16's range becomes
    infinite: the per-layer check refuses it."""
    w = np.asarray(w, dtype=np.float32)
    k, n = w.shape
    with np.errstate(over="ignore"):
        half = np.ascontiguousarray(w.T).astype(np.float16)
    deq = np.ascontiguousarray(half.T.astype(np.float32))
    if panels and n % 16 == 0:
        half = np.ascontiguousarray(half.reshape(n // 16, 16, k).transpose(0, 2, 1))
    return Packed(16, 0, k, n, half, np.zeros((n, 0), np.float32), None, deq)


def _transposed_const(v: Value) -> np.ndarray | None:
    """``v``'s data when it is ``Transpose(constant 2-D, perm [1, 0])``."""
    p = v.producer
    if p is None or p.op_type != "Transpose" or p.domain not in ("", "ai.onnx"):
        return None
    data = const_value(p.inputs[0]) if p.inputs and p.inputs[0] is not None else None
    if data is None or data.ndim != 2 or list(p.attrs.get("perm", [1, 0])) != [1, 0]:
        return None
    return data.T


def _weight_of(node: Node) -> tuple[Value | None, np.ndarray | None, bool, str]:
    """``(B value, B as [K, N] or None, transposed-by-a-node, why not)``."""
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None, None, False, "no weight input"
    b = node.inputs[1]
    data = const_value(b)
    via_transpose = False
    if data is None:
        data = _transposed_const(b)
        via_transpose = data is not None
    trans_b = int(node.attrs.get("transB", 0)) if node.op_type in ("Gemm", "FusedMatMul") else 0
    if data is not None and trans_b:
        data = data.T
    return b, data, via_transpose, ""


def _contraction(node: Node) -> str:
    """Why ``node`` is not a plain ``a @ W (+ bias)`` contraction ("" when it is)."""
    a = node.attrs
    if node.op_type == "Gemm":
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            return "kept fp32: Gemm with transA, alpha or beta (no MatMulNBits form)"
    if node.op_type == "FusedMatMul":
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0:
            return "kept fp32: FusedMatMul with transA or alpha (no MatMulNBits form)"
        if a.get("transBatchA", 0) or a.get("transBatchB", 0):
            return "kept fp32: FusedMatMul with batch transposes (no MatMulNBits form)"
    return ""


def _reaches_output(model: Model, v: Value, depth: int = 6) -> bool:
    """Whether ``v`` is a graph output, directly or through shape-only operators."""
    if model.graph.is_output(v):
        return True
    if depth == 0:
        return False
    for user, _ in v.users:
        if user.op_type in _SHAPE_ONLY and user.outputs and user.inputs[0] is v:
            if _reaches_output(model, user.outputs[0], depth - 1):
                return True
    return False


#: Operators that contract their input with a weight: a layer whose output reaches one is
#: inside the network, not its LM head (whose logits no later layer reads).
_CONTRACTIONS = frozenset({"MatMul", "Gemm", "FusedMatMul", "MatMulNBits", GEMV_OP, "Conv"})


def _feeds_contraction(v: Value) -> bool:
    """Whether any contraction reads ``v`` or a value computed from it (a vocabulary-wide
    layer inside the network, e.g. an FFN whose width equals the vocabulary or the position
    table's rows, against the LM head, whose logits only reach outputs)."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        for user, _ in todo.pop().users:
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.op_type in _CONTRACTIONS:
                return True
            todo.extend(o for o in user.outputs if o is not None)
    return False


def embedding_tables(model: Model) -> list[tuple[str, int, int]]:
    """The ``Gather`` tables of the model's embeddings: ``(node name, rows, columns)``."""
    out = []
    for node in model.graph.nodes:
        if node.op_type != "Gather" or not node.inputs or node.inputs[0] is None:
            continue
        data = const_value(node.inputs[0])
        if data is not None and data.ndim == 2 and data.dtype.kind == "f" and data.size >= 4096:
            out.append((node.name, int(data.shape[0]), int(data.shape[1])))
    return out


def find_sites(model: Model, *, min_elements: int = 4096, keep_head: bool = True) -> list[Site]:
    """Every contraction by a rank-2 matrix in ``model``'s main graph, in graph order, each with
    ``reason`` empty when it can become ``MatMulNBits`` and the reason it stays fp32 otherwise
    (``keep_head``: the LM head by policy; otherwise it is marked ``head`` only).
    Contractions of two activations of higher rank (attention scores) are not listed. Our
    fp32 ``Gemv`` (a decode step's linear on the torch route) is one too, its ``[N, K]``
    weight read as ``W``; the ``If`` form's branches (a dynamic row count) are not searched."""
    sites: list[Site] = []
    vocab = {rows for _, rows, _ in embedding_tables(model)}
    for node in model.graph.nodes:
        if node.op_type == GEMV_OP and node.domain == DOMAIN:  # our few-row GEMV, Wt [N, K]
            b, wt = node.inputs[1], const_value(node.inputs[1])
            if wt is None or wt.ndim != 2:
                continue
            data, via_t = wt.T, False
        elif node.op_type not in ("MatMul", "Gemm", "FusedMatMul") or (node.domain or "") not in (
            ("com.microsoft",) if node.op_type == "FusedMatMul" else ("", "ai.onnx")
        ):
            continue
        else:
            b, data, via_t, why = _weight_of(node)
        if b is None:
            continue
        if data is None and b.rank != 2:
            continue  # activation x activation (attention): not a weight
        a, y = node.inputs[0], node.outputs[0]
        site = Site(node, node.name, node.op_type, a, y, data)
        if via_t:
            site.extra = [b.producer]
        if data is not None:
            site.k, site.n = int(data.shape[0]), int(data.shape[1])
        site.reason = _reason(model, node, site, data, min_elements, keep_head, vocab)
        if not site.reason and node.op_type != "Gemm":
            _absorb_bias(model, site)
        if not site.reason and node.op_type == "Gemm" and len(node.inputs) > 2:
            c = node.inputs[2]
            bias = const_value(c) if c is not None else None
            if c is not None and (bias is None or bias.size != site.n):
                site.reason = "kept fp32: Gemm bias is not a constant [N] vector"
            elif bias is not None:
                site.bias = bias.reshape(-1).astype(np.float32)
        sites.append(site)
    return sites


def _absorb_bias(model: Model, site: Site) -> None:
    """``MatMul`` then ``Add`` of a constant ``[N]`` vector (a ``Linear``'s bias as exported
    for 3-D activations): the bias becomes ``MatMulNBits``' own input, and the ``Add``'s
    output the site's output. Left alone when the product has another reader or is a graph
    output, or the constant would broadcast the product to a higher rank."""
    y = site.y
    if len(y.users) != 1 or model.graph.is_output(y):
        return
    add, _ = y.users[0]
    if add.op_type != "Add" or (add.domain or "") not in ("", "ai.onnx") or len(add.inputs) != 2:
        return
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    bias = const_value(other) if other is not None and other is not y else None
    if bias is None or bias.dtype != np.float32 or bias.size != site.n:
        return
    if bias.shape[-1:] != (site.n,) or bias.ndim > (y.rank if y.rank is not None else 1):
        return
    site.bias = np.ascontiguousarray(bias.reshape(-1))
    site.tail = add
    site.y = add.outputs[0]


def _reason(
    model: Model,
    node: Node,
    site: Site,
    data: np.ndarray | None,
    min_elements: int,
    keep_head: bool,
    vocab: set[int],
) -> str:
    why = _contraction(node)
    if why:
        return why
    if data is None:
        return "kept fp32: the weight is not a constant initializer (no compressed form)"
    if data.dtype != np.float32:
        return f"kept fp32: {data.dtype} weights (the compressed forms take float32 models)"
    if site.a.dtype is not None and site.a.dtype != DType.FLOAT:
        return f"kept fp32: {site.a.dtype.name} activations (the compressed forms take float32)"
    if site.a.rank is not None and site.a.rank < 2:
        return "kept fp32: a 1-D activation (MatMulNBits takes [..., M, K])"
    if site.k < 16:
        return f"kept fp32: K={site.k} is smaller than one block"
    if site.k * site.n < min_elements:
        return f"kept fp32: tiny matrix ({site.k}x{site.n} < {min_elements} weights)"
    site.head = _reaches_output(model, site.y) or (
        site.n in vocab and site.n >= 1000 and not _feeds_contraction(site.y)
    )
    if keep_head and site.head:
        return KEPT_HEAD
    return ""


def nbits_inputs(graph: Any, site: Site, packed: Packed, prefix: str) -> list[Value | None]:
    """The initializers of ``site``'s ``MatMulNBits`` in ``graph`` (an IR graph): ``[A, B,
    scales, zero_points, g_idx, bias]`` trimmed of trailing absent ones."""
    b = graph.add_initializer(graph.fresh_name(f"{prefix}_q{packed.bits}"), packed.b)
    s = graph.add_initializer(graph.fresh_name(f"{prefix}_scales"), packed.scales)
    zp = None
    if packed.zero_points is not None:
        zp = graph.add_initializer(graph.fresh_name(f"{prefix}_zp"), packed.zero_points)
    bias = None
    if site.bias is not None:
        bias = graph.add_initializer(graph.fresh_name(f"{prefix}_bias"), site.bias)
    ins: list[Value | None] = [site.a, b, s, zp, None, bias]
    while ins[-1] is None:
        ins.pop()
    return ins


def nbits_attrs(packed: Packed, accuracy_level: int) -> dict[str, int]:
    return {
        "K": packed.k,
        "N": packed.n,
        "bits": packed.bits,
        "block_size": packed.block_size,
        "accuracy_level": int(accuracy_level),
    }


def _replace(model: Model, node: Node, new: Node, tail: Node | None = None) -> None:
    """``new`` (already in the graph, before ``node``) takes over ``node``'s output (``tail``'s
    when given: the bias ``Add`` after it), by its name too; ``node`` and ``tail`` go, and so
    do the initializers only they read."""
    graph = model.graph
    last = tail or node
    out, y = new.outputs[0], last.outputs[0]
    out.dtype, out.shape = y.dtype, y.shape
    name = y.name
    graph.replace_all_uses_with(y, out)
    product = node.outputs[0]  # read by ``tail`` only: goes with it
    feeders = [
        v
        for n in (node, tail)
        if n is not None
        for v in n.inputs
        if v is not None and v is not product
    ]
    graph.remove_nodes([n for n in (tail, node) if n is not None])
    prune_dead_feeders(model, feeders)
    if not graph.has_value_name(name):
        graph.rename_value(out, name)


def share_identical(model: Model, old_names: set[str]) -> int:
    """Initializers added since ``old_names`` that equal another (dtype, shape, bytes) become
    one: a weight a model shares between layers (ALBERT's layers, a tied matrix read twice)
    is compressed per reading site, and would otherwise be stored once per site. Returns how
    many were folded into another."""
    import hashlib

    graph = model.graph
    first: dict[tuple, Value] = {}
    folded = 0
    for name in [n for n in graph.initializers if n not in old_names]:
        value = graph.initializers[name]
        data = np.ascontiguousarray(value.const)
        key = (data.dtype.str, data.shape, hashlib.sha1(data.view(np.uint8)).hexdigest())
        keep = first.setdefault(key, value)
        if keep is not value and np.array_equal(keep.const, data):
            graph.replace_all_uses_with(value, keep)
            graph.remove_initializer(name)
            folded += 1
    return folded


def compress_site(model: Model, site: Site, packed: Packed, accuracy_level: int) -> Node:
    """Replace ``site``'s node in ``model`` by one ``MatMulNBits`` over ``packed`` (``GemvQ``
    where ``packed.kernel`` says so, ``GemvF16`` for fp16; the old weight initializer goes when
    nothing else reads it). Returns the new node."""

    graph = model.graph
    node = site.node
    prefix = (site.name or "matmul").replace("/", "_").strip("_") or "matmul"
    if packed.bits == 16:
        return _custom_site(model, site, F16_OP, [packed.b], prefix, ("f16",))
    if packed.kernel == Q_OP:
        return _custom_site(model, site, Q_OP, list(packed.panels()), prefix, ("q", "s", "z"))
    ins = nbits_inputs(graph, site, packed, prefix)
    new = graph.make_node(
        "MatMulNBits",
        ins,
        nbits_attrs(packed, accuracy_level),
        domain="com.microsoft",
        name=f"{site.name}/MatMulNBits" if site.name else "MatMulNBits",
        before=node,
    )
    _replace(model, node, new, site.tail)
    model.opset_imports.setdefault("com.microsoft", 1)
    return new


def _custom_site(
    model: Model, site: Site, op: str, arrays: list[np.ndarray], prefix: str, tags: tuple
) -> Node:
    """``site`` as our custom operator ``op(a, *arrays)`` (``GemvF16``, ``GemvQ``), then
    ``Add`` of its bias; the arrays' initializers are named ``<prefix>_<tag>``."""
    graph = model.graph
    ws = [graph.add_initializer(graph.fresh_name(f"{prefix}_{t}"), a) for a, t in zip(arrays, tags)]
    name = f"{site.name}/{op}" if site.name else op
    new = graph.make_node(op, [site.a, *ws], {}, domain=DOMAIN, name=name, before=site.node)
    product = site.node.outputs[0]
    new.outputs[0].dtype, new.outputs[0].shape = product.dtype, product.shape
    if site.bias is not None:
        bias = graph.add_initializer(graph.fresh_name(f"{prefix}_bias"), site.bias)
        new = graph.make_node(
            "Add", [new.outputs[0], bias], {}, name=f"{name}/bias", before=site.node
        )
    _replace(model, site.node, new, site.tail)
    model.opset_imports.setdefault(DOMAIN, 1)
    return new


@dataclass
class Embedding:
    """An embedding table read by ``Gather`` nodes only (axis 0): ``table [rows, columns]``."""

    name: str  # the table's value name
    nodes: list[Node]
    table: np.ndarray
    reason: str = ""

    @property
    def fp32_bytes(self) -> int:
        return int(self.table.size * 4)


def find_embeddings(model: Model, block_size: int) -> list[Embedding]:
    """The float32 tables of ``Gather`` nodes (those of :func:`embedding_tables`), each with the
    reason it cannot become ``GatherBlockQuantized`` ("" when it can)."""
    out: dict[str, Embedding] = {}
    for node in model.graph.nodes:
        if node.op_type != "Gather" or not node.inputs or node.inputs[0] is None:
            continue
        v = node.inputs[0]
        data = const_value(v)
        if data is None or data.ndim != 2 or data.dtype.kind != "f" or data.size < 4096:
            continue
        emb = out.setdefault(v.name, Embedding(v.name, [], data))
        emb.nodes.append(node)
    for emb in out.values():
        v = emb.nodes[0].inputs[0]
        users = [u for u, _ in v.users]
        if any(u.op_type != "Gather" or u.inputs[0] is not v for u in users):
            emb.reason = "kept fp32: the table is also read by other operators (a tied head)"
        elif any(int(u.attrs.get("axis", 0)) != 0 for u in users):
            emb.reason = "kept fp32: a Gather on another axis than 0"
        elif emb.table.dtype != np.float32:
            emb.reason = f"kept fp32: {emb.table.dtype} table"
        elif emb.table.shape[1] % block_size:
            emb.reason = f"kept fp32: {emb.table.shape[1]} columns are not whole blocks"
    return list(out.values())


def compress_embedding(model: Model, emb: Embedding, packed: Packed) -> list[Node]:
    """Every ``Gather`` of ``emb`` becomes ``com.microsoft.GatherBlockQuantized`` over the
    8-bit table ``packed`` (:func:`quantize` of the table's transpose: blocks along the
    columns; no zero point: 128)."""

    graph = model.graph
    if packed.bits == 16:  # fp16: Gather of the fp16 table, then Cast to float32
        return _half_table(model, emb, packed)
    if packed.bits != 8 or packed.zero_points is not None:
        raise ValueError("embeddings are quantized to 8 bits, symmetric")
    rows, cols = emb.table.shape
    data = graph.add_initializer(
        graph.fresh_name(f"{emb.name}_q8"), packed.b.reshape(rows, -1)[:, :cols]
    )
    scales = graph.add_initializer(graph.fresh_name(f"{emb.name}_scales"), packed.scales)
    new_nodes = []
    for node in emb.nodes:
        new = graph.make_node(
            "GatherBlockQuantized",
            [data, node.inputs[1], scales],
            {"bits": 8, "block_size": packed.block_size, "gather_axis": 0, "quantize_axis": 1},
            domain="com.microsoft",
            name=f"{node.name}/GatherBlockQuantized" if node.name else "GatherBlockQuantized",
            before=node,
        )
        _replace(model, node, new)
        new_nodes.append(new)
    model.opset_imports.setdefault("com.microsoft", 1)
    return new_nodes


def _half_table(model: Model, emb: Embedding, packed: Packed) -> list[Node]:
    """Every ``Gather`` of ``emb`` reads the fp16 table (``packed.b``, ``[rows, columns]``) and
    casts the rows it gathers to float32."""
    graph = model.graph
    table = graph.add_initializer(graph.fresh_name(f"{emb.name}_f16"), packed.b)
    new_nodes = []
    for node in emb.nodes:
        name = node.name or "Gather"
        g = graph.make_node(
            "Gather", [table, node.inputs[1]], {"axis": 0}, name=f"{name}/f16", before=node
        )
        g.outputs[0].dtype, g.outputs[0].shape = DType.FLOAT16, node.outputs[0].shape
        new = graph.make_node(
            "Cast", [g.outputs[0]], {"to": int(DType.FLOAT)}, name=f"{name}/cast", before=node
        )
        _replace(model, node, new)
        new_nodes += [g, new]
    return new_nodes
