"""Gathers and scatters: reads and writes at indices found in a tensor at run time.

Those indices are never trusted: a gather clamps an out-of-range index into its dimension,
a scatter skips an update whose index is out of range, so native code never reads or
writes outside a buffer on bad data.
"""
from __future__ import annotations

from math import prod

from ..llvmutil import I64, for_range, i64
from ..loops import contiguous_strides
from ..scalar import ScalarEmitter, Value, load_elem, store_elem
from ..parallel import Work, parallel
from .base import KernelArgs, kernel
from .common import TRUE, clamped_index, copy_elements, lin, load_index, nest, normalize_index


@kernel("Gather")
def gather(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt), (idx, it) = k.outs[0], k.ins[0], k.ins[1]
    axis = k.attrs["axis"]
    n_outer = 1
    for d in xt.shape[:axis]:
        n_outer *= d
    inner = 1
    for d in xt.shape[axis + 1:]:
        inner *= d
    dim = xt.shape[axis]
    n_idx = it.size
    lo, hi = k.split.range(b, n_outer)          # a split task's outer rows (gather_work)
    with for_range(b, hi, start=lo, name="o") as o:
        with for_range(b, n_idx, name="j") as j:
            raw = b.load(b.gep(idx, [j]))
            raw = b.sext(raw, I64) if raw.type.width < 64 else raw
            neg = b.icmp_signed("<", raw, i64(0))
            fixed = b.select(neg, b.add(raw, i64(dim)), raw)
            # Out-of-range indices are clamped: native code never reads outside a buffer.
            fixed = b.select(b.icmp_signed("<", fixed, i64(0)), i64(0), fixed)
            fixed = b.select(b.icmp_signed(">=", fixed, i64(dim)), i64(dim - 1), fixed)
            src = b.add(b.mul(o, i64(dim * inner)), b.mul(fixed, i64(inner)))
            dst = b.add(b.mul(o, i64(n_idx * inner)), b.mul(j, i64(inner)))
            with for_range(b, inner, name="r") as r:
                b.store(b.load(b.gep(x, [b.add(src, r)])), b.gep(y, [b.add(dst, r)]))


@parallel("Gather")
def gather_work(node, shape, ins) -> Work:
    """A gather shares out the rows before its axis (a nearest resize's planes)."""
    x_shape = node.inputs[0].type.shape
    return Work(prod(x_shape[:node.attr_values()["axis"]]),
                elements=prod(node.outputs[0].type.shape))


@kernel("GatherElements")
def gather_elements(k: KernelArgs):
    """Out-of-range indices are clamped into the axis: no read outside x."""
    b = k.b
    (y, yt), (x, xt), (ind, it) = k.outs[0], k.ins[0], k.ins[1]
    axis = k.attrs["axis"]
    dim = xt.shape[axis]
    if yt.size == 0 or dim == 0:
        return
    xs = contiguous_strides(xt.shape)
    qs = contiguous_strides(it.shape)

    def body(idx):
        q = lin(b, idx, qs)
        j = clamped_index(b, load_index(b, b.gep(ind, [q]), it.dtype), dim)
        src = lin(b, [i for d, i in enumerate(idx) if d != axis],
                   [s for d, s in enumerate(xs) if d != axis], b.mul(j, i64(xs[axis])))
        b.store(b.load(b.gep(x, [src])), b.gep(y, [q]))
    nest(b, it.shape, body, "ge")


