"""Operator stacking: runs of consecutive elementwise instructions over the same iteration
space become one loop.  Each external input is loaded once per element (broadcast operands
through stride-0 index maps, never materialized), the composed expression stays in
registers, and only values still needed after the run are stored.
"""
from __future__ import annotations

from typing import Optional

import attrs

import numpy as np

from ...lir.control import loop_lifetimes
from ...lir.ir import Activation, Instr, Program, WeightBuffer, slot
from ...lir.passes import lifetimes
from .loops import Indexed, broadcast_strides, contiguous_strides


@attrs.define(eq=False, repr=False)
class Step:
    """One native kernel: a stack of elementwise instructions, or one other instruction
    (with, after epilogue fusion, the stack applied in its store)."""
    instrs: list                        # the instructions it runs, in order
    stacked: bool                       # a stack of elementwise instructions (one loop)
    epilogue: Optional["Step"] = None   # the stack fused into this product's store
    #                                     (its instructions are also instrs[1:])
    parts: int = 1                      # tasks it is split into (parallel.py)
    scratch: int = 0                    # bytes of scratch memory per task (64-byte multiple)
    phases: int = 1                     # rounds of its tasks (plan.Phases), each after the last
    shared_scratch: int = 0             # bytes of scratch its tasks share (64-byte multiple),
    #                                     before their own shares
    members: Optional[list] = None      # a row group's steps, run block by block (rows.py;
    #                                     their instructions are also instrs)
    rows: tuple = ()                    # a row group's (rows, row length, rows per block)
    joined: bool = False                # its tasks run in the round of the step before,
    #                                     each after that step's task of the same index
    #                                     (joining.py)

    @property
    def shape(self):
        return self.instrs[0].node.outputs[0].type.shape

    def __repr__(self):
        return f"<Step {'+'.join(i.kind for i in self.instrs)}>"


def is_control(step: Step) -> bool:
    """A step that is a control-flow marker of the LIR (ir.Instr.CONTROL): it runs no
    kernel; the entry point branches there (codegen.ModuleBuilder._control)."""
    return step.instrs[0].kind in Instr.CONTROL


def describe_step(step: Step) -> str:
    """`Conv+Add+Relu [1, 64, 56, 56]`: a step's instructions and its result's shape, and
    what its kernel adds (kernels/base.DESCRIBE: a convolution's window and stride)."""
    if is_control(step):
        first = step.instrs[0]
        return first.kind + "".join(f" %{b.name}" for b in first.reads())
    from .kernels import DESCRIBE
    kinds = [i.kind for i in step.instrs]          # a fused epilogue's included
    if step.members:
        rows, n, block = step.rows
        return f"{'+'.join(kinds)} [{rows} rows of {n}] (row group, blocks of {block})"
    first = step.instrs[0]
    node = first.node
    shape = list(node.outputs[0].type.shape) if node is not None else []
    text = f"{'+'.join(kinds)} {shape}"
    describe = DESCRIBE.get(first.kind)
    if node is not None and describe is not None:
        text += describe(node)
    return text


def _elementwise(ins: Instr, registry) -> bool:
    return ins.kind in registry.kernels


# ------------------------------------------------------------------ gathers read by a stack
# A Gather along one axis with constant indices (a resize's taps, an embedding's fixed rows)
# is a load with an index table: a stack reads its operand there (loops.Indexed) instead of
# a gathered copy written by one kernel and read back by the next.

def gather_table(ins: Instr) -> Optional[tuple]:
    """(axis, indices) of a Gather a stack can read through: constant 1-D indices (at least
    two), all within the axis (negative ones counted from its end)."""
    if ins.kind != "Gather" or ins.node is None:
        return None
    x, idx = ins.reads()[0], ins.reads()[1]
    root = idx.root()
    if (not isinstance(root, WeightBuffer) or root.region != "constant" or root.data is None
            or root.nbytes != idx.nbytes or idx.type.rank != 1 or idx.type.size < 2):
        return None
    axis = ins.node.attr_values()["axis"]
    axis = axis + x.type.rank if axis < 0 else axis
    dim = x.type.shape[axis]
    table = np.asarray(root.data).reshape(-1).astype(np.int64)
    if table.size != idx.type.size or np.any(table < -dim) or np.any(table >= dim):
        return None
    return axis, tuple(int(t) for t in np.where(table < 0, table + dim, table))


