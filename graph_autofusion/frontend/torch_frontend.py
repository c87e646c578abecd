"""PyTorch frontend: ``nn.Module`` / Dynamo ``GraphModule`` -> graph IR in the canonical vocabulary.

Route: ``torch.export.export(module, args, kwargs, strict=False)``, then
``run_decompositions(table)`` with the default core-ATen table *minus* the operators converted
at a higher level (:data:`KEEP_OPS`: linear, matmul, layer_norm, gelu, silu, softmax, sdpa, batch norm,
convolutions, pooling, embedding, LSTM), then one converter per ATen operator
(:mod:`graph_autofusion.frontend.aten_ops` has the mapping table). Shapes are static (those
of the example inputs) unless ``dynamic_shapes`` is given; then symbolic dims appear as ``str``.

Lifted parameters, buffers and constants become initializers named after their state-dict
FQN; user inputs become graph inputs with the dtype/shape of the example values. Each node
records ``meta["aten"]`` (the ATen target), ``meta["source"]`` (module path), ``meta[
"module_type"]`` and ``meta["stack_trace"]``. An ATen operator without a converter becomes an
opaque node (domain ``"aten"``) that :class:`~graph_autofusion.runtime.torch_runtime.TorchRunner`
executes through ``torch.ops``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import operator
import re
import sys
import threading
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from graph_autofusion.errors import FrontendError
from graph_autofusion.frontend.aten_ops import get_converter
from graph_autofusion.frontend.fx_scalars import inline_scalars, item_scalars
from graph_autofusion.frontend.torch_convert import (
    ConvertContext,
    dtype_of_torch,
    fold_call,
    is_foldable,
    shape_of_val,
)
from graph_autofusion.ir.core import Graph, Model, Value
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.report import progress
from graph_autofusion.runtime.torch_runtime import infer_shapes

aten = torch.ops.aten

#: torch.export's own warning, from its deep copy of the module call graph (every import of a
#: Dynamo graph runs it), reported from ``copyreg``: a pytree deprecation inside torch
TORCH_EXPORT_NOISE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def hide_torch_export_noise() -> None:
    """Hide :data:`TORCH_EXPORT_NOISE` (nothing a user of ours can act on, once per compile):
    only that message, reported from ``copyreg``; called once at import."""
    warnings.filterwarnings(
        "ignore", message=TORCH_EXPORT_NOISE, category=FutureWarning, module="copyreg"
    )


hide_torch_export_noise()

#: ATen operators kept (not decomposed) because a converter maps them onto one canonical op.
KEEP_OPS = (
    aten.linear.default,
    aten.matmul.default,
    aten.layer_norm.default,
    aten.native_layer_norm.default,
    aten.group_norm.default,
    aten.native_group_norm.default,
    aten.gelu.default,
    aten.silu.default,
    aten.softmax.int,
    aten._softmax.default,
    aten.log_softmax.int,
    aten._log_softmax.default,
    aten.scaled_dot_product_attention.default,
    aten.batch_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
    aten.conv1d.padding,
    aten.conv2d.padding,
    aten.conv3d.padding,
    aten.convolution.default,
    aten.embedding.default,
    aten.max_pool2d.default,
    aten.max_pool2d_with_indices.default,
    aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
    aten.lstm.input,
    aten.hardswish.default,
    aten.hardsigmoid.default,
)

_PY_OPS = {
    operator.add: "Add",
    operator.sub: "Sub",
    operator.mul: "Mul",
    operator.floordiv: "Div",  # floored in _convert_node: ONNX's integer Div truncates
    operator.truediv: "Div",
    operator.mod: "Mod",
    operator.neg: "Neg",  # Mamba's negative cache offsets
    torch.sym_max: "Max",  # sliding-window caches: max(cache length, window)
    torch.sym_min: "Min",
}


def decomposition_table() -> dict[Any, Any]:
    """The default core-ATen decomposition table minus :data:`KEEP_OPS`."""
    table = torch.export.default_decompositions()
    for op in KEEP_OPS:
        if op in table:
            del table[op]
    return table


def safe_name(name: str) -> str:
    """A value name the IR text form accepts (``[\\w.\\-/:]``)."""
    return re.sub(r"[^\w.\-/:]", "_", name) or "v"


def from_torch(
    module: torch.nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
) -> Model:
    """Convert a PyTorch module into a :class:`Model` (exported in eval mode).

    Args:
        module: The module; it is exported in eval mode (its mode is restored afterwards).
        args: Example positional inputs.
        kwargs: Example keyword inputs (e.g. ``input_ids=..., attention_mask=...``).
        dynamic_shapes: Passed to ``torch.export.export``; ``None`` = static shapes.

    Raises:
        FrontendError: ``torch.export`` failed (the message carries torch's reason).
    """
    was_training = module.training
    module.eval()

    try:
        with progress.task(f"torch.export {type(module).__name__}"):
            ep = torch.export.export(
                module, tuple(args), dict(kwargs or {}), dynamic_shapes=dynamic_shapes, strict=False
            )
            ep = ep.run_decompositions(decomposition_table())
    except Exception as e:  # torch raises many types; wrap them in our hierarchy
        raise FrontendError(f"torch.export failed for {type(module).__name__}: {e}") from e
    finally:
        module.train(was_training)
    return convert_exported_program(ep, name=type(module).__name__)


class _FxWrapper(torch.nn.Module):
    """Holds a Dynamo graph's lifted parameters/buffers so ``torch.export`` sees them as state.

    A symbolic-size input of the Dynamo graph (a ``SymInt`` placeholder) is not an input of the
    wrapper when a user tensor carries the same symbol: it is read from that tensor's size
    (``sizes[i] = (user tensor index, axis)``), so the export sees it as ``sym_size``. One no
    tensor carries is a user input (an ``int``) of its own; another placeholder of the same
    symbol reads it (``sizes[i] = (user input index, None)``). One Dynamo specialized to a
    number while tracing is that number (``fixed[i]``).
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        consts: dict[int, tuple[str, torch.Tensor]],
        n_inputs: int,
        sizes: dict[int, tuple[int, int | None]] | None = None,
        fixed: dict[int, int | float] | None = None,
    ) -> None:
        super().__init__()
        self.gm = gm
        self._slots: list[str | None] = [None] * n_inputs
        for i, (_name, t) in consts.items():
            key = f"c{i}"
            self.register_buffer(key, t.detach())
            self._slots[i] = key
        self.fqns = {f"c{i}": name for i, (name, _) in consts.items()}
        self._sizes = dict(sizes or {})
        self._fixed = dict(fixed or {})

    def forward(self, *user: Any) -> Any:
        it = iter(user)
        full: list[Any] = []
        for i, s in enumerate(self._slots):
            if s is not None:
                full.append(getattr(self, s))
            elif i in self._fixed:
                full.append(self._fixed[i])
            elif i in self._sizes:
                k, axis = self._sizes[i]
                full.append(user[k] if axis is None else user[k].shape[axis])
            else:
                full.append(next(it))
        return self.gm(*full)


