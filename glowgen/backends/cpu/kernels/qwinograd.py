"""int8 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3), F(4x4, 3x3) or F(4x2, 3x3),
exact, on AVX2.

The direct int8 product (qlinalg.py) makes 9 products per output pixel and channel pair;
F(2x2, 3x3) makes 16 per 2 x 2 tile of them, F(4x4, 3x3) 36 per 4 x 4 tile (conv_winograd.py's
algebra), F(4x2, 3x3) 24 per tile of 4 rows by 2 columns (F(4)'s transforms down the image,
F(2)'s across it):

    Y = A^T [ (G g G^T) .* (B^T d B) ] A

In integers, and so exactly, bit for bit the direct product's sums (IntegerTransforms):
- d is the input window less the input's offset (its real zero), |d| <= 255.  B^T is
  integer: V = B^T d B is an i16 (|V| <= 1020 for F(2x2), 25,500 for F(4x4)).
- G has fractions; each row times its scale S is integer, and U = (S G) g (S G)^T is an
  i16 (|U| <= 9 x 128, 49 x 128), computed at compile time (pack).
- M = U .* V summed over the channels in i32 by `vpmaddwd` (two 16-bit products summed into
  an i32: no saturation) and `vpaddd`: the int8 GEMM's `madd16` register tile
  (qgemm.emit_tile), its B a plane of channel pairs by tiles.
- (L A^T S^-1) M (L A^T S^-1)^T, an integer matrix on either side, is L^2 times the direct
  sum: 4 for F(2x2), 576 = 64 x 9 for F(4x4), whose result is then multiplied by 9's inverse
  modulo 2^32.  Integer additions and products wrap, but POW2 (4 or 64) times the sum and
  the bias fits i32, checked at compile time (sums_in_range; else F(2x2), else the direct
  product).  The requantization's multiplier is divided by POW2 (exact in f32) and the bias
  multiplied by it, so the requantized result is the direct kernel's
  (reference.primitives.requantize), bit for bit.

On Zen 3, a register-only loop makes 31-33 products a TSC cycle with `vpmaddwd` + `vpaddd`
against 40 with `ubsw`'s three instructions: 2.25x (F(2x2)) or 4x (F(4x4)) fewer products at
0.8x the rate.  With VNNI (64 products an instruction) the direct product stays: this path is
AVX2's only.  F(4x4) where its tiles waste little of the output (MAX_TILE_WASTE: all of
ResNet's sizes, 56 x 56 down to 7 x 7), F(2x2) elsewhere and where F(4x4)'s sums could leave
i32 (ResNet-18's 512 -> 512, say); and F(4x2) in place of either where it makes fewer
products (TALL_TILES: 7 x 7, whose 8 tiles fill a vector, and wherever F(2x2) was).

Per image: the input less its offset as i16 channel pairs, padded and split by column modulo
w, the tile's width (`Xp[C/2][phase][Hp][Wq]` of i32 elements: the pair (c, c+1) of one pixel),
built once (split: each task the rows its bands read, or its share of the pairs in a first
round where the tasks share out filters: PHASES); then,
band by band of tile rows (as conv_winograd's bands):
1. the input transform, 8 tiles of a tile row a vector (their windows' columns w t + j are
   column t + j // w of phase j % w: plain loads), for a channel pair in the 16 lanes of
   i16, into V[xi][C/2][tiles];
2. (h + 2)(w + 2) products M_xi[filter][tile] = U_xi @ V_xi (madd16 tiles of 6 filters x 16
   tiles);
3. the output transform, 8 tiles a vector, requantized and narrowed (qgemm.narrow,
   interleaved by 4) into each tile row of the 8 tiles, and stored: rows of the output where
   the 8 tiles lie in one tile row and inside the image (`rows_direct`), else through a
   staging block, tile row by tile row.
A split shares out the bands, or, where the transformed weights are streamed (past
STREAMED_WEIGHTS) and V is small against them (parallel.shares_pixels), the blocks of
filters: the whole image is then one band, transformed in the first round with the padded
input, each task its channel pairs, into a V they all read (phases; unphased, with several
images, each task transforms it all).

ResNet-18 int8 at x86-64-v3 on Zen 3, 1 thread, kernel Mcycles of the stride-1 3x3 layers
(direct ubsw -> F(2x2) -> F(4x4)): 64 @56 (4 layers) 12.2 -> 8.4 -> 6.4, 128 @28 (3) 8.9 ->
6.1 -> 4.7, 256 @14 (3) 8.9 -> 6.5 -> 4.7, 512 @7 (3) 9.6 -> 7.5 (F(2x2): its sums); the model
49.8 -> 38.9 -> 33.0.  ResNet-50 116.7 -> 105.3 -> 98.7.  512 @7 by F(4x2) in place of F(2x2)
(24 products a vector of 8 tiles for 2 x 16; 12.6 MB of U where F(2x2) has 8.4, streamed
from memory at 16 GB/s: close to what one core draws), in the model, us: ResNet-50's two
918 -> 792, ResNet-18's three 878-885 -> 757-766; whole models at 1 thread, wall: ResNet-18
12.36 -> 11.88 ms; at 2 threads (old and new alternating, one process) ResNet-50 20.97 ->
20.61 (vCPUs on one L3) and 22.72 -> 22.47 (two), ResNet-18 7.81 -> 7.54 and 8.55 -> 8.39.
One 64 @56 layer by F(2x2): 870 us, of which 757 in the
products (at the register-only rate, with 28 tiles a row padded to 32) and 31, 58 and 15 in
the input transform, the output transform and the padded input.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....reference.primitives import requantize_multipliers, saturation
from ..llvmutil import I8, I16, I32, for_range, i64
from ..parallel import Work, shares, shares_pixels
from ..plan import Phases
from ..qgemm import (PackedConstants, QShape, emit_tile, narrow, pack_a, pack_offsets, products_in_range,
                     requantize_for_narrow)
from ..vectors import prefetch, splat
from .conv_winograd import TRANSFORMS, combine, tile_waste
from .common import clamp
from .qdepthwise import copy_bytes

STRATEGY = "winograd-madd16"       # F(2x2, 3x3)
STRATEGY4 = "winograd4-madd16"     # F(4x4, 3x3)
STRATEGY42 = "winograd42-madd16"   # F(4x2, 3x3): tiles of 4 rows by 2 columns
TILES = {STRATEGY: 2, STRATEGY4: 4, STRATEGY42: (4, 2)}
# The int8 product paths (qgemm.QSHAPES) it replaces: AVX2's, in 8-lane vectors.
REPLACES = ("madd16", "ubsw")
# Output pixels at the least.  At 7 x 7 the 16 tiles compute 64 pixels for 49 and the i16
# transformed weights (8.4 MB for 512 -> 512, 16/9 x 2 the filters' bytes) stream from L3
# or memory on every call, and still: ResNet-18's three 512 -> 512 at 7 x 7 took 9.6 -> 7.3
# Mcycles at 1 thread, 5.4 -> 4.5 at 2 (Zen 3; the filters split among the tasks).
MIN_PIXELS = 7 * 7
# F(4x4) where its tiles reach at most this far past the output.  Further than the float
# kernel's 1.15: at 14 x 14 (16 x 16 computed, 1.31) int8 F(4x4) still makes 2.9 products an
# output against F(2x2)'s 4.  Zen 3, 1 thread, kernel Mcycles, 1.15 -> 1.35: ResNet-50's six
# 256 @14 11.0 -> 7.8 and three 512 @7 5.1 -> 4.8, ResNet-18's three 256 @14 6.5 -> 4.7.
MAX_TILE_WASTE = 1.35
# F(4x2) in place of the square tile where it makes fewer products (product_vectors): 3 an
# output pixel against F(2x2)'s 4, and a 7 x 7 image's 8 tiles fill a vector (2 tile rows
# of 4) where F(4x4)'s 4 fill half of one.
TALL_TILES = True
TILE_VECTOR = 8                     # tiles a vector of the transforms holds (i32 lanes)
# V and M of a band (the products' operand and result) within about this many bytes, unless
# the transformed weights exceed STREAMED_WEIGHTS: then one band a task (conv_winograd's rule).
# Past L2 (512 KB on Zen 3): a band of whole vectors of tiles wastes fewer products than
# L2's misses cost.  At 64 @56 (14 tiles a row, 16 computed), bands of 4 tile rows (56 tiles,
# 829 KB) in place of 1 (262 KB, over 192 KB anyway): 1.35-1.36 -> 1.24-1.28 Mcycles as a
# lone layer, 1.37-1.38 -> 1.33-1.35 in ResNet-18 (Zen 3, x86-64-v3, 1 thread).  Where the
# busiest of several tasks computes as many columns either way (two threads there: 112),
# the smaller band stays (_band_rows).
BAND_BYTES = 1024 * 1024
STREAMED_WEIGHTS = 1024 * 1024
# The products read U block after block, one stream through all of it (4.7 MB at 256 @14 by
# F(4x4), 8.4 MB at 512 @7 by F(2x2): more than L3 keeps of a whole model's weights from one
# call to the next), each block by as few as one tile of 16 tiles: memory's latency shows.
# Each step prefetches (into L1) the U bytes this far ahead.  Zen 3, x86-64-v3, one thread:
# 256 @14 alone with L3 flushed before each call 622-646 -> 583-594 us (1, 4 and 8 KB ahead:
# 595, 607, 612; into L2 only: 603-612), with L3 warm 547-551 either way; in the models (sum
# of the Winograd steps' medians over 40 calls) ResNet-50 8.29-8.60 -> 7.90-8.10 ms,
# ResNet-18 8.35-8.63 -> 8.20-8.26.
PREFETCH_AHEAD = 2048
_ceil = lambda a, b: -(-a // b)     # noqa: E731
# The scale of each row of G that makes it integer (S): F(2x2)'s halves all by 2, F(4x4)'s
# quarters, sixths and twenty-fourths each by its own (one scale of 24 for all would take
# U past i16).
ROW_SCALES = {2: (2, 2, 2, 2), 4: (4, 6, 6, 24, 24, 1)}


class _Axis:
    """One dimension of a tile F(m, 3) in integers: B^T, S G and L A^T S^-1 (S =
    diag(ROW_SCALES[m]), L their least common multiple)."""

    def __init__(self, m: int):
        b_t, g, a_t = TRANSFORMS[m]
        scales = np.array(ROW_SCALES[m], np.int64)
        self.m, self.n = m, m + 2
        self.scale = int(np.lcm.reduce(scales))
        self.b_t = _integer(b_t)
        self.kt = _integer(scales[:, None] * g)
        self.a_t = _integer(self.scale * a_t / scales[None, :])


class IntegerTransforms:
    """F(h x w, 3x3) in integers (w = h unless given: F(m x m)).  With S_h, S_w the row
    scales of G along either axis (ROW_SCALES) and L_h, L_w their least common multiples,
    U = (S_h G_h) g (S_w G_w)^T, and M = U .* V summed is S_h M0 S_w for the true M0; so
    (L_h A_h^T S_h^-1) M (L_w A_w^T S_w^-1)^T = L_h L_w A_h^T M0 A_w = L_h L_w x the direct
    sum, all in integers.  L_h L_w = POW2 x ODD: the result times ODD's inverse modulo 2^32
    is POW2 x the sum (exact where that fits i32: sums_in_range), and POW2 is a power of
    two, exact in the f32 multiplier.  F(2x2): 4; F(4x4): 576 = 64 x 9; F(4x2): 48 = 16 x 3.
    Position xi = n_w i + j of the n_h x n_w window."""

    def __init__(self, h: int, w: int | None = None):
        self.down, self.across = _Axis(h), _Axis(w or h)      # along the rows, the columns
        self.h, self.w = self.down.m, self.across.m
        self.positions = self.down.n * self.across.n
        if self.h == self.w:                    # F(m x m): one axis's matrices serve both
            self.m, self.n = self.h, self.down.n
            self.b_t, self.kt, self.a_t = self.down.b_t, self.down.kt, self.down.a_t
        scale = self.down.scale * self.across.scale
        self.pow2 = scale & -scale
        self.odd = scale // self.pow2
        self.inverse = pow(self.odd, -1, 2 ** 32)
        self.inverse -= 2 ** 32 if self.inverse >= 2 ** 31 else 0      # as an i32
        # V = B^T d B of |d| <= 255, U of |g| <= 128, and vpmaddwd's pair sums, in range.
        widest = lambda m: int(np.abs(m).sum(1).max())      # noqa: E731
        self.v_max = 255 * widest(self.down.b_t) * widest(self.across.b_t)
        self.u_max = 128 * widest(self.down.kt) * widest(self.across.kt)
        assert self.v_max < 2 ** 15 and self.u_max < 2 ** 15 and 2 * self.v_max * self.u_max < 2 ** 31


def _skewed(elements: int) -> int:
    """i32 elements a position's block of V (or M) takes: its own, rounded up to an odd number of
    64-byte lines, so that the n^2 blocks start in n^2 different sets of the L1 cache.  The
    input transform stores a vector to each block in turn: blocks a multiple of 4 KB long
    (ResNet's 128 @28 and 256 @14, 16 and 12 KB) put all 36 of them in one set of 8 ways.
    ResNet-18's int8 layers in the model (Zen 3, x86-64-v3, 1 thread, fastest of 40,
    Mcycles): 256 @14 1.52 -> 1.39, 128 @28 1.39 -> 1.29, 64 @56 (3 KB blocks, 9 in a set)
    1.43 -> 1.36.  M's blocks, which the output transform reads 36 at a time, likewise:
    512 @7 2.37 -> 2.33, 128 @28 1.29 -> 1.27."""
    lines = _ceil(elements, 16)
    return 16 * (lines | 1)


def _integer(m: np.ndarray) -> np.ndarray:
    out = np.rint(m).astype(np.int64)
    assert np.allclose(m, out), m
    return out


def _tile(m) -> tuple[int, int]:
    """(rows, columns) of a tile of TILES' key m: m for F(m x m), (h, w) for F(h x w)."""
    return m if isinstance(m, tuple) else (m, m)


