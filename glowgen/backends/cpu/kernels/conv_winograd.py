"""3x3 stride-1 convolutions by Winograd's minimal filtering, F(T x T, 3x3) for T = 2 or 4.

Each T x T block of output pixels (a tile) is computed from the (T + 2) x (T + 2) input
window under it (Lavin and Gray, 2016):

    Y = A^T [ (G g G^T) .* (B^T d B) ] A        g: a 3x3 filter, d: a window

with (T + 2)^2 multiplications per channel pair instead of 9 T^2: 16 instead of 36 for
F(2x2, 3x3), 36 instead of 144 for F(4x4, 3x3).  The filter transform U = G g G^T is done
at compile time (winograd_weights).  Per image, band by band of tile rows:

1. the input rows the band reads are copied into a zero-padded channel-blocked copy X
   (conv_blocked's NCHWc, X[cb][Hp][Wp][VW]), so each window's rows are plain vector loads
   along the channels;
2. the input transform V = B^T d B, VW channels at a time, written as (T + 2)^2 matrices
   V_xi[tile][channel] (xi: a position of the transformed window);
3. one matrix product M_xi[tile][filter] = V_xi @ U_xi per position, with U_xi packed at
   compile time in NR-filter panels (gemm.emit_gemm: the same register tile as every other
   product);
4. the output transform Y = A^T M A, VW filters at a time, into a C^T band of pixels, stored
   back to NCHW through the bias and the fused epilogue by conv_transposed's register
   transposes (conv_blocked.store_band).

A split shares out the bands; where each task computes one band and the tile rows do not
divide evenly among the tasks, it shares out the tiles instead (tile_shares), a task's
first and last tile rows then partial.

The transforms are constant linear combinations (additions, and multiplications by small
constants for F(4x4)) over data that stays in L2.  Rounding differs from a direct
convolution's: the transforms add inputs before multiplying, and F(4x4)'s constants (up to 8
in A, fractions in G) lose a few more bits than F(2x2)'s.  The tests hold both to a float64
convolution and to onnxruntime.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..gemm import GemmShape, emit_gemm
from ..llvmutil import for_range, i64
from ..parallel import shares
from ..vectors import f32_vector, fmuladd, vload, vstore
from .common import clamp
from .conv_blocked import blocked_tile, busiest, fill_blocked, store_band, zero_border
from .conv_planes import aligned_floats
from .integer_forms import combine_integer

# (B^T, G, A^T) of F(T x T, 3x3), by tile size T: interpolation points 0, 1, -1 (and
# infinity) for T = 2; 0, 1, -1, 2, -2 for T = 4.
TRANSFORMS = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                 np.float64)),
}

# Where Winograd applies: at least this many output pixels, by the vector width of the
# product's tile.  Below, the transformed weights (16/9 of the filters') are read for few
# tiles, and once per block of MR tiles: ResNet's 512 -> 512 at 7 x 7 (16 tiles, 16.8 MB of
# them) took 5.30 -> 3.41 Mcycles with AVX-512's 8-tile blocks (Zen 4, 1 thread, in the
# model; 3.0-3.4 -> 1.9-2.0 at 2 threads), and 5.5 -> 6.1 with AVX2's 6-tile ones.
MIN_PIXELS = {16: 7 * 7, 8: 14 * 14}
# F(4x4, 3x3) where its tiles reach at most this far past the output.  ResNet-50's layers in
# the model (Zen 4, 1 thread, fastest of 20-25 alternating runs, Mcycles, AVX-512 /
# x86-64-v3), F(2x2) -> F(4x4): 64 @56 2.83 -> 1.84 / 2.81 -> 2.00, 128 @28 2.89 -> 1.86 /
# 2.91 -> 2.03; 256 @14, in tiles of 4 computing 16 x 16 ((16 / 14)^2 = 1.31), 2.66 ->
# 2.28 / 3.20 -> 3.42: left in tiles of 2.
MAX_TILE_WASTE = 1.15
# V and M of a band (the products' operands and results) kept within about this many bytes
# (at least one tile row: ResNet's 64 -> 64 at 56 x 56 takes one a band, V and M in L2
# between the transforms and the products), unless the transformed weights exceed
# STREAMED_WEIGHTS: then every band reads all of them from L3, and fewer, larger bands (one
# a task) read them fewer times.  With F(2x2), against 512 KB bands and 512 KB of weights:
# 64 @56 2.94 -> 2.76 / 3.14 -> 2.83, 128 @28 2.86 -> 2.56 / 2.98 -> 2.92; 256 @14 (4 MB
# of weights) 2.64 / 3.19 either way, where bands of one or two tile rows took 3.8-3.9 on
# x86-64-v3.  With F(4x4), 128 @28 (2.4 MB of weights) in bands of one tile row: 1.77 ->
# 1.83 / 2.10 -> 2.20.
BAND_BYTES = 128 * 1024
STREAMED_WEIGHTS = 2 * 1024 * 1024
# A split of one band a task shares out tiles rather than tile rows when the rows do not
# divide evenly among the tasks: ResNet's 128 @28 in tiles of 4 and 256 @14 in tiles of 2
# have 7 tile rows, 4 of them to one of two tasks (tasks 1.89 / 1.42 Mcycles in ResNet-50);
# 49 tiles go 25 and 24.  Each task's code is emitted for its own tiles (its first and last
# tile rows may be partial), so only up to this many tasks.
TILE_SPLIT_MAX_PARTS = 4


def conv_is_winograd(node, shape) -> bool:
    """A single-group f32 3x3 convolution at stride 1 without dilation, with whole blocks of
    VW input channels and whole panels of NR filters (of the channel-blocked product's tile,
    conv_blocked.blocked_tile: 24 filters in AVX2 vectors too), over at least MIN_PIXELS
    pixels for the tile's vectors."""
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    tile = blocked_tile(m, shape)
    return (node.group == 1 and node.outputs[0].type.dtype == "f32" and kh == kw == 3
            and tuple(node.strides) == (1, 1) and tuple(node.dilations) == (1, 1)
            and cg % tile.vw == 0 and m % tile.nr == 0 and oh * ow >= MIN_PIXELS.get(tile.vw, 14 * 14))


