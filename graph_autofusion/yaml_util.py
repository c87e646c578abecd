"""YAML read with its node tree, so errors can name the line of a key (rule and profile files)."""

from __future__ import annotations

from typing import Any

import yaml


def load_yaml_with_nodes(text: str, path: str, error: type[Exception]) -> tuple[Any, Any]:
    """``(root node, data)`` of one YAML document; a syntax error raises ``error`` naming
    ``path`` and the line."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark else ""
        raise error(f"{path}{line}: not valid YAML: {getattr(e, 'problem', e)}") from None
    finally:
        loader.dispose()
    return root, data
