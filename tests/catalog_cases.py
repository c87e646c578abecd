"""Single-node cases for tests/test_catalog.py: every catalog operator against onnxruntime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

MS = "com.microsoft"
_rng = np.random.default_rng(0)


@dataclass
class Case:
    op: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 20
    domain: str = ""
    n_out: int = 1
    tag: str = ""
    tol: float = 1e-5

    def __post_init__(self) -> None:
        self.inputs = [None if a is None else np.asarray(a) for a in self.inputs]

    @property
    def id(self) -> str:
        d = f"{self.domain}." if self.domain else ""
        return f"{d}{self.op}-{self.tag}" if self.tag else f"{d}{self.op}"


def r(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (_rng.standard_normal(shape) * scale).astype(np.float32)


def rp(*shape: int) -> np.ndarray:
    return (np.abs(_rng.standard_normal(shape)) + 0.5).astype(np.float32)


def ru(lo: float, hi: float, *shape: int) -> np.ndarray:
    return _rng.uniform(lo, hi, shape).astype(np.float32)


def ri(lo: int, hi: int, *shape: int, dtype: Any = np.int64) -> np.ndarray:
    return _rng.integers(lo, hi, shape).astype(dtype)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def b(*shape: int) -> np.ndarray:
    return _rng.random(shape) > 0.5


def h16(*shape: int) -> np.ndarray:
    return r(*shape).astype(np.float16)


C = Case
CASES: list[Case] = []
for name in [
    "Abs", "Neg", "Exp", "Tanh", "Sin", "Cos", "Atan", "Asinh", "Sinh", "Cosh", "Floor", "Ceil",
    "Round", "Sign", "Erf", "Sigmoid", "Softsign", "Relu", "LeakyRelu", "HardSigmoid",
    "HardSwish", "Softplus", "Elu", "Selu", "Celu", "Mish", "ThresholdedRelu", "Shrink",
    "Identity", "IsNaN", "IsInf",
]:  # fmt: skip
    CASES.append(C(name, [r(3, 4, 5, scale=2.0)]))
for name in ["Sqrt", "Log", "Reciprocal", "Acosh"]:
    CASES.append(C(name, [rp(3, 4) + 1.0]))
for name in ["Asin", "Acos", "Atanh", "Tan"]:
    CASES.append(C(name, [ru(-0.9, 0.9, 3, 4)]))
x_nan = r(4, 4)
x_nan[0, 0], x_nan[1, 1], x_nan[2, 2] = np.nan, np.inf, -np.inf
CASES += [
    C("IsNaN", [x_nan], tag="nan"),
    C("IsInf", [x_nan], {"detect_negative": 0}, tag="posinf"),
    C("LeakyRelu", [r(10)], {"alpha": 0.2}, tag="alpha"),
    C("Elu", [r(10)], {"alpha": 0.5}, tag="alpha"),
    C("Gelu", [r(3, 8, scale=2.0)]),
    C("Gelu", [r(3, 8, scale=2.0)], {"approximate": "tanh"}, tag="tanh"),
    C("Gelu", [h16(3, 8)], tag="fp16", tol=2e-3),
    C("Relu", [ri(-5, 5, 7, dtype=np.int32)], tag="int32"),
    C("Abs", [ri(-5, 5, 7)], tag="int64"),
    C("Not", [b(3, 4)]),
    C("BitwiseNot", [ri(-9, 9, 6, dtype=np.int32)]),
    C("Clip", [r(4, 5), np.float32(-0.5), np.float32(0.5)]),
    C("Clip", [r(4, 5), None, np.float32(0.3)], tag="max-only"),
    C("Clip", [ri(-9, 9, 6), np.int64(-2), np.int64(3)], tag="int"),
    C("Clip", [r(4, 5)], {"min": -0.2, "max": 0.1}, opset=6, tag="attrs"),
    C("Cast", [r(4, 5, scale=3.0)], {"to": 7}, tag="f2i"),
    C("Cast", [r(4, 5)], {"to": 10}, tag="f2h"),
    C("Cast", [ri(-2, 2, 6)], {"to": 9}, tag="i2b"),
    C("Cast", [b(5)], {"to": 1}, tag="b2f"),
    C("CastLike", [ri(-9, 9, 5), r(1)]),
    C("Dropout", [r(3, 4)], n_out=2, opset=13),
    C("Dropout", [r(3, 4)], opset=13, tag="1out"),
]
# ----- binary / variadic ---------------------------------------------------------------------
for name in ["Add", "Sub", "Mul", "Div"]:
    CASES.append(C(name, [r(2, 3, 4), r(4)]))
    CASES.append(C(name, [r(2, 1, 4), r(3, 1)], tag="bcast"))
CASES += [
    C("Add", [h16(2, 3, 4), h16(3, 4)], tag="fp16"),
    C("Mul", [ri(-9, 9, 3, 4), ri(-9, 9, 4)], tag="int"),
    C("Div", [ri(-20, 20, 50), np.array([3, -3, 7, -7, 1] * 10, np.int64)], tag="int-trunc"),
    C(
        "Div",
        [ri(-20, 20, 6, dtype=np.int32), np.array([4, -4, 3, -3, 5, -5], np.int32)],
        tag="i32",
    ),
    C("Pow", [rp(3, 4), r(3, 4)]),
    C("Pow", [r(3, 4), np.array(2, np.int64)], tag="int-exp"),
    C("Pow", [r(3, 4), np.float32(2.0)], tag="square"),
    C("Mod", [ri(-20, 20, 30), np.array([3, -3, 7, -7, 2] * 6, np.int64)], tag="int"),
    C("Mod", [r(10, scale=5), rp(10)], {"fmod": 1}, tag="fmod"),
    C("Equal", [ri(0, 3, 4, 5), ri(0, 3, 5)]),
    C("Less", [r(3, 4), r(4)]),
    C("LessOrEqual", [ri(0, 3, 4, 5), ri(0, 3, 5)]),
    C("Greater", [r(3, 4), r(4)]),
    C("GreaterOrEqual", [ri(0, 3, 4, 5), ri(0, 3, 5)]),
    C("And", [b(3, 4), b(4)]),
    C("Or", [b(3, 4), b(4)]),
    C("Xor", [b(3, 4), b(4)]),
    C("BitwiseAnd", [ri(0, 64, 8, dtype=np.int32), ri(0, 64, 8, dtype=np.int32)]),
    C("BitwiseOr", [ri(0, 64, 8, dtype=np.int32), ri(0, 64, 8, dtype=np.int32)]),
    C("BitwiseXor", [ri(0, 64, 8, dtype=np.int32), ri(0, 64, 8, dtype=np.int32)]),
    C(
        "BitShift",
        [ri(0, 64, 8, dtype=np.uint32), ri(0, 4, 8, dtype=np.uint32)],
        {"direction": "LEFT"},
    ),
    C(
        "BitShift",
        [ri(0, 64, 8, dtype=np.uint8), ri(0, 4, 8, dtype=np.uint8)],
        {"direction": "RIGHT"},
        tag="r",
    ),
    C("PRelu", [r(2, 3, 4, 4), r(3, 1, 1)]),
    C("Where", [b(3, 4), r(3, 4), r(4)]),
    C("Where", [b(3, 1), ri(0, 9, 4), ri(0, 9, 3, 4)], tag="int"),
]
for name in ["Sum", "Max", "Min", "Mean"]:
    CASES.append(C(name, [r(2, 3), r(3), r(1, 3)]))
CASES.append(C("Max", [ri(0, 9, 4), ri(0, 9, 4)], tag="int"))
# ----- reductions ------------------------------------------------------------------------------
for name in [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSumExp",
]:  # fmt: skip
    CASES.append(C(name, [r(2, 3, 4), i64(1, -1)], opset=18))
    CASES.append(C(name, [r(2, 3, 4)], {"keepdims": 0}, opset=18, tag="all"))
CASES += [
    C("ReduceLogSum", [rp(2, 3, 4), i64(2)], opset=18),
    C("ReduceMean", [r(2, 3, 4)], {"axes": [-1], "keepdims": 1}, opset=17, tag="opset17"),
    C("ReduceMean", [h16(2, 3, 64), i64(-1)], opset=18, tag="fp16", tol=2e-3),
    C("ReduceSum", [r(2, 3, 4), i64(1)], {"keepdims": 0}, opset=13, tag="opset13"),
    C(
        "ReduceSum",
        [r(2, 3), np.zeros(0, np.int64)],
        {"noop_with_empty_axes": 1},
        opset=18,
        tag="noop",
    ),
    C("ReduceMax", [ri(0, 50, 3, 4), i64(0)], opset=18, tag="int"),
    C("ArgMax", [r(3, 4, 5)], {"axis": 1}),
    C("ArgMax", [ri(0, 3, 3, 6)], {"axis": -1, "keepdims": 0, "select_last_index": 1}, tag="last"),
    C("ArgMin", [r(3, 4, 5)], {"axis": 2, "keepdims": 0}),
    C("Softmax", [r(2, 3, 8)]),
    C("Softmax", [r(2, 3, 8)], {"axis": 1}, tag="axis1"),
    C("Softmax", [r(2, 3, 8)], {"axis": 1}, opset=11, tag="opset11"),
    C("Softmax", [h16(2, 3, 8)], tag="fp16", tol=2e-3),
    C("LogSoftmax", [r(2, 3, 8)]),
    C("Hardmax", [r(3, 7)]),
    C("CumSum", [r(3, 5), i64(1)]),
    C("CumSum", [r(3, 5), i64(0)], {"exclusive": 1, "reverse": 1}, tag="excl-rev"),
    C("CumSum", [ri(0, 9, 3, 5), np.array(1, np.int32)], {"exclusive": 1}, tag="int"),
    C("TopK", [r(3, 10), i64(4)], n_out=2),
    C("TopK", [r(3, 10), i64(3)], {"axis": 0, "largest": 0}, n_out=2, tag="smallest"),
]
# ----- contraction -------------------------------------------------------------------------
CASES += [
    C("MatMul", [r(2, 3, 4, 8), r(8, 6)]),
    C("MatMul", [r(2, 1, 4, 8), r(3, 8, 6)], tag="bcast"),
    C("MatMul", [r(8), r(8, 6)], tag="vec"),
    C("MatMul", [r(4, 32), r(32, 16)], tag="fp32-k32"),
    C("MatMul", [h16(4, 64), h16(64, 16)], tag="fp16", tol=5e-2),
    C("Gemm", [r(4, 8), r(8, 6), r(6)]),
    C(
        "Gemm",
        [r(8, 4), r(6, 8), r(4, 6)],
        {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
        tag="trans",
    ),
    C("Gemm", [r(4, 8), r(8, 6)], tag="nobias"),
    C("Einsum", [r(2, 3, 4), r(2, 4, 5)], {"equation": "bij,bjk->bik"}),
    C("Einsum", [r(2, 3, 5, 8), r(2, 3, 6, 8)], {"equation": "bhid,bhjd->bhij"}, tag="attn"),
    C("Einsum", [r(3, 4)], {"equation": "ij->ji"}, tag="transpose"),
    C("Conv", [r(1, 4, 9, 9), r(6, 4, 3, 3), r(6)], {"pads": [1, 1, 1, 1]}),
    C(
        "Conv",
        [r(2, 4, 10, 9), r(6, 2, 3, 2)],
        {"strides": [2, 1], "dilations": [1, 2], "group": 2, "pads": [1, 0, 2, 1]},
        tag="group",
    ),
    C(
        "Conv",
        [r(1, 6, 8, 8), r(6, 1, 3, 3)],
        {"group": 6, "auto_pad": "SAME_UPPER", "strides": [2, 2]},
        tag="dw-same",
    ),
    C("Conv", [r(1, 8, 7, 7), r(4, 8, 1, 1), r(4)], {"strides": [2, 2]}, tag="1x1"),
    C("Conv", [r(2, 3, 20), r(5, 3, 4)], {"pads": [2, 1]}, tag="1d"),
    C("Conv", [r(1, 2, 5, 6, 6), r(3, 2, 3, 3, 3)], {"pads": [1] * 6}, tag="3d"),
    C(
        "Conv",
        [r(1, 3, 32, 32), r(8, 3, 7, 7, scale=0.3), r(8)],
        {"strides": [2, 2], "pads": [3, 3, 3, 3]},
        tag="stem",
    ),
    C("Conv", [h16(1, 4, 8, 8), h16(4, 4, 3, 3)], tag="fp16", tol=2e-2),
    C(
        "ConvTranspose",
        [r(1, 4, 5, 5), r(4, 3, 3, 3), r(3)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    C(
        "ConvTranspose",
        [r(2, 4, 5, 6), r(4, 2, 2, 3)],
        {"group": 2, "dilations": [2, 1]},
        tag="group",
    ),
    C("ConvTranspose", [r(1, 3, 7), r(3, 2, 4)], {"strides": [3]}, tag="1d"),
    C(
        "ConvTranspose",
        [r(1, 2, 4, 4), r(2, 2, 3, 3)],
        {"strides": [2, 2], "output_shape": [8, 8]},
        tag="outshape",
    ),
]
# ----- normalization / pooling ---------------------------------------------------------------
CASES += [
    C("BatchNormalization", [r(2, 3, 4, 5), r(3), r(3), r(3), rp(3)], {"epsilon": 1e-3}, opset=15),
    C("InstanceNormalization", [r(2, 3, 4, 5), r(3), r(3)]),
    C("LayerNormalization", [r(2, 5, 16), r(16), r(16)], n_out=3, opset=17),
    C(
        "LayerNormalization",
        [r(2, 5, 4, 4), r(4, 4)],
        {"axis": 2, "epsilon": 1e-3},
        opset=17,
        tag="axis2",
    ),
    C("LayerNormalization", [h16(2, 5, 16), h16(16), h16(16)], opset=17, tag="fp16", tol=5e-3),
    C("GroupNormalization", [r(2, 6, 4, 4), r(6), r(6)], {"num_groups": 3}, opset=21),
    C(
        "GroupNormalization",
        [r(2, 6, 4, 4), r(3), r(3)],
        {"num_groups": 3},
        opset=18,
        tag="opset18",
    ),
    C("RMSNormalization", [r(2, 5, 16), r(16)], {"epsilon": 1e-6}, opset=23),
    C("Attention", [r(2, 4, 3, 8), r(2, 4, 5, 8), r(2, 4, 5, 8)], opset=23),
    C(
        "Attention",
        [r(1, 4, 3, 8), r(1, 2, 5, 8), r(1, 2, 5, 8), r(1, 1, 3, 5)],
        {"scale": 0.3},
        opset=23,
        tag="gqa_additive_mask",
    ),
    C(
        "Attention",
        [r(1, 2, 3, 8), r(1, 2, 5, 8), r(1, 2, 5, 8), b(3, 5)],
        opset=23,
        tag="bool_mask",
    ),
    C(
        "Attention",
        [r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8)],
        {"is_causal": 1},
        opset=23,
        tag="causal",
    ),
    C("SimplifiedLayerNormalization", [r(2, 5, 16), r(16)], {"epsilon": 1e-6}, opset=17),
    C("LpNormalization", [r(3, 6)], {"p": 2}),
    C("LpNormalization", [r(3, 6)], {"p": 1, "axis": 0}, tag="l1"),
    C("MeanVarianceNormalization", [r(2, 3, 4, 5)]),
    C(
        "MaxPool",
        [r(1, 3, 12, 12)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    C(
        "MaxPool",
        [r(1, 2, 9, 9)],
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
        tag="ceil",
    ),
    C("MaxPool", [r(1, 2, 9, 9)], {"kernel_shape": [2, 2], "dilations": [2, 2]}, tag="dil"),
    C(
        "MaxPool",
        [r(2, 2, 6, 7)],
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
        n_out=2,
        tag="idx",
    ),
    C(
        "MaxPool",
        [r(2, 3, 11)],
        {"kernel_shape": [3], "auto_pad": "SAME_UPPER", "strides": [2]},
        tag="1d-same",
    ),
    C("AveragePool", [r(1, 3, 8, 8)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    C(
        "AveragePool",
        [r(1, 3, 8, 8)],
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        tag="incl",
    ),
    C(
        "AveragePool",
        [r(1, 2, 9, 9)],
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
        tag="ceil",
    ),
    C("GlobalAveragePool", [r(2, 3, 5, 5)]),
    C("GlobalMaxPool", [r(2, 3, 5, 5)]),
]
# ----- layout / data movement -------------------------------------------------------------
CASES += [
    C("Reshape", [r(2, 3, 4), i64(0, -1, 2)]),
    C("Reshape", [r(0, 3), i64(3, 0)], {"allowzero": 1}, tag="allowzero"),
    C("Flatten", [r(2, 3, 4, 5)], {"axis": 2}),
    C("Flatten", [r(2, 3, 4)], {"axis": 0}, tag="axis0"),
    C("Transpose", [r(2, 3, 4)], {"perm": [2, 0, 1]}),
    C("Transpose", [r(2, 3, 4)], tag="default"),
    C("Squeeze", [r(1, 3, 1, 4), i64(-2)]),
    C("Squeeze", [r(1, 3, 1, 4)], tag="all"),
    C("Squeeze", [r(1, 3, 1, 4)], {"axes": [0]}, opset=11, tag="attr"),
    C("Unsqueeze", [r(3, 4), i64(0, -1)]),
    C("Unsqueeze", [r(3, 4)], {"axes": [1]}, opset=11, tag="attr"),
    C("Expand", [r(3, 1), i64(2, 1, 4)]),
    C("Slice", [r(5, 6, 7), i64(1, -3), i64(100, -1), i64(0, 2), i64(2, 1)]),
    C("Slice", [r(5, 6), i64(-1), i64(-100), i64(1), i64(-2)], tag="neg-step"),
    C("Slice", [r(5, 6), i64(4, 1), i64(-9999, 5)], tag="noaxes"),
    C("Slice", [r(5, 6)], {"starts": [1], "ends": [3], "axes": [1]}, opset=9, tag="attrs"),
    C("DepthToSpace", [r(1, 8, 2, 3)], {"blocksize": 2}),
    C("DepthToSpace", [r(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, tag="crd"),
    C("SpaceToDepth", [r(1, 2, 4, 6)], {"blocksize": 2}),
    C("Trilu", [r(2, 4, 5), i64(1)]),
    C("Trilu", [r(4, 5), i64(-1)], {"upper": 0}, tag="lower"),
    C("Shape", [r(2, 3, 4)]),
    C("Shape", [r(2, 3, 4, 5)], {"start": 1, "end": -1}, tag="slice"),
    C("Size", [r(2, 3, 4)]),
    C("ConstantOfShape", [i64(2, 3)], {"value": np.array([1.5], np.float32)}),
    C("ConstantOfShape", [i64(4)], {"value": np.array([7], np.int64)}, tag="int"),
    C("ConstantOfShape", [i64(2)], tag="default"),
    C("Constant", [], {"value": r(2, 3)}),
    C("Constant", [], {"value_ints": [1, 2, 3]}, tag="ints"),
    C("Constant", [], {"value_float": 2.5}, tag="float"),
    C("Range", [np.array(2, np.int64), np.array(17, np.int64), np.array(3, np.int64)]),
    C("Range", [np.array(10, np.int32), np.array(1, np.int32), np.array(-4, np.int32)], tag="neg"),
    C("Range", [np.float32(0.5), np.float32(3.0), np.float32(0.7)], tag="float"),
    C("EyeLike", [r(3, 5)], {"k": 1}),
    C("OneHot", [i64(0, 2, -1, 1), i64(4), np.array([0.0, 3.0], np.float32)]),
    C("NonZero", [ri(0, 2, 3, 4)]),
    C("Concat", [r(2, 3), r(2, 5), r(2, 1)], {"axis": -1}),
    C("Split", [r(7, 4)], {"axis": 0, "num_outputs": 3}, opset=18, n_out=3),
    C("Split", [r(6, 4), i64(1, 3)], {"axis": 1}, n_out=2, tag="sizes"),
    C("Split", [r(6, 4)], {"axis": 0, "split": [2, 4]}, opset=11, n_out=2, tag="attr"),
    C("Split", [r(6, 4)], {"axis": 1}, opset=13, n_out=2, tag="equal"),
    C("Gather", [r(5, 4), i64(0, -1, 3)]),
    C("Gather", [r(5, 4, 3), np.array([[1, -2], [0, 3]], np.int64)], {"axis": 1}, tag="axis1"),
    C("Gather", [r(5, 4), np.array(2, np.int64)], tag="scalar"),
    C("Gather", [ri(0, 9, 6), np.array([1, -1], np.int32)], tag="int32"),
    C("GatherElements", [r(3, 4), np.array([[0, -1, 2, 1], [3, 0, 0, 1]], np.int64)], {"axis": 1}),
    C("GatherND", [r(2, 3, 4), np.array([[0, 1], [1, -1]], np.int64)]),
    C("GatherND", [r(2, 3, 4), np.array([[1], [2]], np.int64)], {"batch_dims": 1}, tag="batch"),
    C("ScatterND", [r(4, 3), np.array([[1], [3]], np.int64), r(2, 3)]),
    C(
        "ScatterND",
        [r(4, 3), np.array([[1, 1], [1, 1]], np.int64), r(2)],
        {"reduction": "add"},
        tag="add",
    ),
    C("ScatterElements", [r(3, 4), np.array([[1, 0], [2, 3]], np.int64), r(2, 2)], {"axis": 1}),
    C(
        "ScatterElements",
        [r(3, 4), np.array([[1, 1]], np.int64), r(1, 2)],
        {"axis": 1, "reduction": "add"},
        tag="add",
    ),
    C("Tile", [r(2, 3), i64(2, 3)]),
    C("Pad", [r(2, 3), i64(1, 0, 2, 1), np.float32(0.5)]),
    C("Pad", [r(3, 4), i64(1, 2, 1, 0)], {"mode": "reflect"}, tag="reflect"),
    C("Pad", [r(3, 4), i64(2, 1, 0, 2)], {"mode": "edge"}, tag="edge"),
    C("Pad", [r(1, 2, 3, 4), i64(1, 1, 1, -1), None, i64(2, 3)], tag="axes"),
    C("Compress", [r(4, 3), np.array([True, False, True, True])], {"axis": 0}),
    C("Resize", [r(1, 2, 4, 5), None, np.array([1, 1, 2, 1.5], np.float32)], {"mode": "nearest"}),
    C("Resize", [r(1, 2, 4, 5), None, None, i64(1, 2, 7, 3)], {"mode": "linear"}, tag="linear"),
    C(
        "Resize",
        [r(1, 2, 4, 5), None, None, i64(1, 2, 8, 9)],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        tag="align",
    ),
    C(
        "Resize",
        [r(1, 1, 4, 4), None, np.array([1, 1, 2, 2], np.float32)],
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        },
        tag="asym",
    ),
    C(
        "Resize",
        [r(1, 1, 5, 5), None, np.array([1, 1, 1.6, 1.6], np.float32)],
        {"mode": "cubic"},
        tag="cubic",
    ),
]
# ----- recurrent ------------------------------------------------------------------------------
S, Bt, In, H = 5, 3, 4, 6
lens = np.array([5, 3, 1], np.int32)
CASES += [
    C(
        "LSTM",
        [r(S, Bt, In), r(1, 4 * H, In), r(1, 4 * H, H), r(1, 8 * H)],
        {"hidden_size": H},
        n_out=3,
    ),
    C(
        "LSTM",
        [
            r(S, Bt, In),
            r(2, 4 * H, In),
            r(2, 4 * H, H),
            r(2, 8 * H),
            lens,
            r(2, Bt, H),
            r(2, Bt, H),
            r(2, 3 * H),
        ],
        {"hidden_size": H, "direction": "bidirectional"},
        n_out=3,
        tag="bidi",
    ),
    C(
        "LSTM",
        [r(S, Bt, In), r(1, 4 * H, In), r(1, 4 * H, H)],
        {"hidden_size": H, "direction": "reverse", "input_forget": 1, "clip": 0.8},
        n_out=3,
        tag="rev-clip",
    ),
    C(
        "GRU",
        [r(S, Bt, In), r(1, 3 * H, In), r(1, 3 * H, H), r(1, 6 * H)],
        {"hidden_size": H},
        n_out=2,
    ),
    C(
        "GRU",
        [r(S, Bt, In), r(2, 3 * H, In), r(2, 3 * H, H), r(2, 6 * H), lens, r(2, Bt, H)],
        {"hidden_size": H, "direction": "bidirectional", "linear_before_reset": 1},
        n_out=2,
        tag="bidi-lbr",
    ),
    C(
        "RNN",
        [r(S, Bt, In), r(1, H, In), r(1, H, H), r(1, 2 * H), lens],
        {"hidden_size": H, "direction": "reverse"},
        n_out=2,
    ),
]
# ----- com.microsoft contrib -----------------------------------------------------------------
CASES += [
    C(
        "SkipLayerNormalization",
        [r(2, 5, 16), r(2, 5, 16), r(16), r(16), r(16)],
        {"epsilon": 1e-5},
        domain=MS,
        n_out=4,
    ),
    C("SkipLayerNormalization", [r(2, 5, 16), r(2, 5, 16), r(16)], domain=MS, tag="nobeta"),
    C(
        "SkipSimplifiedLayerNormalization",
        [r(2, 5, 16), r(2, 5, 16), r(16), r(16)],
        {"epsilon": 1e-6},
        domain=MS,
        n_out=4,
    ),
    C("Gelu", [r(3, 8, scale=2.0)], domain=MS),
    C("BiasGelu", [r(2, 3, 8), r(8)], domain=MS),
    C("FastGelu", [r(2, 3, 8), r(8)], domain=MS),
    C("FastGelu", [r(2, 3, 8)], domain=MS, tag="nobias"),
    C("QuickGelu", [r(2, 3, 8)], {"alpha": 1.5}, domain=MS),
    C("FusedMatMul", [r(2, 8, 4), r(2, 6, 8)], {"alpha": 0.5, "transA": 1, "transB": 1}, domain=MS),
    C(
        "FusedMatMul",
        [r(4, 2, 3, 8), r(2, 3, 8, 6)],
        {"transBatchA": 1},
        domain=MS,
        tag="transbatch",
    ),
    C("FusedGemm", [r(4, 8), r(8, 6), r(6)], {"activation": "Relu"}, domain=MS),
    C(
        "FusedGemm",
        [r(4, 8), r(8, 6), r(6)],
        {"activation": "LeakyRelu", "activation_alpha": 0.1},
        domain=MS,
        tag="leaky",
    ),
    C(
        "FusedConv",
        [r(1, 4, 8, 8), r(6, 4, 3, 3), r(6)],
        {"activation": "Relu", "pads": [1, 1, 1, 1]},
        domain=MS,
    ),
    C(
        "FusedConv",
        [r(1, 4, 8, 8), r(6, 4, 3, 3), r(6), r(1, 6, 8, 8)],
        {"activation": "Relu", "pads": [1, 1, 1, 1]},
        domain=MS,
        tag="sum",
    ),
    C(
        "RotaryEmbedding",
        [r(2, 5, 16), ri(0, 10, 2, 5), r(10, 4), r(10, 4)],
        {"num_heads": 2},
        domain=MS,
    ),
    C(
        "RotaryEmbedding",
        [r(2, 2, 5, 8), i64(3), r(10, 4), r(10, 4)],
        {"interleaved": 1},
        domain=MS,
        tag="4d-offset-interleaved",
    ),
    C("RotaryEmbedding", [r(2, 2, 5, 8), r(2, 5, 4), r(2, 5, 4)], opset=23, tag="onnx"),
    C(
        "FusedMatMul",
        [r(2, 3, 8, 4), r(6, 2, 3, 8)],
        {"transA": 1, "transBatchB": 1, "transB": 1},
        domain=MS,
        tag="transbatchB",
    ),
    C(
        "RotaryEmbedding",
        [r(2, 5, 16), r(10, 2), r(10, 2), ri(0, 10, 2, 5)],
        {"num_heads": 2, "rotary_embedding_dim": 4},
        opset=23,
        tag="onnx-partial",
    ),
]
