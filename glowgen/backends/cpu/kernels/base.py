"""What every kernel shares: the registry of kernels by instruction kind, the registries
of what the cpu backend's LIR passes (passes.py) ask of a kernel, and `KernelArgs`, what
an emitter is handed."""
from __future__ import annotations

from functools import partial
from typing import Callable

from llvmlite import ir

from ..parallel import WHOLE
from ..plan import InstrPlan

KERNELS: dict[str, Callable] = {}


def kernel(*kinds, **params):
    """Register the decorated emitter for the instruction `kinds`; `params` are passed to
    it as keywords (one function for several kinds, told apart by what is registered, not
    by reading the op's name back: `@kernel("ArgMax", largest=True)`)."""
    def register(fn):
        for kind in kinds:
            if kind in KERNELS:
                raise ValueError(f"two cpu kernels registered for {kind}")
            KERNELS[kind] = partial(fn, **params) if params else fn
        return fn
    return register


# What the passes ask of the kernels that have a say, by instruction kind:
# the kernel-strategy pass: (ins, gemm shape, packable, plan) -> the kernel's strategy, where
#   packable(buf) says whether a constant operand could be repacked and plan is the
#   program's plan.CpuPlan, with the compile options (plan.CONV_STRATEGIES);
STRATEGY: dict[str, Callable] = {}
# the weight-packing pass: (ins, gemm shape) -> (operand index, layout, panel width) of a
#   constant operand the kernel reads packed (packing.py), or None;
PACKING: dict[str, Callable] = {}
# the weight-packing pass, for kernels that repack their constants themselves (several
#   operands into one buffer, other element types): (prog, ins, gemm shape, users) -> bool;
REPACK: dict[str, Callable] = {}
# the epilogue-fusion pass: ins -> the [batch, rows, columns] view of the result when the
#   kernel stores whole vectors of a row through an epilogue (epilogue.py), or None;
PRODUCT_SPACE: dict[str, Callable] = {}
# the scratch pass: (ins, gemm shape) -> bytes of scratch memory one task needs.  The module
# holds one scratch buffer as large as the largest need (kernels run one after another);
SCRATCH: dict[str, Callable] = {}
# the threads pass, for a step split into `parts` tasks: (ins, gemm shape, parts) ->
#   plan.Phases when the kernel's tasks first prepare data together (each its share, in
#   scratch they all read), wait for each other, and then compute from it; or None (every
#   task prepares its own);
PHASES: dict[str, Callable] = {}
# the row-fusion pass: (ins, gemm shape) -> (rows, row length) when the kernel works row by
#   row and computes only the rows a `rows.RowBlock` share gives it, or None;
ROWS: dict[str, Callable] = {}
# the joining pass, for a step split into `parts` tasks: (ins, gemm shape, parts) -> (the
#   output channels, axis 1, each task computes as [(lo, hi)], and whether each task reads
#   only the same channels of its input x), or None when its split is not by channels;
CHANNELS: dict[str, Callable] = {}
# step descriptions (profiles, dumps): node -> text after the shape.
DESCRIBE: dict[str, Callable] = {}


def hook(table: dict, *kinds):
    """Register the decorated function in `table` for the instruction `kinds`."""
    def register(fn):
        for kind in kinds:
            table[kind] = fn
        return fn
    return register


class KernelArgs:
    def __init__(self, b: ir.IRBuilder, node, outs: list, ins: list, scalars: dict,
                 gemm_shape=None, scratch=None, plan=None):
        self.b, self.node, self.outs, self.ins, self.scalars = b, node, outs, ins, scalars
        self.gemm_shape = gemm_shape      # register tile for the target (see gemm.py)
        self.scratch = scratch            # float* to the module's scratch buffer
        self.epilogue = None              # elementwise run fused into the store (epilogue.py)
        self.split = WHOLE                # the share of the work this function does (parallel.py)
        plan = plan if plan is not None else InstrPlan()
        self.strategy = plan.strategy     # what the passes decided (plan.InstrPlan)
        self.packed = plan.packed         # "a" / "b" / "t": a constant operand repacked (packing.py)
        self.packed_nr = plan.packed_nr   # the width of B's packed panels
        # A phased kernel (PHASES) is emitted once per phase: this function runs `phase` of
        # `plan.phases.count` (None: unphased, all of it), with the scratch all tasks share.
        self.phase = None
        self.shared_scratch = None
        self.phases = plan.phases         # plan.Phases, or None

    def claim_words(self):
        """The i64* claim words (one a task) the tasks claim their work from
        (plan.Phases.claims, parallel.for_claimed), or None."""
        if self.phases is None or not self.phases.claims or self.split.whole:
            return None
        at = self.b.gep(self.b.bitcast(self.shared_scratch, ir.IntType(8).as_pointer()),
                        [ir.Constant(ir.IntType(64), self.phases.claim_words_at)])
        return self.b.bitcast(at, ir.IntType(64).as_pointer())

    @property
    def phased(self) -> bool:
        return self.phase is not None

    @property
    def attrs(self):
        return self.node.attr_values()
