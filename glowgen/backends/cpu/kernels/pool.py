"""Pooling: max and average at any spatial rank, the 2-D f32 max over padded planes, the
2-D integer (int8) max with its taps unrolled."""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ..llvmutil import I8, I32, I64, for_range, i64, register_type, storage_type, target_has
from ..loops import contiguous_strides
from ..parallel import Work, parallel
from ..scalar import ScalarEmitter, Value, const, load_elem, store_elem
from ..vectors import splat
from .base import SCRATCH, STRATEGY, KernelArgs, hook, kernel
from .common import clamp, extreme, inside, lin, nest
from .conv_planes import MAX_TAPS, emit_max_pool_planes, scratch_bytes


def _pool_nd(k: KernelArgs, is_max: bool):
    """Pooling at any spatial rank (the 2-D MaxPool and AvgPool too): taps outside the input
    are skipped; the average divides by the taps inside the input (or inside the explicit
    pads, count_include_pad), never counting the ceil-mode overhang."""
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    a = k.attrs
    n, c, *dims = xt.shape
    out = yt.shape[2:]
    nd = len(dims)
    kern, strides, pads = a["kernel"], a["strides"], a["pads"]
    dil = a.get("dilations", (1,) * nd)
    count_pad = bool(a.get("count_include_pad", 0))
    dtype = yt.dtype
    xs, os_ = contiguous_strides(dims), contiguous_strides(out)
    plane, oplane = prod(dims), prod(out)
    cnt = b.alloca(I64)
    padded = [dims[i] + pads[i] + pads[i + nd] for i in range(nd)]

    def per_plane(idx):
        (nc,) = idx
        xbase, ybase = b.mul(nc, i64(plane)), b.mul(nc, i64(oplane))

        def per_out(oidx):
            acc_ptr = b.gep(y, [lin(b, oidx, os_, ybase)])
            init = extreme("-inf", dtype) if is_max else 0
            store_elem(b, Value(const(init, dtype), dtype), acc_ptr, dtype)
            b.store(i64(0), cnt)

            def per_tap(kidx):
                coords = [b.add(b.sub(b.mul(o, i64(s)), i64(p)), b.mul(kq, i64(d)))
                          for o, kq, s, p, d in zip(oidx, kidx, strides, pads[:nd], dil)]
                within = inside(b, coords, dims)
                if count_pad:
                    counted = inside(b, [b.add(cc, i64(p)) for cc, p in zip(coords, pads[:nd])], padded)
                else:
                    counted = within
                b.store(b.add(b.load(cnt), b.zext(counted, I64)), cnt)
                with b.if_then(within):
                    em = ScalarEmitter(b, k.scalars)
                    xv = load_elem(b, b.gep(x, [lin(b, coords, xs, xbase)]), dtype)
                    acc = load_elem(b, acc_ptr, dtype)
                    store_elem(b, em.f_max(acc, xv) if is_max else em.f_add(acc, xv), acc_ptr, dtype)
            nest(b, kern, per_tap, "pk")
            if not is_max:
                total = b.load(cnt)
                total = b.select(b.icmp_signed("<", total, i64(1)), i64(1), total)
                em = ScalarEmitter(b, k.scalars)
                div = Value(b.sitofp(total, register_type(dtype)), dtype)
                store_elem(b, em.f_div(load_elem(b, acc_ptr, dtype), div), acc_ptr, dtype)
        nest(b, out, per_out, "po")
    lo, hi = k.split.range(b, n * c)           # a split task's planes (pool_work)
    with for_range(b, hi, start=lo, name="pp") as nc:
        per_plane((nc,))


@parallel("MaxPool", "MaxPoolN", "AvgPool", "AvgPoolN")
def pool_work(node, shape, ins) -> Work:
    """Pooling shares out its planes (one per image and channel)."""
    n, c = node.inputs[0].type.shape[:2]
    taps = prod(node.kernel)
    return Work(n * c, elements=prod(node.outputs[0].type.shape) * taps / 4)


