"""int8 products with the output features in the vector lanes: the product of qgemm.py
turned around, for shapes where lanes over pixels (or rows) would idle.

The general product (qlinalg.py) puts output pixels (a matrix product's rows) in the lanes
and broadcasts weights, in tiles of 32 (VNNI) or 16 (AVX2) pixels of a plane whose rows
carry the padding columns: a 7x7 image fills 49 of 64 lanes, a 14x14 one under a 3x3 kernel
196 of 224, and a matrix product of one row 1 of 32.  Here the weights are the vectors and
each output pixel (or row) is broadcast from its own place in the plane:

    Y[R, M] = X[R, K * taps] @ W[K * taps, M]    R: output pixels (or rows), M: features

W is packed at compile time tile by tile, [Mpad / NR][K / G][taps][NR] elements of G values
of k (s8 for VNNI, i16 for AVX2): a tile's weights are one contiguous run, which the
prefetchers stream.  Laid out [K / G][taps][Mpad], a tile read 256 bytes and stepped
Mpad x 4 bytes to the next k: MobileNetV2's int8 classifier (1280 -> 1000, one row) stepped
4 KB, a page, per read, and took 0.168 ms, 7.6 GB/s of weights.  A tile is `mr` rows by NV
vectors of features, the last block of rows perhaps fewer (a tile of its own), `mr` and
that last block chosen to compute few rows past the last in few blocks (ROW_BLOCK_COST):
49 pixels as 12 blocks of 4 and one of 1 on AVX2, with VNNI as 13, 13, 13 and 10 for a
1x1 convolution (LANES_ROWS) and 10, 10, 10, 10 and 9 for a 3x3.  With VNNI the
broadcast activations are the u8 operand of `vpdpbusd` and the weights the s8 one; the +128
of the activations folds into a per-feature correction as in qgemm.pack_epilogue.  The packed
constant: weights, then per feature the i32 correction and the f32 multiplier, then the
result's offset (f32) and the plane's padding element (i32).  Tasks split the features,
or the blocks of rows where the features' tiles would not share out evenly or where the
plane is large against the weights (qlinalg.splits_pixels); every sum is computed whole by
one task (identical for any thread count).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....errors import UnsupportedError
from ....reference.primitives import saturation
from ..llvmutil import F32, I8, I32, for_range, i64, target_has
from ..parallel import for_claimed
from ..vectors import join_vectors
from ..qgemm import (PackedConstants, QShape, Residual, emit_tile, narrowed_rows, pack_epilogue, pack_offsets,
                     products_in_range, requantize_for_narrow, weights_prefetch)

_ceil = lambda a, b: -(-a // b)     # noqa: E731
# A tile's rows at the fewest (when the target's tile has more): AVX2's 4-row tile took 49
# pixels (a 7x7 image) in tiles of one row, every weight vector loaded for one broadcast.
# A product of one row runs faster in tiles of 3 too, two of them repeats (ResNet-50's int8
# classifier at x86-64-v3: 0.215 -> 0.176 Mcycles; MobileNetV2's 0.166 -> 0.143).
MIN_TILE_ROWS = 3
# What a block of rows costs beyond its rows, in rows: each block reads the tile's weights
# again (NR features x K, 32 KB for 2048 channels: from L2 once past L1).  Rows are dealt in
# the blocks that minimize blocks x (rows a block + this): 49 pixels in 13 blocks of 4 on
# AVX2, not 17 of 3 (3% fewer rows, but 31% more passes over the weights).  One thread,
# Zen 3, x86-64-v3, us: 1x1 2048 -> 512 @7 713 -> 592 (onnxruntime 640), 960 -> 320 @7
# 204 -> 178 (176), 960 -> 160 @7 101 -> 89; 576 -> 160 @7 unchanged (52).  VNNI's 7-row
# blocks for 49 or 196 pixels and 5-row ones for one row stay as they were.  A last block
# of the rows left in place of one repeating rows past the end (49 pixels: 12 x 4 + 1, not
# 13 x 4), Zen 3, x86-64-v3, one thread, us: 2048 -> 512 @7 585-591 -> 568-569 (onnxruntime
# in ResNet-50: 568), 512 -> 2048 @7 569 -> 544, 1024 -> 2048 at stride 2 from 14x14
# 1188 -> 1163, 3x3 512 -> 512 at stride 2 from 14x14 1282 -> 1217.  (Computing 2 or 3 rows
# in that last tile, repeating the last, measured the same as 1.)
ROW_BLOCK_COST = 1
# The most rows a tile broadcasts, (with one tap, with several), where it is not the target's
# QShape.mr: VNNI's one-tap products (1x1 convolutions, matrix products) in 14 rows of 2
# vectors of features, 28 of the 32 zmm: every block of rows reads the tile's weights again,
# from L2 or past it (ResNet-50's 2048 -> 512 at 7 x 7, 1 MB, read 4 times for its 49 pixels
# in place of 7).  Emerald Rapids, one thread, alternating, sums of per-step minima:
# ResNet-50 14.17 -> 13.92 ms (its 1024 -> 256 at 14 x 14 933 -> 825 us over five, 2048 ->
# 512 at 7 x 7 443 -> 389 over two, 1024 -> 2048 at stride 2 420 -> 372, 1024 -> 512 at
# 14 x 14 358 -> 314), MobileNetV2 2.00 -> 1.98; two threads unchanged (7.87 / 7.89).  With
# several taps, 10 rows (49 pixels in 4 blocks of 10 and one of 9, not 7 of 7): ResNet-18
# 5.59 -> 5.54 and 5.59 -> 5.53 ms, A / B in either order (its 3x3 512s at 7 x 7 1005 -> 976
# us), ResNet-50 14.00 -> 13.81; 12 rows ran the 3x3 512s slower (976 -> 1058), 14 spilled.
LANES_ROWS = {"vnni": (14, 10)}


def most_rows(geo, qs: QShape) -> int:
    """The most rows in a block of the product's tiles (LANES_ROWS)."""
    rows = LANES_ROWS.get(qs.kind)
    return qs.mr if rows is None else rows[0] if len(geo.taps) == 1 else rows[1]