INTEGER = {m: IntegerTransforms(*_tile(m)) for m in (2, 4, (4, 2))}      # by TILES' key


def strategy(node, qs: QShape, winograd: bool, w: np.ndarray, b: np.ndarray):
    """STRATEGY4 where covers and F(4x4)'s tiles waste little of the output, else STRATEGY;
    either only where its sums stay in range (sums_in_range); then STRATEGY42 in place of
    that where it makes fewer products (product_vectors: 7 x 7 images); None otherwise."""
    if not covers(node, qs, winograd):
        return None
    oh, ow = node.outputs[0].type.shape[2:]
    waste = tile_waste(oh, ow, 4)
    names = [n for n in ((STRATEGY4, STRATEGY) if waste <= MAX_TILE_WASTE else (STRATEGY,))
             if sums_in_range(w, b, TILES[n])]
    if TALL_TILES and sums_in_range(w, b, TILES[STRATEGY42]) and (
            not names or product_vectors(oh, ow, TILES[STRATEGY42]) < product_vectors(oh, ow, TILES[names[0]])):
        return STRATEGY42
    return names[0] if names else None


def product_vectors(oh: int, ow: int, m) -> int:
    """The products' vectors of 8 tiles for an image (per filter and channel pair): positions
    x the image's tiles in whole vectors.  A 7 x 7 image: F(2x2) 16 x 2 (16 tiles), F(4x4)
    36 x 1 (4 tiles in a vector of 8), F(4x2) 24 x 1 (8 tiles: 2 tile rows of 4)."""
    h, w = _tile(m)
    return INTEGER[m].positions * _ceil(_ceil(oh, h) * _ceil(ow, w), TILE_VECTOR)



