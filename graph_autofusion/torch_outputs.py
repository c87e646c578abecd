"""What a compiled graph's engines must give: eager's outputs (within a tolerance per dtype,
or the compressed weights' own), graphs that also return sizes split from their tensor work,
the writes a graph makes into its arguments, and the compile's transient memory given back to
the system.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graph_autofusion import defaults
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.options import FuseOptions
from graph_autofusion.verify.compare import compare_tensors

#: Largest relative L2 error of an output against eager's, per dtype.
REL_TOLERANCE = {
    torch.float32: 1e-3,
    torch.float64: 1e-6,
    torch.float16: 1e-2,
    torch.bfloat16: 3e-2,
}


def tolerance(options: FuseOptions) -> tuple[float, float | None]:
    """The cosine floor and relative-error cap of a program's outputs against eager's: the
    end-to-end floor, or with compressed weights (lossy by design) their own."""
    if options.weights in ("int8", "int4"):
        w = options.weights
        return defaults.WEIGHTS_E2E_COSINE[w], defaults.WEIGHTS_E2E_REL_ERR[w]
    return options.e2e_cosine_floor, None


def same_as_eager(
    got: Sequence[Any], want: Sequence[Any], floor: float, rel_cap: float | None = None
) -> None:
    """Raise unless every output matches eager's (cosine, and relative error: a scaled
    answer has cosine 1; ``rel_cap``: that error's cap instead of the dtype's)."""
    if len(got) != len(want):
        raise GraphAutoFusionError(f"the program returns {len(got)} outputs, eager {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            raise GraphAutoFusionError(
                f"output {i}: {tuple(g.shape)} {g.dtype} where eager gives {tuple(w.shape)} "
                f"{w.dtype}"
            )
        if g.numel() == 0:
            continue
        if not w.dtype.is_floating_point:
            if not torch.equal(g, w):
                raise GraphAutoFusionError(f"output {i} differs from eager's")
            continue
        cmp = compare_tensors(g.detach().float().numpy(), w.detach().float().numpy())
        scale = float(w.detach().float().norm())
        rel = float((g.detach().float() - w.detach().float()).norm()) / max(scale, 1e-30)
        if cmp["cosine"] < floor or rel > (
            rel_cap if rel_cap is not None else REL_TOLERANCE[w.dtype]
        ):
            raise GraphAutoFusionError(
                f"output {i} differs from eager's (cosine {cmp['cosine']:.6f}, relative "
                f"error {rel:.2e})"
            )


def give_back_memory(collect: bool = True) -> None:
    """Return the compile's freed transient memory (sessions, serialized models) to the
    system: glibc keeps freed heap pages otherwise, and the process's resident size stays at
    the compile's peak. ``collect``: run a full garbage collection first (~0.6 s in a process
    with torch and transformers loaded; skip it when one just ran)."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def tensor_outputs(gm: torch.fx.GraphModule) -> list[bool]:
    """For each output of ``gm``, whether it is a tensor (else a size, a number or None)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = out.args[0]
    if not isinstance(outs, tuple | list):
        outs = (outs,)
    kinds = []
    for a in outs:
        if isinstance(a, torch.fx.Node) and "example_value" not in a.meta:
            kinds.append(True)  # not known (a graph not from Dynamo): taken as a tensor
            continue
        val = a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a
        kinds.append(isinstance(val, torch.Tensor))
    return kinds


class SizeOutputs:
    """A graph that returns sizes (``SymInt``), plain numbers or ``None`` besides tensors
    (Gemma2's decode graphs): the engines run ``core``, the graph with only its tensor outputs,
    and ``sizes``, the graph with only the others (size arithmetic on the inputs, no tensor
    work), runs in Python on each call; :meth:`merge` puts the outputs back in order."""

    def __init__(self, core: torch.fx.GraphModule, sizes: torch.fx.GraphModule, kinds: list[bool]):
        self.core, self.sizes, self.kinds = core, sizes, kinds

    @staticmethod
    def of(gm: torch.fx.GraphModule) -> SizeOutputs | None:
        """The split of ``gm``, or ``None`` when it returns only tensors."""
        import copy

        kinds = tensor_outputs(gm)
        if all(kinds):
            return None
        if not any(kinds):
            raise GraphAutoFusionError("the graph returns no tensor, only sizes")

        def keep(which: bool) -> torch.fx.GraphModule:
            g = copy.deepcopy(gm.graph)
            o = next(n for n in reversed(g.nodes) if n.op == "output")
            picked = tuple(a for a, k in zip(o.args[0], kinds) if k == which)
            o.args = (picked,)
            g.eliminate_dead_code()
            return torch.fx.GraphModule(gm, g)

        return SizeOutputs(keep(True), keep(False), kinds)

    def merge(self, tensors: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        others = iter(self.sizes(*args))
        it = iter(tensors)
        return tuple(next(it) if k else next(others) for k in self.kinds)


class Writes:
    """A graph that writes into its arguments (a static KV cache's ``index_copy_``, its
    length's ``add_``; :attr:`FxImport.mutated <graph_autofusion.frontend.torch_frontend.
    FxImport.mutated>`). Its engines are functional: they return the written values after the
    graph's own outputs, and :meth:`apply` copies them into the arguments, as eager's in-place
    writes do, and returns the graph's outputs (an output that is a written argument itself is
    that argument, as in eager). The compile runs eager on :meth:`scratch` copies, so the
    user's tensors are written once per call, by the program that serves it."""

    def __init__(self, mutated: Sequence[int], aliases: Sequence[tuple[int, int]], n_out: int):
        self.mutated = tuple(mutated)
        self.aliases = tuple(aliases)
        self.n_out = n_out  # the graph's own outputs (the written values follow)

    @staticmethod
    def of(imported: Any, n_out: int) -> Writes | None:
        """The writes of an imported graph (``FxImport``) returning ``n_out`` outputs of its
        own, or None when it writes into no argument."""
        return Writes(imported.mutated, imported.aliases, n_out) if imported.mutated else None

    def scratch(self, args: Sequence[Any]) -> list[Any]:
        """``args`` with a copy of each argument the graph writes into."""
        out = list(args)
        for i in self.mutated:
            out[i] = args[i].clone()
        return out

    def written(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """The written arguments of ``args`` (after eager ran on them: the expected values)."""
        return tuple(args[i] for i in self.mutated)

    def apply(self, args: Sequence[Any], outs: Sequence[Any]) -> tuple[Any, ...]:
        """Copy a functional program's written values into ``args``; its own outputs."""
        n = self.n_out
        for k, i in enumerate(self.mutated):
            t = outs[n + k]
            if t is not args[i]:
                args[i].copy_(t)
        res = list(outs[:n])
        for j, i in self.aliases:
            res[j] = args[i]
        return tuple(res)

    def wrap(self, program: Any) -> Any:
        """``program`` (functional) writing into its arguments as the graph does."""
        return lambda *a: self.apply(a, program(*a))

    def on_scratch(self, fn: Any) -> Any:
        """``fn`` (eager, which writes) run on :meth:`scratch` copies: the arguments stay."""
        return lambda *a: fn(*self.scratch(a))


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors among a module's outputs, in order: a model output object's fields
    (``to_tuple()``), a tensor, or the tensors of a tuple or list (others are left out)."""
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []
