"""Fusion controls (F17): size switches and mixed-precision constraints.

* **Size switches** (:class:`SizeSwitch`): a rule applies only when a model input's dimension
  meets a condition, e.g. ``attention:input_ids[1]>=128`` (the attention rule applies only
  when the sequence length is at least 128). The sizes are the sample inputs' (the ones the
  plan and safe mode use): a switched-off rule is left out of the plan, and the decision is
  recorded with the size it saw (``FuseResult.controls``).
* **Mixed-precision constraints** (``keep_fp32``): in a float16 / bfloat16 model the listed
  operators compute in float32. A fusion holding one of them is kept only when its fused form
  computes in float32 (the generated kernels widen every half value to float32; onnxruntime's
  normalization operators accumulate in float32); otherwise it is refused with
  ``precision-constraint``. Unfused, each such operator gets float32 inputs and its outputs are
  rounded back (:func:`graph_autofusion.codegen.precision.keep_fp32_islands`).

Progressive fusion (rule stages with validation between) is
:mod:`graph_autofusion.pipeline.progressive`; the debug float check is
:mod:`graph_autofusion.verify.float_check`.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graph_autofusion import reasons
from graph_autofusion.catalog.precision import FP32_ACCUMULATING
from graph_autofusion.catalog.registry import get_schema
from graph_autofusion.errors import GraphAutoFusionError
from graph_autofusion.ir.dtypes import DType
from graph_autofusion.ir.node import float_dtype
from graph_autofusion.patterns.rules import RuleSet

__all__ = [
    "DEFAULT_KEEP_FP32",
    "REDUCTIONS",
    "ControlError",
    "PrecisionGuard",
    "SizeSwitch",
    "apply_size_switches",
    "computes_in_fp32",
    "half_precision",
    "parse_keep_fp32",
    "parse_size_switch",
]

PRECISION_CONSTRAINT = reasons.PRECISION_CONSTRAINT
SIZE_SWITCH_OFF = reasons.SIZE_SWITCH_OFF

REDUCTIONS = (
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
)
#: ``keep_fp32="default"``: BatchNormalization and the accumulating reductions (ReduceMax and
#: ReduceMin are exact in any precision).
DEFAULT_KEEP_FP32 = ("BatchNormalization", *REDUCTIONS)
HALF = (DType.FLOAT16, DType.BFLOAT16)

_OPS = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}
_SWITCH = re.compile(
    r"^\s*(?P<rule>[A-Za-z_][\w.\-]*)\s*:\s*(?P<input>[^\[\]\s]+)\s*\[\s*(?P<axis>-?\d+)\s*\]"
    r"\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>\d+)\s*$"
)


class ControlError(GraphAutoFusionError, ValueError):
    """A fusion control names an unknown rule, input, axis or operator, or is malformed."""


@dataclass(frozen=True)
class SizeSwitch:
    """``rule`` applies only when ``input``'s dimension ``axis`` satisfies ``op value``."""

    rule: str
    input: str
    axis: int
    op: str
    value: int

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ControlError(
                f"size switch {self}: unknown comparison {self.op!r}; known: {list(_OPS)}"
            )

    def __str__(self) -> str:
        return f"{self.rule}:{self.input}[{self.axis}]{self.op}{self.value}"

    def holds(self, size: int) -> bool:
        return bool(_OPS[self.op](int(size), int(self.value)))


def parse_size_switch(text: str | SizeSwitch) -> SizeSwitch:
    """``"RULE:INPUT[AXIS]>=N"`` (also ``<= > < == !=``) as a :class:`SizeSwitch`."""
    if isinstance(text, SizeSwitch):
        return text
    m = _SWITCH.match(str(text))
    if m is None:
        raise ControlError(
            f"size switch {text!r}: expected RULE:INPUT[AXIS]OP N, e.g. "
            f"'attention:input_ids[1]>=128' (OP one of {' '.join(_OPS)})"
        )
    return SizeSwitch(m["rule"], m["input"], int(m["axis"]), m["op"], int(m["value"]))


