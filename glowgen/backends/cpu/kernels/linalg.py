"""Matrix products (through the register-blocked GEMM of gemm.py for f32, plain loops
for other types) and einsum."""
from __future__ import annotations

from ....speclib.shapes import einsum_parse
from ..gemm import emit_gemm, gemm_items, pack_panels_size
from ..llvmutil import for_range, i64, register_type
from ..loops import contiguous_strides
from ..parallel import WHOLE, Work, parallel
from ..scalar import ScalarEmitter, Value, const, convert, load_elem, store_elem
from ..packing import gemv_panel_width
from .base import PACKING, PRODUCT_SPACE, STRATEGY, KernelArgs, hook, kernel
from .common import lin, nest


@kernel("BatchMatMul")
def batch_matmul(k: KernelArgs):
    (y, yt), (a, at), (c, _) = k.outs[0], k.ins[0], k.ins[1]
    if k.strategy != "gemm":
        return batch_matmul_loops(k)
    b = k.b
    nb, m, kk = at.shape
    n = k.node.inputs[1].type.shape[2]
    packed = k.packed == "b"          # a constant rhs in panels (packing.py)
    width = k.packed_nr if packed else None
    c_stride = pack_panels_size(n, kk, k.gemm_shape, width) if packed else kk * n
    # A split (bmm_work) shares out the batch, or else B's panels or A's row blocks.
    split = k.split
    by_batch = nb > 1
    lo, hi = split.range(b, nb) if by_batch else (i64(0), i64(nb))
    inner = WHOLE if by_batch else split
    with for_range(b, hi, start=lo, name="bmm") as bi:
        epi = None
        if k.epilogue is not None:
            epi = lambda bb, v, row, col, valid: k.epilogue(bb, v, bi, row, col, valid)  # noqa: E731
        emit_gemm(b, k.gemm_shape, m, n, kk, b.gep(a, [b.mul(bi, i64(m * kk))]), kk,
                  b.gep(c, [b.mul(bi, i64(c_stride))]), None if packed else n,
                  b.gep(y, [b.mul(bi, i64(m * n))]), n, epilogue=epi, name="mm", panel_nr=width,
                  split=inner, split_rows=not packed)


@parallel("BatchMatMul")
def bmm_work(node, shape, ins) -> Work:
    nb, m, kk = node.inputs[0].type.shape
    n = node.inputs[1].type.shape[2]
    if shape is None or ins.plan.strategy != "gemm":
        return Work(1)
    packed = ins.plan.packed == "b"
    items = nb if nb > 1 else gemm_items(m, n, shape, not packed, ins.plan.packed_nr)
    # A product with few rows streams B from memory: its time is B's size, not its FLOPs.
    return Work(items, flops=2.0 * nb * m * n * kk, elements=nb * kk * n / 4)


@hook(STRATEGY, "BatchMatMul")
def bmm_strategy(ins, shape, packable, plan) -> str:
    """f32 products run the register-blocked GEMM; other types, plain loops."""
    return "gemm" if shape is not None and ins.node.outputs[0].type.dtype == "f32" else "loops"


@hook(PACKING, "BatchMatMul")
def bmm_packing(ins, shape):
    """A constant right-hand side (operand 2: y, a, b) in panels as wide as the product's
    tiles (packing.gemv_panel_width)."""
    if ins.plan.strategy != "gemm":
        return None
    m = ins.node.inputs[0].type.shape[1]
    n = ins.node.inputs[1].type.shape[2]
    return 2, "b", gemv_panel_width(shape, m, n)


@hook(PRODUCT_SPACE, "BatchMatMul")
def bmm_product_space(ins, features: str = ""):
    return tuple(ins.node.outputs[0].type.shape) if ins.plan.strategy == "gemm" else None


def batch_matmul_loops(k: KernelArgs):
    """Any element type: plain loops (i, k, j order, so the j loop vectorizes)."""
    b = k.b
    (y, yt), (a, at), (c, ct) = k.outs[0], k.ins[0], k.ins[1]
    nb, m, kk = at.shape
    n = ct.shape[2]
    dtype = yt.dtype
    em = ScalarEmitter(b, k.scalars)
    zero = Value(const(0, dtype), dtype)
    with for_range(b, nb, name="bb") as bb:
        with for_range(b, m, name="m") as mi:
            yrow = b.add(b.mul(bb, i64(m * n)), b.mul(mi, i64(n)))
            with for_range(b, n, name="z") as j:
                store_elem(b, zero, b.gep(y, [b.add(yrow, j)]), dtype)
            with for_range(b, kk, name="k") as ki:
                av = load_elem(b, b.gep(a, [b.add(b.mul(bb, i64(m * kk)), b.add(b.mul(mi, i64(kk)), ki))]), dtype)
                crow = b.add(b.mul(bb, i64(kk * n)), b.mul(ki, i64(n)))
                with for_range(b, n, name="n") as j:
                    p = b.gep(y, [b.add(yrow, j)])
                    cv = load_elem(b, b.gep(c, [b.add(crow, j)]), dtype)
                    store_elem(b, em.f_add(load_elem(b, p, dtype), em.f_mul(av, cv)), p, dtype)


# --------------------------------------------------------------------------- einsum
@kernel("Einsum")
def einsum(k: KernelArgs):
    """One loop per output label, then one per summed label; every operand reads through
    its strides per label (a repeated label sums its strides: a diagonal; a broadcast
    dimension of size 1 has stride 0)."""
    b = k.b
    (y, yt) = k.outs[0]
    xs = k.ins[0]
    shapes = [t.shape for _, t in xs]
    labels, out_labels = einsum_parse(k.attrs["equation"], shapes)
    sizes: dict = {}
    for ls, s in zip(labels, shapes):
        for l, d in zip(ls, s):
            if d != 1 or l not in sizes:
                sizes[l] = d
    summed = [l for ls in labels for l in ls if l not in out_labels]
    summed = list(dict.fromkeys(summed))
    order = list(out_labels) + summed
    strides = []
    for ls, s in zip(labels, shapes):
        own = contiguous_strides(s)
        per = {l: 0 for l in order}
        for l, d, st in zip(ls, s, own):
            if d != 1:
                per[l] += st
        strides.append([per[l] for l in order])
    dtype = yt.dtype
    acc_t = "f32" if dtype in ("f16", "bf16") else dtype
    ys = contiguous_strides([sizes[l] for l in out_labels])
    acc_p = b.alloca(register_type(acc_t))

    def per_out(oidx):
        b.store(const(0, acc_t), acc_p)

        def per_sum(sidx):
            idx = oidx + sidx
            em = ScalarEmitter(b, k.scalars)
            prodv = None
            for (ptr, t), st in zip(xs, strides):
                v = convert(b, load_elem(b, b.gep(ptr, [lin(b, idx, st)]), t.dtype), acc_t)
                prodv = v if prodv is None else em.f_mul(prodv, v)
            b.store(em.f_add(Value(b.load(acc_p), acc_t), prodv).v, acc_p)
        nest(b, [sizes[l] for l in summed], per_sum, "es")
        store_elem(b, Value(b.load(acc_p), acc_t), b.gep(y, [lin(b, oidx, ys)]), dtype)
    nest(b, [sizes[l] for l in out_labels], per_out, "eo")