def _row_blockings(rows: int, most: int, least: int):
    """(rows a block, rows of the last block) the tile may take: every block of `mr` rows
    (the last repeating rows past the end), or whole blocks and a last one of the rows left."""
    for mr in range(most, max(MIN_TILE_ROWS, least) - 1, -1):
        yield mr, mr
        if rows > mr and rows % mr:
            yield mr, rows % mr


def _blocking_cost(rows: int, mr: int, tail: int) -> int:
    """Rows computed plus ROW_BLOCK_COST a block, for blocks of `mr` rows and a last of `tail`
    (Lanes breaks ties for blocks all of one size: one tile's code in place of two)."""
    whole = rows // mr if tail != mr else _ceil(rows, mr) - 1
    return whole * (mr + ROW_BLOCK_COST) + tail + ROW_BLOCK_COST


class Lanes:
    """The lanes-over-features layout of a product whose qlinalg.Geometry is `geo`."""

    def __init__(self, geo, qs: QShape):
        self.geo, self.qs = geo, qs
        self.rows = geo.oh * geo.ow if geo.conv else geo.rows
        # Of blockings that cost the same, the one whose last block has the most rows: that
        # tile's sums are the more independent chains to hide the products' latency behind.
        # VNNI's 49 pixels (a 7x7 image) in blocks of 13, 13, 13 and 10, not 14, 14, 14 and
        # 7: Emerald Rapids, alternating in one process, per-step minima of 200 runs, the 1x1s
        # of ResNet-50 at 7x7 (the stride-2 2048 from 1024, three 2048 from 512, two 512 from
        # 2048) -9.3, -2.8, -2.0, -2.8, -3.3, -5.5 us at one thread, -10.1, -4.1, -3.4 at two.
        self.mr, self.tail_rows = min(_row_blockings(self.rows, most_rows(geo, qs), least=qs.mr - 3),
                                      key=lambda p: (_blocking_cost(self.rows, *p), p[1] != p[0], -p[1]))
        self.row_blocks = _ceil(self.rows, self.mr)
        # Whether a block's rows lie one after another in the plane, from its first: rows are
        # the plane's (a matrix product's, or a convolution's whose plane rows carry no
        # padding columns), and no block repeats rows past the last.  Then the tile addresses
        # its broadcasts from one register: 14 row pointers of their own spilled 4 of them to
        # the stack, reloaded at every step of the sums' loop (ResNet-50's 1x1s at 14 x 14).
        self.rows_in_a_run = ((not geo.conv or geo.wq == geo.ow)
                              and (self.tail_rows != self.mr or self.rows % self.mr == 0))
        self.tiles = _ceil(geo.m, qs.nr)
        self.npad = self.tiles * qs.nr
        self.taps = len(geo.taps)
        self.b_bytes = geo.groups * self.taps * self.npad * 4
        # The result block's rows one cache line longer than the features: y takes its columns,
        # and rows a power of two apart would all fall into the same few sets of the L1 cache.
        self.ys_stride = self.npad + 64
        self.scratch = geo.plane_bytes + _ceil(self.row_blocks * self.mr * self.ys_stride, 64) * 64

    def useful(self) -> float:
        """The share of the rows and features computed that are real: the last block of rows
        computes only its own (tail_rows)."""
        computed = (self.row_blocks - 1) * self.mr + self.tail_rows
        return self.rows / computed * self.geo.m / self.npad


