"""The compilation pipeline: import -> lower -> fold constants -> (backend).

Each stage is a function on a `Function`, so `glowgen dump` can stop after any of them.
Constant folding evaluates with the interpreter's kernels: semantics are written once.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .backends.interpreter.evaluate import evaluate, run_node
from .engine.graph import Constant, Function, Node, Placeholder, Value
from .engine.registry import Registry
from .engine.rewrite import RewriteStats, apply_rules
from .errors import UnsupportedError

STAGES = ("loaded", "lowered")


def lower(function: Function, registry: Registry) -> RewriteStats:
    """Rewrite until only primitives remain; name any op that no rule lowers."""
    stats = apply_rules(function, registry, registry.rules_for("lower"))
    function.dead_code_elimination()
    left = sorted({n.OP for n in function.nodes if not n.has_trait("primitive")})
    if left:
        raise UnsupportedError(f"no lowering rule applies to {', '.join(left)} here (see "
                               f"specs/lowerings.glowdef); the nodes are: "
                               + ", ".join(repr(n.name) for n in function.nodes if n.OP in left)[:300])
    return stats


def _foldable(node: Node) -> bool:
    return node.has_trait("shape_only") or all(isinstance(v, Constant) for v in node.flat_inputs())


def _dummy(value: Value) -> np.ndarray:
    """An array of the right type and shape that takes no memory (for shape-only ops)."""
    return np.broadcast_to(np.zeros((), value.type.np_dtype), value.type.shape)


def fold_constants(function: Function, registry: Registry) -> int:
    """Evaluate every node whose operands are all constants and replace it by Constants."""
    folded = 0
    for node in list(function.nodes):
        if not node.has_trait("primitive") or not _foldable(node):
            continue
        if node.has_trait("shape_only"):
            args = [_dummy(v) if not isinstance(v, tuple) else tuple(_dummy(x) for x in v)
                    if v is not None else None for v in node.inputs]
        else:
            args = [v.data if isinstance(v, Constant) else
                    tuple(x.data for x in v) if isinstance(v, tuple) else None for v in node.inputs]
        results = run_node(node, args, registry)
        for out, data in zip(node.outputs, results):
            if function.is_used(out):
                function.replace_all_uses(out, function.add_constant(data, out.name))
        folded += 1
    function.dead_code_elimination()
    return folded


def constant_value(function: Function, value: Value, registry: Registry) -> Optional[np.ndarray]:
    """The value of `value` if it is computable at compile time, else None.

    Copies the subgraph that computes it into a scratch function, lowers it and runs it:
    the same semantics as everything else."""
    if isinstance(value, Constant):
        return value.data
    scratch = Function("fold")
    copies: dict[int, Value] = {}
    feeds: dict[str, np.ndarray] = {}

    def copy(v: Value) -> Optional[Value]:
        if id(v) in copies:
            return copies[id(v)]
        if isinstance(v, Constant):
            nv = scratch.add_constant(v.data, v.name)
        elif isinstance(v, Placeholder):
            return None
        else:
            node = v.node
            if node.has_trait("shape_only"):
                ins = []
                for x in node.inputs:
                    p = scratch.add_placeholder(x.name, x.type)
                    feeds[p.name] = _dummy(x)
                    ins.append(p)
            else:
                ins = []
                for x in node.inputs:
                    if x is None:
                        ins.append(None)
                    elif isinstance(x, tuple):
                        items = tuple(copy(i) for i in x)
                        if any(i is None for i in items):
                            return None
                        ins.append(items)
                    else:
                        c = copy(x)
                        if c is None:
                            return None
                        ins.append(c)
            nn = scratch.add_node(type(node), ins, node.attr_values(), name=node.name)
            for o, no in zip(node.outputs, nn.outputs):
                copies[id(o)] = no
            nv = copies[id(v)]
        copies[id(v)] = nv
        return nv

    root = copy(value)
    if root is None:
        return None
    scratch.add_output("value", root)
    lower(scratch, registry)
    return evaluate(scratch, feeds, registry)["value"]
