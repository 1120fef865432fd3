"""Small helpers over llvmlite.ir: element types, counted loops, intrinsics."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Optional

from llvmlite import ir

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
I8P = I8.as_pointer()

# Element type name -> (LLVM storage type, is_float, is_signed).  bf16 is stored as its 16
# bits and computed in registers as the f32 of the same value (see register_type).
ELEM = {
    "f32": (F32, True, True), "f64": (F64, True, True), "f16": (F16, True, True),
    "bf16": (I16, True, True),
    "i8": (I8, False, True), "i16": (I16, False, True), "i32": (I32, False, True),
    "i64": (I64, False, True), "u8": (I8, False, False), "u16": (I16, False, False),
    "u32": (I32, False, False), "u64": (I64, False, False), "bool": (I8, False, False),
}


def storage_type(dtype: str) -> ir.Type:
    return ELEM[dtype][0]


def register_type(dtype: str) -> ir.Type:
    """The LLVM type a value of `dtype` has in registers: bool is i1, bf16 is f32 (holding a
    value bf16 represents exactly); every other type is its storage type."""
    if dtype == "bool":
        return I1
    if dtype == "bf16":
        return F32
    return storage_type(dtype)


def is_float(dtype: str) -> bool:
    return ELEM[dtype][1]


def is_signed(dtype: str) -> bool:
    return ELEM[dtype][2]


def i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


@contextmanager
def for_range(b: ir.IRBuilder, count, start=0, step=1, name: str = "i", vectorize: bool = True):
    """`for (i = start; i < count; i += step)` with a known or computed trip count.  With
    `vectorize=False`, LLVM's loop vectorizer leaves the loop alone (see no_vectorize)."""
    count = count if isinstance(count, ir.Value) else i64(count)
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    end = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    idx = b.phi(I64, name=name)
    idx.add_incoming(start if isinstance(start, ir.Value) else i64(start), pre)
    b.cbranch(b.icmp_signed("<", idx, count), body, end)
    b.position_at_end(body)
    yield idx
    nxt = b.add(idx, step if isinstance(step, ir.Value) else i64(step), name=f"{name}.next")
    idx.add_incoming(nxt, b.block)
    back = b.branch(head)
    if not vectorize:
        back.set_metadata("llvm.loop", no_vectorize(b.module))
    b.position_at_end(end)


def carried_loop(b: ir.IRBuilder, start: int, stop: int, values: list, body: Callable, name: str = "i",
                 index: str = "k") -> list:
    """A loop of stop - start (at least one) trips, i = start .. stop - 1, carrying `values`
    (rows of values: a register tile's sums) through them as phis: body(i, rows) returns the
    next rows; the rows after the last trip are returned.  The reductions of the register-
    blocked products (gemm.py, qgemm.py), whose sums stay in registers over the loop."""
    entry = b.block
    loop = b.append_basic_block(f"{name}.k")
    done = b.append_basic_block(f"{name}.kdone")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64, name=index)
    i.add_incoming(i64(start), entry)
    phis = [[b.phi(v.type) for v in row] for row in values]
    for row, row_values in zip(phis, values):
        for phi, v in zip(row, row_values):
            phi.add_incoming(v, entry)
    out = body(i, phis)
    i_next = b.add(i, i64(1))
    i.add_incoming(i_next, b.block)
    for row, row_out in zip(phis, out):
        for phi, v in zip(row, row_out):
            phi.add_incoming(v, b.block)
    b.cbranch(b.icmp_signed("<", i_next, i64(stop)), loop, done)
    b.position_at_end(done)
    return out


def in_turn(b: ir.IRBuilder, i, pair):
    """pair[i % 2] (i an i64 value): of two buffers used in turn (for_range_staged)."""
    return b.select(b.trunc(i, ir.IntType(1)), pair[1], pair[0])


@contextmanager
def for_range_staged(b: ir.IRBuilder, count, start, stage: Callable, drain: Optional[Callable] = None,
                     name: str = "i"):
    """`for (i = start; i < count; i++)` (i64 values) whose iterations' inputs are staged one
    ahead and their outputs drained one behind: stage(start) before the loop, stage(i + 1)
    at the top of iteration i (where there is one), then the body, then drain(i - 1) (but in
    the first), and drain(count - 1) after the loop.  Kernels that copy each item into a
    buffer of its own (two, used in turn) and read it whole right after: a vector load over
    stores just made that the store buffer cannot forward (narrower, or straddling two)
    waits until they reach the cache, and an item's copy made an iteration early has."""
    with b.if_then(b.icmp_signed("<", start, count)):
        stage(start)
    with for_range(b, count, start=start, name=name) as i:
        nxt = b.add(i, i64(1))
        with b.if_then(b.icmp_signed("<", nxt, count)):
            stage(nxt)
        yield i
        if drain is not None:
            with b.if_then(b.icmp_signed(">", i, start)):
                drain(b.sub(i, i64(1)))
    if drain is not None:
        with b.if_then(b.icmp_signed("<", start, count)):
            drain(b.sub(count, i64(1)))


