"""The interpreter backend: the LIR run with NumPy, the reference semantics of every op."""
from __future__ import annotations

from ...reference import implemented_ops
from ..base import Backend
from .lir_runner import LirRunner


class InterpreterBackend(Backend):
    name = "interpreter"

    def implemented_ops(self, registry) -> frozenset[str]:
        return frozenset(implemented_ops(registry))

    def make_runner(self, prog, registry, options) -> LirRunner:
        return LirRunner(prog, registry)

    def device_threads(self) -> int:
        return 1
