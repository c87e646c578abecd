"""Opaque ``aten`` nodes: ATen operators the PyTorch frontend has no canonical form for.

Such a node has domain ``"aten"``, ``op_type`` the overload name (``"aten::roll.default"``), its
tensor arguments as inputs, and the full argument structure as a JSON string attribute
``args`` (tensors as ``{"t": i}`` placeholders for input ``i``, scalar tensors read back as
Python numbers as ``{"s": i}``). The torch runtime executes it by looking the overload up in
``torch.ops`` and calling it with the rebuilt arguments.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from graph_autofusion.errors import UnsupportedOperatorError
from graph_autofusion.runtime.torch_ops import OpCall

ATEN_DOMAIN = "aten"


def encode_args(args: Any, kwargs: dict[str, Any], tensor_index: Any) -> str:
    """JSON form of ``(args, kwargs)``; ``tensor_index(obj)`` returns a placeholder or ``None``."""

    def enc(a: Any) -> Any:
        ph = tensor_index(a)
        if ph is not None:
            return ph
        if a is None or isinstance(a, bool | int | float | str):
            return a
        if isinstance(a, list | tuple):
            return {"l": [enc(x) for x in a]}
        if isinstance(a, torch.dtype):
            return {"dtype": str(a).removeprefix("torch.")}
        if isinstance(a, torch.device):
            return {"device": a.type}
        if isinstance(a, torch.layout):
            return {"layout": str(a).removeprefix("torch.")}
        if isinstance(a, torch.memory_format):
            return {"memory_format": str(a).removeprefix("torch.")}
        raise UnsupportedOperatorError(f"cannot encode ATen argument {a!r} ({type(a).__name__})")

    return json.dumps(
        {"args": [enc(a) for a in args], "kwargs": {k: enc(v) for k, v in kwargs.items()}}
    )


def decode_args(spec: str, tensors: list[torch.Tensor | None]) -> tuple[list[Any], dict[str, Any]]:
    """Rebuild ``(args, kwargs)`` from :func:`encode_args` output and the node's input tensors."""
    data = json.loads(spec)
    device = next((t.device for t in tensors if t is not None), torch.device("cpu"))

    def dec(a: Any) -> Any:
        if not isinstance(a, dict):
            return a
        if "t" in a:
            return tensors[a["t"]]
        if "s" in a:
            return tensors[a["s"]].item()
        if "l" in a:
            return [dec(x) for x in a["l"]]
        if "dtype" in a:
            return getattr(torch, a["dtype"])
        if "device" in a:
            return device
        if "layout" in a:
            return getattr(torch, a["layout"])
        if "memory_format" in a:
            return getattr(torch, a["memory_format"])
        raise UnsupportedOperatorError(f"bad ATen argument encoding {a!r}")

    return [dec(a) for a in data["args"]], {k: dec(v) for k, v in data["kwargs"].items()}


def resolve_overload(op_type: str) -> Any:
    """``"aten::foo.default"`` -> ``torch.ops.aten.foo.default``."""
    ns, _, rest = op_type.partition("::")
    name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError) as e:
        raise UnsupportedOperatorError(f"unknown ATen operator {op_type!r}") from e


def run_aten(call: OpCall, *tensors: torch.Tensor | None) -> Any:
    """Execute an opaque ATen node; returns its flattened tensor outputs."""
    fn = resolve_overload(call.node.op_type)
    args, kwargs = decode_args(call.attr("args", '{"args": [], "kwargs": {}}'), list(tensors))
    out = fn(*args, **kwargs)
    if isinstance(out, list | tuple):
        return tuple(out)
    return out