class GatherRead:
    """A stack's external operand that is a Gather's input read through its index table."""

    def __init__(self, ins: Instr):
        self.ins = ins
        self.buffer = ins.reads()[0]
        self.type = self.buffer.type

    def root(self):
        return self.buffer.root()

    def strides(self) -> list:
        """Its index map over the Gather's output shape."""
        axis, table = gather_table(self.ins)
        own = contiguous_strides(self.buffer.type.shape)
        return [Indexed(table, s) if d == axis else s for d, s in enumerate(own)]


def has_gathers(step: "Step") -> bool:
    return step.stacked and any(ins.kind == "Gather" for ins in step.instrs)


def form_steps(prog: Program, registry, stacking: bool = True) -> list[Step]:
    steps: list[Step] = []
    run: list[Instr] = []
    written: set[tuple] = set()        # slots (ir.slot) written by the current run

    def flush():
        nonlocal run
        if run:
            steps.append(Step(run, True))
        run = []
        written.clear()

    for ins in prog.instrs:
        if ins.kind in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW):
            continue                    # no code: memory is planned, views are free
        gather = stacking and gather_table(ins) is not None
        if not gather and not _elementwise(ins, registry):
            flush()
            steps.append(Step([ins], False))
            continue
        shape = ins.node.outputs[0].type.shape
        if gather:          # its input must be in memory: not a value of this iteration
            fits = run and shape == run[0].node.outputs[0].type.shape and slot(ins.reads()[0]) not in written
        else:
            fits = stacking and run and shape == run[0].node.outputs[0].type.shape and all(
                b.type.shape == shape for b in ins.reads() if slot(b) in written)
        if not fits:
            flush()
        run.append(ins)
        written.update(slot(b) for b in ins.writes())
    flush()
    # A run of gathers alone stays with the Gather kernel (it copies whole rows).
    out: list[Step] = []
    for step in steps:
        if step.stacked and all(ins.kind == "Gather" for ins in step.instrs):
            out.extend(Step([ins], False) for ins in step.instrs)
        else:
            out.append(step)
    return out


# ------------------------------------------------------------------ strip-mined stacks
# A stack of several transcendentals is one long dependency chain per element: the core
# holds only a few iterations in flight (its reorder buffer), so the loop runs at the
# chain's latency, not at the machine's throughput.  Such a stack is cut into groups, each
# run over a block of elements that stays in L1 (loops.blocked_loops), so every group's
# loop has independent iterations again while memory is touched once, as for one stack.

HEAVY_COST = 24          # kernel-expression nodes above which an op is a long chain
BLOCK = 256              # elements per block: a few KB of intermediates, in L1


def _expanded_nodes(tree, registry, seen: set):
    """Each distinct node of a kernel expression (`let` values once), with the spec's scalar
    functions it calls expanded, each definition once."""
    if id(tree) in seen:
        return
    seen.add(id(tree))
    yield tree
    if isinstance(tree, tuple) and tree[0] == "call":
        for t in tree[2]:
            yield from _expanded_nodes(t, registry, seen)
        sc = registry.scalars.get(tree[1])
        if sc is not None:
            yield from _expanded_nodes(sc["body"], registry, seen)


def kernel_cost(tree, registry) -> int:
    """Distinct nodes of a kernel expression, scalar functions expanded: a rough measure of
    its instructions and chain length."""
    return sum(1 for _ in _expanded_nodes(tree, registry, set()))


def handoff_count(ins, registry) -> int:
    """The places the instruction's kernel (its scalar functions expanded, each once) marks
    where its chain may be cut into passes (handoffs.py)."""
    kern = registry.kernels.get(ins.kind)
    if kern is None:
        return 0
    return sum(1 for node in _expanded_nodes(kern["body"], registry, set())
               if node[0] == "call" and node[1] == "handoff")


