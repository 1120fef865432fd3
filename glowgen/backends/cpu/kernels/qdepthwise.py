"""QuantizedConv with one filter per channel (depthwise): exact i32 sums of int8 products,
requantized to i8 in the store, vectorized along the output pixels of a channel.

Each channel of an image is first copied into a byte *plane*: the input padded with its
real zero (the x offset, as the product's element holds it: + 128 as u8 for VNNI), its rows
dealt by the row stride sh into sh phases of Hq rows of sw * Wq bytes.  Output pixel
(oy, ox) is lane q = oy * Wq + ox of the channel's product, and tap (ky, kx) reads byte
sw * q + a constant (ky's phase and row, kx * dw): the whole channel is one run of lanes,
the columns ox >= OW of each row computed and dropped (2 of 58 at 56x56, 3x3, stride 1).

The products sum G horizontal taps of a filter row in one instruction (qgemm.dot_groups:
VNNI `vpdpbusd` takes 4, `vpmaddwd` 2, and AVX2's `ubsw` 4 in two, a `vpmaddubsw` and a
`vpmaddwd` with ones): a row is ceil(KW / G) tap groups, each group's weights one 32-bit
element (zeros past KW).  The G bytes of each lane, at sw * q + dw * (G * t + u) for u < G,
are one load and one constant byte shuffle of the plane (vpermb), or at unit strides a
plain load (of a plane of i16 values for `vpmaddwd`: DepthwiseGeometry.mode); at strides
whose lanes span more than one 64-byte load (5 and more on VNNI), a load and a shuffle for
each chunk of lanes within 64 bytes, the chunks joined (DepthwiseGeometry.chunk).  A 3x3
depthwise convolution is three `vpdpbusd` per 16 pixels on AVX-512 VNNI; on AVX2 three
`vpmaddubsw` and three `vpmaddwd` per 8 where its weights fit 7 bits and the lanes run
interleaved (`ubsw`, choose_qshape: the unit-stride ones the quantizer makes), else six
`vpmaddwd` per 8.  The sums start from the per-channel correction (the bias
minus the shift to u8 and the x offset, times the filter's sum: qgemm.pack_epilogue) and
are requantized as the other int8 kernels and the interpreter do, by
qgemm.requantize_unsaturated and qgemm.narrow (the sums' range is checked at compile time:
sums_in_range).

The requantized lanes go to a row of scratch memory, whose OW first columns of each output
row are then copied out.  A split shares out the channels; each task has its own plane.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....reference.primitives import saturation
from ..llvmutil import F32, I8, I16, I32, for_range, for_range_staged, i64, in_turn
from ..parallel import Work
from ..qgemm import (QShape, dot_groups, for_weights, narrow, pack_epilogue, products_in_range,
                     requantize_unsaturated)
from ..vectors import join_vectors, splat

PREFIX = "depthwise-"
# What the kernel covers (qlinalg's general product takes the depthwise convolutions
# beyond): a lane's G bytes must lie within one 64-byte load (dw * (G - 1) < 64; any stride).
MAX_DILATION = 4
NV = 2               # independent vectors of sums per step of the lane loop
COPY = 32            # bytes of the vectors the plane's rows and the output rows are copied in

_ceil = lambda a, b: -(-a // b)          # noqa: E731
_align = lambda n: _ceil(n, 64) * 64     # noqa: E731


def covers(node) -> bool:
    """A depthwise convolution the kernel computes: one filter per channel, any strides,
    dilations of at most MAX_DILATION."""
    c = node.inputs[0].type.shape[1]
    return node.group == c == node.inputs[1].type.shape[0] and max(node.dilations) <= MAX_DILATION


def choose_qshape(node, qs: QShape, w: np.ndarray) -> QShape:
    """The int8 path for a depthwise convolution on the target whose widest is `qs`: on AVX2,
    where the weights fit 7 bits (qgemm.for_weights) and the lanes run interleaved, `ubsw`'s
    groups of 4 taps, as VNNI's (a `vpmaddubsw` of u8 x s8 pair sums, exact for such
    weights, and a `vpmaddwd` with ones: four instructions per 4 taps of 8 lanes, against
    `madd16`'s six per 2 taps of a plane of i16 values); `qs` otherwise."""
    seven = for_weights(qs, w)
    if seven.kind == "ubsw" and DepthwiseGeometry(node, seven).mode == "interleaved":
        return seven
    return qs


def strategy(qs: QShape) -> str:
    return PREFIX + qs.kind