def pixels_useful(geo) -> float:
    """The fraction of the general product's lanes and rows that compute real outputs."""
    real = geo.oh * geo.ow if geo.conv else geo.rows
    return real / geo.qpad * geo.m / geo.mpad


# Products of few rows always; with the u8 x s8 products (VNNI's, and `ubsw`'s for 7-bit
# weights without it), also those where the lanes would idle less and each output has at
# least this many products to sum (the result block's columns are copied into y one byte at
# a time, which costs about what 256 products do).  `madd16` (AVX2's 16-bit products, for
# 8-bit weights) broadcasting pixels measured slower than broadcasting weights.  `ubsw`
# at x86-64-v3 on Zen 4 (one thread, single int8 layers, fastest of 80 alternating runs,
# Mcycles, pixels -> features in the lanes): 3x3 256 @14 3.55 -> 3.12, 512 @7 4.19 -> 3.65,
# 128 -> 256 at stride 2 from 28x28 2.15 -> 1.83, 1x1 1024 -> 256 @14 1.68 -> 1.51,
# 2048 -> 512 @7 2.02 -> 1.88; 64 @56 (left in pixels) 2.78 / 2.83; 64 -> 128 at stride 2
# from 56x56 (4% of the lanes saved) 1.63 -> 1.75 in ResNet-18, hence AVX2's larger margin.
# In the model (kernel sums, fastest of 30 alternating runs): int8 ResNet-18 48.9 -> 44.9
# Mcycles at x86-64-v3 and 47.7 -> 43.3 at x86-64-v4 (AVX-512BW without VNNI), ResNet-50
# 111.3 -> 106.7 at x86-64-v3.
# The kinds of product that may, and by how much less than pixels in the lanes features in
# the lanes must waste (`useful` over `pixels_useful`):
GAIN = {"vnni": 1.04, "ubsw-512": 1.04, "ubsw": 1.05}
MIN_PRODUCTS_PER_OUTPUT = 512
# From this many products an output, any lanes saved will do: ResNet-50's 128 -> 128 3x3 at
# stride 2 from 56x56 (1152 products an output; the pixels' plane rows of 29 for 28 outputs,
# 816 lanes for 784) 1314-1333 -> 1274-1280 us; ResNet-18's 64 -> 128 (576) the same either
# way, 639-640 / 641-642 (Zen 3, x86-64-v3, one thread, alone).
GAIN_FREE_PRODUCTS = 1024
# ... and only images of up to 1024 pixels (32x32): on 56x56, 64->64 3x3, broadcasting
# pixels measured 15% slower than the 4% of lanes it saves; on 28x28, 128->128 3x3 (9% of
# the lanes idle: 2 of 30 columns a row, 800 -> 832 lanes), 0.566 -> 0.527 ms (onnxruntime
# 0.511), and at stride 2 from 56x56 0.578 -> 0.569.
MAX_ROWS = 1024


