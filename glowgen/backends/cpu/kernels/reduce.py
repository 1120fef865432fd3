"""Reductions along axes and along one axis: sums, products, extremes, arg-max and
arg-min, hard max, top-k, cumulative sums and products."""
from __future__ import annotations

from llvmlite import ir

from ..llvmutil import F32, I1, I64, call_intrinsic, for_range, i64, is_float, is_signed, register_type
from ..loops import contiguous_strides, strided_loops
from ..scalar import ScalarEmitter, Value, const, load_elem, store_elem
from ..vectors import f32_vector, lane_mask, vload
from .base import ROWS, KernelArgs, hook, kernel
from .common import extreme, lin, nest, split_axis


# --------------------------------------------------------------------------- reductions
def _identity(init, dtype: str):
    return extreme(init, dtype) if init in ("-inf", "inf") else init


@kernel("ReduceSum", combine="add", init=0)
@kernel("ReduceMax", combine="max", init="-inf")
@kernel("ReduceMin", combine="min", init="inf")
@kernel("ReduceProd", combine="mul", init=1)
def reduce_(k: KernelArgs, combine: str, init):
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    axes = set(k.attrs["axes"]) if len(k.attrs["axes"]) else set(range(xt.rank))
    if _reduce_rows_in_vectors(k, combine, axes):
        return
    start = Value(const(_identity(init, yt.dtype), yt.dtype), yt.dtype)

    def fill(b, ptrs):
        store_elem(b, start, ptrs[0], yt.dtype)
    strided_loops(k.b, (yt.size,), [y], [(1,)], [0], fill, name="f")
    # y viewed with x's rank: reduced axes have stride 0.
    kept = [1 if i in axes else d for i, d in enumerate(xt.shape)]
    ymap = [0 if i in axes else s for i, s in enumerate(contiguous_strides(kept))]

    def body(b, ptrs):
        em = ScalarEmitter(b, k.scalars)
        acc = load_elem(b, ptrs[1], yt.dtype)
        v = load_elem(b, ptrs[0], xt.dtype)
        store_elem(b, getattr(em, "f_" + combine)(acc, v), ptrs[1], yt.dtype)
    strided_loops(k.b, xt.shape, [x, y], [contiguous_strides(xt.shape), ymap], [0, 0], body)


# Row reductions in vectors: how many accumulators run side by side (the adds' latency).
_ROW_ACCUMULATORS = 4
_VECTOR_OPS = {"add": None, "max": "maximum", "min": "minimum"}


def _vector_rows(combine: str, xt, yt, axes: set, vw: int):
    """(rows, row length) when a reduction runs as vector row reductions, else None."""
    rank = xt.rank
    trailing = set(range(rank - len(axes), rank))
    row = 1
    for d in xt.shape[rank - len(axes):]:
        row *= d
    if (combine not in _VECTOR_OPS or xt.dtype != "f32" or yt.dtype != "f32" or not axes
            or axes != trailing or vw < 4 or row < 2 * vw or yt.size == 0):
        return None
    return yt.size, row