def covers(node, qs: QShape, winograd: bool = True) -> bool:
    """A single-group 3x3 convolution at stride 1 without dilation, from an even number of
    channels, over at least MIN_PIXELS output pixels, on a target whose int8 product is
    AVX2's (qs: the product's strategy for these weights)."""
    if not winograd or qs.kind not in REPLACES or node.OP != "QuantizedConv":
        return False
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    return (node.group == 1 and (kh, kw) == (3, 3) and tuple(node.strides) == (1, 1)
            and tuple(node.dilations) == (1, 1) and cg % 2 == 0 and oh * ow >= MIN_PIXELS)


def transformed_weights(w: np.ndarray, m=2) -> np.ndarray:
    """U = (S_h G_h) g (S_w G_w)^T of each filter g [M, C, 3, 3] (IntegerTransforms), as
    [positions, M, C] (position xi = n_w i + j)."""
    t = INTEGER[m]
    u = np.einsum("ik,mckl,jl->ijmc", t.down.kt, w.astype(np.int64), t.across.kt)
    return u.reshape(INTEGER[m].positions, *w.shape[:2])


def sums_in_range(w: np.ndarray, b: np.ndarray, m=2) -> bool:
    """Whether POW2 (sum + bias) fits i32 for every filter and input: what the output
    transform computes exactly (IntegerTransforms)."""
    bound = np.abs(b.astype(np.int64)) + 255 * np.abs(w.reshape(len(b), -1).astype(np.int64)).sum(1)
    return bool(np.all(INTEGER[m].pow2 * bound < 2 ** 31))


