"""Element values in LLVM IR: `Value` (an LLVM value with its element type and, when
known, its range), constants, loads and stores in each type's memory form (booleans as
one byte, bf16 as 16 bits), and conversions between element types."""
from __future__ import annotations

import math

import numpy as np

from llvmlite import ir

from ...engine.types import numpy_dtype
from .llvmutil import F32, I1, I16, I32, intrinsic, is_float, is_signed, register_type, storage_type, type_suffix


class Value:
    """An LLVM value of element type `dtype`.  `range`, when known, is (lo, hi) bounding every
    value it can take that is not NaN: constants and what abs, neg, +, -, *, /, select,
    clamps and `increasing` scalar functions make of them.  It lets a clamp that cannot bind
    go (exp(a + a) after a = min(|x|, 9.5)) and a comparison that cannot hold fold to false,
    taking its select's other branch (tanh of a sigmoid is its polynomial alone).

    `nan_free` says that no lane can be NaN: an integer converted to float, a constant, and
    what +, -, *, / (by a divisor whose range excludes 0), min, max, select, neg, abs and
    rounding make of such values while their ranges are finite (so that no infinity meets
    another).  A quantized loop's dequantize, add and requantize then converts to i8 with no
    NaN test (`convert`)."""
    __slots__ = ("v", "dtype", "range", "nan_free")

    def __init__(self, v, dtype: str, range=None, nan_free: bool = False):
        self.v, self.dtype, self.range, self.nan_free = v, dtype, range, nan_free


def finite(rng) -> bool:
    return rng is not None and math.isfinite(rng[0]) and math.isfinite(rng[1])


def arith_nan_free(op: str, a: Value, c: Value) -> bool:
    """Whether `a op c` (fadd, fsub, fmul, fdiv) cannot be NaN: neither operand can, both are
    finite, and a divisor cannot be 0."""
    if op not in ("fadd", "fsub", "fmul", "fdiv") or not (a.nan_free and c.nan_free):
        return False
    if not (finite(a.range) and finite(c.range)):
        return False
    return op != "fdiv" or not (c.range[0] <= 0 <= c.range[1])


def interval(lo, hi):
    return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def arith_range(op: str, a, c):
    if a is None or c is None:
        return None
    if op == "fadd":
        return interval(a[0] + c[0], a[1] + c[1])
    if op == "fsub":
        return interval(a[0] - c[1], a[1] - c[0])
    if op in ("fmul", "fdiv"):
        if op == "fdiv" and c[0] <= 0 <= c[1]:
            return None                     # the divisor's range holds 0: anything goes
        products = [x * y if op == "fmul" else x / y for x in a for y in c]
        return None if any(math.isnan(p) for p in products) else (min(products), max(products))
    return None


def union_range(a, c):
    return None if a is None or c is None else (min(a[0], c[0]), max(a[1], c[1]))


def image_range(fname: str, dtype: str, rng):
    """Bounds of an increasing function over `rng`: the exact function at its ends, widened
    by more than an approximation's error (the spec's <= 2e-7) and a rounding of `dtype`."""
    if rng is None:
        return None
    from ...scalars import SCALAR_FUNCTIONS      # the exact reference functions
    slack = max(1e-6, 4 * float(np.finfo(numpy_dtype(dtype)).eps))
    with np.errstate(all="ignore"):
        lo, hi = (float(SCALAR_FUNCTIONS[fname].numpy(np.float64(v))) for v in rng)
    if math.isnan(lo) or math.isnan(hi):
        return None
    return (lo - slack * abs(lo), hi + slack * abs(hi))


def never_holds(op: str, a, c) -> bool:
    """Whether `a OP c` is false for every pair of values the ranges allow."""
    if a is None or c is None:
        return False
    if op == "lt":
        return a[0] >= c[1]
    if op == "le":
        return a[0] > c[1]
    if op == "gt":
        return a[1] <= c[0]
    if op == "ge":
        return a[1] < c[0]
    if op == "eq":
        return a[1] < c[0] or c[1] < a[0]
    return False