def in_lanes(geo, qs: QShape) -> bool:
    """Whether the product computes with its features in the lanes (this module): not a
    grouped one, whose groups' filters would share the lanes but not their inputs."""
    if geo.ng > 1 or geo.panel_major:       # (a plane of this module's own layout)
        return False
    if qs.kind == "amx":                    # tiles' idle columns cost little (amx.py)
        return False
    lanes = Lanes(geo, qs)
    if lanes.rows <= qs.mr:
        return True
    products = geo.c * len(geo.taps)
    if qs.kind not in GAIN or products < MIN_PRODUCTS_PER_OUTPUT or lanes.rows > MAX_ROWS:
        return False
    gain = GAIN[qs.kind] if products < GAIN_FREE_PRODUCTS else 1.0
    return lanes.useful() > gain * pixels_useful(geo)


def pack(node, geo, w3, ws, b, qs: QShape, pad_element: int) -> tuple[np.ndarray, bool]:
    """The packed constant of the module docstring, as bytes; w3: weights [M, C, taps]; and
    whether every feature's requantized sums stay within qgemm.IN_RANGE (as qlinalg._pack)."""
    lanes = Lanes(geo, qs)
    m, c, taps = w3.shape
    g = qs.group
    padded = np.zeros((geo.groups * g, taps, lanes.npad), np.int16 if qs.bits == 16 else np.int8)
    padded[:c, :, :m] = w3.transpose(1, 2, 0)
    # [KG, G, taps, tiles, NR] -> [tiles, KG, taps, NR, G]: a tile's weights in one run, the G
    # values of k of one feature in one element.
    weights = np.ascontiguousarray(padded.reshape(geo.groups, g, taps, lanes.tiles, qs.nr)
                                   .transpose(3, 0, 2, 4, 1))
    corr, mult = pack_epilogue(w3, ws, b, node.inputs[0].type.quant, node.scale, qs)
    corr_p, mult_p = np.zeros(lanes.npad, np.int32), np.zeros(lanes.npad, np.float32)
    corr_p[:m], mult_p[:m] = corr[:m], mult[:m]
    data = np.concatenate([weights.view(np.int8).ravel(), corr_p.view(np.int8), mult_p.view(np.int8),
                           *pack_offsets(node, pad_element)])
    return data, products_in_range(w3, corr[:m], mult[:m], node)


def plane_and_result(b, k, geo):
    """The plane (i32 elements) and the result block (bytes) in the kernel's scratch: the
    plane first in its own, or in the scratch a phased kernel's tasks share (q_phases)."""
    scratch = b.bitcast(k.scratch, I8.as_pointer())
    if k.phased:
        return b.bitcast(k.shared_scratch, I32.as_pointer()), scratch
    return b.bitcast(scratch, I32.as_pointer()), b.gep(scratch, [i64(geo.plane_bytes)])


