"""Generic graph passes, and the runner of a pass pipeline described as data.

The passes know no op by name: dead-code elimination, common-subexpression elimination
(operands of `commutative` ops in either order), and constant folding of any node whose
operands are all constants (the evaluation itself is a callback, so the reference
semantics stay in one place: the backend that owns them).

A pipeline is a tuple of `Phase`s; a phase is a list of steps (`Rules` of a spec phase, or a
`Pass` by name) run once or repeated until none of them changes the graph.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Optional

import attrs
import numpy as np

from ..errors import RewriteError, UnsupportedError
from .control import subfunctions
from .graph import Constant, Function, Node
from .registry import Registry
from .rewrite import RewriteContext, apply_rules

# Constant folding materializes a result only if it has at most this many elements, or no
# more than the largest constant it reads: a scalar broadcast to a huge shape stays symbolic,
# while scaled weights (a result as large as the weights) fold.
FOLD_ELEMENTS_CAP = 1 << 16

# Constants up to this size are merged by CSE when their data is equal (rules create many
# small scalars); hashing larger weights on every iteration would cost more than it saves.
CSE_CONSTANT_ELEMENTS = 4096

# A phase run "to a fixpoint" that still changes the graph after this many rounds has
# rules and passes that undo each other.
MAX_ROUNDS = 50

# evaluate(node, operand arrays) -> result arrays, or None when it cannot.
Evaluator = Callable[[Node, list], Optional[list]]


# ----------------------------------------------------------------------------- pipeline data
@attrs.frozen
class Rules:
    """Step: apply the rules of spec phase `phase` to a fixpoint.  With `skip_native`, rules
    whose root op the backend implements are left out (backend-aware lowering)."""
    phase: str
    skip_native: bool = False

    def describe(self) -> str:
        return f"rules [{self.phase}]" + (" (except ops the backend implements)" if self.skip_native else "")


@attrs.frozen
class Pass:
    """Step: run the generic pass `name` (a key of PASSES)."""
    name: str

    def describe(self) -> str:
        return PASSES[self.name][1]


@attrs.frozen
class Phase:
    name: str
    steps: tuple
    fixpoint: bool = False

    def describe(self) -> str:
        how = "to a fixpoint" if self.fixpoint else "once"
        return f"{self.name} ({how}): " + ", ".join(s.describe() for s in self.steps)


def describe_pipeline(phases) -> str:
    return "\n".join(f"{i + 1}. {p.describe()}" for i, p in enumerate(phases)) + "\n"


@attrs.define
class PassContext:
    """What the steps need: the registry, the backend's ops (None: every op), the evaluator
    for constant folding, and the statistics they record."""
    registry: Registry
    backend_ops: Optional[frozenset] = None
    evaluate: Optional[Evaluator] = None
    fold_cap: int = FOLD_ELEMENTS_CAP
    backend: str = ""                                      # for messages: "the cpu backend"
    max_memory: Optional[object] = None                    # memory_limit.MemoryLimit: folds fit it
    fired: Counter = attrs.field(factory=Counter)          # rule name -> times fired
    passes: Counter = attrs.field(factory=Counter)         # pass name -> changes made
    log: list = attrs.field(factory=list)                  # (phase, rounds, nodes before, after)

    def rewrite_context(self) -> RewriteContext:
        return RewriteContext(set(self.backend_ops) if self.backend_ops is not None else None)


def run_pipeline(function: Function, phases, ctx: PassContext, _sub: bool = False) -> Function:
    """Run `phases` over `function` in place; the graph is verified after every phase.
    Each phase runs over the sub-functions of its nodes (a conditional's branches, a loop's
    body) first, so the whole program is at the same stage at every phase's end."""
    for phase in phases:
        for sub in subfunctions(function):
            run_pipeline(sub, (phase,), ctx, _sub=True)
        before = len(function.nodes)
        rounds = 0
        while True:
            rounds += 1
            changed = sum(_run_step(function, step, ctx) for step in phase.steps)
            if not phase.fixpoint or not changed:
                break
            if rounds >= MAX_ROUNDS:
                raise RewriteError(f"phase {phase.name} still changes the graph after {rounds} "
                                   f"rounds; its rules and passes undo each other (rules fired: "
                                   + ", ".join(f"{n} ({c}x)" for n, c in ctx.fired.most_common(5)) + ")")
        function.verify()
        ctx.log.append((f"{phase.name} [{function.name}]" if _sub else phase.name, rounds,
                        before, len(function.nodes)))
    return function


