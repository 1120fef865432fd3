"""Run a LIR program with NumPy over real byte arenas.

The three regions are byte buffers; every operand is a NumPy view at its planned offset, so
a wrong memory plan gives wrong numbers (and the tests catch it).  The kernels are the
reference semantics of glowgen/reference, the same that fold constants."""
from __future__ import annotations

import numpy as np

from ...errors import InputError
from ...lir.control import jumps
from ...lir.ir import Instr, Program, dynamic_views
from ...reference import run_node
from ..base import ContextPool, aligned_bytes, region_view


class _Context:
    """One call's regions (constants shared), with each instruction's operand views made
    once: the regions never move."""

    def __init__(self, prog: Program, constant: np.ndarray):
        self.regions = {"constant": constant,
                        "mutable": aligned_bytes(prog.region_sizes["mutable"]),
                        "activation": aligned_bytes(prog.region_sizes["activation"])}
        # A loop's slice of a tensor (ir.SliceView) moves with the loop counter: its view is
        # made again each time (a function in the list).
        self.steps = [(ins, [None if b is None else self._place(b) for _, b in ins.operands])
                      for ins in prog.instrs if ins.kind not in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW)]
        # Control flow (ir.Instr.CONTROL): where a marker jumps when it does not fall
        # through (lir/control.py), in this list's indices.
        self.jumps = jumps([ins for ins, _ in self.steps])

    def view(self, buf) -> np.ndarray:
        return region_view(self.regions, buf)

    def _place(self, buf):
        return (lambda: self.view(buf)) if dynamic_views(buf) else self.view(buf)


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
            views = [v() if callable(v) else v for v in views]
            if ins.kind in Instr.CONTROL:
                if not _falls_through(ins.kind, views):
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


def _falls_through(kind: str, views: list) -> bool:
    """Whether control goes on to the next instruction at a control-flow marker (ir.Instr).
    `cond` enters its then-branch when the condition holds; `else`, reached at the end of
    the then-branch, skips the else-branch; `loop` counts from 0 and enters the body, and
    `endloop` counts one more and goes round again, while the count is below the trip
    count (if any) and the condition holds."""
    if kind == Instr.COND:
        return bool(views[0].reshape(-1)[0])
    if kind == Instr.ELSE:
        return False
    if kind in (Instr.LOOP, Instr.ENDLOOP):
        trip, counter, flag = views
        counter[...] = 0 if kind == Instr.LOOP else counter + 1
        going = bool(flag.reshape(-1)[0]) and (trip is None or counter < trip.reshape(-1)[0])
        return going if kind == Instr.LOOP else not going
    return True