def sums_in_range(node, w: np.ndarray, ws: np.ndarray, bias: np.ndarray, qs: QShape) -> bool:
    """Whether every channel's requantized sums stay within qgemm.IN_RANGE, as the kernel's
    requantization needs (qgemm.products_in_range)."""
    c = w.shape[0]
    corr, mult = pack_epilogue(w.reshape(c, 1, -1), ws, bias, node.inputs[0].type.quant, node.scale, qs)
    return products_in_range(w, corr[:c], mult[:c])


def is_depthwise(strategy_name) -> bool:
    return bool(strategy_name) and strategy_name.startswith(PREFIX)


def qshape(strategy_name: str) -> QShape:
    return QShape(strategy_name[len(PREFIX):])


class DepthwiseGeometry:
    """The plane, the lanes and the tap groups of one channel, from the node's static shapes."""

    def __init__(self, node, qs: QShape):
        self.qs = qs
        g, vw = qs.group, qs.vw
        self.batch, self.c, self.h, self.w = node.inputs[0].type.shape
        _, _, self.kh, self.kw = node.inputs[1].type.shape
        self.oh, self.ow = node.outputs[0].type.shape[2:]
        (sh, sw), (dh, dw), p = node.strides, node.dilations, node.pads
        self.sh, self.sw, self.pt, self.pl = sh, sw, p[0], p[1]
        self.hq = _ceil(self.h + p[0] + p[2], sh)
        self.wq = _ceil(self.w + p[1] + p[3], sw)
        self.row = sw * self.wq                      # bytes of a plane row
        self.phase = self.hq * self.row
        self.groups = _ceil(self.kw, g)              # tap groups of a filter row
        self.taps = [((ky * dh) % sh) * self.phase + ((ky * dh) // sh) * self.row + dw * g * t
                     for ky in range(self.kh) for t in range(self.groups)]
        # Lane i's G bytes in a load from the lane's first byte: sw * i + dw * u, in chunks
        # of `chunk` lanes each within one load of `chunk_load` bytes (<= 64: one vpermb),
        # the chunk c's load from byte sw * chunk * c; `load`: the bytes all of them span.
        self.chunk = vw
        while self.chunk > 1 and sw * (self.chunk - 1) + dw * (g - 1) >= 64:
            self.chunk //= 2
        self.lanes = [sw * i + dw * u for i in range(self.chunk) for u in range(g)]
        self.chunk_load = 1 << (max(self.lanes)).bit_length()
        assert self.chunk_load <= 64, (sw, dw, qs.kind)
        self.load = sw * (vw - self.chunk) + self.chunk_load
        self.q = (self.oh - 1) * self.wq + self.ow
        # How a tap's groups reach the lanes (channel_lanes):
        # "interleaved" (unit strides and dilations; with VNNI where lanes of 64 waste no
        #   more than lanes of 32): a group is G consecutive values of the plane (bytes for
        #   VNNI; for vpmaddwd the plane holds i16 values, the input widened as it is
        #   copied in), so a plain load from value q0 + r holds the groups of lanes
        #   q0 + r + G * k in its 32-bit elements; G such vectors (r < G) are G * VW
        #   lanes, interleaved back into order when stored (qgemm.narrow);
        # "expand" (vpmaddwd, unit strides, dilated columns): the groups are expanded once
        #   into an element plane, element i the group of bytes i + dw * u, from which
        #   tap t of lane q is element q + t: a plain vector load;
        # "shuffle" (other strides): each tap's groups are a load and a shuffle of the
        #   plane (lane_groups); expanded, the element plane would hold 4x the lanes.
        # vpmaddwd's interleaved i16 plane in place of "expand" (the expansion was an eighth of
        # the kernel's cycles): MobileNetV2's stride-1 depthwise convolutions at x86-64-v3
        # (Zen 4, 1 thread, fastest of 200 in the model), kcycles, 32 at 112x112 337 -> 293,
        # 144 at 56x56 356 -> 316, 192 at 28x28 128 -> 110, 960 at 7x7 101 -> 84.
        per_step = lambda step: _ceil(self.q, step) * step    # noqa: E731  lanes computed
        self.mode = "shuffle"
        if (sh, sw, dw) == (1, 1, 1) and (qs.bits == 16 or per_step(g * vw) <= 1.05 * per_step(NV * vw)):
            self.mode = "interleaved"                        # (VNNI 14x14: 256 lanes for 224)
        elif (sh, sw) == (1, 1) and qs.bits == 16:
            self.mode = "expand"
        # Plane values: bytes, or (interleaved vpmaddwd) i16; offsets below count values.
        self.value_bytes = qs.bits // 8 if self.mode == "interleaved" else 1
        # Vectors of sums a step of the lane loop keeps: interleaved, sets of G vectors, two
        # sets for vpmaddwd's G = 2; otherwise NV, and at AVX2 width twice as many: four
        # vectors, one narrowing of four (qgemm.narrow), in place of two of two, 8 lanes of
        # ymm a short step anyway (MobileNetV2's 96 at 112x112, stride 2, 296 -> 273 kcycles
        # at x86-64-v3, Zen 4, 1 thread, fastest of 300 alone).
        self.vectors = ((g if qs.bits == 8 else 2 * g) if self.mode == "interleaved"
                        else 2 * NV if vw == 8 else NV)
        self.step = vw * self.vectors
        self.qpad = _ceil(self.q, self.step) * self.step
        reach = max(self.taps) + sw * (self.qpad - vw)       # the last lanes' first byte
        if self.mode == "interleaved":                       # vector h * G + r: from value q0 + h * G * VW + r
            reach = max(self.taps) + self.qpad - self.step + (self.vectors - 1) // g * g * vw + g - 1
            self.load = g * vw
        self.elems = _ceil(reach + vw, vw) * vw if self.mode == "expand" else 0
        # The plane, and every byte the loads of the last lanes may reach past it.
        self.plane_bytes = _align(self.value_bytes * max(
            sh * self.phase, (self.elems - vw if self.elems else reach) + self.load))
        self.elem_bytes = _align(4 * self.elems)
        self.ys_bytes = _align(self.qpad)
        # Two planes and two rows of results (emit: one channel's in use, the next one's
        # being filled).
        self.scratch = 2 * self.plane_bytes + self.elem_bytes + 2 * self.ys_bytes
        self.a_words = self.c * len(self.taps)

    def input_rows(self):
        """(phase, first plane row, end plane row, first input row) of the rows of each
        phase that hold input rows (the others are padding)."""
        spans = []
        for py in range(self.sh):
            lo = max(0, _ceil(self.pt - py, self.sh))
            hi = min(self.hq, (self.h - 1 + self.pt - py) // self.sh + 1)
            if hi > lo:
                spans.append((py, lo, hi, lo * self.sh + py - self.pt))
        return spans


# ----------------------------------------------------------------------------- compile time
def pack(node, w: np.ndarray, ws: np.ndarray, bias: np.ndarray, qs: QShape) -> np.ndarray:
    """The kernel's constant buffer (bytes): the weights as [C][KH][groups] 32-bit elements
    of G taps (i8 for VNNI, i16 for vpmaddwd; zero past KW), then the i32 corrections and
    the f32 multipliers of the C channels."""
    c, _, kh, kw = w.shape
    g = qs.group
    groups = _ceil(kw, g)
    taps = np.zeros((c, kh, groups * g), np.int16 if qs.bits == 16 else np.int8)
    taps[:, :, :kw] = w[:, 0]
    corr, mult = pack_epilogue(w.reshape(c, 1, kh * kw), ws, bias, node.inputs[0].type.quant, node.scale, qs)
    return np.concatenate([taps.view(np.int8).ravel(), corr[:c].view(np.int8), mult[:c].view(np.int8)])


def work(node, qs: QShape) -> Work:
    """Channels, split by the elements read and written, as the float depthwise kernel:
    the few integer products hardly cost more than moving the bytes."""
    geo = DepthwiseGeometry(node, qs)
    flops = 2.0 * geo.batch * geo.c * geo.oh * geo.ow * geo.kh * geo.kw
    return Work(geo.c, flops=flops, elements=geo.batch * geo.c * (geo.oh * geo.ow + geo.h * geo.w))


# ----------------------------------------------------------------------------- the kernel
def emit(k, qs: QShape) -> None:
    b, node = k.b, k.node
    geo = DepthwiseGeometry(node, qs)
    (y, _), (x, _), (packed, _) = k.outs[0], k.ins[0], k.ins[1]
    packed = b.bitcast(packed, I8.as_pointer())
    words = b.bitcast(packed, I32.as_pointer())
    corr = b.bitcast(b.gep(packed, [i64(4 * geo.a_words)]), I32.as_pointer())
    mult = b.bitcast(b.gep(packed, [i64(4 * geo.a_words + 4 * geo.c)]), F32.as_pointer())
    scratch = b.bitcast(k.scratch, I8.as_pointer())
    x_offset = node.inputs[0].type.quant.offset
    value = I8 if geo.value_bytes == 1 else I16
    pad = x_offset + qs.shift if value == I16 else (x_offset + qs.shift) & 0xFF
    flip = qs.shift == 128                           # i8 -> the u8 bits of x + 128
    # Two planes and two rows of results, a channel's each, used in turn (for_range_staged):
    # channel c + 1's plane is copied in before channel c's lanes, and channel c - 1's
    # results copied out after them, so that no load reads bytes stored just before it
    # (MobileNetV2's 960 at 7 x 7 at x86-64-v3: 35.8 -> 17.5 us, 29.6 -> 14.6 natively).
    planes = [b.bitcast(b.gep(scratch, [i64(i * geo.plane_bytes)]), value.as_pointer()) for i in range(2)]
    elems = b.bitcast(b.gep(scratch, [i64(2 * geo.plane_bytes)]), I32.as_pointer())
    rows = [b.gep(scratch, [i64(2 * geo.plane_bytes + geo.elem_bytes + i * geo.ys_bytes)]) for i in range(2)]

    def copy_in(n, c):
        image = b.mul(b.add(b.mul(n, i64(geo.c)), c), i64(geo.h * geo.w))
        values = in_turn(b, c, planes)
        for py, yq0, yq1, iy0 in geo.input_rows():
            with for_range(b, yq1, start=yq0, name="drow") as yq:
                iy = b.add(b.mul(b.sub(yq, i64(yq0)), i64(geo.sh)), i64(iy0))
                src = b.gep(x, [b.add(image, b.mul(iy, i64(geo.w)))])
                dst = b.gep(values, [b.add(b.mul(yq, i64(geo.row)), i64(py * geo.phase + geo.pl))])
                copy_bytes(b, src, dst, geo.w, flip)

    def copy_out(n, c):
        out = b.mul(b.add(b.mul(n, i64(geo.c)), c), i64(geo.oh * geo.ow))
        ys = in_turn(b, c, rows)
        with for_range(b, geo.oh, name="dout") as oy:
            copy_bytes(b, b.gep(ys, [b.mul(oy, i64(geo.wq))]), b.gep(y, [b.add(out, b.mul(oy, i64(geo.ow)))]),
                       geo.ow, False)

    for values in planes:                            # the padding; rows are copied over it
        fill(b, values, geo.plane_bytes // geo.value_bytes, pad)
    lo, hi = k.split.range(b, geo.c)
    with for_range(b, geo.batch, name="dn") as n:
        with for_range_staged(b, hi, lo, lambda c: copy_in(n, c), lambda c: copy_out(n, c), name="dc") as c:
            values = in_turn(b, c, planes)
            if geo.mode == "expand":
                plane = b.bitcast(values, I8.as_pointer())
                with for_range(b, geo.elems, step=qs.vw, name="dexp") as i:
                    v = lane_groups(b, geo, plane, i)
                    st = b.store(v, b.bitcast(b.gep(elems, [i]), v.type.as_pointer()))
                    st.align = 4
            channel_lanes(b, geo, values, elems, in_turn(b, c, rows), b.gep(words, [b.mul(c, i64(len(geo.taps)))]),
                          b.load(b.gep(corr, [c])), b.load(b.gep(mult, [c])), node.offset, saturation(node))


def lane_groups(b, geo: DepthwiseGeometry, plane, at):
    """The G values of lanes q0..q0+VW of a tap whose first byte is `at`: bytes
    at + sw * i + dw * u of the plane, one load and one constant shuffle for each chunk of
    lanes (one for all of them but at strides past 64 bytes a vector), the chunks joined, as
    VW 32-bit elements (i8 for VNNI, widened to i16 for vpmaddwd)."""
    qs, vw = geo.qs, geo.qs.vw
    load_t = ir.VectorType(I8, geo.chunk_load)
    parts = []
    for c in range(vw // geo.chunk):
        start = at if c == 0 else b.add(at, i64(geo.sw * geo.chunk * c))
        raw = b.load(b.bitcast(b.gep(plane, [start]), load_t.as_pointer()))
        raw.align = 1
        parts.append(b.shuffle_vector(raw, ir.Constant(load_t, ir.Undefined),
                                      ir.Constant(ir.VectorType(I32, len(geo.lanes)), geo.lanes)))
    v = join_vectors(b, parts)
    if qs.bits == 16:
        v = b.sext(v, ir.VectorType(I16, 2 * vw))
    return b.bitcast(v, ir.VectorType(I32, vw))


def channel_lanes(b, geo: DepthwiseGeometry, plane, elems, ys, words, corr, mult, offset: int,
                  bounds: tuple[int, int]) -> None:
    """All lanes of one channel, geo.step at a time: the tap groups' sums from the
    correction, requantized into ys and saturated to `bounds` (geo.mode says where each
    tap's groups come from)."""
    qs, vw = geo.qs, geo.qs.vw
    weights = [b.load(b.gep(words, [i64(t)])) for t in range(len(geo.taps))]
    i32v = ir.VectorType(I32, vw)
    init = splat(b, corr, vw)
    vectors, g = geo.vectors, qs.group

    def groups(q0, j, tap):
        if geo.mode == "shuffle":
            return lane_groups(b, geo, plane, b.add(b.mul(b.add(q0, i64(j * vw)), i64(geo.sw)), i64(tap)))
        if geo.mode == "expand":
            base, at = elems, b.add(q0, i64(j * vw + tap))
        else:                   # interleaved: vector j = h * G + r holds lanes q0 + h * G * VW + r + G * k
            base, at = plane, b.add(q0, i64(j // g * g * vw + j % g + tap))
        v = b.load(b.bitcast(b.gep(base, [at]), i32v.as_pointer()))
        v.align = 1
        return v

    with for_range(b, geo.qpad, step=geo.step, name="dq") as q0:
        sums = [init] * vectors
        for tap, weight in zip(geo.taps, weights):
            for j in range(vectors):
                sums[j] = dot_groups(b, qs, sums[j], groups(q0, j, tap), weight)
        # Narrowed together (qgemm.narrow), in place of a vpmovsdb, a max, a min and an
        # offset a vector: MobileNetV2's 144 channels at 56 x 56 175 -> 133 kcycles, 32 at
        # 112 x 112 160 -> 130 (Zen 4, 1 thread, fastest of 300 alone).
        v = narrow(b, [requantize_unsaturated(b, v, mult) for v in sums], bounds, offset,
                   interleave=g if geo.mode == "interleaved" else 1)
        st = b.store(v, b.bitcast(b.gep(ys, [q0]), v.type.as_pointer()))
        st.align = 1


def fill(b, dst, count: int, value: int) -> None:
    """dst[0:count] = value (dst's i8 or i16 values), in vectors of COPY bytes (count
    values a whole number of them)."""
    n = COPY // (dst.type.pointee.width // 8)
    assert count % n == 0
    vt = ir.VectorType(dst.type.pointee, n)
    fill = ir.Constant(vt, [value] * n)
    with for_range(b, count, step=n, name="dfill") as i:
        st = b.store(fill, b.bitcast(b.gep(dst, [i]), vt.as_pointer()))
        st.align = 1


def copy_bytes(b, src, dst, count: int, flip: bool) -> None:
    """dst[0:count] = src[0:count] (each byte's top bit flipped, for `flip`: i8 -> the u8 of
    x + 128; widened, for dst's i16 values), in vectors of COPY bytes, the last of them
    overlapping the one before when count is not a multiple; a shorter run in two vectors
    of the largest power of two it holds, overlapping."""
    wide = dst.type.pointee == I16

    def move(at: int, size: int, index=None):
        vt = ir.VectorType(I8, size)
        off = i64(at) if index is None else index
        v = b.load(b.bitcast(b.gep(src, [off]), vt.as_pointer()))
        v.align = 1
        if flip:
            v = b.xor(v, ir.Constant(vt, [-128] * size))
        if wide:
            v = b.sext(v, ir.VectorType(I16, size))
        st = b.store(v, b.bitcast(b.gep(dst, [off]), v.type.as_pointer()))
        st.align = 1

    if count >= COPY:
        full = count // COPY
        if full <= 4:
            for i in range(full):
                move(i * COPY, COPY)
        else:
            with for_range(b, full * COPY, step=COPY, name="dcopy") as i:
                move(0, COPY, i)
        if count % COPY:
            move(count - COPY, COPY)
        return
    # Two moves of the largest power of two that fits, the second ending at the last byte
    # (overlapping the first), in place of one move per set bit of count: a 14-byte row in
    # 2 where it took 3 (8, 4 and 2).
    size = 1 << (count.bit_length() - 1)
    move(0, size)
    if count > size:
        move(count - size, size)
