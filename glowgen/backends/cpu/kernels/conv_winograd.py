"""3x3 stride-1 convolutions by Winograd's minimal filtering, F(2x2, 3x3).

Each 2 x 2 block of output pixels (a tile) is computed from the 4 x 4 input window under it
with 16 multiplications per channel pair instead of 36 (Lavin and Gray, 2016):

    Y = A^T [ (G g G^T) .* (B^T d B) ] A        g: a 3x3 filter, d: a 4x4 window

The filter transform U = G g G^T is done at compile time (winograd_weights).  Per image,
band by band of tile rows:

1. the input rows the band reads are copied into a zero-padded channel-blocked copy X
   (conv_blocked's NCHWc, X[cb][Hp][Wp][VW]), so each window's rows are plain vector loads
   along the channels;
2. the input transform V = B^T d B, VW channels at a time, written as 16 matrices
   V_xi[tile][channel] (xi: one of the 4 x 4 positions of the transformed window);
3. 16 matrix products M_xi[tile][filter] = V_xi @ U_xi, with U_xi packed at compile time
   in NR-filter panels (gemm.emit_gemm: the same register tile as every other product);
4. the output transform Y = A^T M A, VW filters at a time, into a C^T band of pixels, stored
   back to NCHW through the bias and the fused epilogue by conv_transposed's register
   transposes (conv_blocked.store_band).

The products do 16 / 36 of a direct convolution's multiply-adds; the transforms are
additions over data that stays in L2.  Rounding differs from a direct convolution's by a
few units in the last place of the products' sums (the transforms add and subtract inputs
before multiplying); the tests hold it to onnxruntime and ONNX's reference at float32
tolerances.
"""
from __future__ import annotations

import numpy as np

from ..gemm import emit_gemm
from ..llvmutil import for_range, i64
from ..vectors import vload, vstore
from .common import clamp
from .conv_blocked import busiest, fill_blocked, store_band, zero_border
from .conv_planes import aligned_floats

# The filter transform of F(2x2, 3x3) (the input's, B^T, and the output's, A^T, are the
# additions of _combine and _reduce).
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

# Where Winograd applies: at least this many output pixels (below, the transformed weights,
# 16/9 of the filters', are read for too few tiles; ResNet's 7 x 7 stage stays blocked).
MIN_PIXELS = 14 * 14
# V and M of a band (the products' operands and results) kept within about this many bytes,
# unless the transformed weights exceed TRANSFORMED_WEIGHTS_IN_L2: then every band reads all
# of them, and fewer, larger bands read them fewer times.
BAND_BYTES = 512 * 1024
TRANSFORMED_WEIGHTS_IN_L2 = 512 * 1024


def conv_is_winograd(node, shape) -> bool:
    """A single-group f32 3x3 convolution at stride 1 without dilation, with whole blocks of
    VW input channels and whole panels of NR filters, over at least MIN_PIXELS pixels."""
    m, cg, kh, kw = node.inputs[1].type.shape
    oh, ow = node.outputs[0].type.shape[2:]
    return (node.group == 1 and node.outputs[0].type.dtype == "f32" and kh == kw == 3
            and tuple(node.strides) == (1, 1) and tuple(node.dilations) == (1, 1)
            and cg % shape.vw == 0 and m % shape.nr == 0 and oh * ow >= MIN_PIXELS)


def winograd_weights(data, node) -> np.ndarray:
    """The filters [M, C, 3, 3] as the 16 matrices U_xi^T [C, M], U = G g G^T (computed in
    float64, rounded once)."""
    m, cg = node.inputs[1].type.shape[:2]
    g = data.reshape(m, cg, 3, 3).astype(np.float64)
    u = np.einsum("ik,mckl,jl->ijcm", G, g, G)          # [4, 4, C, M]
    return np.ascontiguousarray(u.reshape(16, cg, m).astype(np.float32))


