"""Convolutions.  A 2-D f32 Conv takes one of several strategies: a matrix product
(GEMM) over an im2col patch matrix (whole, or built panel by panel), read directly for a
pointwise one, or computed transposed for small output planes (conv_transposed.py) or over
a channel-blocked copy of the input, read in place (conv_blocked.py); direct
convolution over padded planes in explicit vectors when it has too few filters per group
for a GEMM tile (conv_planes.py); plain loops for other types.  N-D convolution and
ConvTranspose (but a 2x2 stride 2 one: conv_transpose_gemm.py) are direct loop nests."""
from __future__ import annotations

from math import gcd, prod
from typing import Optional

from ..gemm import emit_gemm, gemm_items, pack_panels_size
from ..llvmutil import for_range, i64
from ..loops import contiguous_strides
from ..parallel import Work, parallel, shares
from ..scalar import ScalarEmitter, Value, const, load_elem, store_elem
from ..packing import pack_weights
from .base import CHANNELS, DESCRIBE, PACKING, PRODUCT_SPACE, REPACK, SCRATCH, STRATEGY, KernelArgs, hook, kernel
from .common import inside, lin, nest
from .conv_blocked import (BlockedGeometry, blocked_items, blocked_weights, conv_is_blocked,
                           emit_conv_blocked)
from .conv_planes import (MAX_TAPS, PlaneGeometry, aligned_floats, conv_is_pointwise, conv_scratch_bytes,
                          emit_conv_planes, fill_plane, fill_plane_band, offsets_global, patch_panel,
                          zero_planes)
from .conv_winograd import (WinogradGeometry, conv_is_winograd, emit_conv_winograd, winograd_items,
                            winograd_weights)
from .conv_transposed import (conv_is_transposed, emit_conv_transposed, scratch_floats, transposed_items,
                              transposed_split_pixels)


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


def conv_uses_gemm(node) -> bool:
    # At least one whole register tile of filters (MR = 8 with AVX-512) per group: fewer
    # leave most of the tile idle, and direct convolution is faster (LeNet's 6-filter conv:
    # 21 -> 10 us).  Except a single-group pointwise convolution: it reads its input as B
    # directly (no patches), and idle tile rows cost less than the direct kernel's plane
    # copies (det_fpn's 24 -> 4 1x1 at 320x320: 1.71 -> 0.28 ms; 16 -> 6 at 112: 0.116 ->
    # 0.030 ms).
    m = node.inputs[1].type.shape[0]
    if node.group == 1 and m >= 2 and conv_is_pointwise(node):
        return True
    return m // node.group >= 8


