"""A register-blocked matrix product in LLVM IR: C[M, N] = A[M, K] @ B[K, N] (+ per-row init).

The micro-kernel keeps an MR x NR tile of C in vector registers (MR rows, NR = VW * NV
columns) and, for each k, broadcasts MR values of A and loads NV vectors of B into
MR * NV fused multiply-adds.  A is row-major (weights, read by broadcast, no packing);
B is either row-major (`ldb` = its row stride) or packed in NR-wide panels
[ceil(N / NR)][K][NR] (what the convolution's im2col writes).  All sizes are compile-time
constants, so LLVM sees fixed trip counts.
"""
from __future__ import annotations

from typing import Callable, Optional

from llvmlite import ir

from .llvmutil import I64, carried_loop, for_range, i64, intrinsic
from .parallel import WHOLE, Split
from .vectors import f32_vector, splat, vload, vstore


class GemmShape:
    def __init__(self, vw: int, mr: int, nv: int, features: str = ""):
        self.vw, self.mr, self.nv = vw, mr, nv
        self.features = features          # the target's, for kernels with other choices (qgemm)

    @property
    def nr(self) -> int:
        return self.vw * self.nv


def choose_shape(features: str) -> GemmShape:
    """Tile for the host's vector registers: 32 zmm with AVX-512, 16 ymm with AVX2."""
    if "+avx512f" in features:
        return GemmShape(16, 8, 2, features)      # 16 accumulators of 16 floats
    if "+avx2" in features or "+avx" in features:
        return GemmShape(8, 6, 2, features)       # 12 accumulators of 8 floats
    return GemmShape(4, 4, 2, features)


