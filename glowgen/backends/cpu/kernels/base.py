"""What every kernel shares: the registry of kernels by instruction kind, the registry of
their scratch needs, and `KernelArgs`, what an emitter is handed."""
from __future__ import annotations

from functools import partial
from typing import Callable

from llvmlite import ir

from ..parallel import WHOLE

KERNELS: dict[str, Callable] = {}


def kernel(*kinds, **params):
    """Register the decorated emitter for the instruction `kinds`; `params` are passed to
    it as keywords (one function for several kinds, told apart by what is registered, not
    by reading the op's name back: `@kernel("ArgMax", largest=True)`)."""
    def register(fn):
        for kind in kinds:
            if kind in KERNELS:
                raise ValueError(f"two cpu kernels registered for {kind}")
            KERNELS[kind] = partial(fn, **params) if params else fn
        return fn
    return register


# Kinds whose kernel needs scratch memory: kind -> (node, gemm shape) -> bytes.  The module
# holds one scratch buffer as large as the largest need (kernels run one after another).
SCRATCH: dict[str, Callable] = {}


class KernelArgs:
    def __init__(self, b: ir.IRBuilder, node, outs: list, ins: list, scalars: dict,
                 gemm_shape=None, scratch=None):
        self.b, self.node, self.outs, self.ins, self.scalars = b, node, outs, ins, scalars
        self.gemm_shape = gemm_shape      # register tile for the host (see gemm.py)
        self.scratch = scratch            # float* to the module's scratch buffer
        self.epilogue = None              # elementwise run fused into the store (epilogue.py)
        self.packed = None                # "a" / "b": a constant operand repacked (packing.py)
        self.packed_nr = None             # the width of B's packed panels
        self.split = WHOLE                # the share of the work this function does (parallel.py)

    @property
    def attrs(self):
        return self.node.attr_values()
