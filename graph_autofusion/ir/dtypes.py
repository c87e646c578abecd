"""Element types of IR values, keyed by ONNX's TensorProto enum so both frontends share one set."""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.IntEnum):
    """Element type. Values equal ONNX ``TensorProto.DataType`` numbers."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16

    @property
    def short(self) -> str:
        """Short name used by the text form (``f32``, ``i64`` ...)."""
        return _SHORT[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element (strings count as 8, a pointer)."""
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16)

    def to_numpy(self) -> np.dtype:
        """NumPy dtype; bfloat16 is computed as float32 by the reference interpreter."""
        if self == DType.BFLOAT16:
            return np.dtype(np.float32)
        if self not in _TO_NUMPY:
            raise TypeError(f"dtype {self.name} has no NumPy equivalent")
        return np.dtype(_TO_NUMPY[self])

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> DType:
        d = np.dtype(dtype)
        for k, v in _TO_NUMPY.items():
            if np.dtype(v) == d:
                return k
        raise TypeError(f"NumPy dtype {d} has no IR equivalent")

    @staticmethod
    def from_short(name: str) -> DType:
        for k, v in _SHORT.items():
            if v == name:
                return k
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(_SHORT.values())}")


_SHORT = {
    DType.UNDEFINED: "undef",
    DType.FLOAT: "f32",
    DType.UINT8: "u8",
    DType.INT8: "i8",
    DType.UINT16: "u16",
    DType.INT16: "i16",
    DType.INT32: "i32",
    DType.INT64: "i64",
    DType.STRING: "str",
    DType.BOOL: "bool",
    DType.FLOAT16: "f16",
    DType.DOUBLE: "f64",
    DType.UINT32: "u32",
    DType.UINT64: "u64",
    DType.COMPLEX64: "c64",
    DType.COMPLEX128: "c128",
    DType.BFLOAT16: "bf16",
}
_ITEMSIZE = {
    DType.UNDEFINED: 0,
    DType.FLOAT: 4,
    DType.UINT8: 1,
    DType.INT8: 1,
    DType.UINT16: 2,
    DType.INT16: 2,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.STRING: 8,
    DType.BOOL: 1,
    DType.FLOAT16: 2,
    DType.DOUBLE: 8,
    DType.UINT32: 4,
    DType.UINT64: 8,
    DType.COMPLEX64: 8,
    DType.COMPLEX128: 16,
    DType.BFLOAT16: 2,
}
_TO_NUMPY = {
    DType.FLOAT: np.float32,
    DType.UINT8: np.uint8,
    DType.INT8: np.int8,
    DType.UINT16: np.uint16,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT64: np.int64,
    DType.STRING: np.object_,
    DType.BOOL: np.bool_,
    DType.FLOAT16: np.float16,
    DType.DOUBLE: np.float64,
    DType.UINT32: np.uint32,
    DType.UINT64: np.uint64,
    DType.COMPLEX64: np.complex64,
    DType.COMPLEX128: np.complex128,
}
