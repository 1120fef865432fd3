"""IRGen: a lowered graph -> a LIR program (one instruction per primitive node).

Every result gets an activation (allocated before, deallocated at the end); `view` ops
become tensor views; each graph output is a copy into its mutable weight.  A conditional
node becomes a region (`cond` / `else` / `endcond`, see ir.Instr) holding the instructions
of both its branches; a loop node, a `loop` / `endloop` region holding its body's.  The passes in
`passes.py` then remove what this naive form wastes.
"""
from __future__ import annotations

import numpy as np

from ..engine.control import Conditional, WhileLoop
from ..engine.graph import Function, Node, Value
from ..engine.types import Type
from ..errors import GlowgenError
from .ir import Activation, Instr, Program, SliceView, TensorView, WeightBuffer


def schedule(function: Function) -> list[Node]:
    """Post-order from the outputs, visiting the operand with the largest result first
    (Glow's heuristic): big intermediate results are produced, consumed and freed early
    instead of waiting while other branches run."""
    order: list[Node] = []
    done: set[int] = set()

    def size(v: Value) -> int:
        return v.type.nbytes if v.producer is not None else 0

    def visit(root: Node):
        stack = [(root, None)]
        while stack:
            node, it = stack.pop()
            if id(node) in done:
                continue
            if it is None:
                operands = sorted((v for v in node.flat_inputs() if v.producer is not None),
                                  key=size, reverse=True)
                it = iter(operands)
            for v in it:
                if id(v.producer) not in done:
                    stack.append((node, it))
                    stack.append((v.producer, None))
                    break
            else:
                done.add(id(node))
                order.append(node)

    for _, v in function.outputs:
        if v.producer is not None:
            visit(v.producer)
    for node in function.nodes:            # nodes no output depends on (kept for completeness)
        if id(node) not in done:
            visit(node)
    return order


def generate(function: Function, registry) -> Program:
    prog = Program(function.name)
    gen = _Generator(prog, registry)
    buffers: dict[int, object] = {}
    for p in function.placeholders:
        w = WeightBuffer(gen.unique(p.name), p.type, "mutable")
        w.io = "input"
        prog.weights.append(w)
        prog.inputs[p.name] = w
        buffers[id(p)] = w
    for c in function.constants:
        buffers[id(c)] = gen.constant(c)
    for name, v in function.outputs:
        w = WeightBuffer(gen.unique(name if name not in gen.names else f"{name}.out"), v.type, "mutable")
        w.io = "output"
        prog.weights.append(w)
        prog.outputs[name] = w
    gen.function(function, buffers)
    for name, v in function.outputs:
        gen.emit(Instr(Instr.COPY, [("out", prog.outputs[name]), ("in", buffers[id(v)])]))
    for act in prog.activations:
        gen.emit(Instr(Instr.DEALLOC, [("out", act)]))
    return prog


