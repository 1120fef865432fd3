"""QuantizedConv and QuantizedMatMul: int8 products with exact i32 sums, requantized to i8
in the store (the int8 GEMM of qgemm.py).

A 2-D convolution with one group reads its input in place from a *plane*: the input of one
image padded with its real zero (the x offset, as B's element: + 128 for u8), its rows and
columns dealt by stride into stride x stride phase planes of Hq x Wq, and G channels
interleaved in each 32-bit element.  Output pixel (oy, ox) is then column q = oy * Wq + ox
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
from ....reference.primitives import saturation
from ....lir.ir import WeightBuffer
from llvmlite import ir

from ..llvmutil import F32, F64, I8, I16, I32, I64, for_range, i64, intrinsic, target_has
from ..parallel import Split, Work, for_claimed, parallel, shares_pixels, splits_blocks
from ..plan import Phases, claim_bytes
from ..qgemm import (PackedConstants, QShape, QSHAPES, choose_qshape, emit_tile, for_weights, narrowed_rows,
                     pack_a, pack_epilogue, pack_offsets, products_in_range, requantize,
                     requantize_for_narrow, weights_prefetch)
from ..vectors import join_vectors, masked_load, masked_store, splat
from . import qdepthwise as depthwise
from . import qlanes
from . import qwinograd as winograd
from .base import DESCRIBE, PHASES, PRODUCT_SPACE, REPACK, SCRATCH, STRATEGY, KernelArgs, hook, kernel
from .common import clamp

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
            self.row_elements = (self.im2col and qs.kind == "vnni" and dw == 1
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
        self.plane_elems = max(self.plane_groups * self.group_stride,
                               (self.plane_groups - 1) * self.group_stride + max(self.taps) + self.qpad)
        if self.panel_major:
            self.plane_elems = self.plane_groups * self.qpad
        self.plane_bytes = _ceil(4 * self.plane_elems, 64) * 64
        self.scratch = self.plane_bytes + _ceil(self.mpad * self.qpad, 64) * 64
        self.a_bytes = self.blocks * self.groups * len(self.taps) * self.mr * 4
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
    return winograd.strategy(node, qs, plan.winograd, _constant(ins, 2), _constant(ins, 4)) or qs.kind


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
        pad = _pad_element(qs, node.inputs[0].type.quant.offset)
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
    return data, products_in_range(w3, corr_m, mult_m)


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


def own_plane_pixels(b, geo: Geometry, first, last):
    """(lo, hi) of the plane's pixels that the output pixels at plane positions first..last
    (inclusive; i64 values) read: through the last one's farthest tap, within the image."""
    hi = b.add(last, i64(max(geo.taps) + 1))
    hi = b.select(b.icmp_signed("<", hi, i64(geo.h * geo.w)), hi, i64(geo.h * geo.w))
    return first, b.select(b.icmp_signed("<", first, hi), hi, first)


