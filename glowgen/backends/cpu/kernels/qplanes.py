"""The planes int8 products read (qlinalg.py): the input of one image laid out as a
product's tiles load it, G channels interleaved in each 32-bit element, the activations as B
holds them (u8 bits of v + 128 for VNNI, i16 otherwise).

- build_conv_plane: padded with the real zero, rows and columns dealt by stride into phase
  planes, every tap an offset (in vectors a row at a time where it can: build_plane_rows);
- interleave_channels: the input itself, channels interleaved pixel for pixel (a 1x1
  convolution at unit stride), whole or a band of pixels at a time;
- build_im2col_plane and build_row_element_plane: an element of G values of a window row
  per output pixel, for convolutions of few channels (ResNet's stem);
- build_matmul_plane: a matrix product's rows, transposed;
- build_own_plane: the part of any of them a task's own output pixels read.

What a product's geometry asks of its plane (its phases, its element groups, its strides)
is qlinalg.Geometry's; which plane a product reads, and when each task builds it, is
qlinalg's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from ..llvmutil import I8, I16, I32, I64, for_range, i64, target_has
from ..qgemm import QShape
from ..vectors import join_vectors, masked_load, masked_store, splat
from .common import clamp

if TYPE_CHECKING:
    from .qlinalg import Geometry

_ceil = lambda a, b: -(-a // b)     # noqa: E731


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


def _store_elem(b, qs: QShape, plane_bytes, at_elem, t: int, value):
    """Store channel t of 32-bit element `at_elem` of the plane."""
    et = qs.elem
    t = t if not isinstance(t, int) else i64(t)
    p = b.gep(b.bitcast(plane_bytes, et.as_pointer()), [b.add(b.mul(at_elem, i64(4 // (qs.bits // 8))), t)])
    b.store(value, p)


def pad_element(qs: QShape, x_offset: int) -> int:
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
            part = b.shl(b.zext(v, I32), ir.Constant(I32, qs.bits * t)) if t else b.zext(v, I32)
            word = part if word is None else b.or_(word, part)
        b.store(word, b.gep(dst, [xq]))


# Pixels a step of interleave_channels takes from each of its G channels: 64, or with
# AVX-512 VBMI 32, where LLVM joins the four channels' runs two by two (a 32-byte load and
# one inserted) and deals each 64-byte result with one two-source byte shuffle (`vpermt2b`):
# 2 shuffles for 32 pixels, where 64 pixels took 8 and 4 blends.  ResNet-50 int8, Emerald
# Rapids, one thread, alternating in one process: its interleaved planes' steps 2-4 us
# faster each (the 256 -> 64 1x1s at 56 x 56 -4.0, -4.3), the per-step sum -46 us; the
# AVX2 code (x86-64-v3), whose shuffles stay within 16-byte lanes, measured the same either
# way (MobileNetV2 +1.4, ResNet-50 -14 us of 42.9 ms) and keeps 64, dealt 32 at a time by
# unpacks (_interleave_by_unpacks).
INTERLEAVE_PIXELS = 64
INTERLEAVE_PIXELS_VBMI = 32


def _interleave_pixels(b) -> int:
    """Pixels a step of interleave_channels takes on the module's target."""
    return INTERLEAVE_PIXELS_VBMI if target_has(b.module, "avx512vbmi") else INTERLEAVE_PIXELS


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
    """Bytes of a band of interleaves_in_bands' plane: every element row's pixels (those
    past the plane's own that AMX tiles read: Geometry.plane_rows)."""
    return _ceil(4 * geo.plane_rows * interleave_band_pixels(geo.qs), 64) * 64


def interleaves_in_bands(geo: Geometry) -> bool:
    """Whether an interleaved plane (interleaves_rows) whose weights stay in cache over
    the panels (qlinalg.Geometry.panels_outer) is built a band of its panels at a time into the
    task's own scratch, each band's tiles computed before the next: the plane whole went
    out to L2 and back (ResNet-50's 256 -> 64 at 56 x 56, 800 KB)."""
    return interleaves_rows(geo) and geo.panels_outer and geo.plane_bytes >= INTERLEAVE_BANDS_MIN_BYTES


