"""Convolutions over a channel-blocked copy of their input (NCHWc), computed transposed.

The im2col strategies copy every input channel into a padded plane, then every patch panel
out of the planes: the panel copies were 8.6% of ResNet's 64 -> 64 3x3 at 56 x 56 and the
plane zeroing 1.6%.  Here each image is copied once, into a zero-padded scratch

    X[cb][Hp][Wp][VW]          (channel blocks of VW = the vector width)

in VW x VW register transposes, and the product is computed transposed, along the filters
(as conv_transposed.py does):

    C^T [pixels x filters] = A [pixels x K] @ W^T [K x filters],   k = (cb, kh, kw, ci)

with A read in place: A[p][k] = X[tap(cb, kh, kw) + base(p) + ci], base(p) the corner of
pixel p's window.  The micro-kernel broadcasts A's elements straight from X -- a
constant table of K offsets, one pointer per pixel row of the tile, so tiles of MR pixels
may cross output rows (7 x 7 = 49 pixels need no masks) -- and W^T is packed at compile
time in NR-filter panels with its rows in that order (packing layout "b" of W^T,
conv.conv_repack).  C^T goes to a scratch band of pixels, stored back to NCHW (through the
bias and the fused epilogue) while in cache by conv_transposed's register transposes.

Keeping NCHWc between two blocked convolutions (the producer storing C^T straight into the
consumer's X, the consumer skipping its copy) was measured before being built, and does not
pay: with the copy and the store-back both removed (results wrong: a bound on the gain), 3x3
64->64 @56 took 0.95 times as long, 128 @28 0.98, 256 @14 0.97, 512 @7 0.96-0.97 (Zen 4, 1
thread; for x86-64-v3 0.96 @56, within the noise at the others), whole models with every
blocked convolution so 0.98 (ResNet-18; 0.98-0.99 for x86-64-v3) and 1.00 (ResNet-50),
medians of paired runs.  A chain saves one copy and one store-back per pair of convolutions,
about half of that bound, and det_fpn has no blocked convolution.
"""
from __future__ import annotations

import math

import numpy as np

from llvmlite import ir

from ..gemm import GemmShape, emit_gemm
from ..llvmutil import for_range, i64
from ..parallel import WHOLE, shares
from ..vectors import f32_vector, prefetch, transpose_block, vload, vstore
from .common import clamp
from .conv_planes import aligned_floats, conv_is_pointwise, offsets_global
from .conv_transposed import conv_is_transposed, pixel_block, pixel_tiles, store_ct_block

# The C^T band of pixels the product fills before it is stored back: about this many bytes
# (kept in L1/L2 between the two; 16 KB to 64 KB measured alike within the noise).
BAND_BYTES = 32 * 1024


def conv_is_blocked(node, shape) -> bool:
    """Where the channel-blocked product applies and pays: a single-group f32 convolution
    with whole blocks of VW input channels, whole panels of NR filters, not pointwise (a 1x1
    at stride 1 reads its input in place as it is; but see _pointwise_panel_by_panel).
    ResNet's 3x3 convolutions, against the im2col strategies (Zen 4, 1 thread, ms): 64->64
    @56 2.26 -> 2.11, 64->128 /2 @56 1.10 -> 1.06, 128->128 @28 2.19 -> 2.09, 256->256 @14
    2.19 -> 2.12, 512->512 @7 2.24 -> 2.11 (the last two transposed before).  A half-empty
    panel does not: 16->16 @320 5.0 -> 9.4 (gemm-planes).  ResNet-18's
    1x1 stride 2 ones: 64->128 @56 0.94 times as long, 128->256 @28 0.92, 256->512 @14 0.91.
    On AVX2 (x86-64-v3): 64->64 @56 0.87, 128->128 @28 0.93, 256->256 @14 0.98-1.05,
    512->512 @7 0.90-1.03, 16->16 @320 0.95-1.06 (within the noise of a shared machine)."""
    m, cg, kh, kw = node.inputs[1].type.shape
    return (node.group == 1 and node.outputs[0].type.dtype == "f32" and cg % shape.vw == 0
            and m % blocked_tile(m, shape).nr == 0 and kh * kw <= 64
            and (not conv_is_pointwise(node) or _pointwise_panel_by_panel(node, shape))
            and not _copies_unread_input(node)
            and not (_ymm_panels(m, shape) and 4 * int(np.prod(node.inputs[0].type.shape)) > YMM_PANELS_MAX_COPY))


