"""LIR program -> one LLVM module.

The entry point is `i32 NAME(i8* constant_weights, i8* mutable_weights, i8* activations)`.
It calls one internal function per step (a stack of elementwise instructions or one other
instruction), passing typed pointers at the offsets the memory plan fixed at compile time.
Pointers whose bytes overlap no other argument are marked `noalias`, so LLVM vectorizes
without runtime checks.

Compiled for several threads, a step worth splitting (parallel.py) runs as tasks handed to
a `parallel_for(pool, n, task, env)` the caller supplies: `NAME_parallel(.., .., ..,
parallel_for, pool)` takes it (threads.py has the JIT's; a bundle's main.c has one on POSIX
threads), and NAME runs the same tasks one after another.

For the JIT, `i32 NAME_io(.., .., .., i8** io, parallel_for, pool)` takes the graph inputs
and outputs listed in `io_slots(prog)` from a table of pointers instead of the mutable
region, so a caller can run on its own arrays without copying them in and out.
"""
from __future__ import annotations

import math
import re

from llvmlite import ir

from ...lir.ir import Activation, Buffer, Instr, Program, disjoint, dynamic_views, slot
from ...lir.passes import lifetimes
from .epilogue import EpilogueEmitter
from .kernels import KERNELS, KernelArgs
from .llvmutil import F32, I8, I8P, I32, I64, for_range, i64, intrinsic, storage_type, TargetModule
from .loops import blocked_loops, innermost_extent, strided_loops
from .parallel import WHOLE, Split
from .threads import PARALLEL_FOR_TYPE, TASK_TYPE
from .scalar import ScalarEmitter, emit_stack, load_elem, store_elem
from .rows import emit_group, stack_rows
from .handoffs import GroupCuts, PassEmission, handoffs_to_cut
from .stacking import BLOCK, Step, cost_groups, describe_step, handoff_count, has_gathers, is_control, stack_operands

REGION_ORDER = ("constant", "mutable", "activation")

# Tasks of a step whose cycles a profile keeps apart (the later ones share the last slot).
TASK_SLOTS = 8


def region_of(buf: Buffer) -> str:
    root = buf.root()
    return "activation" if isinstance(root, Activation) else root.region


def byte_range(buf: Buffer) -> tuple[str, int, int]:
    """The bytes `buf` may cover: a slice whose place the loop counter decides, any of its
    root's."""
    root = buf.root()
    size = root.nbytes if dynamic_views(buf) else buf.nbytes
    return region_of(buf), root.offset, root.offset + max(size, 1)


