"""Loop nests for the non-elementwise primitives (the `extern` lists of
specs/cpu_kernels.glowdef), specialized at compile time on shapes and attributes, one
module per domain.  Each kernel registers itself for its instruction kinds (base.kernel);
importing this package registers them all.

Each kernel matches the NumPy reference (glowgen/reference); indices read at run time are
never trusted (common.py).
"""
from __future__ import annotations

from .base import (CHANNELS, DESCRIBE, KERNELS, PACKING, PHASES, PRODUCT_SPACE, REPACK, ROWS, SCRATCH, STRATEGY,
                   KernelArgs, hook, kernel)
from . import conv, conv_transpose_gemm, gather_scatter, index, linalg, movement, pool, qlinalg, reduce  # noqa: F401  (registration)

DOMAINS = (movement, index, gather_scatter, reduce, linalg, qlinalg, conv, conv_transpose_gemm, pool)

__all__ = ["CHANNELS", "DESCRIBE", "DOMAINS", "KERNELS", "PACKING", "PHASES", "PRODUCT_SPACE", "REPACK", "ROWS", "SCRATCH",
           "STRATEGY", "KernelArgs", "hook", "kernel"]
