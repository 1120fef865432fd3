"""The JIT's native work pool (backends/cpu/threads.py): parallel_for runs every item exactly
once, whatever thread runs it; concurrent rounds on one pool are each complete; close() stops
the workers."""
from __future__ import annotations

import ctypes
import threading

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from glowgen.backends.cpu.jit import optimize, target_machine
from glowgen.backends.cpu.llvmutil import I8P, I64, for_range, i64
from glowgen.backends.cpu.threads import PARALLEL_FOR_TYPE, TASK_TYPE, ThreadPool, _pool_functions


def _program():
    """run(parallel_for, pool, n, out): out[i] = a hash of i iterated 2000 times, plus how many
    times item i ran (so a duplicate or a miss shows)."""
    m = ir.Module("pool_test")
    task = ir.Function(m, TASK_TYPE, "task")
    env, i = task.args
    b = ir.IRBuilder(task.append_basic_block("entry"))
    out = b.bitcast(env, I64.as_pointer())
    acc = b.alloca(I64)
    b.store(i, acc)
    with for_range(b, 2000):
        a = b.load(acc)
        b.store(b.add(b.mul(a, i64(6364136223846793005)), i64(1442695040888963407)), acc)
    slot = b.gep(out, [i])
    b.store(b.add(b.load(slot), b.load(acc)), slot)
    b.ret_void()
    run = ir.Function(m, ir.FunctionType(ir.VoidType(), [PARALLEL_FOR_TYPE.as_pointer(), I8P, I64, I8P]), "run")
    pf, pool, n, e = run.args
    b = ir.IRBuilder(run.append_basic_block("entry"))
    b.call(pf, [pool, n, task, e])
    b.ret_void()
    tm = target_machine()
    engine = llvm.create_mcjit_compiler(optimize(str(m), tm), tm)
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)(
        engine.get_function_address("run"))
    return engine, fn


def test_parallel_for_runs_each_item_once_like_the_serial_loop():
    engine, run = _program()
    n = 3001
    serial = np.zeros(n, np.int64)
    run(_pool_functions()[1], None, n, serial.ctypes.data)       # no pool: the serial path
    pool = ThreadPool(3)
    try:
        for rounds in (1, 7, 200):
            for _ in range(rounds):
                out = np.zeros(n, np.int64)
                run(pool.parallel_for, pool.pointer, n if rounds == 1 else 37, out.ctypes.data)
                want = serial if rounds == 1 else np.concatenate([serial[:37], np.zeros(n - 37, np.int64)])
                assert np.array_equal(out, want)
    finally:
        pool.close()


def test_concurrent_rounds_on_one_pool_are_each_complete():
    engine, run = _program()
    n = 1000
    serial = np.zeros(n, np.int64)
    run(_pool_functions()[1], None, n, serial.ctypes.data)
    pool = ThreadPool(2)
    outs = [np.zeros(n, np.int64) for _ in range(4)]
    wrong = []

    def caller(out):
        for _ in range(10):
            out[:] = 0
            run(pool.parallel_for, pool.pointer, n, out.ctypes.data)
            if not np.array_equal(out, serial):
                wrong.append(out.copy())

    threads = [threading.Thread(target=caller, args=(o,)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.close()
    assert not wrong
    assert all(not w.is_alive() for w in pool._workers)