def emit(b, k, geo, qs: QShape, build_plane, exact: bool, pixels: bool, own_plane=None):
    """Per image: the plane of x, the tiles of this task's features over every row block,
    then their columns of the result block [rows][Mpad + 64] copied into y.  `exact`: the
    requantized sums stay in range (pack), and requantize in i32 (qgemm.narrow).  `pixels`:
    the tasks share out the blocks of rows (qlinalg.splits_pixels), else the features' tiles.
    `own_plane(b, n, plane, pad, first, last)`: when the task shares out rows and builds
    the plane at their positions first..last only (qlinalg.owns_pixels), or None."""
    lanes = Lanes(geo, qs)
    mr, npad, stride = lanes.mr, lanes.npad, lanes.ys_stride
    (y, _), (x, _), (packed, _) = k.outs[0], k.ins[0], k.ins[1]
    consts = PackedConstants(b, packed, lanes.b_bytes, npad)
    weights, corr, mult, pad = consts.weights, consts.corr, consts.mult, consts.tail
    y_offset, y_offset_i32 = consts.y_offset, consts.y_offset_i32
    bounds = saturation(k.node)
    plane, ys = plane_and_result(b, k, geo)
    if k.phased and k.phase == 0:           # this task's share of the shared plane
        build_plane(b, geo, x, i64(0), plane, pad, *k.split.range(b, geo.plane_groups))
        return
    (lo, hi), (rb_lo, rb_hi) = k.split.blocks_or_panels(b, lanes.tiles, lanes.row_blocks, pixels,
                                                         ragged=(False, lanes.tail_rows < lanes.mr))

    def position(r):
        """Row r's place in the plane; rows past the last repeat it (computed, not kept)."""
        r = b.select(b.icmp_signed("<", r, i64(lanes.rows)), r, i64(lanes.rows - 1))
        return b.add(b.mul(b.sdiv(r, i64(geo.ow)), i64(geo.wq)), b.srem(r, i64(geo.ow))) if geo.conv else r

    def tile_rows(rows, tile, rb):
        """The tile of features `tile` over block of rows rb (rows r0..r0 + rows), into the
        result block."""
        r0 = b.mul(rb, i64(mr))
        n0 = b.mul(tile, i64(qs.nr))
        if lanes.rows_in_a_run:
            first = b.gep(plane, [r0])
            starts = [b.gep(first, [i64(i)]) for i in range(rows)]
        else:
            starts = [b.gep(plane, [position(b.add(r0, i64(i)))]) for i in range(rows)]

        def a_at(g, t, i):
            return b.gep(starts[i], [b.add(b.mul(g, i64(geo.group_stride)), i64(geo.taps[t]))])

        def features(j, at, t):     # the i32 / f32 vector of features n0 + j * VW of `at`
            v = b.load(b.bitcast(b.gep(at, [b.add(n0, i64(j * qs.vw))]), ir.VectorType(t, qs.vw).as_pointer()))
            v.align = 4
            return v

        sums = {}

        def store(i, j, vector):    # requantized, narrowed and stored by pairs of rows
            joined = None
            if residual is not None:    # its values, where the result block will hold these
                at = _result_at(b, ys, stride, b.add(r0, i64(i)), b.add(n0, i64(j * qs.vw)))
                values = b.load(b.bitcast(at, ir.VectorType(I8, qs.vw).as_pointer()))
                values.align = 1
                joined = (residual, residual.values(b, values))
            sums.setdefault(i, []).append(requantize_for_narrow(
                b, vector, features(j, mult, F32), exact, y_offset, bounds, joined))
        tile_weights = b.gep(weights, [b.mul(tile, i64(geo.groups * lanes.taps * qs.nr))])
        # The next tile's weights, over this tile's blocks of rows (weights_prefetch).
        step = lanes.taps * qs.nr
        ahead = weights_prefetch(b, qs, 4 * step, tile_weights, b.gep(tile_weights, [i64(geo.groups * step)]),
                                 b.sub(rb, rb_lo), geo.groups, lanes.row_blocks)
        emit_tile(b, qs, geo.groups, [t * qs.nr for t in range(lanes.taps)], None,
                  tile_weights, step, store, name="lq", rows=rows,
                  broadcast_u8=True, a_at=a_at, init=lambda i, j: features(j, corr, I32), prefetch=ahead)
        for i, run in narrowed_rows(b, qs, [sums[i] for i in range(rows)], exact, bounds, y_offset_i32):
            at = _result_at(b, ys, stride, b.add(r0, i64(i)), n0)
            st = b.store(run, b.bitcast(at, run.type.as_pointer()))
            st.align = 1

    def feature_range(lo, hi):
        """The features (lo, hi) of tiles lo..hi that are the result's."""
        m_hi = b.mul(hi, i64(qs.nr))
        return b.mul(lo, i64(qs.nr)), b.select(b.icmp_signed("<", m_hi, i64(geo.m)), m_hi, i64(geo.m))

    def row_range():
        """The rows (lo, hi) of this task's blocks that are the result's."""
        r_hi = b.mul(rb_hi, i64(mr))
        return b.mul(rb_lo, i64(mr)), b.select(b.icmp_signed("<", r_hi, i64(lanes.rows)), r_hi, i64(lanes.rows))

    residual = Residual.of(k)
    if residual is not None and not geo.conv:
        raise UnsupportedError(f"{k.node.name}: only a convolution takes a residual")
    with for_range(b, geo.batch, name="ln") as n:
        if own_plane is not None:           # the plane of this task's rows
            own_plane(b, n, plane, pad, position(b.mul(rb_lo, i64(mr))), position(b.sub(b.mul(rb_hi, i64(mr)), i64(1))))
        elif not k.phased:
            build_plane(b, geo, x, n, plane, pad)
        def tiles(lo, hi):
            """The features' tiles lo..hi over this task's blocks of rows, then copied into y
            (with a residual, its values copied into the result block first, where each
            tile's store reads those of its results and then writes them)."""
            if residual is not None:
                read_residual(b, geo, lanes, residual.ptr, ys, n, *feature_range(lo, hi), *row_range())
            with for_range(b, hi, start=lo, name="lt") as tile, for_range(b, rb_hi, start=rb_lo, name="lr") as rb:
                if lanes.tail_rows == mr:
                    tile_rows(mr, tile, rb)
                else:                           # the last block has the rows left
                    with b.if_else(b.icmp_signed("<", rb, i64(lanes.row_blocks - 1))) as (whole, last):
                        with whole:
                            tile_rows(mr, tile, rb)
                        with last:
                            tile_rows(lanes.tail_rows, tile, rb)
            m_lo, m_hi = feature_range(lo, hi)
            r_lo, r_hi = row_range()
            if geo.conv:        # y[n, m, pixel] = ys[pixel][m]
                write_conv_out(b, geo, lanes, ys, y, n, m_lo, m_hi, r_lo, r_hi)
            else:               # y[row, m] = ys[row][m]
                with for_range(b, r_hi, start=r_lo, name="lp") as r, for_range(b, m_hi, start=m_lo, name="lm") as m:
                    v = b.load(_result_at(b, ys, stride, r, m))
                    b.store(v, b.gep(y, [b.add(b.mul(r, i64(geo.m)), m)]))

        claims = k.claim_words()          # tasks claiming tiles as they go (qlinalg.claims_work)
        if claims is not None:
            for_claimed(b, claims, lanes.tiles, k.split, tiles)
        else:
            tiles(lo, hi)


