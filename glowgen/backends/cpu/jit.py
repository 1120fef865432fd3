"""Compile an LLVM module for a target: optimize, JIT it in-process, or emit an object file."""
from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Optional

import llvmlite.binding as llvm

from ...errors import GlowgenError
from . import amx


@lru_cache(maxsize=1)
def _init():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    try:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
    except Exception:      # noqa: BLE001 - some builds only have the native target
        pass
    return True


@lru_cache(maxsize=None)
def host_target() -> tuple[str, str, str]:
    """(triple, CPU, LLVM features) of this machine, less AMX's tiles where Linux does not
    grant this process their state (amx.permitted: using them would fault)."""
    _init()
    features = llvm.get_host_cpu_features().flatten()
    if "+amx-tile" in features.split(",") and not amx.permitted():
        features = amx.without(features)
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), features


def target_machine(triple: Optional[str] = None, cpu: Optional[str] = None, features: Optional[str] = None,
                   reloc: str = "default", codemodel: str = "jitdefault"):
    _init()
    host_triple, host_cpu, host_features = host_target()
    triple = triple or host_triple
    if cpu is None:
        cpu = host_cpu if triple == host_triple else ""
        features = host_features if triple == host_triple and features is None else (features or "")
    if "+avx512f" in (features or "").split(","):
        # Intel's AVX-512 CPUs (Skylake-SP to Emerald Rapids) tune LLVM to split 512-bit
        # vectors into 256-bit halves (prefer-256-bit), for the clock AVX-512 costs in
        # auto-vectorized loops; the kernels here chose their 16-lane vectors on purpose
        # (on an Emerald Rapids core: 167 f32 GFLOPS of zmm FMAs against 96 of ymm).
        features += ",-prefer-256-bit"
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError as e:
        raise GlowgenError(f"unknown target triple {triple!r}: {e}") from None
    return target.create_target_machine(cpu=cpu, features=features or "", opt=3, reloc=reloc,
                                        codemodel=codemodel)


def optimize(ir, tm) -> "llvm.ModuleRef":
    """The module (LLVM text, or a parsed module, optimized in place) through LLVM's -O3."""
    mod = llvm.parse_assembly(ir) if isinstance(ir, str) else ir
    mod.verify()
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def jit_target_machine(cpu=None):
    """The JIT's target machine for `cpu`, a target.CpuTarget (None: this machine's CPU and
    features)."""
    return target_machine() if cpu is None or cpu.host else target_machine(None, cpu.name, cpu.features)


def object_code(ir_text: str, cpu=None) -> bytes:
    """The module `ir_text` optimized and compiled for the JIT's target machine for `cpu`,
    as object code that a JitFunction links (parallel_compile.py)."""
    tm = jit_target_machine(cpu)
    return tm.emit_object(optimize(ir_text, tm))


class JitFunction:
    """An optimized module loaded into this process, with `objects` (object code for the
    same target machine, the functions it declares: parallel_compile.py) linked to it;
    `fn(constant, mutable, activations)`.  `objects` is iterated once the module is
    optimized: a parallel compile's helpers finish meanwhile."""

    def __init__(self, ir_text: str, name: str, io_entry: bool = False, cpu=None, objects=()):
        self.tm = jit_target_machine(cpu)
        self.module = optimize(ir_text, self.tm)
        self.engine = llvm.create_mcjit_compiler(self.module, self.tm)
        for obj in objects:
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self.engine.finalize_object()
        addr = self.engine.get_function_address(name)
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        self.fn = proto(addr)
        if io_entry:        # NAME_io(constant, mutable, activations, io table, parallel_for, pool)
            proto_io = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 6)
            self.fn_io = proto_io(self.engine.get_function_address(name + "_io"))

    def assembly(self) -> str:
        return self.tm.emit_assembly(self.module)
