"""Cutting a graph into sub-functions.

A partition is a set of nodes of the network's optimized graph.  Its sub-function has a
Placeholder for every value it reads that another partition (or the caller) provides, the
Constants it reads (sharing their arrays: weights are not copied), copies of its nodes, and an
output for every value it computes that another partition or the caller needs.  Boundary
tensors keep the names they have in the whole graph, so the executor passes them by name."""
from __future__ import annotations

from typing import Iterable

from ..engine.graph import Constant, Function, Node, Placeholder, Value


def value_bytes(v: Value) -> int:
    return int(v.type.nbytes)


def consumers(function: Function) -> dict[int, list[Node]]:
    """id(value) -> the nodes that read it."""
    out: dict[int, list[Node]] = {}
    for node in function.nodes:
        for v in node.flat_inputs():
            lst = out.setdefault(id(v), [])
            if not lst or lst[-1] is not node:
                lst.append(node)
    return out


def boundary(function: Function, nodes: Iterable[Node]) -> tuple[list[Value], list[Value]]:
    """(inputs, outputs) of the cut `nodes`: the non-constant values they read and do not
    compute, and the values they compute that a node outside or a graph output reads."""
    nodes = list(nodes)
    inside = {id(n) for n in nodes}
    produced = {id(o) for n in nodes for o in n.outputs}
    graph_outputs = {id(v) for _, v in function.outputs}
    inputs, seen = [], set()
    for n in nodes:
        for v in n.flat_inputs():
            if isinstance(v, Constant) or id(v) in produced or id(v) in seen:
                continue
            seen.add(id(v))
            inputs.append(v)
    outputs = []
    for n in nodes:
        for o in n.outputs:
            if id(o) in graph_outputs or any(id(u) not in inside for u, _ in o.users):
                outputs.append(o)
    return inputs, outputs


def cut(function: Function, nodes: Iterable[Node], name: str) -> tuple[Function, list[Value], list[Value]]:
    """The sub-function computing `nodes` (in the graph's order), with its boundary inputs and
    outputs (values of `function`, in the order of the sub-function's placeholders/outputs)."""
    order = {id(n): i for i, n in enumerate(function.nodes)}
    nodes = sorted(nodes, key=lambda n: order[id(n)])
    inputs, outputs = boundary(function, nodes)
    sub = Function(name)
    copies: dict[int, Value] = {}
    for v in inputs:
        copies[id(v)] = sub.add_placeholder(v.name, v.type)
        assert copies[id(v)].name == v.name, v.name
    for n in nodes:
        operands = n.map_operands(lambda v: _operand(sub, copies, v))
        copy = sub.add_node(type(n), operands, n.copy_args(), name=n.name, origin=n.origin,
                            rules=n.rules, output_names=[o.name for o in n.outputs])
        for o, c in zip(n.outputs, copy.outputs):
            copies[id(o)] = c
    for v in outputs:
        sub.add_output(v.name, copies[id(v)])
    return sub, inputs, outputs


def _operand(sub: Function, copies: dict, v: Value) -> Value:
    if id(v) not in copies:
        assert isinstance(v, Constant), v
        copies[id(v)] = sub.add_constant(v.data, v.name)
    return copies[id(v)]


def is_input(v: Value) -> bool:
    return isinstance(v, Placeholder)
