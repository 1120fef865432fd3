"""A native work pool for the JIT: `parallel_for(pool, n, task, env)` runs task(env, i) for
i in [0, n) on the caller's thread and the pool's workers.

Generated code takes the pool as two arguments of its entry point, a `parallel_for` function
pointer and an opaque pool pointer (a bundle's caller supplies its own: see main.c); this
module is the JIT's.  Its workers are Python threads parked inside native code (ctypes
releases the GIL for the whole call), so the pool needs no C compiler and no GIL: everything
they share is a few atomics in one block of memory, written here as LLVM IR.

Work is handed out one item at a time from a single 64-bit word, generation:16 | n:24 |
claimed:24, claimed by compare-and-swap: a worker can only claim an item of the round whose
count it read in the same word, so a late worker never takes an item of a round that has
ended.  `claimed` is a bit per item in a round of at most OWNED_ITEMS (each thread first
takes the item of its own place in the pool: see claim), else the next item to hand out.
The caller waits for `done` to reach n before it returns (and before it may start the next
round).  Which thread runs an item never changes what the item computes, so results do
not depend on the number of threads.  Idle workers spin for a while (the next kernel is
usually microseconds away) and then sleep on a futex; a round wakes them only if some sleep.

Two calls on one pool at once (two threads running one model) do not queue: the second runs
its items itself, serially.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from functools import lru_cache

from llvmlite import ir

from .llvmutil import I8P, I32, I64, i64, intrinsic

# Offsets in the pool block, each written by different threads on a cache line of its own.
WORD, DONE, EPOCH, SLEEPERS, SHUTDOWN, TASK, ENV, BUSY, WORKERS = 0, 64, 128, 132, 136, 192, 200, 256, 264
POOL_BYTES = 320
MAX_ITEMS = (1 << 24) - 1
OWNED_ITEMS = 24                # rounds of up to this many items: a bit per item (claim)
SPINS = 1 << 14                 # pause instructions before an idle worker sleeps (~0.3 ms)
WAIT_SPINS = 1 << 12            # pauses before the caller, waiting for workers, yields its core

TASK_TYPE = ir.FunctionType(ir.VoidType(), [I8P, I64])
PARALLEL_FOR_TYPE = ir.FunctionType(ir.VoidType(), [I8P, I64, TASK_TYPE.as_pointer(), I8P])

_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129


class _Emitter:
    def __init__(self, module: ir.Module, arch: str):
        self.m = module
        self.arch = arch
        self.syscall = ir.Function(module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        self.sched_yield = ir.Function(module, ir.FunctionType(I32, []), "sched_yield")

    def field(self, b, pool, offset, ty):
        return b.bitcast(b.gep(pool, [i64(offset)]), ty.as_pointer())

    def pause(self, b):
        """A spin-wait hint (x86 `pause`, AArch64 `yield`): lets the sibling thread run."""
        if self.arch == "x86_64":
            b.call(intrinsic(self.m, "llvm.x86.sse2.pause", ir.VoidType(), []), [])
        elif self.arch == "aarch64":
            b.call(intrinsic(self.m, "llvm.aarch64.hint", ir.VoidType(), [I32]), [ir.Constant(I32, 1)])

    def futex(self, b, addr, op, value):
        number = _FUTEX_SYSCALL.get(self.arch)
        if number is None:              # no futex: sleeping is a yield of the time slice
            b.call(self.sched_yield, [])
            return
        null = ir.Constant(I8P, None)
        value = value if isinstance(value, ir.Value) else ir.Constant(I32, value)
        b.call(self.syscall, [i64(number), b.bitcast(addr, I8P), ir.Constant(I32, op),
                              value, null, null, ir.Constant(I32, 0)])

    def claim(self) -> ir.Function:
        """i64 claim(pool, own): the index of an unclaimed item of the current round, or -1.

        A round of at most OWNED_ITEMS items keeps a bit per claimed item, and a thread
        takes item `own` (its place in the pool: the caller 0, worker k k + 1) while it is
        free, else the first free one after it: a step split like the one before it then
        runs each share on the core that computed the same share of the last step, and
        finds it in its cache (MobileNetV2 at 2 threads, each task's fastest: its 56 x 56
        depthwise convolution after the 96-filter expansion 192 -> 158 us, the 16-filter
        projection at 112 x 112 80 -> 64 us; items went to whichever thread came first).
        A thread busy elsewhere leaves its item to the others.  A longer round hands its
        items out in order."""
        fn = ir.Function(self.m, ir.FunctionType(I64, [I8P, I64]), "glowgen_pool_claim")
        fn.linkage = "internal"
        pool, own = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        word = self.field(b, pool, WORD, I64)
        loop, owned, counted, take, none = (fn.append_basic_block(n) for n in
                                            ("loop", "owned", "counted", "take", "none"))
        b.branch(loop)
        b.position_at_end(loop)
        w = b.load_atomic(word, "acquire", 8)
        count = b.and_(b.lshr(w, i64(24)), i64(MAX_ITEMS))
        low = b.and_(w, i64(MAX_ITEMS))
        b.cbranch(b.icmp_unsigned("<=", count, i64(OWNED_ITEMS)), owned, counted)

        # Owned: bit i of `low` set once item i is claimed.
        b.position_at_end(owned)
        free = b.and_(b.xor(low, i64(MAX_ITEMS)), b.sub(b.shl(i64(1), count), i64(1)))
        owned_take = fn.append_basic_block("owned.take")
        b.cbranch(b.icmp_unsigned("!=", free, i64(0)), owned_take, none)
        b.position_at_end(owned_take)
        start = b.urem(own, count)
        after = b.and_(free, b.shl(i64(-1), start))
        cttz = intrinsic(self.m, "llvm.cttz.i64", I64, [I64, ir.IntType(1)])
        pick = b.call(cttz, [b.select(b.icmp_unsigned("!=", after, i64(0)), after, free),
                             ir.Constant(ir.IntType(1), 1)])
        owned_next = b.or_(w, b.shl(i64(1), pick))
        b.branch(take)

        # Counted: `low` is the next item to hand out.
        b.position_at_end(counted)
        counted_take = fn.append_basic_block("counted.take")
        b.cbranch(b.icmp_unsigned("<", low, count), counted_take, none)
        b.position_at_end(counted_take)
        counted_next = b.add(w, i64(1))
        b.branch(take)

        b.position_at_end(take)
        index = b.phi(I64)
        index.add_incoming(pick, owned_take)
        index.add_incoming(low, counted_take)
        new = b.phi(I64)
        new.add_incoming(owned_next, owned_take)
        new.add_incoming(counted_next, counted_take)
        result = b.cmpxchg(word, w, new, "acq_rel", "acquire")
        won = b.extract_value(result, 1)
        done_blk = fn.append_basic_block("won")
        b.cbranch(won, done_blk, loop)
        b.position_at_end(done_blk)
        b.ret(index)
        b.position_at_end(none)
        b.ret(i64(-1))
        return fn

    def run_claimed(self, b, fn, pool, claim):
        """Claim and run items until none is left (in the function `fn` being built: the
        caller's, whose own item is 0)."""
        loop, run, out = (fn.append_basic_block(n) for n in ("items", "run", "items.out"))
        b.branch(loop)
        b.position_at_end(loop)
        index = b.call(claim, [pool, i64(0)])
        b.cbranch(b.icmp_signed(">=", index, i64(0)), run, out)
        b.position_at_end(run)
        task = b.load(self.field(b, pool, TASK, TASK_TYPE.as_pointer()))
        env = b.load(self.field(b, pool, ENV, I8P))
        b.call(task, [env, index])
        b.atomic_rmw("add", self.field(b, pool, DONE, I64), i64(1), "release")
        b.branch(loop)
        b.position_at_end(out)

    def parallel_for(self, claim) -> ir.Function:
        fn = ir.Function(self.m, PARALLEL_FOR_TYPE, "glowgen_parallel_for")
        pool, n, task, env = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        serial, shared = fn.append_basic_block("serial"), fn.append_basic_block("shared")
        small = b.or_(b.icmp_unsigned("==", b.ptrtoint(pool, I64), i64(0)),
                      b.icmp_signed("<=", n, i64(1)))
        big = b.icmp_signed(">", n, i64(MAX_ITEMS))
        try_lock = fn.append_basic_block("try_lock")
        b.cbranch(b.or_(small, big), serial, try_lock)
        b.position_at_end(try_lock)
        busy = self.field(b, pool, BUSY, I32)
        locked = b.extract_value(b.cmpxchg(busy, ir.Constant(I32, 0), ir.Constant(I32, 1),
                                           "acquire", "monotonic"), 1)
        b.cbranch(locked, shared, serial)

        # Serial: every item on this thread, in order.
        b.position_at_end(serial)
        i_ptr = b.alloca(I64)
        b.store(i64(0), i_ptr)
        head, body, end = (fn.append_basic_block(x) for x in ("s.head", "s.body", "s.end"))
        b.branch(head)
        b.position_at_end(head)
        i = b.load(i_ptr)
        b.cbranch(b.icmp_signed("<", i, n), body, end)
        b.position_at_end(body)
        b.call(task, [env, i])
        b.store(b.add(i, i64(1)), i_ptr)
        b.branch(head)
        b.position_at_end(end)
        b.ret_void()

        # Shared: publish the round, wake sleepers, take items too, wait for the last one.
        b.position_at_end(shared)
        b.store(task, self.field(b, pool, TASK, TASK_TYPE.as_pointer()))
        b.store(env, self.field(b, pool, ENV, I8P))
        b.store_atomic(i64(0), self.field(b, pool, DONE, I64), "release", 8)
        word = self.field(b, pool, WORD, I64)
        old = b.load_atomic(word, "monotonic", 8)
        generation = b.and_(b.add(b.lshr(old, i64(48)), i64(1)), i64(0xFFFF))
        b.store_atomic(b.or_(b.shl(generation, i64(48)), b.shl(n, i64(24))), word, "seq_cst", 8)
        epoch = self.field(b, pool, EPOCH, I32)
        b.atomic_rmw("add", epoch, ir.Constant(I32, 1), "seq_cst")
        sleepers = b.load_atomic(self.field(b, pool, SLEEPERS, I32), "seq_cst", 4)
        wake, work = fn.append_basic_block("wake"), fn.append_basic_block("work")
        b.cbranch(b.icmp_signed(">", sleepers, ir.Constant(I32, 0)), wake, work)
        b.position_at_end(wake)
        self.futex(b, epoch, _FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)
        b.branch(work)
        b.position_at_end(work)
        self.run_claimed(b, fn, pool, claim)
        # Wait for the items workers took.  A worker the OS has descheduled mid-item (more
        # threads than free cores) would keep us spinning for a whole time slice: after a
        # while, give the core away at each look.
        waited = b.alloca(I64)
        b.store(i64(0), waited)
        wait, finished = fn.append_basic_block("wait"), fn.append_basic_block("finished")
        b.branch(wait)
        b.position_at_end(wait)
        done = b.load_atomic(self.field(b, pool, DONE, I64), "acquire", 8)
        spin = fn.append_basic_block("spin")
        b.cbranch(b.icmp_signed(">=", done, n), finished, spin)
        b.position_at_end(spin)
        count = b.add(b.load(waited), i64(1))
        b.store(count, waited)
        pause, give = fn.append_basic_block("pause"), fn.append_basic_block("yield")
        b.cbranch(b.icmp_signed("<", count, i64(WAIT_SPINS)), pause, give)
        b.position_at_end(pause)
        self.pause(b)
        b.branch(wait)
        b.position_at_end(give)
        b.call(self.sched_yield, [])
        b.branch(wait)
        b.position_at_end(finished)
        b.store_atomic(ir.Constant(I32, 0), busy, "release", 4)
        b.ret_void()
        return fn

    def worker(self, claim) -> ir.Function:
        """i32 worker(pool): run items of every round until the pool shuts down."""
        fn = ir.Function(self.m, ir.FunctionType(I32, [I8P]), "glowgen_pool_worker")
        pool, = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        spins = b.alloca(I64)
        b.store(i64(0), spins)
        own = b.add(b.atomic_rmw("add", self.field(b, pool, WORKERS, I64), i64(1), "monotonic"), i64(1))
        top = fn.append_basic_block("top")
        b.branch(top)
        b.position_at_end(top)
        shutdown = self.field(b, pool, SHUTDOWN, I32)
        stop, go = fn.append_basic_block("stop"), fn.append_basic_block("go")
        b.cbranch(b.icmp_signed("!=", b.load_atomic(shutdown, "acquire", 4), ir.Constant(I32, 0)), stop, go)
        b.position_at_end(stop)
        b.ret(ir.Constant(I32, 0))

        b.position_at_end(go)
        epoch = self.field(b, pool, EPOCH, I32)
        seen = b.load_atomic(epoch, "acquire", 4)      # before looking for work: no lost wake-up
        index = b.call(claim, [pool, own])
        run, idle = fn.append_basic_block("run"), fn.append_basic_block("idle")
        b.cbranch(b.icmp_signed(">=", index, i64(0)), run, idle)
        b.position_at_end(run)
        task = b.load(self.field(b, pool, TASK, TASK_TYPE.as_pointer()))
        env = b.load(self.field(b, pool, ENV, I8P))
        b.call(task, [env, index])
        b.atomic_rmw("add", self.field(b, pool, DONE, I64), i64(1), "release")
        b.store(i64(0), spins)
        b.branch(top)

        b.position_at_end(idle)
        count = b.add(b.load(spins), i64(1))
        b.store(count, spins)
        keep_spinning, sleep = fn.append_basic_block("spin"), fn.append_basic_block("sleep")
        b.cbranch(b.icmp_signed("<", count, i64(SPINS)), keep_spinning, sleep)
        b.position_at_end(keep_spinning)
        self.pause(b)
        b.branch(top)
        b.position_at_end(sleep)
        sleepers = self.field(b, pool, SLEEPERS, I32)
        b.atomic_rmw("add", sleepers, ir.Constant(I32, 1), "seq_cst")
        # Returns at once if a round (or the shutdown) has moved the epoch since `seen`.
        self.futex(b, epoch, _FUTEX_WAIT_PRIVATE, seen)
        b.atomic_rmw("sub", sleepers, ir.Constant(I32, 1), "seq_cst")
        b.store(i64(0), spins)
        b.branch(top)
        return fn


def pool_module_ir(arch: str) -> str:
    module = ir.Module(name="glowgen_pool")
    e = _Emitter(module, arch)
    claim = e.claim()
    e.parallel_for(claim)
    e.worker(claim)
    return str(module)


@lru_cache(maxsize=1)
def _pool_functions():
    """The pool's code, JIT-compiled once per process: (parallel_for address, worker)."""
    import llvmlite.binding as llvm
    from .jit import optimize, target_machine
    tm = target_machine()
    arch = tm.triple.split("-")[0]
    module = optimize(pool_module_ir(arch), tm)
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    worker = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(
        engine.get_function_address("glowgen_pool_worker"))
    return engine, engine.get_function_address("glowgen_parallel_for"), worker


class ThreadPool:
    """`threads - 1` workers parked in native code, for one compiled model (the caller's
    thread is the last one).  `.parallel_for` and `.pointer` are what the generated entry
    point takes; the workers stop when the pool is closed or collected."""

    def __init__(self, threads: int):
        self.threads = threads
        self._block = (ctypes.c_uint8 * POOL_BYTES)()
        self.pointer = ctypes.addressof(self._block)
        self._engine, self.parallel_for, worker = _pool_functions()
        self._workers = [threading.Thread(target=worker, args=(self.pointer,), daemon=True,
                                          name=f"glowgen-worker-{k}") for k in range(threads - 1)]
        for t in self._workers:
            t.start()
        self._finalizer = weakref.finalize(self, _shut_down, self._block, self._workers)

    def close(self) -> None:
        self._finalizer()


def _shut_down(block, workers) -> None:
    base = ctypes.addressof(block)
    ctypes.c_int32.from_address(base + SHUTDOWN).value = 1
    ctypes.c_int32.from_address(base + EPOCH).value += 1
    _wake_all(base + EPOCH)
    for t in workers:
        t.join(timeout=1.0)


def _wake_all(address: int) -> None:
    import platform
    number = _FUTEX_SYSCALL.get(platform.machine())
    if number is None:
        return                          # workers yield, not sleep: they see the flag
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(ctypes.c_long(number), ctypes.c_void_p(address),
                 ctypes.c_int(_FUTEX_WAKE_PRIVATE), ctypes.c_int(0x7FFFFFFF), None, None, 0)
