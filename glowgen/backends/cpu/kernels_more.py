"""More loop-nest primitives for the CPU backend (the last `extern` section of
specs/cpu_kernels.glowdef): splitting, triangles, gathers and scatters, one-hot, arg-max and
friends, top-k, cumulative sums, N-D convolution and pooling, transposed convolution, einsum.

Each kernel is specialized at compile time on the shapes and attributes and matches the
NumPy reference in backends/interpreter/primitives.py.

Indices read from tensors at run time are never trusted: a gather clamps an out-of-range
index into the dimension, a scatter skips an update whose index is out of range, so native
code never reads or writes outside a buffer on bad data.
"""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ...speclib.shapes import einsum_parse
from .kernels import SCRATCH, KernelArgs, _identity, kernel
from .llvmutil import I1, I64, for_range, i64, is_float, is_signed, register_type, storage_type
from .loops import contiguous_strides, strided_loops
from .parallel import Work, parallel
from .scalar import ScalarEmitter, Value, const, convert, load_elem, store_elem

TRUE = ir.Constant(I1, 1)


# --------------------------------------------------------------------------- helpers
def _nest(b, shape, body, name="l"):
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


def _lin(b, idx, strides, base=None):
    """base + sum(idx[i] * strides[i]) as an i64 offset."""
    off = base if base is not None else i64(0)
    for i, s in zip(idx, strides):
        if s == 1:
            off = b.add(off, i)
        elif s:
            off = b.add(off, b.mul(i, i64(s)))
    return off


def _load_index(b, ptr, dtype):
    return convert(b, load_elem(b, ptr, dtype), "i64").v


def _normalize(b, raw, dim):
    """A negative index counts from the end; returns (index, 0 <= index < dim)."""
    fixed = b.select(b.icmp_signed("<", raw, i64(0)), b.add(raw, i64(dim)), raw)
    ok = b.and_(b.icmp_signed(">=", fixed, i64(0)), b.icmp_signed("<", fixed, i64(dim)))
    return fixed, ok


def _clamped(b, raw, dim):
    """A run-time index wrapped once and clamped into [0, dim): never out of bounds."""
    fixed, ok = _normalize(b, raw, dim)
    fixed = b.select(b.icmp_signed("<", fixed, i64(0)), i64(0), fixed)
    return b.select(b.icmp_signed(">=", fixed, i64(dim)), i64(dim - 1), fixed)


def _copy(b, dst, src, n):
    strided_loops(b, (n,), [src, dst], [(1,), (1,)], [0, 0],
                  lambda bb, ps: bb.store(bb.load(ps[0]), ps[1]), name="cp")


def _zero(dtype):
    """Zero in `dtype`'s storage form (a bf16 zero is the 16-bit pattern 0)."""
    t = storage_type(dtype)
    return ir.Constant(t, 0 if isinstance(t, ir.IntType) else 0.0)


def _fill(b, ptr, n, value: Value, dtype):
    strided_loops(b, (n,), [ptr], [(1,)], [0], lambda bb, ps: store_elem(bb, value, ps[0], dtype),
                  name="fill")


def _split_axis(shape, axis):
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


# --------------------------------------------------------------------------- data movement
@kernel("Split")
def split(k: KernelArgs):
    b = k.b
    x, xt = k.ins[0]
    axis = k.attrs["axis"]
    outer, _, inner = _split_axis(xt.shape, axis)
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
    zero = _zero(yt.dtype)

    def body(idx):
        bi, i, j = idx
        off = b.add(b.mul(bi, i64(rows * cols)), b.add(b.mul(i, i64(cols)), j))
        d = b.sub(j, i)
        keep = b.icmp_signed(">=" if upper else "<=", d, i64(diag))
        b.store(b.select(keep, b.load(b.gep(x, [off])), zero), b.gep(y, [off]))
    _nest(b, (prod(batch), rows, cols), body, "tr")


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
        store_elem(b, Value(b.select(on, one, zero), yt.dtype), b.gep(y, [_lin(b, idx, (cols, 1))]), yt.dtype)
    _nest(b, (rows, cols), body, "eye")


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
        raw = _load_index(b, b.gep(ind, [_lin(b, (o, r), (inner, 1))]), it.dtype)
        fixed = b.select(b.icmp_signed("<", raw, i64(0)), b.add(raw, i64(depth)), raw)
        hot = b.icmp_signed("==", fixed, d)   # an index out of [0, depth) is hot nowhere
        b.store(b.select(hot, on_v, off_v), b.gep(y, [_lin(b, idx, (depth * inner, inner, 1))]))
    _nest(b, (outer, depth, inner), body, "oh")