def interleave_channels(b, geo: Geometry, x, n, plane, first, last, pixels=None, stride=None):
    """build_conv_plane where interleaves_rows: element groups first..last of image n, each
    G whole channel images interleaved (or their `pixels` only, (lo, hi) i64 values: a
    task's own, qlinalg.owns_pixels; `stride`: elements from one group's to the next's, by
    default Geometry.group_stride, a band's in interleaves_in_bands), _interleave_pixels of
    each at a time (G vector loads, one shuffle, which LLVM makes byte permutes), then 16 at
    a time, the last pixels one element at a time.  In place of build_conv_plane's loop,
    element by element (each byte widened into its place in a 32-bit lane: 14 instructions
    for 16 elements, here 30 for 64): MobileNetV2's 144 -> 24 1x1 at 56x56 166 -> 155
    kcycles, 32 -> 16 at 112x112 132 -> 120, 576 -> 96 at 14x14 (features in the lanes) 139
    -> 131 (Zen 4, 1 thread, fastest of 300 alone)."""
    qs, g = geo.qs, geo.qs.group
    npix = geo.h * geo.w
    with for_range(b, last, start=first, name="ic") as e:
        rows = [b.gep(x, [b.mul(b.add(b.mul(n, i64(geo.c)), b.add(b.mul(e, i64(g)), i64(t))), i64(npix))])
                for t in range(g)]
        dst = b.bitcast(b.gep(plane, [b.mul(e, i64(stride or geo.group_stride))]), qs.elem.as_pointer())
        done, stop = pixels or (i64(0), i64(npix))
        for vl in (_interleave_pixels(b), 16):
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
    if interleaves_by_unpacks(b, qs, vl):
        run = UNPACK_PIXELS if vl % UNPACK_PIXELS == 0 else 16
        for at in range(0, vl, run):
            _interleave_by_unpacks(b, qs, rows, dst, p if at == 0 else b.add(p, i64(at)), run)
        return
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


# Pixels of _interleave_by_unpacks: a 32-byte vector of each of the four channels.
UNPACK_PIXELS = 32


def interleaves_by_unpacks(b, qs: QShape, vl: int) -> bool:
    """Whether four channels' runs of `vl` bytes are interleaved by unpacks_in_order (a
    multiple of 16 pixels, on a target without AVX-512 VBMI's byte permutes: AVX2's
    shuffles stay within 16-byte lanes) in place of LLVM's lowering of one shuffle."""
    return (qs.bits == 8 and qs.group == 4 and vl % 16 == 0
            and not target_has(b.module, "avx512vbmi"))