def build_own_plane(b, geo: Geometry, x, n, plane, pad, first, last):
    """The plane a task reads for the output pixels at plane positions first..last
    (inclusive; i64 values), every channel group: their pixels, channels interleaved
    (interleave_channels), their output rows' windows (build_im2col_plane), or the rows of
    every phase from the first one's through the last one's farthest tap (build_conv_plane)."""
    if interleaves_rows(geo):
        return interleave_channels(b, geo, x, n, plane, i64(0), i64(geo.plane_groups),
                                   own_plane_pixels(b, geo, first, last))
    if geo.im2col:                          # a position is an output pixel, one tap
        lo = b.sdiv(first, i64(geo.ow))
        hi = clamp(b, b.add(b.sdiv(last, i64(geo.ow)), i64(1)), lo, i64(geo.oh))
        return build_im2col_plane(b, geo, x, n, plane, pad, i64(0), i64(geo.plane_groups), rows=(lo, hi))
    lo = b.sdiv(first, i64(geo.wq))
    hi = clamp(b, b.add(b.sdiv(b.add(last, i64(max(geo.taps))), i64(geo.wq)), i64(1)), lo, i64(geo.hq))
    build_conv_plane(b, geo, x, n, plane, pad, rows=(lo, hi))


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
    runs compressed (compresses_runs on a target of these `features`)."""
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
        own_plane = None
        if owns_pixels(geo, qs, k.split.parts):
            def own_plane(b, n, plane, pad, first, last):
                build_own_plane(b, geo, k.ins[0][0], n, plane, pad, first, last)
        return qlanes.emit(b, k, geo, qs, build_conv_plane if geo.conv else build_matmul_plane, exact,
                           splits_pixels(geo, qs, k.split.parts), own_plane)
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
    claims = None if own and k.epilogue is not None else k.claim_counter()
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
            a_block = b.gep(a, [b.mul(mb, i64(geo.groups * len(geo.taps) * geo.mr))])
            q0 = b.mul(p, i64(qs.nr))
            # The elements of this block's group (the product of a single group: all).
            b_base = b.gep(base[0], [b.mul(q0, i64(geo.groups)) if geo.panel_major else q0 if geo.ng == 1 else b.add(
                q0, b.mul(b.udiv(mb, i64(geo.bpg)), i64(geo.groups * geo.group_stride)))])

            def start(i, j):        # the sums start from the row's bias correction
                return splat(b, b.load(b.gep(corr, [b.add(b.mul(mb, i64(geo.mr)), i64(i))])), qs.vw)

            rows = {}

            def store(i, j, sums):   # requantized, narrowed and stored by pairs of rows
                r = b.add(b.mul(mb, i64(geo.mr)), i64(i))
                rows.setdefault(i, []).append(requantize_for_narrow(
                    b, sums, b.load(b.gep(mult, [r])), exact, y_offset, bounds))
            # The next block's weights, over this block's panels (weights_prefetch; with panels
            # outside, the next block is the next tile's: not spread).
            step = len(geo.taps) * geo.mr
            ahead = weights_prefetch(b, qs, 4 * step, a_block, b.gep(a_block, [i64(geo.groups * step)]),
                                     b.sub(p, p_lo), geo.groups, geo.qpad // qs.nr, spread=not geo.panels_outer)
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


def _elem(b, qs: QShape, v8):
    """i8 activation values (a scalar or a vector) as B holds them: u8 bits of v + shift,
    or i16."""
    vector = isinstance(v8.type, ir.VectorType)
    if qs.bits == 8:
        assert qs.shift == 128
        return b.xor(v8, ir.Constant(v8.type, [-128] * v8.type.count if vector else -128))  # v + 128 as u8 bits
    return b.sext(v8, ir.VectorType(I16, v8.type.count) if vector else I16)


def _strided_elems(b, qs: QShape, x, at, count: int, stride: int):
    """The `count` activations x[at], x[at + stride], ... as B holds them (_elem): one load
    of count * stride bytes and a shuffle taking every stride-th."""
    raw_t = ir.VectorType(I8, count * stride)
    raw = b.load(b.bitcast(b.gep(x, [at]), raw_t.as_pointer()))
    raw.align = 1
    take = ir.Constant(ir.VectorType(I32, count), [stride * i for i in range(count)])
    return _elem(b, qs, b.shuffle_vector(raw, ir.Constant(raw_t, ir.Undefined), take))


def ir_const(t, v):
    from llvmlite import ir
    return ir.Constant(t, v)


def _store_elem(b, qs: QShape, plane_bytes, at_elem, t: int, value):
    """Store channel t of 32-bit element `at_elem` of the plane."""
    et = qs.elem
    t = t if not isinstance(t, int) else i64(t)
    p = b.gep(b.bitcast(plane_bytes, et.as_pointer()), [b.add(b.mul(at_elem, i64(4 // (qs.bits // 8))), t)])
    b.store(value, p)


def _pad_element(qs: QShape, x_offset: int) -> int:
    """The 32-bit plane element of G padding values (the real zero, as B holds it)."""
    bits = qs.bits
    one = (x_offset + qs.shift) & ((1 << bits) - 1)
    word = 0
    for t in range(qs.group):
        word |= one << (bits * t)
    return word - (1 << 32) if word >= 1 << 31 else word


def build_conv_plane(b, geo: Geometry, x, n, plane, pad, first=None, last=None, rows=None):
    """Image n of x (N, C, H, W) into the plane: [groups][CG / G][phase y][phase x][Hq][Wq]
    elements of G channels (the phases some tap reads: Geometry.phase_rows x phase_cols),
    the padding (and channels past each group's CG) the x offset; only its elements
    first..last (i64 values; default all).  For each element row, the columns inside the
    input in one loop (G strided loads combined into a 32-bit store, which LLVM vectorizes),
    the padding columns on either side stored whole.  `pad`: the 32-bit element of G padding
    values (_pad_element), read from the packed constants.  `rows`: (lo, hi) i64 values, only
    those rows of each phase (build_own_plane).  (An interleaved or an im2col plane has
    builders of its own.)"""
    qs = geo.qs
    first = i64(0) if first is None else first
    last = i64(geo.plane_groups) if last is None else last
    if interleaves_rows(geo):
        return interleave_channels(b, geo, x, n, plane, first, last)
    if geo.im2col:
        return build_im2col_plane(b, geo, x, n, plane, pad, first, last)
    if builds_rows_in_vectors(geo):
        return build_plane_rows(b, geo, x, n, plane, pad, first, last, rows)
    pad_value = b.trunc(pad, qs.elem)
    cols = len(geo.phase_cols)
    phases = len(geo.phase_rows) * cols
    with for_range(b, last, start=first, name="pc") as e, for_range(b, phases, name="ph") as ph:
        py = _pick(b, geo.phase_rows, b.sdiv(ph, i64(cols)))
        px = _pick(b, geo.phase_cols, b.srem(ph, i64(cols)))
        # Columns xq whose input column xq * sw + px - pl lies in [0, W).
        first = b.sub(i64(geo.pl), px)                            # in (-sw, pl]
        x_lo = b.sdiv(b.add(first, i64(geo.sw - 1)), i64(geo.sw))
        x_lo = b.select(b.icmp_signed("<", first, i64(0)), i64(0), x_lo)
        x_hi = b.add(b.sdiv(b.add(first, i64(geo.w - 1)), i64(geo.sw)), i64(1))
        x_hi = b.select(b.icmp_signed(">", x_hi, i64(geo.wq)), i64(geo.wq), x_hi)
        y_lo, y_hi = rows or (i64(0), i64(geo.hq))
        with for_range(b, y_hi, start=y_lo, name="py") as yq:
            yy = b.sub(b.add(b.mul(yq, i64(geo.sh)), py), i64(geo.pt))
            y_ok = b.and_(b.icmp_signed(">=", yy, i64(0)), b.icmp_signed("<", yy, i64(geo.h)))
            dst = b.gep(plane, [b.mul(b.add(b.mul(b.add(b.mul(e, i64(phases)), ph), i64(geo.hq)), yq), i64(geo.wq))])
            # Element e holds channels G * (e % groups) + t of group e // groups.
            group, local = (i64(0), e) if geo.ng == 1 else (b.udiv(e, i64(geo.groups)), b.urem(e, i64(geo.groups)))
            rows = []
            for t in range(qs.group):
                c_local = b.add(b.mul(local, i64(qs.group)), i64(t))
                c = b.add(b.mul(group, i64(geo.cg)), c_local)
                ok = b.and_(y_ok, b.icmp_signed("<", c_local, i64(geo.cg)))
                base = b.sub(b.mul(b.add(b.mul(b.add(b.mul(n, i64(geo.c)), c), i64(geo.h)), yy), i64(geo.w)),
                             i64(geo.pl))
                rows.append((ok, b.select(ok, b.add(base, px), i64(0))))
            with for_range(b, x_lo, name="pl") as xq:
                b.store(pad, b.gep(dst, [xq]))
            x_mid = _strided_columns(b, geo, x, rows, dst, pad_value, px, x_lo, x_hi) if geo.sw > 1 else x_lo
            # Rows inside the image and its channels (all of them but at the borders) in a
            # loop of plain loads, which LLVM vectorizes into byte permutes; the selects of
            # the general loop became gathers when LLVM did not unswitch them first (13% of
            # an int8 3x3 convolution's time).
            inside = rows[0][0]
            for ok, _ in rows[1:]:
                inside = b.and_(inside, ok)
            with b.if_else(inside) as (rows_inside, some_outside):
                with rows_inside:
                    _plane_columns(b, geo, x, rows, dst, pad_value, x_mid, x_hi, inside=True)
                with some_outside:
                    _plane_columns(b, geo, x, rows, dst, pad_value, x_mid, x_hi, inside=False)
            with for_range(b, geo.wq, start=x_hi, name="pr") as xq:
                b.store(pad, b.gep(dst, [xq]))


def _raw_pad(b, pad, lanes: int):
    """The x offset as x holds it (the byte _elem makes the padding element `pad`'s), in
    `lanes` lanes: what a masked load of input bytes reads where the padding is."""
    return splat(b, b.xor(b.trunc(pad, I8), ir.Constant(I8, -128)), lanes)


# Plane columns a step of build_plane_rows writes: 16 elements, one 64-byte store.
ROW_STEP = 16


def builds_rows_in_vectors(geo: Geometry) -> bool:
    """Whether build_conv_plane takes build_plane_rows: a padded or strided plane (not the
    input interleaved, nor im2col) of i8 values in 512-bit vectors (AVX-512BW: byte masks),
    each group's channels in whole elements, at column strides 1 and 2."""
    return (geo.conv and not geo.im2col and not interleaves_rows(geo) and geo.qs.vw == 16 and geo.qs.bits == 8
            and geo.cg % geo.qs.group == 0 and geo.sw in (1, 2))


def build_plane_rows(b, geo: Geometry, x, n, plane, pad, first, last, rows=None):
    """build_conv_plane where builds_rows_in_vectors: a plane row in steps of 16 elements,
    each of the G channels' input bytes the step reads (16 * sw from one input row) one
    load, masked to the columns inside the image (the others read the x offset: the
    padding), and the G loads dealt into the 16 elements by one byte shuffle.  Every mask
    is known now (the steps of a row are unrolled; the last one overlaps the one before, or
    a row narrower than a step stores its elements only); a row outside the image is its
    steps with no byte loaded.  build_conv_plane's loop took an element at a time what its
    vectors did not cover: every row of a 14 x 14 image, whose planes ResNet-50's 3x3s at
    2 threads built at 2.7 GB/s a core, the stride-2 ones at 2 GB/s."""
    qs, g, s = geo.qs, geo.qs.group, ROW_STEP
    cols, load_bytes = len(geo.phase_cols), ROW_STEP * geo.sw
    phases = len(geo.phase_rows) * cols
    mask_t = ir.VectorType(ir.IntType(1), load_bytes)
    raw_pad = _raw_pad(b, pad, load_bytes)
    deal = ir.Constant(ir.VectorType(I32, g * s), [t * load_bytes + j * geo.sw for j in range(s) for t in range(g)])
    if geo.wq >= s:
        starts, stored = sorted({*range(0, geo.wq - s + 1, s), geo.wq - s}), None
    else:
        starts, stored = [0], ir.Constant(ir.VectorType(ir.IntType(1), s), [j < geo.wq for j in range(s)])
    y_lo, y_hi = rows or (i64(0), i64(geo.hq))
    with for_range(b, last, start=first, name="rc") as e:
        group, local = (i64(0), e) if geo.ng == 1 else (b.udiv(e, i64(geo.groups)), b.urem(e, i64(geo.groups)))
        channel = b.add(b.mul(group, i64(geo.cg)), b.mul(local, i64(g)))
        image = b.gep(x, [b.mul(b.add(b.mul(n, i64(geo.c)), channel), i64(geo.h * geo.w))])
        for iy, py in enumerate(geo.phase_rows):
            with for_range(b, y_hi, start=y_lo, name="ry") as yq:
                yy = b.sub(b.add(b.mul(yq, i64(geo.sh)), i64(py)), i64(geo.pt))
                ok = b.and_(b.icmp_signed(">=", yy, i64(0)), b.icmp_signed("<", yy, i64(geo.h)))
                row = b.gep(image, [b.mul(b.select(ok, yy, i64(0)), i64(geo.w))])
                for ix, px in enumerate(geo.phase_cols):
                    dst = b.gep(plane, [b.mul(b.add(b.mul(b.add(b.mul(e, i64(phases)), i64(iy * cols + ix)),
                                                          i64(geo.hq)), yq), i64(geo.wq))])
                    for x0 in starts:
                        col = x0 * geo.sw + px - geo.pl        # the step's first input column
                        inside = [0 <= col + j < geo.w for j in range(load_bytes)]
                        if any(inside):
                            mask = b.select(ok, ir.Constant(mask_t, inside), ir.Constant(mask_t, [0] * load_bytes))
                            loads = [masked_load(b, b.gep(row, [i64(t * geo.h * geo.w + col)]), mask, raw_pad)
                                     for t in range(g)]
                        else:                               # every column in the padding
                            loads = [raw_pad] * g
                        word = _elem(b, qs, b.shuffle_vector(join_vectors(b, loads), ir.Constant(
                            ir.VectorType(I8, g * load_bytes), ir.Undefined), deal))
                        word = b.bitcast(word, ir.VectorType(I32, s))
                        at = b.gep(dst, [i64(x0)])
                        if stored is None:
                            st = b.store(word, b.bitcast(at, word.type.as_pointer()))
                            st.align = 4
                        else:
                            masked_store(b, word, at, stored)


def _plane_columns(b, geo: Geometry, x, rows, dst, pad_value, x_lo, x_hi, inside: bool):
    """Columns x_lo..x_hi of a plane row (build_conv_plane): G loads combined into each
    32-bit element; rows outside the image or the group's channels read the padding value
    unless the caller knows every row is `inside`."""
    qs = geo.qs
    with for_range(b, x_hi, start=x_lo, name="pm") as xq:
        word = None
        for t, (ok, base) in enumerate(rows):
            at = b.add(base, b.mul(xq, i64(geo.sw)))
            if inside:
                v = _elem(b, qs, b.load(b.gep(x, [at])))
            else:
                v = b.select(ok, _elem(b, qs, b.load(b.gep(x, [b.select(ok, at, i64(0))]))), pad_value)
            part = b.shl(b.zext(v, I32), ir_const(I32, qs.bits * t)) if t else b.zext(v, I32)
            word = part if word is None else b.or_(word, part)
        b.store(word, b.gep(dst, [xq]))


# Pixels a step of interleave_channels takes from each of its G channels.
INTERLEAVE_PIXELS = 64


def interleaves_rows(geo: Geometry) -> bool:
    """Whether the plane is the input itself, G channels interleaved (interleave_channels):
    a convolution at unit strides without padding whose plane rows are the image's (every
    1x1 one at stride 1), of one group with whole elements of channels."""
    return (geo.conv and (geo.sh, geo.sw, geo.pt, geo.pl) == (1, 1, 0, 0) and (geo.hq, geo.wq) == (geo.h, geo.w)
            and geo.ng == 1 and geo.cg % geo.qs.group == 0)


# Pixels of a band of an interleaved plane built at a time (interleaves_in_bands): the
# panels of 64 pixels, whose plane of 256 channels (16 KB) stays in L1 beside the weights.
INTERLEAVE_BAND_PIXELS = 64
# ... for a plane of this many bytes and more (a smaller one stays in L2 whole).
INTERLEAVE_BANDS_MIN_BYTES = 256 << 10


def interleave_band_pixels(qs: QShape) -> int:
    """Pixels of a band of interleaves_in_bands' plane: whole panels."""
    return max(1, INTERLEAVE_BAND_PIXELS // qs.nr) * qs.nr


def interleave_band_bytes(geo: Geometry) -> int:
    """Bytes of a band of interleaves_in_bands' plane: every element group's pixels."""
    return _ceil(4 * geo.plane_groups * interleave_band_pixels(geo.qs), 64) * 64


def interleaves_in_bands(geo: Geometry) -> bool:
    """Whether an interleaved plane (interleaves_rows) whose weights stay in cache over
    the panels (Geometry.panels_outer) is built a band of its panels at a time into the
    task's own scratch, each band's tiles computed before the next: the plane whole went
    out to L2 and back (ResNet-50's 256 -> 64 at 56 x 56, 800 KB)."""
    return interleaves_rows(geo) and geo.panels_outer and geo.plane_bytes >= INTERLEAVE_BANDS_MIN_BYTES


def interleave_channels(b, geo: Geometry, x, n, plane, first, last, pixels=None, stride=None):
    """build_conv_plane where interleaves_rows: element groups first..last of image n, each
    G whole channel images interleaved (or their `pixels` only, (lo, hi) i64 values: a
    task's own, owns_pixels; `stride`: elements from one group's to the next's, by default
    Geometry.group_stride, a band's in interleaves_in_bands), INTERLEAVE_PIXELS pixels of
    each at a time (G vector loads, one shuffle, which LLVM makes byte permutes), then 16
    at a time, the last pixels one
    element at a time.  In place of build_conv_plane's loop, element by element
    (each byte widened into its place in a 32-bit lane: 14 instructions for 16 elements,
    here 30 for 64): MobileNetV2's 144 -> 24 1x1 at 56x56 166 -> 155 kcycles, 32 -> 16 at
    112x112 132 -> 120, 576 -> 96 at 14x14 (features in the lanes) 139 -> 131 (Zen 4,
    1 thread, fastest of 300 alone)."""
    qs, g = geo.qs, geo.qs.group
    npix = geo.h * geo.w
    with for_range(b, last, start=first, name="ic") as e:
        rows = [b.gep(x, [b.mul(b.add(b.mul(n, i64(geo.c)), b.add(b.mul(e, i64(g)), i64(t))), i64(npix))])
                for t in range(g)]
        dst = b.bitcast(b.gep(plane, [b.mul(e, i64(stride or geo.group_stride))]), qs.elem.as_pointer())
        done, stop = pixels or (i64(0), i64(npix))
        for vl in (INTERLEAVE_PIXELS, 16):
            end = b.add(done, b.mul(b.sdiv(b.sub(stop, done), i64(vl)), i64(vl)))
            with for_range(b, end, start=done, step=vl, name=f"iv{vl}") as p:
                _interleave_step(b, qs, rows, dst, p, vl)
            done = end
        with for_range(b, stop, start=done, name="it") as p:
            for t, row in enumerate(rows):
                b.store(_elem(b, qs, b.load(b.gep(row, [p]))), b.gep(dst, [b.add(b.mul(p, i64(g)), i64(t))]))


def _interleave_step(b, qs: QShape, rows, dst, p, vl: int):
    """Pixels p..p + vl of the G channel rows, interleaved into elements p.. of dst."""
    g = qs.group
    vs = []
    for row in rows:
        v = b.load(b.bitcast(b.gep(row, [p]), ir.VectorType(I8, vl).as_pointer()))
        v.align = 1
        vs.append(_elem(b, qs, v))
    out_v = ir.VectorType(qs.elem, g * vl)
    order = [t * vl + q for q in range(vl) for t in range(g)]     # channel t's pixel q at t * vl + q
    v = b.shuffle_vector(join_vectors(b, vs), ir.Constant(out_v, ir.Undefined),
                         ir.Constant(ir.VectorType(I32, g * vl), order))
    st = b.store(v, b.bitcast(b.gep(dst, [b.mul(p, i64(g))]), out_v.as_pointer()))
    st.align = 4


# Output pixels a step of build_im2col_plane's vector loop takes.
IM2COL_PIXELS = 16
# Geometry.row_elements: at most this many times the elements of a plain im2col plane.
ROW_ELEMENTS_MAX_GROWTH = 1.15
# Panels of a band of row_elements' plane (quantized_product): ResNet's stem 4 x 5.4 KB.
BAND_PANELS = 4


def build_row_element_plane(b, geo: Geometry, x, n, plane, pad, first, last, rows=None, pixels=None):
    """build_im2col_plane where geo.row_elements: element e of pixel q = oy * OW + ox holds
    the G values x[c][oy * sh - pt + ky * dh][ox * sw - pl + G * j + t], t < G, of channel
    c, window row ky and run j of its columns (e = (c * KH + ky) * runs + j; the values
    past the window's last column meet zero weights).  The G values of 16 neighbouring
    pixels lie in sw * 15 + G bytes of one input row: a step is one load of 64 bytes,
    masked to those inside the row (the others, and every value of a row outside the
    image, the x offset), one byte shuffle dealing them into 16 elements, and one store;
    no value is loaded or tested on its own.  The last step of an output row overlaps the
    one before.  The plane is panel by panel where geo.panel_major, and then `pixels` (i64
    values, multiples of NR) builds only those (a band: quantized_product).  `rows`: as
    build_im2col_plane's."""
    qs, g, v = geo.qs, geo.qs.group, IM2COL_PIXELS
    kh, _, dh, _ = geo.window
    runs = geo.row_values // g
    raw_t, mask_t = ir.VectorType(I8, 64), ir.VectorType(ir.IntType(1), 64)
    raw_pad = _raw_pad(b, pad, 64)
    deal = ir.Constant(ir.VectorType(I32, g * v), [geo.sw * p + t for p in range(v) for t in range(g)])
    ones = ir.Constant(I64, -1)
    nr = qs.nr

    def at(e, q):
        """Element e of pixel q: its place in the plane."""
        if not geo.panel_major:
            return b.add(b.mul(e, i64(geo.group_stride)), q)
        panel = b.mul(b.udiv(q, i64(nr)), i64(geo.plane_groups * nr))
        return b.add(panel, b.add(b.mul(e, i64(nr)), b.urem(q, i64(nr))))

    def first_bytes(count):
        """The i64 mask of the low `count` (0..64) bytes."""
        count = clamp(b, count, i64(0), i64(64))
        shifted = b.lshr(ones, b.sub(i64(64), b.select(b.icmp_signed(">", count, i64(0)), count, i64(1))))
        return b.select(b.icmp_signed(">", count, i64(0)), shifted, i64(0))

    def deal_into(e, q, raw):
        """The 64 input bytes `raw` dealt into element e of the 16 pixels from q."""
        word = _elem(b, qs, b.shuffle_vector(raw, ir.Constant(raw_t, ir.Undefined), deal))
        st = b.store(word, b.bitcast(b.gep(plane, [at(e, q)]), word.type.as_pointer()))
        st.align = 4

    def step(e, row, ok, col0, q, ox):
        """The 16 pixels from q (= oy * OW + ox) of element e, from input row `row`."""
        col = b.add(col0, b.mul(ox, i64(geo.sw)))
        # Bytes col + i inside [0, W): i in [-col, W - col).
        inside = b.and_(first_bytes(b.sub(i64(geo.w), col)), b.not_(first_bytes(b.sub(i64(0), col))))
        mask = b.bitcast(b.select(ok, inside, i64(0)), mask_t)
        deal_into(e, q, masked_load(b, b.gep(x, [b.add(row, col)]), mask, raw_pad))

    def step_at(e, row, ok, col: int, q):
        """step where the first column, col, is known now: so is its mask of bytes inside."""
        inside = sum(1 << i for i in range(64) if 0 <= col + i < geo.w)
        if inside == 0:
            return deal_into(e, q, raw_pad)
        mask = b.bitcast(b.select(ok, ir.Constant(I64, inside - (1 << 64) if inside >= 1 << 63 else inside),
                                  i64(0)), mask_t)
        deal_into(e, q, masked_load(b, b.gep(x, [b.add(row, i64(col))]), mask, raw_pad))

    def input_row(e, oy):
        """(row start in x, whether inside the image, pixel 0's first column) of element e
        at output row oy."""
        c, r = b.udiv(e, i64(kh * runs)), b.urem(e, i64(kh * runs))
        ky, j = b.udiv(r, i64(runs)), b.urem(r, i64(runs))
        iy = b.add(b.sub(b.mul(oy, i64(geo.sh)), i64(geo.pt)), b.mul(ky, i64(dh)))
        ok = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(geo.h)))
        row = b.select(ok, b.mul(b.add(b.mul(b.add(b.mul(n, i64(geo.c)), c), i64(geo.h)), iy), i64(geo.w)), i64(0))
        return row, ok, b.sub(b.mul(j, i64(g)), i64(geo.pl))

    oy_lo, oy_hi = rows or (i64(0), i64(geo.oh))
    q_lo, q_hi = pixels or (b.mul(oy_lo, i64(geo.ow)), b.mul(oy_hi, i64(geo.ow)))
    if geo.panel_major:
        # Rows of whole steps (a step's pixels in one row), every element's row runs and steps
        # unrolled: their columns, and so their masks, known now.  (A share first..last of
        # the elements, a phased plane's, is taken by whole window rows: every row once.)
        oy_first, oy_last = b.udiv(q_lo, i64(geo.ow)), b.udiv(b.sub(q_hi, i64(1)), i64(geo.ow))
        with for_range(b, b.udiv(last, i64(runs)), start=b.udiv(first, i64(runs)), name="re") as er, \
                for_range(b, b.add(oy_last, i64(1)), start=oy_first, name="ry") as oy:
            row, ok, _ = input_row(b.mul(er, i64(runs)), oy)
            for j in range(runs):
                e = b.add(b.mul(er, i64(runs)), i64(j))
                for ox in range(0, geo.ow, v):
                    q = b.add(b.mul(oy, i64(geo.ow)), i64(ox))
                    with b.if_then(b.and_(b.icmp_signed(">=", q, q_lo), b.icmp_signed("<", q, q_hi))):
                        step_at(e, row, ok, j * g - geo.pl + ox * geo.sw, q)
    else:
        with for_range(b, last, start=first, name="re") as e, for_range(b, oy_hi, start=oy_lo, name="ry") as oy:
            row, ok, col0 = input_row(e, oy)
            with for_range(b, _ceil(geo.ow, v), name="rv") as i:
                ox = b.mul(i, i64(v))
                ox = b.select(b.icmp_signed("<", ox, i64(geo.ow - v)), ox, i64(geo.ow - v))
                step(e, row, ok, col0, b.add(b.mul(oy, i64(geo.ow)), ox), ox)
    past = b.select(b.icmp_signed(">", q_lo, i64(geo.q)), q_lo, i64(geo.q))
    end = pixels[1] if pixels else i64(geo.qpad)
    with for_range(b, last, start=first, name="rp") as e:               # pixels past the image
        with for_range(b, end, start=past, name="ip") as q:
            b.store(pad, b.gep(plane, [at(e, q)]))


def build_im2col_plane(b, geo: Geometry, x, n, plane, pad, first, last, rows=None):
    """build_conv_plane where geo.im2col: elements first..last of image n, element e of
    pixel q (= oy * OW + ox, at e * Qpad + q) holding the values k = G * e + t (t < G) of
    the window, channel k // (KH * KW), tap k % (KH * KW) (the x offset outside the image
    and past the window; the pixels past OH * OW too).  Within each output row, the pixels
    whose windows lie inside the input row IM2COL_PIXELS at a time (per value one load of
    IM2COL_PIXELS * sw bytes and a shuffle of every sw-th, the G values interleaved into elements by
    one shuffle, the last step overlapping the one before), the others one value at a
    time.  MobileNetV2's 3x3 stride-2 stem from 3 channels, 9 taps over an element of 4 (one
    of them padding) in stride-2 phase planes, becomes 7 elements: 478 -> 400 kcycles at
    x86-64-v3, 268 -> 219 with VNNI; ResNet's 7x7 stem (49 -> 37) 3932 -> 3233 and
    1964 -> 1735 (alone, Zen 4, 1 thread, fastest of 100-300 runs).  `rows`: (lo, hi) i64
    values, only those output rows' pixels (build_own_plane)."""
    if geo.row_elements:
        return build_row_element_plane(b, geo, x, n, plane, pad, first, last, rows)
    qs, g, v = geo.qs, geo.qs.group, IM2COL_PIXELS
    kh, kw, dh, dw = geo.window
    pad_value = b.trunc(pad, qs.elem)
    # Pixels ox whose window's columns, read V * sw bytes from ox * sw - pl + kx * dw, lie
    # inside the row for every kx: lo.. and the vector steps' starts up to `top`.
    lo = _ceil(geo.pl, geo.sw)
    top = (geo.w + geo.pl - (kw - 1) * dw - v * geo.sw) // geo.sw
    vector = top >= lo and top + v <= geo.ow and geo.c * geo.h * geo.w >= v * geo.sw
    scalar = [(0, lo), (top + v, geo.ow)] if vector else [(0, geo.ow)]
    order = ir.Constant(ir.VectorType(I32, g * v), [t * v + p for p in range(v) for t in range(g)])
    pads = splat(b, pad_value, v)
    with for_range(b, last, start=first, name="ie") as e:
        dst = b.gep(plane, [b.mul(e, i64(geo.group_stride))])
        oy_lo, oy_hi = rows or (i64(0), i64(geo.oh))
        with for_range(b, oy_hi, start=oy_lo, name="iy") as oy:
            values = []                                 # (whether in the image's row, row start)
            for t in range(g):
                k = b.add(b.mul(e, i64(g)), i64(t))
                c, r = b.udiv(k, i64(kh * kw)), b.urem(k, i64(kh * kw))
                ky, kx = b.udiv(r, i64(kw)), b.urem(r, i64(kw))
                iy = b.add(b.sub(b.mul(oy, i64(geo.sh)), i64(geo.pt)), b.mul(ky, i64(dh)))
                ok = b.and_(b.icmp_signed("<", k, i64(geo.depth)),
                            b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(geo.h))))
                row = b.add(b.mul(b.add(b.mul(n, i64(geo.c)), c), i64(geo.h)), iy)
                start = b.sub(b.mul(kx, i64(dw)), i64(geo.pl))      # input column of ox = 0
                values.append((ok, b.select(ok, b.mul(row, i64(geo.w)), i64(0)), start))
            out = b.mul(oy, i64(geo.ow))
            if vector:
                steps = _ceil(top - lo, v) + 1
                with for_range(b, steps, name="iv") as i:
                    ox = b.add(i64(lo), b.mul(i, i64(v)))
                    ox = b.select(b.icmp_signed("<", ox, i64(top)), ox, i64(top))
                    parts = []
                    for ok, row, start in values:
                        at = b.select(ok, b.add(row, b.add(start, b.mul(ox, i64(geo.sw)))), i64(0))
                        parts.append(b.select(ok, _strided_elems(b, qs, x, at, v, geo.sw), pads))
                    joined = join_vectors(b, parts)       # value t's pixel p at t * V + p
                    word = b.shuffle_vector(joined, ir.Constant(joined.type, ir.Undefined), order)
                    st = b.store(word, b.bitcast(b.gep(dst, [b.add(out, ox)]), word.type.as_pointer()))
                    st.align = 4
            for x_lo, x_hi in scalar:
                if x_hi <= x_lo:
                    continue
                with for_range(b, i64(x_hi), start=i64(x_lo), name="is") as ox:
                    for t, (ok, row, start) in enumerate(values):
                        ix = b.add(start, b.mul(ox, i64(geo.sw)))
                        inside = b.and_(ok, b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(geo.w))))
                        at = b.select(inside, b.add(row, ix), i64(0))
                        val = b.select(inside, _elem(b, qs, b.load(b.gep(x, [at]))), pad_value)
                        _store_elem(b, qs, dst, b.add(out, ox), t, val)
        with for_range(b, geo.qpad, start=i64(geo.q), name="ip") as q:     # pixels past the image
            b.store(pad, b.gep(dst, [q]))