def _run_step(function: Function, step, ctx: PassContext) -> int:
    if isinstance(step, Rules):
        rules = ctx.registry.rules_for(step.phase)
        if step.skip_native and ctx.backend_ops is not None:
            rules = [_without_native(r, ctx.backend_ops) for r in rules
                     if not all(op in ctx.backend_ops for op in r.pattern.root_ops)]
        stats = apply_rules(function, ctx.registry, rules, ctx.rewrite_context())
        ctx.fired.update(stats.fired)
        return sum(stats.fired.values())
    changes = PASSES[step.name][0](function, ctx)
    ctx.passes[step.name] += changes
    return changes


def _without_native(rule, native: set):
    """`rule`, its root no longer matching the ops the backend implements (for a family)."""
    if not rule.pattern.ops or not any(op in native for op in rule.pattern.ops):
        return rule
    kept = tuple(op for op in rule.pattern.ops if op not in native)
    return attrs.evolve(rule, pattern=attrs.evolve(rule.pattern, ops=kept))


# ----------------------------------------------------------------------------- passes
def dead_code_elimination(function: Function, ctx: PassContext) -> int:
    """Remove nodes whose results nothing reads, and unused constants."""
    return function.dead_code_elimination()


def _hashable(value):
    if isinstance(value, float):
        return ("float", repr(value))            # 0.0 and -0.0 differ, nan equals nan
    if isinstance(value, (tuple, list)):
        return tuple(_hashable(v) for v in value)
    return value


def _node_key(node: Node):
    operands = []
    for v in node.inputs:
        if v is None:
            operands.append(None)
        elif isinstance(v, tuple):
            operands.append(tuple(id(x) for x in v))
        else:
            operands.append(id(v))
    if node.has_trait("commutative") and len(operands) == 2:
        operands.sort(key=repr)
    attrs_ = tuple((k, _hashable(v)) for k, v in node.attr_values().items())
    # Nodes owning sub-functions are equal only if they own the same ones (never, in effect).
    return (node.OP, attrs_, tuple(operands), tuple(id(f) for f in node.subfunctions()))


def _merge_into(function: Function, keep, drop) -> None:
    """Redirect the users of `drop` (a node or a constant) to `keep`."""
    if isinstance(drop, Node):
        for a, b in zip(drop.outputs, keep.outputs):
            function.replace_all_uses(a, b)
        keep.origin = tuple(dict.fromkeys(keep.origin + drop.origin))
        function.remove_node(drop)
    else:
        function.replace_all_uses(drop, keep)


def common_subexpression_elimination(function: Function, ctx: PassContext) -> int:
    """Merge nodes that compute the same op, with the same attributes, on the same operands
    (in either order for `commutative` ops), and small constants with equal data."""
    merged = 0
    seen_constants: dict = {}
    for c in list(function.constants):
        if c.data.size > CSE_CONSTANT_ELEMENTS or not function.is_used(c):
            continue
        key = (c.data.dtype.str, c.data.shape, c.data.tobytes())
        if key in seen_constants:
            _merge_into(function, seen_constants[key], c)
            merged += 1
        else:
            seen_constants[key] = c
    seen: dict = {}
    for node in list(function.nodes):       # in order: operands are merged before their users
        key = _node_key(node)
        if key in seen:
            _merge_into(function, seen[key], node)
            merged += 1
        else:
            seen[key] = node
    if merged:
        function.dead_code_elimination()
    return merged


