"""Loop and index helpers the kernels of several domains share.

Indices read from tensors at run time are never trusted: a gather clamps an out-of-range
index into the dimension, a scatter skips an update whose index is out of range, so native
code never reads or writes outside a buffer on bad data.
"""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ..llvmutil import I1, for_range, i64, is_float, storage_type
from ..loops import strided_loops
from ..parallel import WHOLE
from ..scalar import Value, convert, load_elem, store_elem

TRUE = ir.Constant(I1, 1)


def nest(b, shape, body, name="l"):
    """Nested counted loops over `shape`; `body(indices)` in the innermost one."""
    idx: list = []

    def level(d):
        if d == len(shape):
            body(list(idx))
            return
        with for_range(b, shape[d], name=f"{name}{d}") as i:
            idx.append(i)
            level(d + 1)
            idx.pop()
    level(0)


def lin(b, idx, strides, base=None):
    """base + sum(idx[i] * strides[i]) as an i64 offset."""
    off = base if base is not None else i64(0)
    for i, s in zip(idx, strides):
        if s == 1:
            off = b.add(off, i)
        elif s:
            off = b.add(off, b.mul(i, i64(s)))
    return off


def load_index(b, ptr, dtype):
    return convert(b, load_elem(b, ptr, dtype), "i64").v


def normalize_index(b, raw, dim):
    """A negative index counts from the end; returns (index, 0 <= index < dim)."""
    fixed = b.select(b.icmp_signed("<", raw, i64(0)), b.add(raw, i64(dim)), raw)
    ok = b.and_(b.icmp_signed(">=", fixed, i64(0)), b.icmp_signed("<", fixed, i64(dim)))
    return fixed, ok


def clamped_index(b, raw, dim):
    """A run-time index wrapped once and clamped into [0, dim): never out of bounds."""
    fixed, ok = normalize_index(b, raw, dim)
    fixed = b.select(b.icmp_signed("<", fixed, i64(0)), i64(0), fixed)
    return b.select(b.icmp_signed(">=", fixed, i64(dim)), i64(dim - 1), fixed)


def clamp(b, v, lo, hi):
    """The i64 value v clamped into [lo, hi] (i64 values)."""
    v = b.select(b.icmp_signed("<", v, lo), lo, v)
    return b.select(b.icmp_signed(">", v, hi), hi, v)


def copy_elements(b, dst, src, n):
    strided_loops(b, (n,), [src, dst], [(1,), (1,)], [0, 0],
                  lambda bb, ps: bb.store(bb.load(ps[0]), ps[1]), name="cp")


def zero_of(dtype):
    """Zero in `dtype`'s storage form (a bf16 zero is the 16-bit pattern 0)."""
    t = storage_type(dtype)
    return ir.Constant(t, 0 if isinstance(t, ir.IntType) else 0.0)


def fill(b, ptr, n, value: Value, dtype):
    strided_loops(b, (n,), [ptr], [(1,)], [0], lambda bb, ps: store_elem(bb, value, ps[0], dtype),
                  name="fill")


def split_axis(shape, axis):
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def inside(b, coords, sizes):
    """0 <= coords[i] < sizes[i] for every i, as an i1."""
    ok = TRUE
    for c, s in zip(coords, sizes):
        ok = b.and_(ok, b.and_(b.icmp_signed(">=", c, i64(0)), b.icmp_signed("<", c, i64(s))))
    return ok


def copy_loops(b, shape, src, src_map, src_off, dst, dst_map, dst_off, split=WHOLE):
    """dst[dst_map . i + dst_off] = src[src_map . i + src_off] over `shape` (a `split`'s
    share of its outermost loop)."""
    def body(bb, ptrs):
        bb.store(bb.load(ptrs[0]), ptrs[1])
    strided_loops(b, shape, [src, dst], [src_map, dst_map], [src_off, dst_off], body, split=split)


def extreme(which: str, dtype: str):
    """The lowest ("-inf") or highest ("inf") value of `dtype`: infinities for floats, the
    integer limits otherwise (the identities of max and min)."""
    if is_float(dtype):
        return float(which)
    import numpy as np
    from ....engine.types import numpy_dtype
    info = np.iinfo(numpy_dtype(dtype))
    return info.min if which == "-inf" else info.max