# Pixels a step of the transposing copy out of the result block takes (write_conv_out).
OUT_PIXELS = 16


def _blocks_by_sixteen(b, rows: int, width: int, m_lo, m_hi, r_lo, r_hi, block, name: str):
    """block(m, p0) for the blocks of `width` features (from m) by OUT_PIXELS pixels (from
    p0) of features m_lo.. and pixels r_lo..r_hi that the transposing copies take whole:
    every multiple of `width` features, where there are OUT_PIXELS pixels or more, the last
    block of pixels overlapping the one before; the features from which the rest goes
    another way (returned)."""
    if rows < OUT_PIXELS:
        return m_lo
    count = b.sub(r_hi, r_lo)
    m_mid = b.select(b.icmp_signed(">=", count, i64(OUT_PIXELS)),
                     b.add(m_lo, b.mul(b.sdiv(b.sub(m_hi, m_lo), i64(width)), i64(width))), m_lo)
    blocks = b.sdiv(b.add(count, i64(OUT_PIXELS - 1)), i64(OUT_PIXELS))
    last = b.sub(r_hi, i64(OUT_PIXELS))
    with for_range(b, m_mid, start=m_lo, step=width, name=f"{name}m{width}") as m, \
            for_range(b, blocks, name=f"{name}pb{width}") as pb:
        p0 = b.add(r_lo, b.mul(pb, i64(OUT_PIXELS)))
        block(m, b.select(b.icmp_signed("<", p0, last), p0, last))
    return m_mid


def _transposes_by_sixteen(b) -> bool:
    """Whether the transposing copies take blocks of 16 features by 16 pixels (_transpose_16:
    two-source byte shuffles, one instruction each with AVX-512 VBMI) before their blocks of
    4 by 16 (sixteen 32-bit loads or stores and one byte shuffle a block).  Emerald Rapids,
    one thread, alternating in one process, sums of per-step minima of ResNet-50 int8: with
    no copies at all (wrong results) 12.89 ms against 13.20; blocks of 16 x 16 13.25 ->
    13.07 ms (its three 7x7 1x1s with residuals -19 us each), at two threads 7.10 -> 7.04."""
    return target_has(b.module, "avx512vbmi")


