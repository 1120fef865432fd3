"""Kernels that move elements without computing on them: transpose, broadcast, reshape,
concatenation, slicing, splitting, triangles and padding."""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ..llvmutil import F32, for_range, i64
from ..loops import broadcast_strides, collapse, contiguous_strides, loop_work, strided_loops
from ..parallel import Work, parallel
from ..scalar import Value, const, store_elem
from ..vectors import f32_vector, join_vectors, vload, vstore
from .base import KernelArgs, kernel
from .common import copy_loops, nest, split_axis, zero_of


def _transpose_maps(x_shape, y_shape, perm):
    xs = contiguous_strides(x_shape)
    return [xs[p] for p in perm], contiguous_strides(y_shape)


@kernel("Transpose")
def transpose(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    x_map, y_map = _transpose_maps(xt.shape, yt.shape, k.attrs["perm"])
    four_bytes = yt.size and yt.nbytes == 4 * yt.size
    lanes = k.gemm_shape.vw if k.gemm_shape is not None and four_bytes else 0
    loops = _interleaved(yt.shape, x_map, y_map, lanes)
    if loops is not None:
        return _interleave(k.b, *loops, x, y, lanes, k.split)
    copy_loops(k.b, yt.shape, x, x_map, 0, y, y_map, 0, split=k.split)


# The output's innermost dimension is short and read across the input, the one outside it
# contiguously: a pixel shuffle ([M, H, s, W, s] from [s, s, M, H, W]).  Element by element,
# each load and store moves one value; instead, a vector from each of the f input rows is
# loaded and the f vectors are interleaved in registers into f contiguous output vectors
# (4-byte elements, moved as f32 bits: loads, shuffles and stores change no bit).
MAX_INTERLEAVE = 4


def _interleaved(shape, x_map, y_map, lanes: int):
    """(collapsed shape, x map, y map) of a transpose whose last collapsed output
    dimension (f <= MAX_INTERLEAVE values) interleaves f input rows read with unit stride,
    at least a vector long; None otherwise."""
    if lanes < 2:
        return None
    shape, (xm, ym) = collapse(shape, [x_map, y_map])
    if len(shape) < 2:
        return None
    n, f = shape[-2], shape[-1]
    if 2 <= f <= MAX_INTERLEAVE and ym[-1] == 1 and ym[-2] == f and xm[-2] == 1 and xm[-1] != 1 and n >= lanes:
        return shape, xm, ym
    return None


def _interleave(b, shape, xm, ym, x, y, lanes: int, split) -> None:
    """y[..., w, r] = x[..., r, w] over the last two dimensions (n, f), `lanes` values of w
    at a time; a split shares out the outermost loop."""
    n, f = shape[-2], shape[-1]
    x, y = b.bitcast(x, F32.as_pointer()), b.bitcast(y, F32.as_pointer())
    # Output lane j is lane j // f of input row j % f: the rows (padded to a power of two
    # with undefined vectors) joined pairwise, then one shuffle picks.
    mask = ir.Constant(ir.VectorType(ir.IntType(32), f * lanes), [(j % f) * lanes + j // f for j in range(f * lanes)])
    undef = ir.Constant(f32_vector(lanes), ir.Undefined)

    def block(xoff, yoff, w, valid=None):
        vs = [vload(b, b.gep(x, [b.add(b.add(xoff, i64(r * xm[-1])), w)]), lanes, valid) for r in range(f)]
        vs += [undef] * ((2 if f == 2 else 4) - f)
        joined = join_vectors(b, vs)
        out = b.shuffle_vector(joined, ir.Constant(joined.type, ir.Undefined), mask)
        vstore(b, out, b.gep(y, [b.add(yoff, b.mul(w, i64(f)))]), f * lanes, None if valid is None else f * valid)

    def rows(xoff, yoff, lo, hi):
        """Whole vectors from lo while they fit before hi; then the rest one by one."""
        with for_range(b, b.sub(hi, i64(lanes - 1)), start=lo, step=lanes, name="ilv") as w:
            block(xoff, yoff, w)
        done = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), i64(lanes)), i64(lanes)))
        with for_range(b, hi, start=done, name="ilt") as w:
            for r in range(f):
                b.store(b.load(b.gep(x, [b.add(b.add(xoff, i64(r * xm[-1])), w)])),
                        b.gep(y, [b.add(b.add(yoff, b.mul(w, i64(f))), i64(r))]))

    def whole_rows(xoff, yoff):
        """All n: whole vectors, then one masked vector (n is a compile-time constant)."""
        with for_range(b, n - lanes + 1, step=lanes, name="ilv") as w:
            block(xoff, yoff, w)
        if n % lanes:
            block(xoff, yoff, i64(n - n % lanes), n % lanes)

    if len(shape) == 2:
        if split.whole:
            whole_rows(i64(0), i64(0))
        else:
            rows(i64(0), i64(0), *split.range(b, n))
        return

    def level(d, xoff, yoff):
        if d == len(shape) - 2:
            whole_rows(xoff, yoff)
            return
        lo, hi = split.range(b, shape[0]) if d == 0 else (i64(0), i64(shape[d]))
        with for_range(b, hi, start=lo, name=f"ilo{d}") as i:
            level(d + 1, b.add(xoff, b.mul(i, i64(xm[d]))), b.add(yoff, b.mul(i, i64(ym[d]))))
    level(0, i64(0), i64(0))