# Columns of an element row built a vector at a time at strides above 1 (_strided_columns).
STRIDED_COLUMNS = 8


def _strided_columns(b, geo: Geometry, x, rows, dst, pad_value, px, x_lo, x_hi):
    """The plane's columns x_lo.. of one element row at column stride sw > 1, STRIDED_COLUMNS
    at a time while their input bytes lie inside the row: per channel one contiguous load of
    V * sw bytes and a shuffle of every sw-th, where the column loop's strided byte loads
    were scalar (ResNet-18's 7x7 stride-2 stem from 3 channels at x86-64-v3, alone: 1.04x
    the f32 convolution's time -> 0.86x; the whole int8 model 20.0 -> 19.7 ms).  Returns the first column left
    to the scalar loop."""
    qs, v, sw = geo.qs, STRIDED_COLUMNS, geo.sw
    if geo.c * geo.h * geo.w < v * sw:      # a channel that is no row reads x[0:v*sw]
        return x_lo
    # Columns xq whose V*sw bytes from input column xq * sw + px - pl end inside the row.
    lim = b.sdiv(b.sub(i64(geo.w + geo.pl), px), i64(sw))
    hi = b.select(b.icmp_signed("<", lim, x_hi), lim, x_hi)
    count = b.mul(b.sdiv(b.sub(hi, x_lo), i64(v)), i64(v))
    count = b.select(b.icmp_signed("<", count, i64(0)), i64(0), count)
    wt = ir.VectorType(I32, v)
    pad = splat(b, pad_value, v)
    with for_range(b, count, step=v, name="pv") as i:
        xq = b.add(x_lo, i)
        word = None
        for t, (ok, base) in enumerate(rows):
            src = b.select(ok, b.add(base, b.mul(xq, i64(sw))), i64(0))
            vals = b.select(ok, _strided_elems(b, qs, x, src, v, sw), pad)
            part = b.zext(vals, wt)
            part = b.shl(part, ir.Constant(wt, [qs.bits * t] * v)) if t else part
            word = part if word is None else b.or_(word, part)
        st = b.store(word, b.bitcast(b.gep(dst, [xq]), wt.as_pointer()))
        st.align = 4
    return b.add(x_lo, count)