# --------------------------------------------------------------------------- gathers
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
        q = _lin(b, idx, qs)
        j = _clamped(b, _load_index(b, b.gep(ind, [q]), it.dtype), dim)
        src = _lin(b, [i for d, i in enumerate(idx) if d != axis],
                   [s for d, s in enumerate(xs) if d != axis], b.mul(j, i64(xs[axis])))
        b.store(b.load(b.gep(x, [src])), b.gep(y, [q]))
    _nest(b, it.shape, body, "ge")


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
            raw = _load_index(b, b.gep(ind, [b.add(b.mul(row, i64(last)), i64(j))]), it.dtype)
            src = b.add(src, b.mul(_clamped(b, raw, dims[j]), i64(xs[bd + j])))
        dst = b.mul(row, i64(inner))
        with for_range(b, inner, name="gn.r") as r:
            b.store(b.load(b.gep(x, [b.add(src, r)])), b.gep(y, [b.add(dst, r)]))
    _nest(b, (n_batch, n_tuples), body, "gn")


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
    _copy(b, y, x, yt.size)
    dim = xt.shape[axis]
    ys = contiguous_strides(yt.shape)
    qs = contiguous_strides(it.shape)

    def body(idx):
        q = _lin(b, idx, qs)
        j, ok = _normalize(b, _load_index(b, b.gep(ind, [q]), it.dtype), dim)
        with b.if_then(ok):
            dst = _lin(b, [i for d, i in enumerate(idx) if d != axis],
                       [s for d, s in enumerate(ys) if d != axis], b.mul(j, i64(ys[axis])))
            _scatter_store(k, b, b.gep(upd, [q]), b.gep(y, [dst]), yt.dtype, combine)
    _nest(b, it.shape, body, "se")


@kernel("ScatterND")
def scatter_nd(k: KernelArgs):
    """An update whose index tuple falls outside x is skipped: no write outside y."""
    b = k.b
    (y, yt), (x, xt), (ind, it), (upd, ut) = k.outs[0], k.ins[0], k.ins[1], k.ins[2]
    combine = _combine(k, k.attrs["reduction"], yt.dtype)
    _copy(b, y, x, yt.size)
    last = it.shape[-1]
    n_tuples = prod(it.shape[:-1])
    inner = prod(xt.shape[last:])
    ys = contiguous_strides(yt.shape)
    with for_range(b, n_tuples, name="sn") as t:
        dst, ok = i64(0), TRUE
        for j in range(last):
            raw = _load_index(b, b.gep(ind, [b.add(b.mul(t, i64(last)), i64(j))]), it.dtype)
            fixed, in_range = _normalize(b, raw, xt.shape[j])
            ok = b.and_(ok, in_range)
            dst = b.add(dst, b.mul(fixed, i64(ys[j])))
        with b.if_then(ok):
            src = b.mul(t, i64(inner))
            with for_range(b, inner, name="sn.r") as r:
                _scatter_store(k, b, b.gep(upd, [b.add(src, r)]), b.gep(y, [b.add(dst, r)]),
                               yt.dtype, combine)


# --------------------------------------------------------------------------- arg-max and friends
def _better(b, v: Value, best: Value, largest: bool, ties: bool, nan_best: bool = True):
    """v replaces best: strictly larger (smaller), or equal when `ties`.  A NaN beats every
    number when `nan_best` (NumPy's argmax and argmin), loses to every number otherwise
    (NumPy's ascending sort puts NaN last); between two NaNs the tie rule decides."""
    op = (">=" if ties else ">") if largest else ("<=" if ties else "<")
    if not is_float(v.dtype):
        cmp = b.icmp_signed if is_signed(v.dtype) else b.icmp_unsigned
        return cmp(op, v.v, best.v)
    plain = b.fcmp_ordered(op, v.v, best.v)
    v_nan = b.fcmp_unordered("uno", v.v, v.v)
    best_nan = b.fcmp_unordered("uno", best.v, best.v)
    both = ir.Constant(I1, int(ties))
    if nan_best:
        return b.or_(plain, b.and_(v_nan, b.or_(b.not_(best_nan), both)))
    return b.or_(plain, b.and_(best_nan, b.or_(b.not_(v_nan), both)))