@hook(ROWS, "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce_rows(ins, gemm_shape):
    """Row reductions in vectors work row by row (the row-fusion pass, rows.py)."""
    combine = {"ReduceSum": "add", "ReduceMax": "max", "ReduceMin": "min"}[ins.kind]
    y, x = ins.writes()[0], ins.reads()[0]
    axes = list(ins.node.attr_values()["axes"])
    axes = set(axes) if axes else set(range(x.type.rank))
    return _vector_rows(combine, x.type, y.type, axes, gemm_shape.vw if gemm_shape is not None else 0)


def _reduce_rows_in_vectors(k: KernelArgs, combine: str, axes: set) -> bool:
    """f32 sums, maxima and minima over trailing axes (softmax's and layer norm's rows) in
    vectors: `_ROW_ACCUMULATORS` vector accumulators over the row, combined pairwise and then
    lanes halved in a tree, in a fixed order, at its end.  The scalar loop's chain of dependent adds ran at one element
    every few cycles (softmax over 4x128x128: ReduceSum 37 us).  The order is fixed by the
    shape, so results do not depend on threads or inputs; llvm.maximum/minimum give the same
    result in any order, a sum differs from the sequential one by rounding only."""
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    vw = k.gemm_shape.vw if k.gemm_shape is not None else 0
    space = _vector_rows(combine, xt, yt, axes, vw)
    if space is None:
        return False
    row = space[1]
    b = k.b
    vty = f32_vector(vw)
    op = _VECTOR_OPS[combine]
    identity = {"add": 0.0, "max": float("-inf"), "min": float("inf")}[combine]
    start = ir.Constant(vty, [identity] * vw)
    lanes = min(_ROW_ACCUMULATORS, row // vw)
    with b.goto_entry_block():
        slots = [b.alloca(vty, name=f"racc{j}") for j in range(lanes)]
        bad_slot = b.alloca(ir.VectorType(I1, vw), name="rbad") if op is not None else None
        out_slot = b.alloca(F32, name="rout")

    def exact(p, q):
        return b.fadd(p, q) if op is None else call_intrinsic(b, op, [p, q])

    def cheap(p, q):
        # An x86 max/min (one instruction): a NaN in q is dropped and the sign of a zero
        # result is the order's; `bad` notes what it may have got wrong.
        return b.select(b.fcmp_ordered(">" if combine == "max" else "<", q, p), q, p)

    lo, hi = k.split.range(b, yt.size)        # a row group's block (rows.py), or all rows
    with for_range(b, hi, start=lo, name="rrow") as r:
        base = b.gep(x, [b.mul(r, i64(row))])
        if op is None:
            b.store(_row_total(b, base, row, vw, slots, exact, start), b.gep(y, [r]))
        else:
            # Extremes: first with the cheap max/min, noting NaNs; a row with a NaN, or whose
            # extreme is a zero (llvm.maximum orders -0 below +0), is done again exactly, so
            # the result is llvm.maximum's (minimum's) in every case.
            b.store(ir.Constant(bad_slot.type.pointee, [0] * vw), bad_slot)

            def note(v):
                b.store(b.or_(b.load(bad_slot), b.fcmp_unordered("uno", v, v)), bad_slot)
            total = _row_total(b, base, row, vw, slots, cheap, start, note)
            bits = b.bitcast(b.load(bad_slot), ir.IntType(vw))
            redo = b.or_(b.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(vw), 0)),
                         b.fcmp_unordered("ueq", total, ir.Constant(F32, 0.0)))
            b.store(total, out_slot)
            with b.if_then(redo, likely=False):
                b.store(_row_total(b, base, row, vw, slots, exact, start), out_slot)
            b.store(b.load(out_slot), b.gep(y, [r]))
    return True


def _row_total(b, base, row: int, vw: int, slots: list, join, start, note=None):
    """One row's reduction with `join`: len(slots) vector accumulators over the row, combined
    pairwise and then lane by lane in a fixed order.  `note(v)` sees every vector read."""
    lanes = len(slots)
    step = lanes * vw
    for slot in slots:
        b.store(start, slot)
    with for_range(b, row // step, name="rblk") as c:
        at = b.mul(c, i64(step))
        for j, slot in enumerate(slots):
            v = vload(b, b.gep(base, [b.add(at, i64(j * vw))]), vw)
            if note is not None:
                note(v)
            b.store(join(b.load(slot), v), slot)
    accs = [b.load(slot) for slot in slots]
    done = row // step * step
    for j, at in enumerate(range(done, row, vw)):     # the rest, the last vector masked
        valid = min(vw, row - at)
        v = vload(b, b.gep(base, [i64(at)]), vw, valid)
        if valid < vw:        # masked-off lanes hold the identity, not 0
            v = b.select(lane_mask(vw, valid), v, start)
        if note is not None:
            note(v)
        accs[j % lanes] = join(accs[j % lanes], v)
    while len(accs) > 1:       # pairwise, in a fixed order
        accs = [join(accs[i], accs[i + 1]) if i + 1 < len(accs) else accs[i]
                for i in range(0, len(accs), 2)]
    # Lanes halved in a tree (log2(vw) dependent steps, not vw - 1: a row's sum or
    # extreme was a chain of 15 scalar operations, the latency of short rows).
    acc = accs[0]
    width = vw
    while width > 1:
        width //= 2
        mask = [i + width if i < width else i for i in range(vw)]
        acc = join(acc, b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(ir.IntType(32), vw), mask)))
    return b.extract_element(acc, i64(0))


