"""Operator stacking: runs of consecutive elementwise instructions over the same iteration
space become one loop.  Each external input is loaded once per element (broadcast operands
through stride-0 index maps, never materialized), the composed expression stays in
registers, and only values still needed after the run are stored.
"""
from __future__ import annotations

from typing import Optional

from ...lir.ir import Activation, Instr, Program
from ...lir.passes import lifetimes


class Step:
    """One native kernel: a stack of elementwise instructions, or one other instruction."""

    def __init__(self, instrs: list[Instr], stacked: bool):
        self.instrs = instrs
        self.stacked = stacked

    @property
    def shape(self):
        return self.instrs[0].node.outputs[0].type.shape

    def __repr__(self):
        return f"<Step {'+'.join(i.kind for i in self.instrs)}>"


def _elementwise(ins: Instr, registry) -> bool:
    return ins.kind in registry.kernels


def form_steps(prog: Program, registry, stacking: bool = True) -> list[Step]:
    steps: list[Step] = []
    run: list[Instr] = []
    written: set[int] = set()          # roots written by the current run

    def flush():
        nonlocal run
        if run:
            steps.append(Step(run, True))
        run = []
        written.clear()

    for ins in prog.instrs:
        if ins.kind in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW):
            continue                    # no code: memory is planned, views are free
        if not _elementwise(ins, registry):
            flush()
            steps.append(Step([ins], False))
            continue
        shape = ins.node.outputs[0].type.shape
        fits = stacking and run and shape == run[0].node.outputs[0].type.shape and all(
            b.type.shape == shape for b in ins.reads() if id(b.root()) in written)
        if not fits:
            flush()
        run.append(ins)
        written.update(id(b.root()) for b in ins.writes())
    flush()
    return steps


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
        overwritten = any(later.writes()[0].root() is root for later in step.instrs[k + 1:])
        dies_inside = isinstance(root, Activation) and life[root][1] <= last
        needed.append(not overwritten and not dies_inside)
    return needed


def memory_touches(step: Step, prog: Program, life: dict) -> list:
    """The buffers a step reads or writes in memory: for a stack, its external loads and
    its stores, not the intermediates that stay in registers."""
    if not step.stacked:
        return [b for ins in step.instrs for b in ins.buffers()]
    touched, written = [], set()
    for ins in step.instrs:
        for b in ins.reads():
            if id(b.root()) not in written:
                touched.append(b)
        written.update(id(b.root()) for b in ins.writes())
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
    blocks = [Block(k, acts[k].nbytes, s, e) for k, (s, e) in spans.items()]
    p = plan(blocks)
    for a in prog.activations:
        a.offset = p.offsets.get(id(a), 0)
    prog.region_sizes["activation"] = p.size
