"""LIR program -> one LLVM module.

The entry point is `i32 NAME(i8* constant_weights, i8* mutable_weights, i8* activations)`.
It calls one internal function per step (a stack of elementwise instructions or one other
instruction), passing typed pointers at the offsets the memory plan fixed at compile time.
Pointers whose bytes overlap no other argument are marked `noalias`, so LLVM vectorizes
without runtime checks.
"""
from __future__ import annotations

from llvmlite import ir

from ...lir.ir import Activation, Buffer, Instr, Program
from ...lir.passes import lifetimes
from .epilogue import EpilogueEmitter, fuse_epilogues
from .kernels import KERNELS, SCRATCH, KernelArgs
from . import kernels_more  # noqa: F401  (registers the kernels of the last `extern` section)
from .llvmutil import I8P, I32, i64, storage_type
from .loops import broadcast_strides, contiguous_strides, strided_loops
from .scalar import ScalarEmitter, emit_stack, load_elem, store_elem
from .stacking import Step, form_steps, replan_activations, stores_needed

REGION_ORDER = ("constant", "mutable", "activation")


def region_of(buf: Buffer) -> str:
    root = buf.root()
    return "activation" if isinstance(root, Activation) else root.region


def byte_range(buf: Buffer) -> tuple[str, int, int]:
    root = buf.root()
    return region_of(buf), root.offset, root.offset + max(buf.nbytes, 1)


def _overlaps(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


class ModuleBuilder:
    def __init__(self, prog: Program, registry, name: str, stacking: bool = True,
                 features: str | None = None):
        from .gemm import choose_shape
        from .jit import host_target
        self.prog, self.registry, self.name = prog, registry, name
        self.stacking = stacking
        self.module = ir.Module(name=name)
        self.life = lifetimes(prog)
        self.gemm_shape = choose_shape(host_target()[2] if features is None else features)
        self.scratch = None

    def build(self) -> ir.Module:
        entry_ty = ir.FunctionType(I32, [I8P, I8P, I8P])
        entry = ir.Function(self.module, entry_ty, name=self.name)
        for arg, n in zip(entry.args, REGION_ORDER):
            arg.name = n
            arg.add_attribute("noalias")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        regions = dict(zip(REGION_ORDER, entry.args))
        steps = form_steps(self.prog, self.registry, self.stacking)
        if self.stacking:
            steps = fuse_epilogues(steps, self.registry)
        replan_activations(self.prog, steps)
        self._declare_scratch(steps)
        for i, step in enumerate(steps):
            fn, buffers = self._step_function(i, step)
            ptrs = []
            for buf in buffers:
                raw = b.gep(regions[region_of(buf)], [i64(buf.root().offset)])
                ptrs.append(b.bitcast(raw, storage_type(buf.type.dtype).as_pointer()))
            b.call(fn, ptrs)
        b.ret(ir.Constant(I32, 0))
        return self.module

    def _declare_scratch(self, steps) -> None:
        """One zero-initialized buffer, as large as the largest kernel's need."""
        need = 0
        for step in steps:
            for ins in step.instrs:
                fn = SCRATCH.get(ins.kind)
                if fn is not None and ins.node is not None:
                    need = max(need, fn(ins.node, self.gemm_shape))
        if need:
            ty = ir.ArrayType(ir.IntType(8), need)
            g = ir.GlobalVariable(self.module, ty, name=f"{self.name}_scratch")
            g.linkage = "internal"
            g.initializer = ir.Constant(ty, None)
            g.align = 64
            self.scratch = g

    # ------------------------------------------------------------------ steps
    def _step_function(self, index: int, step: Step):
        buffers: list[Buffer] = []
        for ins in step.instrs:
            for _, buf in ins.operands:
                if buf is not None and all(buf is not x for x in buffers):
                    buffers.append(buf)
        kinds = "_".join(i.kind for i in step.instrs[:3]) + ("_etc" if len(step.instrs) > 3 else "")
        fnty = ir.FunctionType(ir.VoidType(), [storage_type(x.type.dtype).as_pointer() for x in buffers])
        fn = ir.Function(self.module, fnty, name=f"s{index}_{kinds}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        ranges = [byte_range(x) for x in buffers]
        for j, (arg, buf) in enumerate(zip(fn.args, buffers)):
            arg.name = buf.name.replace('"', "")
            if not any(_overlaps(ranges[j], r) for k, r in enumerate(ranges) if k != j):
                arg.add_attribute("noalias")
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
        return fn, buffers

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
        scratch = None
        if self.scratch is not None:
            from .llvmutil import F32
            scratch = b.bitcast(self.scratch, F32.as_pointer())
        args = KernelArgs(b, node, outs, ins_args, self.registry.scalars, self.gemm_shape, scratch)
        args.epilogue = epilogue
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

        def body(bb, ps):
            em = ScalarEmitter(bb, registry.scalars)
            loaded = {}
            current = {}                  # root id -> value computed in this iteration

            def load(buf):
                k = next(j for j, x in enumerate(externals) if x is buf)
                if k not in loaded:
                    loaded[k] = load_elem(bb, ps[k], buf.type.dtype)
                return loaded[k]

            emit_stack(em, step.instrs, registry.kernels, current, load)
            for j, buf in enumerate(stored):
                store_elem(bb, current[id(buf.root())], ps[len(externals) + j], buf.type.dtype)

        strided_loops(b, shape, bases, maps, [0] * len(bases), body)
