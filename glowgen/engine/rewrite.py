"""The rewrite driver: apply generated rules to a fixpoint with a worklist.

Deterministic: nodes are visited in graph order, then new nodes and the users of replaced
values; at each node, larger patterns are tried first, ties in file order.  A bound on the
number of rewrites turns a cycle into an error that names the rules involved.
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Iterable, Optional

import numpy as np

from ..errors import GlowgenError, RewriteError
from .graph import Function, Node, Output, Value
from .patterns import MATCHED, RuleInfo, match
from .registry import Registry


class RewriteContext:
    """What guards may ask about the compilation: `when backend_has(Op)` (ops the backend
    implements; None means every op) and `where uses(x) == 1` (users of a value)."""

    def __init__(self, backend_ops: Optional[set] = None):
        self.backend_ops = backend_ops
        self.function: Optional[Function] = None     # set by apply_rules

    def backend_has(self, *ops: str) -> bool:
        return self.backend_ops is None or all(o in self.backend_ops for o in ops)

    def uses(self, value) -> int:
        """How many operand slots and graph outputs read `value` (a node: its first result)."""
        if isinstance(value, Node):
            value = value.outputs[0]
        outputs = sum(1 for _, v in self.function.outputs if v is value) if self.function else 0
        return len(value.users) + outputs


def _union(groups) -> tuple:
    """Concatenate tuples, keeping the first occurrence of each entry."""
    return tuple(dict.fromkeys(x for g in groups for x in g))


class Builder:
    """Creates the nodes of a rule's right-hand side.  They take the root's name, and the
    ONNX origins and rule history of every node the match covered (a normalization folded
    into the convolution before it remembers both)."""

    def __init__(self, function: Function, registry: Registry, root: Node, rule: RuleInfo,
                 matched: tuple = ()):
        self.function, self.registry, self.root, self.rule = function, registry, root, rule
        matched = tuple(reversed(matched)) or (root,)     # operands before users: model order
        self.origin = _union(n.origin for n in matched)
        self.rules = _union([n.rules for n in matched] + [(rule.name,)])
        self.created: list[Node] = []

    def op(self, name: str, operands: list, attrs: dict) -> Value:
        cls = self.registry.op(name)
        operands = [as_value(v) if not isinstance(v, tuple) else tuple(as_value(x) for x in v)
                    for v in operands]
        try:
            node = self.function.add_node(cls, operands, attrs, name=self.root.name,
                                          origin=self.origin, rules=self.rules)
        except GlowgenError as e:
            raise RewriteError(f"rule {self.rule.name} ({self.rule.location}) built an invalid "
                               f"{name} while rewriting {self.root.OP} node {self.root.name!r}: {e}") from None
        self.created.append(node)
        return node.outputs[0]

    def like(self, node: Node, operands: list, attrs: dict) -> Value:
        """An op of `node`'s kind on `operands`, with `node`'s attributes updated by `attrs`
        (a rule's `u(x)` for a node `u` its pattern matched)."""
        return self.op(node.OP, operands, {**node.attr_values(), **attrs})

    def each_like(self, node: Node, values) -> list:
        """`node`'s op, with its attributes, on each of `values` alone (a rule's
        each_like(u, xs): a unary op distributed over a variadic operand list)."""
        return [self.like(node, [v], {}) for v in values]

    def scalar(self, value, dtype: str) -> Value:
        from .types import numpy_dtype
        return self.function.add_constant(np.array(value, dtype=numpy_dtype(dtype)),
                                          f"{self.root.name}.c")

    def const(self, values, dtype: str) -> Value:
        from .types import numpy_dtype
        return self.function.add_constant(np.array(values, dtype=numpy_dtype(dtype)),
                                          f"{self.root.name}.c")


def as_value(v):
    """A node bound with `as` stands for its first result where a value is expected."""
    return v.outputs[0] if isinstance(v, Node) else v


class RewriteStats:
    def __init__(self):
        self.fired: Counter = Counter()

    def __iadd__(self, other: "RewriteStats"):
        self.fired.update(other.fired)
        return self


def apply_rules(function: Function, registry: Registry, rules: Iterable[RuleInfo],
                ctx: Optional[RewriteContext] = None, max_rewrites: Optional[int] = None) -> RewriteStats:
    """Rewrite `function` with `rules` until none applies."""
    ctx = ctx or RewriteContext()
    ctx.function = function
    by_op: dict[str, list[RuleInfo]] = {}
    for r in sorted(rules, key=lambda r: -r.size):
        for op in r.pattern.root_ops:
            by_op.setdefault(op, []).append(r)
    stats = RewriteStats()
    limit = max_rewrites or max(10_000, 100 * len(function.nodes))
    recent: deque = deque(maxlen=50)
    dead: dict[int, Node] = {}      # holds the nodes too, so their ids are not reused
    worklist = deque(function.nodes)
    queued = {id(n) for n in worklist}
    rewrites = 0

    def enqueue(n: Node):
        if id(n) not in queued and id(n) not in dead:
            queued.add(id(n))
            worklist.append(n)

    while worklist:
        node = worklist.popleft()
        queued.discard(id(node))
        if id(node) in dead:
            continue
        for rule in by_op.get(node.OP, ()):
            replaced = _try_rule(function, registry, rule, node, ctx)
            if replaced is None:
                continue
            created, results = replaced
            stats.fired[rule.name] += 1
            recent.append(rule.name)
            rewrites += 1
            if rewrites > limit:
                cycle = ", ".join(f"{n} ({c}x)" for n, c in Counter(recent).most_common())
                raise RewriteError(f"rewriting did not converge after {limit} rewrites; the last "
                                   f"rules to fire were: {cycle}. These rules undo each other.")
            for n in created:
                enqueue(n)
            for v in results:
                for user, _ in v.users:
                    enqueue(user)
            _erase_dead(function, node, dead)
            if id(node) in dead:
                _inherit_names(function, node, results, created)
            break
    function.topological_sort()
    return stats


def _try_rule(function, registry, rule: RuleInfo, node: Node, ctx):
    for m in match(rule.pattern, node):
        if rule.guard is not None and not rule.guard(m, ctx):
            continue
        builder = Builder(function, registry, node, rule, m.get(MATCHED, ()))
        try:
            results = tuple(as_value(v) for v in rule.build(builder, m))
        except RecursionError:
            # Builders that call themselves unroll over a static length (a sequence, say);
            # Python's stack bounds how long.
            raise RewriteError(f"rule {rule.name} ({rule.location}) recursed too deeply while "
                               f"rewriting {node.OP} node {node.name!r}: its builders unroll "
                               f"over more steps than glowgen supports") from None
        if len(results) > len(node.outputs):
            raise RewriteError(f"rule {rule.name} ({rule.location}) returns {len(results)} values "
                               f"but {node.OP} has {len(node.outputs)} results")
        for out in node.outputs[len(results):]:
            if function.is_used(out):
                # The rule does not say what the other results become: it does not apply.
                for n in reversed(builder.created):
                    _erase_dead(function, n, {})
                return None
        for out, new in zip(node.outputs, results):
            if out.type != new.type:
                raise RewriteError(f"rule {rule.name} ({rule.location}) replaced {node.OP} node "
                                   f"{node.name!r} of type {out.type} with a value of type {new.type}")
        for out, new in zip(node.outputs, results):
            if new.calibrated is None:       # the same tensor: the same calibration
                new.calibrated = out.calibrated
            function.replace_all_uses(out, new)
        return builder.created, results
    return None


def _inherit_names(function: Function, old: Node, results, created) -> None:
    """A value a rule built in place of a result of the (now erased) `old` takes its name."""
    made = {id(n) for n in created}
    for out, new in zip(old.outputs, results):
        if isinstance(new, Output) and new.index == 0 and id(new.node) in made:
            function.take_name(new, out.name)


def _erase_dead(function: Function, node: Node, dead: dict) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in dead or any(function.is_used(o) for o in n.outputs):
            continue
        producers = [v.producer for v in n.flat_inputs() if v.producer is not None]
        function.remove_node(n)
        dead[id(n)] = n
        stack.extend(producers)