class QWinogradGeometry:
    """Tiles, the padded parity-split input, the bands, and the packed constants' layout of
    one convolution split among `parts` tasks."""

    def __init__(self, node, parts: int = 1, m=2):
        self.t = INTEGER[m]
        self.tile_h, self.tile_w = _tile(m)     # a tile's output rows and columns
        self.positions = self.t.positions
        self.qs = QShape("madd16")
        self.batch, self.c, self.h, self.w = node.inputs[0].type.shape
        self.m = node.inputs[1].type.shape[0]
        self.oh, self.ow = node.outputs[0].type.shape[2:]
        self.pt, self.pl = node.pads[:2]
        self.pairs = self.c // 2
        tile_h, tile_w = self.tile_h, self.tile_w
        self.th, self.tw = _ceil(self.oh, tile_h), _ceil(self.ow, tile_w)
        # Xp: padded rows 0 .. h th + 1 (the last tile's window), columns 0 .. w wq - 1 split
        # by their residue modulo w, the tile's width (the phase); a vector of 8 tiles from
        # the last start (max(tw - 8, 0)) reads column indices up to that + 8 (window column
        # w t + j is column t + j // w of phase j % w, and j // w <= 1).
        self.hp = tile_h * self.th + 2
        self.wq = max(self.tw, TILE_VECTOR) + 1
        self.xp_bytes = _ceil(4 * self.pairs * tile_w * self.hp * self.wq, 64) * 64
        # _build_through_image's padded image of two channels (rows shorter than a step)
        self.line_stride = _ceil(tile_w * self.wq, 16) * 16
        self.image_bytes = 2 * self.hp * self.line_stride
        self.mr = self.qs.mr
        self.blocks = _ceil(self.m, self.mr)
        self.mpad = self.blocks * self.mr
        self.a_bytes = self.positions * self.blocks * self.pairs * self.mr * 4
        # Transformed weights past STREAMED_WEIGHTS are read from L3 or memory by every band:
        # one band (the whole image) then, and a split shares out blocks of filters, each
        # task reading its own filters' weights (a split by tile rows read them all in each
        # task: ResNet-50's 512 -> 512 at 7 x 7 took longer at 2 threads than the direct product).
        self.streamed = 2 * self.positions * self.c * self.mpad > STREAMED_WEIGHTS
        # ... unless the tasks' V, which each would read whole, half of it transformed by the
        # other task, is large against them (parallel.shares_pixels: ResNet-50's 128 @28):
        # then one band a task, each reading all of U.
        v_whole = 4 * self.positions * self.pairs * _ceil(self.th * self.tw, TILE_VECTOR) * TILE_VECTOR
        self.shares_filters = self.streamed and not shares_pixels(v_whole, self.a_bytes)
        self.split_filters = self.shares_filters and parts > 1
        self.rows = self._band_rows(1 if self.split_filters else parts)
        self.bands = _ceil(self.th, self.rows)
        self.cols = _ceil(self.rows * self.tw, TILE_VECTOR) * TILE_VECTOR   # a band's tile columns
        self.v_stride = self.cols + TILE_VECTOR   # the last tile row's 8 may reach past the band
        self.v_xi = _skewed(self.pairs * self.v_stride)
        self.v_bytes = 4 * self.positions * self.v_xi
        self.m_xi = _skewed(self.mpad * self.cols)
        self.m_bytes = 4 * self.positions * self.m_xi
        self.z_bytes = tile_h * tile_w * self.cols
        # Whether the output transform stores its 8 tiles as rows of the output: every vector
        # of 8 tiles in one tile row, none past the image's columns.
        self.rows_direct = self.tw >= TILE_VECTOR and self.ow % tile_w == 0
        # Whether build_padded_input goes through a padded image (_build_through_image): rows
        # shorter than its vector step.
        # Its elements k whose input pixels w k - pl .. w k - pl + 8 w - 1 lie inside the row:
        # k_lo .. k_top + 7 (vector steps of 8 elements, the last overlapping).
        self.k_lo = _ceil(self.pl, tile_w)
        self.k_top = min((self.w + self.pl - TILE_VECTOR * tile_w) // tile_w, self.wq - TILE_VECTOR)
        self.through_image = self.k_top < self.k_lo
        # A task sharing out bands builds only the rows of Xp its bands read, in its own
        # scratch, in one round (phases).
        self.own_rows = not self.split_filters

    def _band_rows(self, parts: int) -> int:
        """Tile rows a band: of those whose V and M fit BAND_BYTES, the ones whose vectors of
        8 tiles waste the fewest columns of the busiest task (a band's tiles are padded to
        whole vectors), then the fewest (the least scratch).  Where the weights are
        streamed, one band a task."""
        if self.streamed:
            return _ceil(self.th, parts)

        def busiest_columns(r):
            bands = _ceil(self.th, r)
            cols = [_ceil(min(r, self.th - j * r) * self.tw, TILE_VECTOR) for j in range(bands)]
            return max(sum(cols[lo:hi]) for lo, hi in shares(bands, 1, parts, bands))
        return min(self.band_choices(), key=lambda r: (busiest_columns(r), r))

    def band_choices(self) -> list[int]:
        """The tile rows a band may have where the weights are not streamed."""
        return [r for r in range(1, self.th + 1) if self.band_bytes(r) <= BAND_BYTES] or [1]

    def band_bytes(self, r: int) -> int:
        """V and M of a band of r tile rows."""
        cols = _ceil(r * self.tw, TILE_VECTOR) * TILE_VECTOR
        return 4 * self.positions * (_skewed(self.pairs * (cols + TILE_VECTOR)) + _skewed(self.mpad * cols))

    def most_scratch(self) -> int:
        """A task's own scratch for any split (its bands' rows depend on the tasks)."""
        rows = [self.th] if self.streamed else self.band_choices()
        z = self.tile_h * self.tile_w * _ceil(self.th * self.tw, TILE_VECTOR) * TILE_VECTOR   # the staging block at most
        return max(max(self.band_bytes(r) for r in rows) + z, self.image_bytes)

    def starts(self) -> list[int]:
        """The first tile column of each vector of 8 along a tile row: every 8th, the last one
        overlapping the one before so as to end at the row's end (or 0 alone, reaching past a
        row shorter than 8)."""
        if self.tw <= TILE_VECTOR:
            return [0]
        out = list(range(0, self.tw - TILE_VECTOR, TILE_VECTOR))
        return out + [self.tw - TILE_VECTOR]


# ----------------------------------------------------------------------------- compile time
def pack(node, w, ws, b, m=2) -> tuple[np.ndarray, bool]:
    """[positions][blocks][C/2][MR][2] i16 transformed weights (qgemm.pack_a's madd16
    layout, per position), POW2 x the bias (i32), the multipliers / POW2 (f32), the offsets;
    and whether the sums stay in qgemm.IN_RANGE (requantize in i32)."""
    g = QWinogradGeometry(node, m=m)
    u = transformed_weights(w, m)
    assert np.abs(u).max(initial=0) < 2 ** 15
    a = [pack_a(u[xi][:, :, None].astype(np.int16), 1, g.qs).view(np.int8).ravel() for xi in range(g.positions)]
    q = node.inputs[0].type.quant
    pow2 = g.t.pow2
    bias = np.zeros(g.mpad, np.int32)
    bias[:g.m] = pow2 * b.astype(np.int64)
    mult = np.zeros(g.mpad, np.float32)
    mult[:g.m] = requantize_multipliers(q.scale, ws, node.scale) * np.float32(1.0 / pow2)
    exact = products_in_range(pow2 * w.reshape(g.m, -1).astype(np.int64), bias[:g.m], mult[:g.m])
    data = np.concatenate([*a, bias.view(np.int8), mult.view(np.int8), *pack_offsets(node, q.offset)])
    return data, exact


def scratch(node, phased: bool, m=2) -> int:
    g = QWinogradGeometry(node, m=m)
    return g.most_scratch() + (0 if phased else g.xp_bytes)


def phases(node, parts: int, m=2):
    """The padded input built in a round of its own, each task its share of the channel
    pairs (one image: the kernel loops over images otherwise).  Where the tasks share out
    filters (split_filters), each then transformed the whole input for itself, and 2
    threads ran ResNet-18's 128 @28, 256 @14 and 512 @7 1.57-1.69x as fast as one: the
    first round transforms its pairs too, into a V the tasks share after the padded input.
    Where they share out bands, each builds the rows of Xp its bands read instead, in one
    round (own_rows): on a VM whose two vCPUs shared no L3, half of what each task read of
    a shared Xp crossed between them."""
    g = QWinogradGeometry(node, parts, m)
    if g.batch != 1 or (parts > 1 and g.own_rows):
        return None
    return Phases(2, g.xp_bytes + (g.v_bytes if g.split_filters else 0))


def work(node, m=2) -> Work:
    """Bands of tile rows, or blocks of filters where the weights are streamed (and V is
    not large against them: shares_filters)."""
    g = QWinogradGeometry(node, m=m)
    flops = 2.0 * g.batch * g.m * g.c * g.positions * g.th * g.tw
    return Work(g.blocks if g.shares_filters else g.th, flops=flops)


# ----------------------------------------------------------------------------- run time
def _vec(t, n):
    return ir.VectorType(t, n)


def _load(b, base, at, vt):
    v = b.load(b.bitcast(b.gep(base, [at]), vt.as_pointer()))
    v.align = 1
    return v


def _store(b, value, base, at):
    st = b.store(value, b.bitcast(b.gep(base, [at]), value.type.as_pointer()))
    st.align = 1


def build_padded_input(b, g: QWinogradGeometry, x, n, xp, x_offset, lo, hi, image, rows=None) -> None:
    """Channel pairs lo .. hi of image n into Xp: element (pair, phase p, row r, column k)
    holds channels 2 pair and 2 pair + 1 of input pixel (r - pt, m k + p - pl) less the
    input's offset, as two i16 (0 outside the input).  Input rows 8 m pixels a step where
    they lie inside the row, the edges one element at a time; rows shorter than a step
    (28 and less for F(4x4), 15 for F(2x2)) through a padded image (_build_through_image)
    in `image`, g.image_bytes of the task's own scratch.  `rows`: (first, end) i64 values,
    only those rows of Xp (g.own_rows)."""
    m = g.tile_w                             # phases
    span = TILE_VECTOR * m                   # input pixels of a vector step
    off16 = b.trunc(x_offset, I16)
    zero_row = ir.Constant(_vec(I32, TILE_VECTOR), None)
    # Elements g.k_lo .. g.k_top + 7 in vector steps, the others one at a time.
    k_lo, k_top = g.k_lo, g.k_top
    r_lo, r_hi = rows or (i64(0), i64(g.hp))
    if g.through_image:
        _build_through_image(b, g, x, n, xp, x_offset, lo, hi, image, r_lo, r_hi)
        return
    offs16 = splat(b, off16, 16)
    steps = list(range(k_lo, k_top, TILE_VECTOR)) + [k_top]
    scalar = [(0, k_lo), (k_top + TILE_VECTOR, g.wq)]
    with for_range(b, hi, start=lo, name="xpp") as pair:
        src = [b.gep(x, [b.mul(b.add(b.mul(n, i64(g.c)), b.add(b.mul(pair, i64(2)), i64(t))), i64(g.h * g.w))])
               for t in range(2)]
        with for_range(b, r_hi, start=r_lo, name="xpr") as r:
            iy = b.sub(r, i64(g.pt))
            inside = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(g.h)))
            rows = [b.mul(b.add(b.mul(b.add(b.mul(pair, i64(m)), i64(p)), i64(g.hp)), r), i64(g.wq))
                    for p in range(m)]
            with b.if_else(inside) as (then, otherwise):
                with then:
                    row_src = [b.gep(s, [b.mul(iy, i64(g.w))]) for s in src]
                    for k0 in steps:
                        at = i64(m * k0 - g.pl)
                        c0, c1 = (_load(b, s, at, _vec(I8, span)) for s in row_src)
                        for p, v in enumerate(_phase_pairs(b, m, c0, c1, offs16)):
                            _store(b, v, xp, b.add(rows[p], i64(k0)))
                    for k_a, k_b in scalar:
                        if k_b <= k_a:
                            continue
                        with for_range(b, i64(k_b), start=i64(k_a), name="xps") as k:
                            for p in range(m):
                                ix = b.add(b.mul(k, i64(m)), i64(p - g.pl))
                                ok = b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(g.w)))
                                at = b.select(ok, ix, i64(0))
                                vals = [b.select(ok, b.sub(b.sext(b.load(b.gep(s, [at])), I16), off16),
                                                 ir.Constant(I16, 0)) for s in row_src]
                                word = b.or_(b.zext(vals[0], I32), b.shl(b.zext(vals[1], I32), ir.Constant(I32, 16)))
                                b.store(word, b.gep(xp, [b.add(rows[p], k)]))
                with otherwise:
                    for p in range(m):
                        with for_range(b, g.wq, step=TILE_VECTOR, name="xpz") as k:
                            # the last step overlapping the one before (a row is >= 9 long)
                            k = b.select(b.icmp_signed("<", b.add(k, i64(TILE_VECTOR)), i64(g.wq)), k,
                                         i64(g.wq - TILE_VECTOR))
                            _store(b, zero_row, xp, b.add(rows[p], k))