def _concrete_int(x: Any, name: str) -> int:
    """The value of a symbolic-size argument: the call's ``int`` (or a ``SymInt``'s hint)."""
    if isinstance(x, torch.SymInt):
        hint = getattr(x.node, "hint", None)
        if hint is None:
            raise FrontendError(f"symbolic input {name} ({x}) has no value to export with")
        return int(hint)
    if not isinstance(x, int):
        raise FrontendError(f"symbolic input {name} is a {type(x).__name__}, not an int")
    return x


def _state_name(placeholder: str) -> str:
    name = re.sub(r"^L_self_|^L_", "", placeholder).rstrip("_")
    name = re.sub(r"_modules_|modules_|_parameters_|_buffers_", ".", name)
    return name.strip(".")


def _specialized(x: Any) -> int | None:
    """The value of a ``SymInt`` placeholder Dynamo specialized while tracing (its expression
    is a number, guarded on the frame: a sliding-window cache's ``cumulative_length``), else
    ``None``."""
    if isinstance(x, torch.SymInt) and getattr(x.node.expr, "is_Integer", False):
        return int(x.node.expr)
    return None


def _dynamic_hint(x: Any) -> Any:
    """``Dim.DYNAMIC`` for the export of a symbolic size, bounded by the range Dynamo's guards
    give it on this graph (a sliding-window cache at least as long as the window): the export
    of a graph that only holds in that range would otherwise fail its constraints."""
    hint = torch.export.Dim.DYNAMIC
    if not isinstance(x, torch.SymInt):
        return hint
    vr = x.node.shape_env.var_to_range.get(x.node.expr)
    if vr is None:
        return hint
    lo, hi = _finite(vr.lower), _finite(vr.upper)
    lo = lo if lo is not None and lo > 2 else None
    hi = hi if hi is not None and hi >= max(lo or 0, 2) else None
    return hint if lo is None and hi is None else hint(min=lo, max=hi)


