"""Tensors inside control flow (a run-time If's branches, a native loop's body): which of them
a profile covers, and how the profiler's instruments get their ranges and histograms out.

A sub-function's own tensors are its values but the placeholders that stand for values it
captures from the enclosing function (those are the enclosing function's tensors, profiled
there).  They are keyed by name, as the main function's are: names are unique in a valid
ONNX model, but glowgen names the values it makes itself per function, so a name that two
functions use is left out (its tensors stay float).

A loop's body runs many times per call: its instruments are loop state, a running minimum,
maximum and histogram that start at +inf, -inf and zeros and become results of the loop.
Each branch of a conditional gives the instruments of its own tensors, and the neutral
values for the other branch's.  A tensor no call computed has no range: profiler.py leaves
it out of the profile.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterator

import numpy as np

from ..engine.control import Conditional, WhileLoop
from ..engine.graph import Function, Node, Value
from ..engine.registry import Registry


def captured_placeholders(node: Node, sub: Function) -> list:
    """The placeholders of `sub` (a sub-function of `node`) that stand for values `node`
    captures from the enclosing function."""
    if isinstance(node, WhileLoop):
        return sub.placeholders[2 + node.n_state + len(node.scanned):]
    return list(sub.placeholders)


def nested(function: Function) -> Iterator[tuple[Node, Function]]:
    """(node, sub-function) for every sub-function inside `function`, at any depth."""
    for node in function.nodes:
        for sub in node.subfunctions():
            yield node, sub
            yield from nested(sub)


def own_values(function: Function, inputs: list) -> list[Value]:
    """The float32 tensors `function` computes from its placeholders, and those of `inputs`
    (its placeholders a profile covers): constants and what folds from them are known, and
    empty tensors have no range."""
    dynamic: set[int] = {id(p) for p in function.placeholders}
    chosen = list(inputs)
    for node in function.nodes:                    # topological order
        if not any(id(v) in dynamic for v in node.flat_inputs()):
            continue
        for out in node.outputs:
            dynamic.add(id(out))
            chosen.append(out)
    return [v for v in chosen if v.type.dtype == "f32" and v.type.size > 0]


def body_values(function: Function) -> dict[int, list[Value]]:
    """{id of a sub-function: its own tensors a profile covers}, for every sub-function
    inside `function`: those whose names no other function (main included) uses."""
    own = {id(function): own_values(function, function.placeholders)}
    for node, sub in nested(function):
        captured = {id(p) for p in captured_placeholders(node, sub)}
        own[id(sub)] = own_values(sub, [p for p in sub.placeholders if id(p) not in captured])
    uses = Counter(name for values in own.values() for name in {v.name for v in values})
    del own[id(function)]
    return {k: [v for v in values if uses[v.name] == 1] for k, values in own.items()}


class Instruments:
    """Adds a profile's instruments to a function and the sub-functions inside it.

    `index` numbers the profiled tensors (by id); `body` holds the tensors profiled in each
    sub-function (body_values).  `function(f, own, bounds)` measures `own`, the tensors of
    `f` itself, and those inside `f`'s sub-functions; it returns, per tensor, (i, minimum,
    maximum, histogram) as values of `f`.  `bounds(i)` gives the two values of `f` bounding
    tensor i's histogram (the main function's placeholders low.i and high.i, captured)."""

    def __init__(self, registry: Registry, bins: int, index: dict, body: dict):
        self.registry, self.bins, self.index, self.body = registry, bins, index, body

    def function(self, fn: Function, own: list, bounds: Callable[[int], tuple]) -> list:
        probes = [(self.index[id(v)],) + self._measure(fn, v, *bounds(self.index[id(v)]))
                  for v in own]
        for node in list(fn.nodes):
            if not any(self._inside(sub) for sub in node.subfunctions()):
                continue
            if isinstance(node, WhileLoop):
                probes += self._loop(fn, node, bounds)
            elif isinstance(node, Conditional):
                probes += self._conditional(fn, node, bounds)
        return probes

    def _inside(self, sub: Function) -> bool:
        return bool(self.body.get(id(sub))) or any(self._inside(s) for n in sub.nodes
                                                   for s in n.subfunctions())

    def _measure(self, fn: Function, v: Value, low: Value, high: Value) -> tuple:
        op = self.registry.op
        lo = fn.add_node(op("ReduceMin"), [v], {"axes": [], "keepdims": 0}, name="glowgen.profile.min")
        hi = fn.add_node(op("ReduceMax"), [v], {"axes": [], "keepdims": 0}, name="glowgen.profile.max")
        hist = fn.add_node(op("Histogram"), [v, low, high], {"bins": self.bins},
                           name="glowgen.profile.histogram")
        return lo.outputs[0], hi.outputs[0], hist.outputs[0]

    def _neutral(self, fn: Function) -> tuple:
        """What a tensor not computed contributes: no minimum, no maximum, no counts."""
        return (fn.add_constant(np.array(np.inf, np.float32), "glowgen.profile.none"),
                fn.add_constant(np.array(-np.inf, np.float32), "glowgen.profile.none"),
                fn.add_constant(np.zeros(self.bins, np.float32), "glowgen.profile.none"))

    def _sub(self, sub: Function, outer_bounds, extra: list) -> list:
        """The probes of `sub`, its histograms bounded by placeholders it captures (appended
        to `extra`, the enclosing values they stand for, once per tensor)."""
        made: dict[int, tuple] = {}

        def bounds(i: int) -> tuple:
            if i not in made:
                low, high = outer_bounds(i)
                made[i] = (sub.add_placeholder("glowgen.profile.low", low.type),
                           sub.add_placeholder("glowgen.profile.high", high.type))
                extra.append((i, low, high, made[i]))
            return made[i]

        return self.function(sub, self.body.get(id(sub), []), bounds)

    def _loop(self, fn: Function, node: WhileLoop, bounds) -> list:
        body, n_state = node.body, node.n_state
        old_placeholders = list(body.placeholders)
        extra: list = []
        probes = self._sub(body, bounds, extra)
        running, outs, initial = [], [], []
        for i, lo, hi, hist in probes:
            for value, start, combine in ((lo, np.inf, "Min"), (hi, -np.inf, "Max"), (hist, 0.0, "Add")):
                state = body.add_placeholder("glowgen.profile.running", value.type)
                running.append(state)
                outs.append(body.add_node(self.registry.op(combine), [state, value]).outputs[0])
                initial.append(fn.add_constant(np.full(value.type.shape, start, np.float32),
                                               "glowgen.profile.start"))
        # The body takes (iteration, condition, state..., slices..., captured...): the
        # running values join the state, the bounds the captured values.
        body.placeholders = (old_placeholders[:2 + n_state] + running + old_placeholders[2 + n_state:]
                             + [p for _, _, _, pair in extra for p in pair])
        body.outputs = (body.outputs[:1 + n_state] + [(f"glowgen.profile.{k}", v) for k, v in enumerate(outs)]
                        + body.outputs[1 + n_state:])
        new = self._rebuild(fn, node, [node.trip_count, node.condition, tuple(node.initial) + tuple(initial),
                                       node.scanned, tuple(node.captured) + _bounds(extra)],
                            node.attr_values() | {"body": body}, n_state, len(outs))
        finals = new.outputs[n_state:n_state + len(outs)]
        return [(i,) + tuple(finals[3 * k:3 * k + 3]) for k, (i, _, _, _) in enumerate(probes)]

    def _conditional(self, fn: Function, node: Conditional, bounds) -> list:
        # Both branches take the same captures: each takes the bounds either needs.
        shared: dict[int, tuple] = {}
        per_branch = []
        for sub in node.subfunctions():
            mine: list = []
            per_branch.append((sub, self._sub(sub, bounds, mine), mine))
            for i, low, high, _ in mine:
                shared.setdefault(i, (low, high))
        order = sorted({i for _, probes, _ in per_branch for i, *_ in probes})
        for sub, probes, mine in per_branch:
            have = {i: pair for i, _, _, pair in mine}
            for i in shared:                  # bounds only the other branch reads
                if i not in have:
                    have[i] = (sub.add_placeholder("glowgen.profile.low", shared[i][0].type),
                               sub.add_placeholder("glowgen.profile.high", shared[i][1].type))
            sub.placeholders = (sub.placeholders[:len(node.captured)]
                                + [p for i in sorted(shared) for p in have[i]])
            got = {i: rest for i, *rest in probes}
            for i in order:
                for k, v in enumerate(got.get(i) or self._neutral(sub)):
                    sub.add_output(f"glowgen.profile.{i}.{k}", v)
        extra_values = tuple(x for i in sorted(shared) for x in shared[i])
        new = self._rebuild(fn, node, [node.condition, tuple(node.captured) + extra_values],
                            {"then_branch": node.then_branch, "else_branch": node.else_branch},
                            len(node.outputs), 3 * len(order))
        added = new.outputs[len(node.outputs):]
        return [(i,) + tuple(added[3 * k:3 * k + 3]) for k, i in enumerate(order)]

    def _rebuild(self, fn: Function, node: Node, inputs: list, args: dict, keep: int, added: int) -> Node:
        """`node` made again with `inputs` and `args` (its sub-functions grown), in its place:
        its first `keep` results, then `added` new ones, then the rest of its own."""
        names = [o.name for o in node.outputs]
        for name in names + [node.name]:
            fn.forget_name(name)
        new = fn.add_node(type(node), inputs, args, name=node.name, origin=node.origin,
                          output_names=names[:keep] + [""] * added + names[keep:])
        fn.nodes.remove(new)
        fn.nodes.insert(fn.nodes.index(node), new)
        olds = node.outputs
        fresh = new.outputs[:keep] + new.outputs[keep + added:]
        for old, value in zip(olds, fresh):
            fn.replace_all_uses(old, value)
        fn.remove_node(node)
        return new


def _bounds(extra: list) -> tuple:
    return tuple(x for _, low, high, _ in extra for x in (low, high))
