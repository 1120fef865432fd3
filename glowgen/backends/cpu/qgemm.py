"""An int8 register-blocked matrix product with exact i32 sums, for QuantizedConv and
QuantizedMatMul (kernels/qlinalg.py).

    C[M, Q] = A[M, K] @ B[K, Q]     A: i8 weights (constant), B: the activations

A lane of a vector register holds one column q of C (an output pixel) and sums, in one
instruction, the products of a group of G consecutive k:

  "vnni"    AVX-512 VNNI `vpdpbusd`: G = 4 bytes, B as u8 (the activation + 128), A as s8;
            4 products of at most 255 * 127 summed exactly into i32 lanes, no saturation;
  "ubsw"    AVX2 (or AVX-512BW without VNNI) with weights of 7 bits, in [-64, 63]: VNNI's
            layout, its `vpdpbusd` emulated as `vpmaddubsw` (u8 x s8 pairs summed into i16:
            at most 2 * 255 * 64 = 32640, so exact, never saturated), `vpmaddwd` with ones
            (pairs of those into i32) and `vpaddd` (MLAS's QgemmU8S8KernelAvx2 does the same);
  "madd16"  AVX2 (or AVX-512BW without VNNI) `vpmaddwd`: G = 2 values widened to i16 (the
            activation itself, A's weights); two 16-bit products summed exactly into i32:
            for weights outside [-64, 63], whose u8 x s8 pair sums could saturate.

`ubsw` makes 32 products in 3 instructions where `madd16` makes 16 in 2, and reads half the
bytes of B and A; on Zen 4 at ymm width (a register-only loop, 6 x 2 tile) it measured 72-77
G products/s against madd16's 44-46 (f32 FMA: 42-45).  So each
element of A and of B is 32 bits: G values of consecutive k.  A is packed at compile time
in blocks of MR rows, [ceil(M / MR)][KG][MR] (pack_a), B is whatever the caller lays out
with a constant offset per k group (qlinalg: a padded input plane read in place); the tile
keeps MR x NV vectors of i32 sums, broadcasting A's group for a row and loading B's vectors.

The shift of B to u8 is folded into a per-row correction computed at compile time,
corr[m] = b[m] - (x_offset + shift) * sum_k A[m, k], so that C + corr is exactly
sum_k (x - x_offset) * w + b.  Requantization runs in f32 in the store: (C + corr) as f32
times the row's multiplier x_scale * w_scale[m] / scale, rounded halves to even, plus the
result's offset, saturated to i8 (reference.primitives.requantize computes the same).  The
tile's sums start from corr (emit_tile's init), and its vectors are saturated to i8 four
at a time (narrow).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from llvmlite import ir

from ...reference.primitives import requantize_multipliers, residual_constant, residual_ratio
from . import amx
from .llvmutil import F32, I8, I16, I32, carried_loop, i64, intrinsic, round_to_i32
from .vectors import masked_load, prefetch, splat

# The int8 strategies by target (`choose_qshape`): (group, element bits, shift, vector i32
# lanes, MR, NV).
QSHAPES = {
    "vnni": (4, 8, 128, 16, 8, 2),       # 16 zmm accumulators
    "amx": (4, 8, 128, 16, 32, 2),       # AMX tiles, VNNI's plane: 2 x 2 tiles of sums (amx.py)
    "ubsw-512": (4, 8, 128, 16, 8, 2),   # AVX-512BW without VNNI, 7-bit weights
    "madd16-512": (2, 16, 0, 16, 8, 2),  # AVX-512BW without VNNI
    "ubsw": (4, 8, 128, 8, 4, 2),        # AVX2, 7-bit weights: 8 ymm accumulators (below)
    "madd16": (2, 16, 0, 8, 6, 2),       # AVX2: 12 ymm accumulators
}
# ubsw's AVX2 tile: 4 x 2 vectors of sums leave room for the 2 of B, the ones, the broadcast
# weights and the pair sums in 16 ymm; 6 x 2 (madd16's) spilled sums to the stack.  Single
# int8 3x3 convolutions at x86-64-v3, one thread, ms (min of 30; f32 / madd16 / ubsw 6x2,
# 5x2, 4x2, 3x3, 4x3): 64 at 56x56 2.21 / 1.89 / 1.32, 1.28, 1.25, 1.33, 1.31;
# 128 at 28x28 2.24 / 1.82 / 1.38, 1.27, 1.24, 1.27, 1.25; 256 at 14x14 2.37 / 1.76 / 1.32,
# 1.31, 1.26, 1.38, 1.38; 512 at 7x7 2.65 / 2.15 / 1.56, 1.53, 1.53, 1.68, 1.69; ResNet's
# 7x7 stem from 3 channels 2.34 / 2.56 / 20.6 (49 unrolled taps spilling), 3.38, 2.56, 2.84, 3.23.
# The weights `vpmaddubsw` sums exactly in pairs with any u8 (2 * 255 * 64 <= 32767).
UBSW_WEIGHTS = (-64, 63)


class QShape:
    def __init__(self, kind: str):
        self.kind = kind
        self.group, self.bits, self.shift, self.vw, self.mr, self.nv = QSHAPES[kind]

    @property
    def nr(self) -> int:
        return self.vw * self.nv

    @property
    def elem(self) -> ir.Type:
        """The type of one activation value in B's groups (u8 as i8 bits, or i16)."""
        return I8 if self.bits == 8 else I16


