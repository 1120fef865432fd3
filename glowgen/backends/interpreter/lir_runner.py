"""Run a LIR program with NumPy over real byte arenas.

The three regions are byte buffers; every operand is a NumPy view at its planned offset, so
a wrong memory plan gives wrong numbers (and the tests catch it).  The kernels are the same
as graph-level evaluation's."""
from __future__ import annotations

import numpy as np

from ...lir.ir import ALIGNMENT, Activation, Instr, Program
from .evaluate import run_node


def aligned_bytes(size: int) -> np.ndarray:
    raw = np.zeros(size + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + size]


class LirRunner:
    def __init__(self, prog: Program, registry):
        self.prog, self.registry = prog, registry
        sizes = prog.region_sizes
        self.regions = {"constant": aligned_bytes(sizes["constant"]),
                        "mutable": aligned_bytes(sizes["mutable"]),
                        "activation": aligned_bytes(sizes["activation"])}
        for w in prog.constant_weights():
            self.view(w)[...] = w.data
        # Each instruction's operand views, made once: the regions never move.
        self.steps = [(ins, [self.view(b) if b is not None else None for _, b in ins.operands])
                      for ins in prog.instrs if ins.kind not in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW)]

    def view(self, buf) -> np.ndarray:
        root = buf.root()
        region = "activation" if isinstance(root, Activation) else root.region
        if buf.nbytes == 0:
            return np.empty(buf.type.shape, buf.type.np_dtype)
        return np.ndarray(buf.type.shape, buf.type.np_dtype, buffer=self.regions[region], offset=root.offset)

    def run(self, feeds: dict) -> dict:
        for name, w in self.prog.inputs.items():
            self.view(w)[...] = feeds[name]
        for ins, views in self.steps:
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
            results = run_node(ins.node, args, self.registry)
            for out, r in zip(views[:n_out], results):
                np.copyto(out, r)
        return {name: self.view(w).copy() for name, w in self.prog.outputs.items()}
