"""int8 products on Intel AMX tiles (Sapphire Rapids and later): the general product of
qgemm.py with its sums made by `tdpbsud` in place of `vpdpbusd`.

A tile register holds up to 16 rows of 64 bytes; `tdpbsud C, A, B` adds to the 16 x 16 i32
sums of C the products of A's 16 x 64 signed bytes and B's 64 x 16 unsigned ones, B laid
out as VNNI lays it: a row of B holds 4 consecutive k of 16 columns.  That is the plane of
the general product exactly (qplanes.py: elements of G = 4 channels, a row of elements per
channel group, the output pixels along it, u8 bits of v + 128), so the same plane serves as
B, read 16 channel groups (one tile) at a time at the plane's row stride; A is the weights,
16 filters by 16 channel groups a tile (pack_a).  One `tdpbsud` makes 16,384 products, 16
cycles apart: on an Emerald Rapids core a loop of tile loads (from L2) and products measured
0.4 to 1.4 T products/s (the VM's load varying), a register-only loop of `vpdpbusd` on zmm
0.31 T.

A tile of the product is 32 filters by 32 pixels: four C tiles, two of A and two of B (the
eight tile registers), four products per 16 channel groups and tap.  The sums go through a
block of the stack (`tilestored`) into the general product's epilogue, vector by vector as
qgemm.emit_tile's `store` takes them, so requantization, residuals and stores are
qlinalg's own.  (The epilogue one tile behind, the next tile's products issued before it:
ResNet-50 +260 us at one thread, the vector and tile instructions not overlapping.)

The tiles' shapes are the one configuration (tile_config) a kernel loads (configure) for
each image before its first tile and releases after its last: `ldtilecfg` costs about
80 ns, more than a tile of 64 channels.  Linux hands out the tiles' 8 KB of state only to a
process that asks for it (arch_prctl ARCH_REQ_XCOMP_PERM): the JIT asks before choosing
AMX (permitted, from jit.host_target), and the kernels ask once more, once a process, for a
bundle's program.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from llvmlite import ir

from .llvmutil import I8, I32, I64, for_range, i64, intrinsic

# Channel groups (of G = 4 channels) a tile of A or B spans: 64 bytes a row.
TILE_GROUPS = 16
TILE_ROWS = 16
ROWS = 2                # C tiles down (filters: MR = 32) ...
COLS = 2                # ... and across (pixels: NV = 2 vectors of 16)
# Of a tile's 16 channel groups, those whose weights of the next block it prefetches as
# VNNI's loop does a group (qgemm.weights_prefetch): the first only.  Emerald Rapids, one
# thread, ResNet-50 int8, sums of per-step minima, against all 16: 7645 -> 7507 us, its 3x3s
# 25-40 us faster each (their tile loads keep the load ports busy), its 1x1s at 7 x 7 (1 MB
# of weights from L3) 12-23 us slower; against none: 7340 -> 7270.
PREFETCH_GROUPS = 1
_C, _A, _B = 0, ROWS * COLS, ROWS * COLS + ROWS      # the first tile register of each
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def tile_config() -> bytes:
    """The 64-byte operand of `ldtilecfg`: palette 1, the eight tiles 16 rows of 64 bytes."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    cfg[16:48].view(np.uint16)[:8] = 64
    cfg[48:56] = TILE_ROWS
    return cfg.tobytes()


def available(features: str) -> bool:
    """Whether a target of these LLVM features has AMX's int8 tiles (jit.host_target leaves
    them out where this process may not use them)."""
    have = set((features or "").split(","))
    return {"+amx-tile", "+amx-int8", "+avx512vnni", "+avx512bw"} <= have


def without(features: str) -> str:
    """The features with AMX's switched off (the cpu backend's `amx=False`)."""
    return ",".join(f"-{f[1:]}" if f[1:].startswith("amx-") else f for f in (features or "").split(",") if f)