def choose_qshape(features: str) -> Optional[QShape]:
    """The int8 path for the target's features, or None (plain loops)."""
    have = set((features or "").split(","))
    if "+avx512vnni" in have and "+avx512bw" in have:
        return QShape("vnni")
    if "+avx512bw" in have:
        return QShape("madd16-512")
    if "+avx2" in have:
        return QShape("madd16")
    return None


def for_weights(qs: QShape, *weights: np.ndarray) -> QShape:
    """The strategy for a product with these constant weights on the target whose widest
    int8 path is `qs` (choose_qshape): `ubsw` in place of `madd16` when every weight lies
    in UBSW_WEIGHTS (the quantizer's 7-bit weights: fast_weight_bits), so that its pair
    sums cannot saturate; otherwise `qs` itself (exact for any i8 weights)."""
    if not qs.kind.startswith("madd16"):
        return qs
    lo, hi = UBSW_WEIGHTS
    if all(w.size == 0 or (int(w.min()) >= lo and int(w.max()) <= hi) for w in weights):
        return QShape(qs.kind.replace("madd16", "ubsw"))
    return qs


def fast_weight_bits(features: str) -> int:
    """The bits of int8 weights the target's product multiplies fastest: 7 where it lacks
    VNNI (`ubsw` takes weights in UBSW_WEIGHTS), else 8."""
    qs = choose_qshape(features)
    return 7 if qs is not None and qs.kind.startswith("madd16") else 8


