"""The CPU backend: the LIR program as one LLVM module, compiled for the host in-process
(JIT) or written out as a bundle."""
from __future__ import annotations

import ctypes
import sys
from typing import Optional

import numpy as np

from ...lir.ir import Program
from ..base import REGIONS, ContextPool, aligned_bytes, region_view
from .backend import CpuBackend  # noqa: F401  (registered by name in backends/base.py)
from .codegen import ModuleBuilder, io_slots
from .backend import machine_cores
from .jit import JitFunction, object_code
from .parallel_compile import ProcessesBuild, processes_for
from .target import resolve_cpu
from .threads import ThreadPool


def entry_name(name: str) -> str:
    import re
    safe = re.sub(r"[^A-Za-z0-9_]", "_", name) or "model"
    return safe if not safe[0].isdigit() else "m_" + safe


def _data_address(arr: np.ndarray) -> tuple[int, bool]:
    """(address of arr's first element, whether arr is C-contiguous).  Through the buffer
    protocol (ctypes.from_buffer: one C call, which takes only a writable C-contiguous
    buffer) where it can, else through NumPy's ctypes interface, whose Python code costs
    some 20-30 us more a call on Zen 3 after a model's run has evicted the interpreter's
    state from the caches."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr)), True
    except (TypeError, ValueError):        # read-only, not C-contiguous, or empty
        return arr.ctypes.data, arr.flags.c_contiguous


class _Context:
    """What one call writes: its mutable and activation regions (the constant region is
    shared), the pointer table of the `_io` entry, and the output arrays it hands out."""

    def __init__(self, prog: Program, constant: np.ndarray, n_slots: int, pool_args: tuple):
        self.regions = {"constant": constant,
                        "mutable": aligned_bytes(prog.region_sizes["mutable"]),
                        "activation": aligned_bytes(prog.region_sizes["activation"])}
        self.table = (ctypes.c_void_p * n_slots)()
        self.returned: dict[int, tuple] = {}    # output slot -> (array, address) of the last run
        self.args = (*(self.regions[k].ctypes.data for k in REGIONS), self.table, *pool_args)

    def view(self, w) -> np.ndarray:
        return region_view(self.regions, w)

    def output_array(self, k: int, shape, dtype) -> np.ndarray:
        """A fresh array for output slot `k`, or this context's last one if the caller has
        dropped it.

        Large fresh arrays come from mmap and page-fault on every run (about 0.1 ms per
        3 MB); reusing one nobody else references is invisible to the caller."""
        last = self.returned.get(k)
        # References: the tuple in this dict and getrefcount's argument.  A view or
        # anything the caller kept adds one, and then the array is left alone.
        if last is None or sys.getrefcount(last[0]) != 2:
            arr = np.empty(shape, dtype)
            last = self.returned[k] = (arr, arr.ctypes.data)
        self.table[k] = last[1]
        return last[0]


class CpuRunner:
    """The JIT-compiled entry point, the constant weights every call shares, a pool of
    execution contexts (backends/base.ContextPool) for the memory each call writes, and the
    threads (threads.ThreadPool) that split steps run on, for as long as the model lives."""

    def __init__(self, prog: Program, registry, name: str = "glowgen_main", profile: bool = False,
                 cpu=None, compile_processes: Optional[int] = None):
        # `prog` was prepared by the backend's passes (passes.py) for `cpu` and its threads.
        self.prog = prog
        self.name = entry_name(name)
        self.threads = threads = prog.plan.threads
        self.cpu = cpu or resolve_cpu()

        def new_builder():
            return ModuleBuilder(prog, registry, self.name, profile=profile)
        # Large programs are emitted and compiled by several processes (parallel_compile.py).
        self.compile_processes = processes_for(prog.plan.steps, compile_processes, machine_cores())
        build = ProcessesBuild(new_builder, self.compile_processes, lambda text: object_code(text, self.cpu))
        builder, self.ir = build.builder, build.text
        self.step_names = builder.step_names
        self.split_steps = builder.split_steps     # (step, tasks) of the steps run in parallel
        self.step_parts = builder.step_parts        # tasks of each step
        self.jit = JitFunction(self.ir, self.name, io_entry=True, cpu=self.cpu, objects=build.objects())
        # Helpers whose steps this process compiled instead (none, unless something failed).
        self.compile_failures = build.failures
        self._counters = None
        if profile:
            addr = self.jit.engine.get_global_value_address(f"{self.name}_profile")
            self._counters = (ctypes.c_uint64 * max(1, len(self.step_names))).from_address(addr)
            from .codegen import TASK_SLOTS
            addr = self.jit.engine.get_global_value_address(f"{self.name}_task_profile")
            self._task_counters = (ctypes.c_uint64 * (max(1, len(self.step_names)) * TASK_SLOTS)).from_address(addr)
        # The constant weights, shared by every call and only read.
        self.constant = aligned_bytes(prog.region_sizes["constant"])
        for w in prog.constant_weights():
            region_view({"constant": self.constant}, w)[...] = w.data
        self.constant.flags.writeable = False
        # The graph inputs and outputs the `_io` entry takes by pointer (codegen.io_slots),
        # planned once: run() is on the hot path of small models.
        slots = io_slots(prog)
        self._n_slots = max(1, len(slots))
        self._in_slots = [(k, next(n for n, x in prog.inputs.items() if x is w), w.type.np_dtype)
                          for k, w in enumerate(slots) if w.io == "input"]
        # An input and an output may share a name (a graph that returns its input); one
        # output value may have several names (the later ones get copies).
        self._out_slots = [(k, [n for n, x in prog.outputs.items() if x is w], w.type.shape, w.type.np_dtype)
                           for k, w in enumerate(slots) if w.io == "output"]
        in_slot = {id(w) for w in slots}
        self._region_inputs = [(n, w) for n, w in prog.inputs.items() if id(w) not in in_slot]
        self._region_outputs = [(n, w) for n, w in prog.outputs.items() if id(w) not in in_slot]
        # Only a program with split steps needs the workers.
        self.pool = ThreadPool(threads) if threads > 1 and any(p > 1 for p in builder.parts.values()) else None
        self._pool_args = (self.pool.parallel_for, self.pool.pointer) if self.pool else (None, None)
        self.contexts = ContextPool(self._new_context)

    def _new_context(self) -> "_Context":
        return _Context(self.prog, self.constant, self._n_slots, self._pool_args)

    def run(self, feeds: dict) -> dict:
        """Run on checked feeds (api.CompiledModel.check_feeds): right shapes and dtypes.

        Each call runs in an execution context of its own (its mutable and activation
        regions, its pointer table, its output arrays), so calls from several threads at once
        share nothing they write.  Inputs the program only reads are passed by pointer when
        they are C-contiguous and aligned to their element size (what the generated loads
        assume); any other array is copied to one that is.  Outputs are written straight
        into fresh arrays."""
        ctx = self.contexts.acquire()
        try:
            return self._run(ctx, feeds)
        finally:
            self.contexts.release(ctx)

    def _run(self, ctx: "_Context", feeds: dict) -> dict:
        keep = []                       # arrays whose addresses are in the table
        for k, name, dtype in self._in_slots:
            arr = feeds[name]
            address, contiguous = _data_address(arr)
            if not (contiguous and arr.dtype == dtype and address % arr.itemsize == 0):
                arr = np.array(arr, dtype=dtype, order="C")       # a fresh, aligned copy
                address = arr.ctypes.data
            keep.append(arr)
            ctx.table[k] = address
        outputs = {}
        for k, names, shape, dtype in self._out_slots:
            arr = ctx.output_array(k, shape, dtype)
            for i, name in enumerate(names):
                outputs[name] = arr if i == 0 else None
        for name, w in self._region_inputs:
            ctx.view(w)[...] = feeds[name]
        status = self.jit.fn_io(*ctx.args)
        if status != 0:
            from ...errors import GlowgenError
            raise GlowgenError(f"the compiled model reported error {status}")
        for k, names, _, _ in self._out_slots:
            for name in names[1:]:
                outputs[name] = outputs[names[0]].copy()
        for name, w in self._region_outputs:
            outputs[name] = ctx.view(w).copy()
        return outputs

    def profile(self, reset: bool = False) -> list[tuple[str, int]]:
        """(step, cycles) for every step: its fewest cycles in one run over the runs so far
        (compiled with profile=True: the entry reads the cycle counter around each step);
        0 before any run."""
        if self._counters is None:
            from ...errors import GlowgenError
            raise GlowgenError("this model was compiled without profile=True")
        never = 2 ** 64 - 1
        rows = [(name, 0 if self._counters[i] == never else int(self._counters[i]))
                for i, name in enumerate(self.step_names)]
        if reset:
            for i in range(len(self.step_names)):
                self._counters[i] = never
        return rows

    def task_profile(self, reset: bool = False) -> list[list[int]]:
        """Per step, each of its tasks' fewest cycles over the runs so far (compiled with
        profile=True; [] for a step that is not split, 0 for a task not run yet)."""
        from .codegen import TASK_SLOTS
        if self._counters is None:
            from ...errors import GlowgenError
            raise GlowgenError("this model was compiled without profile=True")
        never = 2 ** 64 - 1
        rows = []
        for i, parts in enumerate(self.step_parts):
            slots = [self._task_counters[i * TASK_SLOTS + p] for p in range(min(parts, TASK_SLOTS))]
            rows.append([0 if c == never else int(c) for c in slots] if parts > 1 else [])
        if reset:
            for i in range(len(self.step_names) * TASK_SLOTS):
                self._task_counters[i] = never
        return rows

    def _whole_module(self) -> None:
        if self.compile_processes > 1:
            from ...errors import GlowgenError
            raise GlowgenError(f"this model was compiled by {self.compile_processes} processes, each "
                               f"with a part of its LLVM module; compile it with "
                               f"compile_processes=1 to see all of it")

    def assembly(self) -> str:
        """The optimized module as the host's assembly."""
        self._whole_module()
        return self.jit.assembly()

    def llvm_ir(self, optimized: bool = True) -> str:
        """The module's LLVM IR, after LLVM's optimization pipeline (or as generated)."""
        self._whole_module()
        return str(self.jit.module) if optimized else self.ir