def known_bool(v):
    """The value of an i1 constant (scalar, or a vector with all lanes equal), else None."""
    if not isinstance(v, ir.Constant):
        return None
    lanes = v.constant if isinstance(v.constant, (list, tuple)) else [v.constant]
    bits = {bool(x.constant if isinstance(x, ir.Constant) else x) for x in lanes}
    return bits.pop() if len(bits) == 1 else None


def llvm_type(dtype: str) -> ir.Type:
    return register_type(dtype)


def const(value, dtype: str) -> ir.Constant:
    if dtype == "bool":
        return ir.Constant(I1, int(bool(value)))
    if dtype == "bf16":
        return ir.Constant(F32, float(np.float32(numpy_dtype("bf16").type(value))))
    if is_float(dtype):
        return ir.Constant(storage_type(dtype), float(value))
    info = numpy_dtype(dtype)
    return ir.Constant(storage_type(dtype), int(value) & ((1 << (info.itemsize * 8)) - 1))


def load_elem(b: ir.IRBuilder, ptr, dtype: str) -> Value:
    v = b.load(ptr)
    if dtype == "bool":
        v = b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
    elif dtype == "bf16":       # the 16 bits are the high half of the f32 of the same value
        v = b.bitcast(b.shl(b.zext(v, I32), ir.Constant(I32, 16)), F32)
    return Value(v, dtype)


def store_elem(b: ir.IRBuilder, val: Value, ptr, dtype: str) -> None:
    v = convert(b, val, dtype).v
    if dtype == "bool":
        v = b.zext(v, storage_type("bool"))
    elif dtype == "bf16":
        # Kernels that accumulate in registers (reductions, matrix products) hand over f32
        # values tagged bf16: rounding here is exact for values already rounded.
        v = b.trunc(b.lshr(bf16_rounded_bits(b, v), ir.Constant(I32, 16)), I16)
    b.store(v, ptr)


def bf16_rounded_bits(b: ir.IRBuilder, v) -> ir.Value:
    """The bits of f32 `v` rounded to bfloat16 (nearest, ties to even) in the high half, the
    low half zero.  NaN stays a (quiet) NaN rather than rounding into infinity."""
    lanes = v.type.count if isinstance(v.type, ir.VectorType) else None
    it = ir.VectorType(I32, lanes) if lanes else I32

    def c(n):                   # an i32 constant, splat across the lanes of a vector
        return ir.Constant(it, [ir.Constant(I32, n)] * lanes) if lanes else ir.Constant(I32, n)
    bits = b.bitcast(v, it)
    lsb = b.and_(b.lshr(bits, c(16)), c(1))
    rounded = b.add(bits, b.add(c(0x7FFF), lsb))
    quiet_nan = b.or_(bits, c(0x00400000))
    is_nan = b.fcmp_unordered("uno", v, v)
    return b.and_(b.select(is_nan, quiet_nan, rounded), c(0xFFFF0000))


def round_to_bf16(b: ir.IRBuilder, v) -> ir.Value:
    """f32 `v` (a scalar or a vector) rounded to the nearest bfloat16 value, still as f32."""
    return b.bitcast(bf16_rounded_bits(b, v), v.type)