def _indices(values) -> ir.Constant:
    values = list(values)
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def _transpose_16(b, runs: list) -> list:
    """16 runs of 16 bytes (run i, byte j) -> the 16 runs of their transpose (run j, byte i):
    the runs four to a 64-byte vector (z[k] byte 16 * t + j: run 4k + t, byte j), then two
    rounds of four two-source byte shuffles (vpermt2b): the first gathers eight rows by eight
    columns (top[h], rows 0..7 from z[0], z[1], and bottom[h], rows 8..15 from z[2], z[3],
    byte 8 * c + i: row i of column 8h + c), the second four columns of all sixteen rows
    (o byte 16 * t + i: row i of column 4j + t).  (vectors.transpose_block on the sixteen
    runs themselves would take 64 shuffles of 16 bytes, here 8 of 64 and 12 joins.)"""
    z = [join_vectors(b, runs[4 * k:4 * k + 4]) for k in range(4)]

    def eight_by_eight(first, second, h):   # rows 0..7 of the pair, columns 8h..8h + 7
        return b.shuffle_vector(first, second, _indices(
            64 * (i // 4) + 16 * (i % 4) + 8 * h + c for c in range(8) for i in range(8)))
    top = [eight_by_eight(z[0], z[1], h) for h in (0, 1)]
    bottom = [eight_by_eight(z[2], z[3], h) for h in (0, 1)]
    out = []
    for j in range(4):
        h, first = divmod(j, 2)
        o = b.shuffle_vector(top[h], bottom[h], _indices(
            (0 if i < 8 else 64) + 8 * (4 * first + t) + i % 8 for t in range(4) for i in range(16)))
        out += [b.shuffle_vector(o, ir.Constant(o.type, ir.Undefined), _indices(range(16 * t, 16 * t + 16)))
                for t in range(4)]
    return out


def _load_run(b, at):
    run = b.load(b.bitcast(at, ir.VectorType(I8, OUT_PIXELS).as_pointer()))
    run.align = 1
    return run


def _store_run(b, run, at):
    st = b.store(run, b.bitcast(at, run.type.as_pointer()))
    st.align = 1


def _result_at(b, ys, stride: int, p, m):
    """Feature m of pixel p in the result block ys, rows `stride` bytes apart."""
    return b.gep(ys, [b.add(b.mul(p, i64(stride)), m)])


def _image_at(b, t, geo, rows: int, n, m, p):
    """Feature m of pixel p of image n in t (N, M, pixels; i8): y, or a residual."""
    return b.gep(t, [b.add(b.mul(b.add(b.mul(n, i64(geo.m)), m), i64(rows)), p)])


def read_residual(b, geo, lanes, r, ys, n, m_lo, m_hi, r_lo, r_hi):
    """Features m_lo..m_hi of pixels r_lo..r_hi of image n of a residual r (N, M, pixels; i8)
    into the result block [rows][Mpad + 64], transposed: write_conv_out's copy the other
    way, blocks of 16 features by 16 pixels where the target transposes them
    (_transposes_by_sixteen), then of 4 features (four runs of 16 bytes, one byte shuffle,
    sixteen 32-bit stores), the rest a byte at a time."""
    rows, stride = lanes.rows, lanes.ys_stride
    at_r = lambda m, p: _image_at(b, r, geo, rows, n, m, p)  # noqa: E731
    bytes64 = ir.VectorType(I8, 4 * OUT_PIXELS)
    # Byte 16 * f + p of the runs (feature f, pixel p) to byte 4 * p + f.
    order = _indices(16 * f + p for p in range(OUT_PIXELS) for f in range(4))

    def block16(m, p0):
        runs = _transpose_16(b, [_load_run(b, at_r(b.add(m, i64(f)), p0)) for f in range(16)])
        for p in range(OUT_PIXELS):
            _store_run(b, runs[p], _result_at(b, ys, stride, b.add(p0, i64(p)), m))

    def block(m, p0):
        joined = join_vectors(b, [_load_run(b, at_r(b.add(m, i64(f)), p0)) for f in range(4)])
        words = b.bitcast(b.shuffle_vector(joined, ir.Constant(bytes64, ir.Undefined), order),
                          ir.VectorType(I32, OUT_PIXELS))
        for p in range(OUT_PIXELS):
            at = _result_at(b, ys, stride, b.add(p0, i64(p)), m)
            st = b.store(b.extract_element(words, i64(p)), b.bitcast(at, I32.as_pointer()))
            st.align = 1
    if _transposes_by_sixteen(b):
        m_lo = _blocks_by_sixteen(b, rows, 16, m_lo, m_hi, r_lo, r_hi, block16, "r")
    m_mid = _blocks_by_sixteen(b, rows, 4, m_lo, m_hi, r_lo, r_hi, block, "r")
    with for_range(b, m_hi, start=m_mid, name="rm") as m, for_range(b, r_hi, start=r_lo, name="rp") as p:
        b.store(b.load(at_r(m, p)), _result_at(b, ys, stride, p, m))


def write_conv_out(b, geo, lanes, ys, y, n, m_lo, m_hi, r_lo, r_hi):
    """Features m_lo..m_hi of pixels r_lo..r_hi of the result block [rows][Mpad + 64] into
    image n of y (N, M, pixels), transposed: blocks of 16 features by 16 pixels where the
    target transposes them (_transposes_by_sixteen: sixteen runs of 16 bytes each way), then
    of 4 features, sixteen 32-bit loads and one byte shuffle into four runs of 16 bytes (the
    last block of a run overlapping the one before; the features past the last multiple of
    4, and all of them when the task has fewer than 16 pixels, a byte at a time).  A byte at
    a time throughout, the copy took 85 of 585 us of ResNet-50's 512 -> 1024 1x1 at 14x14
    (onnxruntime: 470)."""
    rows, stride = lanes.rows, lanes.ys_stride
    at_y = lambda m, r: _image_at(b, y, geo, rows, n, m, r)  # noqa: E731
    i32v, bytes64 = ir.VectorType(I32, OUT_PIXELS), ir.VectorType(I8, 4 * OUT_PIXELS)
    # Byte 4 * p + f of the loads (pixel p, feature f) to byte 16 * f + p.
    order = _indices(4 * p + f for f in range(4) for p in range(OUT_PIXELS))

    def block16(m, r0):
        runs = _transpose_16(b, [_load_run(b, _result_at(b, ys, stride, b.add(r0, i64(p)), m))
                                 for p in range(OUT_PIXELS)])
        for f in range(16):
            _store_run(b, runs[f], at_y(b.add(m, i64(f)), r0))

    def block(m, r0):
        v = ir.Constant(i32v, ir.Undefined)
        for p in range(OUT_PIXELS):
            at = _result_at(b, ys, stride, b.add(r0, i64(p)), m)
            word = b.load(b.bitcast(at, I32.as_pointer()))
            word.align = 1
            v = b.insert_element(v, word, i64(p))
        t = b.shuffle_vector(b.bitcast(v, bytes64), ir.Constant(bytes64, ir.Undefined), order)
        for f in range(4):
            run = b.shuffle_vector(t, ir.Constant(bytes64, ir.Undefined),
                                   _indices(range(f * OUT_PIXELS, (f + 1) * OUT_PIXELS)))
            _store_run(b, run, at_y(b.add(m, i64(f)), r0))
    if _transposes_by_sixteen(b):
        m_lo = _blocks_by_sixteen(b, rows, 16, m_lo, m_hi, r_lo, r_hi, block16, "l")
    m_mid = _blocks_by_sixteen(b, rows, 4, m_lo, m_hi, r_lo, r_hi, block, "l")
    with for_range(b, m_hi, start=m_mid, name="lm") as m, for_range(b, r_hi, start=r_lo, name="lp") as r:
        b.store(b.load(_result_at(b, ys, stride, r, m)), at_y(m, r))