def unpacks_in_order(b, vs: list) -> list:
    """Four byte vectors of 16 or 32 (v_t: channel t's pixels) interleaved into 32-bit
    elements of one pixel's four channels each: [the i32 vectors of pixels 0..3, 4..7, ...]
    (4 of 4 elements, or of 8), by the shuffles AVX2 has: bytes of rows 0/1 and 2/3
    unpacked (low and high 8 of each 16-byte lane: `vpunpck[lh]bw`), those pairs unpacked
    as 16-bit values (`vpunpck[lh]wd`: each 16-byte lane 4 whole elements), then, for 32
    bytes, the lanes put in order (`vperm2i128`): 12 shuffles for 128 bytes, where LLVM's
    lowering of one shuffle of the four rows took 56 for 256 (unpacks, 16-byte inserts,
    widenings and blends)."""
    n = vs[0].type.count
    lanes = n // 16

    def unpack(x, y, high: bool, per_lane: int):
        half = per_lane // 2
        order = [src + lane * per_lane + i + (half if high else 0)
                 for lane in range(lanes) for i in range(half) for src in (0, lanes * per_lane)]
        return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, len(order)), order))

    h16, w32 = ir.VectorType(I16, n // 2), ir.VectorType(I32, n // 4)
    pairs = [unpack(vs[0], vs[1], h, 16) for h in (False, True)] + [unpack(vs[2], vs[3], h, 16) for h in (False, True)]
    lo01, hi01, lo23, hi23 = (b.bitcast(v, h16) for v in pairs)
    # Lane L of quads[k]: pixels 16 L + 4 k .. 16 L + 4 k + 3, their four channels each.
    quads = [b.bitcast(unpack(x, y, h, 8), w32) for x, y in ((lo01, lo23), (hi01, hi23)) for h in (False, True)]
    if lanes == 1:
        return quads
    return [b.shuffle_vector(quads[x], quads[y], ir.Constant(
        ir.VectorType(I32, 8), [4 * lane + i for i in range(4)] + [8 + 4 * lane + i for i in range(4)]))
        for x, y, lane in ((0, 1, 0), (2, 3, 0), (0, 1, 1), (2, 3, 1))]


def store_in_order(b, pieces: list, dst):
    """unpacks_in_order's vectors stored one after the other from dst (i8*), each on its
    own (joined, LLVM would make them one shuffle again)."""
    out = b.bitcast(dst, pieces[0].type.as_pointer())
    for k, v in enumerate(pieces):
        st = b.store(v, b.gep(out, [i64(k)]))
        st.align = 4


def _interleave_by_unpacks(b, qs: QShape, rows, dst, p, run: int):
    """_interleave_step of `run` (UNPACK_PIXELS or 16) pixels from four channel rows of bytes
    (unpacks_in_order).  Single layers, Emerald Rapids, one thread, per-step minima
    alternating in one process: 144 -> 24 at 56 x 56 170 -> 156 us at x86-64-v3 (138 ->
    114 at x86-64-v4: AVX-512 without VBMI), 192 -> 32 at 28 x 28 82 -> 73 (57 -> 49)."""
    b8 = ir.VectorType(I8, run)
    vs = []
    for row in rows:
        v = b.load(b.bitcast(b.gep(row, [p]), b8.as_pointer()))
        v.align = 1
        vs.append(_elem(b, qs, v))
    store_in_order(b, unpacks_in_order(b, vs), b.gep(dst, [b.mul(p, i64(qs.group))]))


# Output pixels a step of build_im2col_plane's vector loop takes.
IM2COL_PIXELS = 16
# Geometry.row_elements: at most this many times the elements of a plain im2col plane.
ROW_ELEMENTS_MAX_GROWTH = 1.15
# Panels of a band of row_elements' plane (qlinalg.quantized_product): ResNet's stem 4 x 5.4 KB.
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
    values, multiples of NR) builds only those (a band: qlinalg.quantized_product).  `rows`: as
    build_im2col_plane's."""
    qs, g, v = geo.qs, geo.qs.group, IM2COL_PIXELS
    kh, _, dh, _ = geo.window
    runs = geo.row_values // g
    raw_t, mask_t = ir.VectorType(I8, 64), ir.VectorType(ir.IntType(1), 64)
    raw_pad = _raw_pad(b, pad, 64)

    def deal(offset: int):
        """Byte `offset` + sw * p + t of a load to value t of pixel p's element."""
        return ir.Constant(ir.VectorType(I32, g * v), [offset + geo.sw * p + t for p in range(v) for t in range(g)])
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

    def deal_into(e, q, raw, offset: int = 0):
        """The 64 input bytes `raw` (from byte `offset` on) dealt into element e of the 16
        pixels from q."""
        word = _elem(b, qs, b.shuffle_vector(raw, ir.Constant(raw_t, ir.Undefined), deal(offset)))
        st = b.store(word, b.bitcast(b.gep(plane, [at(e, q)]), word.type.as_pointer()))
        st.align = 4

    def step(e, row, ok, col0, q, ox):
        """The 16 pixels from q (= oy * OW + ox) of element e, from input row `row`."""
        col = b.add(col0, b.mul(ox, i64(geo.sw)))
        # Bytes col + i inside [0, W): i in [-col, W - col).
        inside = b.and_(first_bytes(b.sub(i64(geo.w), col)), b.not_(first_bytes(b.sub(i64(0), col))))
        mask = b.bitcast(b.select(ok, inside, i64(0)), mask_t)
        deal_into(e, q, masked_load(b, b.gep(x, [b.add(row, col)]), mask, raw_pad))

    def load_at(row, ok, col: int):
        """step's 64 bytes of input row `row` from column col, known now: so is its mask of
        bytes inside."""
        inside = sum(1 << i for i in range(64) if 0 <= col + i < geo.w)
        if inside == 0:
            return raw_pad
        mask = b.bitcast(b.select(ok, ir.Constant(I64, inside - (1 << 64) if inside >= 1 << 63 else inside),
                                  i64(0)), mask_t)
        return masked_load(b, b.gep(x, [b.add(row, i64(col))]), mask, raw_pad)

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
    shares_loads = geo.sw * (v - 1) + runs * g <= 64
    if geo.panel_major:
        # Rows of whole steps (a step's pixels in one row), every element's row runs and steps
        # unrolled: their columns, and so their masks, known now.  (A share first..last of
        # the elements, a phased plane's, is taken by whole window rows: every row once.)
        oy_first, oy_last = b.udiv(q_lo, i64(geo.ow)), b.udiv(b.sub(q_hi, i64(1)), i64(geo.ow))
        with for_range(b, b.udiv(last, i64(runs)), start=b.udiv(first, i64(runs)), name="re") as er, \
                for_range(b, b.add(oy_last, i64(1)), start=oy_first, name="ry") as oy:
            row, ok, _ = input_row(b.mul(er, i64(runs)), oy)
            for ox in range(0, geo.ow, v):
                q = b.add(b.mul(oy, i64(geo.ow)), i64(ox))
                with b.if_then(b.and_(b.icmp_signed(">=", q, q_lo), b.icmp_signed("<", q, q_hi))):
                    # Every run of the window row from one load where its values lie in it
                    # (ResNet's stem: 38 of the 64 bytes for its two runs of 4), in place of a
                    # masked load a run: its 7x7 stem at one thread 456 -> 451 us (ResNet-18,
                    # Emerald Rapids, fastest of 3 x 100 runs).
                    shared = load_at(row, ok, -geo.pl + ox * geo.sw) if shares_loads else None
                    for j in range(runs):
                        e = b.add(b.mul(er, i64(runs)), i64(j))
                        if shared is not None:
                            deal_into(e, q, shared, j * g)
                        else:
                            deal_into(e, q, load_at(row, ok, j * g - geo.pl + ox * geo.sw))
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
