"""The CPU backend: the LIR program as one LLVM module, compiled for the host in-process
(JIT) or written out as a bundle."""
from __future__ import annotations

import ctypes
import sys

import numpy as np

from ...lir.ir import Program
from ..interpreter.lir_runner import aligned_bytes
from .codegen import ModuleBuilder, io_slots
from .jit import JitFunction


def entry_name(name: str) -> str:
    import re
    safe = re.sub(r"[^A-Za-z0-9_]", "_", name) or "model"
    return safe if not safe[0].isdigit() else "m_" + safe


class CpuRunner:
    """Holds the JIT-compiled entry point and the three regions it runs over."""

    def __init__(self, prog: Program, registry, stacking: bool = True, name: str = "glowgen_main",
                 profile: bool = False):
        self.prog = prog
        self.name = entry_name(name)
        builder = ModuleBuilder(prog, registry, self.name, stacking, io_entry=True, profile=profile)
        self.ir = str(builder.build())
        self.step_names = builder.step_names
        self.jit = JitFunction(self.ir, self.name, io_entry=True)
        self._counters = None
        if profile:
            addr = self.jit.engine.get_global_value_address(f"{self.name}_profile")
            self._counters = (ctypes.c_uint64 * max(1, len(self.step_names))).from_address(addr)
        sizes = prog.region_sizes
        self.regions = {k: aligned_bytes(sizes[k]) for k in ("constant", "mutable", "activation")}
        for w in prog.constant_weights():
            self._view(w)[...] = w.data
        self._ptrs = [self.regions[k].ctypes.data for k in ("constant", "mutable", "activation")]
        # The graph inputs and outputs the `_io` entry takes by pointer (codegen.io_slots).
        self._slots = io_slots(prog)
        # An input and an output may share a name (a graph that returns its input).
        self._slot_names = {id(w): [n for n, x in (prog.inputs if w.io == "input" else prog.outputs).items()
                                    if x is w] for w in self._slots}
        self._table = (ctypes.c_void_p * max(1, len(self._slots)))()
        self._returned: dict[int, np.ndarray] = {}      # slot -> output array of the last run

    def _output_array(self, k: int, w) -> np.ndarray:
        """A fresh array for output slot `k`, or last run's if the caller has dropped it.

        Large fresh arrays come from mmap and page-fault on every run (about 0.1 ms per
        3 MB); reusing one nobody else references is invisible to the caller."""
        last = self._returned.get(k)
        # References: this dict, `last`, getrefcount's argument.  A view or anything the
        # caller kept adds one, and then the array is left alone.
        if last is not None and sys.getrefcount(last) == 3:
            return last
        arr = np.empty(w.type.shape, w.type.np_dtype)
        self._returned[k] = arr
        return arr

    def profile(self, reset: bool = False) -> list[tuple[str, int]]:
        """(step, cycles) for every step, summed over the runs so far (compiled with
        profile=True: the entry reads the cycle counter around each step)."""
        if self._counters is None:
            from ...errors import GlowgenError
            raise GlowgenError("this model was compiled without profile=True")
        rows = [(name, int(self._counters[i])) for i, name in enumerate(self.step_names)]
        if reset:
            ctypes.memset(self._counters, 0, ctypes.sizeof(self._counters))
        return rows

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
        """Run on checked feeds (api.CompiledModel.check_feeds): right shapes and dtypes.

        Inputs the program only reads are passed by pointer when they are C-contiguous and
        aligned to their element size (what the generated loads assume); any other array is
        copied to one that is.  Outputs are written straight into fresh arrays."""
        keep, outputs = [], {}
        for k, w in enumerate(self._slots):
            if w.io == "input":
                arr = feeds[self._slot_names[id(w)][0]]
                if not (arr.flags.c_contiguous and arr.dtype == w.type.np_dtype
                        and arr.ctypes.data % max(1, arr.itemsize) == 0):
                    arr = np.array(arr, dtype=w.type.np_dtype, order="C")     # a fresh, aligned copy
            else:
                arr = self._output_array(k, w)
                for name in self._slot_names[id(w)]:
                    outputs[name] = arr       # a second name gets its own copy, below
            keep.append(arr)
            self._table[k] = arr.ctypes.data
        for name, w in self.prog.inputs.items():
            if all(w is not x for x in self._slots):
                self._view(w)[...] = feeds[name]
        status = self.jit.fn_io(*self._ptrs, self._table)
        if status != 0:
            from ...errors import GlowgenError
            raise GlowgenError(f"the compiled model reported error {status}")
        seen = set()
        for name, w in self.prog.outputs.items():
            if name not in outputs:
                outputs[name] = self._view(w).copy()
            elif id(outputs[name]) in seen:           # one value under two output names
                outputs[name] = outputs[name].copy()
            seen.add(id(outputs[name]))
        return outputs