def _finite(bound: Any) -> int | None:
    """A value range's bound as an int, or None when it is infinite."""
    return int(bound) if getattr(bound, "is_Integer", False) else None


def _derived(x: Any) -> bool:
    """Whether a size is an expression of other symbolic sizes (``s27 + 1``: a mask made
    before a graph break, one longer than the cache it is read with): the export keeps it
    dynamic, and finds its relation to the others itself."""
    if not isinstance(x, torch.SymInt) or getattr(x.node.expr, "is_Symbol", False):
        return False
    return bool(getattr(x.node.expr, "free_symbols", None))


def _without_derived(hint: Any, example: Any) -> Any:
    """An argument's export hint without its derived axes (:func:`_derived`)."""
    if not isinstance(hint, dict) or not isinstance(example, torch.Tensor):
        return hint
    axes = {a: h for a, h in hint.items() if not _derived(example.shape[a])}
    return axes or None


def _symbol(x: Any) -> str | None:
    """The free symbol of a plain symbolic size (``s87``), else ``None``."""
    if isinstance(x, torch.SymInt):
        expr = x.node.expr
        if getattr(expr, "is_Symbol", False):
            return str(expr)
    return None


def from_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Model:
    """Convert a Dynamo backend's ``GraphModule`` (torch-level ops) into a :class:`Model`
    (:func:`import_fx` without the input map)."""
    return import_fx(gm, example_inputs).model


@dataclass(frozen=True)
class FxImport:
    """A Dynamo graph as a :class:`Model`: ``model.graph.inputs[j]`` is the graph's argument
    ``user_inputs[j]``; the other arguments are constants or sizes read from tensors. A
    symbolic ``int`` argument no tensor carries is a 0-d int64 graph input: the caller feeds
    the Python ``int`` (the generated program and the torch runner make it a tensor)."""

    model: Model
    user_inputs: tuple[int, ...]
    #: Arguments taken as constants (parameters, buffers): a caller passing other tensors
    #: there needs another import.
    constant_inputs: tuple[int, ...] = ()
    #: Arguments the graph writes into (a static KV cache's ``index_copy_``, a length's
    #: ``add_``), in the order of the model's extra outputs that follow the graph's own: the
    #: model is functional, and its caller copies output ``len(outputs) - len(mutated) + k``
    #: into argument ``mutated[k]``.
    mutated: tuple[int, ...] = ()
    #: (graph output, argument): outputs that are a written argument itself (``x.add_(1)``
    #: returned), which the caller returns as that argument, as eager does.
    aliases: tuple[tuple[int, int], ...] = ()
    #: (argument, value): 0-d float arguments read with ``item()`` that the import took as
    #: these numbers (:mod:`~graph_autofusion.frontend.fx_scalars`): a caller passing another
    #: value there needs another import.
    scalars: tuple[tuple[int, float], ...] = ()
    #: (argument, axis or None for an int argument, value): sizes Dynamo left symbolic that
    #: the graph only holds at, fixed in the model to this call's value: a caller passing
    #: another size there needs another import.
    sizes: tuple[tuple[int, int | None, int], ...] = ()


def import_fx(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], live: Collection[int] = ()
) -> FxImport:
    """See :func:`_import_fx`; a graph whose export fails on a float Dynamo made symbolic
    (read with ``item()``) is imported again with that float taken as this call's value
    (``FxImport.scalars``). ``live``: the indices of buffers read as inputs, not constants
    (a module that assigns a new tensor to a buffer between calls)."""
    scalars = item_scalars(gm, example_inputs)
    dropped = io.StringIO()
    try:
        with _quiet_failed_trace(dropped if scalars else None):
            return _import_fx(gm, example_inputs, {}, live)
    except FrontendError as exc:
        if not scalars or "data-dependent" not in str(exc):
            sys.stderr.write(dropped.getvalue())  # not the failure expected: shown as before
            raise
    imported = _import_fx(inline_scalars(gm, scalars), example_inputs, scalars, live)
    return dataclasses.replace(imported, scalars=tuple(sorted(scalars.items())))


