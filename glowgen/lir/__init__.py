"""The low-level IR: instructions over addressed buffers, with a static memory plan."""
from __future__ import annotations

from .allocator import Block, plan
from .ir import ALIGNMENT, Activation, Instr, Program, TensorView, WeightBuffer
from .irgen import generate
from .passes import lifetimes, optimize


def activation_blocks(prog: Program) -> list[Block]:
    life = lifetimes(prog)
    return [Block(a, a.nbytes, *life[a]) for a in prog.activations]


def plan_memory(prog: Program) -> str:
    """Assign weight offsets and activation offsets; returns the winning strategy's name."""
    prog.place_weights()
    blocks = activation_blocks(prog)
    p = plan(blocks)
    for a in prog.activations:
        a.offset = p.offsets[a]
    prog.region_sizes["activation"] = p.size
    prog.strategy = p.strategy
    return p.strategy


def build(function, registry, optimize_ir: bool = True) -> Program:
    """Lowered graph -> LIR program with a memory plan."""
    prog = generate(function, registry)
    if optimize_ir:
        optimize(prog, registry)
    else:
        from .passes import shorten_lifetimes
        shorten_lifetimes(prog)
    plan_memory(prog)
    return prog
