"""Run a LIR program with NumPy over real byte arenas.

The three regions are byte buffers; every operand is a NumPy view at its planned offset, so
a wrong memory plan gives wrong numbers (and the tests catch it).  The kernels are the
reference semantics of glowgen/reference, the same that fold constants."""
from __future__ import annotations

import numpy as np

from ...errors import InputError
from ...lir.control import jumps
from ...lir.ir import Instr, Program
from ...reference import run_node
from ..base import ContextPool, aligned_bytes, region_view


class _Context:
    """One call's regions (constants shared), with each instruction's operand views made
    once: the regions never move."""

    def __init__(self, prog: Program, constant: np.ndarray):
        self.regions = {"constant": constant,
                        "mutable": aligned_bytes(prog.region_sizes["mutable"]),
                        "activation": aligned_bytes(prog.region_sizes["activation"])}
        self.steps = [(ins, [self.view(b) if b is not None else None for _, b in ins.operands])
                      for ins in prog.instrs if ins.kind not in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW)]
        # Control flow (cond / else / endcond): where a marker jumps when it does not fall
        # through (lir/control.py), in this list's indices.
        self.jumps = jumps([ins for ins, _ in self.steps])

    def view(self, buf) -> np.ndarray:
        return region_view(self.regions, buf)


class LirRunner:
    def __init__(self, prog: Program, registry):
        self.prog, self.registry = prog, registry
        constant = aligned_bytes(prog.region_sizes["constant"])
        for w in prog.constant_weights():
            region_view({"constant": constant}, w)[...] = w.data
        constant.flags.writeable = False
        self.contexts = ContextPool(lambda: _Context(prog, constant))

    def run(self, feeds: dict) -> dict:
        ctx = self.contexts.acquire()
        try:
            return self._run(ctx, feeds)
        finally:
            self.contexts.release(ctx)

    def _run(self, ctx: _Context, feeds: dict) -> dict:
        for name, w in self.prog.inputs.items():
            ctx.view(w)[...] = feeds[name]
        steps, jumps_, pc = ctx.steps, ctx.jumps, 0
        while pc < len(steps):
            ins, views = steps[pc]
            pc += 1
            if ins.kind in Instr.CONTROL:
                # `cond` falls into its then-branch when the condition holds; `else` is
                # reached at the then-branch's end and skips the else-branch.
                if ins.kind == Instr.ELSE or (ins.kind == Instr.COND and not views[0].reshape(-1)[0]):
                    pc = jumps_[pc - 1]
                continue
            if ins.kind == Instr.COPY:
                np.copyto(views[0], views[1])
                continue
            n_out = len(ins.node.outputs)
            args, i = [], n_out
            for info, count in zip(ins.node.INPUTS, ins.groups[n_out:]):
                if info.variadic:
                    args.append(tuple(views[i:i + count]))
                else:
                    args.append(views[i])
                i += count
            try:
                results = run_node(ins.node, args, self.registry)
            except IndexError as e:
                # An index the model computed from its inputs at run time (a constant one is
                # a compile-time error); the cpu backend clamps or skips it instead.
                raise InputError(f"{ins.node.OP} node {ins.node.name!r}: an index known only at run "
                                 f"time is out of range: {e}") from None
            for out, r in zip(views[:n_out], results):
                np.copyto(out, r)
        return {name: ctx.view(w).copy() for name, w in self.prog.outputs.items()}
