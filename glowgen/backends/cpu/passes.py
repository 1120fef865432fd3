"""The cpu backend's LIR passes (CpuBackend.lir_passes), each making one kind of decision
and recording it in the program (plan.py), in this order:

  target           the target's features and the GEMM register tile that follows from them
  kernel-strategy  each kernel's strategy (a convolution's: planes, direct, transposed,
                   GEMM over the whole patch matrix or panel by panel, pointwise), chosen
                   once here and read by every later pass and by the kernel
  weight-packing   constant GEMM operands repacked into the layout their kernel reads
  stacking         runs of elementwise instructions become steps of one loop each
  epilogue-fusion  a stack following a matrix product is applied in the product's store
  row-fusion       steps that work row by row over the same rows (softmax's reductions and
                   stacks) run block by block of rows, in one loop (rows.py)
  arena            the activation arena planned again with a step as the unit of time
  threads          how many tasks each step is split into
  joining          a split step that reads only what the same task of the step before
                   wrote runs in that step's round of tasks, with no wait (joining.py)
  scratch          each kernel's scratch memory, after the arena (which grows by it)

Code emission (codegen.py) then reads what these passes recorded and decides nothing.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

from ...lir.ir import Program
from ...lir.passes import lifetimes
from .epilogue import fuse_epilogues
from .joining import join_steps
from .kernels import PACKING, PHASES, REPACK, SCRATCH, STRATEGY
from .loops import loop_work
from .packing import pack_weights, packable, weight_users
from .parallel import PARALLEL
from .plan import CpuPlan, InstrPlan
from .rows import fuse_rows, group_work
from .stacking import form_steps, replan_activations, stack_operands


def target(prog: Program, registry, features: str, threads: int, stacking: bool, winograd: bool) -> None:
    from .gemm import choose_shape
    prog.plan = CpuPlan(features=features or "", gemm_shape=choose_shape(features or ""),
                        threads=threads, stacking=stacking, winograd=winograd)


def kernel_strategy(prog: Program, registry) -> None:
    """Every kernel with a choice of strategies (kernels/base.STRATEGY) makes it, once."""
    shape = prog.plan.gemm_shape
    users = weight_users(prog)
    for ins in prog.instrs:
        choose = STRATEGY.get(ins.kind)
        if choose is not None and ins.node is not None:
            ins.plan = InstrPlan(strategy=choose(ins, shape, partial(packable, users=users), prog.plan))


def weight_packing(prog: Program, registry) -> None:
    """Constant operands repacked as their kernels read them (kernels/base.PACKING)."""
    shape = prog.plan.gemm_shape
    users = weight_users(prog)
    packed = 0
    for ins in prog.instrs:
        repack = REPACK.get(ins.kind)
        if repack is not None and ins.plan is not None:
            packed += bool(repack(prog, ins, shape, users))
            continue
        layout = PACKING.get(ins.kind)
        choice = layout(ins, shape) if layout is not None and ins.plan is not None else None
        if choice is not None and pack_weights(prog, ins, *choice, shape, users):
            packed += 1
    if packed:
        prog.place_weights()


def stacking(prog: Program, registry) -> None:
    prog.plan.steps = form_steps(prog, registry, prog.plan.stacking)


def epilogue_fusion(prog: Program, registry) -> None:
    if prog.plan.stacking:
        prog.plan.steps = fuse_epilogues(prog.plan.steps, registry, prog.plan.features)


def row_fusion(prog: Program, registry) -> None:
    if prog.plan.stacking:
        prog.plan.steps = fuse_rows(prog.plan.steps, prog, lifetimes(prog), prog.plan.gemm_shape)


def arena(prog: Program, registry) -> None:
    replan_activations(prog, prog.plan.steps)


def threads(prog: Program, registry) -> None:
    """How many tasks each step runs as (parallel.py): 1 unless its kernel can split and
    every share is worth a round of the pool."""
    plan = prog.plan
    if plan.threads <= 1:
        return
    life = lifetimes(prog)
    for step in plan.steps:
        if step.members:
            step.parts = group_work(step).parts(plan.threads)
            continue
        if step.stacked:
            _, _, maps = stack_operands(step, prog, life)
            step.parts = loop_work(step.shape, maps, cost=len(step.instrs)).parts(plan.threads)
            continue
        ins = step.instrs[0]
        work = PARALLEL.get(ins.kind)
        if work is not None and ins.node is not None:
            step.parts = work(ins.node, plan.gemm_shape, ins).parts(plan.threads)
        phased = PHASES.get(ins.kind)
        if step.parts > 1 and phased is not None and ins.plan is not None:
            ins.plan.phases = phased(ins, plan.gemm_shape, step.parts)
            if ins.plan.phases is not None:
                step.phases = ins.plan.phases.count
                step.shared_scratch = -(-ins.plan.phases.shared // 64) * 64


def joining(prog: Program, registry) -> None:
    if prog.plan.threads > 1:
        join_steps(prog, prog.plan.steps, prog.plan.gemm_shape)


def scratch(prog: Program, registry) -> None:
    """Scratch memory for the kernels that need it (im2col panels, padded planes), as large
    as the largest need, at the end of the activation region: the code keeps no state of
    its own, so concurrent calls with their own regions stay independent.  A split step's
    tasks each have a share of their own (`Step.scratch` bytes apart), after the scratch a
    phased kernel's tasks share (`Step.shared_scratch`)."""
    plan = prog.plan
    need = 0
    for step in plan.steps:
        for ins in step.instrs:
            fn = SCRATCH.get(ins.kind)
            if fn is None or ins.node is None:
                continue
            bytes_ = fn(ins, plan.gemm_shape)
            if bytes_:
                ins.plan.scratch = bytes_
                step.scratch = -(-bytes_ // 64) * 64
    # Joined steps' tasks take shares of one size: task p's of either overlaps no other's.
    for first, second in zip(plan.steps, plan.steps[1:]):
        if second.joined:
            first.scratch = second.scratch = max(first.scratch, second.scratch)
    for step in plan.steps:
        need = max(need, step.shared_scratch + step.scratch * step.parts)
    if need:
        plan.scratch_offset = -(-prog.region_sizes["activation"] // 64) * 64
        prog.region_sizes["activation"] = plan.scratch_offset + need
        prog.scratch_bytes = need


def cpu_passes(features: str, threads_: int, stacking_: bool, winograd: bool) -> list[tuple[str, Callable]]:
    """The passes in order, as (name, pass(prog, registry)) pairs."""
    return [("target", partial(target, features=features, threads=threads_, stacking=stacking_,
                               winograd=winograd)),
            ("kernel-strategy", kernel_strategy),
            ("weight-packing", weight_packing),
            ("stacking", stacking),
            ("epilogue-fusion", epilogue_fusion),
            ("row-fusion", row_fusion),
            ("arena", arena),
            ("threads", threads),
            ("joining", joining),
            ("scratch", scratch)]