# --------------------------------------------------------------------------- arg-max and friends
def _better(b, v: Value, best: Value, largest: bool, ties: bool, nan_best: bool = True):
    """v replaces best: strictly larger (smaller), or equal when `ties`.  A NaN beats every
    number when `nan_best` (NumPy's argmax and argmin), loses to every number otherwise
    (NumPy's ascending sort puts NaN last); between two NaNs the tie rule decides."""
    op = (">=" if ties else ">") if largest else ("<=" if ties else "<")
    if not is_float(v.dtype):
        cmp = b.icmp_signed if is_signed(v.dtype) else b.icmp_unsigned
        return cmp(op, v.v, best.v)
    plain = b.fcmp_ordered(op, v.v, best.v)
    v_nan = b.fcmp_unordered("uno", v.v, v.v)
    best_nan = b.fcmp_unordered("uno", best.v, best.v)
    both = ir.Constant(I1, int(ties))
    if nan_best:
        return b.or_(plain, b.and_(v_nan, b.or_(b.not_(best_nan), both)))
    return b.or_(plain, b.and_(best_nan, b.or_(b.not_(v_nan), both)))


@kernel("ArgMax", largest=True)
@kernel("ArgMin", largest=False)
def arg_best(k: KernelArgs, largest: bool):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    axis = k.attrs["axis"]
    outer, n, inner = split_axis(xt.shape, axis)
    if yt.size == 0:
        return
    last = bool(k.attrs["select_last_index"])
    best = b.alloca(register_type(xt.dtype))
    at = b.alloca(I64)

    def body(idx):
        o, r = idx
        base = b.add(b.mul(o, i64(n * inner)), r)
        hit = _best_index(b, x, xt.dtype, base, n, inner, largest, last, best, at, "am")
        b.store(hit, b.gep(y, [lin(b, idx, (inner, 1))]))
    nest(b, (outer, inner), body, "ar")


def _best_index(b, x, dtype, base, n, inner, largest, last, best, at, name):
    """Index along the axis (elements base + i * inner) of the largest (or smallest) value;
    ties go to the first index, or the last with `last`.  `best` and `at` are scratch slots."""
    b.store(b.load(b.gep(x, [base])), best)
    b.store(i64(0), at)
    with for_range(b, n, start=1, name=name) as i:
        v = load_elem(b, b.gep(x, [b.add(base, b.mul(i, i64(inner)))]), dtype)
        with b.if_then(_better(b, v, Value(b.load(best), dtype), largest, last)):
            b.store(v.v, best)
            b.store(i, at)
    return b.load(at)


@kernel("Hardmax")
def hardmax(k: KernelArgs):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    axis = k.attrs["axis"]
    outer, n, inner = split_axis(xt.shape, axis)
    if yt.size == 0:
        return
    one, zero = const(1, yt.dtype), const(0, yt.dtype)
    best = b.alloca(register_type(xt.dtype))
    at = b.alloca(I64)

    def body(idx):
        o, r = idx
        base = b.add(b.mul(o, i64(n * inner)), r)
        hit = _best_index(b, x, xt.dtype, base, n, inner, True, False, best, at, "hm")
        with for_range(b, n, name="hw") as i:
            b.store(b.select(b.icmp_signed("==", i, hit), one, zero),
                    b.gep(y, [b.add(base, b.mul(i, i64(inner)))]))
    nest(b, (outer, inner), body, "hx")


