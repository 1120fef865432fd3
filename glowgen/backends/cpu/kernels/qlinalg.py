"""QuantizedConv and QuantizedMatMul: int8 products with exact i32 sums, requantized to i8
in the store (the int8 GEMM of qgemm.py).

A 2-D convolution with one group reads its input in place from a *plane* (built by
qplanes.py): the input of one image padded with its real zero (the x offset, as B's element:
+ 128 for u8), its rows and columns dealt by stride into stride x stride phase planes of
Hq x Wq, and G channels interleaved in each 32-bit element.  Output pixel (oy, ox) is then column q = oy * Wq + ox
of the product, and tap (ky, kx) reads element q + a constant offset: every tap's vector is
one load, no im2col.  The columns ox >= OW of each row are computed and dropped (Wq - OW of
Wq: 2 of 58 for a 3x3 convolution at 56x56).  The product goes, requantized, to a scratch
block [M][Q] and then its rows to the output; with AVX-512 VBMI2 each run of a tile goes
straight into the output instead, its output pixels compressed together (store_compressed).
A matrix product is the same with the transposed rows of x as its plane ([K / G][rows]
elements) and one tap; one with no more rows than a tile broadcasts (batch 1), or a
convolution of small images, turns around, its features in the lanes (qlanes.py), where
that leaves fewer lanes idle.

Weights, the per-filter bias correction and the multipliers are packed once at compile time
into one constant buffer (qgemm.pack_a / pack_epilogue), in place of the weights operand,
followed by the two offsets (the result's, and the plane's padding element): the code holds
no scale or offset of its own.
A split shares out blocks of MR filters, or panels of pixels where the filters' blocks do
not share out evenly (parallel.splits_blocks): over one image and one group, its tasks first
build the plane together, each a share of its channel groups, in scratch they all read
(q_phases; a small one each builds whole for itself); a plane that is the input with
channels interleaved is shared out by pixels instead, each task building its own pixels'
plane (owns_pixels).

A grouped convolution is one product per group, side by side in one loop of blocks: each
group's filters packed as their own blocks, meeting only its own channels' elements of the
plane (Geometry); a split shares out the blocks of every group, and a task builds the
plane of its groups only.  Any stride and dilation: the plane is dealt by stride, a tap
is an offset.  A depthwise convolution (one filter per channel) takes its own kernel,
qdepthwise.py, where that covers it (any stride, dilations up to 4), and this product
otherwise.
Weights that are not constants and targets without AVX2 run `loops`: plain loops computing
the same sums and requantization.  So do i16 tensors (precision int16): their products sum
in i64 and requantize in f64 (reference/primitives.requantize), compiled but not tuned.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ....engine.types import Type
from ....errors import UnsupportedError
from ....reference.primitives import residual_ratio, saturation
from ....lir.ir import WeightBuffer
from llvmlite import ir

from .. import amx
from ..amx import TILE_GROUPS
from ..llvmutil import F32, F64, I16, I32, I64, for_range, i64, intrinsic, target_has
from ..parallel import Split, Work, for_claimed, parallel, shares_pixels, splits_blocks
from ..plan import Phases, claim_bytes
from ..qgemm import (PackedConstants, QShape, QSHAPES, Residual, choose_qshape, emit_tile, for_weights, narrowed_rows,
                     pack_a, pack_epilogue, pack_offsets, products_in_range, requantize,
                     requantize_for_narrow, weights_prefetch)
from ..vectors import masked_store, splat
from . import qdepthwise as depthwise
from . import qlanes
from . import qwinograd as winograd
from .base import DESCRIBE, PHASES, PRODUCT_SPACE, REPACK, SCRATCH, STRATEGY, KernelArgs, hook, kernel
from .common import clamp
from .qplanes import (BAND_PANELS, IM2COL_PIXELS, ROW_ELEMENTS_MAX_GROWTH, build_conv_plane, build_matmul_plane,
                      build_own_plane, build_row_element_plane, builds_rows_in_vectors, interleave_band_bytes,
                      interleave_band_pixels, interleave_channels, interleaves_in_bands, interleaves_rows,
                      pad_element)

_ceil = lambda a, b: -(-a // b)     # noqa: E731
PANELS_OUTER_MAX_WEIGHTS = 256 << 10   # packed weight bytes (Geometry.panels_outer)
# The packing of a product whose requantized sums are known to stay within qgemm.IN_RANGE
# (_pack): its store requantizes in i32, two instructions a vector fewer, which a
# product of few channels (64 -> 256 1x1, a third of each tile in requantization) feels.
PACKED_IN_RANGE = "a, sums in range"


class Geometry:
    """Where the product reads and writes, from the node's static shapes (one image).

    A grouped convolution (`ng` groups of `cg` input channels and `mg` filters) is `ng`
    products side by side: group i's filters, packed as their own blocks of `mr` rows,
    meet the elements of its own channels in the plane ([ng][ceil(cg / G)][phases][Hq][Wq]:
    each group's channels padded to whole elements).  Blocks are numbered group by group
    (`bpg` a group), rows within them padded to `mr`: the padded row r = block * mr + i is
    filter (r // (bpg * mr)) * mg + r % (bpg * mr) when that remainder is below mg."""

    def __init__(self, node, qs: QShape):
        self.qs = qs
        g, nr = qs.group, qs.nr
        xt = node.inputs[0].type
        self.conv = node.OP == "QuantizedConv"
        self.ng = getattr(node, "group", 1)
        if self.conv:
            self.batch, self.c, self.h, self.w = xt.shape
            self.m, _, kh, kw = node.inputs[1].type.shape
            self.oh, self.ow = node.outputs[0].type.shape[2:]
            (sh, sw), (dh, dw), p = node.strides, node.dilations, node.pads
            self.sh, self.sw, self.pt, self.pl = sh, sw, p[0], p[1]
            hp, wp = self.h + p[0] + p[2], self.w + p[1] + p[3]
            self.hq, self.wq = _ceil(hp, sh), _ceil(wp, sw)
            phase = self.hq * self.wq
            # The phases some tap reads (rows py of phase_rows by columns px of phase_cols):
            # all sh x sw but for windows narrower than the stride.  A 1x1 convolution at
            # stride 2 reads one of four: building only it took ResNet-50's 512 -> 1024 at
            # 28x28 from 0.67 to 0.58 ms (onnxruntime 0.47).
            self.phase_rows = sorted({(ky * dh) % sh for ky in range(kh)})
            self.phase_cols = sorted({(kx * dw) % sw for kx in range(kw)})
            self.taps = [(self.phase_rows.index((ky * dh) % sh) * len(self.phase_cols)
                          + self.phase_cols.index((kx * dw) % sw)) * phase
                         + ((ky * dh) // sh) * self.wq + (kx * dw) // sw
                         for ky in range(kh) for kx in range(kw)]
            self.group_stride = len(self.phase_rows) * len(self.phase_cols) * phase
            self.q = self.oh * self.wq
            self.window = (kh, kw, dh, dw)
            # Fewer channels than an element holds (a stem from 3 of G = 4) take an im2col
            # plane instead (build_im2col_plane): its elements hold G of the C * KH * KW
            # values (channel, ky, kx) of one output pixel, one tap over ceil(C * KH * KW / G)
            # elements in place of KH * KW taps over one element.  (Of more channels, the
            # plane would hold KH * KW copies of the image for fewer products saved.)
            self.im2col = (self.ng == 1 and self.c < g and len(self.taps) > 1
                           and _ceil(self.c * kh * kw, g) < len(self.taps))
            # With 512-bit VNNI products, an element may instead hold G consecutive columns of
            # one window row (the row padded to whole elements: row_elements), where that
            # costs few products more: ResNet's 7x7 stem, 42 elements in place of 37.
            # Their G bytes lie side by side in the input row, so that a step of 16 pixels
            # is one (masked) load and one byte shuffle (build_row_element_plane), where
            # the values one by one took a third of the stem's time.
            runs = _ceil(kw, g)
            self.row_elements = (self.im2col and qs.kind in ("vnni", "amx") and dw == 1
                                 and sw * (IM2COL_PIXELS - 1) + g <= 64 and self.ow >= IM2COL_PIXELS
                                 and self.c * kh * runs <= ROW_ELEMENTS_MAX_GROWTH * _ceil(self.c * kh * kw, g))
            # Values of a window row in the plane: its taps, or row_elements' whole elements.
            self.row_values = runs * g if self.row_elements else kw
            if self.im2col:
                self.hq, self.wq, self.taps = self.oh, self.ow, [0]
                self.q = self.oh * self.ow
        else:
            *batch, self.c = xt.shape
            self.m = node.inputs[1].type.shape[1]
            self.batch, self.rows = 1, int(np.prod(batch, dtype=np.int64))
            self.taps = [0]
            self.group_stride = self.q = self.rows
            self.im2col = self.row_elements = False
        self.cg, self.mg = self.c // self.ng, self.m // self.ng
        # Values a filter sums over each of its taps: the group's channels (im2col: all
        # the window's values).
        self.depth = self.cg * (self.window[0] * self.row_values if self.im2col else 1)
        self.groups = _ceil(self.depth, g)          # elements of G values a tile sums over
        self.plane_groups = self.ng * self.groups   # ... and the plane holds
        # ... and a tile reads: on AMX tiles (one group of filters), whole tiles of 16 element
        # groups, the plane's rows past its own read (any bytes: their weights are zeros).
        self.tile_groups = _ceil(self.groups, TILE_GROUPS) * TILE_GROUPS if qs.kind == "amx" else self.groups
        self.plane_rows = self.plane_groups + self.tile_groups - self.groups     # element rows read
        self.qpad = _ceil(self.q, nr) * nr
        # Vectors of the last panel's tiles: only those holding some column.  A 7x7 image is
        # 49 of 64 lanes in whole panels of 16 (AVX2), of 56 with a last panel of one
        # vector: MobileNetV2's 320 -> 1280 1x1 at x86-64-v3 606 -> 533 kcycles, 160 -> 960
        # 237 -> 208, 960 -> 320 473 -> 444; 96 -> 576 at 14x14 292 -> 280 (196 of 208
        # lanes, not 224), with VNNI 151 -> 141 (alone, Zen 4, 1 thread, fastest of 300).
        self.last_vectors = _ceil(self.q - (self.qpad - nr), qs.vw)
        if self.im2col:
            self.group_stride = self.qpad
        # row_elements' plane panel by panel, [Qpad / NR][groups][NR] elements, where a
        # tile's steps read one run of bytes (with a run a row, the element rows it read were
        # 42 lines 50 KB apart: the stem's products waited on them, 2.1 MB from L3).  Its
        # builder's steps of 16 pixels then must not cross panels: rows of whole steps.
        self.panel_major = self.row_elements and self.ow % IM2COL_PIXELS == 0 and nr % IM2COL_PIXELS == 0
        if self.panel_major:
            self.group_stride = nr
        self.bpg = _ceil(self.mg, qs.mr)
        # A group's filters in blocks of equal rows (12 as 2 x 6, not 8 + 4; 4 as one of 4).
        self.mr = qs.mr if self.ng == 1 else _ceil(self.mg, self.bpg)
        self.blocks = self.ng * self.bpg
        self.mpad = self.blocks * self.mr
        # Elements the tiles may read: the last group's taps up to the last padded column.
        self.plane_elems = max(self.plane_rows * self.group_stride,
                               (self.plane_rows - 1) * self.group_stride + max(self.taps) + self.qpad)
        if self.panel_major:        # (the last panel's tiles read rows past its own: tile_groups)
            self.plane_elems = self.plane_groups * self.qpad + (self.tile_groups - self.groups) * nr
        self.plane_bytes = _ceil(4 * self.plane_elems, 64) * 64
        self.scratch = self.plane_bytes + _ceil(self.mpad * self.qpad, 64) * 64
        self.a_bytes = self.blocks * self.tile_groups * len(self.taps) * self.mr * 4
        # Product columns that are output pixels (no dropped columns: a 1x1 convolution) are
        # stored straight into y, with no result block in scratch to copy out.
        self.direct = self.conv and self.wq == self.ow
        if self.direct:
            self.scratch = self.plane_bytes
        # Loop order of the tiles: over B's panels outside when all the weights fit in L2
        # with room to spare (read from there for each panel) and there are many panels.
        self.panels_outer = self.a_bytes <= PANELS_OUTER_MAX_WEIGHTS and self.qpad // nr >= 4

    def padded_rows(self) -> np.ndarray:
        """The padded row (class docstring) of each filter."""
        m = np.arange(self.m)
        return (m // self.mg) * self.bpg * self.mr + m % self.mg

    def filter_of_row(self, b, r):
        """(filter, whether one) of padded row r, an i64 value."""
        if self.ng == 1:
            return r, b.icmp_signed("<", r, i64(self.m))
        span = self.bpg * self.mr
        local = b.urem(r, i64(span))
        return (b.add(b.mul(b.udiv(r, i64(span)), i64(self.mg)), local),
                b.icmp_signed("<", local, i64(self.mg)))


# ----------------------------------------------------------------------------- decisions
def _constant(ins, index):
    """The constant data of operand `index` (of the instruction) in its node's shape, or None."""
    buf = ins.operands[index][1]
    root = buf.root() if buf is not None else None
    if not (isinstance(root, WeightBuffer) and root.region == "constant" and root.data is not None
            and root.nbytes == buf.nbytes):
        return None
    return root.data.reshape(ins.node.inputs[index - len(ins.node.outputs)].type.shape)


@hook(STRATEGY, "QuantizedConv", "QuantizedMatMul")
def q_strategy(ins, shape, packable, plan) -> str:
    """With constant weights, bias and scales: the target's depthwise kernel (qdepthwise.py)
    for one filter per channel where it covers the shape, its int8 product (qgemm.QSHAPES)
    for any other convolution, grouped or not, and matrix product (on AVX2 `ubsw` where the
    weights fit 7 bits: qgemm.for_weights); plain loops otherwise."""
    qs = choose_qshape(getattr(shape, "features", ""))
    node = ins.node
    if node.inputs[0].type.dtype != "i8":
        return "loops"                    # i16: the plain loops (no int16 product kernel yet)
    if qs is None or any(_constant(ins, i) is None for i in (2, 3, 4)):
        return "loops"
    if getattr(node, "group", 1) != 1 and depthwise.covers(node):
        qs = depthwise.choose_qshape(node, qs, _constant(ins, 2))
        if depthwise.sums_in_range(node, *(_constant(ins, i) for i in (2, 3, 4)), qs):
            return depthwise.strategy(qs)
        return "loops"
    qs = for_weights(qs, _constant(ins, 2))
    chosen = winograd.strategy(node, qs, plan.winograd, _constant(ins, 2), _constant(ins, 4))
    if chosen is None and qs.kind == "vnni" and amx.available(getattr(shape, "features", "")) \
            and amx.fits(Geometry(node, QShape("amx"))):
        chosen = "amx"
    return chosen or qs.kind


@hook(REPACK, "QuantizedConv", "QuantizedMatMul")
def q_repack(prog, ins, shape, users) -> bool:
    """Weights (qgemm.pack_a, qlanes.pack, or qdepthwise.pack), bias corrections, multipliers
    and offsets in one constant buffer replacing the weights operand."""
    strategy = ins.plan.strategy
    node = ins.node
    w, ws, b = (_constant(ins, i) for i in (2, 3, 4))
    exact = False
    if depthwise.is_depthwise(strategy):
        data = depthwise.pack(node, w, ws, b, depthwise.qshape(strategy))
    elif strategy in winograd.TILES:
        data, exact = winograd.pack(node, w, ws, b, winograd.TILES[strategy])
    elif strategy in QSHAPES:
        qs = QShape(strategy)
        geo = Geometry(node, qs)
        if node.OP == "QuantizedConv":              # im2col: one tap over all the window's values
            if geo.row_elements:                    # each window row padded with zero weights
                w = np.pad(w, [(0, 0), (0, 0), (0, 0), (0, geo.row_values - w.shape[3])])
            w3 = w.reshape(w.shape[0], -1, 1) if geo.im2col else w.reshape(w.shape[0], w.shape[1], -1)
        else:
            w3 = np.ascontiguousarray(w.T).reshape(w.shape[1], w.shape[0], 1)
        pad = pad_element(qs, node.inputs[0].type.quant.offset)
        if qlanes.in_lanes(geo, qs):
            data, exact = qlanes.pack(node, geo, w3, ws, b, qs, pad)
        else:
            data, exact = _pack(node, geo, w3, ws, b, qs, pad)
    else:
        return False
    buf = ins.operands[2][1]
    root = buf.root()
    new = WeightBuffer(f"{root.name}.q{strategy}", Type("i8", (data.size,)), "constant", data=data)
    if users.get(id(root)) == 1 and root in prog.weights:
        prog.weights[prog.weights.index(root)] = new
    else:
        prog.weights.append(new)
    ins.replace(buf, new)
    ins.plan.packed = PACKED_IN_RANGE if exact else "a"
    return True


def _pack(node, geo: Geometry, w3, ws, b, qs: QShape, pad: int) -> tuple[np.ndarray, bool]:
    """The packed constants of the general product (each group's filters its own blocks,
    the corrections and multipliers at their padded rows), and whether every filter's
    requantized sums stay within qgemm.IN_RANGE (so that its store may requantize with
    qgemm.requantize_unsaturated; qgemm.products_in_range)."""
    m, taps = w3.shape[0], w3.shape[2]
    corr_m, mult_m = (v[:m] for v in pack_epilogue(w3, ws, b, node.inputs[0].type.quant, node.scale, qs))
    corr, mult = np.zeros(geo.mpad, np.int32), np.zeros(geo.mpad, np.float32)
    corr[geo.padded_rows()], mult[geo.padded_rows()] = corr_m, mult_m
    a = [pack_a(wg, taps, qs, geo.mr).view(np.int8).ravel() for wg in w3.reshape(geo.ng, geo.mg, -1, taps)]
    data = np.concatenate([*a, corr.view(np.int8), mult.view(np.int8), *pack_offsets(node, pad)])
    return data, products_in_range(w3, corr_m, mult_m, node)


@hook(SCRATCH, "QuantizedConv", "QuantizedMatMul")
def q_scratch(ins, shape) -> int:
    if depthwise.is_depthwise(ins.plan.strategy):
        return depthwise.DepthwiseGeometry(ins.node, depthwise.qshape(ins.plan.strategy)).scratch
    if ins.plan.strategy in winograd.TILES:
        return winograd.scratch(ins.node, ins.plan.phases is not None, winograd.TILES[ins.plan.strategy])
    if ins.plan.strategy not in QSHAPES:
        return 0
    qs = QShape(ins.plan.strategy)
    geo = Geometry(ins.node, qs)
    lanes = qlanes.in_lanes(geo, qs)
    need = qlanes.Lanes(geo, qs).scratch if lanes else geo.scratch
    shared = ins.plan.phases is not None and ins.plan.phases.count > 1
    if shared:
        return need - geo.plane_bytes                       # the plane is shared
    if not lanes and interleaves_in_bands(geo):
        return need - geo.plane_bytes + interleave_band_bytes(geo)      # a band of it
    return need


# A plane built a row at a time in vectors (build_plane_rows) of fewer bytes than this each
# task builds whole for itself, in its own scratch, where a round of its own built it in
# shares: the round's wait, and the half of the plane each task then read from the other
# core, cost more than the half it builds twice.  Emerald Rapids, two threads, alternating,
# sums of per-step minima: ResNet-50's 3x3s at 14 x 14 (planes of 65 KB) 904 -> 857 us, at
# 7 x 7 (41 KB) 389 -> 369; ResNet-18's at 14 x 14 712 -> 598; but its 3x3 at 56 x 56 from
# 64 channels (215 KB) 950 -> 987.
PHASED_PLANE_MIN_BYTES = 128 << 10


@hook(PHASES, "QuantizedConv")
def q_phases(ins, shape, parts: int) -> Optional[Phases]:
    """A split int8 product over one image and one group builds its plane in a round of its
    own, each task its share of the plane's channel groups, into scratch every task then
    reads: unphased, every task built the whole plane, at a quarter of the float product's
    time a larger share of the step than there.  Not one whose tasks build only the plane
    of their own pixels (owns_pixels)."""
    if ins.plan.strategy in winograd.TILES:
        return winograd.phases(ins.node, parts, winograd.TILES[ins.plan.strategy])
    if depthwise.is_depthwise(ins.plan.strategy) or ins.plan.strategy not in QSHAPES:
        return None
    qs = QShape(ins.plan.strategy)
    geo = Geometry(ins.node, qs)
    if not geo.conv or geo.batch != 1 or geo.ng != 1:
        return None
    claims = claims_work(geo, qs, parts, _has_vbmi2(getattr(shape, "features", "")))
    words = claim_bytes(parts) if claims else 0
    if owns_pixels(geo, qs, parts) or (builds_rows_in_vectors(geo) and geo.plane_bytes < PHASED_PLANE_MIN_BYTES):
        return Phases(1, words, claim_bytes=words) if claims else None       # no plane shared
    return Phases(2, geo.plane_bytes + words, claim_bytes=words)


# Whether split int8 products whose tasks share out filters claim them as they go
# (claims_work).  On this VM the two vCPUs often run at different speeds (within a run of
# ResNet-50 at two threads, the sums of each task's steps 10.9 and 8.3 ms at the median,
# either one the slower, uncorrelated run to run), and a fixed half each waits on the slower.
# Emerald Rapids, two threads, alternating, medians of 200 runs: ResNet-50 10.91 -> 10.49 ms
# in a busy phase, 8.37 -> 8.32 in a calm one (sums of per-step minima 7.56 -> 7.58: the
# claims cost nothing measurable); ResNet-18 (few steps split by filters) 3.26 -> 3.29.  Runs
# of panels claimed too where the tasks build their own pixels' plane: ResNet-50 10.93 ->
# 10.57 and 10.47 -> 10.27 ms (per-step minima 7.68 -> 7.66; the 3x3s at 56 x 56, whose
# runs' plane rows overlap, 531 -> 550 us), ResNet-18 5.99 -> 5.99.  Not with a fused
# epilogue there (the fused 1x1s at 56 x 56 measured slower claimed), nor the stem's bands.
# Claimed from one counter, the tasks took every other run, and the next step (a fixed
# share of pixels) read half its input from the other core: each task now claims its own
# share first (parallel.for_claimed).  Two threads, alternating, sums of per-step minima:
# ResNet-50 7.28 -> 7.13 ms (as fast as with no claims at all: 7.15), its fused 1x1s at
# 56 x 56 470 -> 439 us over three, medians of 300 runs 7.90 / 7.64 -> 7.50 / 7.61 ms.
CLAIMED_SPLITS = True


def claims_work(geo: Geometry, qs: QShape, parts: int, vbmi2: bool) -> bool:
    """Whether a split convolution of one image and one group has its tasks claim their
    work as they go (parallel.for_claimed), not a fixed share each: blocks of filters
    (features' tiles in the lanes) where split by filters, its plane whole in every task's
    reach; runs of panels where each task builds its own pixels' plane (owns_pixels: then
    each run's rows of it, as it claims them).  Of a product storing straight into y
    (Geometry.direct, or its runs compressed), or of filters in the lanes (each claim
    copying its own features out).  Not the banded stem (its bands built as it goes)."""
    if not CLAIMED_SPLITS or parts <= 1 or banded(geo):
        return False
    lanes = qlanes.in_lanes(geo, qs)
    if splits_pixels(geo, qs, parts):
        return owns_pixels(geo, qs, parts) and not lanes and stores_into_y(geo, vbmi2)
    return lanes or stores_into_y(geo, vbmi2)


# Panels of pixels each task computes at the least for a product to share out pixels rather
# than filters when its tasks can build their own pixels' plane (owns_pixels).
OWN_PIXELS_MIN_PANELS = 4
# ... and how much more unevenly than the filters' blocks the panels may share out, for the
# one round and the plane built where it is read: a 14x14 image is 13 panels, 7 and 6 at two
# threads, where ResNet-50's 256 -> 1024 1x1 has 256 blocks (tasks 311 and 245 us alone;
# sharing out the blocks, both 266-274 and the step 281-286; Zen 3, x86-64-v3).  A 28x28
# image's 49 panels (25 and 24) do: at 0.03 in place of 0.02, two threads on the Zen 3 VM
# ran ResNet-50 int8 as fast with its vCPUs on one L3 and 2.4-2.7% faster on two (ResNet-18
# 0.6% / 1.0%, MobileNetV2 0.3% / 2.4%); at 0.08 (the 13 panels too) 0.3% / 0.9% slower.
OWN_PIXELS_UNEVENNESS = 0.03
# ... unless the product is a 1x1 convolution, whose tasks then build no plane rows another
# builds too (no window reaches past a task's own pixels): a margin of 0.05, 13 panels to 12
# (28 x 28 at 32 pixels a panel).  Emerald Rapids, two threads, alternating, sums of
# per-step minima: the 15 steps of ResNet-50's 1x1s it moves to their own pixels (out of a
# plane built in a round of its own, its halves by two cores) 2650 -> 2283 us (512 -> 128
# at 28 x 28 158 -> 124 us, 1024 -> 256 at 14 x 14 155 -> 133), MobileNetV2's six 134 ->
# 99.  With any margin, ResNet-50's 256 -> 1024 at 14 x 14 on AVX2 (7 panels of 16 to 6)
# took 320 -> 353 us; applied to its 3x3s at stride 2 as well (plane rows the tasks would both
# build), 219 -> 234.
OWN_PIXELS_UNEVENNESS_1X1 = 0.05


def _unevenness(items: int, parts: int) -> float:
    """How much more than an even share the busiest of `parts` tasks computes (Split.range)."""
    return Split(None, parts).chunk(items) * parts / items - 1.0


def _split_items(geo: Geometry, qs: QShape) -> tuple[int, int, int]:
    """(filter items, pixel items, packed weight bytes) a split shares out: blocks of filters
    and panels of pixels, or in the lanes tiles of features and blocks of rows."""
    if qlanes.in_lanes(geo, qs):
        lanes = qlanes.Lanes(geo, qs)
        return lanes.tiles, lanes.row_blocks, lanes.b_bytes
    return geo.blocks, geo.qpad // qs.nr, geo.a_bytes


def splits_pixels(geo: Geometry, qs: QShape, parts: int) -> bool:
    """Whether a split product shares out its pixels (panels, or blocks of rows in the
    lanes) rather than its filters: where the filters do not share out
    (parallel.splits_blocks), and where the pixels share out as evenly (as owns_pixels asks)
    and the plane it reads is large enough against its weights (parallel.shares_pixels)."""
    if parts <= 1:
        return False
    filters, pixels, weight_bytes = _split_items(geo, qs)
    if not splits_blocks(filters, Split(None, parts)):
        return True
    return _pixels_share_out(filters, pixels, parts, _slack(geo)) and shares_pixels(geo.plane_bytes, weight_bytes)


def _slack(geo: Geometry) -> float:
    """How much more unevenly than its filters a product's pixels may share out."""
    return OWN_PIXELS_UNEVENNESS_1X1 if geo.conv and len(geo.taps) == 1 and not geo.im2col else OWN_PIXELS_UNEVENNESS


def _pixels_share_out(filters: int, pixels: int, parts: int, slack: float = OWN_PIXELS_UNEVENNESS) -> bool:
    """Whether each of `parts` tasks gets OWN_PIXELS_MIN_PANELS of the pixel items, shared
    out within `slack` as evenly as the filter items."""
    return (pixels >= OWN_PIXELS_MIN_PANELS * parts
            and _unevenness(pixels, parts) <= _unevenness(filters, parts) + slack)


def owns_pixels(geo: Geometry, qs: QShape, parts: int) -> bool:
    """Whether a split product's tasks each build the plane of their own output pixels only:
    one whose plane is its input, channels interleaved pixel for pixel (interleaves_rows),
    split over its pixels (in the lanes, its blocks of rows when its features' tiles do not
    share out; else its panels, when each task has OWN_PIXELS_MIN_PANELS of them); or a
    convolution of one group and image with a padded, strided or im2col plane split over
    its pixels (splits_pixels), each task building the plane rows its pixels' taps read.
    No task then reads what another wrote, and the step is one round of the pool where the
    phased plane (q_phases) took two, the second reading from the other core half the
    plane the first built there."""
    if parts <= 1 or not geo.conv:
        return False
    if not interleaves_rows(geo):
        return geo.ng == 1 and geo.batch == 1 and splits_pixels(geo, qs, parts)
    if qlanes.in_lanes(geo, qs):
        return splits_pixels(geo, qs, parts)
    return _pixels_share_out(geo.blocks, geo.qpad // qs.nr, parts, _slack(geo))


@parallel("QuantizedConv", "QuantizedMatMul")
def q_work(node, shape, ins) -> Work:
    if ins.plan is not None and depthwise.is_depthwise(ins.plan.strategy):
        return depthwise.work(node, depthwise.qshape(ins.plan.strategy))
    if ins.plan is not None and ins.plan.strategy in winograd.TILES:
        return winograd.work(node, winograd.TILES[ins.plan.strategy])
    if ins.plan is not None and ins.plan.strategy == "loops" and node.inputs[0].type.dtype == "i16":
        # i16 loops (LoopTypes): shares of the filters (of a product's columns).
        w = node.inputs[1].type.shape
        conv = node.OP == "QuantizedConv"
        per_output = float(np.prod(w[1:])) if conv else float(w[0])
        return Work(w[0] if conv else w[1], flops=2.0 * float(np.prod(node.outputs[0].type.shape)) * per_output)
    if ins.plan is None or ins.plan.strategy not in QSHAPES:
        return Work(1)
    qs = QShape(ins.plan.strategy)
    geo = Geometry(node, qs)
    flops = 2.0 * geo.batch * geo.m * geo.q * geo.depth * len(geo.taps)
    if not qlanes.in_lanes(geo, qs):         # blocks of filters, or panels of pixels
        return Work(max(geo.blocks, geo.qpad // qs.nr), flops=flops)
    lanes = qlanes.Lanes(geo, qs)
    # A product of a row or a few streams its weights once, each read for those rows only:
    # bound by reading them, not by its few FLOPs.  MobileNetV2's int8 classifier (1280 ->
    # 1000, 1.3 MB) ran unsplit at 2 threads.
    weights = lanes.b_bytes / 4 if lanes.rows <= qs.mr else 0.0
    return Work(max(lanes.tiles, lanes.row_blocks), flops=flops, elements=weights)


@hook(PRODUCT_SPACE, "QuantizedConv")
def q_product_space(ins, features: str = ""):
    """[batch, filters, pixels] where the product's tiles store their runs of i8 pixels
    straight into y (Geometry.direct: pixels in the lanes, no dropped columns), through the
    epilogue a stack fused into it gives them (epilogue.py: a residual's QuantizedAdd, which
    otherwise reads and writes every element again: ResNet-50's 16 took 4% of its int8
    steps), with 512-bit products only.  Emerald Rapids, one thread, the 13 fused into their
    1x1 convolutions against the convolutions and the sums apart (sums of per-step minima,
    us): at 56 x 56 907 -> 877, 28 x 28 882 -> 829, 14 x 14 1202 -> 1159, the model 15.34 ->
    15.03 ms (outputs the same); at x86-64-v3, AVX2's runs of 16 lanes, 2396 -> 2561,
    2813 -> 2908, 3925 -> 4001: slower, so not there.  Likewise a convolution storing its
    runs compressed (compresses_runs on a target of these `features`).  (Those 13 sums, from
    a profile, now join their convolutions' requantization before the rounding instead:
    the rule quantize_conv_residual, residual_values; what fuses here is a QDQ model's sum,
    which keeps the product's rounding, and a sum after a 3x3, ResNet-18's.)"""
    if ins.plan.strategy not in QSHAPES:
        return None
    qs = QShape(ins.plan.strategy)
    if qs.vw < 16:
        return None
    geo = Geometry(ins.node, qs)
    if qlanes.in_lanes(geo, qs) or not stores_into_y(geo, _has_vbmi2(features)):
        return None
    n, m, oh, ow = ins.node.outputs[0].type.shape
    return (n, m, oh * ow)


@hook(DESCRIBE, "QuantizedConv", "QuantizedMatMul")
def q_describe(node) -> str:
    """` int8 3x3 stride 2 from 64` (a convolution's window, stride and input channels), or
    ` int8 from 2048` (a matrix product's depth): what a profile needs to tell steps apart."""
    if node.OP == "QuantizedConv":
        window = "x".join(map(str, node.inputs[1].type.shape[2:]))
        shape = f" {window} stride {'x'.join(map(str, node.strides))} from {node.inputs[0].type.shape[1]}"
    else:
        shape = f" from {node.inputs[0].type.shape[-1]}"
    if node.inputs[0].type.dtype == "i16":
        return " int16 (plain loops)" + shape
    if getattr(node, "group", 1) == 1:
        return " int8" + shape
    return (" int8 depthwise" if depthwise.covers(node) else " int8 grouped") + shape


# ----------------------------------------------------------------------------- kernels
@kernel("QuantizedConv", "QuantizedMatMul")
def quantized_product(k: KernelArgs):
    residual = Residual.of(k)
    if residual is not None and (depthwise.is_depthwise(k.strategy) or k.strategy in winograd.TILES):
        raise UnsupportedError(f"{k.node.name}: the {k.strategy} int8 kernel reads no residual; only "
                               f"pointwise convolutions take one (rule quantize_conv_residual)")
    if depthwise.is_depthwise(k.strategy):
        return depthwise.emit(k, depthwise.qshape(k.strategy))
    if k.strategy in winograd.TILES:
        return winograd.emit(k, k.packed == PACKED_IN_RANGE, winograd.TILES[k.strategy])
    if k.strategy not in QSHAPES:
        return (q_conv_loops if k.node.OP == "QuantizedConv" else q_matmul_loops)(k)
    b, node = k.b, k.node
    qs = QShape(k.strategy)
    geo = Geometry(node, qs)
    exact = k.packed == PACKED_IN_RANGE     # the sums stay in range: qgemm.requantize_for_narrow
    if qlanes.in_lanes(geo, qs):
        def own_plane(b, n, plane, pad, first, last):
            build_own_plane(b, geo, k.ins[0][0], n, plane, pad, first, last)
        return qlanes.emit(b, k, geo, qs, build_conv_plane if geo.conv else build_matmul_plane, exact,
                           splits_pixels(geo, qs, k.split.parts),
                           own_plane if owns_pixels(geo, qs, k.split.parts) else None)
    if residual is not None and not (geo.direct and geo.ng == 1):
        raise UnsupportedError(f"{node.name}: the int8 product stores its results through a block of "
                               f"its own and reads no residual; only pointwise convolutions take one")
    (y, _), (x, _), (packed, _) = k.outs[0], k.ins[0], k.ins[1]
    consts = PackedConstants(b, packed, geo.a_bytes, geo.mpad)
    a, corr, mult, pad = consts.weights, consts.corr, consts.mult, consts.tail
    y_offset, y_offset_i32 = consts.y_offset, consts.y_offset_i32
    bounds = saturation(node)
    plane, ys = qlanes.plane_and_result(b, k, geo)
    if k.phased and k.phase == 0:           # this task's share of the shared plane
        build_conv_plane(b, geo, x, i64(0), plane, pad, *k.split.range(b, geo.plane_groups))
        return
    own = owns_pixels(geo, qs, k.split.parts)
    # Runs with dropped columns stored straight into y, their output pixels compressed
    # together (compresses_runs), in place of the result block and its copy into y.
    compress = compresses_runs(geo, target_has(b.module, "avx512vbmi2"))
    (lo, hi), (p_lo, p_hi) = k.split.blocks_or_panels(b, geo.blocks, geo.qpad // qs.nr,
                                                       own or splits_pixels(geo, qs, k.split.parts),
                                                       ragged=(False, geo.last_vectors < qs.nv))
    # Tasks claiming blocks, or runs of panels (own), as they go (claims_work); not with a
    # fused epilogue where each task builds its own pixels' plane (which the plan, phased
    # before the fusion is known to it, leaves to the kernel).
    claims = None if own and k.epilogue is not None else k.claim_words()
    if claims is not None:
        (lo, hi), (p_lo, p_hi) = (i64(0), i64(geo.blocks)), (i64(0), i64(geo.qpad // qs.nr))
    # row_elements' plane panel by panel is built a band of its panels at a time, each band's
    # tiles computed before the next (in L1: BAND_PANELS panels), where the whole plane (2.1 MB
    # for ResNet's stem) went out to L3 and back.
    base = [plane]                          # where panel 0 of the plane lies (banded: moves)
    in_bands = banded(geo) and not k.phased
    # An interleaved plane of the task's own, a band of panels at a time (interleaves_in_bands).
    interleaved_bands = interleaves_in_bands(geo) and not k.phased
    group_stride = interleave_band_pixels(qs) if interleaved_bands else geo.group_stride
    with for_range(b, geo.batch, name="qn") as n:
        if qs.kind == "amx":                # the tiles an image at a time (released below)
            amx.configure(b)
        if in_bands or interleaved_bands:
            pass                            # built band by band below
        elif own:                           # the plane of this task's pixels only
            if claims is None:              # (claimed: of each run of panels, below)
                build_own_plane(b, geo, x, n, plane, pad, b.mul(p_lo, i64(qs.nr)), b.sub(b.mul(p_hi, i64(qs.nr)), i64(1)))
        elif geo.conv and not k.phased:     # the plane of this task's groups only
            first = b.mul(b.udiv(lo, i64(geo.bpg)), i64(geo.groups))
            last = b.mul(b.udiv(b.add(hi, i64(geo.bpg - 1)), i64(geo.bpg)), i64(geo.groups))
            build_conv_plane(b, geo, x, n, plane, pad, first, last)
        elif not geo.conv:
            build_matmul_plane(b, geo, x, n, plane, pad)

        def tile(mb, p, vectors):
            a_block = b.gep(a, [b.mul(mb, i64(geo.tile_groups * len(geo.taps) * geo.mr))])
            q0 = b.mul(p, i64(qs.nr))
            # The elements of this block's group (the product of a single group: all).
            b_base = b.gep(base[0], [b.mul(q0, i64(geo.groups)) if geo.panel_major else q0 if geo.ng == 1 else b.add(
                q0, b.mul(b.udiv(mb, i64(geo.bpg)), i64(geo.groups * geo.group_stride)))])

            def start(i, j):        # the sums start from the row's bias correction
                return splat(b, b.load(b.gep(corr, [b.add(b.mul(mb, i64(geo.mr)), i64(i))])), qs.vw)

            rows = {}
            values = {}             # the residual's, read when the tile's first vector is stored

            def store(i, j, sums):   # requantized, narrowed and stored by pairs of rows
                r = b.add(b.mul(mb, i64(geo.mr)), i64(i))
                if residual is not None and not values:
                    values.update(residual_values(b, geo, residual, n, mb, q0, vectors))
                joined = (residual, values[(i, j)]) if residual is not None else None
                rows.setdefault(i, []).append(requantize_for_narrow(
                    b, sums, b.load(b.gep(mult, [r])), exact, y_offset, bounds, joined))
            # The next block's weights, over this block's panels (weights_prefetch; with panels
            # outside, the next block is the next tile's: not spread).
            step = len(geo.taps) * geo.mr
            ahead = weights_prefetch(b, qs, 4 * step, a_block, b.gep(a_block, [i64(geo.tile_groups * step)]),
                                     b.sub(p, p_lo), geo.tile_groups, geo.qpad // qs.nr, spread=not geo.panels_outer)
            if qs.kind == "amx":
                amx.emit_tile(b, geo.tile_groups, geo.taps, a_block, b_base, group_stride, store,
                              init=start, vectors=vectors, prefetch=ahead)
            else:
                emit_tile(b, qs, geo.groups, geo.taps, a_block, b_base, group_stride, store,
                          rows=geo.mr, init=start, vectors=vectors, prefetch=ahead)
            inside = pixel_lanes(b, geo, q0, qs.nv * qs.vw) if compress else None
            for i, run in narrowed_rows(b, qs, [rows[i] for i in range(geo.mr)], exact, bounds, y_offset_i32):
                r = b.add(b.mul(mb, i64(geo.mr)), i64(i))
                if geo.direct:
                    store_direct(b, geo, run, y, n, *geo.filter_of_row(b, r), q0, k.epilogue)
                    continue
                if compress:
                    store_compressed(b, geo, run, y, n, *geo.filter_of_row(b, r), q0, inside, k.epilogue)
                    continue
                st = b.store(run, b.bitcast(b.gep(ys, [b.add(b.mul(r, i64(geo.qpad)), q0)]), run.type.as_pointer()))
                st.align = 1

        def panel(p, body):
            """body(vectors) for panel p: the last one in fewer vectors where its last ones
            hold no pixel (geo.last_vectors)."""
            if geo.last_vectors == qs.nv:
                return body(qs.nv)
            with b.if_else(b.icmp_signed("==", p, i64(geo.qpad // qs.nr - 1))) as (last, other):
                with last:
                    body(geo.last_vectors)
                with other:
                    body(qs.nv)

        def panels(first, last, block_lo=lo, block_hi=hi):
            with for_range(b, last, start=first, name="qp") as p:
                def blocks(vectors):
                    with for_range(b, block_hi, start=block_lo, name="qmb") as mb:
                        tile(mb, p, vectors)
                panel(p, blocks)

        def bands(panels_a_band, first, last, build, block_lo=lo, block_hi=hi):
            """Panels first..last a band of `panels_a_band` at a time: build(pb, pe) the
            band's plane (moving base[0] to where its panel 0 would lie), then its tiles."""
            with for_range(b, last, start=first, step=panels_a_band, name="qb") as pb:
                pe = b.add(pb, i64(panels_a_band))
                pe = b.select(b.icmp_signed("<", pe, last), pe, last)
                build(pb, pe)
                panels(pb, pe, block_lo, block_hi)

        def row_element_band(pb, pe):
            base[0] = b.gep(plane, [b.neg(b.mul(pb, i64(geo.plane_groups * qs.nr)))])
            build_row_element_plane(b, geo, x, n, base[0], pad, i64(0), i64(geo.plane_groups),
                                    pixels=(b.mul(pb, i64(qs.nr)), b.mul(pe, i64(qs.nr))))

        def interleaved_band(pb, pe):
            first, stop = b.mul(pb, i64(qs.nr)), b.mul(pe, i64(qs.nr))
            stop = b.select(b.icmp_signed("<", stop, i64(geo.h * geo.w)), stop, i64(geo.h * geo.w))
            base[0] = b.gep(plane, [b.neg(first)])
            interleave_channels(b, geo, x, n, base[0], i64(0), i64(geo.plane_groups),
                                pixels=(first, stop), stride=group_stride)

        if in_bands:
            bands(BAND_PANELS, p_lo, p_hi, row_element_band)
        else:
            def compute(block_lo, block_hi, panel_lo, panel_hi):
                """The tiles of blocks block_lo..block_hi over panels panel_lo..panel_hi."""
                if interleaved_bands:   # each band's plane built, then its tiles
                    bands(group_stride // qs.nr, panel_lo, panel_hi, interleaved_band, block_lo, block_hi)
                    return
                if geo.panels_outer:    # all the weights stay in cache; each panel of B in L1
                    panels(panel_lo, panel_hi, block_lo, block_hi)
                    return
                # a block of weights stays in L1 over every panel
                with for_range(b, block_hi, start=block_lo, name="qmb") as mb, \
                        for_range(b, panel_hi, start=panel_lo, name="qp") as p:
                    panel(p, lambda vectors: tile(mb, p, vectors))

            def claimed_panels(c_lo, c_hi):     # a claimed run of panels: its plane, its tiles
                if not interleaved_bands:
                    build_own_plane(b, geo, x, n, plane, pad, b.mul(c_lo, i64(qs.nr)), b.sub(b.mul(c_hi, i64(qs.nr)), i64(1)))
                compute(lo, hi, c_lo, c_hi)
            if claims is None:
                compute(lo, hi, p_lo, p_hi)
            elif own:
                for_claimed(b, claims, geo.qpad // qs.nr, k.split, claimed_panels)
            else:               # each claimed run of blocks over every panel
                for_claimed(b, claims, geo.blocks, k.split, lambda c_lo, c_hi: compute(c_lo, c_hi, p_lo, p_hi))
        if qs.kind == "amx":
            amx.release(b)
        if not geo.direct and not compress:     # else the tiles stored into y themselves
            r_lo, r_hi = b.mul(lo, i64(geo.mr)), b.mul(hi, i64(geo.mr))
            q_lo, q_hi = b.mul(p_lo, i64(qs.nr)), b.mul(p_hi, i64(qs.nr))
            if geo.conv:
                write_conv_out(b, geo, ys, y, n, r_lo, r_hi, q_lo, q_hi)
            else:
                r_hi = b.select(b.icmp_signed("<", r_hi, i64(geo.m)), r_hi, i64(geo.m))
                q_hi = b.select(b.icmp_signed("<", q_hi, i64(geo.rows)), q_hi, i64(geo.rows))
                write_matmul_out(b, geo, ys, y, n, r_lo, r_hi, q_lo, q_hi)


def store_direct(b, geo: Geometry, v, y, n, m, is_filter, q, epilogue=None):
    """The i8 vector v of output pixels q.. of filter m, into image n of y: only its lanes
    inside (pixels < OH * OW, and none unless `is_filter`: m is a padded row's filter (a
    real one) when it holds).  AVX-512BW stores them in one masked store;
    otherwise a whole vector at once, the ragged end a byte at a time in a small loop (one
    per store: unrolled lane by lane, 16 stores a tile made the module slow to optimize).
    With an `epilogue` (a fused stack: epilogue.EpilogueEmitter), it takes the vector, the
    lanes inside as its mask or the ragged end's values one at a time, and stores."""
    vw = v.type.count
    npix = geo.oh * geo.ow
    at = b.gep(y, [b.add(b.mul(b.add(b.mul(n, i64(geo.m)), m), i64(npix)), q)])
    whole = b.and_(b.icmp_signed("<=", b.add(q, i64(vw)), i64(npix)), is_filter)    # every lane inside
    if target_has(b.module, "avx512bw"):
        lanes = ir.Constant(ir.VectorType(I64, vw), list(range(vw)))
        inside = b.icmp_signed("<", b.add(lanes, splat(b, q, vw)), splat(b, i64(npix), vw))
        mask = b.and_(inside, splat(b, is_filter, vw))
        if epilogue is not None:
            # Whole runs (all but the image's last) without a mask: LLVM keeps the masked
            # loads of the stack's operands as such, where plain ones fold into arithmetic.
            with b.if_else(whole) as (then, otherwise):
                with then:
                    epilogue(b, v, n, m, q, None)
                with otherwise:
                    epilogue(b, v, n, m, q, mask)
            return
        vty = v.type
        fn = intrinsic(b.module, f"llvm.masked.store.v{vw}i8.p0", ir.VoidType(),
                       [vty, vty.as_pointer(), I32, mask.type])
        b.call(fn, [v, b.bitcast(at, vty.as_pointer()), ir.Constant(I32, 1), mask])
        return
    with b.if_else(whole) as (then, otherwise):
        with then:
            if epilogue is not None:
                epilogue(b, v, n, m, q, None)
            else:
                st = b.store(v, b.bitcast(at, v.type.as_pointer()))
                st.align = 1
        with otherwise:
            count = b.select(is_filter, b.sub(i64(npix), q), i64(0))
            with for_range(b, count, name="ragged") as lane:
                if epilogue is not None:
                    epilogue(b, b.extract_element(v, lane), n, m, b.add(q, lane), None)
                else:
                    b.store(b.extract_element(v, lane), b.gep(at, [lane]))


def residual_values(b, geo: Geometry, residual: Residual, n, mb, q0, vectors: int) -> dict:
    """{(i, j): the residual's values (f32) for vector j of row i} of the tile of
    block mb at plane column q0 (of `vectors` vectors) of image n, in a pointwise
    convolution (Geometry.direct, one group: the columns are the pixels, the rows the
    filters): each vector's values lie at its results' places in r.  Lanes past the last
    pixel, and rows past the last filter, read nothing."""
    vw, npix = geo.qs.vw, geo.oh * geo.ow
    first = b.mul(mb, i64(geo.mr))
    places = {(i, j): residual.at(b, b.add(b.mul(b.add(b.mul(n, i64(geo.m)), b.add(first, i64(i))), i64(npix)),
                                           b.add(q0, i64(j * vw))))
              for i in range(geo.mr) for j in range(vectors)}
    whole = b.and_(b.icmp_signed("<=", b.add(q0, i64(vectors * vw)), i64(npix)),
                   b.icmp_signed("<=", b.add(first, i64(geo.mr)), i64(geo.m)))

    def masks():
        lanes = ir.Constant(ir.VectorType(I64, vw), list(range(vw)))
        inside = [b.icmp_signed("<", b.add(lanes, splat(b, b.add(q0, i64(j * vw)), vw)), splat(b, i64(npix), vw))
                  for j in range(vectors)]
        filters = [splat(b, b.icmp_signed("<", b.add(first, i64(i)), i64(geo.m)), vw) for i in range(geo.mr)]
        return {(i, j): b.and_(inside[j], filters[i]) for i in range(geo.mr) for j in range(vectors)}
    return residual.load_values(b, places, vw, whole, masks)


def banded(geo: Geometry) -> bool:
    """Whether the product's plane (row_elements', panel by panel) is built a band of its
    panels at a time, each band's tiles computed before the next (quantized_product)."""
    return geo.panel_major and geo.panels_outer


def _has_vbmi2(features: str) -> bool:
    """Whether a target of these features (LLVM's "+a,-b" string) has AVX-512 VBMI2."""
    return "+avx512vbmi2" in features.split(",")


def stores_into_y(geo: Geometry, vbmi2: bool) -> bool:
    """Whether the product's tiles store into y themselves (no result block copied out):
    pixels in the lanes with no dropped columns (Geometry.direct), or runs compressed."""
    return geo.direct or compresses_runs(geo, vbmi2)


def compresses_runs(geo: Geometry, vbmi2: bool) -> bool:
    """Whether a convolution whose plane rows carry columns past OW (a padded one: not
    Geometry.direct) stores its tiles' runs straight into y (store_compressed): with
    512-bit products and AVX-512 VBMI2's byte compress (`vbmi2`: the target has it).  In
    place of the result block and its copy into y, Emerald Rapids, alternating, sums of
    per-step minima: ResNet-18's 3x3s at 56 x 56 1458 -> 1424 us at one thread, 739 -> 700
    at two (the model 6.13 -> 6.03 and 2.99 -> 2.93 ms); ResNet-50's 1063 -> 1017; at
    28 x 28 and 14 x 14 about the same.
    (The result block's scratch stays reserved: Geometry does not know the target.)"""
    return geo.conv and not geo.direct and not geo.im2col and geo.qs.vw == 16 and vbmi2


def pixel_lanes(b, geo: Geometry, q, lanes: int):
    """The i64 bit mask of the `lanes` plane columns q.. (an i64 value) that are output
    pixels: column within its row below OW, row below OH.  A run of them meets at most
    ceil(lanes / Wq) + 1 rows, each the bits [start, start + OW) for start = j Wq - q % Wq."""
    def below(count):                   # the low `count` bits, count clamped to 0..lanes
        count = clamp(b, count, i64(0), i64(lanes))
        return b.sub(b.shl(i64(1), count), i64(1))
    col = b.urem(q, i64(geo.wq))
    mask = i64(0)
    for j in range(_ceil(lanes, geo.wq) + 1):
        start = b.sub(i64(j * geo.wq), col)
        mask = b.or_(mask, b.and_(below(b.add(start, i64(geo.ow))), b.not_(below(start))))
    return b.and_(mask, below(b.sub(i64(geo.oh * geo.wq), q)))


def store_compressed(b, geo: Geometry, v, y, n, m, is_filter, q, inside, epilogue=None):
    """The i8 vector v of plane columns q.. of filter m into image n of y, only its lanes
    that are output pixels (`inside`: pixel_lanes' mask), which are consecutive pixels of
    y: compressed together (`vpcompressb`) and stored by one masked store from the first
    one's place (or handed so to the `epilogue` of a fused stack, as store_direct's).
    Nothing where m is a padded row."""
    vw = v.type.count
    inside = b.and_(b.select(is_filter, inside, i64(0)), i64((1 << vw) - 1))
    row, col = b.udiv(q, i64(geo.wq)), b.urem(q, i64(geo.wq))
    first = b.add(b.mul(row, i64(geo.ow)), b.select(b.icmp_signed("<", col, i64(geo.ow)), col, i64(geo.ow)))
    mask_t = ir.VectorType(ir.IntType(1), vw)
    bits = b.trunc(inside, ir.IntType(vw))
    compress = intrinsic(b.module, f"llvm.x86.avx512.mask.compress.v{vw}i8", v.type, [v.type, v.type, mask_t])
    packed = b.call(compress, [v, ir.Constant(v.type, None), b.bitcast(bits, mask_t)])
    popcount = intrinsic(b.module, "llvm.ctpop.i64", I64, [I64])
    count = b.call(popcount, [inside])
    first_lanes = b.bitcast(b.trunc(b.sub(b.shl(i64(1), count), i64(1)), ir.IntType(vw)), mask_t)
    if epilogue is not None:
        return epilogue(b, packed, n, m, first, first_lanes)
    at = b.gep(y, [b.add(b.mul(b.add(b.mul(n, i64(geo.m)), m), i64(geo.oh * geo.ow)), first)])
    masked_store(b, packed, at, first_lanes)


def write_conv_out(b, geo: Geometry, ys, y, n, r_lo, r_hi, q_lo, q_hi):
    """Padded rows r_lo..r_hi, columns q_lo..q_hi, of the product block [Mpad][Q] into image n
    of y (N, M, OH, OW): the filters' rows only, dropping each row's columns past OW."""
    wq = i64(geo.wq)
    y_lo, y_hi = b.sdiv(q_lo, wq), clamp(b, b.sdiv(b.add(q_hi, i64(geo.wq - 1)), wq), i64(0), i64(geo.oh))
    with for_range(b, r_hi, start=r_lo, name="wm") as r:
        m, is_filter = geo.filter_of_row(b, r)
        with b.if_then(is_filter), for_range(b, y_hi, start=y_lo, name="wy") as oy:
            row = b.mul(oy, wq)             # this output row's columns of the block
            x_lo = clamp(b, b.sub(q_lo, row), i64(0), i64(geo.ow))
            x_hi = clamp(b, b.sub(q_hi, row), i64(0), i64(geo.ow))
            src = b.add(b.mul(r, i64(geo.qpad)), row)
            dst = b.mul(b.add(b.mul(b.add(b.mul(n, i64(geo.m)), m), i64(geo.oh)), oy), i64(geo.ow))
            with for_range(b, x_hi, start=x_lo, name="wx") as ox:
                b.store(b.load(b.gep(ys, [b.add(src, ox)])), b.gep(y, [b.add(dst, ox)]))


def write_matmul_out(b, geo: Geometry, ys, y, n, m_lo, m_hi, r_lo, r_hi):
    """Rows m_lo..m_hi, columns r_lo..r_hi of the product block [N][rows], transposed into
    y (rows, N)."""
    with for_range(b, r_hi, start=r_lo, name="wr") as r:
        with for_range(b, m_hi, start=m_lo, name="wm") as m:
            v = b.load(b.gep(ys, [b.add(b.mul(m, i64(geo.qpad)), r)]))
            b.store(v, b.gep(y, [b.add(b.mul(r, i64(geo.m)), m)]))


# ----------------------------------------------------------------------------- plain loops
class LoopTypes:
    """What the plain loops of a product compute in, by the element type of its operands
    (as reference/primitives.requantize): i8 sums in i32, requantized in f32 (qgemm.requantize);
    i16 sums in i64 (products of up to 2^30), requantized in f64, where f32 would round sums
    of more than 24 bits before the 65536-step result is rounded."""

    def __init__(self, node):
        self.wide = node.inputs[0].type.dtype == "i16"
        self.acc = I64 if self.wide else I32

    def multiplier(self, b, node, ws, m):
        """x_scale * w_scale[m] / scale in f64 (rounded to f32 for i8, as requantize_multipliers)."""
        q = node.inputs[0].type.quant
        v = b.fmul(ir.Constant(F64, float(q.scale)), b.fpext(b.load(b.gep(ws, [m])), F64))
        v = b.fdiv(v, ir.Constant(F64, float(node.scale)))
        return v if self.wide else b.fptrunc(v, F32)

    def sum_into(self, b, acc, xv, wv, xo):
        xs = b.sub(b.sext(xv, self.acc), ir.Constant(self.acc, xo))
        b.store(b.add(b.load(acc), b.mul(xs, b.sext(wv, self.acc))), acc)

    def requantize(self, b, sums, mult, node, residual=None, element=None):
        """The requantized sums, with the value of a `residual` (Residual) at `element` (i64)
        joined: in f32 for i8 (Residual.join), in f64 for i16 (sums * mult + (r - r_offset)
        * ratio, the ratio in f64, as reference.primitives.join_residual)."""
        bounds = saturation(node, "i16" if self.wide else "i8")
        value = b.load(residual.at(b, element)) if residual is not None else None
        if not self.wide:
            joined = (residual, residual.values(b, value)) if residual is not None else None
            return requantize(b, sums, mult, node.offset, bounds=bounds, residual=joined)
        f = b.fmul(b.sitofp(sums, F64), mult)
        if residual is not None:
            shifted = b.sub(b.sext(value, I64), ir.Constant(I64, residual.offset))
            f = b.fadd(f, b.fmul(b.sitofp(shifted, F64), ir.Constant(F64, float(residual_ratio(node, "i16")))))
        f = b.fadd(b.call(intrinsic(b.module, "llvm.roundeven.f64", F64, [F64]), [f]), ir.Constant(F64, float(node.offset)))
        lo, hi = (ir.Constant(F64, float(v)) for v in bounds)
        f = b.select(b.fcmp_ordered(">", f, hi), hi, f)
        f = b.select(b.fcmp_ordered("<", f, lo), lo, f)
        return b.trunc(b.fptosi(f, I32), I16)


def q_conv_loops(k: KernelArgs):
    """Any QuantizedConv (grouped, depthwise, weights computed at run time): one sum per
    output element in i32, taps outside the input skipped (they are real zeros)."""
    b, node = k.b, k.node
    (y, _), (x, _), (w, _), (ws, _), (bias, _) = k.outs[0], *k.ins[:4]
    nb, c, h, wd = node.inputs[0].type.shape
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    (sh, sw), (dh, dw), pads = node.strides, node.dilations, node.pads
    mg = m // node.group
    xo = node.inputs[0].type.quant.offset
    lt = LoopTypes(node)
    acc = b.alloca(lt.acc)
    residual = Residual.of(k)
    m_lo, m_hi = k.split.range(b, m)            # the whole of it but for i16 (q_work)
    with for_range(b, nb, name="n") as n, for_range(b, m_hi, start=m_lo, name="m") as mi:
        mult = lt.multiplier(b, node, ws, mi)
        c0 = b.mul(b.sdiv(mi, i64(mg)), i64(cg))
        with for_range(b, oh, name="oy") as oy, for_range(b, ow, name="ox") as ox:
            b.store(b.load(b.gep(bias, [mi])), acc)
            with for_range(b, cg, name="c") as ci, for_range(b, kh, name="ky") as ky, \
                    for_range(b, kw, name="kx") as kx:
                iy = b.add(b.sub(b.mul(oy, i64(sh)), i64(pads[0])), b.mul(ky, i64(dh)))
                ix = b.add(b.sub(b.mul(ox, i64(sw)), i64(pads[1])), b.mul(kx, i64(dw)))
                inside = b.and_(b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h))),
                                b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(wd))))
                with b.if_then(inside):
                    xi = b.add(b.mul(b.add(b.mul(b.add(b.mul(n, i64(c)), b.add(c0, ci)), i64(h)), iy), i64(wd)), ix)
                    wi = b.add(b.mul(b.add(b.mul(b.add(b.mul(mi, i64(cg)), ci), i64(kh)), ky), i64(kw)), kx)
                    lt.sum_into(b, acc, b.load(b.gep(x, [xi])), b.load(b.gep(w, [wi])), xo)
            yi = b.add(b.mul(b.add(b.mul(b.add(b.mul(n, i64(m)), mi), i64(oh)), oy), i64(ow)), ox)
            b.store(lt.requantize(b, b.load(acc), mult, node, residual, yi), b.gep(y, [yi]))


def q_matmul_loops(k: KernelArgs):
    b, node = k.b, k.node
    (y, _), (x, _), (w, _), (ws, _), (bias, _) = k.outs[0], *k.ins
    *batch, kk = node.inputs[0].type.shape
    n = node.inputs[1].type.shape[1]
    rows = int(np.prod(batch, dtype=np.int64))
    xo = node.inputs[0].type.quant.offset
    lt = LoopTypes(node)
    acc = b.alloca(lt.acc)
    n_lo, n_hi = k.split.range(b, n)            # the whole of it but for i16 (q_work)
    with for_range(b, n_hi, start=n_lo, name="n") as j:
        mult = lt.multiplier(b, node, ws, j)
        with for_range(b, rows, name="r") as r:
            b.store(b.load(b.gep(bias, [j])), acc)
            with for_range(b, kk, name="k") as ki:
                lt.sum_into(b, acc, b.load(b.gep(x, [b.add(b.mul(r, i64(kk)), ki)])),
                            b.load(b.gep(w, [b.add(b.mul(ki, i64(n)), j)])), xo)
            b.store(lt.requantize(b, b.load(acc), mult, node), b.gep(y, [b.add(b.mul(r, i64(n)), j)]))
