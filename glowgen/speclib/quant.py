"""Quantization: how scales and zero points broadcast, blocked parameters, the float
types the arithmetic runs in.

Each function marked @helper is callable from the specs, where specs/helpers.glowdef declares
it with its parameters."""
from __future__ import annotations

from ..engine.specrt import b_broadcastable, b_prod
from ..errors import ShapeError
from .registry import helper
from .shapes import channel_shape


@helper
def quant_param_shape(shape, param_shape, axis, block_size):
    """The shape a quantization scale or zero point takes to broadcast against a tensor of
    `shape` (ONNX QuantizeLinear / DequantizeLinear): one value -> a scalar; a vector -> one
    value per index of `axis`; with `block_size` > 0, the parameter has the tensor's rank
    and ceil(shape[axis] / block_size) entries along `axis`, each repeated block_size times."""
    shape, param_shape = tuple(shape), tuple(param_shape)
    if b_prod(param_shape) == 1 and len(param_shape) <= 1:
        return ()
    if block_size == 0:
        if len(param_shape) != 1 or axis >= len(shape) or param_shape[0] != shape[axis]:
            raise ShapeError(f"a per-axis scale or zero point must be a vector of the {shape[axis] if axis < len(shape) else '?'} "
                             f"indices of axis {axis} of {list(shape)}, got shape {list(param_shape)}")
        return channel_shape(len(shape), param_shape[0], axis)
    blocks = -(-shape[axis] // block_size)
    expected = shape[:axis] + (blocks,) + shape[axis + 1:]
    if param_shape != expected:
        raise ShapeError(f"a blocked scale or zero point for {list(shape)} with block_size {block_size} "
                         f"along axis {axis} must have shape {list(expected)}, got {list(param_shape)}")
    return shape


@helper
def quant_param_fits(shape, param_shape, axis, block_size):
    try:
        quant_param_shape(shape, param_shape, axis, block_size)
        return True
    except ShapeError:
        return False


@helper
def block_indices(size, block_size):
    """Index of the block each of `size` positions belongs to: [0]*block_size + [1]*block_size..."""
    return tuple(i // block_size for i in range(size))


@helper
def float_promote(a, b):
    """The float type NumPy computes a / b in (an integer operand takes the other's type)."""
    order = ("bf16", "f16", "f32", "f64")
    floats = [d for d in (a, b) if d in order]
    if not floats:
        return "f64"
    if set(floats) == {"bf16", "f16"}:
        return "f32"            # neither holds the other
    return max(floats, key=order.index)


@helper
def exact_float(dtype):
    """A float type wide enough to hold every value of `dtype` (an integer of up to 16 bits
    or a float) and the sums of a few of them exactly: f32, or f64 for f64 and wide integers."""
    return "f64" if dtype in ("f64", "i32", "u32", "i64", "u64") else "f32"


@helper
def param_along(param_shape, size, axis, rank):
    """The shape a scale or zero point takes to broadcast against a rank-`rank` tensor: one
    value -> a scalar; a vector of `size` values -> along dimension `axis`; a tensor of the
    full rank (MatMulInteger's [D1, D2, M, 1] form) stays as it is."""
    param_shape = tuple(param_shape)
    if b_prod(param_shape) == 1 and len(param_shape) <= 1:
        return ()
    if param_shape == (size,):
        return channel_shape(rank, size, axis)
    if len(param_shape) == rank and b_broadcastable(param_shape, channel_shape(rank, size, axis)):
        return param_shape
    raise ShapeError(f"a scale or zero point must hold one value or one per index ({size}) of "
                     f"dimension {axis}, got shape {list(param_shape)}")


@helper
def param_fits(param_shape, size, axis, rank):
    """`param_shape` (None for an absent optional parameter) fits `param_along`."""
    if param_shape is None:
        return True
    try:
        param_along(param_shape, size, axis, rank)
        return True
    except ShapeError:
        return False


@helper
def int_min(dtype):
    """The least value of integer type `dtype` (the bottom of a quantized type's range)."""
    import numpy as np
    from ..engine.types import numpy_dtype
    return int(np.iinfo(numpy_dtype(dtype)).min)


@helper
def int_max(dtype):
    import numpy as np
    from ..engine.types import numpy_dtype
    return int(np.iinfo(numpy_dtype(dtype)).max)


@helper
def accumulator(dtype):
    """The type an integer product of quantized `dtype` sums in, exactly: i32 for i8
    (products of 2^14 at most, sums of 2^17 of them), i64 for i16 (products of 2^30)."""
    return "i64" if dtype == "i16" else "i32"


@helper
def rescaled_value(value, in_scale, in_offset, scale, offset, dtype="i8"):
    """One quantized value of parameters (in_scale, in_offset) under (scale, offset), in
    `dtype`, as the Rescale kernel computes it (float32, halves to even, saturated)."""
    import numpy as np
    f32 = np.float32
    real = (f32(value) - f32(in_offset)) * (f32(in_scale) / f32(scale))
    return int(min(max(np.rint(real) + offset, int_min(dtype)), int_max(dtype)))


@helper
def items_every(onnx_input, start, step):
    """The one element of every step-th compile-time value of a variadic ONNX input from
    `start`: onnxruntime's QLinearConcat's scales (start 1, step 3) and zero points (start 2)."""
    items = []
    for i, value in enumerate(onnx_input.every(start, step).values):
        if value.size != 1:
            raise ShapeError(f"variadic input value {start + i * step} must hold one value (per-tensor "
                             f"quantization), not {value.size}")
        items.append(value.reshape(-1)[0].item())
    return items


def _centered(w, z, axis):
    """Constant weights `w` less their zero points `z` (one value, or one per index of
    `axis`), in int64."""
    import numpy as np
    data, zp = np.asarray(w.data, np.int64), np.asarray(z.data, np.int64)
    if zp.size > 1:
        shape = [1] * data.ndim
        shape[axis] = zp.size
        zp = zp.reshape(shape)
    return data - zp.reshape(()) if zp.size == 1 else data - zp


@helper
def centered_fits_i8(w, z, axis):
    """Every weight of constant `w` less its zero point (constant `z`, along `axis`) lies in
    i8's range: u8 weights around zero point 128 (onnxruntime's symmetric u8 weights), or
    of a reduced range (7 bits), are i8 weights of zero point 0 without rounding."""
    d = _centered(w, z, axis)
    return bool(d.size and d.min() >= -128 and d.max() <= 127)


@helper
def centered_i8_data(w, z, axis):
    """The data of _centered(w, z, axis) as i8 (centered_fits_i8 holds)."""
    import numpy as np
    return _centered(w, z, axis).astype(np.int8)
