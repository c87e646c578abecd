"""Conversions between ONNX type/tensor protos and IR dtypes, shapes and NumPy constants.

Element types the IR's :class:`DType` does not name (float8, int4, float4 ...) are kept as the
ONNX enum number in ``Value.meta["onnx_elem_type"]``. Tensors whose element type NumPy cannot
compute with natively (bfloat16, float8, int4 ...) are exposed as a losslessly up-cast, read-only
array (float32, or int8/uint8 for the small integer types) and the original ``TensorProto`` is
kept in ``meta["onnx_tensor"]``; it is written back untouched as long as the constant array is
the same object.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, TypeProto, ValueInfoProto, helper, numpy_helper

from graph_autofusion.ir.core import Shape, Value
from graph_autofusion.ir.dtypes import DType

_DTYPE_VALUES = {int(d) for d in DType}
# Element types NumPy holds only through ml_dtypes: upcast target for the IR constant.
_SMALL_INT = {TensorProto.INT4, TensorProto.UINT4}
for _name in ("INT2", "UINT2"):
    if hasattr(TensorProto, _name):
        _SMALL_INT.add(getattr(TensorProto, _name))
_NATIVE_NUMPY = {int(d) for d in DType if d not in (DType.UNDEFINED, DType.BFLOAT16)}


def dtype_of(elem_type: int) -> DType | None:
    """IR dtype for an ONNX element type, ``None`` if the IR has no name for it."""
    return DType(elem_type) if elem_type in _DTYPE_VALUES and elem_type != 0 else None


def elem_type_of(value: Value) -> int | None:
    """ONNX element type of ``value`` (from ``dtype`` or ``meta["onnx_elem_type"]``)."""
    if value.dtype is not None:
        return int(value.dtype)
    return value.meta.get("onnx_elem_type")


def shape_of(tensor_type: Any) -> Shape | None:
    """IR shape of a ``TypeProto.Tensor``: int, ``str`` (symbolic) or ``None`` dims."""
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for d in tensor_type.shape.dim:
        which = d.WhichOneof("value")
        if which == "dim_value":
            dims.append(int(d.dim_value))
        elif which == "dim_param":
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def apply_type(value: Value, type_proto: TypeProto) -> None:
    """Set ``value.dtype``/``shape`` from a TypeProto; non-tensor types are kept raw in meta."""
    if type_proto.WhichOneof("value") != "tensor_type":
        if type_proto.WhichOneof("value") is not None:
            value.meta["onnx_type"] = type_proto
        return
    tt = type_proto.tensor_type
    if tt.elem_type:
        value.dtype = dtype_of(tt.elem_type)
        if value.dtype is None:
            value.meta["onnx_elem_type"] = int(tt.elem_type)
    shape = shape_of(tt)
    if shape is not None:
        value.shape = shape


def make_value_info(value: Value) -> ValueInfoProto:
    """ValueInfoProto describing ``value`` (reuses the imported proto if its type is unchanged)."""
    snap = value.meta.get("onnx_value_info")
    if snap is not None and snap[1] == value.dtype and snap[2] == value.shape:
        vi = ValueInfoProto()
        vi.CopyFrom(snap[0])
        vi.name = value.name
        return vi
    vi = ValueInfoProto(name=value.name)
    if value.doc:
        vi.doc_string = value.doc
    elem = elem_type_of(value)
    if elem is None:
        raw = value.meta.get("onnx_type")
        if raw is not None:
            vi.type.CopyFrom(raw)
        return vi
    tt = vi.type.tensor_type
    tt.elem_type = elem
    if value.shape is not None:
        shp = tt.shape
        shp.SetInParent()
        for d in value.shape:
            dim = shp.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            elif d is not None:
                dim.dim_value = int(d)
    return vi


def remember_value_info(value: Value, vi: ValueInfoProto) -> None:
    """Keep ``vi`` so export can reuse it verbatim while dtype and shape stay unchanged."""
    value.meta["onnx_value_info"] = (vi, value.dtype, value.shape)


def tensor_to_array(tensor: TensorProto) -> tuple[np.ndarray, bool]:
    """NumPy array for ``tensor``; second item is True when the array is an up-cast copy."""
    arr = numpy_helper.to_array(tensor)
    if tensor.data_type in _NATIVE_NUMPY:
        return arr, False
    if tensor.data_type in _SMALL_INT:
        up = arr.astype(np.uint8 if arr.dtype.name.startswith("u") else np.int8)
    else:
        up = arr.astype(np.float32)
    up.setflags(write=False)
    return up, True


def array_to_tensor(arr: np.ndarray, name: str, elem_type: int | None) -> TensorProto:
    """TensorProto holding ``arr`` with ONNX element type ``elem_type`` (cast if needed)."""
    arr = np.asarray(arr)
    if elem_type is not None and elem_type not in _NATIVE_NUMPY and elem_type != 0:
        arr = arr.astype(helper.tensor_dtype_to_np_dtype(elem_type))
    elif elem_type is not None and elem_type != 0:
        want = helper.tensor_dtype_to_np_dtype(elem_type)
        if arr.dtype != want and not (arr.dtype == object and elem_type == TensorProto.STRING):
            arr = arr.astype(want)
    if arr.dtype == object:
        arr = np.vectorize(lambda s: s.encode() if isinstance(s, str) else s, otypes=[object])(arr)
    return numpy_helper.from_array(arr, name)


def tensor_for_value(value: Value) -> TensorProto:
    """Initializer TensorProto for a constant value; reuses the imported proto when unchanged."""
    raw = value.meta.get("onnx_tensor")
    if raw is not None and value.const is value.meta.get("onnx_tensor_const"):
        if raw.name != value.name:
            raw = _copy(raw)
            raw.name = value.name
        return raw
    assert value.const is not None
    t = array_to_tensor(value.const, value.name, elem_type_of(value))
    if value.doc:
        t.doc_string = value.doc
    return t


def _copy(proto: Any) -> Any:
    new = type(proto)()
    new.CopyFrom(proto)
    return new


def sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    """Dense NumPy array for a SparseTensorProto (COO, linear or per-dim indices)."""
    values, _ = tensor_to_array(sp.values)
    dims = tuple(int(d) for d in sp.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if values.size:
        idx = numpy_helper.to_array(sp.indices).astype(np.int64)
        flat = dense.reshape(-1)
        if idx.ndim == 1:
            flat[idx] = values.reshape(-1)
        else:
            flat[np.ravel_multi_index(tuple(idx.T), dims)] = values.reshape(-1)
    dense.setflags(write=False)
    return dense


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: building 100k-node graphs otherwise triggers repeated full scans."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