@contextlib.contextmanager
def _quiet_failed_trace(into: io.StringIO | None) -> Any:
    """With a buffer, what ``torch.export`` writes of a trace that fails on a data-dependent
    guard goes ``into`` it: the partial graph it prints to ``sys.stderr`` (``partial_fx_graph``,
    hundreds of lines for a transformer), and the symbolic-shapes warning about the unbacked
    float is dropped, for the attempt :func:`import_fx` expects may fail that way and retries.
    One swap at a time (:data:`_STDERR_SWAP`: two graphs compiling on two threads would
    otherwise restore each other's buffer); another thread's Python writes to ``sys.stderr``
    meanwhile go into the buffer too."""
    if into is None:
        yield
        return
    log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    quiet = _NoUserCodeWarning()
    with _STDERR_SWAP:
        log.addFilter(quiet)
        try:
            with contextlib.redirect_stderr(into):
                yield
        finally:
            log.removeFilter(quiet)


#: Held while ``sys.stderr`` is swapped (:func:`_quiet_failed_trace`)
_STDERR_SWAP = threading.Lock()


class _NoUserCodeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to find user code")


def _import_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    scalars: dict[int, float],
    live: Collection[int] = (),
) -> FxImport:
    """Convert a Dynamo backend's ``GraphModule`` (torch-level ops) into a :class:`Model`.

    The graph is re-exported with ``torch.export`` (non-strict) and converted like a module.
    Inputs that are parameters or buffers of the compiled module (Dynamo passes them as
    graph inputs) become initializers; the remaining tensors become graph inputs. A graph
    that writes into a parameter or buffer is refused (the export's signature lists the
    writes); one that writes into other inputs (a static KV cache) is imported functional,
    the written values as extra outputs after the graph's own (``FxImport.mutated``). Sizes
    Dynamo made symbolic stay symbolic (``str`` dims, the symbol's name): a ``SymInt`` input
    is read from the tensor that carries its symbol, or, when no tensor carries it, is a 0-d
    int64 graph input of its own (exported as a dynamic ``int``).

    Call it outside Dynamo's compilation (on the compiled graph's first call, with the real
    inputs): an export inside it adds guards to the frame being compiled.

    Raises:
        FrontendError: the export failed (a symbolic size it would specialize among others).
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    consts: dict[int, tuple[str, torch.Tensor]] = {}
    sym_inputs: dict[int, str] = {}
    fixed: dict[int, int | float] = {}
    user_index: list[int] = []
    for i, (ph, x) in enumerate(zip(placeholders, example_inputs)):
        is_state = (
            isinstance(x, torch.nn.Parameter)
            or re.search(r"_parameters_|_buffers_", ph.name) is not None
        )
        ev = ph.meta.get("example_value", x)
        if i in scalars:  # read as this number in the graph: the input itself is unused
            fixed[i] = scalars[i]
        elif isinstance(ev, torch.SymInt) or isinstance(x, torch.SymInt):
            sym = _symbol(ev if isinstance(ev, torch.SymInt) else x)
            if sym is not None:
                sym_inputs[i] = sym
            elif (value := _specialized(ev)) is not None:
                fixed[i] = value  # Dynamo fixed it to this value (and guards it): a constant
            else:
                raise FrontendError(f"symbolic input {ph.name} ({ev}) is not a plain size")
        elif is_state and isinstance(x, torch.Tensor) and i not in live:
            consts[i] = (_state_name(ph.name), x)
        else:
            user_index.append(i)
    # where each symbol lives: (placeholder index, axis), a tensor's axis first; a symbolic
    # int no tensor carries (a Python int Dynamo made dynamic on a recompile: a cache offset,
    # a length passed apart) is an input of its own (axis None), a 0-d int64 in the IR
    carriers: dict[str, tuple[int, int | None]] = {}
    for i in user_index:
        ev = placeholders[i].meta.get("example_value")
        if isinstance(ev, torch.Tensor):
            for axis, d in enumerate(ev.shape):
                sym = _symbol(d)
                if sym is not None:
                    carriers.setdefault(sym, (i, axis))
    for i, sym in sym_inputs.items():
        if sym not in carriers:
            carriers[sym] = (i, None)
            user_index.append(i)
    user_index.sort()
    position = {i: k for k, i in enumerate(user_index)}  # placeholder -> wrapper input
    user: list[Any] = []
    dynamic: list[Any] = []
    for i in user_index:
        x, ev = example_inputs[i], placeholders[i].meta.get("example_value")
        if i in sym_inputs:
            user.append(_concrete_int(x, placeholders[i].name))
            # DYNAMIC, not AUTO: an export that specializes the size fails, and the retry
            # below records each size it fixes (FxImport.sizes), never silently
            dynamic.append(_dynamic_hint(placeholders[i].meta.get("example_value", x)))
            continue
        user.append(x)
        axes = {}
        if isinstance(ev, torch.Tensor):
            for axis, d in enumerate(ev.shape):
                if _symbol(d) is not None or _derived(d):
                    axes[axis] = _dynamic_hint(d)
        dynamic.append(axes or None)
    sizes = {
        i: (position[carriers[sym][0]], carriers[sym][1])
        for i, sym in sym_inputs.items()
        if i not in position
    }
    evs = [placeholders[i].meta.get("example_value") for i in user_index]
    wrapper = _FxWrapper(gm, consts, len(placeholders), sizes, fixed)
    real = [x.detach() if isinstance(x, torch.Tensor) else x for x in user]
    pinned: tuple[tuple[int, int | None, int], ...] = ()
    try:
        try:
            ep = _export(wrapper, real, dynamic)
        except Exception:
            if dynamic == (plain := [_without_derived(d, ev) for d, ev in zip(dynamic, evs)]):
                raise
            dynamic = plain  # an expression the export cannot relate: a number, as before
            ep = _export(wrapper, real, dynamic)
    except Exception as e:
        if "specialized it to be a constant" not in str(e):
            raise FrontendError(f"torch.export of the FX graph failed: {e}") from e
        # the graph holds at one value of a size Dynamo left symbolic (a sliding-window
        # cache, full, keeps its length): exported at this call's value; the caller compiles
        # again for another (FxImport.sizes)
        auto = [_auto(d) for d in dynamic]
        try:
            ep = _export(wrapper, real, auto)
        except Exception as e2:
            raise FrontendError(f"torch.export of the FX graph failed: {e2}") from e2
        pinned = _pinned_sizes(ep, user_index, dynamic)
    _refuse_mutations(ep)
    model = _convert_undecomposed(ep, wrapper.fqns)
    if model is None:
        try:
            ep = ep.run_decompositions(decomposition_table())
        except Exception as e:
            raise FrontendError(f"torch.export of the FX graph failed: {e}") from e
        _refuse_mutations(ep)  # functionalized: in-place writes now show in the signature
        model = convert_exported_program(ep, name="fx_graph", fqn_map=wrapper.fqns, mutations=True)
    if len(model.graph.inputs) != len(user):
        raise FrontendError(
            f"the FX graph has {len(user)} inputs but its export {len(model.graph.inputs)}"
        )
    mutated, aliases = _written_inputs(ep, user_index)
    return FxImport(model, tuple(user_index), tuple(sorted(consts)), mutated, aliases, sizes=pinned)


def _export(wrapper: Any, args: Sequence[Any], dynamic: Sequence[Any]) -> Any:
    return torch.export.export(
        wrapper,
        tuple(args),
        dynamic_shapes={"user": tuple(dynamic)} if any(d is not None for d in dynamic) else None,
        strict=False,
    )


def _fixed(size: Any) -> bool:
    """Whether an exported size is a number (a plain int, or a symbolic one the export
    specialized)."""
    return not isinstance(size, torch.SymInt) or bool(size.node.expr.is_number)


def _auto(hint: Any) -> Any:
    """An export hint that lets the export fix a size (``Dim.AUTO``) in place of
    ``Dim.DYNAMIC`` (per axis of a tensor's, or an int's)."""
    if hint is None:
        return None
    if isinstance(hint, dict):
        return {axis: _auto(h) for axis, h in hint.items()}
    return torch.export.Dim.AUTO(min=hint.min, max=hint.max)


def _pinned_sizes(
    ep: torch.export.ExportedProgram, user_index: Sequence[int], dynamic: Sequence[Any]
) -> tuple[tuple[int, int | None, int], ...]:
    """(argument, axis or None for an int argument, value): the sizes Dynamo left symbolic
    that the export fixed to this call's value."""
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    specs = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    pinned = []
    for k, (spec, hint) in enumerate(zip(specs, dynamic)):
        if hint is None:
            continue
        if not isinstance(hint, dict):  # an int argument: fixed, it is a constant
            value = getattr(spec.arg, "value", None)
            node = nodes.get(getattr(spec.arg, "name", ""))
            val = node.meta.get("val") if node is not None else value
            if isinstance(val, int | torch.SymInt) and _fixed(val):
                pinned.append((user_index[k], None, int(val)))
            continue
        node = nodes.get(getattr(spec.arg, "name", ""))
        val = node.meta.get("val") if node is not None else None
        if isinstance(val, torch.Tensor):
            pinned += [
                (user_index[k], axis, int(val.shape[axis]))
                for axis in hint
                if _fixed(val.shape[axis])
            ]
    return tuple(pinned)


