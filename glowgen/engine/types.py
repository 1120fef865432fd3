"""Element types and tensor types: the strong typing every value in a graph carries."""
from __future__ import annotations

from typing import Optional

import attrs
import ml_dtypes
import numpy as np

from ..errors import ShapeError

# Element type names used everywhere (specs, textual IR, error messages).
# Order matters only for printing the supported list.
_NUMPY = {
    "f32": np.float32, "f16": np.float16, "f64": np.float64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "bool": np.bool_,
    # bfloat16: 16-bit storage, computed by widening to f32 and rounding back to nearest
    # even (NumPy has no bfloat16; ml_dtypes, which onnx depends on, provides it).
    "bf16": ml_dtypes.bfloat16,
}
DTYPES = tuple(_NUMPY)
FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")
INT_DTYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")

_FROM_NUMPY = {np.dtype(v): k for k, v in _NUMPY.items()}


def numpy_dtype(dtype: str) -> np.dtype:
    return np.dtype(_NUMPY[dtype])


def dtype_of(array_or_dtype) -> str:
    """The element type name of a NumPy array or dtype."""
    dt = np.dtype(getattr(array_or_dtype, "dtype", array_or_dtype))
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise ShapeError(f"element type {dt} is not supported; supported: {', '.join(DTYPES)}") from None


def _f32(x) -> float:
    return float(np.float32(x))


@attrs.frozen
class Quant:
    """Quantization parameters of an integer element type: an element q stands for the real
    number scale * (q - offset) (Glow's convention; ONNX calls the offset the zero point).
    The scale is a float32 value, as the kernels compute with it."""
    scale: float = attrs.field(converter=_f32)
    offset: int = attrs.field(converter=int)

    def __str__(self) -> str:
        return f"q({str(np.float32(self.scale))}, {self.offset})"


def _to_shape(dims) -> tuple[int, ...]:
    return tuple(int(d) for d in dims)


@attrs.frozen
class Type:
    """The type of a tensor value: element type, static shape, optional quantization."""
    dtype: str
    shape: tuple[int, ...] = attrs.field(converter=_to_shape)
    quant: Optional[Quant] = None

    def __attrs_post_init__(self):
        if self.dtype not in _NUMPY:
            raise ShapeError(f"unknown element type {self.dtype!r}; supported: {', '.join(DTYPES)}")
        if any(d < 0 for d in self.shape):
            raise ShapeError(f"negative dimension in shape {list(self.shape)}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * numpy_dtype(self.dtype).itemsize

    @property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    def with_shape(self, shape) -> "Type":
        return Type(self.dtype, shape, self.quant)

    def with_quant(self, quant: Optional[Quant]) -> "Type":
        return Type(self.dtype, self.shape, quant)

    def __str__(self) -> str:
        text = f"{self.dtype}[{', '.join(map(str, self.shape))}]"
        return f"{text} {self.quant}" if self.quant is not None else text

    @classmethod
    def of(cls, array: np.ndarray) -> "Type":
        return cls(dtype_of(array), array.shape)


# ONNX TensorProto.DataType codes of the element types above (ONNX's numbering).
ONNX_CODES = {"f32": 1, "u8": 2, "i8": 3, "u16": 4, "i16": 5, "i32": 6, "i64": 7,
              "bool": 9, "f16": 10, "f64": 11, "u32": 12, "u64": 13,
              "bf16": 16}
_FROM_ONNX = {v: k for k, v in ONNX_CODES.items()}


def dtype_from_onnx(code: int) -> str:
    try:
        return _FROM_ONNX[code]
    except KeyError:
        import onnx
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else code
        from ..errors import UnsupportedError
        raise UnsupportedError(f"ONNX element type {name} is not supported; supported: "
                               f"{', '.join(ONNX_CODES)}") from None