def _pick(b, values: list[int], index):
    """values[index] (an i64 value), the list a compile-time constant (a select chain, none
    for the list 0, 1, ...)."""
    if values == list(range(len(values))):
        return index
    v = i64(values[0])
    for i, value in enumerate(values[1:], 1):
        v = b.select(b.icmp_signed("==", index, i64(i)), i64(value), v)
    return v


def build_matmul_plane(b, geo: Geometry, x, n, plane, pad):
    """x (rows, K) transposed into the plane: [K / G][rows] elements of G values of k."""
    qs = geo.qs
    pad = b.trunc(pad, qs.elem)
    with for_range(b, geo.rows, name="pr") as r:
        with for_range(b, geo.groups, name="pg") as cg:
            at = b.add(b.mul(cg, i64(geo.rows)), r)
            for t in range(qs.group):
                c = b.add(b.mul(cg, i64(qs.group)), i64(t))
                ok = b.icmp_signed("<", c, i64(geo.c))
                src = b.select(ok, b.add(b.mul(r, i64(geo.c)), c), i64(0))
                v = b.select(ok, _elem(b, qs, b.load(b.gep(x, [src]))), pad)
                _store_elem(b, qs, plane, at, t, v)


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
        v = b.fmul(ir_const(F64, float(q.scale)), b.fpext(b.load(b.gep(ws, [m])), F64))
        v = b.fdiv(v, ir_const(F64, float(node.scale)))
        return v if self.wide else b.fptrunc(v, F32)

    def sum_into(self, b, acc, xv, wv, xo):
        xs = b.sub(b.sext(xv, self.acc), ir_const(self.acc, xo))
        b.store(b.add(b.load(acc), b.mul(xs, b.sext(wv, self.acc))), acc)

    def requantize(self, b, sums, mult, node):
        bounds = saturation(node, "i16" if self.wide else "i8")
        if not self.wide:
            return requantize(b, sums, mult, node.offset, bounds=bounds)
        f = b.fmul(b.sitofp(sums, F64), mult)
        f = b.fadd(b.call(intrinsic(b.module, "llvm.roundeven.f64", F64, [F64]), [f]), ir_const(F64, float(node.offset)))
        lo, hi = (ir_const(F64, float(v)) for v in bounds)
        f = b.select(b.fcmp_ordered(">", f, hi), hi, f)
        f = b.select(b.fcmp_ordered("<", f, lo), lo, f)
        return b.trunc(b.fptosi(f, I32), I16)


def q_conv_loops(k: KernelArgs):
    """Any QuantizedConv (grouped, depthwise, weights computed at run time): one sum per
    output element in i32, taps outside the input skipped (they are real zeros)."""
    b, node = k.b, k.node
    (y, _), (x, _), (w, _), (ws, _), (bias, _) = k.outs[0], *k.ins
    nb, c, h, wd = node.inputs[0].type.shape
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    (sh, sw), (dh, dw), pads = node.strides, node.dilations, node.pads
    mg = m // node.group
    xo = node.inputs[0].type.quant.offset
    lt = LoopTypes(node)
    acc = b.alloca(lt.acc)
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
            b.store(lt.requantize(b, b.load(acc), mult, node), b.gep(y, [yi]))


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
