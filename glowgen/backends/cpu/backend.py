"""The cpu backend as the compiler sees it (backends/base.py): native code through LLVM,
JIT-compiled in this process or written out as a bundle."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from ...errors import GlowgenError
from ..base import Backend


def machine_cores() -> int:
    """The cores this process may run on (its affinity mask, as onnxruntime counts them)."""
    import os
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def resolve_threads(threads) -> int:
    """`threads=` checked: a positive integer, or None for every core of this machine."""
    if threads is None:
        return machine_cores()
    if not is_positive_int(threads):
        raise GlowgenError(f"threads must be a positive integer (or None for this machine's "
                           f"{machine_cores()} cores), not {threads!r}")
    return threads


class CpuBackend(Backend):
    name = "cpu"
    options = {
        "stacking": True,     # stack runs of elementwise instructions into single loops
        "winograd": True,     # 3x3 convolutions by Winograd's minimal filtering where it pays
                              # (faster; their transformed weights take 16/9 or 4 times the memory)
        "amx": True,          # int8 products on AMX tiles where the CPU has them (amx.py;
                              # False: its AVX-512 VNNI products, to compare)
        "profile": False,     # count cycles per native step (CompiledModel.profile())
        "threads": None,      # threads a call may use (None: this machine's cores)
        "cpu": None,          # the JIT's target: None ($GLOWGEN_CPU, else this machine) or an
                              # x86-64 level such as "x86-64-v3" (target.py)
        "compile_processes": None,  # processes that emit and compile the JIT's code at once
                              # (parallel_compile.py; None: this machine's cores for a large
                              # model; 1: all in this process)
    }

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        options = super().check_options(options)
        options["threads"] = resolve_threads(options["threads"])
        processes = options["compile_processes"]
        if processes is not None and not is_positive_int(processes):
            raise GlowgenError(f"compile_processes must be a positive integer (or None: this "
                               f"machine's {machine_cores()} cores for a large model), not {processes!r}")
        from .target import resolve_cpu
        options["cpu"] = resolve_cpu(options["cpu"]).name
        return options

    def implemented_ops(self, registry) -> frozenset[str]:
        # specs/cpu_kernels.glowdef: elementwise kernels plus the loop-nest primitives that
        # have a kernel here (all of them: base.check_externs, when the backend loads).
        from .kernels import KERNELS
        return frozenset(registry.kernels) | frozenset(op for op in registry.extern if op in KERNELS)

    @staticmethod
    def _features(options: Mapping[str, Any]) -> str:
        """The features of the target of `options` (a bundle's: bundle_options)."""
        from .target import resolve_cpu
        features = options.get("target_features")
        features = resolve_cpu(options["cpu"]).features if features is None else features
        if not options.get("amx", True):
            from .amx import without
            features = without(features)
        return features

    def lir_passes(self, options: Mapping[str, Any]):
        """passes.py: the backend's decisions (strategies, packing, steps, fusion, arena,
        threads, scratch), for the target of `options` (a bundle's: bundle_options)."""
        from .passes import cpu_passes
        return cpu_passes(self._features(options), options["threads"], options["stacking"],
                          options["winograd"])

    def weight_bits(self, options: Mapping[str, Any]) -> int:
        """7 on targets whose int8 product is faster with 7-bit weights (AVX2 and AVX-512BW
        without VNNI: qgemm.fast_weight_bits), 8 otherwise."""
        from .qgemm import fast_weight_bits
        return fast_weight_bits(self._features(options))

    def prepare(self, prog, registry, options: Mapping[str, Any]):
        if prog.plan is not None:
            from ...errors import GlowgenError
            raise GlowgenError("this program has been prepared for the cpu backend already")
        return super().prepare(prog, registry, options)

    def bundle_options(self, options: Mapping[str, Any], target) -> dict[str, Any]:
        # Instruction choices follow the bundle's target, not this machine's.
        return {**options, "target_features": target.features}

    def make_runner(self, prog, registry, options: Mapping[str, Any]):
        from . import CpuRunner
        from .target import resolve_cpu
        return CpuRunner(prog, registry, name=prog.name, profile=options["profile"],
                         cpu=resolve_cpu(options["cpu"]), compile_processes=options["compile_processes"])

    def bundle_target(self, triple: Optional[str] = None, cpu: Optional[str] = None,
                      name: Optional[str] = None, source: Optional[Path] = None):
        from .bundle import bundle_target
        return bundle_target(triple, cpu, name, source)

    def write_bundle(self, prog, registry, out_dir, target, options: Mapping[str, Any]):
        from .bundle import write_bundle
        if options.get("profile"):
            from ...errors import GlowgenError
            raise GlowgenError("profile=True counts cycles in the JIT; a bundle cannot carry it")
        return write_bundle(prog, registry, out_dir, target, options.get("compile_processes"))
