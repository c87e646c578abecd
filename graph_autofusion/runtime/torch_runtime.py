"""Execute the graph IR with PyTorch: :class:`TorchRunner`, :func:`to_torch_module`, shape inference.

Every canonical operator has a torch implementation in :mod:`graph_autofusion.runtime.torch_ops`
(and its ``_tensor``/``_nn`` siblings); opaque ``aten`` nodes left by the PyTorch frontend run
through ``torch.ops`` (:mod:`graph_autofusion.runtime.torch_ops_aten`). Initializers are
converted to tensors once, when the runner is built.

Example::

    runner = TorchRunner(model)
    (logits,) = runner.run({"input_ids": ids}).values()
    module = to_torch_module(model)  # forward(*graph_inputs) -> tensor or tuple
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import torch

from graph_autofusion.errors import MissingInputError, UnsupportedOperatorError
from graph_autofusion.ir.core import Graph, Model, Node, Value
from graph_autofusion.runtime.torch_ops import (
    OpCall,
    TorchImpl,
    from_torch_dtype,
    get_impl,
    to_torch_dtype,
)
from graph_autofusion.runtime.torch_ops_aten import ATEN_DOMAIN, run_aten


def const_to_tensor(value: Value) -> torch.Tensor:
    """The constant of an initializer as a tensor of the value's dtype (bf16 kept as bf16)."""
    arr = value.const
    if arr is None:
        raise ValueError(f"%{value.name} is not a constant")
    arr = np.asarray(arr)
    # a strided array (a parameter's transposed view) is taken as it is: torch reads any
    # non-negative strides, and a copy would duplicate the weight
    if not arr.flags.writeable or any(s < 0 for s in arr.strides):
        arr = np.array(arr, copy=True, order="C")  # ascontiguousarray makes a 0-d array 1-d
    t = torch.from_numpy(arr)
    if value.dtype is not None:
        dt = to_torch_dtype(value.dtype)
        if t.dtype != dt:
            t = t.to(dt)
    return t


def impl_for(node: Node) -> TorchImpl | None:
    """The torch implementation that executes ``node`` (``None`` if there is none)."""
    if node.domain == ATEN_DOMAIN:
        return run_aten
    return get_impl(node.op_type, node.domain)


