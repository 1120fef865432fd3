"""Which CPU the JIT compiles for: this machine's, or a named x86-64 level below it.

`glowgen.compile(model, cpu="x86-64-v3")` (or GLOWGEN_CPU=x86-64-v3, or `--cpu` on `run` and
`bench`) makes the code this machine would run on an AVX2 + FMA CPU without AVX-512: vector
widths, GEMM tiles and instruction choices all follow the named level's features, so the AVX2
path can be tested and measured on an AVX-512 host.  The level must be one this machine can
run.  (Bundles take any CPU LLVM knows: `glowgen compile --cpu`, bundle.py.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from ...errors import GlowgenError

# The x86-64 micro-architecture levels (the psABI's), as LLVM feature flags.
_V1 = ["sse", "sse2", "cx8", "cmov", "fxsr", "mmx"]
_V2 = _V1 + ["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf"]
_V3 = _V2 + ["avx", "avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt", "movbe", "xsave"]
_V4 = _V3 + ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]
LEVELS = {"x86-64": _V1, "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
# Everything a lower level must switch off, so LLVM does not infer it from the host.
_WIDE = ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512vnni", "avx512bf16",
         "avx512fp16", "avx512vbmi", "avx512vbmi2", "avx512ifma", "avx512bitalg",
         "avx512vpopcntdq", "avxvnni", "amx-tile", "amx-int8", "amx-bf16"]

ENV = "GLOWGEN_CPU"


@dataclass(frozen=True)
class CpuTarget:
    name: str           # what LLVM calls the CPU ("znver4", "x86-64-v3", ...)
    features: str       # "+avx2,+fma,-avx512f,...": what instruction choices may assume
    host: bool          # this machine's own CPU


@lru_cache(maxsize=None)
def _host() -> CpuTarget:
    from .jit import host_target
    _, cpu, features = host_target()
    return CpuTarget(cpu, features, True)


def resolve_cpu(name: Optional[str] = None) -> CpuTarget:
    """The target for `cpu=name` (None: $GLOWGEN_CPU, else this machine), checked."""
    source = f"cpu={name!r}"
    if name is None and os.environ.get(ENV):
        name, source = os.environ[ENV], f"{ENV}={os.environ[ENV]!r}"
    host = _host()
    if name is None or name in ("host", "native", host.name):
        return host
    if not isinstance(name, str) or name not in LEVELS:
        raise GlowgenError(f"{source}: the JIT compiles for this machine ({host.name}) or for "
                           f"an x86-64 level it can run: {', '.join(LEVELS)} (e.g. x86-64-v3 "
                           f"for AVX2 + FMA without AVX-512); bundles take any CPU: "
                           f"glowgen compile --cpu")
    on = LEVELS[name]
    have = {f[1:] for f in host.features.split(",") if f.startswith("+")}
    missing = [f for f in on if f not in have and f not in ("mmx", "cx8", "cmov", "fxsr")]
    if missing:
        raise GlowgenError(f"{source} needs {', '.join(missing)}, which this machine "
                           f"({host.name}) lacks: its code could not run here")
    return CpuTarget(name, level_features(name), False)


def level_features(name: str) -> str:
    """An x86-64 level's features, with the wider extensions it lacks switched off."""
    on = LEVELS[name]
    off = [f for f in _WIDE if f not in on]
    return ",".join([f"+{f}" for f in on] + [f"-{f}" for f in off])