def _overlaps(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def io_slots(prog: Program) -> list:
    """The graph inputs and outputs the `_io` entry point takes by pointer, in table order:
    inputs no instruction writes (the caller's array is only read), then outputs some
    instruction writes and that are not also inputs (the caller's array is all written).
    Anything else stays in the mutable region."""
    written = {id(buf.root()) for ins in prog.instrs for buf in ins.writes()}
    slots = []
    for w in prog.inputs.values():
        if id(w) not in written and all(w is not x for x in slots):
            slots.append(w)
    for w in prog.outputs.values():
        if id(w) in written and all(w is not x for x in slots) and all(w is not x for x in prog.inputs.values()):
            slots.append(w)
    return slots


def _anonymous_text(fn: ir.Function, text: str) -> str:
    """`fn`'s LLVM text (`text`) with its own name and its arguments' names replaced by
    positions: two step functions with equal anonymous texts compute the same thing on their
    arguments."""
    header_end = text.index("\n")
    header, body = text[:header_end], text[header_end:]
    header = header.replace(fn.name, "@fn", 1) if fn.name in header else header
    refs = {arg.get_reference(): f"%arg{k}" for k, arg in enumerate(fn.args)}
    if refs:        # one pass over the body for all of them (longest first: %"x" and %"x.1")
        pattern = "|".join(re.escape(r) for r in sorted(refs, key=len, reverse=True))
        body = re.sub(f"(?:{pattern})(?=[,\\s)\\]])", lambda m: refs[m.group(0)], body)
        for ref, name in refs.items():
            header = header.replace(ref, name, 1)
    return header + body


def _loader(b, ptrs, externals):
    """load(buf) for a stack's external operand buffer: its element at ptrs[its index],
    read once per iteration however many instructions use it."""
    loaded = {}

    def load(buf):
        k = next(j for j, x in enumerate(externals) if x is buf or getattr(x, "ins", None) is buf)
        if k not in loaded:
            loaded[k] = load_elem(b, ptrs[k], externals[k].type.dtype)
        return loaded[k]
    return load


class ModuleBuilder:
    """Emits the LLVM module of a program the cpu backend's passes have prepared (passes.py):
    every decision it follows is in `prog.plan` and the instructions' plans."""

    def __init__(self, prog: Program, registry, name: str, profile: bool = False):
        if prog.plan is None:
            raise ValueError("the program has not been prepared by the cpu backend's passes")
        self.prog, self.registry, self.name = prog, registry, name
        self.plan = prog.plan
        self.module = TargetModule(name, self.plan.features)
        self.life = lifetimes(prog)
        self.gemm_shape = self.plan.gemm_shape
        self.scratch_offset = self.plan.scratch_offset   # of the kernels' scratch (activation region)
        self.profile = profile
        self.step_names: list[str] = []   # what each step computes, for profiles
        self.threads = self.plan.threads
        self.parts: dict[int, int] = {}   # step id -> tasks it is split into (parallel.py)
        self._twins: dict = {}            # cheap key -> [(step function, its anonymous text)]
        self._texts: dict[str, str] = {}  # step function name -> its text (_text_of)
        self._elsewhere = False           # step functions called from another module
        self.declared: list[str] = []     # names of the step functions another module defines

    def build(self, jobs=None) -> ir.Module:
        """The whole module: every step's functions, the entry points calling them.

        `jobs` (parallel_compile.py) yields lists of step indices, the steps whose functions
        this module defines; the others are declared, their code is another module's
        (step_functions).  None: every step is defined here."""
        steps = self.plan.steps
        self._begin()
        if self.profile:
            # Each step's fewest cycles over the runs: the cycle counter is wall time, and the
            # minimum is what survives the runs another process interrupted.
            ty = ir.ArrayType(ir.IntType(64), max(1, len(steps)))
            self._counters = ir.GlobalVariable(self.module, ty, name=f"{self.name}_profile")
            self._counters.initializer = ir.Constant(ty, [ir.Constant(ir.IntType(64), 2 ** 64 - 1)] * ty.count)
            # And each task's fewest cycles (TASK_SLOTS a step): how evenly a split shares.
            ty = ir.ArrayType(ir.IntType(64), max(1, len(steps)) * TASK_SLOTS)
            self._task_counters = ir.GlobalVariable(self.module, ty, name=f"{self.name}_task_profile")
            self._task_counters.initializer = ir.Constant(ty, [ir.Constant(ir.IntType(64), 2 ** 64 - 1)] * ty.count)
        # A control-flow step (cond, else, endcond, loop, endloop) is no function: the entry
        # branches there (_control).
        calls: list = [step.instrs[0] if is_control(step) else None for step in steps]
        for job in ([range(len(steps))] if jobs is None else jobs):
            for i in job:
                if calls[i] is None:
                    calls[i] = self._step_function(i, steps[i])
        for i, step in enumerate(steps):        # another module's (step_functions)
            if calls[i] is None:
                calls[i] = self._step_function(i, step, define=False)
        calls = self._join(steps, calls)
        self.step_names = [describe_step(step) for step in steps]
        self.step_parts = [1 if is_control(step) else self.parts[id(step)] for step in steps]
        self.split_steps = [(name, parts) for name, parts in zip(self.step_names, self.step_parts) if parts > 1]
        self._serial_for = self._serial_parallel_for()
        # One entry calls the steps; the region entries pass it a table of their own region
        # pointers.
        slots = io_slots(self.prog)
        io_fn = self._entry(self.name + "_io", calls, slots=slots)
        self._region_entry(self.name, io_fn, slots, parallel=False)
        self._region_entry(self.name + "_parallel", io_fn, slots, parallel=True)
        return self.module

    def _begin(self) -> None:
        self.parts = {id(step): step.parts for step in self.plan.steps}
        self._counters = None           # the profile's (build)

    def step_functions(self, jobs) -> ir.Module:
        """A module of only the functions of the steps `jobs` yields (lists of indices of
        steps that are not control steps), for a module built with `build(jobs)` to call:
        they are external, and one that is a twin of another here (_shared_twin) calls it,
        under its own name, which the caller knows."""
        self._elsewhere = True
        steps = self.plan.steps
        self._begin()
        for job in jobs:
            for i in job:
                self._step_function(i, steps[i])
        return self.module

    def _region_entry(self, name: str, io_fn, slots, parallel: bool) -> None:
        """`NAME(constant, mutable, activations)` and `NAME_parallel(.., .., ..,
        parallel_for, pool)`: NAME_io with the io buffers at their places in the mutable
        region (NAME runs every task on the calling thread)."""
        params = [I8P, I8P, I8P] + ([PARALLEL_FOR_TYPE.as_pointer(), I8P] if parallel else [])
        entry = ir.Function(self.module, ir.FunctionType(I32, params), name=name)
        for arg, n in zip(entry.args, REGION_ORDER + ("parallel_for", "pool")):
            arg.name = n
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        table = b.alloca(ir.ArrayType(I8P, max(1, len(slots))), name="io")
        for k, w in enumerate(slots):
            b.store(b.gep(entry.args[REGION_ORDER.index(w.region)], [i64(w.offset)]),
                    b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
        first = b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, 0)])
        pool = (list(entry.args[3:]) if parallel
                else [ir.Constant(PARALLEL_FOR_TYPE.as_pointer(), None), ir.Constant(I8P, None)])
        b.ret(b.call(io_fn, list(entry.args[:3]) + [first] + pool))

    def _serial_parallel_for(self) -> ir.Function:
        """The parallel_for of a caller that gives none: every task in order, here.  Never
        inlined: LLVM would then inline the small tasks it calls into the entry for this
        serial path alone (ResNet-50's entry grew to 35,000 lines of IR, a third more
        compile time, when phases made several tasks small)."""
        fn = ir.Function(self.module, PARALLEL_FOR_TYPE, name=f"{self.name}_serial_for")
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        _, n, task, env = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        with for_range(b, n, name="task") as i:
            b.call(task, [env, i])
        b.ret_void()
        return fn

    def _task_function(self, name: str, members: list) -> ir.Function:
        """`void task(i8* env, i64 part)`: for each of `members`, (step index, function,
        pointers it takes, timed), its pointers from `env` (one after another), then its
        share (`timed`, in a profile: its fewest cycles kept in the step's task counters).
        Several members are joined steps (joining.py): task p of each after task p of the
        one before."""
        task = ir.Function(self.module, TASK_TYPE, name=name)
        task.linkage = "internal"
        env, part = task.args
        b = ir.IRBuilder(task.append_basic_block("entry"))
        table = b.bitcast(env, I8P.as_pointer())
        first = 0
        for k, (index, fn, n_ptrs, timed) in enumerate(members):
            if k:
                b.fence("seq_cst", "singlethread")      # as between the entry's steps
            args = [b.bitcast(b.load(b.gep(table, [i64(first + j)])), fn.args[j].type) for j in range(n_ptrs)]
            first += n_ptrs
            clock = (intrinsic(self.module, "llvm.readcyclecounter", ir.IntType(64), [])
                     if timed and self._counters is not None else None)
            start = b.call(clock, []) if clock is not None else None
            b.call(fn, args + [part])
            if clock is not None:
                spent = b.sub(b.call(clock, []), start)
                last = i64(TASK_SLOTS - 1)
                at = b.add(i64(index * TASK_SLOTS), b.select(b.icmp_signed("<", part, last), part, last))
                slot = b.gep(self._task_counters, [i64(0), at])
                old = b.load(slot)
                b.store(b.select(b.icmp_unsigned("<", spent, old), spent, old), slot)
        b.ret_void()
        return task

    def _join(self, steps: list, calls: list) -> list:
        """Each joined step's call merged into the call before it (joining.py): a call
        (buffers, uses scratch, rounds) becomes (members, None, [(None, (task, parts))]),
        members its steps' (buffers, uses scratch); the joined step's place, None."""
        calls = list(calls)
        for index, step in enumerate(steps):
            if not step.joined:
                continue
            (buf_a, scratch_a, ((fn_a, _),)), (buf_b, scratch_b, ((fn_b, _),)) = calls[index - 1], calls[index]
            members = [(index - 1, fn_a, len(buf_a) + scratch_a, True), (index, fn_b, len(buf_b) + scratch_b, True)]
            task = self._task_function(f"s{index - 1}_s{index}_task", members)
            calls[index - 1] = ([(buf_a, scratch_a), (buf_b, scratch_b)], None, [(None, (task, step.parts))])
            calls[index] = None
        return calls

    def _entry(self, name: str, calls, slots) -> None:
        """The entry point calling every step: the buffers listed in `slots` come from the
        pointer table of a fourth argument rather than from the mutable region; split steps
        go to the parallel_for of the fifth (with the pool of the sixth)."""
        params = [I8P, I8P, I8P, I8P.as_pointer(), PARALLEL_FOR_TYPE.as_pointer(), I8P]
        entry = ir.Function(self.module, ir.FunctionType(I32, params), name=name)
        for arg, n in zip(entry.args, REGION_ORDER + ("io", "parallel_for", "pool")):
            arg.name = n
            if n != "parallel_for":
                arg.add_attribute("noalias")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        regions = dict(zip(REGION_ORDER, entry.args))
        slot_of = {id(w): k for k, w in enumerate(slots or ())}
        given, pool = entry.args[4], entry.args[5]
        parallel_for = b.select(b.icmp_unsigned("==", b.ptrtoint(given, I64), i64(0)),
                                self._serial_for, given)
        clock = (intrinsic(self.module, "llvm.readcyclecounter", ir.IntType(64), [])
                 if self._counters is not None else None)
        def pointer(buf):
            k = slot_of.get(id(buf.root()))
            raw = (b.load(b.gep(entry.args[3], [i64(k)])) if k is not None
                   else b.gep(regions[region_of(buf)], [i64(buf.root().offset)]))
            for view in dynamic_views(buf):         # a loop's slice: counter * slice bytes on
                index = b.load(pointer(view.counter))
                if view.reverse:
                    index = b.sub(i64(view.length - 1), index)
                if view.phase is not None:          # an alternating state's slot
                    index = b.and_(b.add(index, i64(view.phase)), i64(1))
                raw = b.gep(raw, [b.mul(index, i64(view.slice_bytes))])
            return b.bitcast(raw, storage_type(buf.type.dtype).as_pointer())

        open_regions: list = []          # the blocks of each region open here (_control)
        for index, call in enumerate(calls):
            # Steps talk through memory: a compiler-only barrier keeps LLVM from moving one
            # step's loads and stores past another's once it has inlined them (LLVM 22's SLP
            # vectorizer sank a CumSum's stores below the GatherElements reading them).
            b.fence("seq_cst", "singlethread")
            if call is None:                # joined to the step before: called there
                continue
            if isinstance(call, Instr):
                self._control(b, call, pointer, open_regions)
                continue
            buffers, uses_scratch, rounds = call
            ptrs = []
            for bufs, scratch in (buffers if uses_scratch is None else [(buffers, uses_scratch)]):
                ptrs += [pointer(buf) for buf in bufs]
                if scratch:
                    raw = b.gep(regions["activation"], [i64(self.scratch_offset)])
                    ptrs.append(b.bitcast(raw, F32.as_pointer()))
            start = b.call(clock, []) if clock is not None else None
            claims = self._claim_words(b, regions, self.plan.steps[index])
            if claims is not None:          # the tasks claim their work from zero (plan.Phases)
                for word in range(self.plan.steps[index].parts):
                    b.store_atomic(i64(0), b.gep(claims, [i64(word)]), "monotonic", 8)
            env = None
            for fn, task in rounds:         # a phased step's rounds, each after the last
                if task is None:
                    b.call(fn, ptrs)
                    continue
                if env is None:
                    env = b.alloca(ir.ArrayType(I8P, len(ptrs)), name=f"env{index}")
                    for j, p in enumerate(ptrs):
                        b.store(b.bitcast(p, I8P), b.gep(env, [ir.Constant(I32, 0), ir.Constant(I32, j)]))
                b.call(parallel_for, [pool, i64(task[1]), task[0], b.bitcast(env, I8P)])
            if clock is not None:
                slot = b.gep(self._counters, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), index)])
                spent = b.sub(b.call(clock, []), start)
                old = b.load(slot)
                b.store(b.select(b.icmp_unsigned("<", spent, old), spent, old), slot)
        b.ret(ir.Constant(I32, 0))
        return entry

    def _claim_words(self, b: ir.IRBuilder, regions: dict, step: Step):
        """The i64 claim words (one a task) a step's tasks claim their work from
        (plan.Phases.claims), in the scratch they share; None for a step without them."""
        ins = step.instrs[0] if step.instrs else None
        phases = ins.plan.phases if ins is not None and ins.plan is not None else None
        if phases is None or not phases.claims or step.parts < 2:
            return None
        at = b.gep(regions["activation"], [i64(self.scratch_offset + phases.claim_words_at)])
        return b.bitcast(at, I64.as_pointer())

    @staticmethod
    def _control(b: ir.IRBuilder, ins: Instr, pointer, open_regions: list) -> None:
        """A region of the LIR (ir.Instr) as blocks of the entry: `cond` tests its one-byte
        condition and enters the then-block or the else-block, both of which end in a jump
        to the join block where the steps after `endcond` go; a loop is a test block, the
        body's block and an exit block.  The steps of a branch or body are called (and
        split among threads) in its block as anywhere else."""
        fn = b.function
        if ins.kind == Instr.COND:
            flag = b.load(pointer(ins.operands[0][1]), name="cond")
            then_bb = fn.append_basic_block("then")
            else_bb, join_bb = fn.append_basic_block("else"), fn.append_basic_block("endcond")
            b.cbranch(b.icmp_unsigned("!=", flag, ir.Constant(flag.type, 0)), then_bb, else_bb)
            open_regions.append((else_bb, join_bb))
            b.position_at_end(then_bb)
        elif ins.kind == Instr.ELSE:
            else_bb, join_bb = open_regions[-1]
            b.branch(join_bb)
            b.position_at_end(else_bb)
        elif ins.kind == Instr.ENDCOND:
            _, join_bb = open_regions.pop()
            b.branch(join_bb)
            b.position_at_end(join_bb)
        elif ins.kind == Instr.LOOP:
            # counter = 0; test: counter < trip (if any) and the condition; body ... ;
            # endloop: counter += 1, back to the test; the steps after it in `exit`.
            trip, counter, flag = (pointer(buf) if buf is not None else None for _, buf in ins.operands)
            b.store(i64(0), counter)
            test_bb, body_bb = fn.append_basic_block("loop"), fn.append_basic_block("body")
            exit_bb = fn.append_basic_block("endloop")
            b.branch(test_bb)
            b.position_at_end(test_bb)
            going = b.icmp_unsigned("!=", b.load(flag), ir.Constant(I8, 0))
            if trip is not None:
                going = b.and_(going, b.icmp_signed("<", b.load(counter), b.load(trip)))
            b.cbranch(going, body_bb, exit_bb)
            open_regions.append((test_bb, exit_bb, counter))
            b.position_at_end(body_bb)
        else:                                           # ENDLOOP
            test_bb, exit_bb, counter = open_regions.pop()
            b.store(b.add(b.load(counter), i64(1)), counter)
            b.branch(test_bb)
            b.position_at_end(exit_bb)

    # ------------------------------------------------------------------ steps
    def _step_function(self, index: int, step: Step, define: bool = True):
        """The step's functions, one per round of its tasks (a phased kernel's phases, else
        one), with the buffers and scratch they take: (buffers, uses scratch, [(function,
        (task function, tasks) or None)]).  `define=False`: the functions only declared,
        another module's (step_functions)."""
        buffers: list[Buffer] = []
        for ins in step.instrs:
            for _, buf in ins.operands:
                if buf is not None and all(buf is not x for x in buffers):
                    buffers.append(buf)
        # A step whose kernel uses scratch takes it as a last argument (it overlaps nothing).
        uses_scratch = step.scratch > 0 or step.shared_scratch > 0
        parts = self.parts.get(id(step), 1)
        n_ptrs = len(buffers) + (1 if uses_scratch else 0)
        rounds = []
        for phase in (range(step.phases) if step.phases > 1 else [None]):
            if define:
                fn = self._phase_function(index, step, buffers, uses_scratch, parts, phase)
            else:
                fn = self._declare_phase_function(index, step, buffers, uses_scratch, parts, phase)
                self.declared.append(fn.name)
            # A phased step's tasks are timed in its last round (its product).
            timed = phase is None or phase == step.phases - 1
            name = f"s{index}{'' if phase is None else f'p{phase}'}_task"
            task = (self._task_function(name, [(index, fn, n_ptrs, timed)]), parts) if parts > 1 else None
            rounds.append((fn, task))
        return buffers, uses_scratch, rounds

    def _declare_phase_function(self, index: int, step: Step, buffers: list, uses_scratch: bool,
                                parts: int, phase) -> ir.Function:
        """The function of one round of a step, without its body: `void (buffers..,
        [scratch], [i64 part])`, named after the step (the same name in every module)."""
        kinds = "_".join(i.kind for i in step.instrs[:3]) + ("_etc" if len(step.instrs) > 3 else "")
        params = [storage_type(x.type.dtype).as_pointer() for x in buffers]
        params += [F32.as_pointer()] if uses_scratch else []
        fnty = ir.FunctionType(ir.VoidType(), params + ([I64] if parts > 1 else []))
        fn = ir.Function(self.module, fnty, name=f"{self.name}_s{index}{'' if phase is None else f'p{phase}'}_{kinds}")
        # Never inlined into the entry: LLVM then optimized every step twice, the second
        # time inside one function of all of them, and generated code for that function
        # (ResNet-18 at one thread: 7.4 of its 11 s of compile time in LLVM, 3.8 so).  Calls
        # are a few nanoseconds a step; the kernels' code is the same either way.
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        ranges = [byte_range(x) for x in buffers]
        for j, (arg, buf) in enumerate(zip(fn.args, buffers)):
            arg.name = buf.name.replace('"', "")
            if not any(_overlaps(ranges[j], r) and not disjoint(buf, buffers[k])
                       for k, r in enumerate(ranges) if k != j):
                arg.add_attribute("noalias")
        if parts > 1:
            fn.args[-1].name = "part"
        return fn

    def _phase_function(self, index: int, step: Step, buffers: list, uses_scratch: bool, parts: int, phase):
        fn = self._declare_phase_function(index, step, buffers, uses_scratch, parts, phase)
        if not self._elsewhere:         # only this module's entry points call it
            fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        split = Split(fn.args[-1], parts) if parts > 1 else WHOLE
        self._scratch_arg = self._shared_scratch_arg = None
        if uses_scratch:
            # The scratch the tasks share (a phased kernel's), then each task's own share.
            scratch = fn.args[len(buffers)]
            scratch.name = "scratch"
            scratch.add_attribute("noalias")
            self._shared_scratch_arg = scratch if step.shared_scratch else None
            own = b.gep(scratch, [i64(step.shared_scratch // 4)]) if step.shared_scratch else scratch
            if parts > 1 and step.scratch:
                own = b.gep(own, [b.mul(split.index, i64(step.scratch // 4))], name="own_scratch")
            self._scratch_arg = own
        ptr = {id(buf): arg for buf, arg in zip(buffers, fn.args)}
        if step.members:
            emit_group(self, b, step, ptr, split)
        elif step.stacked:
            self._emit_stack(b, step, ptr, split)
        elif step.epilogue is not None:
            epilogue = EpilogueEmitter(step, self.prog, self.life, self.registry, ptr, self.gemm_shape.vw)
            self._emit_single(b, step.instrs[0], ptr, split, epilogue, phase)
        else:
            self._emit_single(b, step.instrs[0], ptr, split, phase=phase)
        b.ret_void()
        return self._shared_twin(fn, step, phase)

    def _shared_twin(self, fn: ir.Function, step: Step, phase=None) -> ir.Function:
        """An earlier step function with the same code as `fn` (up to names), which then
        replaces it; else `fn`.  Repeated blocks (ResNet-50's 16 bottlenecks are 12 distinct
        ones) compute the same thing on other buffers, and their pointers are arguments:
        compiling each once halves the LLVM module and its optimization time.  Quantized
        types carry their scales, so int8 products of other scales are never twins."""
        key = (phase, str(fn.function_type), tuple(str(a.attributes) for a in fn.args),
               tuple((ins.kind, tuple(buf.type if buf is not None else None for _, buf in ins.operands))
                     for ins in step.instrs))
        candidates = self._twins.setdefault(key, [])
        if not candidates:
            candidates.append((fn, None))
            return fn
        text = _anonymous_text(fn, self._text_of(fn))
        for k, (other, other_text) in enumerate(candidates):
            if other_text is None:
                other_text = _anonymous_text(other, self._text_of(other))
                candidates[k] = (other, other_text)
            if other_text == text:
                if self._elsewhere:     # called by name from another module: a thunk
                    self._become_call(fn, other)
                    return fn
                del self.module.globals[fn.name]
                return other
        candidates.append((fn, text))
        return fn

    def _become_call(self, fn: ir.Function, other: ir.Function) -> None:
        """`fn`'s body replaced by a tail call of `other`, its twin (same arguments)."""
        fn.blocks.clear()
        self._texts.pop(fn.name, None)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.call(other, list(fn.args), tail=True)
        b.ret_void()

    def _text_of(self, fn: ir.Function) -> str:
        """`str(fn)`, kept for build_text: printing a large function's IR takes llvmlite
        longer than emitting it (ResNet-50: 1.2 s of its 10 s compile, twice over)."""
        text = self._texts.get(fn.name)
        if text is None:
            text = self._texts[fn.name] = str(fn)
        return text

    def build_text(self, jobs=None) -> str:
        """The module built (build) as LLVM text."""
        return self.text(self.build(jobs))

    def text(self, module: ir.Module) -> str:
        """`module` (this builder's) as LLVM text, with the text of the step functions the
        twin search printed reused (the rest as llvmlite's Module.__repr__ prints it)."""
        lines = ['; ModuleID = "%s"' % (module.name,), 'target triple = "%s"' % (module.triple,),
                 'target datalayout = "%s"' % (module.data_layout,), '']
        lines += [t.get_declaration() for t in module.get_identified_types().values()]
        lines += [self._texts.get(v.name) or str(v) if isinstance(v, ir.Function) else str(v)
                  for v in module.globals.values()]
        lines += module._get_metadata_lines()
        return "\n".join(lines)

    def _emit_single(self, b, ins: Instr, ptr, split: Split = WHOLE, epilogue=None, phase=None):
        if ins.kind == Instr.COPY:
            dst, src = ins.operands[0][1], ins.operands[1][1]
            n = dst.type.size

            def body(bb, ps):
                bb.store(bb.load(ps[0]), ps[1])
            strided_loops(b, (n,), [ptr[id(src)], ptr[id(dst)]], [(1,), (1,)], [0, 0], body)
            return
        emitter = KERNELS.get(ins.kind)
        if emitter is None:
            from ...errors import UnsupportedError
            raise UnsupportedError(f"the cpu backend has no kernel for {ins.kind} "
                                   f"(node {ins.node.name!r})")
        node = ins.node
        n_out = len(node.outputs)
        outs = [(ptr[id(buf)], buf.type) for _, buf in ins.operands[:n_out]]
        ins_args, i = [], n_out
        for info, count in zip(node.INPUTS, ins.groups[n_out:]):
            entries = [(ptr[id(buf)], buf.type) if buf is not None else None
                       for _, buf in ins.operands[i:i + count]]
            ins_args.append(entries if info.variadic else entries[0])
            i += count
        scratch = self._scratch_arg
        args = KernelArgs(b, node, outs, ins_args, self.registry.scalars, self.gemm_shape, scratch, ins.plan)
        args.epilogue = epilogue
        args.split = split
        args.phase, args.shared_scratch = phase, self._shared_scratch_arg
        emitter(args)

    def _emit_stack(self, b, step: Step, ptr, split: Split = WHOLE):
        shape = step.shape
        externals, stored, maps = stack_operands(step, self.prog, self.life)
        bases = [ptr[id(getattr(x, "buffer", x))] for x in externals] + [ptr[id(x)] for x in stored]
        registry = self.registry
        groups = cost_groups(step, registry)
        cut = any(handoff_count(ins, registry) >= handoffs_to_cut(b.module) for ins in step.instrs)
        if ((len(groups) > 1 or cut)
                and not has_gathers(step) and innermost_extent(shape, maps) >= 2 * BLOCK):
            self._emit_stack_blocked(b, step, groups, externals, stored, bases, maps, split)
            return

        def body(bb, ps):
            em = ScalarEmitter(bb, registry.scalars)
            current = {}                  # slot -> value computed in this iteration
            emit_stack(em, step.instrs, registry.kernels, current, _loader(bb, ps, externals))
            for j, buf in enumerate(stored):
                store_elem(bb, current[slot(buf)], ps[len(externals) + j], buf.type.dtype)

        strided_loops(b, shape, bases, maps, [0] * len(bases), body, split=split)

    def _emit_stack_rows(self, b, step: Step, ptr, share):
        """A stack in a row group (rows.py): its loop over [rows, n] (or [rows, 1]), over the
        rows of the block `share` gives."""
        rows, n = share.rows, share.n
        externals, stored, maps = stack_rows(step, self.prog, self.life, rows, n)
        bases = [ptr[id(x)] for x in externals] + [ptr[id(x)] for x in stored]
        registry = self.registry
        per_row = all(m[1] == 0 for m in maps) and math.prod(step.shape) == rows

        def body(bb, ps):
            em = ScalarEmitter(bb, registry.scalars)
            current = {}
            emit_stack(em, step.instrs, registry.kernels, current, _loader(bb, ps, externals))
            for j, buf in enumerate(stored):
                store_elem(bb, current[slot(buf)], ps[len(externals) + j], buf.type.dtype)

        shape = (rows, 1) if per_row else (rows, n)
        strided_loops(b, shape, bases, maps, [0] * len(bases), body, split=share)

    def _emit_stack_blocked(self, b, step: Step, groups, externals, stored, bases, maps, split: Split):
        """A costly stack as groups run one after another over each block of elements
        (stacking.cost_groups); values one group passes to a later one wait in per-block
        arrays on the stack, in L1."""
        registry = self.registry
        group_of = {}                                   # slot -> last group writing it
        for g, instrs in enumerate(groups):
            for ins in instrs:
                group_of[slot(ins.writes()[0])] = g
        # A value crosses groups when a later group reads its buffer; the group that
        # computes it last before that read stores it (`handoff`: root id -> groups).
        crossing: dict[tuple, object] = {}              # slot -> buffer (for its type)
        handoff: dict[int, set] = {}
        for g, instrs in enumerate(groups):
            for ins in instrs:
                for buf in ins.reads():
                    k = slot(buf)
                    writers = [h for h in range(g) if any(slot(i.writes()[0]) == k for i in groups[h])]
                    if writers:
                        crossing.setdefault(k, buf)
                        handoff.setdefault(k, set()).add(writers[-1])
        # `b` is still in the step function's entry block: allocas there are static.  Cache
        # line aligned, or every vector load and store of a temp may straddle two lines (how
        # aligned the stack happened to be made the stack's time vary by a third).
        temps = {}
        for k, buf in crossing.items():
            temps[k] = b.alloca(ir.ArrayType(storage_type(buf.type.dtype), BLOCK), name="blk")
            temps[k].align = 64
        # The value ranges of handed-off values and whether they may be NaN (ScalarEmitter),
        # kept across the hand-off: groups are emitted in order, so a later group reads what
        # an earlier one found.
        ranges: dict[int, object] = {}

        needed = handoffs_to_cut(b.module)

        def make_body(g, instrs, cuts: GroupCuts, segment: int):
            def body(bb, ps, j):
                emission = PassEmission(bb, j, cuts, segment)
                em = ScalarEmitter(bb, registry.scalars, handoffs=emission)
                # Values earlier groups handed off (a buffer this group reads before any
                # group wrote it is still external: it is loaded from memory instead).
                current = {}
                for k, buf in crossing.items():
                    if min(handoff[k]) < g:
                        current[k] = load_elem(bb, bb.gep(temps[k], [i64(0), j]), buf.type.dtype)
                        current[k].range, current[k].nan_free = ranges.get(k, (None, False))
                emit_stack(em, instrs, registry.kernels, current, _loader(bb, ps, externals))
                emission.finish()

                def stored_in_this_pass(value) -> bool:
                    # In the pass of the segment that computes it (loads: the first).
                    n = emission.number(value)
                    return (cuts.segment_of[n] if n is not None else 0) == segment

                for k in [k for k, gs in handoff.items() if g in gs]:
                    if stored_in_this_pass(current[k]):
                        store_elem(bb, current[k], bb.gep(temps[k], [i64(0), j]), crossing[k].type.dtype)
                        ranges[k] = current[k].range, current[k].nan_free
                for i, buf in enumerate(stored):
                    if group_of[slot(buf)] == g and stored_in_this_pass(current[slot(buf)]):
                        store_elem(bb, current[slot(buf)], ps[len(externals) + i], buf.type.dtype)
            return body

        def bodies():
            # Lazily: how many passes a group takes is known once its first pass is emitted.
            for g, instrs in enumerate(groups):
                cuts = GroupCuts(b, BLOCK, needed)
                yield make_body(g, instrs, cuts, 0)
                for segment in range(1, cuts.passes):
                    yield make_body(g, instrs, cuts, segment)

        blocked_loops(b, step.shape, bases, maps, BLOCK, bodies(), split=split)