def _pointwise_panel_by_panel(node, shape) -> bool:
    """A pointwise convolution computed transposed (its pixels fill the vector lanes badly)
    whose weights exceed L2, at no more than POINTWISE_BLOCKED_PIXELS pixels (its C^T then
    fits one band, BlockedGeometry.panels_outer): blocked, each panel of its weights read
    once from memory (prefetched) and used by every tile of pixels, where the transposed
    product streamed all of them once per block of pixels.  ResNet-50's last stage (weights
    from memory; Zen 4, 1 thread, each kernel's fastest of 30 runs in 4 processes, Mcycles):
    512 -> 2048 at 7 x 7 2.77 -> 2.59 on x86-64-v3, 2.54 -> 2.55 with AVX-512 (whose panels
    are not prefetched, BlockedGeometry.prefetch); 2048 -> 512 2.72 -> 2.60 and 2.52 -> 2.43
    (whole model, 4 and 3 processes).  Its 1024 -> 512 at 14 x 14 measured 1.01 times as long
    with AVX-512 (1.08 on x86-64-v3, where it is not transposed but pointwise: each block of
    filters reads its weights once there).  MobileNetV2's 320 -> 1280 at 7 x 7: 1.00 -> 1.00
    Mcycles on x86-64-v3."""
    m, cg = node.inputs[1].type.shape[:2]
    oh, ow = node.outputs[0].type.shape[2:]
    return (oh * ow <= POINTWISE_BLOCKED_PIXELS and 4 * cg * m > L2_BYTES and 4 * oh * ow * m <= WHOLE_BAND_BYTES
            and conv_is_transposed(node, shape))


# (ResNet-50's 7 x 7: 49 pixels, nine AVX2 tiles per panel.)
POINTWISE_BLOCKED_PIXELS = 64


