"""Rule patterns as data, and the generic matcher that walks them.

A generated rule is a `RuleInfo`: its left-hand side as a `P` tree, a compiled guard and a
compiled builder.  The matcher knows nothing about particular ops; operand order of
`commutative` ops is tried both ways.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional

import attrs

from .graph import Node, Output, Value


@attrs.frozen
class V:
    """A variable: matches any value (`_` binds nothing; a repeated name must be the same value).
    An `optional` variable (`x?`) also matches an absent optional operand and binds None."""
    name: str
    bind: Optional[str] = None
    optional: bool = False


@attrs.frozen
class R:
    """`*rest`: the remaining values of a variadic operand."""
    name: str


@attrs.frozen
class P:
    """An op pattern: the value must be result 0 of a node of kind `op`, or, for a family or
    group of ops (`op` is its name), of any kind in `ops`."""
    op: str
    args: tuple
    bind: Optional[str] = None
    ops: tuple = ()

    @property
    def root_ops(self) -> tuple:
        """The node kinds the pattern's root matches."""
        return self.ops or (self.op,)

    def accepts(self, kind: str) -> bool:
        return kind == self.op if not self.ops else kind in self.ops


@attrs.frozen
class RuleInfo:
    name: str
    phases: tuple
    pattern: P
    size: int
    guard: Optional[Callable]
    build: Callable
    location: str


def _operand_lists(node: Node, nargs: int, has_rest: bool) -> Iterator[list]:
    """The operand sequences a pattern with `nargs` entries may be matched against."""
    if len(node.INPUTS) == 1 and node.INPUTS[0].variadic:
        values = list(node.inputs[0])
        if has_rest:
            if len(values) >= nargs - 1:
                yield values
        elif len(values) == nargs:
            yield values
        return
    inputs = list(node.inputs)
    if nargs < len(inputs):
        if any(v is not None for v in inputs[nargs:]):
            return          # the pattern omits operands that are present
        inputs = inputs[:nargs]
    yield inputs
    if "commutative" in node.TRAITS and len(inputs) == 2:
        yield [inputs[1], inputs[0]]


def match(pattern: P, node: Node) -> Iterator[dict]:
    """Yield every binding of `pattern` rooted at `node`."""
    if not pattern.accepts(node.OP):
        return
    yield from _match_node(pattern, node, {})


MATCHED = "__matched__"      # key of the tuple of every node a match covers (provenance)


def _match_node(p: P, node: Node, m: dict) -> Iterator[dict]:
    if not p.accepts(node.OP):
        return
    m = {**m, MATCHED: m.get(MATCHED, ()) + (node,)}
    if p.bind:
        m = {**m, p.bind: node}
    has_rest = bool(p.args) and isinstance(p.args[-1], R)
    for operands in _operand_lists(node, len(p.args), has_rest):
        yield from _match_args(p.args, operands, m)


def _match_args(args: tuple, values: list, m: dict) -> Iterator[dict]:
    if not args:
        if not values:
            yield m
        return
    head, tail = args[0], args[1:]
    if isinstance(head, R):
        yield {**m, head.name: tuple(values)}
        return
    if not values:
        return
    for m2 in _match_value(head, values[0], m):
        yield from _match_args(tail, values[1:], m2)


def _match_value(p, value: Optional[Value], m: dict) -> Iterator[dict]:
    if value is None:
        if isinstance(p, V) and p.optional:
            yield {**m, p.name: None} if p.name != "_" else m
        return              # an absent optional operand matches nothing else
    if isinstance(p, V):
        if p.name != "_":
            if p.name in m:
                if m[p.name] is not value:
                    return
            else:
                m = {**m, p.name: value}
        if p.bind:
            m = {**m, p.bind: value}
        yield m
        return
    if not isinstance(value, Output) or value.index != 0:
        return
    yield from _match_node(p, value.node, m)