def emit_gemm(b: ir.IRBuilder, shape: GemmShape, M: int, N: int, K: int,
              a, lda: int, bmat, ldb: Optional[int], c, ldc: int,
              row_init: Optional[Callable] = None,
              epilogue: Optional[Callable] = None, name: str = "g", a_packed: bool = False,
              pack_panel: Optional[Callable] = None, panel_nr: Optional[int] = None,
              split: Split = WHOLE, split_rows: bool = False, row_align: int = 1, b_table=None,
              a_transposed: bool = False, store_tile: Optional[Callable] = None,
              image_rows: Optional[tuple] = None, a_table=None, k_block: Optional[int] = None,
              panels_outer: bool = False, prefetch: Optional[Callable] = None) -> None:
    """Emit C = A @ B (+ row_init(m) broadcast on each row).  With `epilogue`, each result
    vector goes to epilogue(b, vec, m, n0, valid_lanes), which stores what it computes;
    otherwise it is stored to C.

    `ldb=None` means B is packed in NR-wide panels; otherwise B is row-major with row
    stride `ldb` (the last panel is then read with masked loads).  `a_packed` means A is
    packed in blocks of MR rows, column by column (packing.pack_rows; `lda` is unused);
    `a_transposed` that A is stored as its transpose, A[m][k] at k * lda + m.

    With `pack_panel(p)`, B is produced one panel at a time: the call emits code that writes
    panel p (K x NR) to `bmat`, and every row block of A then meets that panel while it is
    in cache, so B never exists whole (im2col of a large image, with A small enough to be
    re-read from L2 for each panel).  `panel_nr` is the width of B's packed panels when it is
    not the tile's NR (packing.gemv_panel_width: a matrix-vector product's wide tiles).

    With a `split` (parallel.py), only a share of the tiles: of B's whole panels (the last
    task also takes the ragged last panel; with B row-major, the rows past the last whole
    block of MR are tiles of another width, whose panels are shared out apart), or with
    `split_rows`, of A's whole blocks of MR rows, or of whole runs of `row_align` blocks
    (the last task also takes the blocks past the last whole run and the rows that do not
    fill a block).  gemm_items counts them.
    With `b_table = (offsets, oh, ow, pitch)`, B is never built: its columns are the pixels
    of an oh x ow image, and B[k][oy * ow + ox] is bmat[offsets[k] + oy * pitch + ox]
    (offsets: a constant i32 array of K; a convolution's padded input planes, read in
    place, conv.py).  Tiles run along each image row (masked at its end); a split shares
    out whole image rows, or `image_rows = (lo, hi)` gives the rows to compute.

    With `a_table = (offsets, rows)`, A is never built either: M is one tile's rows, and
    A[i][k] is rows[i][offsets[k]] (offsets: a constant i32 array of K; rows: a pointer per
    row -- the window corners of a channel-blocked convolution's pixels, conv_blocked.py).

    With `k_block` (B row-major), the rows of C run over K in blocks of that many k, each
    block's partial sums left in C for the next (the same additions in the same order), so
    that a tile's rows of B stay in L1 while every row block of A meets them.

    With `panels_outer` (B row-major), each column panel of B meets every row block of A
    (this task's) before the next panel, instead of each row block running over all of B:
    B streams from memory once rather than once per row block (A must stay in cache).

    With `prefetch`, prefetch(b, k) is called at each step k of a tile's loop (to emit
    prefetches of what the caller's next tiles read).

    With `store_tile`, the whole tile goes to store_tile(b, rows, m0, n0, valid_cols) once
    its sums are complete (rows[i][j]: row m0 + i, columns n0 + j * VW.., row_init added),
    which stores it as it likes (a ConvTranspose's rows interleaved, conv_transpose_gemm.py)."""
    vw = shape.vw
    assert not k_block or (ldb is not None and c is not None and store_tile is None and b_table is None
                           and pack_panel is None), "blocks of K: B row-major, the sums in C"
    if k_block and k_block >= K:
        k_block = None
    fma = intrinsic(b.module, f"llvm.fma.v{vw}f32", f32_vector(vw), [f32_vector(vw)] * 3)

    def tile(mr: int, nv: int, m0, n0, valid_cols: int, panel_index, b_base=None, k_range=None):
        """One MR x NR tile at rows m0.., columns n0.. (valid_cols of them real); with
        `k_range = (k0, k1)`, only those k, from the partial sums in C unless k0 = 0 and
        left there unless k1 = K."""
        k0, k1 = k_range or (0, K)
        zero = ir.Constant(f32_vector(vw), [0.0] * vw)

        def partial_at(i, j):        # C's vector j of row i: where partial sums wait
            return b.gep(c, [b.add(b.mul(b.add(m0, i64(i)), i64(ldc)), b.add(n0, i64(j * vw)))])

        def lanes(j):                # valid lanes of vector j (None: all of them)
            return valid_cols - j * vw if valid_cols - j * vw < vw else None

        starts = [[zero] * nv for _ in range(mr)]
        if k0:
            starts = [[vload(b, partial_at(i, j), vw, lanes(j)) if valid_cols - j * vw > 0 else zero
                       for j in range(nv)] for i in range(mr)]

        def reduce(k, accs):
            """The tile's sums after k, from `accs`."""
            if prefetch is not None:
                prefetch(b, k)
            # B vectors for this k
            bvecs = []
            if b_table is not None:
                row = b.add(b.sext(b.load(b.gep(b_table[0], [ir.Constant(I64, 0), k])), I64), b_base)
            for j in range(nv):
                col_valid = valid_cols - j * vw
                if b_table is not None:
                    if col_valid <= 0:
                        bvecs.append(zero)
                        continue
                    bvecs.append(vload(b, b.gep(bmat, [b.add(row, i64(j * vw))]), vw,
                                       col_valid if col_valid < vw else None))
                elif ldb is None:
                    off = b.add(b.mul(b.add(b.mul(panel_index, i64(K)), k), i64(vw * nv)), i64(j * vw))
                    bvecs.append(vload(b, b.gep(bmat, [off]), vw))
                else:
                    if col_valid <= 0:
                        bvecs.append(zero)
                        continue
                    off = b.add(b.mul(k, i64(ldb)), b.add(n0, i64(j * vw)))
                    bvecs.append(vload(b, b.gep(bmat, [off]), vw, col_valid if col_valid < vw else None))
            new_accs = []
            if a_table is not None:
                a_off = b.sext(b.load(b.gep(a_table[0], [ir.Constant(I64, 0), k])), I64)
            for i in range(mr):
                if a_table is not None:
                    av = b.load(b.gep(a_table[1][i], [a_off]))
                    new_accs.append([b.call(fma, [splat(b, av, vw), bvecs[j], accs[i][j]]) for j in range(nv)])
                    continue
                if a_packed:       # block m0 // MR starts at m0 * K; then MR floats per k
                    at = b.add(b.add(b.mul(m0, i64(K)), b.mul(k, i64(shape.mr))), i64(i))
                elif a_transposed:
                    at = b.add(b.add(b.mul(k, i64(lda)), m0), i64(i))
                else:
                    at = b.add(b.mul(b.add(m0, i64(i)), i64(lda)), k)
                av = b.load(b.gep(a, [at]))
                avec = splat(b, av, vw)
                new_accs.append([b.call(fma, [avec, bvecs[j], accs[i][j]]) for j in range(nv)])
            return new_accs

        new_accs = carried_loop(b, k0, k1, starts, reduce, name=name)
        if k1 < K:                    # partial sums, to C
            for i in range(mr):
                for j in range(nv):
                    if valid_cols - j * vw > 0:
                        vstore(b, new_accs[i][j], partial_at(i, j), vw, lanes(j))
            return
        rows = []
        for i in range(mr):
            m = b.add(m0, i64(i))
            init = row_init(m) if row_init is not None else None
            if store_tile is not None:
                rows.append([b.fadd(v, splat(b, init, vw)) if init is not None else v for v in new_accs[i]])
                continue
            for j in range(nv):
                col_valid = valid_cols - j * vw
                if col_valid <= 0:
                    continue
                v = new_accs[i][j]
                if init is not None:
                    v = b.fadd(v, splat(b, init, vw))
                n_at = b.add(n0, i64(j * vw))
                if epilogue is not None:      # it stores what it computes from the tile
                    epilogue(b, v, m, n_at, col_valid if col_valid < vw else vw)
                    continue
                out = b.gep(c, [b.add(b.mul(m, i64(ldc)), n_at)])
                vstore(b, v, out, vw, col_valid if col_valid < vw else None)
        if store_tile is not None:
            store_tile(b, rows, m0, n0, valid_cols)

    by_panels = not split.whole and not split_rows
    assert not (split_rows and not split.whole and pack_panel is not None), "panel by panel splits by panels"

    def panels(n_full: int, n_tail: int, full, tail):
        """full(p) for each whole panel (of this task's share), then tail() if this task
        takes the ragged one."""
        if n_full:
            lo, hi = split.range(b, n_full) if by_panels else (i64(0), i64(n_full))
            with for_range(b, hi, start=lo, name=f"{name}.p") as p:
                full(p)
        if n_tail:
            if by_panels:
                with b.if_then(split.is_last(b)):
                    tail()
            else:
                tail()

    def panel_by_panel():
        n_full, n_tail = divmod(N, shape.nr)
        m_main = (M // shape.mr) * shape.mr

        def panel(p, valid: int):
            """Build panel p in `bmat`, then every row block's tile of it (the last panel
            has `valid` < NR columns: tile() masks its stores)."""
            pack_panel(p)
            n0 = b.mul(p, i64(shape.nr))
            if m_main:
                with for_range(b, m_main, step=shape.mr, name=f"{name}.m{valid}") as m0:
                    tile(shape.mr, shape.nv, m0, n0, valid, i64(0))
            if M - m_main:
                tile(M - m_main, shape.nv, i64(m_main), n0, valid, i64(0))
        panels(n_full, n_tail, lambda p: panel(p, shape.nr), lambda: panel(i64(n_full), n_tail))

    def rows(mr: int, m_start: int, m_count: int, shared: bool = False):
        """All tiles of `m_count` rows (a multiple of mr) from m_start.  Fewer rows than the
        tile's take wider tiles (same number of accumulators) when B is row-major, so a
        matrix-vector product streams whole rows of B instead of narrow columns."""
        if m_count <= 0:
            return
        nv = (shape.nv if ldb is None else wide_nv(shape, mr)) if panel_nr is None else panel_nr // vw
        nr = vw * nv
        n_full, n_tail = divmod(N, nr)
        lo, hi = i64(m_start), i64(m_start + m_count)
        if shared and split_rows and not split.whole:             # this task's row blocks
            blocks = m_count // mr
            if row_align > 1:     # runs of row_align blocks; the last task to the end
                lo, hi = split.range(b, blocks // row_align)
                lo = b.mul(lo, i64(row_align))
                hi = b.select(split.is_last(b), i64(blocks), b.mul(hi, i64(row_align)))
            else:
                lo, hi = split.range(b, blocks)
            lo, hi = b.add(i64(m_start), b.mul(lo, i64(mr))), b.add(i64(m_start), b.mul(hi, i64(mr)))
        if panels_outer:
            def column(p, n0, valid: int):
                with for_range(b, hi, start=lo, step=mr, name=f"{name}.m{mr}") as m0:
                    tile(mr, nv, m0, n0, valid, p)
                if rest_rows:
                    def rest():
                        tile(rest_rows, nv, i64(M - rest_rows), n0, valid, p)
                    if split_rows and not split.whole:
                        with b.if_then(split.is_last(b)):
                            rest()
                    else:
                        rest()
            panels(n_full, n_tail, lambda p: column(p, b.mul(p, i64(nr)), nr),
                   lambda: column(i64(n_full), i64(n_full * nr), n_tail))
            return
        k_ranges = [(k0, min(K, k0 + k_block)) for k0 in range(0, K, k_block)] if k_block else [None]
        for kr in k_ranges:
            with for_range(b, hi, start=lo, step=mr, name=f"{name}.m{mr}") as m0:
                panels(n_full, n_tail, lambda p: tile(mr, nv, m0, b.mul(p, i64(nr)), nr, p, k_range=kr),
                       lambda: tile(mr, nv, m0, i64(n_full * nr), n_tail, i64(n_full), k_range=kr))

    def by_image_rows():
        _, oh, ow, pitch = b_table
        nr = shape.nr
        m_main = (M // shape.mr) * shape.mr
        n_full, n_tail = divmod(ow, nr)
        lo, hi = image_rows if image_rows is not None else split.range(b, oh)

        def tiles(oy, ox0, valid: int):
            n0 = b.add(b.mul(oy, i64(ow)), ox0)
            base = b.add(b.mul(oy, i64(pitch)), ox0)
            nv = -(-valid // vw)          # a row's ragged end: only the vectors it reaches
            if m_main:
                with for_range(b, m_main, step=shape.mr, name=f"{name}.m{valid}") as m0:
                    tile(shape.mr, nv, m0, n0, valid, None, base)
            if M - m_main:
                tile(M - m_main, nv, i64(m_main), n0, valid, None, base)
        with for_range(b, hi, start=lo, name=f"{name}.oy") as oy:
            if n_full:
                with for_range(b, n_full, name=f"{name}.ox") as t:
                    tiles(oy, b.mul(t, i64(nr)), nr)
            if n_tail:
                tiles(oy, i64(n_full * nr), n_tail)

    if b_table is not None:
        by_image_rows()
        return
    if pack_panel is not None:
        panel_by_panel()
        return
    mr = shape.mr
    m_main = (M // mr) * mr
    assert not panels_outer or (ldb is not None and not k_block and panel_nr is None and m_main), \
        "panels outer: B row-major, whole row blocks"
    rest_rows = M - m_main if panels_outer else 0      # those tiles then run in each panel
    rows(mr, 0, m_main, shared=True)
    rest = M - m_main if not panels_outer else 0
    if rest:
        if split_rows and not split.whole:
            with b.if_then(split.is_last(b)):
                rows(rest, m_main, rest)
        else:
            rows(rest, m_main, rest)


def pack_panels_size(N: int, K: int, shape: GemmShape, width: Optional[int] = None) -> int:
    """Floats a packed B of K x N takes: whole NR-wide panels (or `width`-wide; the tail
    zero-padded)."""
    width = width or shape.nr
    return -(-N // width) * K * width


def wide_nv(shape: GemmShape, rows: int) -> int:
    """Vectors per tile row for a block of fewer rows than MR: as many accumulators as the
    full tile has (at most 16 vectors wide), so a matrix-vector product streams whole rows
    of B instead of narrow columns."""
    return max(shape.nv, min(16, (shape.mr * shape.nv) // rows))


def gemm_items(M: int, N: int, shape: GemmShape, split_rows: bool, panel_nr: Optional[int] = None) -> int:
    """What a split of emit_gemm shares out: whole blocks of MR rows, or whole panels of B."""
    return M // shape.mr if split_rows else N // (panel_nr or shape.nr)
