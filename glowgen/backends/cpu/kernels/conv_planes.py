"""Convolution and pooling over zero-padded input planes, in explicit vectors.

Each input channel is first copied into a plane of the scratch memory with its padding made
of zeros (-inf for max pooling) and, for a column stride s > 1, its columns dealt into s
sub-planes by their remainder mod s.  Then every tap of every output row is a plain
contiguous vector load -- no bounds checks, no strided or gathered loads.  Three users:

- direct convolution (emit_conv_planes), for too few filters per group for a GEMM tile
  (depthwise convolutions, LeNet's 6-filter layer): a row's vectors take all the taps in
  registers before one store, where an elementwise run that follows the convolution
  (bias, Clip, Relu...) is applied (epilogue.py);
- the patch matrix (im2col) of a GEMM convolution (patch_panel): each panel row is copied
  from the planes in a few masked loads;
- 2-D max pooling (emit_max_pool_planes).
"""
from __future__ import annotations

import copy

from llvmlite import ir

from ..llvmutil import F32, I32, I64, for_range, for_range_staged, i64, in_turn
from ..vectors import copy_run, fmuladd, masked_load, splat, vload, vstore


class PlaneGeometry:
    """Where the padded plane of one input channel lies in the scratch buffer, for a
    convolution or a pooling (whose window is its `kernel` attribute)."""

    def __init__(self, node, vw: int):
        _, _, self.h, self.w = node.inputs[0].type.shape
        if hasattr(node, "kernel"):
            self.kh, self.kw = node.kernel
        else:
            self.m, self.cg, self.kh, self.kw = node.inputs[1].type.shape
        self.oh, self.ow = node.outputs[0].type.shape[2:]
        (self.sh, self.sw), (self.dh, self.dw) = node.strides, node.dilations
        self.pt, self.pl = node.pads[:2]
        self.vw = vw
        self.chunks = -(-self.ow // vw)
        # Padded rows: every row a tap reads, input rows shifted down by the top padding.
        self.rows = max(self.h + self.pt, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1)
        # Sub-plane width: the input columns dealt into it, and every vector a tap loads
        # (the last chunk's lanes past the output's width read zeros, never past the end).
        reach = ((self.kw - 1) * self.dw) // self.sw
        self.cols = max(-(-(self.w + self.pl) // self.sw), self.chunks * vw + reach)
        self.sub_plane = self.rows * self.cols
        self.size = self.sw * self.sub_plane           # floats per input channel

    def band(self, out_rows: int) -> "PlaneGeometry":
        """The geometry of a band of the planes: the padded rows `out_rows` consecutive
        output rows read (fill_plane_band), columns as in the whole planes."""
        g = copy.copy(self)
        g.rows = (out_rows - 1) * self.sh + (self.kh - 1) * self.dh + 1
        g.sub_plane = g.rows * g.cols
        g.size = g.sw * g.sub_plane
        return g

    def tap(self, kwi: int) -> tuple[int, int]:
        """(sub-plane, column offset) from which output column j reads tap `kwi`."""
        return (kwi * self.dw) % self.sw, (kwi * self.dw) // self.sw


def conv_is_pointwise(node) -> bool:
    """A 1x1 convolution at unit stride with no padding: its input is its patch matrix."""
    kh, kw = node.inputs[1].type.shape[2:]
    return (kh, kw) == (1, 1) and tuple(node.strides) == (1, 1) and not any(node.pads)


def scratch_bytes(node, vw: int) -> int:
    """One plane's bytes (a pooling's)."""
    return 4 * PlaneGeometry(node, vw).size


def conv_scratch_bytes(node, vw: int) -> int:
    """emit_conv_planes' two planes."""
    return 2 * scratch_bytes(node, vw)


def emit_conv_planes(k, vw: int) -> None:
    """Direct convolution: for each input channel of a group, its padded plane, then every
    filter of the group over every output row (the channels' sums accumulate in y).  Two
    planes used in turn: channel c + 1's is filled before channel c's filters run, so that
    their loads do not read values stored just before them (a vector load over stores the
    store buffer cannot forward waits until they reach the cache: a small plane, a depthwise
    convolution's at 14 x 14 or 7 x 7, is read right after it is filled)."""
    b = k.b
    (y, _), (x, xt), (w, _) = k.outs[0], k.ins[0], k.ins[1]
    bias = k.ins[2]
    g = PlaneGeometry(k.node, vw)
    n_img, c_all = xt.shape[:2]
    groups = k.node.group
    mg = g.m // groups
    planes = [k.scratch, b.gep(k.scratch, [i64(g.size)])]

    def fill(img, chan):
        fill_plane(b, g, b.gep(x, [b.mul(b.add(b.mul(img, i64(c_all)), chan), i64(g.h * g.w))]), in_turn(b, chan, planes))

    zero_planes(b, g, k.scratch, 2)
    lo, hi = k.split.range(b, groups)          # a split task's groups (kernels.conv_work)
    # The task's channels in order, chan = gi * cg + ci.
    first_chan, end_chan = b.mul(lo, i64(g.cg)), b.mul(hi, i64(g.cg))
    with for_range(b, n_img, name="img") as img:
        with for_range_staged(b, end_chan, first_chan, lambda chan: fill(img, chan), name="chan") as chan:
            gi, ci = b.sdiv(chan, i64(g.cg)), b.srem(chan, i64(g.cg))
            first = b.icmp_signed("==", ci, i64(0))
            last = b.icmp_signed("==", ci, i64(g.cg - 1))
            plane = in_turn(b, chan, planes)
            with for_range(b, mg, name="f") as fi:
                mi = b.add(b.mul(gi, i64(mg)), fi)
                _filter_rows(k, g, img, mi, ci, first, last, plane, y, w, bias)


def zero_planes(b, g: PlaneGeometry, planes, count: int, value: float = 0.0) -> None:
    """Set the padding of `count` planes to `value` (zero; -inf around a max pooling's
    input): every element fill_plane never writes, which keeps it for every channel copied
    in afterwards.  Only the border: the interior is the input's, written by fill_plane
    (a 3-channel 640 x 640 image's planes are 4.9 MB, and writing them whole cost as much
    as copying the input in)."""
    fill = ir.Constant(ir.VectorType(F32, g.vw), [value] * g.vw)
    below = g.rows - g.pt - g.h
    with for_range(b, count, name="zp") as ci:
        for q, (lo, hi) in enumerate(_spans(g)):
            sub = b.gep(planes, [b.add(b.mul(ci, i64(g.size)), i64(q * g.sub_plane))])
            _fill_run(b, sub, g.pt * g.cols, fill, g.vw)
            _fill_run(b, b.gep(sub, [i64((g.pt + g.h) * g.cols)]), below * g.cols, fill, g.vw)
            if lo > 0 or hi < g.cols:
                with for_range(b, g.h, name="zr") as ih:
                    row = b.gep(sub, [b.mul(b.add(ih, i64(g.pt)), i64(g.cols))])
                    _fill_run(b, row, lo, fill, g.vw)
                    _fill_run(b, b.gep(row, [i64(hi)]), g.cols - hi, fill, g.vw)


def _fill_run(b, ptr, count: int, fill, vw: int) -> None:
    """`count` floats from ptr set to the vector `fill`'s lanes."""
    full = count - count % vw
    if full > vw:
        with for_range(b, full, step=vw, name="fill") as i:
            vstore(b, fill, b.gep(ptr, [i]), vw)
    elif full:
        vstore(b, fill, ptr, vw)
    if count % vw:
        vstore(b, fill, b.gep(ptr, [i64(full)]), vw, count % vw)


def _spans(g: PlaneGeometry) -> list:
    """(lo, hi) per sub-plane q: the columns fill_plane writes in each of its rows (column j
    of sub-plane q holds input column j * sw + q - pl, where that is inside [0, w))."""
    spans = []
    for q in range(g.sw):
        lo = min(g.cols, max(0, -(-(g.pl - q) // g.sw)))
        hi = min(g.cols, (g.w - 1 + g.pl - q) // g.sw + 1)
        spans.append((lo, max(lo, hi)))
    return spans


def fill_plane(b, g: PlaneGeometry, src, plane) -> None:
    """Copy one input channel inside its padded plane, dealing columns by remainder mod sw:
    padded column c = iw + pl goes to sub-plane c % sw, column c // sw.  The columns every
    sub-plane fills are copied in one loop, whose loads LLVM vectorizes as an interleaved
    group (all sw phases of a run of input columns at once); the ragged edges loop apart."""
    with for_range(b, g.h, name="fr") as ih:
        _deal_row(b, g, b.gep(src, [b.mul(ih, i64(g.w))]), _rows_at(b, g, plane, b.add(ih, i64(g.pt))))


def fill_plane_band(b, g: PlaneGeometry, src, band, first_row) -> None:
    """Padded rows first_row .. first_row + g.rows of one input channel into `band` (g: a
    PlaneGeometry.band), whole: its input rows dealt, with their border columns, and rows
    of padding (or past the image) set to zero."""
    fill = ir.Constant(ir.VectorType(F32, g.vw), [0.0] * g.vw)
    spans = _spans(g)
    with for_range(b, g.rows, name="br") as r:
        ih = b.sub(b.add(first_row, r), i64(g.pt))
        rows = _rows_at(b, g, band, r)
        inside = b.and_(b.icmp_signed(">=", ih, i64(0)), b.icmp_signed("<", ih, i64(g.h)))
        with b.if_else(inside) as (then, otherwise):
            with then:
                _deal_row(b, g, b.gep(src, [b.mul(ih, i64(g.w))]), rows)
                for row, (lo, hi) in zip(rows, spans):
                    _fill_run(b, row, lo, fill, g.vw)
                    _fill_run(b, b.gep(row, [i64(hi)]), g.cols - hi, fill, g.vw)
            with otherwise:
                for row in rows:
                    _fill_run(b, row, g.cols, fill, g.vw)


def _rows_at(b, g: PlaneGeometry, plane, row) -> list:
    """Row `row` of each sub-plane of `plane`."""
    return [b.gep(plane, [b.add(i64(q * g.sub_plane), b.mul(row, i64(g.cols)))]) for q in range(g.sw)]


def _deal_row(b, g: PlaneGeometry, srow, drows) -> None:
    """One input row's columns into the rows `drows` of the sub-planes (see fill_plane)."""
    spans = _spans(g)
    j0 = max(lo for lo, _ in spans)
    j1 = max(j0, min(hi for _, hi in spans))

    def copy(qs, start, stop, name):
        if stop <= start:
            return
        if g.sw == 1:
            copy_run(b, b.gep(srow, [i64(start - g.pl)]), b.gep(drows[0], [i64(start)]),
                     stop - start, g.vw)
            return
        if g.sw == 2 and len(qs) == 2 and stop - start >= g.vw:
            # Even and odd columns: two vectors in, two shuffles, two vectors out.
            vw = g.vw
            evens = ir.Constant(ir.VectorType(I32, vw), [2 * i for i in range(vw)])
            odds = ir.Constant(ir.VectorType(I32, vw), [2 * i + 1 for i in range(vw)])
            full = (stop - start) // vw * vw
            with for_range(b, start + full, start=start, step=vw, name=name) as j:
                at = b.sub(b.mul(j, i64(2)), i64(g.pl))
                lo_v = vload(b, b.gep(srow, [at]), vw)
                hi_v = vload(b, b.gep(srow, [b.add(at, i64(vw))]), vw)
                vstore(b, b.shuffle_vector(lo_v, hi_v, evens), b.gep(drows[0], [j]), vw)
                vstore(b, b.shuffle_vector(lo_v, hi_v, odds), b.gep(drows[1], [j]), vw)
            start += full
            if stop <= start:
                return
        with for_range(b, stop, start=start, name=name) as j:
            for q in qs:
                iw = b.add(b.mul(j, i64(g.sw)), i64(q - g.pl))
                b.store(b.load(b.gep(srow, [iw])), b.gep(drows[q], [j]))
    copy(range(g.sw), j0, j1, "fc")
    for q, (lo, hi) in enumerate(spans):
        copy([q], lo, min(hi, j0), f"fl{q}")
        copy([q], max(lo, j1), hi, f"fh{q}")


def _filter_rows(k, g: PlaneGeometry, img, mi, ci, first, last, plane, y, w, bias) -> None:
    """One filter over one input channel: every output row, all its vectors at once."""
    b, vw = k.b, g.vw
    wbase = b.mul(b.add(b.mul(mi, i64(g.cg)), ci), i64(g.kh * g.kw))
    taps = [[splat(b, b.load(b.gep(w, [b.add(wbase, i64(r * g.kw + c))])), vw) for c in range(g.kw)]
            for r in range(g.kh)]
    init = splat(b, b.load(b.gep(bias[0], [mi])), vw) if bias is not None else \
        ir.Constant(ir.VectorType(F32, vw), [0.0] * vw)
    ybase = b.mul(b.add(b.mul(img, i64(g.m)), mi), i64(g.oh * g.ow))
    with for_range(b, g.oh, name="oh") as oh:
        yrow = b.add(ybase, b.mul(oh, i64(g.ow)))

        def chunks(col0, valids):
            accs = []
            for ch, valid in enumerate(valids):
                col = b.add(col0, i64(ch * vw))
                prev = vload(b, b.gep(y, [b.add(yrow, col)]), vw, valid)
                acc = b.select(first, init, prev)
                for r in range(g.kh):
                    prow = b.mul(b.add(b.mul(oh, i64(g.sh)), i64(r * g.dh)), i64(g.cols))
                    for c in range(g.kw):
                        q, off = g.tap(c)
                        p = b.gep(plane, [b.add(b.add(prow, col), i64(q * g.sub_plane + off))])
                        acc = fmuladd(b, taps[r][c], vload(b, p, vw), acc)
                accs.append((col, valid, acc))
            # The last input channel's pass stores through the epilogue; others accumulate.
            with b.if_else(last) as (then, otherwise):
                with then:
                    for col, valid, acc in accs:
                        if k.epilogue is not None:
                            k.epilogue(b, acc, img, mi, b.add(b.mul(oh, i64(g.ow)), col), valid)
                        else:
                            vstore(b, acc, b.gep(y, [b.add(yrow, col)]), vw, valid)
                with otherwise:
                    for col, valid, acc in accs:
                        vstore(b, acc, b.gep(y, [b.add(yrow, col)]), vw, valid)
        for_row_chunks(b, g, chunks)


def for_row_chunks(b, g: PlaneGeometry, emit) -> None:
    """Cover an output row in vectors: emit(col0, valids) emits len(valids) adjacent vectors
    from column col0, each with its count of valid lanes.  A row of up to 8 vectors is
    emitted whole (independent accumulators for the FMA pipes); a longer one in a loop of
    4 vectors at a time, then the rest."""
    vw = g.vw
    if g.chunks <= 8:
        emit(i64(0), [min(vw, g.ow - ch * vw) for ch in range(g.chunks)])
        return
    full = g.ow // vw
    blocks = full // 4
    with for_range(b, i64(blocks * 4 * vw), step=4 * vw, name="cb") as col0:
        emit(col0, [vw] * 4)
    emit(i64(blocks * 4 * vw), [vw] * (full - blocks * 4) + ([g.ow % vw] if g.ow % vw else []))


# Taps unrolled per output vector, at most (a larger window goes to the generic kernels).
MAX_TAPS = 64


def patch_panel(b, g: PlaneGeometry, planes, dst, nr: int, n0) -> None:
    """One NR-wide panel of the patch matrix (im2col) from dealt planes: dst[kk][j] for
    output pixels n0 + j.  The panel's pixels are runs along output rows, and each run of
    each tap is a contiguous stretch of one sub-plane row (zeros in the padding): a plain
    copy, whatever the stride.  Columns past the last pixel are zero."""
    n_total = g.oh * g.ow
    oh0, ow0 = b.udiv(n0, i64(g.ow)), b.urem(n0, i64(g.ow))
    runs = (nr + g.ow - 2) // g.ow + 1            # output rows a panel can touch
    valid = b.sub(i64(n_total), n0)
    valid = b.select(b.icmp_signed("<", valid, i64(nr)), valid, i64(nr))
    if nr % g.vw == 0:
        return _patch_panel_vectors(b, g, planes, dst, nr, oh0, ow0, runs, valid)
    with for_range(b, g.cg, name="pc") as ci:
        with for_range(b, g.kh, name="pkh") as khi:
            with for_range(b, g.kw, name="pkw") as kwi:
                kk = b.add(b.mul(b.add(b.mul(ci, i64(g.kh)), khi), i64(g.kw)), kwi)
                drow = b.gep(dst, [b.mul(kk, i64(nr))])
                tap = b.mul(kwi, i64(g.dw))          # sub-plane tap % sw, column tap // sw
                sub = b.add(b.mul(ci, i64(g.size)),
                            b.add(b.mul(b.urem(tap, i64(g.sw)), i64(g.sub_plane)), b.udiv(tap, i64(g.sw))))
                # Runtime loops over the runs (not unrolled: one copy loop per convolution
                # keeps LLVM's time on ResNet-50 down).  Run s: output row oh0 + s from
                # column (ow0 if s == 0 else 0), into panel columns from j0 = s * OW - ow0
                # (0 for the first run), up to `valid`.
                with for_range(b, runs, name="run") as s_:
                    first = b.icmp_signed("==", s_, i64(0))
                    col0 = b.select(first, ow0, i64(0))
                    j0 = b.select(first, i64(0), b.sub(b.mul(s_, i64(g.ow)), ow0))
                    count = b.sub(i64(g.ow), col0)
                    room = b.sub(valid, j0)
                    count = b.select(b.icmp_signed("<", room, count), room, count)
                    prow = b.add(b.mul(b.add(oh0, s_), i64(g.sh)), b.mul(khi, i64(g.dh)))
                    src = b.gep(planes, [b.add(sub, b.add(b.mul(prow, i64(g.cols)), col0))])
                    out = b.gep(drow, [j0])
                    copy_run(b, src, out, count, g.vw)
                with for_range(b, nr, start=valid, name="pz") as j:
                    b.store(ir.Constant(F32, 0.0), b.gep(drow, [j]))


def _patch_panel_vectors(b, g: PlaneGeometry, planes, dst, nr: int, oh0, ow0, runs: int, valid) -> None:
    """patch_panel for a panel of whole vectors.  Which lanes of each panel vector come from
    which run, and from where relative to the tap, is worked out once per panel; each tap
    then costs one masked load per (vector, run) -- each merging into the last -- and a
    store per vector, where a copy loop per run cost several times that."""
    vw = g.vw
    lanes = ir.VectorType(I64, vw)
    parts = []          # per panel vector: [(mask, source offset of its lane 0)] per run
    for d in range(nr // vw):
        lane = b.add(splat(b, i64(d * vw), vw), ir.Constant(lanes, list(range(vw))))
        vec_parts = []
        for s in range(runs):
            # Run s: output row oh0 + s from column (ow0 if s == 0 else 0), panel columns
            # [j0, j0 + count) with j0 = s * OW - ow0 (0 for the first), within `valid`.
            col0 = ow0 if s == 0 else i64(0)
            j0 = i64(0) if s == 0 else b.sub(i64(s * g.ow), ow0)
            end = b.add(j0, b.sub(i64(g.ow), col0))
            end = b.select(b.icmp_signed("<", valid, end), valid, end)
            mask = b.and_(b.icmp_signed(">=", lane, splat(b, j0, vw)),
                          b.icmp_signed("<", lane, splat(b, end, vw)))
            row = b.mul(b.add(oh0, i64(s)), i64(g.sh * g.cols))
            vec_parts.append((mask, b.add(b.sub(b.add(row, col0), j0), i64(d * vw))))
        parts.append(vec_parts)
    vty = ir.VectorType(F32, vw)
    zero = ir.Constant(vty, [0.0] * vw)
    with for_range(b, g.cg, name="pc") as ci:
        with for_range(b, g.kh, name="pkh") as khi:
            with for_range(b, g.kw, name="pkw") as kwi:
                kk = b.add(b.mul(b.add(b.mul(ci, i64(g.kh)), khi), i64(g.kw)), kwi)
                tap = b.mul(kwi, i64(g.dw))          # sub-plane tap % sw, column tap // sw
                base = b.add(b.add(b.mul(ci, i64(g.size)), b.mul(khi, i64(g.dh * g.cols))),
                             b.add(b.mul(b.urem(tap, i64(g.sw)), i64(g.sub_plane)), b.udiv(tap, i64(g.sw))))
                for d, vec_parts in enumerate(parts):
                    v = zero
                    for mask, offset in vec_parts:
                        v = masked_load(b, b.gep(planes, [b.add(base, offset)]), mask, v)
                    vstore(b, v, b.gep(dst, [b.add(b.mul(kk, i64(nr)), i64(d * vw))]), vw)


def emit_max_pool_planes(k, vw: int) -> None:
    """2-D f32 max pooling over planes padded with -inf: each tap of an output row is a
    contiguous vector load and a maximum (NaN-propagating, as NumPy's)."""
    b = k.b
    (y, _), (x, xt) = k.outs[0], k.ins[0]
    g = PlaneGeometry(k.node, vw)
    planes = k.scratch
    zero_planes(b, g, planes, 1, float("-inf"))
    n, c = xt.shape[:2]
    lo, hi = k.split.range(b, n * c)           # a split task's planes (pool.pool_work)
    with for_range(b, hi, start=lo, name="pp") as nc:
        fill_plane(b, g, b.gep(x, [b.mul(nc, i64(g.h * g.w))]), planes)
        ybase = b.mul(nc, i64(g.oh * g.ow))
        with for_range(b, g.oh, name="oh") as oh:
            yrow = b.add(ybase, b.mul(oh, i64(g.ow)))

            def chunks(col0, valids):
                for ch, valid in enumerate(valids):
                    col = b.add(col0, i64(ch * vw))
                    acc = nan = None
                    for r in range(g.kh):
                        prow = b.mul(b.add(b.mul(oh, i64(g.sh)), i64(r * g.dh)), i64(g.cols))
                        for c_ in range(g.kw):
                            q, off = g.tap(c_)
                            p = b.gep(planes, [b.add(b.add(prow, col), i64(q * g.sub_plane + off))])
                            v = vload(b, p, vw)
                            # One vmaxps (`acc > v ? acc : v`) and a NaN flag per tap, rather
                            # than llvm.maximum's six instructions: NaN still wins the window.
                            is_nan = b.fcmp_unordered("uno", v, v)
                            if acc is None:
                                acc, nan = v, is_nan
                            else:
                                acc = b.select(b.fcmp_ordered(">", acc, v), acc, v)
                                nan = b.or_(nan, is_nan)
                    acc = b.select(nan, ir.Constant(ir.VectorType(F32, vw), [float("nan")] * vw), acc)
                    vstore(b, acc, b.gep(y, [b.add(yrow, col)]), vw, valid)
            for_row_chunks(b, g, chunks)


def aligned_floats(floats: int) -> int:
    """`floats` rounded up to whole 64-byte cache lines (where scratch parts start)."""
    return -(-floats // 16) * 16


def offsets_global(module, offsets: list):
    """A constant i32 array of `offsets` in `module` (one per distinct table)."""
    import zlib
    data = ",".join(map(str, offsets)).encode()
    name = f"conv_taps_{len(offsets)}_{zlib.crc32(data):08x}"
    if name in module.globals:
        return module.globals[name]
    ty = ir.ArrayType(ir.IntType(32), len(offsets))
    g = ir.GlobalVariable(module, ty, name=name)
    g.initializer = ir.Constant(ty, offsets)
    g.global_constant = True
    g.linkage = "internal"
    return g