class _Generator:
    """Appends the instructions of a function, and of the sub-functions its nodes own, to
    one program: all their buffers are planned in one arena."""

    def __init__(self, prog: Program, registry):
        self.prog, self.registry = prog, registry
        self.names: set[str] = set()
        self.weights: dict[int, WeightBuffer] = {}     # id of constant data -> its buffer

    def unique(self, name: str) -> str:
        base, i = name, 1
        while name in self.names:
            name = f"{base}.{i}"
            i += 1
        self.names.add(name)
        return name

    def emit(self, ins: Instr) -> None:
        self.prog.instrs.append(ins)

    def constant(self, c) -> WeightBuffer:
        """The constant's buffer; a branch shares its enclosing function's constants (the
        same data), so they are stored once."""
        w = self.weights.get(id(c.data))
        if w is None or w.type != c.type:
            w = WeightBuffer(self.unique(c.name), c.type, "constant", data=c.data)
            self.prog.weights.append(w)
            self.weights[id(c.data)] = w
        return w

    def activation(self, value, buffers: dict) -> Activation:
        act = self.buffer(value.name, value.type)
        buffers[id(value)] = act
        return act

    def buffer(self, name: str, type: Type) -> Activation:
        act = Activation(self.unique(name), type)
        self.prog.activations.append(act)
        self.emit(Instr(Instr.ALLOC, [("out", act)]))
        return act

    def copy(self, dst, src) -> None:
        """dst <- src; a source of another shape (a condition of shape [1] into a bool[]) is
        read through a view of dst's type."""
        if src.type != dst.type:
            src = TensorView(self.unique(src.name), dst.type, src)
        self.emit(Instr(Instr.COPY, [("out", dst), ("in", src)]))

    def function(self, function: Function, buffers: dict) -> None:
        """The instructions computing `function`'s nodes; `buffers` maps its placeholders
        (and gets every value it computes)."""
        for c in function.constants:
            buffers[id(c)] = self.constant(c)
        for node in schedule(function):
            if isinstance(node, Conditional):
                self.conditional(node, buffers)
            elif isinstance(node, WhileLoop):
                self.loop(node, buffers)
            else:
                self.node(node, buffers)

    def node(self, node: Node, buffers: dict) -> None:
        kind = self.registry.instructions.get(node.OP)
        if kind is None:
            raise GlowgenError(f"{node.OP} (node {node.name!r}) is not a primitive; lower the "
                               f"graph before IRGen")
        if "view" in node.TRAITS:
            base = buffers[id(node.inputs[0])]
            view = TensorView(self.unique(node.outputs[0].name), node.outputs[0].type, base)
            buffers[id(node.outputs[0])] = view
            self.emit(Instr(Instr.VIEW, [("out", view), ("in", base)], node))
            return
        operands, groups = [], []
        for out in node.outputs:
            operands.append(("out", self.activation(out, buffers)))
            groups.append(1)
        for v in node.inputs:
            if isinstance(v, tuple):
                operands += [("in", buffers[id(x)]) for x in v]
                groups.append(len(v))
            else:
                operands.append(("in", buffers[id(v)] if v is not None else None))
                groups.append(1)
        self.emit(Instr(node.OP, operands, node, tuple(groups)))

    def conditional(self, node: Conditional, buffers: dict) -> None:
        """`cond`, the then-branch, `else`, the else-branch, `endcond`: each branch computes
        its results and copies them into the node's (copy elimination then has most
        branches compute straight into them)."""
        results = [self.activation(out, buffers) for out in node.outputs]
        captured = [buffers[id(v)] for v in node.captured]
        self.emit(Instr(Instr.COND, [("in", buffers[id(node.condition)])], node))
        for k, branch in enumerate(node.subfunctions()):
            if k:
                self.emit(Instr(Instr.ELSE, [], node))
            inner = {id(p): b for p, b in zip(branch.placeholders, captured)}
            self.function(branch, inner)
            for (_, v), result in zip(branch.outputs, results):
                self.emit(Instr(Instr.COPY, [("out", result), ("in", inner[id(v)])]))
        self.emit(Instr(Instr.ENDCOND, [], node))

    def loop(self, node: WhileLoop, buffers: dict) -> None:
        """The state copied into the node's results, then `loop`, the body, the copies of
        its next state and condition over the old, `endloop` (ir.Instr).  The body reads
        the iteration counter, the condition and the state in place, and the slices of the
        scanned values through views whose offset the counter decides (ir.SliceView); it
        copies each slice it stacks into such a view of the stacked result, which copy
        elimination turns into computing it there."""
        n_state = node.n_state
        state = [self.activation(out, buffers) for out in node.outputs[:n_state]]
        stacked = [self.activation(out, buffers) for out in node.outputs[n_state:]]
        counter = self.buffer(f"{node.name}.iter", Type("i64", ()))
        flag = self.buffer(f"{node.name}.cond", Type("bool", ()))
        for s, v in zip(state, node.initial):
            self.copy(s, buffers[id(v)])
        if node.condition is not None:
            self.copy(flag, buffers[id(node.condition)])
        else:                   # no condition: the body's is not read, the flag stays true
            true = WeightBuffer(self.unique(f"{node.name}.true"), flag.type, "constant",
                                data=np.array(True))
            self.prog.weights.append(true)
            self.copy(flag, true)
        trip = buffers[id(node.trip_count)] if node.trip_count is not None else None
        control = [("in", trip), ("inout", counter), ("in", flag)]
        self.emit(Instr(Instr.LOOP, list(control), node))
        slices = [SliceView(self.unique(f"{buffers[id(v)].name}.slice"), buffers[id(v)], counter,
                            reverse) for v, reverse in zip(node.scanned, node.reverse_scanned)]
        captured = [buffers[id(v)] for v in node.captured]
        inner = {id(p): b for p, b in zip(node.body.placeholders,
                                          [counter, flag] + state + slices + captured)}
        self.function(node.body, inner)
        results = [inner[id(v)] for _, v in node.body.outputs]
        for whole, piece, reverse in zip(stacked, results[1 + n_state:], node.reverse_stacked):
            self.copy(SliceView(self.unique(f"{whole.name}.slice"), whole, counter, reverse), piece)
        updates = list(zip(state, results[1:1 + n_state]))
        if node.condition is not None:
            updates.append((flag, results[0]))
        # The next state replaces the old one only once all of it is computed: a next value
        # that is itself old state (a body that swaps two values) is first copied aside.
        old = {id(b) for b in state + [flag, counter]}
        staged = []
        for dst, src in updates:
            if src.root() is dst:
                continue                    # passed through unchanged
            if id(src.root()) in old:
                aside = self.buffer(f"{dst.name}.next", src.type)
                self.copy(aside, src)
                src = aside
            staged.append((dst, src))
        for dst, src in staged:
            self.copy(dst, src)
        self.emit(Instr(Instr.ENDLOOP, list(control), node))