@parallel("Transpose")
def transpose_work(node, shape, ins) -> Work:
    """A large transpose (a pixel shuffle) shares out its outermost loop."""
    x_shape, y_shape = node.inputs[0].type.shape, node.outputs[0].type.shape
    return loop_work(y_shape, _transpose_maps(x_shape, y_shape, node.attr_values()["perm"]))


@kernel("Expand")
def expand(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    copy_loops(k.b, yt.shape, x, broadcast_strides(xt.shape, yt.shape), 0, y,
               contiguous_strides(yt.shape), 0)


@kernel("Reshape")
def reshape(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    copy_loops(k.b, (yt.size,), x, (1,), 0, y, (1,), 0)


@kernel("Concat")
def concat(k: KernelArgs):
    (y, yt) = k.outs[0]
    axis = k.attrs["axis"]
    ys = contiguous_strides(yt.shape)
    at = 0
    for x, xt in k.ins[0]:     # a split task copies its share of each input
        copy_loops(k.b, xt.shape, x, contiguous_strides(xt.shape), 0, y, ys, at * ys[axis],
                   split=k.split)
        at += xt.shape[axis]


@parallel("Concat")
def concat_work(node, shape, ins) -> Work:
    """A large concatenation shares out each input's copy loop."""
    y_shape = node.outputs[0].type.shape
    ys = contiguous_strides(y_shape)
    items = [loop_work(v.type.shape, [contiguous_strides(v.type.shape), ys]).items
             for v in node.inputs[0]]
    return Work(min(items), elements=prod(y_shape))


@kernel("Slice")
def slice_(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    xs = contiguous_strides(xt.shape)
    a = k.attrs
    offset = sum(s * st for s, st in zip(a["starts"], xs))
    copy_loops(k.b, yt.shape, x, [st * step for st, step in zip(xs, a["steps"])], offset,
               y, contiguous_strides(yt.shape), 0)


@kernel("Split")
def split(k: KernelArgs):
    b = k.b
    x, xt = k.ins[0]
    axis = k.attrs["axis"]
    outer, _, inner = split_axis(xt.shape, axis)
    at = 0
    for y, yt in k.outs:
        size = yt.shape[axis]
        # y viewed as [outer, size * inner], x as [outer, dim * inner] from column at * inner.
        strided_loops(b, (outer, size * inner), [x, y],
                      [(xt.shape[axis] * inner, 1), (size * inner, 1)], [at * inner, 0],
                      lambda bb, ps: bb.store(bb.load(ps[0]), ps[1]), name="sp")
        at += size


@kernel("Trilu")
def trilu(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    *batch, rows, cols = xt.shape
    diag, upper = k.attrs["k"], k.attrs["upper"]
    zero = zero_of(yt.dtype)

    def body(idx):
        bi, i, j = idx
        off = b.add(b.mul(bi, i64(rows * cols)), b.add(b.mul(i, i64(cols)), j))
        d = b.sub(j, i)
        keep = b.icmp_signed(">=" if upper else "<=", d, i64(diag))
        b.store(b.select(keep, b.load(b.gep(x, [off])), zero), b.gep(y, [off]))
    nest(b, (prod(batch), rows, cols), body, "tr")


@kernel("Pad")
def pad(k: KernelArgs):
    """Each output index maps back to an input index: constant mode fills what falls
    outside, edge clamps, wrap wraps around, reflect mirrors (once: pads are smaller than
    the dimension).  Negative pads crop: the index map simply starts inside."""
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    pads, mode = k.attrs["pads"], k.attrs["mode"]
    rank = xt.rank
    xs = contiguous_strides(xt.shape)
    fill = Value(const(k.attrs["value"], yt.dtype), yt.dtype)

    def level(d, y_off, x_off, valid):
        if d == rank:
            with b.if_else(valid) as (inside, outside):
                with inside:
                    b.store(b.load(b.gep(x, [x_off])), b.gep(y, [y_off]))
                with outside:
                    store_elem(b, fill, b.gep(y, [y_off]), yt.dtype)
            return
        size = xt.shape[d]
        with for_range(b, yt.shape[d], name=f"p{d}") as i:
            src = b.sub(i, i64(pads[d]))
            ok = valid
            if mode == "constant":
                ok = b.and_(ok, b.and_(b.icmp_signed(">=", src, i64(0)), b.icmp_signed("<", src, i64(size))))
                src = b.select(b.icmp_signed("<", src, i64(0)), i64(0), src)
                src = b.select(b.icmp_signed(">=", src, i64(size)), i64(size - 1), src)
            elif mode == "wrap":
                src = b.srem(b.add(b.srem(src, i64(size)), i64(size)), i64(size))
            elif mode == "edge":
                src = b.select(b.icmp_signed("<", src, i64(0)), i64(0), src)
                src = b.select(b.icmp_signed(">=", src, i64(size)), i64(size - 1), src)
            else:
                src = b.select(b.icmp_signed("<", src, i64(0)), b.neg(src), src)
                src = b.select(b.icmp_signed(">=", src, i64(size)), b.sub(i64(2 * (size - 1)), src), src)
            stride_y = contiguous_strides(yt.shape)[d]
            level(d + 1, b.add(y_off, b.mul(i, i64(stride_y))), b.add(x_off, b.mul(src, i64(xs[d]))), ok)

    level(0, i64(0), i64(0), ir.Constant(ir.IntType(1), 1))