def blocked_tile(filters: int, shape) -> GemmShape:
    """The product's register tile, MR pixels x NV vectors of filters: the target's, unless
    its filter panels do not divide the filters and panels of three AVX2 vectors do (4 x 24:
    as many accumulators as 6 x 16).  det_fpn's 96 -> 24 3x3 at 160 x 160 (x86-64-v3, Zen 4,
    1 thread, in the model): gemm-planes 12.8 ms, blocked in 24-filter panels 11.5 ms."""
    if shape.vw == 8 and shape.nv == 2 and filters % shape.nr and filters % (3 * shape.vw) == 0:
        return GemmShape(shape.vw, shape.mr * shape.nv // 3, 3, shape.features)
    if _ymm_panels(filters, shape):
        return GemmShape(8, 8, 3, shape.features)
    return shape


def _ymm_panels(filters: int, shape) -> bool:
    """With AVX-512, filters in panels of three AVX2 vectors (an 8 x 24 tile: 24 of the 32
    registers accumulate) where 32-filter panels would run a quarter empty.  det_fpn's
    96 -> 24 3x3s (Zen 4, 1 thread, in the model, each kernel's fastest of 36 runs, Mcycles;
    gemm-panels before): 7.86 -> 6.87 at 80 x 80, 1.87 -> 1.66 at 40 x 40, 0.51 -> 0.45 at
    20 x 20.  At 160 x 160 (a 10 MB copy of the input; gemm-planes before) 27.4 -> 28.5, so
    not above YMM_PANELS_MAX_COPY."""
    return shape.vw == 16 and filters % shape.nr != 0 and filters % 24 == 0


YMM_PANELS_MAX_COPY = 4 * 1024 * 1024


# A copy of the input larger than Zen 4's L2 (1 MB)...
COPY_BYTES = 1024 * 1024


def _copies_unread_input(node) -> bool:
    """...that a window narrower than its stride reads only part of (a 1x1 stride-2
    convolution: a quarter), unless only that part is copied (subsampled): copied whole,
    ResNet-50's 256 -> 512 1x1/2 at 56 x 56 (a 3.2 MB copy) took 1.04-1.13 times as long
    blocked, 512 -> 1024 at 28 (1.6 MB) 0.98-1.01; with copies of 0.8 MB and less,
    0.91-1.01 (ResNet-18's three)."""
    _, c, h, w = node.inputs[0].type.shape
    kh, kw = node.inputs[1].type.shape[2:]
    (sh, sw), (dh, dw) = node.strides, node.dilations
    skips = (kh - 1) * dh + 1 < sh or (kw - 1) * dw + 1 < sw
    return skips and not subsampled(node) and 4 * c * h * w > COPY_BYTES


# The largest C^T of a whole plane computed in one band, panel by panel,
# when the weights exceed L2.  ResNet's 512 -> 512 3x3 at 7 x 7 (x86-64-v3, Zen 4, 1 thread,
# in the models, weights from memory): 2.62-2.67 -> 2.43-2.44 ms (ResNet-18, three of them),
# 3x3/2 at 7 x 7 2.77 -> 2.53 (ResNet-50); ResNet-18 35.7 -> 34.9-35.1 ms.  Alone, the
# weights warm in L3, 2.46 -> 2.64: the weights' single stream from L3 fed the tiles better.
# With AVX-512 (7-pixel tiles, fewer re-reads) ResNet-18 measured the same either way.
# ResNet-50's 1024 -> 2048 1x1/2 at 14 x 14 (8 MB of weights, a C^T of 400 KB), in bands
# of 24 pixels before, each tile re-reading all the weights: in its last stage (weights from
# memory; 1 thread, each kernel's fastest of 30 runs in 5 processes) 6.54 -> 5.25 Mcycles on
# x86-64-v3, 5.02 -> 4.87 with AVX-512 (alone, the weights warm in L3, 2.11-2.18 ->
# 2.20-2.29 ms on x86-64-v3).
WHOLE_BAND_BYTES = 512 * 1024
L2_BYTES = 1024 * 1024          # Zen 4's
# Where _band_panels_outer prefetches the next filter panel: L2 (prefetcht1).
PANEL_PREFETCH_LEVEL = 2


def subsampled(node) -> bool:
    """A strided 1x1 convolution without padding is a pointwise one over the pixels its
    stride picks: X then holds only those (a quarter of the input at stride 2), gathered
    while copying, and the product runs over X at stride 1.  ResNet-50's downsamples (with
    the residual Add and Relu fused; Zen 4, 1 thread, ms, inputs in cache / flushed):
    256 -> 512 @56 (gemm before) 2.06 -> 1.90 / 2.42 -> 2.18, 512 -> 1024 @28 (gemm) 2.00 ->
    1.91 / 2.19 -> 2.03, 1024 -> 2048 @14 (blocked, whole copy) 1.88 -> 1.83 / 2.14 -> 2.08;
    on AVX2 (x86-64-v3) 3.73 -> 2.12, 2.28 -> 2.04, 2.43 -> 2.17.  Columns are gathered from
    pairs of vectors (_gather_columns), so a column stride of at most 2."""
    kh, kw = node.inputs[1].type.shape[2:]
    sh, sw = node.strides
    return kh == kw == 1 and (sh > 1 or sw > 1) and sw <= 2 and not any(node.pads)


class BlockedGeometry:
    """The padded channel-blocked input and the product's blocking, for one convolution."""

    def __init__(self, node, shape, parts: int = 1):
        _, _, self.h, self.w = node.inputs[0].type.shape
        self.m, self.cg, self.kh, self.kw = node.inputs[1].type.shape
        self.oh, self.ow = node.outputs[0].type.shape[2:]
        (self.sh, self.sw), (self.dh, self.dw) = node.strides, node.dilations
        self.pt, self.pl = node.pads[:2]
        # The input's planes, and the input rows and columns one step of X's rows and
        # columns moves over: the stride when X holds only the pixels it picks (subsampled).
        self.src_h, self.src_w = self.h, self.w
        self.step_h = self.step_w = 1
        if subsampled(node):
            self.step_h, self.step_w = self.sh, self.sw
            self.h, self.w, self.sh, self.sw = self.oh, self.ow, 1, 1
        # The GEMM's register tile, MR pixels x NV vectors of filters (6 x 4 and 12 x 2 on
        # AVX-512 measured no faster than 8 x 2: the loop runs at the FMA peak).
        shape = blocked_tile(self.m, shape)
        self.vw, self.nr, self.nv = shape.vw, shape.nr, shape.nv
        self.cb = self.cg // self.vw
        self.hp = max(self.h + self.pt, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1)
        self.wp = max(self.w + self.pl, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1)
        self.block = self.hp * self.wp * self.vw          # floats per channel block
        self.size = self.cb * self.block
        self.n = self.oh * self.ow
        self.k = self.cg * self.kh * self.kw
        self.panels = -(-self.m // self.nr)
        self.mp = self.panels * self.nr                    # filters with the packing's padding
        self.mr = pixel_block(self.n, shape)
        # Bands start whole tiles and whole vectors of the store-back.
        self.unit = self.mr * self.vw // math.gcd(self.mr, self.vw)
        units = min(max(1, BAND_BYTES // (4 * self.mp * self.unit)), -(-self.n // self.unit))
        # Weights larger than L2 (ResNet's 512 -> 512 3x3 at 7 x 7: 9.4 MB), re-read by every
        # tile, come from L3 or memory each time: with a C^T of all the pixels small enough
        # for L2 (WHOLE_BAND_BYTES), one band of them, each filter panel meeting every tile
        # while in L2 (_band_panels_outer).
        self.panels_outer = 4 * self.k * self.mp > L2_BYTES and 4 * self.n * self.mp <= WHOLE_BAND_BYTES
        # Panel by panel, the next panel is prefetched into L2 while the tiles use this one
        # (_band_panels_outer) where a panel's row is one cache line (AVX2's 16 filters, read
        # at 64 bytes per 6 cycles): AVX-512's panels of 32 (128 bytes per 16 cycles) gained
        # at most 1% from it, and ResNet-50's 256 -> 256 3x3/2 at 14 x 14 took 1.25-1.3 times
        # as long (in the model, Zen 4, 1 thread).
        self.prefetch = 4 * self.nr <= 64
        if self.panels_outer:
            units = -(-self.n // self.unit)
        self.band = balanced_band(self.n, self.unit, units, parts)
        self.bands = -(-self.n // self.band)
        # The input copied band by band, just before the product reads it, when X is larger
        # than L2 (copied whole, it was read back from L3): 128->128 3x3/2 @56 (1.7 MB) 0.93-
        # 0.96 times as long, 256->256 /2 @28 (0.9 MB) 0.98; 64->64 @56 (0.9 MB) 1.01-1.02.
        self.progressive = 4 * self.size > COPY_BYTES
        # A 3x3 stride-2 window with padding 1 reads every input row and column, so its copy
        # (four times the output's pixels) has nothing to leave out, and the micro-kernel
        # broadcasts A's elements one at a time, so X's columns dealt by parity would gain
        # nothing either.  ResNet-50's 128 -> 128 3x3/2 @56 took 2.03-2.08 ms, the same work
        # at stride 1 2.00 (inputs in cache; flushed 2.22 and 2.07), onnxruntime's kernel alone
        # 2.04 (Zen 4, 1 thread).  Prefetching the next band's input rows, and every tile of a
        # band per filter panel (W^T read once per band), measured no faster (on AVX2 either).

    def taps(self) -> list:
        """Where A[p][k] lies in X for pixel p = (0, 0), for each k = (cb, kh, kw, ci).  (One
        step of the micro-kernel per k: unrolled over a tap's VW channels at constant
        displacements, LLVM's scheduler hoisted all the broadcasts and spilled most.)"""
        return [c * self.block + (r * self.dh * self.wp + q * self.dw) * self.vw + ci
                for c in range(self.cb) for r in range(self.kh) for q in range(self.kw)
                for ci in range(self.vw)]

    def scratch_floats(self) -> int:
        return aligned_floats(self.size) + aligned_floats(self.band * self.mp)


def blocked_weights(data, node, vw: int):
    """The filters [M, cg, kh, kw] as W^T, [1, K, M] with k = (cb, kh, kw, ci) (then packed
    in NR-filter panels, layout "b")."""
    m, cg, kh, kw = node.inputs[1].type.shape
    blocks = data.reshape(m, cg // vw, vw, kh, kw).transpose(0, 1, 3, 4, 2)
    return np.ascontiguousarray(blocks.reshape(1, m, cg * kh * kw).transpose(0, 2, 1))


# What a split by filter panels costs more than its share of the product: every task copies
# the whole input.
PANEL_SPLIT_COPY = 1.03


def busiest(items: int, unit: int, parts: int, total: int) -> int:
    """The most of `total` one task computes when `parts` tasks share out `items` runs of
    `unit` (parallel.shares, Split.range's shares)."""
    return max(hi - lo for lo, hi in shares(items, unit, parts, total))


def balanced_band(n: int, unit: int, units: int, parts: int) -> int:
    """Pixels per band: at most `units` whole units, and of those the largest whose bands,
    shared out among `parts` tasks, give the busiest task the fewest pixels.  (The largest
    band that fits BAND_BYTES alone gave ResNet-18's 256 -> 256 3x3 at 14 x 14 seven bands of
    32 pixels, four to one task and three to the other, one of them 4 pixels: its tasks took
    1.56 and 0.87 ms.)"""
    def most(u):
        return busiest(-(-n // (u * unit)), u * unit, parts, n)
    return max(range(units, 0, -1), key=lambda u: (-most(u), u)) * unit


def blocked_items(node, shape) -> int:
    """What a split shares out: whole filter panels or bands of pixels, whichever are more."""
    g = BlockedGeometry(node, shape)
    return max(g.panels, g.bands)


def blocked_split_pixels(node, shape, parts: int) -> bool:
    """Share out bands of pixels (each task copies the input rows they read and computes
    every filter of its bands) unless the filter panels share out more evenly (each task
    then copies the whole input, a few percent of the work): the busiest task's share of
    the work, either way."""
    g = BlockedGeometry(node, shape, parts)
    by_pixels = busiest(g.bands, g.band, parts, g.n) / g.n
    by_panels = busiest(g.panels, 1, parts, g.panels) / g.panels
    return g.bands >= parts and by_pixels <= by_panels * PANEL_SPLIT_COPY


def emit_conv_blocked(k) -> None:
    b, shape, node = k.b, k.gemm_shape, k.node
    (y, _), (x, xt), (w, _) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    by_pixels = not k.split.whole and blocked_split_pixels(node, shape, k.split.parts)
    g = BlockedGeometry(node, shape, k.split.parts if by_pixels else 1)
    n_img, c = xt.shape[:2]
    xb = k.scratch
    ct = b.gep(k.scratch, [i64(aligned_floats(g.size))])
    taps = offsets_global(b.module, g.taps())
    split = k.split
    panel_split = WHOLE if by_pixels else split        # the filter panels this task computes
    p_lo, p_hi = panel_split.range(b, g.panels)
    zero_border(b, g, xb)
    b_lo, b_hi = split.range(b, g.bands) if by_pixels else (i64(0), i64(g.bands))
    rows = (i64(0), i64(g.h)) if not by_pixels else _input_rows(b, g, b_lo, b_hi)
    with for_range(b, n_img, name="img") as img:
        src = b.gep(x, [b.mul(img, i64(c * g.src_h * g.src_w))])
        if not g.progressive:
            fill_blocked(b, g, src, xb, rows)

        def fill_for(band):
            """Before a band, the input rows its windows read past the last band's."""
            if not g.progressive:
                return
            lo, hi = _input_rows(b, g, band, b.add(band, i64(1)))
            prev = _input_rows(b, g, b.sub(band, i64(1)), band)[1]
            start = b.select(b.icmp_signed("==", band, b_lo), lo, prev)
            fill_blocked(b, g, src, xb, (start, hi))
        full, ragged = divmod(g.n, g.band)
        if full:
            f_hi = b.select(b.icmp_signed("<", b_hi, i64(full)), b_hi, i64(full))
            with for_range(b, f_hi, start=b_lo, name="band") as band:
                fill_for(band)
                _band(k, g, xb, w, ct, taps, b.mul(band, i64(g.band)), g.band, (p_lo, p_hi), panel_split, img, y, bias)
        if ragged:
            mine = b.and_(b.icmp_signed("<=", b_lo, i64(full)), b.icmp_signed("<", i64(full), b_hi))
            with b.if_then(mine):
                fill_for(i64(full))
                _band(k, g, xb, w, ct, taps, i64(full * g.band), ragged, (p_lo, p_hi), panel_split, img, y, bias)


def zero_border(b, g: BlockedGeometry, xb) -> None:
    """The padding of every channel block: what fill_blocked never writes."""
    zero = ir.Constant(f32_vector(g.vw), [0.0] * g.vw)
    row = g.wp * g.vw
    below = g.hp - g.pt - g.h

    def run(ptr, pixels: int):
        if pixels:
            with for_range(b, pixels, name="zb") as j:
                vstore(b, zero, b.gep(ptr, [b.mul(j, i64(g.vw))]), g.vw)
    right = g.wp - g.pl - g.w
    with for_range(b, g.cb, name="zcb") as cb:
        blk = b.gep(xb, [b.mul(cb, i64(g.block))])
        run(blk, g.pt * g.wp)
        run(b.gep(blk, [i64((g.pt + g.h) * row)]), below * g.wp)
        if g.pl or right:
            with for_range(b, g.h, name="zr") as ih:
                r = b.gep(blk, [b.mul(b.add(ih, i64(g.pt)), i64(row))])
                run(r, g.pl)
                run(b.gep(r, [i64((g.pl + g.w) * g.vw)]), right)


def _input_rows(b, g: BlockedGeometry, b_lo, b_hi):
    """(lo, hi): the input rows the windows of bands b_lo .. b_hi read (a task that shares
    out bands of pixels copies only those)."""
    p_last = b.sub(b.mul(b_hi, i64(g.band)), i64(1))
    p_last = b.select(b.icmp_signed("<", p_last, i64(g.n - 1)), p_last, i64(g.n - 1))
    oy_first = b.udiv(b.mul(b_lo, i64(g.band)), i64(g.ow))
    oy_last = b.udiv(p_last, i64(g.ow))
    lo = b.sub(b.mul(oy_first, i64(g.sh)), i64(g.pt))
    hi = b.add(b.sub(b.mul(oy_last, i64(g.sh)), i64(g.pt)), i64((g.kh - 1) * g.dh + 1))
    return clamp(b, lo, i64(0), i64(g.h)), clamp(b, hi, i64(0), i64(g.h))


def fill_blocked(b, g: BlockedGeometry, src, xb, rows) -> None:
    """One image's input rows rows[0] .. rows[1] into the interior of X: VW channels x VW
    columns loaded as VW vectors along the columns, transposed in registers into VW vectors
    along the channels."""
    vw, plane, step = g.vw, g.src_h * g.src_w, g.step_w
    # Chunks of VW columns of X whose source columns all lie inside the row (a gather of
    # stride 2 loads two whole vectors); the last chunks load only what is there.
    full = min(g.w // vw, g.src_w // (vw * step))
    with for_range(b, g.cb, name="fcb") as cb:
        with for_range(b, rows[1], start=rows[0], name="fr") as ih:
            srow = b.gep(src, [b.add(b.mul(cb, i64(vw * plane)), b.mul(ih, i64(g.step_h * g.src_w)))])
            drow = b.gep(xb, [b.add(b.mul(cb, i64(g.block)), b.mul(b.add(ih, i64(g.pt)), i64(g.wp * vw)))])

            def chunk(c0, valid: int, there: int):
                """X's columns c0 .. c0 + valid, from the `there` source floats from column
                c0 * step on."""
                rows = [_gather_columns(b, b.gep(srow, [b.add(b.mul(c0, i64(step)), i64(r * plane))]), vw, step,
                                        there) for r in range(vw)]
                cols = transpose_block(b, rows)
                for j in range(valid):
                    vstore(b, cols[j], b.gep(drow, [b.mul(b.add(b.add(c0, i64(j)), i64(g.pl)), i64(vw))]), vw)
            if full:
                with for_range(b, full * vw, step=vw, name="fc") as c0:
                    chunk(c0, vw, vw * step)
            for c0 in range(full * vw, g.w, vw):
                valid = min(vw, g.w - c0)
                chunk(i64(c0), valid, min(valid * step, g.src_w - c0 * step))


def _gather_columns(b, ptr, vw: int, step: int, there: int):
    """The vector of ptr[0], ptr[step], ..., ptr[(VW - 1) * step] (step 1 or 2), reading
    only the first `there` floats from ptr (the lanes past them are zero)."""
    if step == 1:
        return vload(b, ptr, vw, there if there < vw else None)
    lo = vload(b, ptr, vw, there if there < vw else None)
    if there <= vw:
        hi = ir.Constant(f32_vector(vw), [0.0] * vw)
    else:
        hi = vload(b, b.gep(ptr, [i64(vw)]), vw, there - vw if there < 2 * vw else None)
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ir.IntType(32), vw), list(range(0, 2 * vw, 2))))


def _band(k, g: BlockedGeometry, xb, w, ct, taps, p0, count: int, panels, panel_split, img, y, bias) -> None:
    """Pixels p0 .. p0 + count: their C^T rows for this task's filter panels, tile by tile
    (each tile's rows of X stay in L1 while every panel of W^T streams from L2), then stored
    back.  (Or panel by panel: _band_panels_outer.)"""
    b = k.b
    if g.panels_outer:
        _band_panels_outer(k, g, xb, w, ct, taps, p0, count, panels)
    else:
        def tile(q, mr: int, ragged: bool, _):
            rows = _tile_rows(b, g, xb, b.add(p0, q), mr, ragged)
            # This task's filter panels (emit_gemm shares them out as panel_split.range does)
            emit_gemm(b, GemmShape(g.vw, mr, g.nv), mr, g.m, g.k, None, 0, w, None,
                      b.gep(ct, [b.mul(q, i64(g.mp))]), g.mp, name="bk", split=panel_split,
                      a_table=(taps, rows))
        _tiles(b, g, count, tile)
    store_band(k, g, ct, p0, count, *panels, img, y, bias)


def _tiles(b, g: BlockedGeometry, count: int, tile) -> None:
    """tile(q, mr, ragged, t) for each register tile of a band of `count` pixels: q its
    first pixel in the band, `ragged` when it may reach past the band's last pixel, t its
    index among the band's tiles (pixel_tiles: a ragged last tile, or tiles of one row
    fewer)."""
    first, done = 0, 0
    for tiles, mr in pixel_tiles(count, g.mr):
        with for_range(b, tiles, name=f"tile{mr}") as t:
            tile(b.add(i64(first), b.mul(t, i64(mr))), mr, first + tiles * mr > count, b.add(t, i64(done)))
        first += tiles * mr
        done += tiles


def _tile_rows(b, g: BlockedGeometry, xb, first, mr: int, ragged: bool) -> list:
    """Where each of a tile's `mr` pixels' windows start in X (a ragged tile's rows past
    the last pixel repeat it)."""
    rows = []
    for i in range(mr):
        p = b.add(first, i64(i))
        if ragged:
            p = b.select(b.icmp_signed("<", p, i64(g.n)), p, i64(g.n - 1))
        oy, ox = b.udiv(p, i64(g.ow)), b.urem(p, i64(g.ow))
        base = b.mul(b.add(b.mul(oy, i64(g.sh * g.wp)), b.mul(ox, i64(g.sw))), i64(g.vw))
        rows.append(b.gep(xb, [base]))
    return rows


def _band_panels_outer(k, g: BlockedGeometry, xb, w, ct, taps, p0, count: int, panels) -> None:
    """The band's C^T rows panel by panel, each filter panel of W^T meeting every tile of
    the band while it is in L2 (weights larger than L2 are then read once a band, not once a
    tile; BlockedGeometry.panels_outer).  The band's first tile would read a panel from L3 or
    memory, faster than they deliver it (AVX2's 6 x 16 tile takes 64 bytes of it every 6
    cycles), so the tiles of each panel prefetch the next one into L2 as they go (with AVX2's
    panels, BlockedGeometry.prefetch).  ResNet-50's
    last stage, weights from memory (Zen 4, 1 thread, each kernel's fastest of 30 runs in 5
    processes, Mcycles): 512 -> 512 3x3 at 7 x 7 5.97 -> 5.50 (x86-64-v3), its 3x3/2 6.12
    -> 5.80; 256 -> 256 3x3 at 14 x 14 5.49 -> 5.41."""
    b = k.b
    p_lo, p_hi = panels
    tiles = sum(t for t, _ in pixel_tiles(count, g.mr))
    with for_range(b, p_hi, start=p_lo, name="bpanel") as p:
        wp = b.gep(w, [b.mul(p, i64(g.k * g.nr))])           # panel p of W^T: K x NR
        following = b.bitcast(b.gep(wp, [i64(g.k * g.nr)]), ir.IntType(8).as_pointer())

        def tile(q, mr: int, ragged: bool, t):
            rows = _tile_rows(b, g, xb, b.add(p0, q), mr, ragged)
            c = b.gep(ct, [b.add(b.mul(q, i64(g.mp)), b.mul(p, i64(g.nr)))])

            def fetch_ahead(bb, kk):
                """One line of the next panel into L2 at each k: tile t of T covers bytes
                t / T .. (t + 1) / T of it (past the last panel, a harmless stray line)."""
                step = bb.add(bb.mul(t, i64(g.k)), kk)
                prefetch(bb, bb.gep(following, [bb.udiv(bb.mul(step, i64(4 * g.nr)), i64(tiles))]), False,
                         PANEL_PREFETCH_LEVEL)
            emit_gemm(b, GemmShape(g.vw, mr, g.nv), mr, g.nr, g.k, None, 0, wp, None, c, g.mp, name="bo",
                      a_table=(taps, rows), prefetch=fetch_ahead if g.prefetch else None)
        _tiles(b, g, count, tile)


def store_band(k, g: BlockedGeometry, ct, p0, count: int, p_lo, p_hi, img, y, bias) -> None:
    """y[img, f, p0 + p] = C^T[p, f] (+ bias, through the epilogue) for the band's pixels and
    this task's filters (those of its panels, short of the packing's padding)."""
    b, vw = k.b, g.vw
    f_lo = b.mul(p_lo, i64(g.nr))
    f_hi = b.mul(p_hi, i64(g.nr))
    whole = (g.m // vw) * vw
    f_full = b.select(b.icmp_signed("<", f_hi, i64(whole)), f_hi, i64(whole))
    ragged = g.m % vw

    def pixels_of(q0, pixels: int):
        ctq = b.gep(ct, [b.mul(q0, i64(g.mp))])
        with for_range(b, f_full, start=f_lo, step=vw, name="sf") as f0:
            store_ct_block(k, ctq, g.mp, f0, pixels, vw, img, b.add(p0, q0), y, bias, g.m, g.n)
        if ragged:
            with b.if_then(b.icmp_signed(">", f_hi, i64(whole))):
                store_ct_block(k, ctq, g.mp, i64(whole), pixels, ragged, img, b.add(p0, q0), y, bias, g.m, g.n)
    full, tail = divmod(count, vw)
    if full:
        with for_range(b, full * vw, step=vw, name="sp") as q0:
            pixels_of(q0, vw)
    if tail:
        pixels_of(i64(full * vw), tail)
