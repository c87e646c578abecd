"""What ``target="cpu"`` runs: fused groups as generated kernels, every other operator on
torch's kernels (:class:`~graph_autofusion.runtime.torch_runtime.TorchRunner`).

    program = CpuProgram(fused_model, steps)     # steps: fused node name -> kernel step
    outputs = program.run({"input_ids": ids})    # {output name: tensor}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from graph_autofusion.ir.core import Model, Node
from graph_autofusion.runtime.torch_ops import OpCall
from graph_autofusion.runtime.torch_runtime import TorchRunner, impl_for


def _prologue_impl(node: Node) -> Any:
    """A prologue's implementation: a ``MatMul`` by a constant matrix takes the gemv / oneDNN
    path the program's own contractions take."""
    w = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) > 1 else None
    if node.domain in ("", "ai.onnx") and w is not None and w.const is not None:
        from graph_autofusion.runtime.gemv import LazyConstMatMul

        return LazyConstMatMul()
    return impl_for(node)


def kernel_step(
    fn: Any,
    input_names: Sequence[str],
    prologue: Sequence[Node],
    opset: int,
    kernel_inputs: Sequence[str] | None = None,
) -> Any:
    """The implementation of one fused node: the ``prologue`` nodes on torch's kernels (a
    contraction, run-time-shaped reshapes), then the kernel. ``input_names`` are the fused
    node's inputs in order; ``kernel_inputs`` the values this group passes as the kernel's
    inputs (by default the kernel's own input names)."""
    kin = list(kernel_inputs) if kernel_inputs is not None else [i.name for i in fn.kernel.inputs]
    pos = {n: i for i, n in enumerate(input_names)}
    if not prologue:
        index = [pos[n] for n in kin]

        def step(_call: Any, *args: Any) -> Any:
            outs = fn(*[args[i] for i in index])
            return outs[0] if len(outs) == 1 else tuple(outs)

        return step
    # slots: the fused node's arguments, then each prologue node's output
    slot = dict(pos)
    calls = []
    for node in prologue:
        ins = [slot[v.name] if v is not None else None for v in node.inputs]
        calls.append((_prologue_impl(node), OpCall(node, opset), ins))
        slot[node.outputs[0].name] = len(slot)
    index = [slot[n] for n in kin]

    def step_with_prologue(_call: Any, *args: Any) -> Any:
        env = list(args)
        for impl, call, ins in calls:
            env.append(impl(call, *[env[i] if i is not None else None for i in ins]))
        outs = fn(*[env[i] for i in index])
        return outs[0] if len(outs) == 1 else tuple(outs)

    return step_with_prologue


class CpuProgram(TorchRunner):
    """A fused model on the cpu target (kernels registered per fused node name)."""

    def __init__(self, model: Model, steps: Mapping[str, Any], *, gemv: bool = True) -> None:
        super().__init__(model, overrides=steps)
        self.steps = dict(steps)
        self.gemv: list[Any] = []
        #: ``MatMul`` nodes by a constant matrix routed through the gemv kernel (few rows).
        self.gemv_nodes = 0
        if gemv:
            from graph_autofusion.runtime.gemv import install_gemv

            self.gemv_nodes = install_gemv(self)

    def step_of(self, node_name: str) -> Any:
        return self.steps[node_name]

    @property
    def kernel_nodes(self) -> int:
        return len(self.steps)