@kernel("MaxPool")
def max_pool(k: KernelArgs):
    """2-D max pooling: over padded planes in explicit vectors when it can."""
    if k.strategy == "planes":
        return emit_max_pool_planes(k, k.gemm_shape.vw)
    if k.strategy == "taps":
        return max_pool_int_taps(k)
    _pool_nd(k, True)


def _int_pool_geometry(node):
    n, c, h, w = node.inputs[0].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    return n, c, h, w, oh, ow


def _smax(b, u, v):
    """The signed maximum of integers (scalars or vectors) u and v."""
    return b.select(b.icmp_signed(">", u, v), u, v)


def max_pool_int_taps(k: KernelArgs):
    if by_rows(k.node):
        return max_pool_i8_rows(k)
    max_pool_int_taps_separable(k)


# The widest vector of bytes a target holds, by the feature that gives it byte lanes.
_BYTE_VECTORS = (("avx512bw", 64), ("avx2", 32), ("", 16))


def by_rows(node) -> bool:
    """Whether max_pool_i8_rows applies: an i8 pool at column stride 1 or 2, row dilation
    1, every window reaching a row of the input, and rows of at least 16 bytes."""
    if node.outputs[0].type.dtype != "i8":
        return False
    n, c, h, w, oh, ow = _int_pool_geometry(node)
    kh, _ = node.kernel
    sh, sw = node.strides
    pt = node.pads[0]
    if sw not in (1, 2) or node.dilations[0] != 1 or ow < 16 or w < 16:
        return False
    return all(oy * sh - pt + kh - 1 >= 0 and oy * sh - pt <= h - 1 for oy in range(oh))


def _row_vectors(node, module) -> tuple[int, int]:
    """max_pool_i8_rows' vectors (of output bytes, of input bytes): the target's widest,
    no wider than a row."""
    _, _, _, w, _, ow = _int_pool_geometry(node)
    widest = next(v for feature, v in _BYTE_VECTORS if not feature or target_has(module, feature))
    return (max(v for v in (16, 32, 64) if v <= min(ow, widest)),
            max(v for v in (16, 32, 64) if v <= min(w, widest)))


def _row_width(node) -> int:
    """Bytes of max_pool_i8_rows' row of column maxima: the padded row, and every byte its
    last vector of output reads (at stride 2, the odd bytes of its pairs too)."""
    _, _, _, w, _, ow = _int_pool_geometry(node)
    (_, kw), (_, sw), (_, dw) = node.kernel, node.strides, node.dilations
    return max(node.pads[1] + w, sw * ow + (kw - 1) * dw)


