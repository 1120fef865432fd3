"""LIR program -> one LLVM module.

The entry point is `i32 NAME(i8* constant_weights, i8* mutable_weights, i8* activations)`.
It calls one internal function per step (a stack of elementwise instructions or one other
instruction), passing typed pointers at the offsets the memory plan fixed at compile time.
Pointers whose bytes overlap no other argument are marked `noalias`, so LLVM vectorizes
without runtime checks.

For the JIT, a second entry point `i32 NAME_io(.., .., .., i8** io)` takes the graph inputs
and outputs listed in `io_slots(prog)` from a table of pointers instead of the mutable
region, so a caller can run on its own arrays without copying them in and out.
"""
from __future__ import annotations

from llvmlite import ir

from ...lir.ir import Activation, Buffer, Instr, Program
from ...lir.passes import lifetimes
from .epilogue import EpilogueEmitter, fuse_epilogues
from .kernels import KERNELS, SCRATCH, KernelArgs
from . import kernels_more  # noqa: F401  (registers the kernels of the last `extern` section)
from .packing import pack_constant_weights
from .llvmutil import F32, I8P, I32, i64, intrinsic, set_target_features, storage_type
from .loops import blocked_loops, broadcast_strides, contiguous_strides, innermost_extent, strided_loops
from .scalar import ScalarEmitter, emit_stack, load_elem, store_elem
from .stacking import BLOCK, Step, cost_groups, form_steps, replan_activations, stores_needed

REGION_ORDER = ("constant", "mutable", "activation")


def region_of(buf: Buffer) -> str:
    root = buf.root()
    return "activation" if isinstance(root, Activation) else root.region


def byte_range(buf: Buffer) -> tuple[str, int, int]:
    root = buf.root()
    return region_of(buf), root.offset, root.offset + max(buf.nbytes, 1)


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


def _loader(b, ptrs, externals):
    """load(buf) for a stack's external operand buffer: its element at ptrs[its index],
    read once per iteration however many instructions use it."""
    loaded = {}

    def load(buf):
        k = next(j for j, x in enumerate(externals) if x is buf)
        if k not in loaded:
            loaded[k] = load_elem(b, ptrs[k], buf.type.dtype)
        return loaded[k]
    return load


def describe_step(step: Step) -> str:
    """`Conv+Add+Relu [1, 64, 56, 56]`: a step's instructions and its result's shape."""
    kinds = [i.kind for i in step.instrs]          # a fused epilogue's included
    node = step.instrs[0].node
    shape = list(node.outputs[0].type.shape) if node is not None else []
    text = f"{'+'.join(kinds)} {shape}"
    if node is not None and step.instrs[0].kind in ("Conv", "ConvN"):
        window = "x".join(map(str, node.inputs[1].type.shape[2:]))
        text += f" {window} stride {'x'.join(map(str, node.strides))}"
        if node.group > 1:
            text += f" groups {node.group}"
    return text


