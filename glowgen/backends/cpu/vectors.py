"""Explicit vectors of f32 lanes in LLVM IR: the helpers the hand-vectorized kernels
(gemm.py, the plane and transposed convolutions, epilogues) build their loads, stores,
masks, broadcasts and shuffles from."""
from __future__ import annotations

from llvmlite import ir

from .llvmutil import F32, I1, I32, I64, call_intrinsic, for_range, intrinsic, target_has, type_suffix


def f32_vector(vw: int) -> ir.VectorType:
    return ir.VectorType(F32, vw)


def splat(b, scalar, vw):
    """`scalar` (of any element type) in all `vw` lanes of a vector."""
    vty = ir.VectorType(scalar.type, vw)
    v = b.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(v, ir.Constant(vty, ir.Undefined),
                            ir.Constant(ir.VectorType(ir.IntType(32), vw), [0] * vw))


def lane_mask(vw: int, valid: int) -> ir.Constant:
    """The constant mask of the first `valid` of `vw` lanes."""
    return ir.Constant(ir.VectorType(I1, vw), [1 if i < valid else 0 for i in range(vw)])


def _lane_bytes(vty: ir.VectorType) -> int:
    e = vty.element
    return 4 if isinstance(e, ir.FloatType) else 8 if isinstance(e, ir.DoubleType) else max(1, e.width // 8)


def masked_load(b, ptr, mask, passthru):
    """llvm.masked.load of the lanes of `mask` (f32, or any element type: passthru's) from
    ptr, the others from `passthru` (masked-off lanes are not read, so they may lie past the
    end of an array)."""
    vty = passthru.type
    vptr = b.bitcast(ptr, vty.as_pointer())
    fn = intrinsic(b.module, f"llvm.masked.load.{type_suffix(vty)}.p0", vty,
                   [vptr.type, ir.IntType(32), mask.type, vty])
    return b.call(fn, [vptr, ir.Constant(ir.IntType(32), _lane_bytes(vty)), mask, passthru])


def masked_store(b, value, ptr, mask):
    """llvm.masked.store of the lanes of `mask` (of any element type)."""
    vptr = b.bitcast(ptr, value.type.as_pointer())
    fn = intrinsic(b.module, f"llvm.masked.store.{type_suffix(value.type)}.p0", ir.VoidType(),
                   [value.type, vptr.type, ir.IntType(32), mask.type])
    b.call(fn, [value, vptr, ir.Constant(ir.IntType(32), _lane_bytes(value.type)), mask])


def vload(b, ptr, vw, valid=None):
    if valid is None or valid >= vw:
        ld = b.load(b.bitcast(ptr, f32_vector(vw).as_pointer()))
        ld.align = 4
        return ld
    return masked_load(b, ptr, lane_mask(vw, valid), ir.Constant(f32_vector(vw), [0.0] * vw))


def vstore(b, value, ptr, vw, valid=None):
    if valid is None or valid >= vw:
        st = b.store(value, b.bitcast(ptr, f32_vector(vw).as_pointer()))
        st.align = 4
        return
    if valid <= 0:
        return
    if not target_has(b.module, "avx512f"):
        store_lanes(b, value, ptr, valid)
        return
    masked_store(b, value, ptr, lane_mask(vw, valid))


def store_lanes(b, value, ptr, valid: int) -> None:
    """The first `valid` lanes of `value` to ptr as plain stores of 8, 4, 2 and 1 lanes (6 =
    4 + 2).  Without AVX-512, a masked store is vmaskmovps, microcoded on AMD cores: on Zen 4
    compiled for x86-64-v3, MobileNetV2's 576-channel depthwise 3x3 at 14 x 14 (each output
    row 8 + 6 floats) took 186 kcycles with it, against 92 for AVX-512's masked stores."""
    start = 0
    for size in (8, 4, 2, 1):
        while valid - start >= size:
            if size == 1:
                piece = b.extract_element(value, ir.Constant(I32, start))
            else:
                piece = b.shuffle_vector(value, ir.Constant(value.type, ir.Undefined),
                                         ir.Constant(ir.VectorType(I32, size), list(range(start, start + size))))
            st = b.store(piece, b.bitcast(b.gep(ptr, [ir.Constant(I64, start)]), piece.type.as_pointer()))
            st.align = 4
            start += size


def fmuladd(b, a, x, acc):
    """a * x + acc, fused where the target has FMA (llvm.fmuladd)."""
    return call_intrinsic(b, "fmuladd", [a, x, acc])


def copy_run(b, src, dst, count, vw: int) -> None:
    """dst[0:count] = src[0:count] for a run-time count, in masked vectors: written as
    vectors, the loop is not vectorized again by LLVM, which for a scalar copy between two
    places of the scratch buffer would add alias checks and a scalar twin of every loop
    (ResNet-18's module grew 2.5 times and took 36 s to compile).

    Without AVX-512, a count known now (an int) copies whole vectors, then its last lanes
    by store_lanes: MobileNetV2's depthwise 3x3s copy each input row so, 14 floats at
    14 x 14 (x86-64-v3 on Zen 4, kcycles): 576 channels 185 -> 102, 960 at 7 x 7 141 -> 72,
    192 at 28 x 28 180 -> 128.  AVX-512's masked stores are cheap, and its loop of them
    measured 8% faster than this at 14 x 14."""
    if isinstance(count, int) and not target_has(b.module, "avx512f"):
        full = count - count % vw
        if full:
            with for_range(b, full, step=vw, name="run") as t:
                vstore(b, vload(b, b.gep(src, [t]), vw), b.gep(dst, [t]), vw)
        if count % vw:
            tail = ir.Constant(I64, full)
            vstore(b, vload(b, b.gep(src, [tail]), vw, count % vw), b.gep(dst, [tail]), vw, count % vw)
        return
    count = count if isinstance(count, ir.Value) else ir.Constant(I64, count)
    iota = ir.Constant(ir.VectorType(I64, vw), list(range(vw)))
    ends = splat(b, count, vw)
    none = ir.Constant(ir.VectorType(F32, vw), [0.0] * vw)
    with for_range(b, count, step=vw, name="run") as t:
        mask = b.icmp_signed("<", b.add(splat(b, t, vw), iota), ends)
        masked_store(b, masked_load(b, b.gep(src, [t]), mask, none), b.gep(dst, [t]), mask)


def join_vectors(b, vectors: list):
    """The vectors (a power of two of them, of one type) end to end in one: lane j of
    vector i at i * count + j, joined pairwise."""
    while len(vectors) > 1:
        n = vectors[0].type.count
        both = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
        vectors = [b.shuffle_vector(vectors[i], vectors[i + 1], both) for i in range(0, len(vectors), 2)]
    return vectors[0]


def transpose_block(b, rows: list) -> list:
    """The transpose of a square block of vectors: at every scale s (VW/2, ..., 1), swap
    the off-diagonal s x s blocks of each 2s x 2s block -- one two-input shuffle per row
    per stage (vpermt2ps)."""
    n = len(rows)
    rows = list(rows)
    s = n // 2
    while s >= 1:
        lo = ir.Constant(ir.VectorType(I32, n), [j if not j & s else n + j - s for j in range(n)])
        hi = ir.Constant(ir.VectorType(I32, n), [j + s if not j & s else n + j for j in range(n)])
        for i in range(n):
            if i & s:
                continue
            a, c = rows[i], rows[i + s]
            rows[i], rows[i + s] = b.shuffle_vector(a, c, lo), b.shuffle_vector(a, c, hi)
        s //= 2
    return rows


def prefetch(b, ptr, write: bool, locality: int = 3) -> None:
    """llvm.prefetch of the line at `ptr`, for writing (prefetchw) or reading, into L1
    (locality 3), or L2 (2: prefetcht1)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = intrinsic(b.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, i32, i32, i32])
    b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(i32, int(write)), ir.Constant(i32, locality), ir.Constant(i32, 1)])