@kernel("ArgMax", "ArgMin")
def arg_max(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    axis = k.attrs["axis"]
    outer, n, inner = _split_axis(xt.shape, axis)
    if yt.size == 0:
        return
    largest = k.node.OP == "ArgMax"
    last = bool(k.attrs["select_last_index"])
    best = b.alloca(register_type(xt.dtype))
    at = b.alloca(I64)

    def body(idx):
        o, r = idx
        base = b.add(b.mul(o, i64(n * inner)), r)
        hit = _arg_best(b, x, xt.dtype, base, n, inner, largest, last, best, at, "am")
        b.store(hit, b.gep(y, [_lin(b, idx, (inner, 1))]))
    _nest(b, (outer, inner), body, "ar")


def _arg_best(b, x, dtype, base, n, inner, largest, last, best, at, name):
    """Index along the axis (elements base + i * inner) of the largest (or smallest) value;
    ties go to the first index, or the last with `last`.  `best` and `at` are scratch slots."""
    b.store(b.load(b.gep(x, [base])), best)
    b.store(i64(0), at)
    with for_range(b, n, start=1, name=name) as i:
        v = load_elem(b, b.gep(x, [b.add(base, b.mul(i, i64(inner)))]), dtype)
        with b.if_then(_better(b, v, Value(b.load(best), dtype), largest, last)):
            b.store(v.v, best)
            b.store(i, at)
    return b.load(at)


@kernel("Hardmax")
def hardmax(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    axis = k.attrs["axis"]
    outer, n, inner = _split_axis(xt.shape, axis)
    if yt.size == 0:
        return
    one, zero = const(1, yt.dtype), const(0, yt.dtype)
    best = b.alloca(register_type(xt.dtype))
    at = b.alloca(I64)

    def body(idx):
        o, r = idx
        base = b.add(b.mul(o, i64(n * inner)), r)
        hit = _arg_best(b, x, xt.dtype, base, n, inner, True, False, best, at, "hm")
        with for_range(b, n, name="hw") as i:
            b.store(b.select(b.icmp_signed("==", i, hit), one, zero),
                    b.gep(y, [b.add(base, b.mul(i, i64(inner)))]))
    _nest(b, (outer, inner), body, "hx")


@kernel("TopK")
def top_k(k: KernelArgs):
    """Insertion into the sorted k-prefix of the outputs, O(n k) per line; a value enters
    ahead of the kept ones only when strictly better, so equal values keep index order."""
    b = k.b
    (vy, vt), (iy, _), (x, xt) = k.outs[0], k.outs[1], k.ins[0]
    axis, kk, largest = k.attrs["axis"], k.attrs["k"], bool(k.attrs["largest"])
    outer, n, inner = _split_axis(xt.shape, axis)
    if kk == 0 or vt.size == 0:
        return
    dtype = xt.dtype
    pos_p = b.alloca(I64)
    fn = b.function

    def body(idx):
        o, r = idx
        xbase = b.add(b.mul(o, i64(n * inner)), r)
        ybase = b.add(b.mul(o, i64(kk * inner)), r)

        def yat(p):
            off = b.add(ybase, b.mul(p, i64(inner)))
            return b.gep(vy, [off]), b.gep(iy, [off])
        with for_range(b, n, name="tk") as i:
            v = load_elem(b, b.gep(x, [b.add(xbase, b.mul(i, i64(inner)))]), dtype)
            count = b.select(b.icmp_signed("<", i, i64(kk)), i, i64(kk))
            b.store(count, pos_p)
            head = fn.append_basic_block("tk.head")
            shift = fn.append_basic_block("tk.shift")
            done = fn.append_basic_block("tk.done")
            b.branch(head)
            b.position_at_end(head)
            pos = b.load(pos_p)
            has_prev = b.icmp_signed(">", pos, i64(0))
            prev = b.select(has_prev, b.sub(pos, i64(1)), i64(0))
            pv, pi = yat(prev)
            wins = _better(b, v, load_elem(b, pv, dtype), largest, False, nan_best=largest)
            b.cbranch(b.and_(has_prev, wins), shift, done)
            b.position_at_end(shift)
            with b.if_then(b.icmp_signed("<", pos, i64(kk))):
                cv, ci = yat(pos)
                b.store(b.load(pv), cv)
                b.store(b.load(pi), ci)
            b.store(prev, pos_p)
            b.branch(head)
            b.position_at_end(done)
            pos = b.load(pos_p)
            with b.if_then(b.icmp_signed("<", pos, i64(kk))):
                cv, ci = yat(pos)
                b.store(v.v, cv)
                b.store(i, ci)
    _nest(b, (outer, inner), body, "tkl")


# --------------------------------------------------------------------------- scans
@kernel("CumSum", "CumProd")
def cumulative(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    a = k.attrs
    axis = a["axis"]
    outer, n, inner = _split_axis(xt.shape, axis)
    dtype = yt.dtype
    is_sum = k.node.OP == "CumSum"
    acc_p = b.alloca(register_type(dtype))

    def body(idx):
        o, r = idx
        base = b.add(b.mul(o, i64(n * inner)), r)
        b.store(const(0 if is_sum else 1, dtype), acc_p)
        with for_range(b, n, name="cs") as i:
            j = b.sub(i64(n - 1), i) if a["reverse"] else i
            p = b.add(base, b.mul(j, i64(inner)))
            em = ScalarEmitter(b, k.scalars)
            acc = Value(b.load(acc_p), dtype)
            new = (em.f_add if is_sum else em.f_mul)(acc, load_elem(b, b.gep(x, [p]), dtype))
            b.store(new.v, acc_p)
            store_elem(b, acc if a["exclusive"] else new, b.gep(y, [p]), dtype)
    _nest(b, (outer, inner), body, "cu")


# --------------------------------------------------------------------------- N-D convolution and pooling
def _inside(b, coords, sizes):
    ok = TRUE
    for c, s in zip(coords, sizes):
        ok = b.and_(ok, b.and_(b.icmp_signed(">=", c, i64(0)), b.icmp_signed("<", c, i64(s))))
    return ok


class _DirectConv:
    """What the N-D direct kernels (ConvN, ConvTranspose) read of their operands and
    attributes, and the pieces they share."""

    def __init__(self, k: KernelArgs):
        (self.y, yt), (self.x, xt), (self.w, wt) = k.outs[0], k.ins[0], k.ins[1]
        self.bias = k.ins[2]
        a = k.attrs
        self.n, self.c, *self.dims = xt.shape
        self.m, *self.out = yt.shape[1:]
        self.kern = wt.shape[2:]
        self.wc = wt.shape[1]                  # weight channels: Conv's cg, ConvTranspose's mg
        self.nd = len(self.dims)
        self.strides, self.dil, self.pads = a["strides"], a["dilations"], a["pads"]
        self.g = a["group"]
        self.dtype = yt.dtype
        self.xs, self.os, self.ks = (contiguous_strides(self.dims), contiguous_strides(self.out),
                                     contiguous_strides(self.kern))
        self.plane, self.oplane, self.kplane = prod(self.dims), prod(self.out), prod(self.kern)
        self.k = k

    def bias_or_zero(self, mi) -> Value:
        b = self.k.b
        return (load_elem(b, b.gep(self.bias[0], [mi]), self.dtype) if self.bias is not None
                else Value(const(0, self.dtype), self.dtype))

    def coords(self, pos, kidx) -> list:
        """pos * stride - pad_begin + tap * dilation, per spatial dimension."""
        b = self.k.b
        return [b.add(b.sub(b.mul(o, i64(s)), i64(p)), b.mul(kq, i64(d)))
                for o, kq, s, p, d in zip(pos, kidx, self.strides, self.pads[:self.nd], self.dil)]

    def accumulate(self, yp, xv, wv) -> None:
        """*yp += xv * wv."""
        b = self.k.b
        em = ScalarEmitter(b, self.k.scalars)
        store_elem(b, em.f_add(load_elem(b, yp, self.dtype), em.f_mul(xv, wv)), yp, self.dtype)


@kernel("ConvN")
def conv_nd(k: KernelArgs):
    """Direct N-D convolution: the accumulator lives in y; padding taps are skipped."""
    b, cv = k.b, _DirectConv(k)
    cg, mg = cv.wc, cv.m // cv.g

    def per_filter(idx):
        ni, mi = idx
        ybase = b.mul(b.add(b.mul(ni, i64(cv.m)), mi), i64(cv.oplane))
        gi = b.sdiv(mi, i64(mg))

        def per_out(oidx):
            yp = b.gep(cv.y, [_lin(b, oidx, cv.os, ybase)])
            store_elem(b, cv.bias_or_zero(mi), yp, cv.dtype)
            with for_range(b, cg, name="cnc") as ci:
                chan = b.add(b.mul(gi, i64(cg)), ci)
                xbase = b.mul(b.add(b.mul(ni, i64(cv.c)), chan), i64(cv.plane))
                wbase = b.mul(b.add(b.mul(mi, i64(cg)), ci), i64(cv.kplane))

                def per_tap(kidx):
                    coords = cv.coords(oidx, kidx)
                    with b.if_then(_inside(b, coords, cv.dims)):
                        xv = load_elem(b, b.gep(cv.x, [_lin(b, coords, cv.xs, xbase)]), cv.dtype)
                        wv = load_elem(b, b.gep(cv.w, [_lin(b, kidx, cv.ks, wbase)]), cv.dtype)
                        cv.accumulate(yp, xv, wv)
                _nest(b, cv.kern, per_tap, "cnk")
        _nest(b, cv.out, per_out, "cno")
    _nest(b, (cv.n, cv.m), per_filter, "cnf")


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
            acc_ptr = b.gep(y, [_lin(b, oidx, os_, ybase)])
            init = _identity("ReduceMax", dtype) if is_max else 0
            store_elem(b, Value(const(init, dtype), dtype), acc_ptr, dtype)
            b.store(i64(0), cnt)

            def per_tap(kidx):
                coords = [b.add(b.sub(b.mul(o, i64(s)), i64(p)), b.mul(kq, i64(d)))
                          for o, kq, s, p, d in zip(oidx, kidx, strides, pads[:nd], dil)]
                inside = _inside(b, coords, dims)
                if count_pad:
                    counted = _inside(b, [b.add(cc, i64(p)) for cc, p in zip(coords, pads[:nd])], padded)
                else:
                    counted = inside
                b.store(b.add(b.load(cnt), b.zext(counted, I64)), cnt)
                with b.if_then(inside):
                    em = ScalarEmitter(b, k.scalars)
                    xv = load_elem(b, b.gep(x, [_lin(b, coords, xs, xbase)]), dtype)
                    acc = load_elem(b, acc_ptr, dtype)
                    store_elem(b, em.f_max(acc, xv) if is_max else em.f_add(acc, xv), acc_ptr, dtype)
            _nest(b, kern, per_tap, "pk")
            if not is_max:
                total = b.load(cnt)
                total = b.select(b.icmp_signed("<", total, i64(1)), i64(1), total)
                em = ScalarEmitter(b, k.scalars)
                div = Value(b.sitofp(total, register_type(dtype)), dtype)
                store_elem(b, em.f_div(load_elem(b, acc_ptr, dtype), div), acc_ptr, dtype)
        _nest(b, out, per_out, "po")
    lo, hi = k.split.range(b, n * c)           # a split task's planes (pool_work)
    with for_range(b, hi, start=lo, name="pp") as nc:
        per_plane((nc,))


@parallel("MaxPool", "MaxPoolN", "AvgPool", "AvgPoolN")
def pool_work(node, shape, ins) -> Work:
    """Pooling shares out its planes (one per image and channel)."""
    n, c = node.inputs[0].type.shape[:2]
    taps = prod(node.kernel)
    return Work(n * c, elements=prod(node.outputs[0].type.shape) * taps / 4)


@kernel("MaxPool", "MaxPoolN")
def max_pool_nd(k: KernelArgs):
    if _max_pool_by_planes(k.node):
        from .conv_planes import emit_max_pool_planes
        return emit_max_pool_planes(k, k.gemm_shape.vw)
    _pool_nd(k, True)


def _max_pool_by_planes(node) -> bool:
    from .conv_planes import MAX_TAPS
    return (type(node).__name__ == "MaxPool" and node.outputs[0].type.dtype == "f32"
            and node.kernel[0] * node.kernel[1] <= MAX_TAPS)


def _max_pool_scratch(node, shape) -> int:
    if not _max_pool_by_planes(node):
        return 0
    from .conv_planes import scratch_bytes
    return scratch_bytes(node, shape.vw)


SCRATCH["MaxPool"] = _max_pool_scratch


@kernel("AvgPool", "AvgPoolN")
def avg_pool_nd(k: KernelArgs):
    _pool_nd(k, False)


@kernel("ConvTranspose")
def conv_transpose(k: KernelArgs):
    """Scatter form: each input element times each tap adds into the output position
    in * stride + tap * dilation - pad_begin, when that falls inside y (the crop)."""
    b, cv = k.b, _DirectConv(k)
    mg, cg = cv.wc, cv.c // cv.g

    def init(idx):
        ni, mi = idx
        v = cv.bias_or_zero(mi)
        base = b.mul(b.add(b.mul(ni, i64(cv.m)), mi), i64(cv.oplane))
        with for_range(b, cv.oplane, name="ctz") as z:
            store_elem(b, v, b.gep(cv.y, [b.add(base, z)]), cv.dtype)
    _nest(b, (cv.n, cv.m), init, "cti")

    def per_channel(idx):
        ni, gi, ci = idx
        chan = b.add(b.mul(gi, i64(cg)), ci)
        xbase = b.mul(b.add(b.mul(ni, i64(cv.c)), chan), i64(cv.plane))

        def per_in(iidx):
            xv = load_elem(b, b.gep(cv.x, [_lin(b, iidx, cv.xs, xbase)]), cv.dtype)
            with for_range(b, mg, name="ctm") as mi:
                oc = b.add(b.mul(gi, i64(mg)), mi)
                ybase = b.mul(b.add(b.mul(ni, i64(cv.m)), oc), i64(cv.oplane))
                wbase = b.mul(b.add(b.mul(chan, i64(mg)), mi), i64(cv.kplane))

                def per_tap(kidx):
                    coords = cv.coords(iidx, kidx)
                    with b.if_then(_inside(b, coords, cv.out)):
                        wv = load_elem(b, b.gep(cv.w, [_lin(b, kidx, cv.ks, wbase)]), cv.dtype)
                        cv.accumulate(b.gep(cv.y, [_lin(b, coords, cv.os, ybase)]), xv, wv)
                _nest(b, cv.kern, per_tap, "ctk")
        _nest(b, cv.dims, per_in, "ctx")
    _nest(b, (cv.n, cv.g, cg), per_channel, "ctc")


# --------------------------------------------------------------------------- einsum
@kernel("Einsum")
def einsum(k: KernelArgs):
    """One loop per output label, then one per summed label; every operand reads through
    its strides per label (a repeated label sums its strides: a diagonal; a broadcast
    dimension of size 1 has stride 0)."""
    b = k.b
    (y, yt) = k.outs[0]
    xs = k.ins[0]
    shapes = [t.shape for _, t in xs]
    labels, out_labels = einsum_parse(k.attrs["equation"], shapes)
    sizes: dict = {}
    for ls, s in zip(labels, shapes):
        for l, d in zip(ls, s):
            if d != 1 or l not in sizes:
                sizes[l] = d
    summed = [l for ls in labels for l in ls if l not in out_labels]
    summed = list(dict.fromkeys(summed))
    order = list(out_labels) + summed
    strides = []
    for ls, s in zip(labels, shapes):
        own = contiguous_strides(s)
        per = {l: 0 for l in order}
        for l, d, st in zip(ls, s, own):
            if d != 1:
                per[l] += st
        strides.append([per[l] for l in order])
    dtype = yt.dtype
    acc_t = "f32" if dtype in ("f16", "bf16") else dtype
    ys = contiguous_strides([sizes[l] for l in out_labels])
    acc_p = b.alloca(register_type(acc_t))

    def per_out(oidx):
        b.store(const(0, acc_t), acc_p)

        def per_sum(sidx):
            idx = oidx + sidx
            em = ScalarEmitter(b, k.scalars)
            prodv = None
            for (ptr, t), st in zip(xs, strides):
                v = convert(b, load_elem(b, b.gep(ptr, [_lin(b, idx, st)]), t.dtype), acc_t)
                prodv = v if prodv is None else em.f_mul(prodv, v)
            b.store(em.f_add(Value(b.load(acc_p), acc_t), prodv).v, acc_p)
        _nest(b, [sizes[l] for l in summed], per_sum, "es")
        store_elem(b, Value(b.load(acc_p), acc_t), b.gep(y, [_lin(b, oidx, ys)]), dtype)
    _nest(b, [sizes[l] for l in out_labels], per_out, "eo")