def _row_stride(node) -> int:
    """Bytes between max_pool_i8_rows' rows of column maxima: whole cache lines."""
    return -(-_row_width(node) // 64) * 64


def max_pool_i8_rows(k: KernelArgs):
    """A 2-D i8 max pool in explicit byte vectors, a plane at a time: for every output row,
    the max of the input rows its window reaches, column by column, into a padded row of
    scratch (rows outside the input clamped to the nearest inside, which the window also
    reaches: the max is the same); then, every row of those, each horizontal tap one vector
    load (at stride 2, two and a shuffle of the even bytes) and a max.  All rows are written
    before any is read: read right after it, a row's vectors spanned two of the stores
    that wrote it, which the store buffer does not forward (2.6 times slower at 64 x 112 x
    112).  Vectors do not stop at the end of a row: the last one starts where it ends,
    overlapping the one before (a max is the same computed twice).  Over ResNet-18's 3x3
    pool at stride 2 from 112 x 112, the loops LLVM vectorized from
    max_pool_int_taps_separable took 67 us of a 6.2 ms model (16-byte vectors, scalar
    edges)."""
    b = k.b
    (y, _), (x, _) = k.outs[0], k.ins[0]
    node = k.node
    n, c, h, w, oh, ow = _int_pool_geometry(node)
    (kh, kw), (sh, sw), (_, dw) = node.kernel, node.strides, node.dilations
    pt, pl = node.pads[:2]
    vo, vi = _row_vectors(node, b.module)
    width, stride = _row_width(node), _row_stride(node)
    lowest = ir.Constant(I8, -128)
    rows = b.bitcast(k.scratch, I8.as_pointer())

    def load(ptr, offset, lanes):
        v = b.load(b.bitcast(b.gep(ptr, [offset]), ir.VectorType(I8, lanes).as_pointer()))
        v.align = 1
        return v

    def store(value, ptr, offset):
        st = b.store(value, b.bitcast(b.gep(ptr, [offset]), value.type.as_pointer()))
        st.align = 1

    def starts(length, lanes):
        """The offsets of vectors of `lanes` covering [0, length): the last ends at length."""
        return sorted(set(list(range(0, length - lanes + 1, lanes)) + [length - lanes]))

    pads = [(0, pl), (pl + w, width)]
    with for_range(b, oh, name="pz") as oy:     # the padding columns, once: never written again
        row = b.gep(rows, [b.mul(oy, i64(stride))])
        for lo, hi in pads:
            if hi - lo >= 16:
                for at in starts(hi - lo, 16):
                    store(splat(b, lowest, 16), row, i64(lo + at))
            else:
                for at in range(lo, hi):
                    b.store(lowest, b.gep(row, [i64(at)]))
    evens = ir.Constant(ir.VectorType(I32, vo), [2 * i for i in range(vo)])
    lo, hi = k.split.range(b, n * c)
    with for_range(b, hi, start=lo, name="pp") as nc:
        plane = b.gep(x, [b.mul(nc, i64(h * w))])
        with for_range(b, oh, name="pv") as oy:
            top = b.sub(b.mul(oy, i64(sh)), i64(pt))
            srcs = []
            for ky in range(kh):
                iy = clamp(b, b.add(top, i64(ky)), i64(0), i64(h - 1))
                srcs.append(b.gep(plane, [b.mul(iy, i64(w))]))
            row = b.gep(rows, [b.mul(oy, i64(stride))])
            for col in starts(w, vi):
                best = None
                for src in srcs:
                    v = load(src, i64(col), vi)
                    best = v if best is None else _smax(b, best, v)
                store(best, row, i64(pl + col))
        out = b.gep(y, [b.mul(nc, i64(oh * ow))])
        with for_range(b, oh, name="ph") as oy:
            row = b.gep(rows, [b.mul(oy, i64(stride))])
            orow = b.gep(out, [b.mul(oy, i64(ow))])
            for ox in starts(ow, vo):
                best = None
                for kx in range(kw):
                    at = sw * ox + kx * dw
                    if sw == 1:
                        v = load(row, i64(at), vo)
                    else:
                        v = b.shuffle_vector(load(row, i64(at), vo), load(row, i64(at + vo), vo), evens)
                    best = v if best is None else _smax(b, best, v)
                store(best, orow, i64(ox))


def max_pool_int_taps_separable(k: KernelArgs):
    """A 2-D max pool of a signed integer type, separably: per plane, the max over the
    horizontal taps of every input row into scratch rows (the columns whose taps all lie
    inside the row in a loop without bounds checks, which LLVM vectorizes over the strided
    loads; the few edge columns checked one by one), then each output row the max of the
    scratch rows its vertical taps reach, whole rows at a time.  A tap outside the input is
    the type's least value; maxima are exact in any order."""
    b = k.b
    (y, yt), (x, _) = k.outs[0], k.ins[0]
    a = k.attrs
    n, c, h, w, oh, ow = _int_pool_geometry(k.node)
    (kh, kw), (sh, sw), pads = a["kernel"], a["strides"], a["pads"]
    dh, dw = a.get("dilations", (1, 1))
    et = storage_type(yt.dtype)
    lowest = ir.Constant(et, -(1 << (et.width - 1)))
    rows = b.bitcast(k.scratch, et.as_pointer())            # [h][ow]: each input row's maxima
    # Output columns whose horizontal taps all lie in [0, w).
    ox_lo = min(ow, max(0, -(-pads[1] // sw)))
    ox_hi = max(ox_lo, min(ow, (w - 1 + pads[1] - (kw - 1) * dw) // sw + 1))
    lo, hi = k.split.range(b, n * c)

    with for_range(b, hi, start=lo, name="pp") as nc:
        plane = b.gep(x, [b.mul(nc, i64(h * w))])
        with for_range(b, h, name="pr") as iy:
            src = b.gep(plane, [b.mul(iy, i64(w))])
            dst = b.gep(rows, [b.mul(iy, i64(ow))])

            def checked(ox):
                best = lowest
                for kx in range(kw):
                    ix = b.add(b.mul(ox, i64(sw)), i64(kx * dw - pads[1]))
                    ok = b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(w)))
                    v = b.load(b.gep(src, [b.select(ok, ix, i64(0))]))
                    best = _smax(b, b.select(ok, v, lowest), best)
                b.store(best, b.gep(dst, [ox]))
            with for_range(b, ox_lo, name="pl") as ox:
                checked(ox)
            with for_range(b, ox_hi, start=ox_lo, name="pm") as ox:
                base = b.sub(b.mul(ox, i64(sw)), i64(pads[1]))
                best = b.load(b.gep(src, [base]))
                for kx in range(1, kw):
                    best = _smax(b, b.load(b.gep(src, [b.add(base, i64(kx * dw))])), best)
                b.store(best, b.gep(dst, [ox]))
            with for_range(b, ow, start=ox_hi, name="pr") as ox:
                checked(ox)
        out = b.gep(y, [b.mul(nc, i64(oh * ow))])
        with for_range(b, oh, name="py") as oy:
            orow = b.gep(out, [b.mul(oy, i64(ow))])
            with for_range(b, ow, name="pi") as ox:
                b.store(lowest, b.gep(orow, [ox]))
            for ky in range(kh):
                iy = b.add(b.mul(oy, i64(sh)), i64(ky * dh - pads[0]))
                ok = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h)))
                with b.if_then(ok):
                    srow = b.gep(rows, [b.mul(iy, i64(ow))])
                    with for_range(b, ow, name="pv") as ox:
                        at = b.gep(orow, [ox])
                        b.store(_smax(b, b.load(b.gep(srow, [ox])), b.load(at)), at)


@kernel("MaxPoolN")
def max_pool_nd(k: KernelArgs):
    _pool_nd(k, True)


def max_pool_by_planes(node) -> bool:
    """Whether a 2-D MaxPool runs over planes padded with -inf (conv_planes.py)."""
    return node.outputs[0].type.dtype == "f32" and node.kernel[0] * node.kernel[1] <= MAX_TAPS


@hook(STRATEGY, "MaxPool")
def max_pool_strategy(ins, shape, packable, plan) -> str:
    if max_pool_by_planes(ins.node):
        return "planes"
    dtype = ins.node.outputs[0].type.dtype
    small = ins.node.kernel[0] * ins.node.kernel[1] <= MAX_TAPS
    return "taps" if small and dtype in ("i8", "i16", "i32") else "loops"


@hook(SCRATCH, "MaxPool")
def max_pool_scratch(ins, shape) -> int:
    if ins.plan.strategy == "planes":
        return scratch_bytes(ins.node, shape.vw)
    if ins.plan.strategy == "taps" and by_rows(ins.node):
        return _int_pool_geometry(ins.node)[4] * _row_stride(ins.node)     # per task
    if ins.plan.strategy == "taps":     # max_pool_int_taps_separable's rows of maxima
        _, _, h, _, _, ow = _int_pool_geometry(ins.node)
        return h * ow * storage_type(ins.node.outputs[0].type.dtype).width // 8
    return 0


@kernel("AvgPool", "AvgPoolN")
def avg_pool_nd(k: KernelArgs):
    _pool_nd(k, False)