def convert(b: ir.IRBuilder, x: Value, dtype: str) -> Value:
    """NumPy `astype` semantics (float -> int saturates instead of being undefined), of a
    scalar or of each lane of a vector."""
    src, dst = x.dtype, dtype
    if src == dst:
        return x
    if src == "bf16":           # in registers a bf16 is the f32 of the same value
        return convert(b, Value(x.v, "f32"), dst)
    if dst == "bf16":
        wide = convert(b, x, "f32")
        return Value(round_to_bf16(b, wide.v), "bf16")
    v = x.v
    if dst == "bool":
        if is_float(src):
            return Value(b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0)), "bool")
        return Value(b.icmp_unsigned("!=", v, ir.Constant(v.type, 0)), "bool")
    t, e = storage_type(dst), _element(v.type)      # the element types: result, operand

    def lanes(ty):              # `ty`, or vectors of it as wide as v
        return ir.VectorType(ty, v.type.count) if isinstance(v.type, ir.VectorType) else ty
    if src == "bool":
        if is_float(dst):
            return Value(b.uitofp(v, lanes(t)), dst, (0.0, 1.0), nan_free=True)
        return Value(b.zext(v, lanes(t)), dst)
    if is_float(src) and is_float(dst):
        widen = float_bits(t) > float_bits(e)
        if not widen and float_bits(t) == 16 and float_bits(e) == 64:
            # double -> half would need a compiler-rt call the JIT does not have: go via float.
            v = b.fptrunc(v, lanes(F32))
        if widen:
            return Value(b.fpext(v, lanes(t)), dst, x.range, x.nan_free)
        return Value(b.fptrunc(v, lanes(t)), dst, nan_free=x.nan_free)     # may round to infinity
    if is_float(src):
        name = "fptosi.sat" if is_signed(dst) else "fptoui.sat"
        if t.width >= 32:
            fn = intrinsic(b.module, f"llvm.{name}.{type_suffix(lanes(t))}.{type_suffix(v.type)}", lanes(t), [v.type])
            return Value(b.call(fn, [v]), dst)
        # To 8 or 16 bits: clamp in float (NaN to 0), convert exactly, truncate.  The same
        # values as fptosi.sat; but LLVM scalarizes a vector fptosi.sat (one conversion per
        # lane), and this is a quantized model's every requantizing loop.
        if float_bits(e) == 16:      # 65535 is no half: clamp in f32
            v = b.fpext(v, lanes(F32))
        if is_signed(dst):
            lo, hi = -(1 << (t.width - 1)), (1 << (t.width - 1)) - 1
        else:
            lo, hi = 0, (1 << t.width) - 1
        flo, fhi, zero = (ir.Constant(v.type, float(c)) for c in (lo, hi, 0))
        c = b.select(b.fcmp_ordered("<", v, flo), flo, v)
        c = b.select(b.fcmp_ordered(">", c, fhi), fhi, c)
        if not x.nan_free:
            c = b.select(b.fcmp_unordered("uno", v, v), zero, c)
        return Value(b.trunc(b.fptosi(c, lanes(ir.IntType(32))), lanes(t)), dst)
    if is_float(dst):
        return Value(b.sitofp(v, lanes(t)) if is_signed(src) else b.uitofp(v, lanes(t)), dst,
                     _exact_range(x, src, dst), nan_free=True)
    if t.width > e.width:
        return Value(b.sext(v, lanes(t)) if is_signed(src) else b.zext(v, lanes(t)), dst)
    if t.width < e.width:
        return Value(b.trunc(v, lanes(t)), dst)
    return Value(v, dst)


def _element(ty: ir.Type) -> ir.Type:
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _exact_range(x: Value, src: str, dst: str):
    """The range of integer x converted to float `dst`, where every value of `src` converts
    exactly (to f32 from 16 bits at most, to f64 from 32): its own, else its type's."""
    bits = np.dtype(numpy_dtype(src)).itemsize * 8
    if not ((dst == "f32" and bits <= 16) or (dst == "f64" and bits <= 32)):
        return None
    if x.range is not None:
        return (float(x.range[0]), float(x.range[1]))
    info = np.iinfo(numpy_dtype(src))
    return (float(info.min), float(info.max))


def float_bits(t) -> int:
    return {ir.HalfType: 16, ir.FloatType: 32, ir.DoubleType: 64}[type(t)]


def float_tag(t) -> str:
    return {ir.HalfType: "f16", ir.FloatType: "f32", ir.DoubleType: "f64"}[type(t)]
