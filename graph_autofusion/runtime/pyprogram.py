"""A fused program as straight-line Python: one generated function, no interpreter loop.

    program = generate_program(cpu_program, user_inputs=(0, 2), n_args=3)
    outputs = program(*args)        # a tuple, in graph-output order
    print(program.source)

:class:`~graph_autofusion.runtime.torch_runtime.TorchRunner` walks a list of nodes with a
dictionary of values; that costs a few microseconds per node, which is what decode spends
most of its time on. The generated function has one line per node (``v12 = f12(c12, v3,
w0)``), each implementation and constant bound as a name of the function's globals, and
``del`` of each value after its last use, so buffers are freed (and the kernels' output pool
reused) as early as liveness allows. Common operators whose ONNX semantics match one torch
call exactly (``MatMul``, elementwise arithmetic, ``Softmax`` over one axis, ...) are called
directly, without their ``OpCall`` wrapper.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from typing import Any

import torch

from graph_autofusion.ir.core import Node
from graph_autofusion.runtime.torch_ops import to_torch_dtype
from graph_autofusion.runtime.torch_runtime import impl_for

#: ONNX operators that are exactly one torch call on their inputs (no attribute to honour).
_DIRECT: dict[str, str] = {
    "Add": "torch.add",
    "Sub": "torch.sub",
    "Mul": "torch.mul",
    "MatMul": "torch.matmul",
    "Neg": "torch.neg",
    "Exp": "torch.exp",
    "Sqrt": "torch.sqrt",
    "Tanh": "torch.tanh",
    "Sigmoid": "torch.sigmoid",
    "Relu": "torch.relu",
    "Reciprocal": "torch.reciprocal",
    "Equal": "torch.eq",
    "Less": "torch.lt",
    "Greater": "torch.gt",
    "Where": "torch.where",
}


class GeneratedProgram:
    """The generated function and its source (``program.source``)."""

    def __init__(self, fn: Any, source: str, nodes: int) -> None:
        self.fn = fn
        self.source = source
        self.nodes = nodes

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _ident(name: str, used: set[str]) -> str:
    base = re.sub(r"\W", "_", name)
    if not base or base[0].isdigit() or keyword.iskeyword(base):
        base = "v_" + base
    cand, i = "v_" + base, 0
    while cand in used:
        i += 1
        cand = f"v_{base}_{i}"
    used.add(cand)
    return cand


def _direct_ok(node: Node) -> bool:
    if node.op_type not in _DIRECT or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ("Add", "Sub", "Mul"):  # integer ops of mixed widths promote in torch
        return all(
            v is not None and v.dtype is not None and v.dtype == node.outputs[0].dtype
            for v in node.inputs
        )
    return True


def generate_program(
    runner: Any, user_inputs: Sequence[int] | None = None, n_args: int | None = None
) -> GeneratedProgram:
    """Generate the straight-line function of a :class:`TorchRunner` (or ``CpuProgram``).

    The function takes ``n_args`` positional arguments; graph input ``j`` is argument
    ``user_inputs[j]`` (by default graph input ``j`` is argument ``j``); the others are
    ignored (a Dynamo graph's parameters, which the program holds as constants). A 0-d graph
    input may be passed as a Python number (a symbolic ``int`` of Dynamo's): it becomes a
    tensor of the input's dtype."""
    graph = runner.graph
    inputs = list(graph.inputs)
    user_inputs = list(user_inputs) if user_inputs is not None else list(range(len(inputs)))
    n_args = n_args if n_args is not None else (max(user_inputs) + 1 if user_inputs else 0)
    used: set[str] = set()
    names: dict[str, str] = {}
    env: dict[str, Any] = {"torch": torch}
    lines: list[str] = []
    args = [f"a{i}" for i in range(n_args)]
    used.update(args)
    for v, i in zip(inputs, user_inputs):
        names[v.name] = args[i]
        if v.shape == () and v.dtype is not None:
            # a 0-d input may arrive as a Python number (a symbolic int Dynamo passes)
            dt = _ident("dt_" + v.name, used)
            env[dt] = to_torch_dtype(v.dtype)
            lines.append(f"    {args[i]} = _tensor({args[i]}, {dt})")
    for cname, t in runner.constants.items():
        if cname in names:
            continue  # a graph input with a default value: the caller's tensor wins
        ident = _ident("c_" + cname, used)
        names[cname] = ident
        env[ident] = t
    outputs = {v.name for v in graph.outputs}
    graph_inputs = {v.name for v in inputs}
    kept = outputs | {v.name for node, _impl, _call in runner._plan for v in node.all_inputs()}
    steps = getattr(runner, "steps", {}) or {}
    env["_one"], env["_seq"], env["_tensor"] = _one, _seq, _tensor
    for k, (node, impl, call) in enumerate(runner._plan):
        operands = ", ".join(names[v.name] if v is not None else "None" for v in node.inputs)
        outs = []
        for v in node.outputs:
            ident = _ident(v.name, used)
            names[v.name] = ident
            outs.append(ident)
        if node.name not in steps and impl is impl_for(node) and _direct_ok(node):
            call_src = f"{_DIRECT[node.op_type]}({operands})"
        else:
            f_name, c_name = f"f{k}", f"o{k}"
            env[f_name], env[c_name] = impl, call
            call_src = f"{f_name}({c_name}{', ' if operands else ''}{operands})"
        if len(outs) == 1 and call_src.startswith("torch."):
            lines.append(f"    {outs[0]} = {call_src}")
        elif len(outs) == 1:  # an implementation may return a 1-tuple (Split, LSTM, aten)
            lines.append(f"    {outs[0]} = _one({call_src})")
        else:  # as TorchRunner: a lone tensor is the first output, missing ones None
            lines.append(f"    {', '.join(outs)} = _seq({call_src}, {len(outs)})")
        # the runner's own liveness: what dies after node k (the caller's arguments stay)
        dead = [names[n] for n in runner._free[k] if n not in graph_inputs]
        dead += [o for o, v in zip(outs, node.outputs) if v.name not in kept]
        if dead:
            lines.append(f"    del {', '.join(dict.fromkeys(dead))}")
    # an output computed from constants alone is the same tensor every call: a copy each time
    const_derived = set(runner.constants)
    for node, _impl, _call in runner._plan:
        ins = [v for v in node.all_inputs()]
        if ins and all(v.name in const_derived for v in ins):
            const_derived.update(v.name for v in node.outputs)
    ret = [
        f"{names[v.name]}.clone()" if v.name in const_derived else names[v.name]
        for v in graph.outputs
    ]
    lines.append(f"    return ({', '.join(ret)}{',' if len(ret) == 1 else ''})")
    header = f"def program({', '.join(args)}):"
    body = "\n".join(lines) if lines else "    pass"
    source = f"{header}\n{body}\n"
    code = compile(source, f"<graph-autofusion program {graph.name}>", "exec")
    scope = dict(env)
    exec(code, scope)  # noqa: S102 - our own generated source
    fn = scope["program"]
    no_grad = torch.no_grad()(fn)
    return GeneratedProgram(no_grad, source, len(runner._plan))


def _tensor(x: Any, dtype: torch.dtype) -> Any:
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype)


def _one(r: Any) -> Any:
    return r[0] if isinstance(r, tuple | list) and len(r) == 1 else r


def _seq(r: Any, n: int) -> tuple[Any, ...]:
    out = tuple(r) if isinstance(r, tuple | list) else (r,)
    return (out + (None,) * n)[:n]
