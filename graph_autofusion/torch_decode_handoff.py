"""The decode loop's state handed back to Hugging Face's cache before a length threshold.

A decoder whose Python branches on the cache length (a sliding window: Mistral, Gemma-2/3,
Starcoder2, Cohere2; a static cache's end; a rotary scaling switch) has a decode graph that
Dynamo's shape guards refuse at some step: the loop may run until the step before, but then
``generate()`` must go on from where the loop stopped, and the loop never touched Hugging
Face's cache object (it calls the compiled graph, not the frame whose side effects update the
cache). This module writes the loop's state back into that object.

Where each value goes is what Dynamo recorded: every argument of the graph has a source, an
access path from the frame's locals (``L['kwargs']['cache'].layers[0].keys``). An argument
under the cache is assigned there; the arguments ``generate()`` makes anew for every step
(:data:`REBUILT`: ids, mask, positions) need nothing; any other argument that changes per
step refuses the hand-off. Before the loop runs, the paths are checked on the probe's last
step: the live cache, as Hugging Face's own step left it, must hold exactly what the learnt
rules predict for every path (:func:`agrees`), else no hand-off.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

#: A source under the model's cache argument (``cache`` from transformers 5, or
#: ``past_key_values``), given by keyword or by name.
_CACHE_ROOT = re.compile(r"^L(?:\['kwargs'\])?\['(?:cache|past_key_values)'\]")
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]")
#: A size, stride or offset of an argument: follows the tensor (written back, or remade).
_DERIVED = re.compile(r"(?:\.(?:size|stride)\(\)\[\d+\]|\.storage_offset\(\))$")
_ARG = re.compile(r"^L(?:\['kwargs'\])?\['(\w+)'\]$")
#: generate() arguments Hugging Face makes anew for every step from the sequence, the mask
#: and the cache.
REBUILT = frozenset({"input_ids", "attention_mask", "position_ids", "cache_position"})
#: Rules of arguments that change from step to step (torch_decode.Rule kinds).
MOVING = frozenset({"feed", "token", "count", "grow"})

Path = tuple[tuple[str, Any], ...]


def arg_sources(gm: Any) -> list[str]:
    """Dynamo's access path of each argument of the graph ``gm`` ("" where it has none):
    read when the backend is handed the graph (Dynamo drops them afterwards)."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = getattr(node.meta.get("grapharg"), "source", None)
            name = getattr(source, "name", "") if source is not None else ""
            out.append(name if isinstance(name, str) else "")
    return out


def cache_paths(graph: Any, kinds: Sequence[str]) -> tuple[list[tuple[int, Path]], str]:
    """Per argument of ``graph`` (a CompiledGraph) held in the cache, its path there; and
    why no hand-off is possible ("" when it is). ``kinds``: each argument's rule kind."""
    names = getattr(graph, "sources", None) or []
    if len(names) != len(kinds) or not any(names):
        return [], "the decode graph's arguments have no sources"
    paths = []
    for i, (name, kind) in enumerate(zip(names, kinds)):
        root = _CACHE_ROOT.match(name)
        if root:
            rest = name[root.end() :]
            path = _path(rest)
            if path:
                paths.append((i, path))
                continue
            if _path(_DERIVED.sub("", rest)):  # a size of a cache entry
                continue
        else:  # an argument generate() remakes, or a size of one
            arg = _ARG.match(_DERIVED.sub("", name))
            if arg and arg.group(1) in REBUILT:
                continue
        if kind in MOVING:
            return [], f"decode argument {name or i} changes per step outside the cache"
    if not paths:
        return [], "no cache entry among the decode graph's arguments"
    return paths, ""


def _path(text: str) -> Path | None:
    steps, at = [], 0
    for m in _STEP.finditer(text):
        if m.start() != at:
            return None
        steps.append(("attr", m.group(1)) if m.group(1) else ("item", int(m.group(2))))
        at = m.end()
    return tuple(steps) if steps and at == len(text) else None


def _get(obj: Any, step: tuple[str, Any]) -> Any:
    kind, key = step
    return getattr(obj, key) if kind == "attr" else obj[key]


def agrees(paths: list[tuple[int, Path]], cache: Any, nxt: Sequence[Any]) -> bool:
    """Whether ``cache`` holds ``nxt`` (the next call's arguments) at every path."""
    for i, path in paths:
        try:
            value = cache
            for step in path:
                value = _get(value, step)
        except (AttributeError, IndexError, KeyError, TypeError):
            return False
        want = nxt[i]
        if value is want:
            continue
        if isinstance(value, torch.Tensor) and isinstance(want, torch.Tensor):
            same = value.shape == want.shape and value.dtype == want.dtype
            if not (same and torch.equal(value, want)):
                return False
        elif type(value) is not type(want) or value != want:
            return False
    return True


def write_back(paths: list[tuple[int, Path]], cache: Any, nxt: Sequence[Any]) -> None:
    """Put ``nxt`` (the next call's arguments) into ``cache`` at every path."""
    for i, path in paths:
        parent = cache
        for step in path[:-1]:
            parent = _get(parent, step)
        kind, key = path[-1]
        if kind == "attr":
            setattr(parent, key, nxt[i])
        else:
            parent[key] = nxt[i]
