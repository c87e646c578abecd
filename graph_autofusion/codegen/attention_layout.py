"""After the attention lowering: let ``Attention`` take the heads and the KV cache itself.

Exporters split heads around attention with layout nodes, one chain per tensor:

    q3 [b, s, h*d] -> Reshape [b, s, h, d] -> Transpose(0, 2, 1, 3) -> (RotaryEmbedding) -> Q
    K = Concat(past_key, <the same for k>, axis=2)   (also the graph output present.N.key)
    Y [b, h, s, d] -> Transpose(0, 2, 1, 3) -> Reshape [b, s, h*d]

The opset-23 ``Attention`` and ``RotaryEmbedding`` also take 3-D ``[batch, seq, heads * size]``
tensors (``q_num_heads``/``kv_num_heads``, ``num_heads``), and ``Attention`` takes the past
key/value and returns the present ones. Where every chain of one attention has exactly that
form and nothing else reads its intermediate values, :func:`absorb_layout` rewrites it as

    Attention(q3', k3', v3, mask, past_key, past_value) -> (y3, present_key, present_value)

(``'``: rotated by a 3-D RotaryEmbedding), removing per layer the 3 Reshape + 3 Transpose of the
head split, the 2 KV-cache Concats and the Transpose + Reshape of the merge. The presents keep
their graph-output names. Anything else leaves that attention as it is. The pipeline compares
the model before and after on the sample inputs and keeps the old one if they differ.
"""

from __future__ import annotations

from graph_autofusion.codegen.onnxruntime import drop_dead_initializers, prune_dead_feeders
from graph_autofusion.ir.core import Model, Node, Value, producer_of
from graph_autofusion.patterns.matcher import const_value

_PERM = [0, 2, 1, 3]


def _only_reader(value: Value, node: Node, graph) -> bool:
    users = value.users
    return len(users) == 1 and users[0][0] is node and not graph.is_output(value)


def _split_heads(
    x4: Value, reader: Node, graph
) -> tuple[Value, list[Node], Node | None, int] | None:
    """``x4`` = [RotaryEmbedding](Transpose(Reshape(x3))), read by ``reader`` alone:
    ``(x3, removed nodes, rotary, heads)``."""
    if not _only_reader(x4, reader, graph):
        return None
    removed: list[Node] = []
    rotary = producer_of(x4, "RotaryEmbedding")
    cur = x4
    if rotary is not None:
        if len(rotary.inputs) != 3 or rotary.attrs.get("interleaved", 0) != 0:
            return None
        if rotary.attrs.get("rotary_embedding_dim", 0) or rotary.attrs.get("num_heads", 0):
            return None
        cur = rotary.inputs[0]
        if not _only_reader(cur, rotary, graph):
            return None
    tr = producer_of(cur, "Transpose")
    if tr is None or list(tr.attrs.get("perm") or ()) != _PERM:
        return None
    rs = producer_of(tr.inputs[0], "Reshape")
    if rs is None or not _only_reader(tr.inputs[0], tr, graph):
        return None
    x3, r4 = rs.inputs[0], rs.outputs[0]
    if x3.rank != 3 or r4.rank not in (None, 4):
        return None
    heads, size = _head_dims(rs)
    if heads is None or size is None or x3.shape[2] not in (heads * size, None):
        return None
    removed += [rs, tr]
    return x3, removed, rotary, heads


def _head_dims(reshape: Node) -> tuple[int | None, int | None]:
    """``(heads, size)`` a ``[b, s, h*d] -> [b, s, h, d]`` Reshape makes: from its output's
    shape, else from a constant target (the shape folding makes most of them constant)."""
    out = reshape.outputs[0].shape
    dims = list(out[2:]) if out is not None and len(out) == 4 else [None, None]
    target = const_value(reshape.inputs[1])
    if target is not None and target.size == 4:
        t = [int(x) for x in target.reshape(-1)]
        dims = [
            d if isinstance(d, int) else (t[2 + i] if t[2 + i] > 0 else None)
            for i, d in enumerate(dims)
        ]
    heads, size = dims
    width = reshape.inputs[0].shape[-1] if reshape.inputs[0].shape else None
    if isinstance(width, int) and isinstance(size, int) and not isinstance(heads, int):
        heads = width // size if width % size == 0 else None  # [0, 0, -1, d]
    return (heads if isinstance(heads, int) else None), (size if isinstance(size, int) else None)


def _cache(x4: Value, graph) -> tuple[Value | None, Value, Node | None]:
    """``x4`` = Concat(past, new, axis=2) with ``past`` a graph input: ``(past, new, concat)``."""
    cat = producer_of(x4, "Concat")
    if cat is None or len(cat.inputs) != 2 or cat.attrs.get("axis") not in (2, -2):
        return None, x4, None
    past, new = cat.inputs
    for _ in range(4):  # TorchScript passes the past through a one-input Concat
        p = past.producer if past is not None else None
        if p is None or not (
            p.op_type == "Identity" or (p.op_type == "Concat" and len(p.inputs) == 1)
        ):
            break
        past = p.inputs[0]
    if past is None or not any(v is past for v in graph.inputs) or past.rank != 4:
        return None, x4, None
    others = [u for u, _ in x4.users]
    if len(others) != 1:  # the attention only (plus being the present graph output)
        return None, x4, None
    return past, new, cat