@kernel("GatherND")
def gather_nd(k: KernelArgs):
    """Every index of a tuple is clamped into its dimension: no read outside x."""
    b = k.b
    (y, yt), (x, xt), (ind, it) = k.outs[0], k.ins[0], k.ins[1]
    bd = k.attrs["batch_dims"]
    last = it.shape[-1]
    n_batch = prod(xt.shape[:bd])
    n_tuples = prod(it.shape[bd:-1])
    inner = prod(xt.shape[bd + last:])
    xs = contiguous_strides(xt.shape)
    dims = xt.shape[bd:bd + last]
    if yt.size == 0 or any(d == 0 for d in dims):
        return
    x_batch = prod(xt.shape[bd:])

    def body(idx):
        bi, t = idx
        row = b.add(b.mul(bi, i64(n_tuples)), t)
        src = b.mul(bi, i64(x_batch))
        for j in range(last):
            raw = load_index(b, b.gep(ind, [b.add(b.mul(row, i64(last)), i64(j))]), it.dtype)
            src = b.add(src, b.mul(clamped_index(b, raw, dims[j]), i64(xs[bd + j])))
        dst = b.mul(row, i64(inner))
        with for_range(b, inner, name="gn.r") as r:
            b.store(b.load(b.gep(x, [b.add(src, r)])), b.gep(y, [b.add(dst, r)]))
    nest(b, (n_batch, n_tuples), body, "gn")


# --------------------------------------------------------------------------- scatters
def _combine(k, reduction, dtype):
    if reduction == "none":
        return None
    name = {"add": "f_add", "mul": "f_mul", "max": "f_max", "min": "f_min"}[reduction]

    def apply(b, old: Value, new: Value) -> Value:
        return getattr(ScalarEmitter(b, k.scalars), name)(old, new)
    return apply


def _scatter_store(k, b, src_ptr, dst_ptr, dtype, combine):
    if combine is None:
        b.store(b.load(src_ptr), dst_ptr)
    else:
        store_elem(b, combine(b, load_elem(b, dst_ptr, dtype), load_elem(b, src_ptr, dtype)), dst_ptr, dtype)


@kernel("ScatterElements")
def scatter_elements(k: KernelArgs):
    """An update whose index falls outside the axis is skipped: no write outside y."""
    b = k.b
    (y, yt), (x, xt), (ind, it), (upd, ut) = k.outs[0], k.ins[0], k.ins[1], k.ins[2]
    axis = k.attrs["axis"]
    combine = _combine(k, k.attrs["reduction"], yt.dtype)
    copy_elements(b, y, x, yt.size)
    dim = xt.shape[axis]
    ys = contiguous_strides(yt.shape)
    qs = contiguous_strides(it.shape)

    def body(idx):
        q = lin(b, idx, qs)
        j, ok = normalize_index(b, load_index(b, b.gep(ind, [q]), it.dtype), dim)
        with b.if_then(ok):
            dst = lin(b, [i for d, i in enumerate(idx) if d != axis],
                       [s for d, s in enumerate(ys) if d != axis], b.mul(j, i64(ys[axis])))
            _scatter_store(k, b, b.gep(upd, [q]), b.gep(y, [dst]), yt.dtype, combine)
    nest(b, it.shape, body, "se")


@kernel("ScatterND")
def scatter_nd(k: KernelArgs):
    """An update whose index tuple falls outside x is skipped: no write outside y."""
    b = k.b
    (y, yt), (x, xt), (ind, it), (upd, ut) = k.outs[0], k.ins[0], k.ins[1], k.ins[2]
    combine = _combine(k, k.attrs["reduction"], yt.dtype)
    copy_elements(b, y, x, yt.size)
    last = it.shape[-1]
    n_tuples = prod(it.shape[:-1])
    inner = prod(xt.shape[last:])
    ys = contiguous_strides(yt.shape)
    with for_range(b, n_tuples, name="sn") as t:
        dst, ok = i64(0), TRUE
        for j in range(last):
            raw = load_index(b, b.gep(ind, [b.add(b.mul(t, i64(last)), i64(j))]), it.dtype)
            fixed, in_range = normalize_index(b, raw, xt.shape[j])
            ok = b.and_(ok, in_range)
            dst = b.add(dst, b.mul(fixed, i64(ys[j])))
        with b.if_then(ok):
            src = b.mul(t, i64(inner))
            with for_range(b, inner, name="sn.r") as r:
                _scatter_store(k, b, b.gep(upd, [b.add(src, r)]), b.gep(y, [b.add(dst, r)]),
                               yt.dtype, combine)