class WinogradGeometry:
    """The padded channel-blocked input, the tiles, and the bands of tile rows, for one
    convolution (split among `parts` tasks).  Carries the fields conv_blocked's copy and
    store-back read."""

    def __init__(self, node, shape, parts: int = 1):
        _, _, self.h, self.w = node.inputs[0].type.shape
        self.m, self.cg = node.inputs[1].type.shape[:2]
        self.oh, self.ow = node.outputs[0].type.shape[2:]
        self.pt, self.pl = node.pads[:2]
        self.src_h, self.src_w, self.step_h, self.step_w = self.h, self.w, 1, 1
        self.vw, self.nr = shape.vw, shape.nr
        self.cb = self.cg // self.vw
        self.th, self.tw = -(-self.oh // 2), -(-self.ow // 2)       # tile rows and columns
        # X reaches the last tile's window (past the input and its padding when the output
        # has an odd number of rows or columns: zeros).
        self.hp = max(self.h + self.pt, 2 * self.th + 2)
        self.wp = max(self.w + self.pl, 2 * self.tw + 2)
        self.block = self.hp * self.wp * self.vw
        self.size = self.cb * self.block
        self.panels = self.m // self.nr
        self.mp = self.m
        self.n = self.oh * self.ow
        self.rows = band_rows(self, parts)                      # tile rows per band
        self.bands = -(-self.th // self.rows)
        self.tiles = self.rows * self.tw                        # tiles of a whole band

    def v_floats(self) -> int:
        return aligned_floats(16 * self.tiles * self.cg)

    def m_floats(self) -> int:
        return aligned_floats(16 * self.tiles * self.mp)

    def scratch_floats(self) -> int:
        return (aligned_floats(self.size) + self.v_floats() + self.m_floats()
                + aligned_floats(2 * self.rows * self.ow * self.mp))


def band_rows(g: WinogradGeometry, parts: int) -> int:
    """Tile rows per band: V and M within BAND_BYTES (all of a task's rows in one band when the
    transformed weights exceed TRANSFORMED_WEIGHTS_IN_L2), and of those the most whose bands,
    shared out among `parts` tasks, give the busiest task the fewest tile rows."""
    per_row = 4 * 16 * g.tw * (g.cg + g.mp)
    if 4 * 16 * g.cg * g.mp > TRANSFORMED_WEIGHTS_IN_L2:
        most = -(-g.th // parts)
    else:
        most = max(1, min(g.th, BAND_BYTES // per_row))

    def busiest_rows(r):
        return busiest(-(-g.th // r), r, parts, g.th)
    return max(range(most, 0, -1), key=lambda r: (-busiest_rows(r), r))


def winograd_items(node, shape) -> int:
    """What a split shares out: tile rows (in bands that band_rows balances among the tasks)."""
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
    lo, hi = k.split.range(b, g.bands)
    zero_border(b, g, xb)
    last = g.bands - 1
    with for_range(b, n_img, name="img") as img:
        src = b.gep(x, [b.mul(img, i64(c * g.h * g.w))])

        def band(j, tile_rows: int, out_rows: int):
            """Band j, of `tile_rows` tile rows and `out_rows` output rows: the input rows
            it reads past the last band's copied, then transformed, multiplied, transformed
            back and stored."""
            first = b.mul(j, i64(g.rows))
            fill_blocked(b, g, src, xb, _input_rows(b, g, j, lo))
            tiles = tile_rows * g.tw
            _input_transform(b, g, xb, v, first, tile_rows)
            with for_range(b, 16, name="xi") as xi:
                emit_gemm(b, k.gemm_shape, tiles, g.m, g.cg, b.gep(v, [b.mul(xi, i64(tiles * g.cg))]), g.cg,
                          b.gep(w, [b.mul(xi, i64(g.cg * g.m))]), None,
                          b.gep(mm, [b.mul(xi, i64(tiles * g.mp))]), g.mp, name="wg")
            _output_transform(b, g, mm, ct, tile_rows, out_rows)
            store_band(k, g, ct, b.mul(first, i64(2 * g.ow)), out_rows * g.ow, i64(0), i64(g.panels),
                        img, y, bias)

        if last:      # whole bands (the last one holds what the rows do not divide into)
            whole_hi = b.select(b.icmp_signed("<", hi, i64(last)), hi, i64(last))
            with for_range(b, whole_hi, start=lo, name="band") as j:
                band(j, g.rows, 2 * g.rows)
        with b.if_then(b.and_(b.icmp_signed("<=", lo, i64(last)), b.icmp_signed("<", i64(last), hi))):
            band(i64(last), g.th - last * g.rows, g.oh - 2 * last * g.rows)


def _input_rows(b, g: WinogradGeometry, j, first_band):
    """(lo, hi): the input rows band j reads that the bands before it (this task's, from
    `first_band` on) have not copied: windows of tile rows overlap by two input rows."""
    top = b.sub(b.mul(j, i64(2 * g.rows)), i64(g.pt))
    start = b.select(b.icmp_signed("==", j, first_band), top, b.add(top, i64(2)))
    end_tile = b.mul(b.add(j, i64(1)), i64(g.rows))
    end_tile = b.select(b.icmp_signed("<", end_tile, i64(g.th)), end_tile, i64(g.th))
    end = b.sub(b.add(b.mul(end_tile, i64(2)), i64(2)), i64(g.pt))
    return clamp(b, start, i64(0), i64(g.h)), clamp(b, end, i64(0), i64(g.h))


def _combine(b, d):
    """B^T d for four vectors d[0..3] (rows or columns of a window): d0 - d2, d1 + d2,
    d2 - d1, d1 - d3."""
    return [b.fsub(d[0], d[2]), b.fadd(d[1], d[2]), b.fsub(d[2], d[1]), b.fsub(d[1], d[3])]


def _input_transform(b, g: WinogradGeometry, xb, v, first, tile_rows: int) -> None:
    """V_xi[t][c] = (B^T d B)[xi] for the band's tiles t (tile row `first` on) and every
    channel c, VW channels at a time."""
    vw, tiles = g.vw, tile_rows * g.tw
    with for_range(b, tile_rows, name="itr") as r:
        row = b.mul(b.add(first, r), i64(2 * g.wp * vw))       # the window's first row in X
        with for_range(b, g.tw, name="itc") as tc:
            t = b.add(b.mul(r, i64(g.tw)), tc)
            corner = b.add(row, b.mul(tc, i64(2 * vw)))
            out = b.mul(t, i64(g.cg))
            with for_range(b, g.cb, name="icb") as cb:
                base = b.add(corner, b.mul(cb, i64(g.block)))
                d = [[vload(b, b.gep(xb, [b.add(base, i64((i * g.wp + j) * vw))]), vw) for j in range(4)]
                     for i in range(4)]
                # B^T d column by column (cols[j][i] = (B^T d)[i][j]), then times B row by row
                cols = [_combine(b, [d[i][j] for i in range(4)]) for j in range(4)]
                vt = [_combine(b, [cols[j][i] for j in range(4)]) for i in range(4)]
                at = b.add(out, b.mul(cb, i64(vw)))
                for i in range(4):
                    for j in range(4):
                        vstore(b, vt[i][j], b.gep(v, [b.add(at, i64((4 * i + j) * tiles * g.cg))]), vw)


def _reduce(b, s):
    """A^T s for four vectors s[0..3]: s0 + s1 + s2, s1 - s2 - s3."""
    return [b.fadd(b.fadd(s[0], s[1]), s[2]), b.fsub(b.fsub(s[1], s[2]), s[3])]


def _output_transform(b, g: WinogradGeometry, mm, ct, tile_rows: int, out_rows: int) -> None:
    """C^T[p][f] = (A^T M A) of the band's tiles for their output pixels p (the band's, row
    by row: those inside the image) and every filter f, VW filters at a time."""
    vw, tiles = g.vw, tile_rows * g.tw
    with for_range(b, tile_rows, name="otr") as r:
        with for_range(b, g.tw, name="otc") as tc:
            t = b.add(b.mul(r, i64(g.tw)), tc)
            pixel = b.add(b.mul(r, i64(2 * g.ow)), b.mul(tc, i64(2)))   # the tile's first, in the band
            with for_range(b, g.mp, step=vw, name="of") as f0:
                at = b.add(b.mul(t, i64(g.mp)), f0)
                m = [[vload(b, b.gep(mm, [b.add(at, i64((4 * i + j) * tiles * g.mp))]), vw) for j in range(4)]
                     for i in range(4)]
                cols = [_reduce(b, [m[i][j] for i in range(4)]) for j in range(4)]
                out = [_reduce(b, [cols[j][i] for j in range(4)]) for i in range(2)]

                def put(i, j):
                    p = b.add(pixel, i64(i * g.ow + j))
                    vstore(b, out[i][j], b.gep(ct, [b.add(b.mul(p, i64(g.mp)), f0)]), vw)

                def row(i):
                    put(i, 0)
                    if g.ow % 2:          # the last tile column's right pixel is past the image
                        with b.if_then(b.icmp_signed("<", b.add(b.mul(tc, i64(2)), i64(1)), i64(g.ow))):
                            put(i, 1)
                    else:
                        put(i, 1)
                row(0)
                if out_rows % 2:          # the band's last tile row has one output row
                    with b.if_then(b.icmp_signed("<", b.add(b.mul(r, i64(2)), i64(1)), i64(out_rows))):
                        row(1)
                else:
                    row(1)
