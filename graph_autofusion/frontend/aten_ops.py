"""ATen -> canonical (ONNX, opset 20) converters, one per ATen operator, Hidet-style.

A converter is registered with :func:`aten_op` under overload names (``"add.Tensor"``) or a
packet name (``"add"``, any overload). It receives the :class:`ConvertContext` and the node's
arguments, FX nodes replaced by IR values / constant tensors, and returns the IR value(s).
Operators without a converter become opaque ``aten`` nodes (never an import failure).

Mapping table (ATen -> canonical form); everything is represented as the ONNX exporters do:

=================================================  =============================================
ATen                                               canonical
=================================================  =============================================
add/sub/mul/div (Tensor, Scalar), rsub             Add/Sub/Mul/Div (alpha -> Mul; operands Cast
                                                   to the promoted dtype; scalars -> 0-d consts)
div.Tensor_mode (floor/trunc)                      Div (+ Floor for floor on floats; integer
                                                   floor: Div(Sub(a, Mod(a, b)), b))
remainder, fmod                                    Mod (fmod attr)
neg abs exp log sqrt sin cos tanh sigmoid relu     Neg Abs Exp Log Sqrt Sin Cos Tanh Sigmoid Relu
erf floor ceil round reciprocal sign               Erf Floor Ceil Round Reciprocal Sign
rsqrt                                              Sqrt + Reciprocal
log1p                                              x * Log(1 + x) / ((1 + x) - 1), x where
                                                   1 + x rounds to 1
pow (Tensor_Scalar/Tensor_Tensor/Scalar)           Pow
gelu(approximate)                                  Gelu(approximate) (opset 20)
silu                                               Mul(x, Sigmoid(x)) (TorchScript exporter form)
hardtanh, clamp(min/max)                           Clip(x, min, max); Max / Min for tensor
                                                   bounds that are not 0-d
leaky_relu elu hardsigmoid hardswish softplus      LeakyRelu Elu HardSigmoid HardSwish Softplus
eq ne lt le gt ge                                  Equal Not(Equal) Less LessOrEqual Greater
                                                   GreaterOrEqual
logical_and/or/xor/not, bitwise_* on bool          And Or Xor Not (BitwiseAnd... on integers)
where, masked_fill                                 Where
_to_copy(dtype)                                    Cast (no node when the dtype is unchanged)
clone alias detach lift_fresh_copy contiguous      no node (value passed through)
mean.dim sum amax amin prod (dim)                  ReduceMean/ReduceSum/ReduceMax/ReduceMin/
                                                   ReduceProd (axes input, opset 18 form)
linalg_vector_norm (ord 2, 1, inf, 0, p)           ReduceL2 / ReduceL1 / ReduceMax(Abs) / count
                                                   of non-zeros / Pow(ReduceSum(Pow(Abs)), 1/p)
max.dim / min.dim                                  ReduceMax + ArgMax / ReduceMin + ArgMin
argmax argmin                                      ArgMax ArgMin
var std var_mean, elu with scales                  see ``aten_ops_math``
cumsum                                             CumSum
_softmax softmax.int _log_softmax                  Softmax(axis) / LogSoftmax(axis)
topk                                               TopK
=================================================  =============================================

Layout ops are listed in :mod:`graph_autofusion.frontend.aten_ops_tensor`, neural-network ops
(linear, matmul, norms, conv, pooling, attention, embedding, LSTM) in
:mod:`graph_autofusion.frontend.aten_ops_nn`, token routing (sort, histc, grouped matrix
products: mixture-of-experts layers) in :mod:`graph_autofusion.frontend.aten_ops_routing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from graph_autofusion.frontend.torch_convert import ConvertContext
from graph_autofusion.ir.core import Value
from graph_autofusion.ir.dtypes import DType

Converter = Callable[..., Any]
_CONVERTERS: dict[str, Converter] = {}


def aten_op(*names: str) -> Callable[[Converter], Converter]:
    """Register a converter for ATen overloads (``"add.Tensor"``) or packets (``"add"``)."""

    def deco(fn: Converter) -> Converter:
        for name in names:
            _CONVERTERS[name] = fn
        return fn

    return deco


def get_converter(target: Any) -> Converter | None:
    """Converter for an ``OpOverload`` (exact overload first, then its packet)."""
    _ensure_loaded()
    if not isinstance(target, torch._ops.OpOverload):
        return None
    full = target._schema.name.split("::")[-1]
    overload = target._overloadname
    return _CONVERTERS.get(f"{full}.{overload}") or _CONVERTERS.get(full)


def converted_ops() -> list[str]:
    """Names of every ATen overload/packet with a converter."""
    _ensure_loaded()
    return sorted(_CONVERTERS)


def _ensure_loaded() -> None:
    from graph_autofusion.frontend import (  # noqa: F401
        aten_ops_indexing,
        aten_ops_math,
        aten_ops_nn,
        aten_ops_routing,
        aten_ops_tensor,
        aten_ops_transformer,
    )


# ----- arithmetic -------------------------------------------------------------------------
def binary(cx: ConvertContext, op_type: str, a: Any, b: Any, dtype: DType | None = None) -> Value:
    """``op_type(a, b)`` with both operands cast to ``dtype`` (default: the output dtype)."""
    dt = dtype or cx.out_dtype
    return cx.op(op_type, [cx.v(a, dt), cx.v(b, dt)])


def _scaled(cx: ConvertContext, b: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return b
    return binary(cx, "Mul", b, alpha)


@aten_op("add.Tensor", "add.Scalar")
def _add(cx: ConvertContext, a: Any, b: Any, alpha: Any = 1) -> Value:
    return binary(cx, "Add", a, _scaled(cx, b, alpha))


@aten_op("sub.Tensor", "sub.Scalar")
def _sub(cx: ConvertContext, a: Any, b: Any, alpha: Any = 1) -> Value:
    return binary(cx, "Sub", a, _scaled(cx, b, alpha))


@aten_op("rsub.Tensor", "rsub.Scalar")
def _rsub(cx: ConvertContext, a: Any, b: Any, alpha: Any = 1) -> Value:
    return binary(cx, "Sub", b, _scaled(cx, a, alpha))


@aten_op("mul.Tensor", "mul.Scalar")
def _mul(cx: ConvertContext, a: Any, b: Any) -> Value:
    return binary(cx, "Mul", a, b)


@aten_op("div.Tensor", "div.Scalar")
def _div(cx: ConvertContext, a: Any, b: Any) -> Value:
    return binary(cx, "Div", a, b)


@aten_op("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cx: ConvertContext, a: Any, b: Any, rounding_mode: str | None = None) -> Value:
    dt = cx.out_dtype
    if rounding_mode == "floor" and not dt.is_float:
        # a - (a mod b) is a multiple of b (Mod's fmod=0 takes the divisor's sign, as
        # Python's %), so dividing it truncates nothing: floor(a / b) exactly
        av, bv = cx.v(a, dt), cx.v(b, dt)
        exact = cx.op("Sub", [av, cx.op("Mod", [av, bv], {"fmod": 0})])
        return cx.op("Div", [exact, bv])
    if rounding_mode is None or not dt.is_float:  # integer Div truncates
        return binary(cx, "Div", a, b)
    q = binary(cx, "Div", a, b)
    if rounding_mode == "floor":
        return cx.op("Floor", [q])
    return cx.op("Mul", [cx.op("Sign", [q]), cx.op("Floor", [cx.op("Abs", [q])])])


@aten_op("remainder.Tensor", "remainder.Scalar")
def _remainder(cx: ConvertContext, a: Any, b: Any) -> Value:
    dt = cx.out_dtype
    if not dt.is_float:
        return cx.op("Mod", [cx.v(a, dt), cx.v(b, dt)], {"fmod": 0})
    bv = cx.v(b, dt)
    floor_q = cx.op("Floor", [binary(cx, "Div", a, bv)])
    return cx.op("Sub", [cx.v(a, dt), cx.op("Mul", [floor_q, bv])])


@aten_op("fmod.Tensor", "fmod.Scalar")
def _fmod(cx: ConvertContext, a: Any, b: Any) -> Value:
    dt = cx.out_dtype
    return cx.op("Mod", [cx.v(a, dt), cx.v(b, dt)], {"fmod": 1})


_UNARY = {
    "neg": "Neg",
    "abs": "Abs",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
    "erf": "Erf",
    "floor": "Floor",
    "ceil": "Ceil",
    "round": "Round",
    "reciprocal": "Reciprocal",
    "sign": "Sign",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
    "cosh": "Cosh",
    "asinh": "Asinh",
    "acosh": "Acosh",
    "atanh": "Atanh",
    "isnan": "IsNaN",
    "logical_not": "Not",  # of x != 0 (ONNX's Not takes booleans only)
    "mish": "Mish",
}


def _register_unary(aten_name: str, onnx_name: str) -> None:
    @aten_op(f"{aten_name}.default")
    def conv(cx: ConvertContext, x: Any) -> Value:
        if onnx_name == "IsNaN":
            return cx.op(onnx_name, [cx.v(x)])
        if onnx_name == "Not":
            return cx.op(onnx_name, [cx.v(x, DType.BOOL)])
        return cx.op(onnx_name, [cx.v(x, cx.out_dtype)])


for _a, _o in _UNARY.items():
    _register_unary(_a, _o)


@aten_op("log1p.default")
def _log1p(cx: ConvertContext, x: Any) -> Value:
    """``log(1 + x)`` to a few ulps where ``1 + x`` rounds (ONNX has no Log1p): with
    ``u = 1 + x``, ``x * log(u) / (u - 1)``, and ``x`` itself where ``u`` rounds to 1."""
    xv = cx.v(x, cx.out_dtype)
    one = cx.scalar(1, xv.dtype)
    u = cx.op("Add", [xv, one])
    d = cx.op("Sub", [u, one])
    ratio = cx.op("Mul", [xv, cx.op("Div", [cx.op("Log", [u]), d])])
    return cx.op("Where", [cx.op("Equal", [d, cx.scalar(0, xv.dtype)]), xv, ratio])


@aten_op("bitwise_not.default")
def _bitwise_not(cx: ConvertContext, x: Any) -> Value:
    return cx.op("Not" if cx.out_dtype == DType.BOOL else "BitwiseNot", [cx.v(x)])


@aten_op("rsqrt.default")
def _rsqrt(cx: ConvertContext, x: Any) -> Value:
    return cx.op("Reciprocal", [cx.op("Sqrt", [cx.v(x, cx.out_dtype)])])


@aten_op("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar")
def _pow(cx: ConvertContext, x: Any, y: Any) -> Value:
    dt = cx.out_dtype
    exp_dt = dt if not isinstance(y, Value) else None
    return cx.op("Pow", [cx.v(x, dt), cx.v(y, exp_dt)])


@aten_op("gelu.default")
def _gelu(cx: ConvertContext, x: Any, approximate: str = "none") -> Value:
    return cx.op("Gelu", [cx.v(x)], {"approximate": approximate})


@aten_op("silu.default")
def _silu(cx: ConvertContext, x: Any) -> Value:
    xv = cx.v(x)
    return cx.op("Mul", [xv, cx.op("Sigmoid", [xv])])


@aten_op(
    "hardtanh.default",
    "clamp.default",
    "clamp.Tensor",
    "clamp_min.default",
    "clamp_max.default",
    "clamp_min.Tensor",
    "clamp_max.Tensor",
)
def _clip(cx: ConvertContext, x: Any, lo: Any = None, hi: Any = None) -> Value:
    name = cx.node.target._schema.name
    if name.endswith("clamp_max"):
        lo, hi = None, lo
    if name.endswith("hardtanh"):
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    dt = cx.out_dtype
    ins = [cx.v(x, dt), cx.v(lo, dt) if lo is not None else None]
    if hi is not None:
        ins.append(cx.v(hi, dt))
    if any(b is not None and b.shape != () for b in ins[1:]):
        # bounds that are tensors (broadcast over x): Clip takes scalars only
        out = ins[0] if ins[1] is None else cx.op("Max", ins[:2])
        return out if hi is None else cx.op("Min", [out, ins[2]])
    return cx.op("Clip", ins)


@aten_op("leaky_relu.default")
def _leaky_relu(cx: ConvertContext, x: Any, slope: float = 0.01) -> Value:
    return cx.op("LeakyRelu", [cx.v(x)], {"alpha": float(slope)})


@aten_op("hardsigmoid.default")
def _hardsigmoid(cx: ConvertContext, x: Any) -> Value:
    return cx.op("HardSigmoid", [cx.v(x)], {"alpha": 1.0 / 6, "beta": 0.5})


@aten_op("hardswish.default")
def _hardswish(cx: ConvertContext, x: Any) -> Value:
    return cx.op("HardSwish", [cx.v(x)])


@aten_op("softplus.default")
def _softplus(cx: ConvertContext, x: Any, beta: float = 1.0, threshold: float = 20.0) -> Value:
    if beta != 1:
        return cx.opaque(cx.node.target, (x, beta, threshold), {})
    return cx.op("Softplus", [cx.v(x)])


# ----- comparisons and logic ------------------------------------------------------------------
_CMP = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}


def _register_cmp(aten_name: str, onnx_name: str) -> None:
    @aten_op(f"{aten_name}.Tensor", f"{aten_name}.Scalar")
    def conv(cx: ConvertContext, a: Any, b: Any) -> Value:
        return binary(cx, onnx_name, a, b, cx.promoted())


for _a, _o in _CMP.items():
    _register_cmp(_a, _o)


@aten_op("ne.Tensor", "ne.Scalar")
def _ne(cx: ConvertContext, a: Any, b: Any) -> Value:
    return cx.op("Not", [binary(cx, "Equal", a, b, cx.promoted())])


_LOGIC = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
_BITWISE = {
    "bitwise_and": ("And", "BitwiseAnd"),
    "bitwise_or": ("Or", "BitwiseOr"),
    "bitwise_xor": ("Xor", "BitwiseXor"),
}


def _register_logic(aten_name: str, op_bool: str, op_int: str) -> None:
    @aten_op(f"{aten_name}.Tensor", f"{aten_name}.Scalar", f"{aten_name}.default")
    def conv(cx: ConvertContext, a: Any, b: Any) -> Value:
        if op_int == "":
            return binary(cx, op_bool, a, b, DType.BOOL)
        dt = cx.out_dtype
        return binary(cx, op_bool if dt == DType.BOOL else op_int, a, b, dt)


for _a, _o in _LOGIC.items():
    _register_logic(_a, _o, "")
for _a, (_b, _i) in _BITWISE.items():
    _register_logic(_a, _b, _i)
# Python's ``&``, ``|``, ``^`` on tensors (the export's pre-decomposition form)
_register_logic("__and__", "And", "BitwiseAnd")
_register_logic("__or__", "Or", "BitwiseOr")
_register_logic("__xor__", "Xor", "BitwiseXor")


@aten_op("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(cx: ConvertContext, c: Any, a: Any, b: Any) -> Value:
    dt = cx.out_dtype
    return cx.op("Where", [cx.v(c, DType.BOOL), cx.v(a, dt), cx.v(b, dt)])


@aten_op("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cx: ConvertContext, x: Any, mask: Any, value: Any) -> Value:
    dt = cx.out_dtype
    return cx.op("Where", [cx.v(mask, DType.BOOL), cx.v(value, dt), cx.v(x, dt)])


# ----- casts and aliases ------------------------------------------------------------------------
@aten_op(
    "_to_copy.default",
    "to.dtype",
    "_to_dtype",
    "to.device",
    "to.dtype_layout",
    "to.other",
    "to.prim_Device",
    "type_as.default",
)
def _to_copy(cx: ConvertContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    dt = cx.out_dtype
    if isinstance(x, Value) and x.dtype == dt:
        return x
    return cx.v(x, dt)


@aten_op(
    "clone.default",
    "alias.default",
    "detach.default",
    "lift_fresh_copy.default",
    "contiguous.default",
    "dropout.default",
    "native_dropout.default",
    "_unsafe_view_copy",
)
def _identity(cx: ConvertContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    if cx.node.target._schema.name.endswith("native_dropout"):
        return [x, None]
    return x


# ----- reductions -------------------------------------------------------------------------------
def reduce(
    cx: ConvertContext, op_type: str, x: Any, dims: Any, keepdim: bool, dtype: DType
) -> Value:
    """``op_type`` over ``dims`` (``None``/empty = all) in the opset-18 form (axes as input)."""
    xv = cx.v(x, dtype)
    if isinstance(dims, int):
        dims = [dims]
    ins = [xv]
    if dims:
        ins.append(cx.ints(list(dims)))
    return cx.op(op_type, ins, {"keepdims": int(bool(keepdim))})


@aten_op("mean.dim", "mean.default")
def _mean(cx: ConvertContext, x: Any, dim: Any = None, keepdim: bool = False, dtype=None) -> Value:
    return reduce(cx, "ReduceMean", x, dim, keepdim, cx.out_dtype)


@aten_op("sum.dim_IntList", "sum.default")
def _sum(cx: ConvertContext, x: Any, dim: Any = None, keepdim: bool = False, dtype=None) -> Value:
    return reduce(cx, "ReduceSum", x, dim, keepdim, cx.out_dtype)


@aten_op("amax.default", "amin.default")
def _amax(cx: ConvertContext, x: Any, dim: Any = (), keepdim: bool = False) -> Value:
    op = "ReduceMax" if cx.node.target._schema.name.endswith("amax") else "ReduceMin"
    return reduce(cx, op, x, dim, keepdim, cx.out_dtype)


@aten_op("prod.dim_int", "prod.default")
def _prod(cx: ConvertContext, x: Any, dim: Any = None, keepdim: bool = False, dtype=None) -> Value:
    return reduce(cx, "ReduceProd", x, dim, keepdim, cx.out_dtype)


@aten_op("linalg_vector_norm.default")
def _vector_norm(
    cx: ConvertContext, x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype=None
) -> Value:
    """``torch.norm`` / ``F.normalize``'s norm: ReduceL2 / ReduceL1, ReduceMax / ReduceMin of
    ``|x|`` for +-inf, the count of non-zeros for 0, else ``(sum |x|^p)^(1/p)``."""
    xv = cx.v(x, cx.out_dtype)
    if isinstance(dim, int):
        dim = [dim]
    if not dim:  # every element
        if keepdim and xv.shape is not None:
            dim = list(range(len(xv.shape)))
        else:
            xv, dim, keepdim = cx.op("Reshape", [xv, cx.ints([-1])]), [0], False
    return p_norm(cx, xv, float(ord), dim, keepdim, cx.out_dtype)


def p_norm(cx: ConvertContext, x: Value, p: float, dims: Any, keepdim: bool, dt: DType) -> Value:
    """The p-norm of ``x`` over ``dims``: ReduceL2 / ReduceL1, ReduceMax / ReduceMin of ``|x|``
    for +-inf, the count of non-zeros for 0, else ``(sum |x|^p)^(1/p)``."""
    if p == 2.0:
        return reduce(cx, "ReduceL2", x, dims, keepdim, dt)
    if p == 1.0:
        return reduce(cx, "ReduceL1", x, dims, keepdim, dt)
    a = cx.op("Abs", [x])
    if p in (math.inf, -math.inf):
        return reduce(cx, "ReduceMax" if p > 0 else "ReduceMin", a, dims, keepdim, dt)
    if p == 0.0:
        nonzero = cx.op("Cast", [cx.op("Greater", [a, cx.scalar(0, dt)])], {"to": int(dt)})
        return reduce(cx, "ReduceSum", nonzero, dims, keepdim, dt)
    total = reduce(cx, "ReduceSum", cx.op("Pow", [a, cx.scalar(p, dt)]), dims, keepdim, dt)
    return cx.op("Pow", [total, cx.scalar(1.0 / p, dt)])


@aten_op("max.dim", "min.dim")
def _max_dim(cx: ConvertContext, x: Any, dim: int, keepdim: bool = False) -> list[Value]:
    is_max = cx.node.target._schema.name.endswith("max")
    xv = cx.v(x)
    vals = reduce(cx, "ReduceMax" if is_max else "ReduceMin", xv, [dim], keepdim, xv.dtype)
    idx = cx.op("ArgMax" if is_max else "ArgMin", [xv], {"axis": dim, "keepdims": int(keepdim)})
    return [vals, idx]


@aten_op("max.default", "min.default")
def _max_all(cx: ConvertContext, x: Any) -> Value:
    is_max = cx.node.target._schema.name.endswith("max")
    return reduce(cx, "ReduceMax" if is_max else "ReduceMin", x, None, False, cx.out_dtype)


@aten_op("maximum.default", "minimum.default")
def _maximum(cx: ConvertContext, a: Any, b: Any) -> Value:
    return binary(cx, "Max" if cx.node.target._schema.name.endswith("maximum") else "Min", a, b)


@aten_op("argmax.default", "argmin.default")
def _argmax(cx: ConvertContext, x: Any, dim: int | None = None, keepdim: bool = False) -> Value:
    op = "ArgMax" if cx.node.target._schema.name.endswith("argmax") else "ArgMin"
    xv = cx.v(x)
    if dim is None:
        xv = cx.op("Reshape", [xv, cx.ints([-1])])
        dim, keepdim = 0, False
    return cx.op(op, [xv], {"axis": int(dim), "keepdims": int(keepdim)})


@aten_op("cumsum.default")
def _cumsum(cx: ConvertContext, x: Any, dim: int, dtype: Any = None) -> Value:
    return cx.op("CumSum", [cx.v(x, cx.out_dtype), cx.scalar(int(dim), DType.INT64)])


@aten_op("_softmax.default", "softmax.int", "_log_softmax.default", "log_softmax.int")
def _softmax(cx: ConvertContext, x: Any, dim: int, half_or_dtype: Any = None) -> Value:
    op = "LogSoftmax" if "log_softmax" in cx.node.target._schema.name else "Softmax"
    return cx.op(op, [cx.v(x, cx.out_dtype)], {"axis": int(dim)})


@aten_op("topk.default")
def _topk(
    cx: ConvertContext, x: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
):
    return cx.op(
        "TopK",
        [cx.v(x), cx.ints([k])],
        {"axis": dim, "largest": int(largest), "sorted": int(sorted)},
        num_outputs=2,
    )