def _merge_heads(y4: Value, att: Node, graph) -> tuple[Value, list[Node], str] | None:
    """``Reshape(Transpose(y4))``: ``(merged, nodes, how)``; ``how``: ``copies`` (the target is
    ``[0, 0, n]``), ``flat`` (a constant 2-D target, ``[b*s, n]``) or ``shape`` (anything else:
    the output's dims must be q's)."""
    if not _only_reader(y4, _first_user(y4), graph):
        return None
    tr = _first_user(y4)
    if tr.op_type != "Transpose" or list(tr.attrs.get("perm") or ()) != _PERM:
        return None
    t = tr.outputs[0]
    rs = _first_user(t)
    if rs is None or rs.op_type != "Reshape" or not _only_reader(t, rs, graph):
        return None
    out = rs.outputs[0]
    target = const_value(rs.inputs[1])
    if out.shape is not None and len(out.shape) == 2:  # GPT-2: straight to [b*s, h*d]
        return (out, [tr, rs], "flat") if target is not None and target.size == 2 else None
    if out.shape is None or len(out.shape) != 3:
        return None
    copies = target is not None and target.size == 3 and list(target.reshape(-1)[:2]) == [0, 0]
    return out, [tr, rs], "copies" if copies else "shape"  # "shape": dims checked by the caller


def _first_user(value: Value) -> Node | None:
    users = value.users
    return users[0][0] if users else None


def _absorb_one(model: Model, att: Node) -> bool:
    graph = model.graph
    if len(att.inputs) > 4 or len(att.outputs) != 1 or att.attrs.get("is_causal", 0):
        return False
    q4, k4, v4 = att.inputs[:3]
    mask = att.inputs[3] if len(att.inputs) > 3 else None
    if q4.rank != 4:
        return False
    past_k, k_new, cat_k = _cache(k4, graph)
    past_v, v_new, cat_v = _cache(v4, graph)
    if (cat_k is None) != (cat_v is None):
        return False
    readers = (att, cat_k or att, cat_v or att)
    parts = [_split_heads(x, r, graph) for x, r in zip((q4, k_new, v_new), readers)]
    if any(p is None for p in parts):
        return False
    (q3, q_rm, q_rot, heads), (k3, k_rm, k_rot, kv_heads), (v3, v_rm, v_rot, v_heads) = parts
    if kv_heads != v_heads or heads % kv_heads:
        return False
    if v_rot is not None or (q_rot is None) != (k_rot is None):
        return False
    merged = _merge_heads(att.outputs[0], att, graph)
    if merged is None:
        return False
    y_old, y_rm, how = merged
    v_size = _head_dims(v_rm[0])[1]
    want = (q3.shape[0], q3.shape[1], heads * v_size)
    if how != "shape":  # Reshape [0, 0, n] or [m, n]: n must be heads * size (or -1 for [0, 0, -1])
        n = int(const_value(y_rm[1].inputs[1]).reshape(-1)[-1])
        if n not in ((-1, want[2]) if how == "copies" else (want[2],)):
            return False
    elif y_old.shape is None or any(a is None or a != b for a, b in zip(y_old.shape, want)):
        return False  # the merge must give [batch, seq, heads * size] in q's own dims

    def rotate(x3: Value, rot: Node, n: int) -> Value:
        node = graph.make_node(
            "RotaryEmbedding",
            [x3, rot.inputs[1], rot.inputs[2]],
            {"interleaved": 0, "num_heads": n},
            name="attention_layout/RotaryEmbedding",
            before=att,
        )
        node.outputs[0].dtype, node.outputs[0].shape = x3.dtype, x3.shape
        return node.outputs[0]

    if q_rot is not None:
        q3 = rotate(q3, q_rot, heads)
        k3 = rotate(k3, k_rot, kv_heads)
    attrs = dict(att.attrs)
    attrs.update(q_num_heads=heads, kv_num_heads=kv_heads)
    ins: list[Value | None] = [q3, k3, v3, mask]
    n_out = 1
    if cat_k is not None:
        ins += [past_k, past_v]
        n_out = 3
    while ins and ins[-1] is None:
        ins.pop()
    node = graph.make_node(
        "Attention", ins, attrs, name="attention_layout/Attention", num_outputs=n_out, before=att
    )
    y3 = node.outputs[0]
    y3.dtype, y3.shape = y_old.dtype, (y_old.shape if how != "flat" else want)
    if how == "flat":
        flat = graph.make_node(
            "Reshape", [y3, y_rm[1].inputs[1]], name="attention_layout/Reshape", before=att
        )
        flat.outputs[0].dtype, flat.outputs[0].shape = y_old.dtype, y_old.shape
        y3 = flat.outputs[0]
    replace = [(y_old, y3)]
    if cat_k is not None:
        for old, new in ((cat_k.outputs[0], node.outputs[1]), (cat_v.outputs[0], node.outputs[2])):
            new.dtype, new.shape = old.dtype, old.shape
            replace.append((old, new))
    names = [old.name for old, _ in replace]
    for old, new in replace:
        graph.replace_all_uses_with(old, new)
    dead = [att, *y_rm, *q_rm, *k_rm, *v_rm]
    dead += [n for n in (q_rot, k_rot, cat_k, cat_v) if n is not None]
    feeders = [v for n in dead for v in n.inputs if v is not None]
    graph.remove_nodes(dead)
    prune_dead_feeders(model, feeders)  # the head split's shape computations
    for (_, new), name in zip(replace, names):
        if not graph.has_value_name(name):
            graph.rename_value(new, name)
    if not graph.is_sorted:
        graph.topological_sort()
    return True


def absorb_layout(model: Model) -> int:
    """Rewrite every opset-23 ``Attention`` whose head split, KV-cache concatenation and head
    merge have the exporters' form; returns how many were rewritten."""
    graph = model.graph
    todo = [n for n in graph.nodes if n.op_type == "Attention" and n.domain == ""]
    done = 0
    for att in todo:
        if att.graph is graph and _absorb_one(model, att):
            done += 1
    if done:
        drop_dead_initializers(model)
    return done
