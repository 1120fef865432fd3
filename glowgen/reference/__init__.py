"""The reference semantics of every primitive, in NumPy: what the interpreter backend runs,
what constant folding evaluates, and what the scalar functions mean (glowgen/scalars.py).
Lives outside backends/ so the pipeline depends on no backend."""
from .evaluate import evaluate, implemented_ops, run_node

__all__ = ["evaluate", "implemented_ops", "run_node"]