@kernel("TopK")
def top_k(k: KernelArgs):
    """Insertion into the sorted k-prefix of the outputs, O(n k) per line; a value enters
    ahead of the kept ones only when strictly better, so equal values keep index order."""
    b = k.b
    (vy, vt), (iy, _), (x, xt) = k.outs[0], k.outs[1], k.ins[0]
    axis, kk, largest = k.attrs["axis"], k.attrs["k"], bool(k.attrs["largest"])
    outer, n, inner = split_axis(xt.shape, axis)
    if kk == 0 or vt.size == 0:
        return
    dtype = xt.dtype
    pos_p = b.alloca(I64)
    fn = b.function

    def body(idx):
        o, r = idx
        xbase = b.add(b.mul(o, i64(n * inner)), r)
        ybase = b.add(b.mul(o, i64(kk * inner)), r)

        def yat(p):
            off = b.add(ybase, b.mul(p, i64(inner)))
            return b.gep(vy, [off]), b.gep(iy, [off])
        with for_range(b, n, name="tk") as i:
            v = load_elem(b, b.gep(x, [b.add(xbase, b.mul(i, i64(inner)))]), dtype)
            count = b.select(b.icmp_signed("<", i, i64(kk)), i, i64(kk))
            b.store(count, pos_p)
            head = fn.append_basic_block("tk.head")
            shift = fn.append_basic_block("tk.shift")
            done = fn.append_basic_block("tk.done")
            b.branch(head)
            b.position_at_end(head)
            pos = b.load(pos_p)
            has_prev = b.icmp_signed(">", pos, i64(0))
            prev = b.select(has_prev, b.sub(pos, i64(1)), i64(0))
            pv, pi = yat(prev)
            wins = _better(b, v, load_elem(b, pv, dtype), largest, False, nan_best=largest)
            b.cbranch(b.and_(has_prev, wins), shift, done)
            b.position_at_end(shift)
            with b.if_then(b.icmp_signed("<", pos, i64(kk))):
                cv, ci = yat(pos)
                b.store(b.load(pv), cv)
                b.store(b.load(pi), ci)
            b.store(prev, pos_p)
            b.branch(head)
            b.position_at_end(done)
            pos = b.load(pos_p)
            with b.if_then(b.icmp_signed("<", pos, i64(kk))):
                cv, ci = yat(pos)
                b.store(v.v, cv)
                b.store(i, ci)
    nest(b, (outer, inner), body, "tkl")


# --------------------------------------------------------------------------- scans
@kernel("CumSum", is_sum=True)
@kernel("CumProd", is_sum=False)
def cumulative(k: KernelArgs, is_sum: bool):
    b = k.b
    (y, yt), (x, xt) = k.outs[0], k.ins[0]
    a = k.attrs
    axis = a["axis"]
    outer, n, inner = split_axis(xt.shape, axis)
    dtype = yt.dtype
    acc_p = b.alloca(register_type(dtype))

    def body(idx):
        o, r = idx
        base = b.add(b.mul(o, i64(n * inner)), r)
        b.store(const(0 if is_sum else 1, dtype), acc_p)
        with for_range(b, n, name="cs") as i:
            j = b.sub(i64(n - 1), i) if a["reverse"] else i
            p = b.add(base, b.mul(j, i64(inner)))
            em = ScalarEmitter(b, k.scalars)
            acc = Value(b.load(acc_p), dtype)
            new = (em.f_add if is_sum else em.f_mul)(acc, load_elem(b, b.gep(x, [p]), dtype))
            b.store(new.v, acc_p)
            store_elem(b, acc if a["exclusive"] else new, b.gep(y, [p]), dtype)
    nest(b, (outer, inner), body, "cu")
