"""Messages about sample inputs: where the model came from (:func:`source_of`), and a run
on them that failed, explained: the node onnxruntime or torch names and the inputs that may
have caused it (:func:`run_failure`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from graph_autofusion.errors import SampleInputError
from graph_autofusion.ir.core import Model, Node, Value


def source_of(model: Model) -> str:
    """The file the model was read from (or its graph name), for messages."""
    return str(model.meta.get("onnx_source") or f"graph {model.graph.name!r}")


_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'(?: Status Message: (.*))?", re.S)


_TORCH_NODE = re.compile(r"failed at node '([^']*)' \(([^)]*)\): (.*)", re.S)


_ORT_INPUT = re.compile(r"(?:for input|input name|input): ?'?([\w./:-]+)'?")


_RUN_MARKERS = (
    "while running",
    "invalid dimensions for input",
    "Unexpected input data type",
    "Invalid rank for input",
    "Got invalid",
    "failed at node",
)


def failed_node(exc: BaseException) -> tuple[str, str, str]:
    """The node onnxruntime or the torch runner names in its failure ``exc``: its name, its
    operator type and the message about it (empty name and type where it names none)."""
    text = " ".join(str(exc).split())
    m = _ORT_NODE.search(text)
    if m:
        return m.group(2), m.group(1), m.group(3) or text
    t = _TORCH_NODE.search(text)
    if t:
        return t.group(1), t.group(2), t.group(3)
    return "", "", text


def run_failure(
    model: Model, feeds: Mapping[str, Any], exc: BaseException, *, runtime: str, generated: bool
) -> SampleInputError | None:
    """One clear error for the original model failing on the sample inputs (``None`` when
    ``exc`` is not such a failure, e.g. the runtime refused the model itself)."""
    text = " ".join(str(exc).split())
    if not any(m in text for m in _RUN_MARKERS):
        return None
    node_name, op, detail = failed_node(exc)
    detail = detail.split("onnxruntime::")[-1].strip()[:240]
    node = next((n for n in model.graph.nodes if node_name and n.name == node_name), None)
    suspects = _suspects(model, node, feeds)
    if not node:
        named = _ORT_INPUT.search(text)
        if named and named.group(1) in feeds:
            suspects = [named.group(1)]
    declared = _wrong_dtypes(model, feeds)
    if declared:  # an input of another type than the graph declares: that one
        suspects = list(declared)
    derived = getattr(feeds, "derived", {})
    how = "generated from the input specs" if generated else "given"
    at = f" at node {node_name!r} ({op})" if node_name else ""
    parts = []
    for name in suspects[:3]:
        arr = np.asarray(feeds[name]) if not isinstance(feeds[name], list) else None
        desc = "a sequence" if arr is None else f"{arr.dtype} {tuple(arr.shape)}"
        if arr is not None and arr.dtype.kind in "iub" and arr.size <= 8:
            desc += f" = {arr.reshape(-1).tolist()}"
        if name in derived:
            desc += f", derived as the {derived[name]}"
        if name in declared:
            desc += f"; the model declares {declared[name]}"
        parts.append(f"{name!r} ({desc})")
    carriers = [n for n in suspects if not _floating(feeds[n])]
    who = f"; check input{'s' if len(parts) > 1 else ''} {', '.join(parts)}" if parts else ""
    if not carriers and not declared:  # nothing shape- or index-like: maybe the model itself
        who += "; the model itself may be invalid, or it needs other inputs"
    for note in getattr(feeds, "notes", ()):
        who += f"; {note}"
    return SampleInputError(
        f"{source_of(model)}: the sample inputs {how} make the original model fail in "
        f"{runtime}{at}: {detail}{who}; pass inputs the model accepts with --inputs FILE.npz "
        f"(API: sample_inputs={{name: array}})"
    )


def check_given_inputs(model: Model, feeds: Mapping[str, Any]) -> None:
    """Check sample inputs a user gave against the model's inputs: every input must have a
    value (an initializer also listed as an input may be fed or left to its default). Keys
    that name no input are ignored, as onnxruntime ignores them (a tokenizer's whole output);
    they are named in the error when an input has no value (a misspelled key).

    Raises:
        SampleInputError: an input of the model has no value; the message names it, the keys
            that name no input, and the model's inputs.
    """
    graph = model.graph
    names = [v.name for v in graph.inputs]
    overridable = graph.meta.get("onnx_initializer_inputs", {})
    missing = missing_inputs(model, feeds)
    if not missing:
        return
    unknown = [k for k in feeds if k not in names and k not in overridable]
    extra = (
        f"; {', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not an "
        f"input of the model"
        if unknown
        else ""
    )
    raise SampleInputError(
        f"{source_of(model)}: the sample inputs given have no value for "
        f"{', '.join(map(repr, missing))}{extra} (its inputs: {', '.join(names)}); pass one "
        f"array per input with --inputs FILE.npz (API: sample_inputs={{name: array}})"
    )


def missing_inputs(model: Model, feeds: Mapping[str, Any]) -> list[str]:
    """The model's inputs that ``feeds`` gives no value."""
    return [v.name for v in model.graph.inputs if v.const is None and v.name not in feeds]


def declared_dtype(v: Value) -> np.dtype | None:
    """The NumPy dtype graph input ``v`` declares (``None``: unknown, or no NumPy dtype)."""
    try:
        return np.dtype(v.dtype.to_numpy()) if v.dtype is not None else None
    except TypeError:  # strings and the like
        return None


def _wrong_dtypes(model: Model, feeds: Mapping[str, Any]) -> dict[str, str]:
    """Fed inputs whose numpy dtype is not the one the graph declares: name -> declared."""
    out: dict[str, str] = {}
    for v in model.graph.inputs:
        arr = feeds.get(v.name)
        want = declared_dtype(v)
        if arr is None or isinstance(arr, list) or want is None or v.dtype.name == "BFLOAT16":
            continue
        try:
            got = np.asarray(arr).dtype
        except (TypeError, ValueError, RuntimeError):  # a tensor numpy cannot read
            continue
        if got != want and want.kind != "O":  # strings: numpy's own dtype for them varies
            out[v.name] = str(want)
    return out


def _floating(arr: Any) -> bool:
    if isinstance(arr, list):
        return False
    dtype = getattr(arr, "dtype", None)
    if dtype is not None and not isinstance(dtype, np.dtype):  # a torch tensor (bfloat16 too)
        return bool(dtype.is_floating_point or dtype.is_complex)
    return np.asarray(arr).dtype.kind in "fc"


def _suspects(model: Model, node: Node | None, feeds: Mapping[str, Any]) -> list[str]:
    """Graph inputs reaching ``node`` (all of them without one), shape- or index-carrying
    (non-float) ones first."""
    graph = model.graph
    inputs = [v for v in graph.inputs if v.name not in graph.initializers and v.name in feeds]
    if node is not None:
        reach: set[int] = set()
        stack, seen = [node], {id(node)}
        while stack:
            n = stack.pop()
            for v in n.all_inputs():
                if v.producer is None:
                    reach.add(id(v))
                elif id(v.producer) not in seen:
                    seen.add(id(v.producer))
                    stack.append(v.producer)
        inputs = [v for v in inputs if id(v) in reach] or inputs

    carriers = [v.name for v in inputs if not _floating(feeds[v.name])]
    return carriers or [v.name for v in inputs]
