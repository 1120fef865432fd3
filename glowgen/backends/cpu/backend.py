"""The cpu backend as the compiler sees it (backends/base.py): native code through LLVM,
JIT-compiled in this process or written out as a bundle."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from ..base import Backend


class CpuBackend(Backend):
    name = "cpu"
    options = {
        "stacking": True,     # stack runs of elementwise instructions into single loops
        "profile": False,     # count cycles per native step (CompiledModel.profile())
    }

    def implemented_ops(self, registry) -> frozenset[str]:
        # specs/cpu_kernels.glowdef: elementwise kernels plus the loop-nest primitives.
        return frozenset(registry.kernels) | frozenset(registry.extern)

    def make_runner(self, prog, registry, options: Mapping[str, Any]):
        from . import CpuRunner
        return CpuRunner(prog, registry, stacking=options["stacking"], name=prog.name,
                         profile=options["profile"])

    def bundle_target(self, triple: Optional[str] = None, cpu: Optional[str] = None,
                      name: Optional[str] = None, source: Optional[Path] = None):
        from .bundle import bundle_target
        return bundle_target(triple, cpu, name, source)

    def write_bundle(self, prog, registry, out_dir, target, options: Mapping[str, Any]):
        from .bundle import write_bundle
        if options.get("profile"):
            from ...errors import GlowgenError
            raise GlowgenError("profile=True counts cycles in the JIT; a bundle cannot carry it")
        return write_bundle(prog, registry, out_dir, target, stacking=options["stacking"])