def conv_panel_by_panel(node) -> bool:
    """im2col one panel at a time (gemm.emit_gemm's pack_panel) when the whole B would not
    stay in L2 (over 1 MB) but a group's filters mostly would (up to 768 KB): each panel is
    built in L1/L2 and used by every filter while there, instead of all of B being written
    to and read back from L3 (measured: ResNet-18 47.1 -> 40.9 ms, ResNet-50 93.8 -> 86.7;
    larger filter sets, or smaller B, measured no better)."""
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    k = cg * kh * kw
    return (m // node.group) * k * 4 <= 768 * 1024 and k * oh * ow * 4 > 1024 * 1024


def conv_by_planes(node) -> bool:
    """Direct f32 convolutions run over padded planes in explicit vectors (conv_planes.py)."""
    kh, kw = node.inputs[1].type.shape[2:]
    return not conv_uses_gemm(node) and node.outputs[0].type.dtype == "f32" and kh * kw <= MAX_TAPS


@hook(STRATEGY, "Conv")
def conv_strategy(ins, shape, packable, plan) -> str:
    """A 2-D convolution's strategy (plan.CONV_STRATEGIES), chosen once by the
    kernel-strategy pass: the kernel, its weights' packing, its scratch, its split and its
    epilogue all follow it.  Computed transposed only when its weights can be packed so."""
    node = ins.node
    if conv_by_planes(node):
        return "planes"
    if node.outputs[0].type.dtype != "f32":
        return "direct"
    if plan.winograd and conv_uses_gemm(node) and conv_is_winograd(node, shape) and packable(ins.operands[2][1]):
        return "winograd"
    if conv_uses_gemm(node) and conv_is_blocked(node, shape) and packable(ins.operands[2][1]):
        return "blocked"
    if conv_uses_gemm(node) and conv_is_transposed(node, shape) and packable(ins.operands[2][1]):
        return "transposed"
    if conv_is_pointwise(node):
        return "pointwise"
    if conv_reads_planes(node, shape.nr):
        return "gemm-planes"
    return "gemm-panels" if conv_panel_by_panel(node) else "gemm"


# Filters per group up to which the patch matrix is read in place (gemm-planes).
PLANES_MAX_FILTERS = 32
# The planes of a band of output rows stay in L2 while the product reads them (planes_band).
PLANES_BAND_BYTES = 512 * 1024


def planes_band(node, vw: int) -> Optional[int]:
    """Output rows per band when a gemm-planes convolution deals its planes a band at a time
    (conv_planes.fill_plane_band), each band read by the product while in L2, or None for
    the whole planes at once.  Bands when the planes exceed PLANES_BAND_BYTES and a band of
    that size computes at least as many rows as it re-deals (the KH - 1 it shares with the
    next).  Planes written whole and read back from L3 starved the product: det_fpn's
    96 -> 24 3x3 at 160x160 (11 MB of planes) ran at 39% of the FMA peak, in bands of 5
    output rows at 88% (23.2 -> 10.2 ms, Zen 4); a 3-channel stem at 640x640 (4.9 MB), dealt
    whole by every thread, 1.00 -> 0.95 ms."""
    geo = PlaneGeometry(node, vw)
    row_bytes = 4 * geo.cg * geo.sw * geo.cols        # a padded row of the group's channels
    if geo.cg * geo.size * 4 <= PLANES_BAND_BYTES:
        return None
    shared = (geo.kh - 1) * geo.dh
    out_rows = (PLANES_BAND_BYTES // row_bytes - shared - 1) // geo.sh + 1
    if out_rows < 1 or shared > out_rows * geo.sh or out_rows >= geo.oh:
        return None
    return out_rows


def conv_reads_planes(node, nr: int) -> bool:
    """A product with few filters per group (at most PLANES_MAX_FILTERS: four MR-row blocks),
    or with so few patch rows that a tile's rows read in place stay in L1 (in_place_rows_fit_l1),
    reads its patch matrix from the padded planes in place: row k = (channel, tap) of B is
    the plane row the tap reads (in the sub-plane of its column phase, for a column
    stride), so a table of K offsets replaces the im2col copy, which so few filter blocks do
    not amortize (det_fpn's 96 -> 24 3x3 at 160x160: the panel copies were a quarter of its
    time; a 3 -> 16 3x3 stride 2 stem at 640x640: 1.27 -> 1.05 ms).  More filters reuse each copied
    panel enough for its contiguous reads to pay when its rows are many (the ResNets' 3x3
    convolutions keep gemm-panels).  Its tiles run along output rows, so only where rows fill
    them (at most 1/8 of a tile's columns idle) and the patch matrix is large (over 256 KB; a
    small one is built whole, in L2)."""
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    tiles = -(-ow // nr) * nr
    few_filters = m // node.group <= PLANES_MAX_FILTERS
    return ((few_filters or in_place_rows_fit_l1(cg * kh * kw, nr)) and not conv_is_pointwise(node)
            and 8 * ow >= 7 * tiles and cg * kh * kw * oh * ow * 4 > 256 * 1024)


# L1 data cache of the smallest core we target (Zen 3 and Zen 4: 32 KB).
L1_BYTES = 32 * 1024


def in_place_rows_fit_l1(k: int, nr: int) -> bool:
    """Whether the K rows of one NR-pixel tile column, read in place from the planes (each an
    unaligned run of NR floats: one cache line more than its length), stay in L1 while every
    filter block runs over them.  Then the in-place product re-reads them from L1 and the
    im2col copy is pure cost, however many filters: ResNet's 7x7/2 stem, 3 -> 64 (K = 147),
    2.30 -> 2.10 ms; 16 -> 64 3x3 at 112 (K = 144) 2.24 -> 2.05; 3 -> 64 5x5 1.12 -> 1.06
    (Zen 4, 1 thread).  Past L1 the copied panels' contiguous rows win: 32 -> 64 3x3 at 56
    (K = 288) 1.08 -> 1.17 ms in place."""
    lines = (nr * 4) // 64 + 1
    return k * lines * 64 <= L1_BYTES


def _tap_offsets(geo: PlaneGeometry) -> list:
    """Where row k = (channel, tap row, tap column) of the patch matrix starts in the planes,
    for output pixel (0, 0): the tap column's sub-plane and column in it (PlaneGeometry.tap)."""
    return [ci * geo.size + geo.tap(c)[0] * geo.sub_plane + r * geo.dh * geo.cols + geo.tap(c)[1]
            for ci in range(geo.cg) for r in range(geo.kh) for c in range(geo.kw)]


@hook(PACKING, "Conv")
def conv_packing(ins, shape):
    """A GEMM convolution's constant weights (operand 2: y, x, w[, b]) as the product's A in
    MR-row blocks, or as the B of the transposed product."""
    strategy = ins.plan.strategy
    if strategy == "transposed":
        return 2, "t", None
    if strategy in ("gemm", "gemm-panels", "gemm-planes", "pointwise") and conv_uses_gemm(ins.node):
        return 2, "a", None
    return None


@hook(REPACK, "Conv")
def conv_repack(prog, ins, shape, users) -> bool:
    """The weights as conv_packing says; a channel-blocked product's transposed with their
    rows k in its order (channel block, tap, channel: conv_blocked.blocked_weights)."""
    if ins.plan.strategy == "winograd":
        return pack_weights(prog, ins, 2, "b", WinogradGeometry(ins.node, shape).nr, shape, users,
                            matrices=lambda data: winograd_weights(data, ins.node))
    if ins.plan.strategy == "blocked":
        g = BlockedGeometry(ins.node, shape)
        return pack_weights(prog, ins, 2, "b", g.nr, shape, users,
                            matrices=lambda data: blocked_weights(data, ins.node, g.vw))
    choice = conv_packing(ins, shape)
    return choice is not None and pack_weights(prog, ins, *choice, shape, users)


@hook(SCRATCH, "Conv")
def conv_scratch(ins, shape) -> int:
    node, strategy = ins.node, ins.plan.strategy
    if strategy == "planes":
        return conv_scratch_bytes(node, shape.vw)
    if strategy == "transposed":
        return 4 * scratch_floats(node, shape)
    if strategy == "blocked":
        return 4 * BlockedGeometry(node, shape).scratch_floats()
    if strategy == "winograd":
        return 4 * WinogradGeometry(node, shape).scratch_floats()    # a task's bands are no larger
    # Pointwise convolutions read the input as B directly (packing it measured no faster).
    if strategy not in ("gemm", "gemm-panels", "gemm-planes"):
        return 0
    cg, kh, kw = node.inputs[1].type.shape[1:]
    oh, ow = node.outputs[0].type.shape[2:]
    # The group's input channels in padded planes, then the patch matrix copied from them.
    planes = aligned_floats(cg * PlaneGeometry(node, shape.vw).size)
    if strategy == "gemm-planes":
        band = planes_band(node, shape.vw)
        return 4 * (aligned_floats(cg * PlaneGeometry(node, shape.vw).band(band).size) if band else planes)
    if strategy == "gemm-panels":
        return 4 * (planes + cg * kh * kw * shape.nr)
    return 4 * (planes + pack_panels_size(oh * ow, cg * kh * kw, shape))


@hook(PRODUCT_SPACE, "Conv")
def conv_product_space(ins, features: str = ""):
    """[batch, filters, pixels]: a matrix product stores whole rows of it; a direct
    convolution over planes with several input channels per group accumulates them in its
    output, and only a one-channel (depthwise) one keeps its sum in registers."""
    node, strategy = ins.node, ins.plan.strategy
    gemm = (strategy in ("gemm", "gemm-panels", "gemm-planes", "pointwise", "transposed", "blocked",
                             "winograd")
            and conv_uses_gemm(node))
    if not (gemm or (strategy == "planes" and node.inputs[1].type.shape[1] == 1)):
        return None
    n, m, oh, ow = node.outputs[0].type.shape
    return (n, m, oh * ow)


@hook(DESCRIBE, "Conv", "ConvN")
def describe_conv(node) -> str:
    window = "x".join(map(str, node.inputs[1].type.shape[2:]))
    text = f" {window} stride {'x'.join(map(str, node.strides))}"
    return text + (f" groups {node.group}" if node.group > 1 else "")


@kernel("Conv")
def conv(k: KernelArgs):
    node, strategy = k.node, k.strategy
    if strategy == "planes":
        return emit_conv_planes(k, k.gemm_shape.vw)
    if strategy == "direct":
        return conv_direct(k)
    if strategy == "transposed":
        return emit_conv_transposed(k)
    if strategy == "blocked":
        return emit_conv_blocked(k)
    if strategy == "winograd":
        return emit_conv_winograd(k)
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
    pointwise = strategy == "pointwise"
    a_packed = k.packed == "a"       # constant weights in blocks of MR rows (packing.py)
    mr = k.gemm_shape.mr
    a_stride = -(-mg // mr) * mr * K if a_packed else mg * K
    band = None
    if not pointwise:
        # Each input channel of a group is first copied into a zero-padded plane, its
        # columns dealt by remainder mod the column stride (conv_planes.py): every row of a
        # patch panel is then a few contiguous copies, with no bounds checks or gathers.
        geo = PlaneGeometry(node, k.gemm_shape.vw)
        if strategy == "gemm-planes":
            band = planes_band(node, k.gemm_shape.vw)
        if band:                  # the planes a band at a time, with the product over it
            geo = geo.band(band)
        nr = k.gemm_shape.nr
        planes, panels = k.scratch, b.gep(k.scratch, [i64(aligned_floats(cg * geo.size))])
        if not band:
            zero_planes(b, geo, planes, cg)
    # A split (conv_work) shares out the patch matrix's panels, or for a pointwise
    # convolution, the blocks of filters; every task deals the input planes in its own
    # scratch.  (Dealing them together, each task its share of the channels, then computing
    # in a second round did a tenth less work at 2 threads but took 2-7% longer: each core
    # then read half its planes from the other core's cache.)
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
                def channel(ci):
                    return b.gep(x, [b.mul(b.add(b.add(b.mul(img, i64(c_all)), b.mul(gi, i64(cg))), ci), i64(h * wd))])
                if not band:
                    with for_range(b, cg, name="deal") as ci:
                        fill_plane(b, geo, channel(ci), b.gep(planes, [b.mul(ci, i64(geo.size))]))
                bmat, ldb = panels, None
                if strategy == "gemm-planes":
                    bmat = planes
                elif strategy == "gemm-panels":
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
            table = None
            if strategy == "gemm-planes":
                table = (offsets_global(b.module, _tap_offsets(geo)), oh, ow, geo.sh * geo.cols)
            if band:
                # This task's output rows band by band: a band's padded rows dealt into the
                # planes, then the product reads them in place (B shifted so that output row
                # o0 reads the band's first row).
                lo, hi = split.range(b, oh)
                with for_range(b, hi, start=lo, step=band, name="band") as o0:
                    first = b.mul(o0, i64(geo.sh))
                    with for_range(b, cg, name="deal") as ci:
                        fill_plane_band(b, geo, channel(ci), b.gep(planes, [b.mul(ci, i64(geo.size))]), first)
                    o1 = b.add(o0, i64(band))
                    o1 = b.select(b.icmp_signed("<", o1, hi), o1, hi)
                    emit_gemm(b, k.gemm_shape, mg, N, K, a, K, b.gep(planes, [b.neg(b.mul(first, i64(geo.cols)))]),
                              None, out, N, row_init=row_init, epilogue=epi, name="cv", a_packed=a_packed,
                              b_table=table, image_rows=(o0, o1))
            else:
                emit_gemm(b, k.gemm_shape, mg, N, K, a, K, bmat, ldb, out, N, row_init=row_init,
                          epilogue=epi, name="cv", a_packed=a_packed, pack_panel=pack_panel,
                          split=split, split_rows=pointwise and pointwise_splits_rows(mg, k.gemm_shape, split.parts),
                          b_table=table, k_block=pointwise_k_block(k.gemm_shape, mg, N, K) if pointwise else None,
                          panels_outer=pointwise and pointwise_panels_outer(k.gemm_shape, mg, K, N))


@parallel("Conv")
def conv_work(node, shape, ins) -> Work:
    """What a convolution shares out (see conv): its groups when it runs over planes, the
    filter panels of the transposed product, the filter blocks of a pointwise one, the
    patch matrix's panels otherwise."""
    n, m, oh, ow = node.outputs[0].type.shape
    cg, kh, kw = node.inputs[1].type.shape[1:]
    flops = 2.0 * n * m * oh * ow * cg * kh * kw
    strategy = ins.plan.strategy
    if shape is None or strategy == "direct":
        return Work(1)
    if strategy == "planes":
        # Depthwise convolutions are memory-bound: worth splitting by the elements they
        # read and write, not their few FLOPs.  Unsplit after a split step, a core reads
        # the half of its input the other core wrote from that core's cache: slower at 2
        # threads than at 1 (MobileNetV2's 14x14 and 7x7 ones, 0.10 -> 0.18 ms).
        _, c, ih, iw = node.inputs[0].type.shape
        return Work(node.group, flops=flops, elements=n * (m * oh * ow + c * ih * iw))
    if strategy == "transposed":
        return Work(transposed_items(node, shape), flops=flops)
    if strategy == "blocked":
        return Work(blocked_items(node, shape), flops=flops)
    if strategy == "winograd":                  # bands of tile rows
        return Work(winograd_items(node, shape), flops=flops)
    if strategy == "gemm-planes":
        return Work(oh, flops=flops)          # whole image rows (gemm.emit_gemm's b_table)
    if strategy == "pointwise":                 # blocks of filters, or column panels
        mg = m // node.group
        return Work(max(gemm_items(mg, oh * ow, shape, True), gemm_items(mg, oh * ow, shape, False)), flops=flops)
    return Work(gemm_items(m // node.group, oh * ow, shape, False), flops=flops)


@hook(CHANNELS, "Conv")
def conv_channel_shares(ins, shape, parts: int):
    """The filters each task computes (see conv_work) when a split shares them out: a
    pointwise convolution's blocks of MR, a transposed one's panels of NR, a depthwise
    one's channels (each reading its own channel only)."""
    node, strategy = ins.node, ins.plan.strategy
    m, cg = node.inputs[1].type.shape[:2]
    c = node.inputs[0].type.shape[1]
    if strategy == "planes" and node.group == m == c and cg == 1:
        return shares(m, 1, parts, m), True
    if node.group != 1:
        return None
    if strategy == "pointwise" and pointwise_splits_rows(m, shape, parts):
        return shares(m // shape.mr, shape.mr, parts, m), False
    if strategy == "transposed" and not transposed_split_pixels(node, shape, parts):
        return shares(m // shape.nr, shape.nr, parts, m), False
    return None


def pointwise_splits_rows(filters: int, shape, parts: int) -> bool:
    """A split pointwise convolution shares out its blocks of MR filters (each task reads
    the whole input, once) when they divide among the tasks evenly or are many; else the
    column panels of its input (each task reads every filter: few).  MobileNetV2's 24
    filters at 56 x 56, three blocks, kept one of two cores idle a third of the time."""
    blocks = filters // shape.mr
    return blocks >= parts and (blocks % parts == 0 or blocks >= 4 * parts)


def pointwise_k_block(shape, filters: int, pixels: int, channels: int) -> Optional[int]:
    """Input channels per block of K for a pointwise convolution with AVX2's tiles
    (emit_gemm's k_block): as many rows of a tile's NR columns of the input as fill a
    quarter of the L1 lines they can map to.  Its planes' pitch decides which: a multiple of
    a cache line puts every row in the same few sets (56 x 56 floats, 196 lines: 16 of 64
    sets).  A 6 x 16 tile reads 64 bytes of B per 12 FMAs, too many for L2 to feed over all
    of K: 256 -> 64 at 56 x 56 1.36 -> 1.04 ms in blocks of 32 (64: 1.13, 128: 1.36);
    512 -> 128 at 28 x 28 1.14 -> 0.94-0.97 (32 to 128); 1024 -> 256 at 14 x 14 1.15 ->
    0.98 in blocks of 128 (Zen 4 compiled for x86-64-v3, 1 thread).  AVX-512's 8 x 32 tile
    reads 128 bytes per 16 FMAs and ran as fast over all of K (blocks of 64 to 256 at 28
    and 56: within 2%).  The partial sums are re-read by every block: while they stay in
    L2 (half of Zen 4's, 512 KB), or up to 2 MB when the input is the larger (more channels
    than filters; its rows then stay in L1).  256 -> 1024 at 14 x 14 (784 KB of them, a
    200 KB input) took 0.98 -> 1.46 ms in blocks; 256 -> 64 at 56 x 56 (784 KB) 1.39 -> 1.00,
    512 -> 256 at 28 x 28 (784 KB) 2.76 -> 2.12, 256 -> 128 at 56 x 56 (1.6 MB) 3.04 ->
    2.48, det_fpn's 384 -> 96 at 40 x 40 (600 KB) 1.66 -> 1.16 (inputs in cache)."""
    sums = filters * pixels * 4
    if shape.vw != 8 or sums > (2048 if channels > filters else 512) * 1024:
        return None
    pitch = pixels * 4
    sets, ways, line = L1_BYTES // (8 * 64), 8, 64
    if pitch % line == 0:
        sets //= gcd(pitch // line, sets)
    rows = sets * ways // 4 // max(1, shape.nr * 4 // line)
    block = 1 << (rows.bit_length() - 1)
    return max(32, block)


def pointwise_panels_outer(shape, filters: int, channels: int, pixels: int) -> bool:
    """Whether a pointwise convolution runs each column panel of its input through every
    block of filters before the next (emit_gemm's panels_outer), so that an input larger
    than L2 streams from memory once instead of once per block of MR filters.  Where it
    pays: few filters (all of A in L1), an input over 2 MB, and no more filters than
    channels -- the input, not the output, is the traffic that matters.  det_fpn at
    160 x 160 (Zen 4, 1 thread, in the model, ms): 48 -> 24 2.17 -> 1.25, 72 -> 24
    8.7 -> 1.17 (x86-64-v3); 2.4 -> 1.4 and 2.5 -> 1.5 with AVX-512.  With more filters
    than channels, each panel writes every output row at once, a plane apart (a multiple
    of 4 KB: all in one L1 set), and rows in turn stream better: 24 -> 72 at 160 x 160
    1.03 -> 1.25, 16 -> 48 at 320 x 320 2.46 -> 3.64 (inputs in cache).  Smaller inputs,
    warm from the step before, showed no gain: MobileNetV2's 32 -> 16 at 112 x 112 (1.6 MB)
    0.147 -> 0.199 ms with AVX-512, 0.171 -> 0.189 on x86-64-v3, det_fpn's 72 -> 40 at
    80 x 80 (1.8 MB) 0.41 -> 0.52 with AVX-512 (in the models; unchanged code varied by
    0.14-0.16 on that shared machine)."""
    return (pointwise_k_block(shape, filters, pixels, channels) is None and filters >= shape.mr
            and filters <= channels and filters * channels * 4 <= L1_BYTES
            and channels * pixels * 4 > 2 * 1024 * 1024)


# --------------------------------------------------------------------------- N-D and transposed convolution
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
            yp = b.gep(cv.y, [lin(b, oidx, cv.os, ybase)])
            store_elem(b, cv.bias_or_zero(mi), yp, cv.dtype)
            with for_range(b, cg, name="cnc") as ci:
                chan = b.add(b.mul(gi, i64(cg)), ci)
                xbase = b.mul(b.add(b.mul(ni, i64(cv.c)), chan), i64(cv.plane))
                wbase = b.mul(b.add(b.mul(mi, i64(cg)), ci), i64(cv.kplane))

                def per_tap(kidx):
                    coords = cv.coords(oidx, kidx)
                    with b.if_then(inside(b, coords, cv.dims)):
                        xv = load_elem(b, b.gep(cv.x, [lin(b, coords, cv.xs, xbase)]), cv.dtype)
                        wv = load_elem(b, b.gep(cv.w, [lin(b, kidx, cv.ks, wbase)]), cv.dtype)
                        cv.accumulate(yp, xv, wv)
                nest(b, cv.kern, per_tap, "cnk")
        nest(b, cv.out, per_out, "cno")
    nest(b, (cv.n, cv.m), per_filter, "cnf")


def conv_transpose_scatter(k: KernelArgs):
    """Any ConvTranspose (conv_transpose_gemm.py registers the kernel), in scatter form: each input element times each tap adds into the output position
    in * stride + tap * dilation - pad_begin, when that falls inside y (the crop)."""
    b, cv = k.b, _DirectConv(k)
    mg, cg = cv.wc, cv.c // cv.g

    def init(idx):
        ni, mi = idx
        v = cv.bias_or_zero(mi)
        base = b.mul(b.add(b.mul(ni, i64(cv.m)), mi), i64(cv.oplane))
        with for_range(b, cv.oplane, name="ctz") as z:
            store_elem(b, v, b.gep(cv.y, [b.add(base, z)]), cv.dtype)
    nest(b, (cv.n, cv.m), init, "cti")

    def per_channel(idx):
        ni, gi, ci = idx
        chan = b.add(b.mul(gi, i64(cg)), ci)
        xbase = b.mul(b.add(b.mul(ni, i64(cv.c)), chan), i64(cv.plane))

        def per_in(iidx):
            xv = load_elem(b, b.gep(cv.x, [lin(b, iidx, cv.xs, xbase)]), cv.dtype)
            with for_range(b, mg, name="ctm") as mi:
                oc = b.add(b.mul(gi, i64(mg)), mi)
                ybase = b.mul(b.add(b.mul(ni, i64(cv.m)), oc), i64(cv.oplane))
                wbase = b.mul(b.add(b.mul(chan, i64(mg)), mi), i64(cv.kplane))

                def per_tap(kidx):
                    coords = cv.coords(iidx, kidx)
                    with b.if_then(inside(b, coords, cv.out)):
                        wv = load_elem(b, b.gep(cv.w, [lin(b, kidx, cv.ks, wbase)]), cv.dtype)
                        cv.accumulate(b.gep(cv.y, [lin(b, coords, cv.os, ybase)]), xv, wv)
                nest(b, cv.kern, per_tap, "ctk")
        nest(b, cv.dims, per_in, "ctx")
    nest(b, (cv.n, cv.g, cg), per_channel, "ctc")
