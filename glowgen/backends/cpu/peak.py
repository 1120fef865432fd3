"""The machine's single-core FMA peak, measured: a JIT-compiled loop of independent vector
FMAs (12 accumulators hide the FMA latency), as wide as the target's vectors.  The layer
benchmark reports every kernel as a fraction of it."""
from __future__ import annotations

import ctypes
import time
from functools import lru_cache

from llvmlite import ir

from .llvmutil import F32, I64, i64, intrinsic

ACCUMULATORS = 12


def vector_width(features: str) -> int:
    """f32 lanes of the widest vectors the target's FMA units take."""
    return 16 if "+avx512f" in features.split(",") else 8


def _module(width: int) -> str:
    vec = ir.VectorType(F32, width)
    m = ir.Module("fma_peak")
    fn = ir.Function(m, ir.FunctionType(F32, [I64, F32, F32]), "fma_peak")
    iters, a, c = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = intrinsic(m, f"llvm.fma.v{width}f32", vec, [vec, vec, vec])
    splat = lambda x: b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(ir.IntType(32), 0)),  # noqa: E731
                                       ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))
    va, vc = splat(a), splat(c)
    loop, done = fn.append_basic_block("loop"), fn.append_basic_block("done")
    entry = b.block
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64)
    accs = [b.phi(vec) for _ in range(ACCUMULATORS)]
    new = [b.call(fma, [acc, va, vc]) for acc in accs]
    nxt = b.add(i, i64(1))
    i.add_incoming(i64(0), entry)
    i.add_incoming(nxt, loop)
    for k, (acc, n) in enumerate(zip(accs, new)):
        acc.add_incoming(ir.Constant(vec, [float(k)] * width), entry)
        acc.add_incoming(n, loop)
    b.cbranch(b.icmp_signed("<", nxt, iters), loop, done)
    b.position_at_end(done)
    total = new[0]
    for n in new[1:]:
        total = b.fadd(total, n)
    b.ret(b.extract_element(total, ir.Constant(ir.IntType(32), 0)))
    return str(m)


@lru_cache(maxsize=None)
def fma_peak_gflops(features: str) -> float:
    """Single-thread GFLOPS of the FMA loop for vectors as wide as `features` allow."""
    import llvmlite.binding as llvm
    from .jit import optimize, target_machine
    width = vector_width(features)
    tm = target_machine()
    engine = llvm.create_mcjit_compiler(optimize(_module(width), tm), tm)
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float, ctypes.c_float)(
        engine.get_function_address("fma_peak"))
    iters = 1_000_000
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        fn(iters, 0.999999, 1e-7)
        best = min(best, time.perf_counter() - t0)
    return 2 * width * ACCUMULATORS * iters / best / 1e9