def no_vectorize(module: ir.Module) -> ir.values.MDValue:
    """A loop ID (`!N = !{!N, !{"llvm.loop.vectorize.enable", i1 false}}`, its first operand
    itself, as LLVM requires) for a loop the vectorizer must not widen: one whose iterations
    read through a table, which LLVM would otherwise widen into gathers and scatters once
    the loop inside it is fully unrolled.  One node per loop: loop IDs must not be shared."""
    disable = module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"),
                                   ir.Constant(ir.IntType(1), 0)])
    loop_id = ir.values.MDValue(module, [], name=str(len(module.metadata)))
    loop_id.operands = (loop_id, disable)
    return loop_id


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    """Declare (once) an LLVM intrinsic such as llvm.maximum.f32."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


def type_suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{type_suffix(t.element)}"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.HalfType):
        return "f16"
    return f"i{t.width}"


def call_intrinsic(b: ir.IRBuilder, base: str, args: list, ret: ir.Type = None):
    t = args[0].type
    fn = intrinsic(b.module, f"llvm.{base}.{type_suffix(t)}", ret or t, [a.type for a in args])
    return b.call(fn, args)


class TargetModule(ir.Module):
    """An LLVM module that knows the target's feature string ("+avx512f,+fma,..."), for
    emitters that pick an instruction only some targets have."""

    def __init__(self, name: str, features: str):
        super().__init__(name=name)
        self.target_features = features or ""


def target_has(module: ir.Module, feature: str) -> bool:
    """Whether code in `module` may use `feature` (a plain module: the baseline only)."""
    features = module.target_features if isinstance(module, TargetModule) else ""
    return f"+{feature}" in features.split(",")


def round_to_i32(b: ir.IRBuilder, f):
    """f32 values (a scalar or a vector) rounded halves to even and converted to i32, for
    values known to lie within i32 and not NaN (fptosi of others is poison).  A vector of 8
    lanes takes `vcvtps2dq`, which rounds as MXCSR says: halves to even in the default
    floating-point environment that LLVM, and so every f32 operation of the kernels,
    already assumes; one of 16 lanes with AVX-512 `vcvtps2dq {rn-sae}`, halves to even
    whatever MXCSR says.  One instruction in place of vroundps and vcvttps2dq.  A scalar
    (a stacked loop's element, which LLVM vectorizes) takes `llvm.lrint`, which rounds by
    the same environment: vcvtps2dq once vectorized, cvtss2si otherwise."""
    vw = f.type.count if isinstance(f.type, ir.VectorType) else None
    it = I32 if vw is None else ir.VectorType(I32, vw)
    native = 16 if target_has(b.module, "avx512f") else 8 if target_has(b.module, "avx") else None
    if native and vw and vw > native and vw % native == 0:
        # Wider than a register (an int8 product's epilogue over a run of 32 lanes): by halves.
        from .vectors import join_vectors       # (vectors.py builds on this module)
        return join_vectors(b, [round_to_i32(b, b.shuffle_vector(
            f, ir.Constant(f.type, ir.Undefined), ir.Constant(ir.VectorType(I32, native), list(range(i, i + native)))))
            for i in range(0, vw, native)])
    if vw == 16 and target_has(b.module, "avx512f"):
        cvt = intrinsic(b.module, "llvm.x86.avx512.mask.cvtps2dq.512", it, [f.type, it, I16, I32])
        return b.call(cvt, [f, ir.Constant(it, [0] * vw), ir.Constant(I16, -1), ir.Constant(I32, 8)])
    if vw == 8 and target_has(b.module, "avx"):
        return b.call(intrinsic(b.module, "llvm.x86.avx.cvt.ps2dq.256", it, [f.type]), [f])
    if vw is None:      # lrint: vectorized by LLVM to vcvtps2dq where the loop vectorizes
        return b.call(intrinsic(b.module, "llvm.lrint.i32.f32", I32, [F32]), [f])
    return b.fptosi(call_intrinsic(b, "roundeven", [f]), it)