def cost_groups(step: Step, registry) -> list[list]:
    """The instructions of a stacked step, in order, cut so that each group holds at most
    one heavy op (a transcendental) with the cheap ones around it.  One group (no cut)
    for the cheap chains most stacks are."""
    groups: list[list] = [[]]
    heavy = False
    for ins in step.instrs:
        kern = registry.kernels.get(ins.kind)          # None: a gather (a load)
        is_heavy = kern is not None and kernel_cost(kern["body"], registry) > HEAVY_COST
        if is_heavy and heavy:
            groups.append([])
            heavy = False
        groups[-1].append(ins)
        heavy = heavy or is_heavy
    return groups


def stores_needed(step: Step, prog: Program, life: Optional[dict] = None) -> list[bool]:
    """For each instruction of a stacked step: must its result reach memory?

    Not when a later instruction of the step overwrites the same buffer, nor when the
    buffer's lifetime ends inside the step (an intermediate nobody reads afterwards)."""
    life = lifetimes(prog) if life is None else life
    index = {id(ins): i for i, ins in enumerate(prog.instrs)}
    last = index[id(step.instrs[-1])]
    needed = []
    for k, ins in enumerate(step.instrs):
        root = ins.writes()[0].root()
        overwritten = any(slot(later.writes()[0]) == slot(ins.writes()[0]) for later in step.instrs[k + 1:])
        dies_inside = isinstance(root, Activation) and life[root][1] <= last
        needed.append(not overwritten and not dies_inside)
    return needed


def memory_touches(step: Step, prog: Program, life: dict) -> list:
    """The buffers a step reads or writes in memory: for a stack, its external loads and
    its stores, not the intermediates that stay in registers."""
    if step.members:
        return [b for m in step.members for b in memory_touches(m, prog, life)]
    if not step.stacked:
        return [b for ins in step.instrs for b in ins.buffers()]
    touched, written = [], set()
    for ins in step.instrs:
        for b in ins.reads():
            if slot(b) not in written:
                touched.append(b)
        written.update(slot(b) for b in ins.writes())
    needed = stores_needed(step, prog, life)
    touched += [ins.writes()[0] for ins, need in zip(step.instrs, needed) if need]
    return touched


def replan_activations(prog: Program, steps: list[Step]) -> None:
    """Plan the activation arena again with a step as the unit of time.

    A stacked loop reads and writes all its buffers at once, so buffers the LIR plan let
    share bytes (one dead before the other is born) may not share them inside one loop;
    and intermediates that stay in registers need no memory at all."""
    from ...lir.allocator import Block, plan
    life = lifetimes(prog)
    spans: dict[int, list] = {}
    acts: dict[int, Activation] = {}
    for t, step in enumerate(steps):
        for b in memory_touches(step, prog, life):
            root = b.root()
            if isinstance(root, Activation):
                acts[id(root)] = root
                span = spans.setdefault(id(root), [t, t])
                span[1] = t
    loop_lifetimes(spans, [step.instrs[0] for step in steps])     # markers are steps
    blocks = [Block(k, acts[k].nbytes, s, e) for k, (s, e) in spans.items()]
    p = plan(blocks)
    for a in prog.activations:
        a.offset = p.offsets.get(id(a), 0)
    prog.region_sizes["activation"] = p.size
    prog.strategy = p.strategy


def stack_operands(step: Step, prog: Program, life: dict):
    """A stack's external operands (every buffer read before the step writes it), the
    values it stores, and the index maps of both over the step's shape."""
    shape = step.shape
    needed = stores_needed(step, prog, life)
    externals: list = []
    written: set[tuple] = set()
    for ins in step.instrs:
        if ins.kind == "Gather":                   # its input, through the index table
            externals.append(GatherRead(ins))
        else:
            for buf in ins.reads():
                if slot(buf) not in written and all(buf is not x for x in externals):
                    externals.append(buf)
        written.update(slot(x) for x in ins.writes())
    stored = [ins.writes()[0] for ins, need in zip(step.instrs, needed) if need]
    maps = ([x.strides() if isinstance(x, GatherRead) else broadcast_strides(x.type.shape, shape)
             for x in externals]
            + [contiguous_strides(shape) for _ in stored])
    return externals, stored, maps
