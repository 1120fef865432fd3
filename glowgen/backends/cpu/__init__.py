"""The CPU backend: the LIR program as one LLVM module, compiled for the host in-process
(JIT) or written out as a bundle."""
from __future__ import annotations

import numpy as np

from ...lir.ir import Program
from ..interpreter.lir_runner import aligned_bytes
from .codegen import ModuleBuilder
from .jit import JitFunction


def entry_name(name: str) -> str:
    import re
    safe = re.sub(r"[^A-Za-z0-9_]", "_", name) or "model"
    return safe if not safe[0].isdigit() else "m_" + safe


class CpuRunner:
    """Holds the JIT-compiled entry point and the three regions it runs over."""

    def __init__(self, prog: Program, registry, stacking: bool = True, name: str = "glowgen_main"):
        self.prog = prog
        self.name = entry_name(name)
        self.ir = str(ModuleBuilder(prog, registry, self.name, stacking).build())
        self.jit = JitFunction(self.ir, self.name)
        sizes = prog.region_sizes
        self.regions = {k: aligned_bytes(sizes[k]) for k in ("constant", "mutable", "activation")}
        for w in prog.constant_weights():
            self._view(w)[...] = w.data
        self._ptrs = [self.regions[k].ctypes.data for k in ("constant", "mutable", "activation")]

    def assembly(self) -> str:
        """The optimized module as the host's assembly."""
        return self.jit.assembly()

    def llvm_ir(self, optimized: bool = True) -> str:
        """The module's LLVM IR, after LLVM's optimization pipeline (or as generated)."""
        return str(self.jit.module) if optimized else self.ir

    def _view(self, w) -> np.ndarray:
        region = self.regions[w.region]
        if w.nbytes == 0:
            return np.empty(w.type.shape, w.type.np_dtype)
        return np.ndarray(w.type.shape, w.type.np_dtype, buffer=region, offset=w.offset)

    def run(self, feeds: dict) -> dict:
        # Inputs are copied into the aligned mutable region: generated code never sees a
        # user's (possibly unaligned or strided) array.
        for name, w in self.prog.inputs.items():
            self._view(w)[...] = feeds[name]
        status = self.jit.fn(*self._ptrs)
        if status != 0:
            from ...errors import GlowgenError
            raise GlowgenError(f"the compiled model reported error {status}")
        return {name: self._view(w).copy() for name, w in self.prog.outputs.items()}
