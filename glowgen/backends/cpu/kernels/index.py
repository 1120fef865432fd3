"""Kernels that make tensors from attributes and indices: splat, ranges, shapes and
sizes, identity matrices and one-hot encodings."""
from __future__ import annotations

from math import prod

from ....speclib.shapes import shape_range
from ..llvmutil import for_range, i64, is_float, register_type, storage_type
from ..loops import strided_loops
from ..scalar import Value, const, store_elem
from .base import KernelArgs, kernel
from .common import lin, load_index, nest


@kernel("Splat")
def splat(k: KernelArgs):
    (y, yt) = k.outs[0]
    value = Value(const(k.attrs["value"], yt.dtype) if yt.dtype != "bool" else const(k.attrs["value"], "bool"), yt.dtype)

    def body(b, ptrs):
        store_elem(b, value, ptrs[0], yt.dtype)
    strided_loops(k.b, (yt.size,), [y], [(1,)], [0], body)


@kernel("Range")
def range_(k: KernelArgs):
    b = k.b
    (y, yt) = k.outs[0]
    a = k.attrs
    with for_range(b, yt.size) as i:
        if is_float(yt.dtype):
            v = b.fadd(const(a["start"], yt.dtype), b.fmul(b.sitofp(i, register_type(yt.dtype)), const(a["delta"], yt.dtype)))
        else:
            t = storage_type(yt.dtype)
            iv = b.trunc(i, t) if t.width < 64 else i
            v = b.add(const(int(a["start"]), yt.dtype), b.mul(iv, const(int(a["delta"]), yt.dtype)))
        store_elem(b, Value(v, yt.dtype), b.gep(y, [i]), yt.dtype)


@kernel("Shape")
def shape_of(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    _store_i64s(k.b, y, shape_range(xt.shape, k.attrs["start"], k.attrs["end"]))


@kernel("Size")
def size_of(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    _store_i64s(k.b, y, [xt.size])


def _store_i64s(b, y, values) -> None:
    """Values known at compile time, stored one by one."""
    for i, v in enumerate(values):
        b.store(i64(v), b.gep(y, [i64(i)]))


@kernel("EyeLike")
def eye_like(k: KernelArgs):
    b = k.b
    (y, yt) = k.outs[0]
    rows, cols = yt.shape
    diag = k.attrs["k"]
    one, zero = const(1, yt.dtype), const(0, yt.dtype)

    def body(idx):
        i, j = idx
        on = b.icmp_signed("==", b.sub(j, i), i64(diag))
        store_elem(b, Value(b.select(on, one, zero), yt.dtype), b.gep(y, [lin(b, idx, (cols, 1))]), yt.dtype)
    nest(b, (rows, cols), body, "eye")


@kernel("OneHot")
def one_hot(k: KernelArgs):
    b = k.b
    (y, yt), (ind, it), (vals, vt) = k.outs[0], k.ins[0], k.ins[1]
    depth = k.attrs["depth"]
    axis = k.attrs["axis"]
    axis = axis if axis >= 0 else axis + it.rank + 1
    outer, inner = prod(it.shape[:axis]), prod(it.shape[axis:])
    off_v, on_v = b.load(b.gep(vals, [i64(0)])), b.load(b.gep(vals, [i64(1)]))

    def body(idx):
        o, d, r = idx
        raw = load_index(b, b.gep(ind, [lin(b, (o, r), (inner, 1))]), it.dtype)
        fixed = b.select(b.icmp_signed("<", raw, i64(0)), b.add(raw, i64(depth)), raw)
        hot = b.icmp_signed("==", fixed, d)   # an index out of [0, depth) is hot nowhere
        b.store(b.select(hot, on_v, off_v), b.gep(y, [lin(b, idx, (depth * inner, inner, 1))]))
    nest(b, (outer, depth, inner), body, "oh")
