"""Loop nests for the non-elementwise primitives (the `extern` list of
specs/cpu_kernels.glowdef), specialized at compile time on shapes and attributes.

Each emitter gets a `KernelArgs`: the builder positioned in the kernel's function, the
result pointers and the operand pointers (None for an absent optional operand, a list for
a variadic one), each with its Type.  Emitters register themselves in `KERNELS`.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...speclib.shapes import shape_range
from .conv_planes import conv_is_pointwise
from .parallel import WHOLE, Work, parallel
from .llvmutil import I64, for_range, i64, is_float, register_type, storage_type
from .loops import broadcast_strides, contiguous_strides, strided_loops
from .scalar import ScalarEmitter, Value, const, load_elem, store_elem

KERNELS: dict[str, Callable] = {}


def kernel(*names):
    def register(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return register


# Ops whose kernel needs scratch memory: op -> (node, gemm shape) -> bytes.  The module
# holds one scratch buffer as large as the largest need (kernels run one after another).
SCRATCH: dict[str, Callable] = {}


class KernelArgs:
    def __init__(self, b: ir.IRBuilder, node, outs: list, ins: list, scalars: dict,
                 gemm_shape=None, scratch=None):
        self.b, self.node, self.outs, self.ins, self.scalars = b, node, outs, ins, scalars
        self.gemm_shape = gemm_shape      # register tile for the host (see gemm.py)
        self.scratch = scratch            # float* to the module's scratch buffer
        self.epilogue = None              # elementwise run fused into the store (epilogue.py)
        self.packed = None                # "a" / "b": a constant operand repacked (packing.py)
        self.packed_nr = None             # the width of B's packed panels
        self.split = WHOLE                # the share of the work this function does (parallel.py)

    @property
    def attrs(self):
        return self.node.attr_values()


def _copy_loops(k: KernelArgs, shape, src, src_map, src_off, dst, dst_map, dst_off, dtype):
    def body(b, ptrs):
        b.store(b.load(ptrs[0]), ptrs[1])
    strided_loops(k.b, shape, [src, dst], [src_map, dst_map], [src_off, dst_off], body)


# --------------------------------------------------------------------------- data movement
@kernel("Transpose")
def transpose(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    xs = contiguous_strides(xt.shape)
    perm = k.attrs["perm"]
    _copy_loops(k, yt.shape, x, [xs[p] for p in perm], 0, y, contiguous_strides(yt.shape), 0, yt.dtype)


@kernel("Expand")
def expand(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    _copy_loops(k, yt.shape, x, broadcast_strides(xt.shape, yt.shape), 0, y,
                contiguous_strides(yt.shape), 0, yt.dtype)


@kernel("Reshape")
def reshape(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    _copy_loops(k, (yt.size,), x, (1,), 0, y, (1,), 0, yt.dtype)


@kernel("Concat")
def concat(k: KernelArgs):
    (y, yt) = k.outs[0]
    axis = k.attrs["axis"]
    ys = contiguous_strides(yt.shape)
    at = 0
    for x, xt in k.ins[0]:
        _copy_loops(k, xt.shape, x, contiguous_strides(xt.shape), 0, y, ys, at * ys[axis], yt.dtype)
        at += xt.shape[axis]


@kernel("Slice")
def slice_(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    xs = contiguous_strides(xt.shape)
    a = k.attrs
    offset = sum(s * st for s, st in zip(a["starts"], xs))
    _copy_loops(k, yt.shape, x, [st * step for st, step in zip(xs, a["steps"])], offset,
                y, contiguous_strides(yt.shape), 0, yt.dtype)


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
    with for_range(b, n_outer, name="o") as o:
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


@kernel("Shape", "Size")
def shape_of(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    if k.node.OP == "Size":
        values = [xt.size]
    else:
        values = list(shape_range(xt.shape, k.attrs["start"], k.attrs["end"]))
    for i, v in enumerate(values):
        b.store(i64(v), b.gep(y, [i64(i)]))


# --------------------------------------------------------------------------- reductions
_REDUCE = {"ReduceSum": ("add", 0), "ReduceMax": ("max", "-inf"), "ReduceMin": ("min", "inf"),
           "ReduceProd": ("mul", 1)}


def _identity(op: str, dtype: str):
    init = _REDUCE[op][1]
    if init in ("-inf", "inf"):
        if is_float(dtype):
            return float(init)
        import numpy as np
        from ...engine.types import numpy_dtype
        info = np.iinfo(numpy_dtype(dtype))
        return info.min if init == "-inf" else info.max
    return init


@kernel(*_REDUCE)
def reduce_(k: KernelArgs):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    axes = set(k.attrs["axes"]) if len(k.attrs["axes"]) else set(range(xt.rank))
    op = k.node.OP
    init = Value(const(_identity(op, yt.dtype), yt.dtype), yt.dtype)

    def fill(b, ptrs):
        store_elem(b, init, ptrs[0], yt.dtype)
    strided_loops(k.b, (yt.size,), [y], [(1,)], [0], fill, name="f")
    # y viewed with x's rank: reduced axes have stride 0.
    kept = [1 if i in axes else d for i, d in enumerate(xt.shape)]
    ymap = [0 if i in axes else s for i, s in enumerate(contiguous_strides(kept))]
    fname = _REDUCE[op][0]

    def body(b, ptrs):
        em = ScalarEmitter(b, k.scalars)
        acc = load_elem(b, ptrs[1], yt.dtype)
        v = load_elem(b, ptrs[0], xt.dtype)
        store_elem(b, getattr(em, "f_" + fname)(acc, v), ptrs[1], yt.dtype)
    strided_loops(k.b, xt.shape, [x, y], [contiguous_strides(xt.shape), ymap], [0, 0], body)


# --------------------------------------------------------------------------- linear algebra
@kernel("BatchMatMul")
def batch_matmul(k: KernelArgs):
    (y, yt), (a, at), (c, _) = k.outs[0], k.ins[0], k.ins[1]
    if k.gemm_shape is None or yt.dtype != "f32":
        return batch_matmul_loops(k)
    from .gemm import emit_gemm, pack_panels_size
    b = k.b
    nb, m, kk = at.shape
    n = k.node.inputs[1].type.shape[2]
    packed = k.packed == "b"          # a constant rhs in panels (packing.py)
    width = k.packed_nr if packed else None
    c_stride = pack_panels_size(n, kk, k.gemm_shape, width) if packed else kk * n
    # A split (bmm_work) shares out the batch, or else B's panels or A's row blocks.
    split = k.split
    by_batch = nb > 1
    lo, hi = split.range(b, nb) if by_batch else (i64(0), i64(nb))
    inner = WHOLE if by_batch else split
    with for_range(b, hi, start=lo, name="bmm") as bi:
        epi = None
        if k.epilogue is not None:
            epi = lambda bb, v, row, col, valid: k.epilogue(bb, v, bi, row, col, valid)  # noqa: E731
        emit_gemm(b, k.gemm_shape, m, n, kk, b.gep(a, [b.mul(bi, i64(m * kk))]), kk,
                  b.gep(c, [b.mul(bi, i64(c_stride))]), None if packed else n,
                  b.gep(y, [b.mul(bi, i64(m * n))]), n, epilogue=epi, name="mm", panel_nr=width,
                  split=inner, split_rows=not packed)


@parallel("BatchMatMul")
def bmm_work(node, shape, ins) -> Work:
    from .gemm import gemm_items
    nb, m, kk = node.inputs[0].type.shape
    n = node.inputs[1].type.shape[2]
    if shape is None or node.outputs[0].type.dtype != "f32":
        return Work(1)
    packed = getattr(ins, "packed", None) == "b"
    items = nb if nb > 1 else gemm_items(m, n, shape, not packed, getattr(ins, "packed_nr", None))
    # A product with few rows streams B from memory: its time is B's size, not its FLOPs.
    return Work(items, flops=2.0 * nb * m * n * kk, elements=nb * kk * n / 4)


def batch_matmul_loops(k: KernelArgs):
    """Any element type: plain loops (i, k, j order, so the j loop vectorizes)."""
    b = k.b
    (y, yt), (a, at), (c, ct) = k.outs[0], k.ins[0], k.ins[1]
    nb, m, kk = at.shape
    n = ct.shape[2]
    dtype = yt.dtype
    em = ScalarEmitter(b, k.scalars)
    zero = Value(const(0, dtype), dtype)
    with for_range(b, nb, name="bb") as bb:
        with for_range(b, m, name="m") as mi:
            yrow = b.add(b.mul(bb, i64(m * n)), b.mul(mi, i64(n)))
            with for_range(b, n, name="z") as j:
                store_elem(b, zero, b.gep(y, [b.add(yrow, j)]), dtype)
            with for_range(b, kk, name="k") as ki:
                av = load_elem(b, b.gep(a, [b.add(b.mul(bb, i64(m * kk)), b.add(b.mul(mi, i64(kk)), ki))]), dtype)
                crow = b.add(b.mul(bb, i64(kk * n)), b.mul(ki, i64(n)))
                with for_range(b, n, name="n") as j:
                    p = b.gep(y, [b.add(yrow, j)])
                    cv = load_elem(b, b.gep(c, [b.add(crow, j)]), dtype)
                    store_elem(b, em.f_add(load_elem(b, p, dtype), em.f_mul(av, cv)), p, dtype)


# --------------------------------------------------------------------------- convolution
def _valid_range(b, k_idx, pad, stride, dil, in_size, out_size):
    """Output positions o whose input o*stride - pad + k*dil lies inside [0, in_size)."""
    # lo = ceil((pad - k*dil) / stride) clamped at 0; hi = floor((in-1+pad-k*dil)/stride)+1
    kd = b.mul(k_idx, i64(dil))
    num_lo = b.sub(i64(pad), kd)
    lo = b.sdiv(b.add(num_lo, i64(stride - 1)), i64(stride))
    lo = b.select(b.icmp_signed("<", num_lo, i64(0)), i64(0), lo)
    num_hi = b.sub(i64(in_size - 1 + pad), kd)
    hi = b.add(b.sdiv(num_hi, i64(stride)), i64(1))
    hi = b.select(b.icmp_signed("<", num_hi, i64(0)), i64(0), hi)
    hi = b.select(b.icmp_signed(">", hi, i64(out_size)), i64(out_size), hi)
    return lo, hi


def conv_direct(k: KernelArgs):
    """Direct convolution, vectorized along output columns: for depthwise and other
    convolutions with few filters per group, where a matrix product has nothing to block."""
    b = k.b
    (y, yt), (x, xt), (w, wt) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    n, c, h, wd = xt.shape
    m, cg, kh, kw = wt.shape
    oh, ow = yt.shape[2:]
    a = k.attrs
    (sh, sw), (dh, dw), (pt, pl) = a["strides"], a["dilations"], a["pads"][:2]
    g = a["group"]
    mg = m // g
    dtype = yt.dtype
    em = ScalarEmitter(b, k.scalars)
    with for_range(b, n, name="n") as ni:
        with for_range(b, m, name="m") as mi:
            ybase = b.mul(b.add(b.mul(ni, i64(m)), mi), i64(oh * ow))
            init = (load_elem(b, b.gep(bias[0], [mi]), dtype) if bias is not None
                    else Value(const(0, dtype), dtype))
            with for_range(b, oh * ow, name="z") as z:
                store_elem(b, init, b.gep(y, [b.add(ybase, z)]), dtype)
            gi = b.sdiv(mi, i64(mg))
            with for_range(b, cg, name="c") as ci:
                chan = b.add(b.mul(gi, i64(cg)), ci)
                xbase = b.mul(b.add(b.mul(ni, i64(c)), chan), i64(h * wd))
                # Row by row: the output row takes all KH * KW taps while it sits in L1.
                with for_range(b, oh, name="oh") as ohi:
                    yrow = b.add(ybase, b.mul(ohi, i64(ow)))
                    with for_range(b, kh, name="kh") as khi:
                        ih = b.add(b.sub(b.mul(ohi, i64(sh)), i64(pt)), b.mul(khi, i64(dh)))
                        inside = b.and_(b.icmp_signed(">=", ih, i64(0)), b.icmp_signed("<", ih, i64(h)))
                        with b.if_then(inside):
                            xrow = b.add(xbase, b.mul(ih, i64(wd)))
                            with for_range(b, kw, name="kw") as kwi:
                                ow_lo, ow_hi = _valid_range(b, kwi, pl, sw, dw, wd, ow)
                                widx = b.add(b.mul(b.add(b.mul(mi, i64(cg)), ci), i64(kh * kw)),
                                             b.add(b.mul(khi, i64(kw)), kwi))
                                wv = load_elem(b, b.gep(w, [widx]), dtype)
                                with for_range(b, ow_hi, start=ow_lo, name="ow") as owi:
                                    iw = b.add(b.sub(b.mul(owi, i64(sw)), i64(pl)), b.mul(kwi, i64(dw)))
                                    xv = load_elem(b, b.gep(x, [b.add(xrow, iw)]), dtype)
                                    p = b.gep(y, [b.add(yrow, owi)])
                                    store_elem(b, em.f_add(load_elem(b, p, dtype), em.f_mul(wv, xv)), p, dtype)


# --------------------------------------------------------------------------- pooling
# MaxPool and AvgPool (2-D) are kernels_more._pool_nd at rank 2.


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


def _conv_uses_gemm(node) -> bool:
    # At least one whole register tile of filters (MR = 8 with AVX-512) per group: fewer
    # leave most of the tile idle, and direct convolution is faster (LeNet's 6-filter conv:
    # 21 -> 10 us).
    m = node.inputs[1].type.shape[0]
    return m // node.group >= 8


def _conv_panel_by_panel(node) -> bool:
    """im2col one panel at a time (gemm.emit_gemm's pack_panel) when the whole B would not
    stay in L2 (over 1 MB) but a group's filters mostly would (up to 768 KB): each panel is
    built in L1/L2 and used by every filter while there, instead of all of B being written
    to and read back from L3 (measured: ResNet-18 47.1 -> 40.9 ms, ResNet-50 93.8 -> 86.7;
    larger filter sets, or smaller B, measured no better)."""
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    k = cg * kh * kw
    return (m // node.group) * k * 4 <= 768 * 1024 and k * oh * ow * 4 > 1024 * 1024


def _conv_by_planes(node) -> bool:
    """Direct f32 convolutions run over padded planes in explicit vectors (conv_planes.py)."""
    from .conv_planes import MAX_TAPS
    kh, kw = node.inputs[1].type.shape[2:]
    return not _conv_uses_gemm(node) and node.outputs[0].type.dtype == "f32" and kh * kw <= MAX_TAPS


def conv_weight_layout(node, shape):
    """How a Conv's constant f32 weights are packed for its kernel (packing.py)."""
    if node.outputs[0].type.dtype != "f32" or not _conv_uses_gemm(node):
        return None
    from .conv_transposed import conv_is_transposed
    return "t" if conv_is_transposed(node, shape) else "a"


def _conv_scratch(node, shape) -> int:
    need = _conv_scratch_untransposed(node, shape)
    if conv_weight_layout(node, shape) == "t":
        # (Weights that could not be packed transposed take the other path: room for both.)
        from .conv_transposed import scratch_floats
        need = max(need, 4 * scratch_floats(node, shape))
    return need


def _conv_scratch_untransposed(node, shape) -> int:
    if _conv_by_planes(node):
        from .conv_planes import scratch_bytes
        return scratch_bytes(node, shape.vw)
    # Pointwise convolutions read the input as B directly (packing it measured no faster).
    if not _conv_uses_gemm(node) or conv_is_pointwise(node) or node.outputs[0].type.dtype != "f32":
        return 0
    from .conv_planes import PlaneGeometry, aligned_floats
    from .gemm import pack_panels_size
    cg, kh, kw = node.inputs[1].type.shape[1:]
    oh, ow = node.outputs[0].type.shape[2:]
    # The group's input channels in padded planes, then the patch matrix copied from them.
    planes = aligned_floats(cg * PlaneGeometry(node, shape.vw).size)
    if _conv_panel_by_panel(node):
        return 4 * (planes + cg * kh * kw * shape.nr)
    return 4 * (planes + pack_panels_size(oh * ow, cg * kh * kw, shape))


SCRATCH["Conv"] = _conv_scratch


@kernel("Conv")
def conv(k: KernelArgs):
    node = k.node
    if _conv_by_planes(node):
        from .conv_planes import emit_conv_planes
        return emit_conv_planes(k, k.gemm_shape.vw)
    if node.outputs[0].type.dtype != "f32":
        return conv_direct(k)
    if k.packed == "t":
        from .conv_transposed import emit_conv_transposed
        return emit_conv_transposed(k)
    from .gemm import emit_gemm
    b = k.b
    (y, yt), (x, xt), (w, _) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    n_img, c_all, h, wd = xt.shape
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = yt.shape[2:]
    g = node.group
    mg = m // g
    K = cg * kh * kw
    N = oh * ow
    pointwise = conv_is_pointwise(node)
    a_packed = k.packed == "a"       # constant weights in blocks of MR rows (packing.py)
    mr = k.gemm_shape.mr
    a_stride = -(-mg // mr) * mr * K if a_packed else mg * K
    if not pointwise:
        # Each input channel of a group is first copied into a zero-padded plane, its
        # columns dealt by remainder mod the column stride (conv_planes.py): every row of a
        # patch panel is then a few contiguous copies, with no bounds checks or gathers.
        from .conv_planes import PlaneGeometry, aligned_floats, fill_plane, patch_panel, zero_planes
        geo = PlaneGeometry(node, k.gemm_shape.vw)
        planes, panels = k.scratch, b.gep(k.scratch, [i64(aligned_floats(cg * geo.size))])
        zero_planes(b, geo, planes, cg)
        nr = k.gemm_shape.nr
    # A split (conv_work) shares out the patch matrix's panels, or for a pointwise
    # convolution, the blocks of filters; every task deals the input planes in its own scratch.
    split = k.split
    with for_range(b, n_img, name="img") as img:
        with for_range(b, g, name="grp") as gi:
            a = b.gep(w, [b.mul(gi, i64(a_stride))])
            out = b.gep(y, [b.mul(b.add(b.mul(img, i64(m)), b.mul(gi, i64(mg))), i64(N))])
            pack_panel = None
            if pointwise:
                bmat = b.gep(x, [b.mul(b.add(b.mul(img, i64(c_all)), b.mul(gi, i64(cg))), i64(h * wd))])
                ldb = N
            else:
                with for_range(b, cg, name="deal") as ci:
                    chan = b.mul(b.add(b.add(b.mul(img, i64(c_all)), b.mul(gi, i64(cg))), ci), i64(h * wd))
                    fill_plane(b, geo, b.gep(x, [chan]), b.gep(planes, [b.mul(ci, i64(geo.size))]))
                bmat, ldb = panels, None
                if _conv_panel_by_panel(node):
                    pack_panel = lambda p: patch_panel(b, geo, planes, panels, nr, b.mul(p, i64(nr)))  # noqa: E731
                else:
                    def build(p):
                        patch_panel(b, geo, planes, b.gep(panels, [b.mul(p, i64(K * nr))]), nr, b.mul(p, i64(nr)))
                    lo, hi = split.range(b, N // nr)
                    with for_range(b, hi, start=lo, name="panel") as p:
                        build(p)
                    if N % nr:
                        with b.if_then(split.is_last(b)):
                            build(i64(N // nr))
            row_init = None
            if bias is not None:
                bptr = b.gep(bias[0], [b.mul(gi, i64(mg))])
                row_init = lambda row: b.load(b.gep(bptr, [row]))  # noqa: E731
            epi = None
            if k.epilogue is not None:
                chan0 = b.mul(gi, i64(mg))
                epi = lambda bb, v, row, col, valid: k.epilogue(bb, v, img, bb.add(chan0, row), col, valid)  # noqa: E731
            emit_gemm(b, k.gemm_shape, mg, N, K, a, K, bmat, ldb, out, N, row_init=row_init,
                      epilogue=epi, name="cv", a_packed=a_packed, pack_panel=pack_panel,
                      split=split, split_rows=pointwise)


@parallel("Conv")
def conv_work(node, shape, ins) -> Work:
    """What a convolution shares out (see conv): its groups when it runs over planes, the
    filter panels of the transposed product, the filter blocks of a pointwise one, the
    patch matrix's panels otherwise."""
    from .conv_transposed import transposed_items
    from .gemm import gemm_items
    n, m, oh, ow = node.outputs[0].type.shape
    cg, kh, kw = node.inputs[1].type.shape[1:]
    flops = 2.0 * n * m * oh * ow * cg * kh * kw
    if shape is None or node.outputs[0].type.dtype != "f32":
        return Work(1)
    if _conv_by_planes(node):
        return Work(node.group, flops=flops)
    if getattr(ins, "packed", None) == "t":
        return Work(transposed_items(node, shape), flops=flops)
    pointwise = conv_is_pointwise(node)
    return Work(gemm_items(m // node.group, oh * ow, shape, pointwise), flops=flops)