class TorchRunner:
    """Runs a :class:`Model` with torch operators.

    Args:
        model: The model to execute.
        device: Device the initializers are moved to (feeds must be on the same device).

    Raises:
        UnsupportedOperatorError: some operator has no torch implementation (all are named).
    """

    def __init__(
        self,
        model: Model,
        device: str | torch.device = "cpu",
        overrides: Mapping[str, TorchImpl] | None = None,
        shared_constants: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.model = model
        self.graph: Graph = model.graph
        self.opset = int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 20)))
        overrides = dict(overrides or {})
        missing = sorted(
            {
                n.qualified_op
                for n in self.graph.nodes
                if n.name not in overrides and impl_for(n) is None
            }
        )
        if missing:
            raise UnsupportedOperatorError(
                f"no torch implementation for operators {missing}; the torch runtime cannot "
                f"execute this model"
            )
        # ``shared_constants``: tensors another runner of a model with the same initializers
        # already holds (safe mode's reference run), taken as they are instead of copied
        shared = dict(shared_constants or {})
        self.constants: dict[str, torch.Tensor] = {
            name: shared[name] if name in shared else const_to_tensor(v).to(device)
            for name, v in self.graph.initializers.items()
        }
        # A constant 2-D right operand of MatMul is a Linear weight stored transposed (as the
        # ONNX exporters store it). Keep it as a transposed view of an [N, K] tensor, the
        # layout nn.Linear hands the GEMM, so results match eager PyTorch bit for bit.
        for node in self.graph.nodes:
            if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
                w = node.inputs[1]
                if (
                    w is not None
                    and w.name in self.constants
                    and w.name not in shared
                    and self.constants[w.name].dim() == 2
                ):
                    t = self.constants[w.name]
                    if t.is_contiguous():
                        self.constants[w.name] = t.t().contiguous().t()
        self._plan = [
            (n, overrides.get(n.name) or impl_for(n), OpCall(n, self.opset))
            for n in self.graph.nodes
        ]
        outputs = {v.name for v in self.graph.outputs}
        last_use: dict[str, int] = {}
        for i, n in enumerate(self.graph.nodes):
            for v in n.all_inputs():
                last_use[v.name] = i
        self._free: list[list[str]] = [[] for _ in self._plan]
        for name, i in last_use.items():
            if name not in outputs and name not in self.constants:
                self._free[i].append(name)

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    def run(
        self,
        feeds: Mapping[str, torch.Tensor | np.ndarray],
        constants: Mapping[str, torch.Tensor] | None = None,
        *,
        keep_all: bool = False,
        keep: Collection[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Execute the graph; returns ``{output name: tensor}`` in graph-output order, or with
        ``keep_all`` every value computed (inputs and constants included), or with ``keep``
        the outputs and the values of those names (the others freed as the run goes)."""
        keep = frozenset(keep) if keep is not None and not keep_all else None
        env: dict[str, Any] = dict(constants if constants is not None else self.constants)
        for v in self.graph.inputs:
            if v.name not in feeds:
                if v.name in env:  # an input that also has an initializer (default value)
                    continue
                raise MissingInputError(
                    f"missing graph input {v.name!r}; inputs: {self.input_names}"
                )
            t = feeds[v.name]
            env[v.name] = torch.from_numpy(np.asarray(t)) if not isinstance(t, torch.Tensor) else t
        with torch.no_grad():
            for (node, impl, call), free in zip(self._plan, self._free):
                args = [env[v.name] if v is not None else None for v in node.inputs]
                try:
                    out = impl(call, *args)
                except UnsupportedOperatorError:
                    raise
                except Exception as e:
                    raise RuntimeError(
                        f"torch runtime failed at node {node.name!r} ({node.qualified_op}): {e}"
                    ) from e
                outs = out if isinstance(out, tuple | list) else (out,)
                for v, t in zip(node.outputs, outs):
                    env[v.name] = t
                if not keep_all:
                    for name in free:
                        if keep is None or name not in keep:
                            env.pop(name, None)
        if keep_all:
            return env
        outs = {v.name: env[v.name] for v in self.graph.outputs}
        if keep is not None:
            outs.update((k, env[k]) for k in keep if k in env)
        return outs

    def __call__(self, *tensors: torch.Tensor, **named: torch.Tensor) -> Any:
        """Positional inputs in graph-input order (then named ones); returns a tensor or tuple."""
        feeds = dict(zip(self.input_names, tensors))
        feeds.update(named)
        outs = list(self.run(feeds).values())
        return outs[0] if len(outs) == 1 else tuple(outs)


class IRModule(torch.nn.Module):
    """An ``nn.Module`` running a :class:`Model`; constants are buffers (so ``.to()`` works)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self._runner = TorchRunner(model)
        self._const_names = list(self._runner.constants)
        for i, name in enumerate(self._const_names):
            self.register_buffer(f"c{i}", self._runner.constants[name], persistent=True)
        self._runner.constants = {}

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> Any:
        consts = {name: getattr(self, f"c{i}") for i, name in enumerate(self._const_names)}
        feeds = dict(zip(self._runner.input_names, args))
        feeds.update(kwargs)
        outs = list(self._runner.run(feeds, consts).values())
        return outs[0] if len(outs) == 1 else tuple(outs)


def to_torch_module(model: Model) -> torch.nn.Module:
    """An ``nn.Module`` whose ``forward`` takes the graph inputs positionally (graph-input
    order) and returns the outputs (a single tensor if there is one output, else a tuple)."""
    return IRModule(model)


def _meta_input(v: Value) -> torch.Tensor | None:
    """A tensor standing for ``v`` in shape inference (real for small int/0-d constants)."""
    if v.dtype is None or not v.is_static:
        return None
    try:
        dt = to_torch_dtype(v.dtype)
    except UnsupportedOperatorError:
        return None
    small_int = v.const is not None and v.const.size <= 64 and not dt.is_floating_point
    if small_int or (v.const is not None and v.const.ndim == 0):
        return const_to_tensor(v)
    return torch.empty(v.shape, dtype=dt, device="meta")


def infer_node_types(node: Node, opset: int = 20, overwrite: bool = False) -> bool:
    """Fill the dtype/shape of ``node``'s outputs by running it on ``meta`` tensors.

    Returns:
        True if the node ran (its outputs are now typed), False if it could not be inferred.
    """
    impl = impl_for(node)
    if impl is None or node.domain == ATEN_DOMAIN:
        return False
    ins = [_meta_input(v) if v is not None else None for v in node.inputs]
    if any(t is None for t, v in zip(ins, node.inputs) if v is not None):
        return False
    out = _run_for_types(impl, node, opset, ins)
    if out is None and any(t is not None and t.is_meta for t in ins):
        # a small integer constant beside a meta tensor (an Equal with a row of bin ids):
        # the constant as meta too, for the operators that read no values from it
        ins = [t.to("meta") if t is not None and t.dim() > 0 else t for t in ins]
        out = _run_for_types(impl, node, opset, ins)
    if out is None:
        return False
    outs = out if isinstance(out, tuple | list) else (out,)
    for v, t in zip(node.outputs, outs):
        if not isinstance(t, torch.Tensor):
            continue
        if v.dtype is None or overwrite:
            v.dtype = from_torch_dtype(t.dtype)
        if v.shape is None or overwrite:
            v.shape = tuple(int(d) for d in t.shape)
    return True


def _run_for_types(impl: Any, node: Node, opset: int, ins: list[Any]) -> Any:
    """``impl``'s outputs on ``ins``, or ``None`` when it cannot run on them (best effort:
    unknown stays unknown)."""
    try:
        with torch.no_grad():
            return impl(OpCall(node, opset), *ins)
    except Exception:  # noqa: BLE001
        return None


def infer_shapes(model: Model, *, overwrite: bool = False) -> int:
    """Fill missing value dtypes/shapes by running the graph on ``meta`` tensors, in order.

    Best effort: a node whose inputs have no static shape, or whose implementation cannot run
    on meta tensors, is skipped (its outputs stay unknown unless already annotated).

    Returns:
        The number of nodes whose outputs were (re)typed.
    """
    opset = int(model.opset_imports.get("", 20))
    count = 0
    for node in model.graph.nodes:
        if overwrite or any(v.dtype is None or v.shape is None for v in node.outputs):
            count += infer_node_types(node, opset, overwrite)
    return count