def pack_a(w: np.ndarray, taps: int, qs: QShape, mr: Optional[int] = None) -> np.ndarray:
    """Weights [M, C, taps] (i8) -> [ceil(M / MR)][ceil(C / G) * taps][MR][G] in the element
    type of the product (i8 or i16), the group's G channels of one tap together; k runs
    over (channel group, tap).  Rows past M and channels past C are zero.  `mr` (at most
    MR) replaces MR: the rows of a tile (emit_tile's `rows`)."""
    m, c, _ = w.shape
    g, mr = qs.group, mr or qs.mr
    mp, cp = -(-m // mr) * mr, -(-c // g) * g
    padded = np.zeros((mp, cp, taps), np.int16 if qs.bits == 16 else np.int8)
    padded[:m, :c] = w
    # [MB, MR, CG, G, T] -> [MB, CG, T, MR, G]
    if qs.kind == "amx":
        return amx.pack_a(padded, mr, g)
    a = padded.reshape(mp // mr, mr, cp // g, g, taps).transpose(0, 2, 4, 1, 3)
    return np.ascontiguousarray(a)


def pack_epilogue(w: np.ndarray, ws: np.ndarray, b: np.ndarray, x_quant, scale: float,
                  qs: QShape) -> tuple[np.ndarray, np.ndarray]:
    """Per row (padded to whole MR blocks): the i32 correction b - (x_offset + shift) *
    sum_k w and the f32 multiplier of the requantization."""
    m = w.shape[0]
    mp = -(-m // qs.mr) * qs.mr
    corr = np.zeros(mp, np.int64)
    corr[:m] = b.astype(np.int64) - (x_quant.offset + qs.shift) * w.reshape(m, -1).astype(np.int64).sum(1)
    assert np.all(np.abs(corr) < 2 ** 31), "bias correction out of i32 range"
    mult = np.zeros(mp, np.float32)
    mult[:m] = requantize_multipliers(x_quant.scale, ws, scale)
    return corr.astype(np.int32), mult


def pack_offsets(node, pad_element: int) -> list[np.ndarray]:
    """The tail of a packed product's constants: the result's offset (f32) and the padding
    element of its plane (i32), as bytes; PackedConstants reads them back in the kernel."""
    return [np.array([node.offset], np.float32).view(np.int8),
            np.array([pad_element], np.int32).view(np.int8)]


class PackedConstants:
    """A packed product's constants as its kernel reads them: the weights (i32 elements,
    `a_bytes` of them), then per row (`rows`) the i32 bias corrections and the f32
    multipliers (pack_epilogue), then the result's offset (f32, and converted to i32) and
    the i32 after it (pack_offsets: the plane's padding element, or the input's offset)."""

    def __init__(self, b: ir.IRBuilder, packed, a_bytes: int, rows: int):
        packed = b.bitcast(packed, I8.as_pointer())
        self.weights = b.bitcast(packed, I32.as_pointer())
        self.corr = b.bitcast(b.gep(packed, [i64(a_bytes)]), I32.as_pointer())
        self.mult = b.bitcast(b.gep(packed, [i64(a_bytes + 4 * rows)]), F32.as_pointer())
        at = a_bytes + 8 * rows
        self.y_offset = b.load(b.bitcast(b.gep(packed, [i64(at)]), F32.as_pointer()))
        self.tail = b.load(b.bitcast(b.gep(packed, [i64(at + 4)]), I32.as_pointer()))
        self.y_offset_i32 = b.fptosi(self.y_offset, I32)


def _vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def dot_groups(b: ir.IRBuilder, qs: QShape, acc, bvec, aval, broadcast_u8: bool = False):
    """acc + the group sums of B's vector (i32 lanes of G values) times A's broadcast group.
    With VNNI and ubsw, B holds the u8 values and A the s8 ones, or the other way round
    when `broadcast_u8`."""
    vw = qs.vw
    avec = splat(b, aval, vw)
    u8, s8 = (avec, bvec) if broadcast_u8 else (bvec, avec)
    if qs.kind == "vnni":
        fn = intrinsic(b.module, "llvm.x86.avx512.vpdpbusd.512", _vec(I32, 16), [_vec(I32, 16)] * 3)
        return b.call(fn, [acc, u8, s8])
    h = _vec(I16, 2 * vw)
    name = "llvm.x86.avx512.pmaddw.d.512" if vw == 16 else "llvm.x86.avx2.pmadd.wd"
    madd = intrinsic(b.module, name, _vec(I32, vw), [h, h])
    if qs.kind.startswith("ubsw"):
        q = _vec(I8, 4 * vw)
        name = "llvm.x86.avx512.pmaddubs.w.512" if vw == 16 else "llvm.x86.avx2.pmadd.ub.sw"
        pairs = b.call(intrinsic(b.module, name, h, [q, q]), [b.bitcast(u8, q), b.bitcast(s8, q)])
        return in_register(b, b.add(acc, b.call(madd, [pairs, ir.Constant(h, [1] * (2 * vw))])))
    return in_register(b, b.add(acc, b.call(madd, [b.bitcast(bvec, h), b.bitcast(avec, h)])))


# Whether a product prefetches the weights of its next tile (weights_prefetch).
PREFETCH_NEXT_WEIGHTS = True


def weights_prefetch(b: ir.IRBuilder, qs: QShape, step_bytes: int, current, nxt, index, groups: int,
                     tiles: int, spread: bool = True):
    """The emit_tile `prefetch` callback of the `index`-th (i64, from 0) of the `tiles` tiles
    that read the block of weights at `current` (`groups` steps of `step_bytes`), for the
    block after it at `nxt` (both i32*): spread_weights with 512-bit products (where
    `spread`), else next_weights in the first tile; None where PREFETCH_NEXT_WEIGHTS is off."""
    if not PREFETCH_NEXT_WEIGHTS:
        return None
    i8p = I8.as_pointer()
    if qs.vw == 16 and spread:
        return spread_weights(b, step_bytes, b.bitcast(nxt, i8p), index, groups, tiles)
    first = b.icmp_signed("==", index, i64(0))
    return next_weights(b, step_bytes, b.bitcast(b.select(first, nxt, current), i8p))


def spread_weights(b: ir.IRBuilder, step_bytes: int, nxt, block, groups: int, blocks: int):
    """An emit_tile `prefetch` callback for the `block`-th (i64, from 0) of the `blocks` tiles
    that read one block of weights of `groups` steps of `step_bytes`: the block after it,
    `nxt` (i8*), prefetched into L2, a slice in each tile (its own lines at each step), so
    that all of them arrive over all the tiles.  With 512-bit products (AVX-512), in place of
    next_weights: a block of ResNet's 3x3 512 -> 512 at 7 x 7, 147 KB (32 features in the
    lanes), came from L3 into L1 during the first of its 7 tiles.  Emerald Rapids, one thread,
    sums of per-step minima: ResNet-50's 7 x 7 layers 2.75 -> 2.20 ms (its two 3x3 512s 958 ->
    740 us), the model 15.79 -> 15.15 ms; ResNet-18 6.74 -> 6.28; two threads ResNet-50 12.33
    -> 11.93.  At x86-64-v3 it measured no better than next_weights."""
    per = max(1, -(-step_bytes // (64 * blocks)))        # lines a step
    base = b.gep(nxt, [b.mul(b.mul(block, i64(groups)), i64(64 * per))])

    def ahead(g):
        at = b.gep(base, [b.mul(g, i64(64 * per))])
        for i in range(per):
            prefetch(b, b.gep(at, [i64(64 * i)]), False, 2)
    return ahead


def next_weights(b: ir.IRBuilder, step_bytes: int, base):
    """An emit_tile `prefetch` callback: at step g, the lines of bytes g * step_bytes ..
    (g + 1) * step_bytes of the weights at `base` (i8*), into L1.  A product's tiles read
    their block of weights once from L3 or memory, in its first tile, then from L1 or L2:
    that first tile, given the next block's address, brings it in while it computes (the
    others, given their own, cost a prefetch that hits).  Past L2 (R50's int8 weights, 25
    MB, against 2 MB of L2 on an Emerald Rapids core), the first tile waited on L3: 1x1
    512 -> 2048 @7 took 0.28 ms in ResNet-50 against 0.17 alone."""
    lines = max(1, -(-step_bytes // 64))

    def ahead(g):
        at = b.gep(base, [b.mul(g, i64(step_bytes))])
        for i in range(lines):
            prefetch(b, b.gep(at, [i64(64 * i)]), False)
    return ahead


def in_register(b: ir.IRBuilder, v):
    """v, through an empty inline assembly statement: a sum LLVM cannot reassociate with the
    additions after it.  Left free, it summed a tile's products tap by tap into trees of
    temporaries (acc + ((p1 + p2) + (p3 + p4)) ...) which with the tile's accumulators
    overflowed the 16 ymm registers and spilled sums to the stack in every step."""
    asm = ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=v,0", side_effect=False)
    return b.call(asm, [v])


# Channel groups x taps of a tile unrolled whole, in place of emit_tile's loop over the groups:
# the 1x1s from few channels, whose loop ran 4-8 times a tile.  MobileNetV2 int8, Emerald
# Rapids, one thread, alternating in one process, sums of per-step minima: at x86-64-v3
# 4903 -> 4866 and 4656 -> 4607 us (its 24 -> 144 at 56 x 56 186 -> 178), natively 1441 ->
# 1428; ResNet-50 7221 -> 7165.
UNROLLED_STEPS = 8


def emit_tile(b: ir.IRBuilder, qs: QShape, groups: int, taps: list[int], a_block, b_base,
              group_stride: int, store: Callable, name: str = "qt", rows: Optional[int] = None,
              broadcast_u8: bool = False, a_at: Optional[Callable] = None,
              init: Optional[Callable] = None, vectors: Optional[int] = None,
              prefetch: Optional[Callable] = None) -> None:
    """One MR x NR tile: for each of `groups` channel groups (a run-time loop) and each tap
    (unrolled), B's NV vectors at b_base + group * group_stride + tap offset + j * VW (i32
    elements) meet A's MR broadcast groups at a_block[(group * taps + t) * MR + i].  Then
    store(i, j, sums) for each of the MR x NV vectors of i32 sums.  `rows` (at most MR)
    replaces MR; `broadcast_u8`: A holds the u8 values (_dot); `a_at(group, t, i)`, when
    given, is the pointer to A's group for row i and tap t in place of a_block's;
    `init(i, j)`, when given, the i32 vector (i, j)'s sums start from (in place of zeros: a per-row bias
    added there costs nothing, where added to the sums it is one instruction a vector);
    `vectors` (at most NV) replaces NV: the vectors of B a tile takes; `prefetch(g)`, when
    given, is called at each step g of the loop (to emit prefetches of what later tiles read)."""
    vw, mr, nv = qs.vw, rows or qs.mr, vectors or qs.nv
    vt = _vec(I32, vw)
    zero = ir.Constant(vt, [0] * vw)
    starts = [[init(i, j) if init is not None else zero for j in range(nv)] for i in range(mr)]

    def step(g, cur):
        """The sums after channel group g (an i64 value), from `cur`."""
        cur = [list(row) for row in cur]
        bg = b.gep(b_base, [b.mul(g, i64(group_stride))])
        ag = b.gep(a_block, [b.mul(g, i64(len(taps) * mr))]) if a_at is None else None
        if prefetch is not None:
            prefetch(g)
        for t, off in enumerate(taps):
            bvecs = []
            for j in range(nv):
                p = b.bitcast(b.gep(bg, [i64(off + j * vw)]), vt.as_pointer())
                v = b.load(p)
                v.align = 4
                bvecs.append(v)
            for i in range(mr):
                av = b.load(a_at(g, t, i) if a_at is not None else b.gep(ag, [i64(t * mr + i)]))
                for j in range(nv):
                    cur[i][j] = dot_groups(b, qs, cur[i][j], bvecs[j], av, broadcast_u8)
        return cur

    if groups * len(taps) <= UNROLLED_STEPS:
        cur = starts
        for g in range(groups):
            cur = step(i64(g), cur)
    else:
        cur = carried_loop(b, 0, groups, starts, step, name=name, index="g")
    for i in range(mr):
        for j in range(nv):
            store(i, j, cur[i][j])


def requantize(b: ir.IRBuilder, sums, mult, offset: int, corr=None, bounds=(-128, 127), wide: bool = False,
               residual=None):
    """i32 sums (a scalar, or a vector with `mult` and `corr` per lane or for all lanes) -> i8:
    (sums + corr) as f32 times mult, rounded halves to even, + offset (an int, or an f32
    value read at run time), saturated to `bounds` (the product's: reference.primitives.saturation).
    `wide`: the saturated values as i32 (for `narrow`).  `residual`: (Residual, its values as
    f32: Residual.values) joined to the scaled sums before the rounding (Residual.join)."""
    vw = sums.type.count if isinstance(sums.type, ir.VectorType) else None
    ft, it, qt = (F32, I32, I8) if vw is None else (_vec(F32, vw), _vec(I32, vw), _vec(I8, vw))

    def lanes(v):
        return v if vw is None or isinstance(v.type, ir.VectorType) else splat(b, v, vw)

    def const(x: float):
        return ir.Constant(ft, x if vw is None else [x] * vw)

    if corr is not None:
        sums = b.add(sums, lanes(corr))
    f = scaled_sums(b, b.sitofp(sums, ft), lanes(mult), residual)
    rnd = intrinsic(b.module, "llvm.roundeven." + ("f32" if vw is None else f"v{vw}f32"), ft, [ft])
    f = b.fadd(b.call(rnd, [f]), const(float(offset)) if isinstance(offset, int) else lanes(offset))
    lo, hi = const(float(bounds[0])), const(float(bounds[1]))
    f = b.select(b.fcmp_ordered(">", f, hi), hi, f)
    f = b.select(b.fcmp_ordered("<", f, lo), lo, f)
    r = b.fptosi(f, it)
    return r if wide else b.trunc(r, qt)


def scaled_sums(b: ir.IRBuilder, sums, mult, residual=None):
    """f32 sums times mult (values or vectors alike), or with a residual (Residual, its
    values as f32) joined to them: requantize's and requantize_unsaturated's value before
    the rounding."""
    if residual is None:
        return b.fmul(sums, mult)
    return residual[0].join(b, sums, mult, residual[1])


# |sums * mult| below this converts to i32 exactly with room for the offset: the
# precondition of requantize_unsaturated, checked at compile time (products_in_range).
IN_RANGE = 2.0 ** 30


def products_in_range(w: np.ndarray, corr: np.ndarray, mult: np.ndarray, node=None) -> bool:
    """Whether every row's sums times its f32 multiplier stay below IN_RANGE (with room for
    f32 rounding), for rows of weights `w` (one row per entry of corr and mult) with their
    corrections `corr`: a row's sums lie within its correction +- 255 times its weights'
    absolute sum (always so but for absurd scales); with the residual term of a `node`
    that has one (Residual.bound) added."""
    bound = np.abs(corr.astype(np.int64)) + 255 * np.abs(w.reshape(len(corr), -1).astype(np.int64)).sum(1)
    scaled = bound.astype(np.float64) * np.abs(mult.astype(np.float64))
    return bool(np.all((scaled + Residual.bound(node)) * 1.001 < IN_RANGE))


def requantize_unsaturated(b: ir.IRBuilder, sums, mult, residual=None):
    """requantize for a vector of sums whose products with `mult` (for all lanes, or a vector
    of one per lane) stay below IN_RANGE (products_in_range), up to its saturation: rounded
    halves to even in f32, then converted to i32: the vector `narrow` offsets and saturates
    to i8 and to the bounds four vectors at a time.  (Outside the range the conversion would not be exact:
    fptosi of a too-large value is poison.)  `residual`: as requantize's."""
    vw = sums.type.count
    ft = _vec(F32, vw)
    mult = mult if isinstance(mult.type, ir.VectorType) else splat(b, mult, vw)
    f = scaled_sums(b, b.sitofp(sums, ft), mult, residual)
    # vcvtps2dq in place of vroundps and vcvttps2dq: MobileNetV2's int8 kernels at
    # x86-64-v3, 1 thread, the sum of their fastest-of-150 cycles: 11187 -> 10913 kcycles.
    return round_to_i32(b, f)


def requantize_for_narrow(b: ir.IRBuilder, sums, mult, exact: bool, offset, bounds, residual=None):
    """A tile's vector of sums (the bias correction in them) as narrowed_rows takes it: where
    the packing found the sums in range (`exact`: products_in_range), only scaled and rounded
    (requantize_unsaturated: the narrowing offsets and saturates); otherwise requantize's
    values, offset (`offset`: the f32 one) and saturated to `bounds`, as i32.  `residual`:
    (Residual, the f32 vector of its values) joining the scaled sums (Residual.join), or None."""
    if exact:
        return requantize_unsaturated(b, sums, mult, residual)
    return requantize(b, sums, mult, offset, bounds=bounds, wide=True, residual=residual)


class Residual:
    """The residual of a QuantizedConv that has one (its operand r: values of its result's
    shape and type, quantized with r_scale and r_offset) as its int8 stores read it: each
    vector of results takes the values of r at its own places, which join its scaled sums
    before their rounding (requantize_for_narrow's `residual`) as two fused multiply-adds,
    fma(r, r_scale / scale, fma(sums, mult, -r_offset * r_scale / scale)): the subtraction
    of the offset, a product and a sum a vector fewer than (r - r_offset) * ratio added
    (reference.primitives.join_residual computes the same)."""

    def __init__(self, node, arg):
        self.ptr = arg[0]                   # i8*: r, laid out as the result
        self.offset = int(node.r_offset)
        ratio = residual_ratio(node)
        self.ratio = float(ratio)
        self.constant = float(residual_constant(self.offset, ratio))

    @staticmethod
    def present(node) -> bool:
        """Whether `node` is a QuantizedConv with a residual (its fifth operand)."""
        return node is not None and node.OP == "QuantizedConv" and len(node.inputs) > 4 and node.inputs[4] is not None

    @staticmethod
    def of(k) -> Optional["Residual"]:
        """The residual of the kernel's QuantizedConv (KernelArgs k), or None."""
        return Residual(k.node, k.ins[4]) if Residual.present(k.node) else None

    @staticmethod
    def bound(node) -> float:
        """The largest magnitude of a `node`'s residual term (0 without one)."""
        return 255.0 * float(residual_ratio(node)) if Residual.present(node) else 0.0

    def at(self, b, element):
        """The address (i8*) of r's element `element` (i64)."""
        return b.gep(self.ptr, [element])

    def values(self, b, values):
        """An i8 value or vector of them, as f32."""
        vw = values.type.count if isinstance(values.type, ir.VectorType) else None
        it, ft = (I32, F32) if vw is None else (_vec(I32, vw), _vec(F32, vw))
        return b.sitofp(b.sext(values, it), ft)

    def join(self, b, sums, mult, values):
        """fma(values, ratio, fma(sums, mult, constant)): f32 sums (a value or vector, as
        `mult` and `values`) scaled, with the residual's values joined."""
        ft = sums.type
        vw = ft.count if isinstance(ft, ir.VectorType) else None
        fma = intrinsic(b.module, "llvm.fma." + ("f32" if vw is None else f"v{vw}f32"), ft, [ft] * 3)

        def const(x):
            return ir.Constant(ft, x if vw is None else [x] * vw)
        return b.call(fma, [values, const(self.ratio), b.call(fma, [sums, mult, const(self.constant)])])

    def load_values(self, b, places, vw: int, whole, masks) -> dict:
        """{key: the vector of `vw` values at places[key] (an i8* each), as f32}:
        plain loads where `whole` (an i1: every lane of every vector is a result), else
        each vector's lanes of masks()[key] (an i1 vector each; the others read nothing,
        so they may lie past the end of r)."""
        vt = _vec(I8, vw)
        loaded = {}
        with b.if_else(whole) as (then, otherwise):
            with then:
                plain = {}
                for key, at in places.items():
                    ld = b.load(b.bitcast(at, vt.as_pointer()))
                    ld.align = 1
                    plain[key] = ld
                plain_block = b.block
            with otherwise:
                lanes = masks()
                masked = {key: masked_load(b, at, lanes[key], ir.Constant(vt, [0] * vw))
                          for key, at in places.items()}
                masked_block = b.block
        for key in places:
            loaded[key] = b.phi(vt)
            loaded[key].add_incoming(plain[key], plain_block)
            loaded[key].add_incoming(masked[key], masked_block)
        return {key: self.values(b, v) for key, v in loaded.items()}


def narrow(b: ir.IRBuilder, vectors: list, bounds=(-128, 127), offset=None, interleave: int = 1):
    """Four (or two) i32 vectors of VW lanes (16 with AVX-512BW, 8 with AVX2) -> one i8
    vector of their lanes, [v0, v1, v2, v3] (or, `interleave` I > 1, lane k of v_{h * I + r}
    at h * I * VW + I * k + r: VNNI's depthwise lanes 4k + r, vpmaddwd's 16h + 2k + r),
    plus `offset` (an int or an i32 value, or None: none), saturated to i8 and then to
    `bounds`: two saturating packs (i32 -> i16 of two vectors, i16 -> i8 of the two results),
    which leave each 128-bit lane holding 4 values of every vector, put in order by one
    vpermd (interleaved by 4: one in-lane vpshufb, a 4 x 4 byte transpose; by 2: a vpshufb
    and a vpermq); the offset costs a saturating i16 add for two vectors, the bounds a byte
    max and min for all four.  In
    place of a vpmovsdb-style narrowing with a max, a min and an offset per vector, 64 -> 22
    instructions a tile of 8 x 2 vectors, where requantizing a product of few channels costs
    more than its sums: with its sums started from the bias correction (emit_tile's init),
    MobileNetV2's int8 16 -> 96 1x1 at 112 x 112 476 -> 360 kcycles, 24 -> 144 at 56 x 56
    218 -> 179, its 3x3 stride-2 stem 293 -> 255 (Zen 4, fastest of 300 runs alone)."""
    n, vw = len(vectors), vectors[0].type.count
    assert n in (2, 4) and vw in (8, 16) and (n == 4 or interleave == 1)
    lanes = vw // 4                     # 128-bit lanes a vector spans
    it, ht, bt = _vec(I32, vw), _vec(I16, 2 * vw), _vec(I8, 4 * vw)
    pack_dw = intrinsic(b.module, "llvm.x86.avx512.packssdw.512" if vw == 16 else "llvm.x86.avx2.packssdw",
                        ht, [it, it])
    pack_wb = intrinsic(b.module, "llvm.x86.avx512.packsswb.512" if vw == 16 else "llvm.x86.avx2.packsswb",
                        bt, [ht, ht])
    halves = [b.call(pack_dw, vectors[i:i + 2]) for i in range(0, n, 2)]
    if offset is not None:
        # Offset in i16 with saturation, for two vectors at once: a value the pack saturated
        # (beyond +-32767) stays beyond i8 after an offset of at most 128 either way.
        off = ir.Constant(ht, [offset] * 2 * vw) if isinstance(offset, int) else splat(b, b.trunc(offset, I16), 2 * vw)
        add_sat = intrinsic(b.module, f"llvm.sadd.sat.v{2 * vw}i16", ht, [ht, ht])
        halves = [b.call(add_sat, [h, off]) for h in halves]
    v = b.call(pack_wb, [halves[0], halves[-1]])
    if interleave > 1:
        # Lane k of vector s = h * interleave + r to byte h * interleave * VW + interleave * k
        # + r, from byte 16 * (k // 4) + 4 * s + k % 4 of the packs (below).
        order = [0] * (4 * vw)
        for s in range(n):
            h, r = divmod(s, interleave)
            for k in range(vw):
                order[h * interleave * vw + interleave * k + r] = 16 * (k // 4) + 4 * s + k % 4
        v = b.shuffle_vector(v, ir.Constant(bt, ir.Undefined), ir.Constant(_vec(I32, 4 * vw), order))
    else:
        # Dword (4 bytes of one vector) l * 4 + s of the packs holds vector s's lanes 4l..4l+3.
        order = [l * 4 + s for s in range(n) for l in range(lanes)]
        v = b.bitcast(b.shuffle_vector(b.bitcast(v, it), ir.Constant(it, ir.Undefined),
                                       ir.Constant(_vec(I32, len(order)), order)), _vec(I8, n * vw))
    vt = v.type
    for op, bound, binds in (("smin", bounds[1], bounds[1] < 127), ("smax", bounds[0], bounds[0] > -128)):
        if binds:
            fn = intrinsic(b.module, f"llvm.{op}.v{vt.count}i8", vt, [vt, vt])
            v = b.call(fn, [v, ir.Constant(vt, [bound] * vt.count)])
    return v


def narrowed_rows(b: ir.IRBuilder, qs: QShape, rows: list, exact: bool, bounds, offset):
    """[(i, the i8 vector of row i's NV * VW lanes)] from rows[i] = its NV i32 vectors
    (NV of 2 or 1; requantize_for_narrow's: when `exact`, not yet offset by `offset`, the
    i32 one, nor saturated to `bounds`), narrowed four vectors at a time (`narrow`): 4 / NV
    rows of a tile at once (the last of fewer rows repeated)."""
    nv = len(rows[0])
    assert nv in (1, 2)
    if not exact:                       # requantize offset and saturated them already
        bounds, offset = (-128, 127), None
    out, per, run = [], 4 // nv, nv * qs.vw
    for i in range(0, len(rows), per):
        group = rows[i:i + per]
        v = narrow(b, [v for row in group + [group[-1]] * (per - len(group)) for v in row], bounds, offset)
        for k in range(len(group)):
            out.append((i + k, b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                                ir.Constant(_vec(I32, run), list(range(k * run, (k + 1) * run))))))
    return out