class ModuleBuilder:
    def __init__(self, prog: Program, registry, name: str, stacking: bool = True,
                 features: str | None = None, io_entry: bool = False, profile: bool = False):
        from .gemm import choose_shape
        from .jit import host_target
        self.prog, self.registry, self.name = prog, registry, name
        self.stacking = stacking
        self.module = ir.Module(name=name)
        self.life = lifetimes(prog)
        features = host_target()[2] if features is None else features
        set_target_features(self.module, features)
        self.gemm_shape = choose_shape(features)
        self.scratch_offset = None       # of the kernels' scratch in the activation region
        self.scratch_steps: set[int] = set()  # ids of the steps whose kernels use it
        self.io_entry = io_entry
        self.profile = profile
        self.step_names: list[str] = []   # what each step computes, for profiles

    def build(self) -> ir.Module:
        from .kernels import conv_weight_layout
        if self.gemm_shape is not None:
            shape = self.gemm_shape
            pack_constant_weights(self.prog, shape, lambda node: conv_weight_layout(node, shape))
        steps = form_steps(self.prog, self.registry, self.stacking)
        if self.stacking:
            steps = fuse_epilogues(steps, self.registry)
        replan_activations(self.prog, steps)
        self._declare_scratch(steps)
        calls = [self._step_function(i, step) for i, step in enumerate(steps)]
        self.step_names = [describe_step(step) for step in steps]
        self._counters = None
        if self.profile:
            # Each step's fewest cycles over the runs: the cycle counter is wall time, and the
            # minimum is what survives the runs another process interrupted.
            ty = ir.ArrayType(ir.IntType(64), max(1, len(steps)))
            self._counters = ir.GlobalVariable(self.module, ty, name=f"{self.name}_profile")
            self._counters.initializer = ir.Constant(ty, [ir.Constant(ir.IntType(64), 2 ** 64 - 1)] * ty.count)
        if not self.io_entry:
            self._entry(self.name, calls, slots=None)
            return self.module
        # One entry calls the steps (each step function has one call site, so LLVM inlines
        # them all: with two entries calling them it would not, and MobileNetV2 ran 30%
        # slower); the region entry passes a table of its own region pointers.
        slots = io_slots(self.prog)
        io_fn = self._entry(self.name + "_io", calls, slots=slots)
        self._region_entry(io_fn, slots)
        return self.module

    def _region_entry(self, io_fn, slots) -> None:
        """`NAME(constant, mutable, activations)`: NAME_io with the io buffers at their places
        in the mutable region."""
        entry = ir.Function(self.module, ir.FunctionType(I32, [I8P, I8P, I8P]), name=self.name)
        for arg, n in zip(entry.args, REGION_ORDER):
            arg.name = n
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        table = b.alloca(ir.ArrayType(I8P, max(1, len(slots))), name="io")
        for k, w in enumerate(slots):
            b.store(b.gep(entry.args[REGION_ORDER.index(w.region)], [i64(w.offset)]),
                    b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
        first = b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, 0)])
        b.ret(b.call(io_fn, list(entry.args) + [first]))

    def _entry(self, name: str, calls, slots) -> None:
        """An entry point calling every step; with `slots`, the buffers listed there come
        from the pointer table of a fourth argument rather than from the mutable region."""
        params = [I8P, I8P, I8P] + ([I8P.as_pointer()] if slots is not None else [])
        entry = ir.Function(self.module, ir.FunctionType(I32, params), name=name)
        for arg, n in zip(entry.args, REGION_ORDER + ("io",)):
            arg.name = n
            arg.add_attribute("noalias")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        regions = dict(zip(REGION_ORDER, entry.args))
        slot_of = {id(w): k for k, w in enumerate(slots or ())}
        clock = (intrinsic(self.module, "llvm.readcyclecounter", ir.IntType(64), [])
                 if self._counters is not None else None)
        for index, (fn, buffers, uses_scratch) in enumerate(calls):
            ptrs = []
            for buf in buffers:
                k = slot_of.get(id(buf.root()))
                raw = (b.load(b.gep(entry.args[3], [i64(k)])) if k is not None
                       else b.gep(regions[region_of(buf)], [i64(buf.root().offset)]))
                ptrs.append(b.bitcast(raw, storage_type(buf.type.dtype).as_pointer()))
            if uses_scratch:
                raw = b.gep(regions["activation"], [i64(self.scratch_offset)])
                ptrs.append(b.bitcast(raw, F32.as_pointer()))
            start = b.call(clock, []) if clock is not None else None
            b.call(fn, ptrs)
            if clock is not None:
                slot = b.gep(self._counters, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), index)])
                spent = b.sub(b.call(clock, []), start)
                old = b.load(slot)
                b.store(b.select(b.icmp_unsigned("<", spent, old), spent, old), slot)
        b.ret(ir.Constant(I32, 0))
        return entry

    def _declare_scratch(self, steps) -> None:
        """Scratch memory for the kernels that need it (im2col panels, padded planes), as
        large as the largest need, at the end of the activation region: the code keeps no
        state of its own, so concurrent calls with their own regions stay independent."""
        need = 0
        for step in steps:
            for ins in step.instrs:
                fn = SCRATCH.get(ins.kind)
                if fn is not None and ins.node is not None:
                    bytes_ = fn(ins.node, self.gemm_shape)
                    if bytes_:
                        self.scratch_steps.add(id(step))
                    need = max(need, bytes_)
        if need:
            self.scratch_offset = -(-self.prog.region_sizes["activation"] // 64) * 64
            self.prog.region_sizes["activation"] = self.scratch_offset + need

    # ------------------------------------------------------------------ steps
    def _step_function(self, index: int, step: Step):
        buffers: list[Buffer] = []
        for ins in step.instrs:
            for _, buf in ins.operands:
                if buf is not None and all(buf is not x for x in buffers):
                    buffers.append(buf)
        kinds = "_".join(i.kind for i in step.instrs[:3]) + ("_etc" if len(step.instrs) > 3 else "")
        # A step whose kernel uses scratch takes it as a last argument (it overlaps nothing).
        uses_scratch = id(step) in self.scratch_steps
        params = [storage_type(x.type.dtype).as_pointer() for x in buffers]
        fnty = ir.FunctionType(ir.VoidType(), params + ([F32.as_pointer()] if uses_scratch else []))
        fn = ir.Function(self.module, fnty, name=f"s{index}_{kinds}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        ranges = [byte_range(x) for x in buffers]
        for j, (arg, buf) in enumerate(zip(fn.args, buffers)):
            arg.name = buf.name.replace('"', "")
            if not any(_overlaps(ranges[j], r) for k, r in enumerate(ranges) if k != j):
                arg.add_attribute("noalias")
        self._scratch_arg = None
        if uses_scratch:
            self._scratch_arg = fn.args[-1]
            self._scratch_arg.name = "scratch"
            self._scratch_arg.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        ptr = {id(buf): arg for buf, arg in zip(buffers, fn.args)}
        if step.stacked:
            self._emit_stack(b, step, ptr)
        elif getattr(step, "epilogue", None) is not None:
            epilogue = EpilogueEmitter(step, self.prog, self.life, self.registry, ptr, self.gemm_shape.vw)
            self._emit_single(b, step.instrs[0], ptr, epilogue)
        else:
            self._emit_single(b, step.instrs[0], ptr)
        b.ret_void()
        return fn, buffers, uses_scratch

    def _emit_single(self, b, ins: Instr, ptr, epilogue=None):
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
        args = KernelArgs(b, node, outs, ins_args, self.registry.scalars, self.gemm_shape, scratch)
        args.epilogue = epilogue
        args.packed = getattr(ins, "packed", None)
        args.packed_nr = getattr(ins, "packed_nr", None)
        emitter(args)

    def _emit_stack(self, b, step: Step, ptr):
        shape = step.shape
        needed = stores_needed(step, self.prog, self.life)
        # External operands: every buffer read before the step writes it.
        externals: list[Buffer] = []
        written: set[int] = set()
        for ins in step.instrs:
            for buf in ins.reads():
                if id(buf.root()) not in written and all(buf is not x for x in externals):
                    externals.append(buf)
            written.update(id(x.root()) for x in ins.writes())
        stored = [ins.writes()[0] for ins, need in zip(step.instrs, needed) if need]
        bases = [ptr[id(x)] for x in externals] + [ptr[id(x)] for x in stored]
        maps = ([broadcast_strides(x.type.shape, shape) for x in externals]
                + [contiguous_strides(shape) for _ in stored])
        registry = self.registry
        groups = cost_groups(step, registry)
        if len(groups) > 1 and innermost_extent(shape, maps) >= 2 * BLOCK:
            self._emit_stack_blocked(b, step, groups, externals, stored, bases, maps)
            return

        def body(bb, ps):
            em = ScalarEmitter(bb, registry.scalars)
            current = {}                  # root id -> value computed in this iteration
            emit_stack(em, step.instrs, registry.kernels, current, _loader(bb, ps, externals))
            for j, buf in enumerate(stored):
                store_elem(bb, current[id(buf.root())], ps[len(externals) + j], buf.type.dtype)

        strided_loops(b, shape, bases, maps, [0] * len(bases), body)

    def _emit_stack_blocked(self, b, step: Step, groups, externals, stored, bases, maps):
        """A costly stack as groups run one after another over each block of elements
        (stacking.cost_groups); values one group passes to a later one wait in per-block
        arrays on the stack, in L1."""
        registry = self.registry
        group_of = {}                                   # root id -> last group writing it
        for g, instrs in enumerate(groups):
            for ins in instrs:
                group_of[id(ins.writes()[0].root())] = g
        # A value crosses groups when a later group reads its buffer; the group that
        # computes it last before that read stores it (`handoff`: root id -> groups).
        crossing: dict[int, object] = {}                # root id -> buffer (for its type)
        handoff: dict[int, set] = {}
        for g, instrs in enumerate(groups):
            for ins in instrs:
                for buf in ins.reads():
                    k = id(buf.root())
                    writers = [h for h in range(g) if any(id(i.writes()[0].root()) == k for i in groups[h])]
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
        # The value ranges of handed-off values (ScalarEmitter), kept across the hand-off:
        # groups are emitted in order, so a later group reads what an earlier one found.
        ranges: dict[int, object] = {}

        def make_body(g, instrs):
            def body(bb, ps, j):
                em = ScalarEmitter(bb, registry.scalars)
                # Values earlier groups handed off (a buffer this group reads before any
                # group wrote it is still external: it is loaded from memory instead).
                current = {}
                for k, buf in crossing.items():
                    if min(handoff[k]) < g:
                        current[k] = load_elem(bb, bb.gep(temps[k], [i64(0), j]), buf.type.dtype)
                        current[k].range = ranges.get(k)
                emit_stack(em, instrs, registry.kernels, current, _loader(bb, ps, externals))
                for k in [k for k, gs in handoff.items() if g in gs]:
                    store_elem(bb, current[k], bb.gep(temps[k], [i64(0), j]), crossing[k].type.dtype)
                    ranges[k] = current[k].range
                for i, buf in enumerate(stored):
                    if group_of[id(buf.root())] == g:
                        store_elem(bb, current[id(buf.root())], ps[len(externals) + i], buf.type.dtype)
            return body

        blocked_loops(b, step.shape, bases, maps, BLOCK,
                      [make_body(g, instrs) for g, instrs in enumerate(groups)])
