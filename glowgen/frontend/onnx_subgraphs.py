"""ONNX control flow decided at run time: subgraphs imported as Functions of their own.

When the condition of an If is known only at run time, both branches are compiled and the
If becomes a `Conditional` node (engine/control.py) owning them; a Loop whose trip count or
condition is known only at run time becomes a `WhileLoop` owning its body.  A subgraph is
imported by the same generic importer, into a Function of its own: names it does not
define resolve in the enclosing scopes, as ONNX specifies, and the value found there is
captured.  A captured constant is shared (the subgraph's Function gets a constant with the
same data, so folding and weight packing see it); any other value becomes a placeholder of
the Function and an operand of the node.  The two branches of an If take the union of what
either captures, in the same order, so the node has one list of operands.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Optional

import numpy as np

from ..engine.control import Conditional, WhileLoop
from ..engine.graph import Constant, Function, Value
from ..engine.types import Type


class _Captures:
    """What the subgraphs of one node (an If's two branches, a Loop's body) capture from the
    enclosing function, in the order first met."""

    def __init__(self):
        self.outer: dict[int, Value] = {}               # id -> the enclosing function's value

    def placeholder(self, branch: Function, value: Value, made: dict) -> Value:
        self.outer.setdefault(id(value), value)
        if id(value) not in made:
            made[id(value)] = branch.add_placeholder(value.name, value.type)
        return made[id(value)]


class _CaptureScope(dict):
    """The outermost name scope of a subgraph: a name missing here is looked up in the
    enclosing scope `outer` and captured (the dict then remembers it)."""

    def __init__(self, outer: ChainMap, branch: Function, captures: _Captures):
        super().__init__()
        self.outer, self.branch, self.captures = outer, branch, captures
        self.made: dict[int, Value] = {}                # outer value id -> its stand-in here

    def __missing__(self, name: str) -> Value:
        value = self.outer[name]                        # KeyError when no scope defines it
        if isinstance(value, Constant):
            if id(value) not in self.made:
                self.made[id(value)] = self.branch.add_constant(value.data, value.name)
            inner = self.made[id(value)]
        else:
            inner = self.captures.placeholder(self.branch, value, self.made)
        self[name] = inner
        return inner

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or name in self.outer


def _import_subgraph(importer, graph, name: str, captures: _Captures, desc: str, opset: int,
                     formals: tuple = (), leading: tuple = ()):
    """`graph` imported into a new Function whose first placeholders are `leading` ((name,
    Type) pairs the graph does not take: a Scan body's iteration number and condition), then
    the graph's inputs, of the Types `formals` (a Loop body's iteration number, condition
    and state), followed by those of the values it captures; returns the Function and its
    capture scope."""
    fn = Function(name)
    for label, ty in leading:
        fn.add_placeholder(label, ty)
    bindings = {formal.name: fn.add_placeholder(formal.name, ty)
                for formal, ty in zip(graph.input, formals)}
    scope = _CaptureScope(importer.values, fn, captures)
    saved = importer.function, importer.values
    importer.function, importer.values = fn, ChainMap(scope)
    try:
        outputs = importer.inline_graph(graph, bindings, desc, opset)
    finally:
        importer.function, importer.values = saved
    for i, value in enumerate(outputs):
        fn.add_output(str(i), value)
    return fn, scope


def conditional(importer, node, cond: Value, then_graph, else_graph, desc: str, opset: int):
    """Import both branches of If `node` and join them in a Conditional of the function being
    built.  Returns the node, or None when the branches give different types (the caller
    then decides per value of the condition instead)."""
    captures = _Captures()
    label = node.name or node.output[0] or "if"
    then_fn, then_scope = _import_subgraph(importer, then_graph, f"{label}.then", captures,
                                           f"{desc} (then_branch)", opset)
    else_fn, else_scope = _import_subgraph(importer, else_graph, f"{label}.else", captures,
                                           f"{desc} (else_branch)", opset)
    if [v.type for _, v in then_fn.outputs] != [v.type for _, v in else_fn.outputs]:
        return None
    # Both branches take every captured value, in one order (a branch ignores what only the
    # other reads: an unused placeholder costs nothing).
    outer = list(captures.outer.values())
    for fn, scope in ((then_fn, then_scope), (else_fn, else_scope)):
        fn.placeholders = [captures.placeholder(fn, v, scope.made) for v in outer]
    return importer.function.add_node(
        Conditional, [cond, tuple(outer)], {"then_branch": then_fn, "else_branch": else_fn},
        name=label, origin=(label,), output_names=list(node.output))


def while_loop(importer, node, trip_count: Optional[Value], cond: Optional[Value], initial: list,
               body_graph, desc: str, opset: int, length: Optional[int] = None):
    """Import Loop `node`'s body into a WhileLoop of the function being built.  Scan outputs
    need `length`, the number of iterations, known at compile time (the caller has checked
    that the loop runs exactly that many: the condition, if any, is left out).  Returns the
    node, or None when the body gives its state other types than it takes (the caller then
    needs the trip count at compile time instead) or has scan outputs without a `length`."""
    n_state = len(initial)
    if len(body_graph.input) != 2 + n_state or len(body_graph.output) < 1 + n_state:
        return None
    n_stacked = len(body_graph.output) - 1 - n_state
    if n_stacked and length is None:
        return None
    captures = _Captures()
    label = node.name or node.output[0] or "loop"
    formals = (Type("i64", ()), Type("bool", ())) + tuple(v.type for v in initial)
    body, scope = _import_subgraph(importer, body_graph, f"{label}.body", captures, f"{desc} (body)",
                                   opset, formals)
    cond_out, state_out = body.outputs[0][1].type, [v.type for _, v in body.outputs[1:1 + n_state]]
    if cond_out.dtype != "bool" or cond_out.size != 1 or state_out != [v.type for v in initial]:
        return None
    outer = list(captures.outer.values())
    body.placeholders = body.placeholders[:2 + n_state] + [
        captures.placeholder(body, v, scope.made) for v in outer]
    return importer.function.add_node(
        WhileLoop, [trip_count, cond, tuple(initial), (), tuple(outer)],
        {"body": body, "length": length or 0, "reverse_stacked": (False,) * n_stacked},
        name=label, origin=(label,), output_names=list(node.output))


def scan_loop(importer, node, states: list, scanned: list, reverse_scanned: list,
              reverse_stacked: list, body_graph, desc: str, opset: int):
    """Import Scan `node`'s body into a WhileLoop of the function being built, running once
    per slice of `scanned` (each already with its scan axis first): the body gets an
    iteration number and a condition it ignores, and gives a condition that stays true.
    Returns the node, or None when the body gives its state other types than it takes."""
    n_state, length = len(states), scanned[0].type.shape[0]
    captures = _Captures()
    label = node.name or node.output[0] or "scan"
    formals = tuple(v.type for v in states) + tuple(
        v.type.with_shape(tuple(v.type.shape[1:])) for v in scanned)
    body, scope = _import_subgraph(importer, body_graph, f"{label}.body", captures,
                                   f"{desc} (body)", opset, formals,
                                   leading=(("iter", Type("i64", ())), ("cond", Type("bool", ()))))
    if [v.type for _, v in body.outputs[:n_state]] != [v.type for v in states]:
        return None
    body.outputs.insert(0, ("cond", body.add_constant(np.array(True), "true")))
    outer = list(captures.outer.values())
    body.placeholders = body.placeholders[:2 + len(formals)] + [
        captures.placeholder(body, v, scope.made) for v in outer]
    trip = importer.function.add_constant(np.array(length, np.int64), f"{label}.length")
    return importer.function.add_node(
        WhileLoop, [trip, None, tuple(states), tuple(scanned), tuple(outer)],
        {"body": body, "length": length, "reverse_scanned": tuple(map(bool, reverse_scanned)),
         "reverse_stacked": tuple(map(bool, reverse_stacked))},
        name=label, origin=(label,), output_names=list(node.output))