def tile_size(node) -> int:
    """T of F(T x T, 3x3): 4 where the output's tiles waste little of it (rows and columns
    past the image), else 2."""
    oh, ow = node.outputs[0].type.shape[2:]
    return 4 if tile_waste(oh, ow, 4) <= MAX_TILE_WASTE else 2


def tile_waste(oh: int, ow: int, t: int) -> float:
    """The pixels tiles of t x t compute over the oh x ow the output has."""
    return (-(-oh // t) * t / oh) * (-(-ow // t) * t / ow)


def winograd_weights(data, node) -> np.ndarray:
    """The filters [M, C, 3, 3] as the (T + 2)^2 matrices U_xi^T [C, M], U = G g G^T
    (computed in float64, rounded once)."""
    m, cg = node.inputs[1].type.shape[:2]
    _, gt, _ = TRANSFORMS[tile_size(node)]
    g = data.reshape(m, cg, 3, 3).astype(np.float64)
    u = np.einsum("ik,mckl,jl->ijcm", gt, g, gt)          # [T + 2, T + 2, C, M]
    return np.ascontiguousarray(u.reshape(-1, cg, m).astype(np.float32))


class WinogradGeometry:
    """The tiles, the padded channel-blocked input, and the bands of tile rows, for one
    convolution (split among `parts` tasks).  Carries the fields conv_blocked's copy and
    store-back read."""

    def __init__(self, node, shape, parts: int = 1):
        _, _, self.h, self.w = node.inputs[0].type.shape
        self.m, self.cg = node.inputs[1].type.shape[:2]
        self.oh, self.ow = node.outputs[0].type.shape[2:]
        self.pt, self.pl = node.pads[:2]
        self.src_h, self.src_w, self.step_h, self.step_w = self.h, self.w, 1, 1
        self.gemm = blocked_tile(self.m, shape)                  # the products' register tile
        self.vw, self.nr = self.gemm.vw, self.gemm.nr
        self.cb = self.cg // self.vw
        self.t = tile_size(node)                                  # T: a tile's output rows and columns
        self.window = self.t + 2
        self.positions = self.window ** 2                         # of a transformed window: xi
        self.th, self.tw = -(-self.oh // self.t), -(-self.ow // self.t)     # tile rows and columns
        # X reaches the last tile's window (past the input and its padding when the tiles
        # reach past the output: zeros).
        self.hp = max(self.h + self.pt, self.t * self.th + 2)
        self.wp = max(self.w + self.pl, self.t * self.tw + 2)
        self.block = self.hp * self.wp * self.vw
        self.size = self.cb * self.block
        self.panels = self.m // self.nr
        self.mp = self.m
        self.n = self.oh * self.ow
        self.rows = band_rows(self, parts)                        # tile rows per band
        self.bands = -(-self.th // self.rows)
        self.tile_shares = tile_shares(self, parts)               # or None: bands of tile rows
        if self.tile_shares:        # a task's tiles reach into one more tile row than they fill
            self.rows = max(hi // self.tw - lo // self.tw + 1 for lo, hi in self.tile_shares)
        self.tiles = self.rows * self.tw                          # tiles of a whole band

    def v_floats(self) -> int:
        return aligned_floats(self.positions * self.tiles * self.cg)

    def m_floats(self) -> int:
        return aligned_floats(self.positions * self.tiles * self.mp)

    def scratch_floats(self) -> int:
        return (aligned_floats(self.size) + self.v_floats() + self.m_floats()
                + aligned_floats(self.t * self.rows * self.ow * self.mp))


def band_rows(g: WinogradGeometry, parts: int) -> int:
    """Tile rows per band: V and M within BAND_BYTES (all of a task's rows in one band when the
    transformed weights exceed STREAMED_WEIGHTS), and of those the most whose bands,
    shared out among `parts` tasks, give the busiest task the fewest tile rows."""
    per_row = 4 * g.positions * g.tw * (g.cg + g.mp)
    if 4 * g.positions * g.cg * g.mp > STREAMED_WEIGHTS:
        most = -(-g.th // parts)
    else:
        most = max(1, min(g.th, BAND_BYTES // per_row))

    def busiest_rows(r):
        return busiest(-(-g.th // r), r, parts, g.th)
    return max(range(most, 0, -1), key=lambda r: (-busiest_rows(r), r))


def tile_shares(g: WinogradGeometry, parts: int):
    """[(first tile, end)] of each task when `parts` tasks share out tiles (in row-major
    order) rather than bands of tile rows: when each would compute one band (the transformed
    weights streamed), the rows do not divide evenly, and the tasks are few; else None."""
    if not (1 < parts <= TILE_SPLIT_MAX_PARTS and g.th % parts and g.bands <= parts
            and 4 * g.positions * g.cg * g.mp > STREAMED_WEIGHTS):
        return None
    return shares(g.th * g.tw, 1, parts, g.th * g.tw)


def winograd_items(node, shape) -> int:
    """What a split shares out: tile rows (in bands that band_rows balances among the tasks,
    or as their tiles: tile_shares)."""
    return WinogradGeometry(node, shape).th


def emit_conv_winograd(k) -> None:
    b, node = k.b, k.node
    (y, _), (x, xt), (w, _) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    g = WinogradGeometry(node, k.gemm_shape, k.split.parts)
    n_img, c = xt.shape[:2]
    xb = k.scratch
    v = b.gep(xb, [i64(aligned_floats(g.size))])
    mm = b.gep(v, [i64(g.v_floats())])
    ct = b.gep(mm, [i64(g.m_floats())])
    zero_border(b, g, xb)
    lo, hi = (None, None) if g.tile_shares else k.split.range(b, g.bands)
    with for_range(b, n_img, name="img") as img:
        src = b.gep(x, [b.mul(img, i64(c * g.h * g.w))])
        if g.tile_shares:       # each task's code for its own tiles
            for part, (t_lo, t_hi) in enumerate(g.tile_shares):
                with b.if_then(b.icmp_signed("==", k.split.index, i64(part))):
                    _task_tiles(k, g, src, xb, v, mm, ct, img, y, w, bias, t_lo, t_hi)
        else:
            _task_bands(k, g, src, xb, v, mm, ct, img, y, w, bias, lo, hi)


def _task_bands(k, g: WinogradGeometry, src, xb, v, mm, ct, img, y, w, bias, lo, hi) -> None:
    """This task's bands lo .. hi (i64 values) of tile rows."""
    b = k.b

    def band(j, tile_rows: int, out_rows: int):
        """Band j, of `tile_rows` tile rows and `out_rows` output rows: the input rows it
        reads past the last band's copied, then transformed, multiplied, transformed back
        and stored."""
        first = b.mul(j, i64(g.rows))
        fill_blocked(b, g, src, xb, _input_rows(b, g, j, lo))
        tiles = tile_rows * g.tw
        first_tile = b.mul(first, i64(g.tw))
        _input_transform(b, g, xb, v, first_tile, tiles)
        _products(b, g, v, w, mm, tiles)
        _output_transform(b, g, mm, ct, first_tile, tiles, first)
        store_band(k, g, ct, b.mul(first, i64(g.t * g.ow)), out_rows * g.ow, i64(0), i64(g.panels),
                   img, y, bias)

    last = g.bands - 1
    last_rows, last_out = g.th - last * g.rows, g.oh - g.t * last * g.rows
    alike = last_rows == g.rows and last_out == g.t * g.rows     # then one copy of the code
    if last or alike:      # whole bands (the last one holds what the rows do not divide into)
        whole_hi = hi if alike else b.select(b.icmp_signed("<", hi, i64(last)), hi, i64(last))
        with for_range(b, whole_hi, start=lo, name="band") as j:
            band(j, g.rows, g.t * g.rows)
    if not alike:
        with b.if_then(b.and_(b.icmp_signed("<=", lo, i64(last)), b.icmp_signed("<", i64(last), hi))):
            band(i64(last), last_rows, last_out)


def _products(b, g: WinogradGeometry, v, w, mm, tiles: int) -> None:
    """M_xi = V_xi @ U_xi for each position xi, over `tiles` tiles."""
    with for_range(b, g.positions, name="xi") as xi:
        first_tile = 0
        for count, rows in tile_blocks(tiles, g.gemm.mr):
            emit_gemm(b, GemmShape(g.vw, rows, g.gemm.nv, g.gemm.features), count * rows, g.m, g.cg,
                      b.gep(v, [b.add(b.mul(xi, i64(tiles * g.cg)), i64(first_tile * g.cg))]), g.cg,
                      b.gep(w, [b.mul(xi, i64(g.cg * g.m))]), None,
                      b.gep(mm, [b.add(b.mul(xi, i64(tiles * g.mp)), i64(first_tile * g.mp))]), g.mp,
                      name="wg")
            first_tile += count * rows


def _task_tiles(k, g: WinogradGeometry, src, xb, v, mm, ct, img, y, w, bias, t_lo: int, t_hi: int) -> None:
    """One task's tiles t_lo .. t_hi (of a tile split: constants), in one band: its first
    and last tile rows may be partial, so C^T holds the band's tile rows whole and the store
    takes the pixels of its own tiles, row by row where a tile row is partial.  (A task has
    at least a tile row's tiles, the last one to the end: no tile row is partial at both
    ends.)"""
    b = k.b
    r_lo, r_hi = t_lo // g.tw, (t_hi - 1) // g.tw            # the tile rows it reaches
    top = r_lo * g.t - g.pt
    fill_blocked(b, g, src, xb, (i64(max(0, top)), i64(min(g.h, (r_hi + 1) * g.t + 2 - g.pt))))
    tiles = t_hi - t_lo
    _input_transform(b, g, xb, v, i64(t_lo), tiles)
    _products(b, g, v, w, mm, tiles)
    _output_transform(b, g, mm, ct, i64(t_lo), tiles, i64(r_lo))
    base = r_lo * g.t * g.ow                                 # C^T's first pixel

    def store(p0: int, count: int):
        if count > 0:
            store_band(k, g, b.gep(ct, [i64((p0 - base) * g.mp)]), i64(p0), count, i64(0), i64(g.panels),
                       img, y, bias)

    def partial(row: int, c_lo: int, c_hi: int):
        """Tile row `row`'s tile columns c_lo .. c_hi, output row by output row."""
        for oy in range(row * g.t, min(g.oh, (row + 1) * g.t)):
            store(oy * g.ow + c_lo * g.t, min(g.ow, c_hi * g.t) - c_lo * g.t)
    whole_lo = r_lo if t_lo % g.tw == 0 else r_lo + 1        # tile rows it computes whole
    whole_hi = r_hi + 1 if t_hi % g.tw == 0 else r_hi
    if whole_lo > r_lo:
        partial(r_lo, t_lo % g.tw, g.tw)
    if whole_hi > whole_lo:
        first = whole_lo * g.t * g.ow
        store(first, min(g.oh * g.ow, whole_hi * g.t * g.ow) - first)
    if whole_hi <= r_hi:
        partial(r_hi, 0, t_hi - r_hi * g.tw)


def tile_blocks(tiles: int, mr: int) -> list:
    """A band's tiles as runs (blocks, rows of each) of the product's register tiles: as few
    blocks as MR-row ones, their rows as even as can be (AVX2's 6-row tiles take 14 tiles as
    5 + 5 + 4, not 6 + 6 + 2, whose last block of 4 accumulators waits on the FMA latency).
    ResNet-50's Winograd layers on x86-64-v3 (Zen 4, 1 thread, in the model, fastest of 30
    alternating runs, two processes): 39.4 -> 38.3-38.9 Mcycles, 256 @14's 49 tiles a band
    (8 x 6 + 1 before) 3.20 -> 3.12."""
    blocks = -(-tiles // mr)
    rows, extra = divmod(tiles, blocks)
    return [(n, r) for n, r in ((extra, rows + 1), (blocks - extra, rows)) if n]


def _input_rows(b, g: WinogradGeometry, j, first_band):
    """(lo, hi): the input rows band j reads that the bands before it (this task's, from
    `first_band` on) have not copied: windows of successive tile rows overlap by two rows."""
    top = b.sub(b.mul(j, i64(g.t * g.rows)), i64(g.pt))
    start = b.select(b.icmp_signed("==", j, first_band), top, b.add(top, i64(2)))
    end_tile = b.mul(b.add(j, i64(1)), i64(g.rows))
    end_tile = b.select(b.icmp_signed("<", end_tile, i64(g.th)), end_tile, i64(g.th))
    end = b.sub(b.add(b.mul(end_tile, i64(g.t)), i64(2)), i64(g.pt))
    return clamp(b, start, i64(0), i64(g.h)), clamp(b, end, i64(0), i64(g.h))


def combine(b, matrix, xs: list, vw: int) -> list:
    """matrix @ xs for a constant matrix and a list of vectors: additions and subtractions
    for coefficients of 1 and -1, multiply-adds for the others, none for zeros.  Vectors of
    integers (qwinograd.py's) take integer matrices, summed with their shared terms
    (integer_forms.combine_integer)."""
    if isinstance(xs[0].type.element, ir.IntType):
        return combine_integer(b, matrix, xs)
    out = []
    for row in matrix:
        terms = sorted(((float(c), x) for c, x in zip(row, xs) if c), key=lambda t: t[0] != 1.0)
        coef, acc = terms[0]
        if coef != 1.0:
            acc = b.fmul(splat_constant(coef, vw), acc)
        for coef, x in terms[1:]:
            if coef == 1.0:
                acc = b.fadd(acc, x)
            elif coef == -1.0:
                acc = b.fsub(acc, x)
            else:
                acc = fmuladd(b, splat_constant(coef, vw), x, acc)
        out.append(acc)
    return out


def splat_constant(value: float, vw: int) -> ir.Constant:
    return ir.Constant(f32_vector(vw), [float(np.float32(value))] * vw)


def _input_transform(b, g: WinogradGeometry, xb, v, first_tile, tiles: int) -> None:
    """V_xi[t][c] = (B^T d B)[xi] for `tiles` tiles from tile `first_tile` on (in row-major
    order over the image's tiles: V's tile t is tile first_tile + t) and every channel c,
    VW channels at a time."""
    vw, a = g.vw, g.window
    bt = TRANSFORMS[g.t][0]
    with for_range(b, tiles, name="it") as t:
        tile = b.add(first_tile, t)
        r = b.udiv(tile, i64(g.tw))
        tc = b.sub(tile, b.mul(r, i64(g.tw)))
        corner = b.add(b.mul(r, i64(g.t * g.wp * vw)), b.mul(tc, i64(g.t * vw)))   # the window's in X
        out = b.mul(t, i64(g.cg))
        with for_range(b, g.cb, name="icb") as cb:
            base = b.add(corner, b.mul(cb, i64(g.block)))
            d = [[vload(b, b.gep(xb, [b.add(base, i64((i * g.wp + j) * vw))]), vw) for j in range(a)]
                 for i in range(a)]
            # B^T d column by column (cols[j][i] = (B^T d)[i][j]), then times B row by row
            cols = [combine(b, bt, [d[i][j] for i in range(a)], vw) for j in range(a)]
            vt = [combine(b, bt, [cols[j][i] for j in range(a)], vw) for i in range(a)]
            at = b.add(out, b.mul(cb, i64(vw)))
            for i in range(a):
                for j in range(a):
                    vstore(b, vt[i][j], b.gep(v, [b.add(at, i64((a * i + j) * tiles * g.cg))]), vw)


def _output_transform(b, g: WinogradGeometry, mm, ct, first_tile, tiles: int, first_row) -> None:
    """C^T[p][f] = (A^T M A) of `tiles` tiles from tile `first_tile` on (M's tile t is tile
    first_tile + t) for their output pixels p inside the image, p counted from the first
    pixel of tile row `first_row`, and every filter f, VW filters at a time."""
    vw, a, t_out = g.vw, g.window, g.t
    at_ = TRANSFORMS[g.t][2]
    with for_range(b, tiles, name="ot") as t:
        tile = b.add(first_tile, t)
        r = b.udiv(tile, i64(g.tw))
        tc = b.sub(tile, b.mul(r, i64(g.tw)))
        pixel = b.add(b.mul(b.sub(r, first_row), i64(t_out * g.ow)), b.mul(tc, i64(t_out)))   # the tile's first
        with for_range(b, g.mp, step=vw, name="of") as f0:
            at = b.add(b.mul(t, i64(g.mp)), f0)
            m = [[vload(b, b.gep(mm, [b.add(at, i64((a * i + j) * tiles * g.mp))]), vw) for j in range(a)]
                 for i in range(a)]
            cols = [combine(b, at_, [m[i][j] for i in range(a)], vw) for j in range(a)]
            out = [combine(b, at_, [cols[j][i] for j in range(a)], vw) for i in range(t_out)]

            def put(i, j):
                p = b.add(pixel, i64(i * g.ow + j))
                vstore(b, out[i][j], b.gep(ct, [b.add(b.mul(p, i64(g.mp)), f0)]), vw)

            def inside(index, offset: int, size: int):
                """Whether tile `index`'s row or column `offset` lies inside `size`."""
                return b.icmp_signed("<", b.add(b.mul(index, i64(t_out)), i64(offset)), i64(size))

            def row(i):
                for j in range(t_out):
                    if j < g.ow % t_out or not g.ow % t_out:
                        put(i, j)
                    else:             # the last tile column reaches past the image
                        with b.if_then(inside(tc, j, g.ow)):
                            put(i, j)
            for i in range(t_out):
                if i < g.oh % t_out or not g.oh % t_out:
                    row(i)
                else:                 # the last tile row reaches past the image
                    with b.if_then(inside(r, i, g.oh)):
                        row(i)
