"""Graph-level evaluation of primitives with NumPy: the reference semantics, also used by
constant folding."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..engine.graph import Constant, Function, Node
from ..errors import UnsupportedError
from .elementwise import ElementwiseKernels
from .primitives import PRIMITIVES


@lru_cache(maxsize=8)
def _elementwise(registry) -> ElementwiseKernels:
    return ElementwiseKernels(registry)


def implemented_ops(registry) -> set[str]:
    return set(PRIMITIVES) | set(registry.kernels)


def run_node(node: Node, args: list, registry) -> list[np.ndarray]:
    """Evaluate one primitive node on NumPy arrays (one per operand; tuples for variadic
    operands, None for absent optional ones)."""
    ew = _elementwise(registry)
    out_types = [o.type for o in node.outputs]
    if node.OP in ew:
        results = [ew.run(node.OP, args, node.attr_values(), out_types[0].np_dtype)]
    elif node.OP in PRIMITIVES:
        with np.errstate(all="ignore"):
            r = PRIMITIVES[node.OP](node, *args)
        results = list(r) if isinstance(r, tuple) else [r]
    else:
        raise UnsupportedError(f"the interpreter has no kernel for {node.OP} (node {node.name!r}); "
                               f"it should have been lowered")
    out = []
    for r, ty in zip(results, out_types):
        r = np.asarray(r).astype(ty.np_dtype, copy=False)
        if r.shape != ty.shape:
            raise AssertionError(f"{node.OP} {node.name!r}: kernel produced shape {r.shape}, "
                                 f"declared {ty.shape}")
        out.append(r)
    return out


def evaluate(function: Function, feeds: dict, registry) -> dict[str, np.ndarray]:
    """Run every node of a lowered function; `feeds` maps placeholder names to arrays."""

    def run(sub: Function, arrays: list) -> list:
        got = evaluate(sub, {p.name: a for p, a in zip(sub.placeholders, arrays)}, registry)
        return [got[name] for name, _ in sub.outputs]

    env: dict[int, np.ndarray] = {}
    for p in function.placeholders:
        env[id(p)] = feeds[p.name]
    for c in function.constants:
        env[id(c)] = c.data

    def arg(v):
        if v is None:
            return None
        if isinstance(v, tuple):
            return tuple(env[id(x)] for x in v)
        if isinstance(v, Constant):
            return v.data
        return env[id(v)]

    for node in function.nodes:
        if node.subfunctions():          # control flow (engine/control.py)
            results = node.evaluate([arg(v) for v in node.inputs], run)
        else:
            results = run_node(node, [arg(v) for v in node.inputs], registry)
        for o, r in zip(node.outputs, results):
            env[id(o)] = r
    return {name: arg(v) for name, v in function.outputs}