def _operand_arrays(node: Node) -> Optional[list]:
    """The operands' data if every operand is a constant (shape-only ops: stand-ins that
    take no memory), else None."""
    shape_only = node.has_trait("shape_only")

    def data(v):
        if isinstance(v, Constant):
            return v.data
        if shape_only:
            return np.broadcast_to(np.zeros((), v.type.np_dtype), v.type.shape)
        return None

    return node.map_operands(data)


def _within_cap(node: Node, ctx: PassContext) -> bool:
    """Fold unless that would materialize a constant much larger than the node's inputs that
    only elementwise users read (they could take it broadcast instead).  A result some other
    kind of op reads (convolution weights made by a fill, say) is needed in memory anyway,
    and computing it once beats computing it at every inference."""
    largest_input = max((v.data.size for v in node.flat_inputs() if isinstance(v, Constant)), default=0)
    limit = max(ctx.fold_cap, largest_input)
    if all(math.prod(o.type.shape) <= limit for o in node.outputs):
        return True
    return any(not user.has_trait("elementwise") for o in node.outputs for user, _ in o.users)


def _check_fold_fits(function: Function, node: Node, ctx: PassContext) -> None:
    """Each result of folding `node`, and the constants with them, must fit the memory limit
    (checked before the evaluator allocates anything)."""
    if ctx.max_memory is None:
        return
    results = sum(o.type.nbytes for o in node.outputs)
    for o in node.outputs:
        ctx.max_memory.check(f"folding {node.OP} node {node.name!r} into a constant: its result "
                             f"{o.name!r} ({o.type})", o.type.nbytes)
    held = sum(c.data.nbytes for c in function.constants)
    ctx.max_memory.check(f"folding {node.OP} node {node.name!r} into a constant: the constants "
                         f"with its results", held + results)


def constant_folding(function: Function, ctx: PassContext) -> int:
    """Replace every node whose operands are all constants by the constants it computes."""
    if ctx.evaluate is None:
        return 0
    folded = 0
    for node in list(function.nodes):       # in order, so chains of constants fold in one sweep
        if node.subfunctions():             # control flow: the importer resolved known conditions
            continue
        if not any(function.is_used(o) for o in node.outputs) or not _within_cap(node, ctx):
            continue
        args = _operand_arrays(node)
        if args is None:
            continue
        _check_fold_fits(function, node, ctx)
        results = ctx.evaluate(node, args)
        if results is None:
            continue
        used = [(out, data) for out, data in zip(node.outputs, results) if function.is_used(out)]
        function.remove_node(node)
        for out, data in used:              # the constant takes over the result's name
            function.forget_name(out.name)
            function.replace_all_uses(out, function.add_constant(data, out.name))
        folded += 1
    if folded:
        function.dead_code_elimination()
    return folded


def check_backend_coverage(function: Function, ctx: PassContext) -> int:
    """Fail, naming the ops, if the graph holds an op the backend does not implement."""
    if ctx.backend_ops is None:
        return 0
    # A node owning sub-functions is control flow, which every backend runs; its
    # sub-functions are checked on their own (run_pipeline recurses into them).
    missing = sorted({n.OP for n in function.nodes
                      if n.OP not in ctx.backend_ops and not n.subfunctions()})
    if missing:
        nodes = ", ".join(repr(n.name) for n in function.nodes if n.OP in missing)
        raise UnsupportedError(f"no lowering rule applies to {', '.join(missing)} here and the "
                               f"{ctx.backend + ' ' if ctx.backend else ''}backend "
                               f"does not implement {'it' if len(missing) == 1 else 'them'} (see "
                               f"specs/lowerings.glowdef); the nodes are: {nodes[:300]}")
    return 0


PASSES = {
    "dce": (dead_code_elimination, "dead-code elimination"),
    "cse": (common_subexpression_elimination, "common-subexpression elimination"),
    "fold": (constant_folding, "constant folding"),
    "check": (check_backend_coverage, "check that the backend implements every op"),
}
