"""YAML read with its node tree, so errors can name the line of a key (rule and profile files).

Rule files and hardware profiles come from users, so reading one is bounded before anything is
built from it: the file's size (:data:`MAX_YAML_BYTES`), the nesting depth (:data:`MAX_DEPTH`)
and the number of nodes once every alias is expanded (:data:`MAX_NODES`, which stops the
"billion laughs" file whose few lines of anchors expand to 10**9 values). The check walks the
parser's event stream, which is not recursive, so a 10,000-level file is refused, not a
``RecursionError``. Only plain YAML is accepted (``yaml.SafeLoader``): a ``!!python/...`` tag
is an error naming the line, never a constructed object.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from graph_autofusion.errors import GraphAutoFusionError

__all__ = ["MAX_DEPTH", "MAX_NODES", "MAX_YAML_BYTES", "load_yaml_with_nodes", "read_yaml_file"]

#: Largest rule or profile file read (the shipped profiles are ~2 KB, a calibrated host ~12 KB).
MAX_YAML_BYTES = 8 * 2**20
#: Deepest nesting of mappings and sequences (a rule file needs 3, a profile 4).
MAX_DEPTH = 64
#: Most nodes (scalars, mappings, sequences) with every alias expanded.
MAX_NODES = 200_000

_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def read_yaml_file(
    path: str | os.PathLike[str], error: type[GraphAutoFusionError], what: str
) -> str:
    """The text of ``path`` (UTF-8), at most :data:`MAX_YAML_BYTES`; any problem raises
    ``error`` naming the file (``what`` says what it is: "rule file", "hardware profile")."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if len(data) > MAX_YAML_BYTES:
        raise error(
            f"{path}: {what} is larger than {MAX_YAML_BYTES // 2**20} MiB; not read "
            f"(a {what} is a few KB of YAML)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{path}, line {line}: {what} is not UTF-8 text") from None


def _line(mark: Any) -> str:
    return f", line {mark.line + 1}" if mark is not None else ""


def _check_bounds(loader: yaml.SafeLoader, path: str, error: type[GraphAutoFusionError]) -> None:
    """Walk the event stream (without building anything) and refuse a document nested deeper
    than :data:`MAX_DEPTH` or larger than :data:`MAX_NODES` once aliases are expanded."""
    sizes = [0]  # expanded node count of each open collection (and the document)
    opened: list[str | None] = []  # their anchors
    anchors: dict[str, int] = {}
    while loader.check_event():
        ev = loader.get_event()
        if isinstance(ev, _OPEN):
            if len(opened) >= MAX_DEPTH:
                raise error(
                    f"{path}{_line(ev.start_mark)}: nested more than {MAX_DEPTH} levels deep"
                )
            sizes.append(1)
            opened.append(ev.anchor)
            continue
        if isinstance(ev, _CLOSE):
            size, anchor = sizes.pop(), opened.pop()
            if anchor is not None:
                anchors[anchor] = size
        elif isinstance(ev, yaml.ScalarEvent):
            size = 1
            if ev.anchor is not None:
                anchors[ev.anchor] = 1
        elif isinstance(ev, yaml.AliasEvent):
            if ev.anchor in opened:
                raise error(
                    f"{path}{_line(ev.start_mark)}: alias *{ev.anchor} refers to a node that "
                    f"contains it (a recursive structure)"
                )
            size = anchors.get(ev.anchor, 1)  # an unknown anchor: the composer names it
        else:
            continue
        sizes[-1] += size
        if sizes[-1] > MAX_NODES:
            raise error(
                f"{path}{_line(ev.start_mark)}: more than {MAX_NODES:,} values once its "
                f"aliases (*name) are expanded; refused (anchors that expand exponentially?)"
            )


def load_yaml_with_nodes(
    text: str, path: str, error: type[GraphAutoFusionError]
) -> tuple[Any, Any]:
    """``(root node, data)`` of one YAML document; a syntax error, a non-plain tag (such as
    ``!!python/object``), or a document over the size, depth or alias-expansion bounds raises
    ``error`` naming ``path`` and the line."""
    if len(text) > MAX_YAML_BYTES:
        raise error(f"{path}: larger than {MAX_YAML_BYTES // 2**20} MiB; not read")
    try:
        scan = yaml.SafeLoader(text)
        try:
            _check_bounds(scan, path, error)
        finally:
            scan.dispose()
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or e
        note = " (only plain YAML is read: no !!python tags)" if "python/" in str(problem) else ""
        raise error(f"{path}{_line(mark)}: not valid YAML: {problem}{note}") from None
    except RecursionError:  # pragma: no cover - the depth bound above comes first
        raise error(f"{path}: nested too deeply") from None
    return root, data