def _written_inputs(
    ep: torch.export.ExportedProgram, user_index: Sequence[int]
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """The graph arguments the export writes into, in its mutation outputs' order, and the
    user outputs that are such a written value (see :class:`FxImport`)."""
    specs = ep.graph_signature.input_specs
    arg_of = {
        s.arg.name: user_index[k]
        for k, s in enumerate(x for x in specs if x.kind == InputKind.USER_INPUT)
    }
    outs = ep.graph_signature.output_specs
    writes = [s for s in outs if s.kind == OutputKind.USER_INPUT_MUTATION]
    mutated = tuple(arg_of[s.target] for s in writes)
    written = {s.arg.name: arg_of[s.target] for s in writes}
    users = [s for s in outs if s.kind == OutputKind.USER_OUTPUT]
    aliases = tuple(
        (j, written[s.arg.name])
        for j, s in enumerate(users)
        if getattr(s.arg, "name", None) in written
    )
    return mutated, aliases


def _refuse_mutations(ep: torch.export.ExportedProgram) -> None:
    """Refuse a graph that writes into a parameter or buffer (the program reads them as
    constants); writes into other inputs become outputs (:func:`_written_inputs`)."""
    mutated = list(ep.graph_signature.buffers_to_mutate.values())
    if mutated:
        raise FrontendError(
            f"the graph writes into its parameters or buffers ({', '.join(map(str, mutated[:4]))})"
        )


def _convert_undecomposed(ep: torch.export.ExportedProgram, fqns: dict[str, str]) -> Model | None:
    """The export converted as it is, before ``run_decompositions`` (which re-traces the whole
    graph: about a second on a 4-layer Llama), when that is as good: every operator functional
    and every one converted (no opaque ``aten`` node). ``None``: decompose first."""
    from graph_autofusion.runtime.torch_ops_aten import ATEN_DOMAIN

    for n in ep.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and schema is not None and schema.is_mutable:
            return None
    try:
        model = convert_exported_program(ep, name="fx_graph", fqn_map=fqns, mutations=True)
    except Exception:  # noqa: BLE001 - the decomposed form is the reference path
        return None
    if any(n.domain == ATEN_DOMAIN for n in model.graph.nodes):
        return None
    return model


def _output_names(ep: torch.export.ExportedProgram, n: int) -> list[str]:
    try:
        spec = ep.call_spec.out_spec
        tree = pytree.tree_unflatten(list(range(n)), spec)
        leaves = pytree.tree_flatten_with_path(tree)[0]
        if len(leaves) != n:
            raise ValueError
    except Exception:  # noqa: BLE001 - naming is cosmetic
        return ["output"] if n == 1 else [f"output_{i}" for i in range(n)]
    names = []
    for path, _ in leaves:
        keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", "")))) for k in path]
        keys = [k for k in keys if k != ""]
        names.append(safe_name("_".join(keys)) if keys and not keys[0].isdigit() else "")
    if n == 1 and not names[0]:
        return ["output"]
    return [nm or f"output_{i}" for i, nm in enumerate(names)]


def convert_exported_program(
    ep: torch.export.ExportedProgram,
    name: str = "main",
    fqn_map: dict[str, str] | None = None,
    mutations: bool = False,
) -> Model:
    """Convert an (already decomposed) ``ExportedProgram`` into a :class:`Model`
    (``mutations``: the values written into user inputs are outputs too, after the
    program's own, named ``written_<input>``)."""
    graph = Graph(safe_name(name))
    cx = ConvertContext(graph)
    fqn_map = fqn_map or {}
    for spec in ep.graph_signature.input_specs:
        arg_name = spec.arg.name
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants[spec.target]
            t = t.detach()
            cx.env[arg_name] = t
            cx.name_constant(t, safe_name(fqn_map.get(spec.target, spec.target)))
        elif spec.kind == InputKind.USER_INPUT:
            if isinstance(spec.arg, torch.export.graph_signature.SymIntArgument):
                # a symbolic int of its own: a 0-d int64 graph input (fed the Python int)
                v = Value(safe_name(arg_name), DType.INT64, ())
                cx.env[arg_name] = graph.add_input(v)
                continue
            if not isinstance(spec.arg, torch.export.graph_signature.TensorArgument):
                cx.env[arg_name] = getattr(spec.arg, "value", None)
                continue
            val = _placeholder_val(ep, arg_name)
            v = Value(safe_name(arg_name), dtype_of_torch(val.dtype), shape_of_val(val))
            cx.env[arg_name] = graph.add_input(v)
        else:
            raise FrontendError(f"unsupported exported input kind {spec.kind} ({arg_name})")

    for node in ep.graph.nodes:
        if node.op == "call_function":
            cx.env[node.name] = _convert_node(cx, node)
    outputs = [s for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    names = _output_names(ep, len(outputs))
    if mutations:
        written = [
            s for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION
        ]
        outputs += written
        names += [safe_name(f"written_{s.target}") for s in written]
    outs: list[Value] = []
    for spec, out_name in zip(outputs, names):
        arg = spec.arg
        if isinstance(arg, torch.export.graph_signature.ConstantArgument):
            res = arg.value  # a number the export computed (its name is empty)
        else:
            res = cx.env[arg.name] if hasattr(arg, "name") else arg.value
        v = cx.v(res)
        if v.producer is None or any(v is o for o in outs):
            v = graph.make_node("Identity", [v]).outputs[0]
        _rename(graph, v, out_name)
        outs.append(v)
    graph.set_outputs(outs)
    graph.remove_unused()
    model = Model(graph, {"": 20})
    model.producer_name = "graph-autofusion.torch"
    infer_shapes(model)
    return model


def _placeholder_val(ep: torch.export.ExportedProgram, name: str) -> Any:
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name == name:
            return n.meta["val"]
    raise FrontendError(f"placeholder {name!r} not found")


def _rename(graph: Graph, v: Value, new: str) -> None:
    if new and not graph.has_value_name(new):
        graph.rename_value(v, new)


def _sym_number(cx: ConvertContext, node: torch.fx.Node, value: Value) -> Value:
    """``value`` (double) as the node's Python type: an int64 when the result is an int."""
    val = node.meta.get("val")
    return value if isinstance(val, torch.SymFloat | float) else cx.v(value, DType.INT64)


def _sym_rounding(how: str) -> Callable[..., Value]:
    """``math.floor``/``math.ceil``/``round``/``int()`` of a size: the ONNX rounding in double
    (``Round`` rounds half to even, as Python's ``round``; ``int()`` truncates toward zero),
    then the result's type (an int)."""

    def convert(cx: ConvertContext, node: torch.fx.Node, x: Any, *rest: Any) -> Value:
        if any(r is not None for r in rest):  # round(x, ndigits)
            raise FrontendError(f"cannot convert {node.name!r}: {how} with {len(rest)} more args")
        v = cx.v(x, DType.DOUBLE)
        if how == "Trunc":
            v = cx.op("Mul", [cx.op("Sign", [v]), cx.op("Floor", [cx.op("Abs", [v])])])
        else:
            v = cx.op(how, [v])
        return _sym_number(cx, node, v)

    return convert


def _sym_pow(cx: ConvertContext, node: torch.fx.Node, base: Any, exp: Any) -> Value:
    """``a ** b`` of sizes: in double (an int result is exact below 2**53), then the result's
    type."""
    return _sym_number(cx, node, cx.op("Pow", [cx.v(base, DType.DOUBLE), cx.v(exp, DType.DOUBLE)]))


def _sym_compare(op_type: str, negate: bool = False) -> Callable[..., Value]:
    """A comparison of sizes (``s0 >= 2``: what torch.export's run-time size checks and a
    model's own branches on lengths compute): the ONNX comparison, in double when either
    side is a float, else in int64."""

    def convert(cx: ConvertContext, node: torch.fx.Node, a: Any, b: Any) -> Value:
        floats = any(cx.dtype(x) in (DType.FLOAT, DType.DOUBLE) for x in (a, b))
        dt = DType.DOUBLE if floats else DType.INT64
        out = cx.op(op_type, [cx.v(a, dt), cx.v(b, dt)])
        return cx.op("Not", [out]) if negate else out

    return convert


def _sym_logic(op_type: str, bitwise: str = "") -> Callable[..., Value]:
    """``&`` / ``|`` / ``not`` of sizes: logical of booleans (size comparisons), bitwise of
    integers (``n & 1``: torch traces both as ``operator.and_``)."""

    def convert(cx: ConvertContext, node: torch.fx.Node, *xs: Any) -> Value:
        val = node.meta.get("val")
        if bitwise and not isinstance(val, torch.SymBool | bool):
            return cx.op(bitwise, [cx.v(x, DType.INT64) for x in xs])
        return cx.op(op_type, [cx.v(x, DType.BOOL) for x in xs])

    return convert


#: Python's number functions Dynamo leaves in a graph on symbolic sizes (TF-style "SAME"
#: padding takes ``math.ceil`` of a size over the stride; a scale takes ``int()`` of a float).
_SYM_CONVERTERS: dict[Any, Callable[..., Value]] = {
    math.floor: _sym_rounding("Floor"),
    math.ceil: _sym_rounding("Ceil"),
    round: _sym_rounding("Round"),
    math.trunc: _sym_rounding("Trunc"),
    torch.sym_int: _sym_rounding("Trunc"),
    torch.sym_float: lambda cx, node, x: cx.v(x, DType.DOUBLE),
    operator.pow: _sym_pow,
    operator.lt: _sym_compare("Less"),
    operator.le: _sym_compare("LessOrEqual"),
    operator.gt: _sym_compare("Greater"),
    operator.ge: _sym_compare("GreaterOrEqual"),
    operator.eq: _sym_compare("Equal"),
    operator.ne: _sym_compare("Equal", negate=True),
    operator.and_: _sym_logic("And", "BitwiseAnd"),
    operator.or_: _sym_logic("Or", "BitwiseOr"),
    torch.sym_not: _sym_logic("Not"),
}


def _floor_divide(cx: ConvertContext, a: Value, b: Value, dt: DType) -> Value:
    """Python's ``a // b`` of two sizes, which floors: ONNX's integer ``Div`` truncates
    toward zero (``(13 - 20) // 3`` is -3, not -2). ``a - a mod b`` (``Mod`` with ``fmod=0``
    takes the divisor's sign, as Python's ``%``) is a multiple of ``b``, so its ``Div`` is
    exact; in double, ``Floor`` of the quotient."""
    if dt.is_float:
        return cx.op("Floor", [cx.op("Div", [a, b])])
    exact = cx.op("Sub", [a, cx.op("Mod", [a, b], {"fmod": 0})])
    return cx.op("Div", [exact, b])


def _convert_node(cx: ConvertContext, node: torch.fx.Node) -> Any:
    cx.node = node
    args = torch.fx.node.map_arg(node.args, lambda n: cx.env[n.name])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: cx.env[n.name])
    target = node.target
    if target is operator.getitem:
        return args[0][args[1]]
    if isinstance(target, torch._ops.OpOverload) and not target._schema.returns:
        return None  # assertions (_assert_tensor_metadata, _assert_scalar ...)
    flat = pytree.tree_leaves((args, kwargs))
    if is_foldable(target, flat):
        return fold_call(target, args, kwargs)
    conv = get_converter(target)
    if conv is not None:
        res = conv(cx, *args, **kwargs)
    elif target in _PY_OPS:
        # size arithmetic in int64; a Python float Dynamo made symbolic (a module's float
        # attribute that differs between two compiled instances: a norm's epsilon) in double
        val = node.meta.get("val")
        dt = DType.DOUBLE if isinstance(val, torch.SymFloat | float) else DType.INT64
        operands = [cx.v(a, dt) for a in args]
        if target is operator.floordiv:
            res = _floor_divide(cx, *operands, dt)
        else:
            res = cx.op(_PY_OPS[target], operands)
    elif target in _SYM_CONVERTERS and not kwargs:
        res = _SYM_CONVERTERS[target](cx, node, *args)
    elif target is torch.sym_sum:  # a sum of sizes (ONNX Sum has no int64: Adds)
        terms = [cx.v(a, DType.INT64) for a in args[0]]
        res = terms[0]
        for t in terms[1:]:
            res = cx.op("Add", [res, t])
    elif isinstance(target, torch._ops.OpOverload):
        res = cx.opaque(target, args, kwargs)
    else:
        raise FrontendError(f"cannot convert FX node {node.name!r} with target {target!r}")
    val = node.meta.get("val")
    if isinstance(res, Value):
        cx.annotate_value(res, val)
    elif isinstance(res, list | tuple) and isinstance(val, list | tuple):
        for r, fv in zip(res, val):
            if isinstance(r, Value):
                cx.annotate_value(r, fv)
    return res