def permitted() -> bool:
    """Ask Linux for this process's AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM): whether
    granted (False off Linux, or on a kernel without AMX support)."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                            ctypes.c_long(_XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):
        return False


def fits(geo) -> bool:
    """Whether a general product (qlinalg.Geometry) may run on tiles: one group of filters;
    of an im2col plane only one panel by panel (row elements: ResNet's stem, whose 42
    channel groups a pixel lie in one run of the panel, 16 of them a tile's rows); more than
    half the rows of its tiles of channel groups its own; and at least a vector of pixels
    (or rows).  Emerald Rapids, one thread, MobileNetV2 int8 against VNNI: 1x1s from 16
    channels (4 groups of a tile's 16) at 112 x 112 131 -> 152 us, from 24 at 56 x 56 59 ->
    66, from 32 at 112 x 112 38 -> 42 (but at 28 x 28 24 -> 20), from 96 at 14 x 14 44 -> 21;
    its classifier (one row, 1280 -> 1000: VNNI's features in the lanes) 55 -> 70."""
    return (geo.ng == 1 and (not geo.im2col or geo.panel_major)
            and 2 * geo.groups > geo.tile_groups and geo.q >= 16)


def pack_a(padded: np.ndarray, mr: int, g: int) -> np.ndarray:
    """Weights [Mpad, Cpad, taps] (i8, rows and channels zero-padded, the channels here to
    whole tiles of 16 groups) -> [Mpad / MR][CG / 16][taps][MR][16][G]: for each block of MR
    filters, 16 channel groups and tap, A's tiles (16 filters each) one after another, a
    filter's 64 bytes a row."""
    mp, cp, taps = padded.shape
    whole = -(-cp // (g * TILE_GROUPS)) * g * TILE_GROUPS      # channels of whole tiles
    if whole > cp:                                             # zero weights for the plane rows past
        padded = np.concatenate([padded, np.zeros((mp, whole - cp, taps), padded.dtype)], axis=1)
        cp = whole
    a = padded.reshape(mp // mr, mr, cp // (g * TILE_GROUPS), TILE_GROUPS, g, taps)
    return np.ascontiguousarray(a.transpose(0, 2, 5, 1, 3, 4))


def _tile(n: int) -> ir.Constant:
    return ir.Constant(I8, n)


def _global(module: ir.Module, name: str, ty: ir.Type, init) -> ir.GlobalVariable:
    if name in module.globals:
        return module.globals[name]
    g = ir.GlobalVariable(module, ty, name)
    g.linkage = "internal"
    g.initializer = init
    return g


def configure(b: ir.IRBuilder) -> None:
    """The tiles' shapes (tile_config) loaded; the process's permission asked for once."""
    m = b.module
    asked = _global(m, "glowgen.amx.asked", I32, ir.Constant(I32, 0))
    with b.if_then(b.icmp_signed("==", b.load(asked), ir.Constant(I32, 0)), likely=False):
        syscall = m.globals.get("syscall") or ir.Function(m, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        b.call(syscall, [i64(_SYS_ARCH_PRCTL), i64(_ARCH_REQ_XCOMP_PERM), i64(_XFEATURE_XTILEDATA)])
        b.store(ir.Constant(I32, 1), asked)
    data = tile_config()
    cfg = _global(m, "glowgen.amx.config", ir.ArrayType(I8, len(data)), ir.Constant(ir.ArrayType(I8, len(data)), bytearray(data)))
    cfg.global_constant = True
    b.call(intrinsic(m, "llvm.x86.ldtilecfg", ir.VoidType(), [I8.as_pointer()]), [b.bitcast(cfg, I8.as_pointer())])


def release(b: ir.IRBuilder) -> None:
    b.call(intrinsic(b.module, "llvm.x86.tilerelease", ir.VoidType(), []), [])


def _sums_block(b: ir.IRBuilder):
    """The function's block of the stack the C tiles are stored to (in its entry block)."""
    fn = b.function
    if getattr(fn, "_amx_sums", None) is None:
        with b.goto_entry_block():                  # not on the stack once a loop trip
            block = b.alloca(ir.ArrayType(I32, ROWS * COLS * TILE_ROWS * 16), name="amx.sums")
            block.align = 64
            fn._amx_sums = b.bitcast(block, I8.as_pointer())
    return fn._amx_sums


def emit_tile(b: ir.IRBuilder, groups: int, taps: list[int], a_block, b_base, group_stride: int,
              store: Callable, name: str = "amx", init: Optional[Callable] = None,
              vectors: Optional[int] = None, prefetch: Optional[Callable] = None) -> None:
    """qgemm.emit_tile's contract on tiles, for MR = 32 filters (pack_a's blocks) and NR =
    `vectors` (1 or 2) x 16 pixels: `groups` channel groups (a multiple of 16) of B at
    b_base + group * group_stride + tap offset (i32 elements), then store(i, j, sums) for
    each row i < 32 and vector j, the sums starting from init(i, j) where given."""
    m = b.module
    i8p = I8.as_pointer()
    load = intrinsic(m, "llvm.x86.tileloadd64", ir.VoidType(), [I8, i8p, I64])
    zero = intrinsic(m, "llvm.x86.tilezero", ir.VoidType(), [I8])
    product = intrinsic(m, "llvm.x86.tdpbsud", ir.VoidType(), [I8, I8, I8])
    stored = intrinsic(m, "llvm.x86.tilestored64", ir.VoidType(), [I8, i8p, I64])
    cols = vectors or COLS
    assert groups % TILE_GROUPS == 0
    sums = _sums_block(b)
    for r in range(ROWS):
        for j in range(cols):
            b.call(zero, [_tile(_C + r * COLS + j)])
    a_bytes = b.bitcast(a_block, i8p)
    b_bytes = b.bitcast(b_base, i8p)
    a_tile = TILE_ROWS * TILE_GROUPS * 4                # bytes of an A tile
    with for_range(b, groups // TILE_GROUPS, name=name) as kb:      # 16 channel groups a step
        if prefetch is not None:        # (PREFETCH_GROUPS)
            for s in range(PREFETCH_GROUPS):
                prefetch(b.add(b.mul(kb, i64(TILE_GROUPS)), i64(s)))
        a_at = b.gep(a_bytes, [b.mul(kb, i64(len(taps) * ROWS * a_tile))])
        b_at = b.gep(b_bytes, [b.mul(kb, i64(TILE_GROUPS * group_stride * 4))])
        for t, off in enumerate(taps):
            for r in range(ROWS):
                b.call(load, [_tile(_A + r), b.gep(a_at, [i64((t * ROWS + r) * a_tile)]), i64(TILE_GROUPS * 4)])
            for j in range(cols):
                b.call(load, [_tile(_B + j), b.gep(b_at, [i64(4 * (off + 16 * j))]), i64(4 * group_stride)])
            for r in range(ROWS):
                for j in range(cols):
                    b.call(product, [_tile(_C + r * COLS + j), _tile(_A + r), _tile(_B + j)])
    c_tile = TILE_ROWS * 64                             # bytes of a C tile
    for r in range(ROWS):
        for j in range(cols):
            b.call(stored, [_tile(_C + r * COLS + j), b.gep(sums, [i64((r * COLS + j) * c_tile)]), i64(64)])
    vt = ir.VectorType(I32, 16)
    for i in range(ROWS * TILE_ROWS):
        for j in range(cols):
            at = ((i // TILE_ROWS) * COLS + j) * c_tile + (i % TILE_ROWS) * 64
            v = b.load(b.bitcast(b.gep(sums, [i64(at)]), vt.as_pointer()))
            v.align = 64
            store(i, j, b.add(v, init(i, j)) if init is not None else v)