def apply_size_switches(
    rules: Any, switches: Iterable[SizeSwitch | str], feeds: Mapping[str, Any]
) -> tuple[Any, list[dict[str, Any]]]:
    """The rule set without the rules whose switch is off on ``feeds``' sizes, and one record
    per switch (``switch``, ``size``, ``on``, ``message``). A rule with several switches
    applies only when all hold.

    Raises:
        ControlError: a switch names an unknown rule, input or axis (the message lists the
            known ones).
    """

    parsed = [parse_size_switch(s) for s in switches]
    if not parsed:
        return rules, []
    names = [r.name for r in rules]
    off: set[str] = set()
    records: list[dict[str, Any]] = []
    for sw in parsed:
        if sw.rule not in names:
            raise ControlError(
                f"size switch {sw}: no rule {sw.rule!r} in the rule set; known: {sorted(names)}"
            )
        if sw.input not in feeds:
            raise ControlError(
                f"size switch {sw}: the model has no input {sw.input!r}; inputs: {sorted(feeds)}"
            )
        shape = tuple(getattr(feeds[sw.input], "shape", ()))
        if not -len(shape) <= sw.axis < len(shape):
            raise ControlError(
                f"size switch {sw}: input {sw.input!r} has rank {len(shape)} (shape "
                f"{list(shape)}), no axis {sw.axis}"
            )
        size = int(shape[sw.axis])
        on = sw.holds(size)
        if not on:
            off.add(sw.rule)
        records.append(
            {
                "switch": str(sw),
                "rule": sw.rule,
                "size": size,
                "on": on,
                "code": "" if on else SIZE_SWITCH_OFF,
                "message": (
                    f"rule {sw.rule} {'on' if on else 'off'}: {sw.input}[{sw.axis}] = {size}, "
                    f"{'meets' if on else 'fails'} {sw.op} {sw.value}"
                ),
            }
        )
    kept = RuleSet(tuple(r for r in rules if r.name not in off))
    return kept, records


def parse_keep_fp32(ops: str | Sequence[str] | None) -> tuple[str, ...]:
    """Operator names kept in float32 in half-precision models: a comma-separated string or
    a sequence; ``"default"`` is :data:`DEFAULT_KEEP_FP32` (BatchNormalization and the
    reductions), ``"none"`` or empty is none.

    Raises:
        ControlError: an operator the catalog does not know.
    """

    if ops is None:
        return ()
    items = [s.strip() for s in ops.split(",")] if isinstance(ops, str) else list(ops)
    out: list[str] = []
    for item in items:
        if not item or item == "none":
            continue
        if item == "default":
            out.extend(DEFAULT_KEEP_FP32)
            continue
        if not get_schema(item).known:
            raise ControlError(
                f"keep-fp32: unknown operator {item!r}; use ONNX operator names such as "
                f"{', '.join(DEFAULT_KEEP_FP32[:3])} or 'default' ({', '.join(DEFAULT_KEEP_FP32)})"
            )
        out.append(item)
    return tuple(dict.fromkeys(out))


def half_precision(model: Any) -> bool:
    """Whether any value of ``model`` is float16 or bfloat16."""
    g = model.graph
    return any(v.dtype in HALF for v in g.values())


def _half_nodes(nodes: Iterable[Any], keep: frozenset[str]) -> list[Any]:
    return [n for n in nodes if n.op_type in keep and any(float_dtype(v) in HALF for v in n.inputs)]


def computes_in_fp32(candidate: Any, kernel: bool) -> bool:
    """Whether ``candidate``'s fused form computes in float32: a generated kernel always
    does (half values are widened on load); an onnxruntime operator only when it is one of
    :data:`graph_autofusion.catalog.precision.FP32_ACCUMULATING` or ``RMSNormalization``."""
    if kernel:
        return True
    rule = getattr(candidate, "rule", None)
    native = getattr(rule, "native_op", None) or getattr(rule, "fuse_pattern", "")
    # onnxruntime's normalizations, and the opset-23 RMSNormalization (stash_type float32)
    return str(native).split(".")[-1] in FP32_ACCUMULATING | {"RMSNormalization"}


class PrecisionGuard:
    """A target wrapper whose :meth:`refusal` first applies the mixed-precision constraint,
    then the wrapped target's own; everything else is the wrapped target's."""

    def __init__(self, inner: Any, keep: Sequence[str]) -> None:
        self.inner = inner
        self.keep = frozenset(keep)
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def refusal(self, candidate: Any, binding: Any) -> tuple[str, str] | None:
        nodes = getattr(getattr(candidate, "match", None), "nodes", None)
        if nodes is None:
            nodes = getattr(candidate, "nodes", ())
        kept = _half_nodes(nodes, self.keep)
        if kept:
            kernel = self._lowers_to_kernel(candidate, binding)
            if not computes_in_fp32(candidate, kernel):
                ops = sorted({n.op_type for n in kept})
                return (
                    PRECISION_CONSTRAINT,
                    f"it holds {', '.join(ops)} on half-precision values, which the "
                    f"mixed-precision constraint keeps in float32, and its fused operator "
                    f"computes in half precision",
                )
        return self.inner.refusal(candidate, binding)

    def _lowers_to_kernel(self, candidate: Any, binding: Any) -> bool:
        lower = getattr(self.inner, "lower", None)
        if lower is None:
            return False
        try:
            lower(candidate, binding)
        except Exception:  # noqa: BLE001 - refused as a kernel: a native form, if any
            return False
        return True