def _phase_pairs(b, m: int, c0, c1, offs) -> list:
    """Xp's m vectors of a step from the raw bytes of its 8 m input pixels in two channels
    (c0, c1): phase p's is the pairs (c0[m k + p], c1[m k + p]) of k < 8 as i16, less the
    offset (`offs`, 16 i16).  Dealt by phase and paired as bytes, then widened: a byte
    shuffle a channel, two unpacks and a qword permute (F(4x4)), 12 shuffles a step in
    place of the 40 that widening first and dealing i16 lanes took (LLVM's lowering)."""
    span = TILE_VECTOR * m
    lanes = span // 16                      # 128-bit lanes of a channel's bytes
    # In each 128-bit lane, the bytes by phase: [phase 0's 16 / m, phase 1's, ...].
    deal = [16 * lane + m * k + p for lane in range(lanes) for p in range(m) for k in range(16 // m)]
    undef = ir.Constant(c0.type, ir.Undefined)
    s0, s1 = (b.shuffle_vector(c, undef, ir.Constant(_vec(I32, span), deal)) for c in (c0, c1))
    # Unpacks of the two channels, lane by lane: the low and the high 8 bytes of each.
    unpacks = [b.shuffle_vector(s0, s1, ir.Constant(_vec(I32, span), [
        x for lane in range(lanes) for i in range(8) for x in (16 * lane + 8 * h + i, span + 16 * lane + 8 * h + i)]))
        for h in range(2)]
    runs = []                               # 16-byte runs of pairs, phase by phase
    for u in unpacks:                       # (m = 4: lane 0 phases 2h, 2h + 1 of k < 4, lane 1 of k >= 4)
        if lanes == 2:
            q = b.bitcast(u, _vec(ir.IntType(64), 4))
            q = b.bitcast(b.shuffle_vector(q, ir.Constant(q.type, ir.Undefined), ir.Constant(_vec(I32, 4), [0, 2, 1, 3])),
                          _vec(I8, 32))
            runs += [b.shuffle_vector(q, ir.Constant(q.type, ir.Undefined), ir.Constant(_vec(I32, 16), list(range(16 * h, 16 * h + 16))))
                     for h in range(2)]
        else:
            runs.append(u)
    return [b.bitcast(b.sub(b.sext(r, _vec(I16, 16)), offs), _vec(I32, TILE_VECTOR)) for r in runs]


def _build_through_image(b, g: QWinogradGeometry, x, n, xp, x_offset, lo, hi, image, r_lo, r_hi) -> None:
    """build_padded_input for rows shorter than its vector step: each pair's two channels
    copied into `image` (scratch of g.image_bytes: both channels padded, Hp rows of
    line_stride bytes, the padding the input's offset, filled once; of the input, the rows
    that Xp's rows r_lo .. r_hi hold), then those rows of Xp 8 elements a step from there
    (the last step overlapping the one before: Xp's rows hold at least 9), none one element
    at a time.  The copies all land before the first load
    reads them back, so no load waits on the narrower stores before it (copied a row at
    a time just before its steps, the layer was slower).  With _phase_pairs, the padded
    input of single layers took (Zen 3, x86-64-v3, 1 thread, kcycles): 128 @28 (F(4x4), one
    element at a time before) 181 -> 42, 512 @7 (F(2x2)) 81 -> 51, 256 @14 44 -> 47; 64 @56
    (8 m pixels a step before too) 68 -> 38; ResNet-18's 128 @28 layers 1.55 -> 1.39 Mcycles."""
    m = g.tile_w                             # phases
    span = TILE_VECTOR * m
    offs = splat(b, b.trunc(x_offset, I16), 16)
    plane = g.hp * g.line_stride
    fill = splat(b, b.trunc(x_offset, I8), 16)
    for at in range(0, g.image_bytes, 16):
        _store(b, fill, image, i64(at))
    steps = list(range(0, g.wq - TILE_VECTOR, TILE_VECTOR)) + [g.wq - TILE_VECTOR]
    # the input rows iy = r - pt of those rows that lie inside the input
    in_lo = clamp(b, b.sub(r_lo, i64(g.pt)), i64(0), i64(g.h))
    in_hi = clamp(b, b.sub(r_hi, i64(g.pt)), in_lo, i64(g.h))
    with for_range(b, hi, start=lo, name="xip") as pair:
        src = [b.gep(x, [b.mul(b.add(b.mul(n, i64(g.c)), b.add(b.mul(pair, i64(2)), i64(t))), i64(g.h * g.w))])
               for t in range(2)]
        with for_range(b, in_hi, start=in_lo, name="xic") as iy:
            for t in range(2):
                dst = b.add(i64(t * plane + g.pt * g.line_stride + g.pl), b.mul(iy, i64(g.line_stride)))
                copy_bytes(b, b.gep(src[t], [b.mul(iy, i64(g.w))]), b.gep(image, [dst]), g.w, False)
        with for_range(b, r_hi, start=r_lo, name="xir") as r:
            line = b.mul(r, i64(g.line_stride))
            rows = [b.mul(b.add(b.mul(b.add(b.mul(pair, i64(m)), i64(p)), i64(g.hp)), r), i64(g.wq))
                    for p in range(m)]
            for k0 in steps:
                c0, c1 = (_load(b, image, b.add(line, i64(t * plane + m * k0)), _vec(I8, span)) for t in range(2))
                for p, v in enumerate(_phase_pairs(b, m, c0, c1, offs)):
                    _store(b, v, xp, b.add(rows[p], i64(k0)))


def _input_transform(b, g: QWinogradGeometry, xp, v, first_row, tile_rows: int, pairs=None) -> None:
    """V[xi][pair][t] of the band's tiles t (tile row first_row + t // tw), 8 tiles of a tile
    row at a time, for the channel pairs `pairs` (lo, hi; None: all)."""
    vt, vh = _vec(I32, TILE_VECTOR), _vec(I16, 2 * TILE_VECTOR)
    m, down, across = g.tile_w, g.t.down, g.t.across
    nh, nw = down.n, across.n                                     # the window's rows and columns
    lo, hi = pairs or (i64(0), i64(g.pairs))
    with for_range(b, hi, start=lo, name="itp") as pair, for_range(b, tile_rows, name="itr") as r:
        top = b.mul(b.add(first_row, r), i64(g.tile_h))           # the windows' first padded row
        planes = [b.mul(b.add(b.mul(pair, i64(m)), i64(p)), i64(g.hp)) for p in range(m)]
        for t0 in g.starts():
            d = [[b.bitcast(_load(b, xp, b.add(b.mul(b.add(b.add(planes[j % m], top), i64(i)), i64(g.wq)),
                                                  i64(t0 + j // m)), vt), vh)
                  for j in range(nw)] for i in range(nh)]
            out = _separable(b, down.b_t, across.b_t, d, 2 * TILE_VECTOR)      # V = B_h^T d B_w
            col = b.add(b.mul(r, i64(g.tw)), i64(t0))
            for i in range(nh):
                for j in range(nw):
                    at = b.add(i64((nw * i + j) * g.v_xi), b.add(b.mul(pair, i64(g.v_stride)), col))
                    _store(b, b.bitcast(out[i][j], vt), v, at)


def _products(b, g: QWinogradGeometry, a, v, mm, tiles: int, blocks) -> None:
    """M_xi[r][t] = sum over pairs of U_xi[f][pair] . V_xi[pair][t], for the band's `tiles`
    tiles and the filters f of `blocks` (lo, hi), r = f - MR lo: madd16 tiles of MR filters
    by 16 tiles (the last by 8 where that is what is left)."""
    qs = g.qs
    full, half = divmod(_ceil(tiles, TILE_VECTOR), qs.nv)
    with for_range(b, g.positions, name="pxi") as xi, for_range(b, blocks[1], start=blocks[0], name="pmb") as mb:
        a_block = b.gep(a, [b.mul(b.add(b.mul(xi, i64(g.blocks)), mb), i64(g.pairs * g.mr))])
        v_xi = b.gep(v, [b.mul(xi, i64(g.v_xi))])
        m_rows = b.mul(b.sub(mb, blocks[0]), i64(g.mr))
        m_xi = b.mul(xi, i64(g.m_xi))

        def tile(col, vectors):
            def store(i, j, sums):
                at = b.add(m_xi, b.add(b.mul(b.add(m_rows, i64(i)), i64(g.cols)), b.add(col, i64(j * qs.vw))))
                _store(b, sums, mm, at)

            def ahead(step):        # U's bytes PREFETCH_AHEAD on (the next blocks' at the end)
                at = b.gep(b.bitcast(a_block, I8.as_pointer()), [b.add(b.mul(step, i64(4 * g.mr)), i64(PREFETCH_AHEAD))])
                prefetch(b, at, False)
            emit_tile(b, qs, g.pairs, [0], a_block, b.gep(v_xi, [col]), g.v_stride, store,
                      name="qwt", rows=g.mr, vectors=vectors, prefetch=ahead)
        if full:
            with for_range(b, full * qs.nr, step=qs.nr, name="pp") as col:
                tile(col, qs.nv)
        if half:
            tile(i64(full * qs.nr), 1)


def _separable(b, left, right, grid: list, vw: int) -> list:
    """left @ grid @ right^T for a grid [i][j] of vectors and constant integer matrices
    (combine): down each column by `left`, then along each row of that by `right`."""
    cols = [combine(b, left, [row[j] for row in grid], vw) for j in range(len(grid[0]))]
    return [combine(b, right, [col[i] for col in cols], vw) for i in range(len(left))]


def _output_sums(b, g: QWinogradGeometry, mm, row, col, bias, mult, exact, y_offset, bounds):
    """The sums of 8 tiles from band column `col` for the filter of M's `row`, requantized
    (requantize_for_narrow): [i][j] the vector of the tiles' pixel (i, j)."""
    vt = _vec(I32, TILE_VECTOR)
    down, across = g.t.down, g.t.across
    nh, nw = down.n, across.n
    mv = [_load(b, mm, b.add(i64(xi * g.m_xi), b.add(b.mul(row, i64(g.cols)), col)), vt)
          for xi in range(g.positions)]
    out = _separable(b, down.a_t, across.a_t, [mv[nw * i:nw * (i + 1)] for i in range(nh)], TILE_VECTOR)
    inverse = ir.Constant(vt, [g.t.inverse] * TILE_VECTOR) if g.t.odd > 1 else None

    def final(o):           # ODD x POW2 x the sum -> POW2 x (the sum + the bias), exactly
        if inverse is not None:
            o = b.mul(o, inverse)
        return requantize_for_narrow(b, b.add(o, bias), mult, exact, y_offset, bounds)
    return [[final(out[i][j]) for j in range(g.tile_w)] for i in range(g.tile_h)]


def _output_lines(b, g: QWinogradGeometry, sums, exact, bounds, y_offset_i32) -> list:
    """The i8 results of 8 tiles, row i of each tile after the other (8 w bytes) for each
    of the h rows: qgemm.narrow of four vectors, interleaved by 4 (tiles 4 wide: one row's
    four pixels; 2 wide: two rows' two pixels, then dealt into the two rows)."""
    def narrowed(vectors):
        if exact:
            return narrow(b, vectors, bounds, y_offset_i32, interleave=4)
        return narrow(b, vectors, interleave=4)
    if g.tile_w == 4:
        return [narrowed(sums[i]) for i in range(g.tile_h)]
    lines = []
    for top in range(0, g.tile_h, 2):
        q = narrowed([sums[top][0], sums[top][1], sums[top + 1][0], sums[top + 1][1]])
        lines += [b.shuffle_vector(q, ir.Constant(q.type, ir.Undefined), ir.Constant(
            _vec(I32, 16), [4 * k + 2 * i + j for k in range(TILE_VECTOR) for j in range(2)])) for i in range(2)]
    return lines


def _output_transform(b, g: QWinogradGeometry, mm, zs, y, n, first_row, tile_rows: int, filters,
                      bias, mult, exact, y_offset, y_offset_i32, bounds) -> None:
    """The output pixels of the band's tiles for `filters` (lo, hi: M's rows from 0 on),
    requantized into y: rows of 8 tiles straight into the output (rows_direct), else
    through the staging block zs (row i of band tile t at w (cols i + t)), tile by tile."""
    h, m = g.tile_h, g.tile_w
    tiles = tile_rows * g.tw
    with for_range(b, filters[1], start=filters[0], name="of") as f:
        row = b.sub(f, filters[0])
        bias_f = splat(b, b.load(b.gep(bias, [f])), TILE_VECTOR)
        mf = b.load(b.gep(mult, [f]))
        plane = b.mul(b.add(b.mul(n, i64(g.m)), f), i64(g.oh * g.ow))

        def lines(col):
            sums = _output_sums(b, g, mm, row, col, bias_f, mf, exact, y_offset, bounds)
            return _output_lines(b, g, sums, exact, bounds, y_offset_i32)
        if g.rows_direct:
            with for_range(b, tile_rows, name="ofr") as r:
                oy = b.mul(b.add(first_row, r), i64(h))
                for t0 in g.starts():
                    for i, line in enumerate(lines(b.add(b.mul(r, i64(g.tw)), i64(t0)))):
                        at = b.add(plane, b.add(b.mul(b.add(oy, i64(i)), i64(g.ow)), i64(m * t0)))
                        if i and g.oh % h:
                            with b.if_then(b.icmp_signed("<", b.add(oy, i64(i)), i64(g.oh))):
                                _store(b, line, y, at)
                        else:
                            _store(b, line, y, at)
            return
        with for_range(b, _ceil(tiles, TILE_VECTOR) * TILE_VECTOR, step=TILE_VECTOR, name="ofz") as col:
            for i, line in enumerate(lines(col)):
                _store(b, line, zs, b.add(i64(i * m * g.cols), b.mul(col, i64(m))))
        wide = ir.IntType(8 * m)                 # a tile's row
        with for_range(b, tiles, name="oft") as t:
            tr = b.add(first_row, b.udiv(t, i64(g.tw)))
            tc = b.urem(t, i64(g.tw))
            for i in range(h):
                oy = b.add(b.mul(tr, i64(h)), i64(i))
                src = b.add(i64(i * m * g.cols), b.mul(t, i64(m)))
                dst = b.add(plane, b.add(b.mul(oy, i64(g.ow)), b.mul(tc, i64(m))))

                def whole_row():
                    _store(b, _load(b, zs, src, wide), y, dst)

                def ragged_row():                # the last tile of a row past the image
                    for j in range(m):
                        with b.if_then(b.icmp_signed("<", b.add(b.mul(tc, i64(m)), i64(j)), i64(g.ow))):
                            b.store(b.load(b.gep(zs, [b.add(src, i64(j))])), b.gep(y, [b.add(dst, i64(j))]))

                def tile_row():
                    if g.ow % m == 0:
                        whole_row()
                        return
                    with b.if_else(b.icmp_signed("<=", b.mul(b.add(tc, i64(1)), i64(m)), i64(g.ow))) as (then, otherwise):
                        with then:
                            whole_row()
                        with otherwise:
                            ragged_row()
                if i and g.oh % h:
                    with b.if_then(b.icmp_signed("<", oy, i64(g.oh))):
                        tile_row()
                else:
                    tile_row()


def emit(k, exact: bool, m=2) -> None:
    b, node = k.b, k.node
    g = QWinogradGeometry(node, k.split.parts, m)
    (y, _), (x, _), (packed, _) = k.outs[0], k.ins[0], k.ins[1]
    consts = PackedConstants(b, packed, g.a_bytes, g.mpad)      # its corrections: POW2 x the bias
    a, bias, mult, x_offset = consts.weights, consts.corr, consts.mult, consts.tail
    y_offset, y_offset_i32 = consts.y_offset, consts.y_offset_i32
    bounds = saturation(node)
    scratch = b.bitcast(k.scratch, I8.as_pointer())
    if k.phased:
        xp = b.bitcast(k.shared_scratch, I32.as_pointer())
        own = scratch
    else:
        xp = b.bitcast(scratch, I32.as_pointer())
        own = b.gep(scratch, [i64(g.xp_bytes)])
    shared_v = k.phased and g.split_filters      # V transformed once, in the first round
    v = b.bitcast(b.gep(b.bitcast(k.shared_scratch, I8.as_pointer()), [i64(g.xp_bytes)]) if shared_v else own,
                  I32.as_pointer())
    mm = b.bitcast(b.gep(own, [i64(g.v_bytes)]), I32.as_pointer())
    zs = b.gep(own, [i64(g.v_bytes + g.m_bytes)])
    if k.phased and k.phase == 0:               # this task's share of the padded input
        pairs = k.split.range(b, g.pairs)
        build_padded_input(b, g, x, i64(0), xp, x_offset, *pairs, own)
        if shared_v:                            # ... and of V (one band: the whole image)
            _input_transform(b, g, xp, v, i64(0), g.th, pairs)
        return
    if g.split_filters:                         # every band (one), this task's filters
        (lo, hi), blocks = (i64(0), i64(g.bands)), k.split.range(b, g.blocks)
    else:                                       # this task's bands, every filter
        (lo, hi), blocks = k.split.range(b, g.bands), (i64(0), i64(g.blocks))
    f_hi = b.mul(blocks[1], i64(g.mr))
    filters = (b.mul(blocks[0], i64(g.mr)), b.select(b.icmp_signed("<", f_hi, i64(g.m)), f_hi, i64(g.m)))
    own_rows = None
    if g.own_rows:                              # the rows of Xp this task's bands read
        end = clamp(b, b.mul(hi, i64(g.rows)), i64(0), i64(g.th))
        first = b.mul(b.mul(lo, i64(g.rows)), i64(g.tile_h))
        own_rows = (first, clamp(b, b.add(b.mul(end, i64(g.tile_h)), i64(2)), first, i64(g.hp)))
    with for_range(b, g.batch, name="qwn") as n:
        if not k.phased:
            build_padded_input(b, g, x, n, xp, x_offset, i64(0), i64(g.pairs), own, own_rows)

        def band(j, tile_rows: int):
            first_row = b.mul(j, i64(g.rows))
            if not shared_v:
                _input_transform(b, g, xp, v, first_row, tile_rows)
            _products(b, g, a, v, mm, tile_rows * g.tw, blocks)
            _output_transform(b, g, mm, zs, y, n, first_row, tile_rows, filters, bias, mult, exact,
                              y_offset, y_offset_i32, bounds)

        last = g.bands - 1
        last_rows = g.th - last * g.rows
        if last_rows == g.rows:
            with for_range(b, hi, start=lo, name="qwb") as j:
                band(j, g.rows)
        else:
            whole_hi = b.select(b.icmp_signed("<", hi, i64(last)), hi, i64(last))
            with for_range(b, whole_hi, start=lo, name="qwb") as j:
                band(j, g.rows)
            with b.if_then(b.and_(b.icmp_signed("<=", lo, i64(last)), b.icmp_signed("<", i64(last), hi))):
                band(i64(last), last_rows)
