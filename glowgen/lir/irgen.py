"""IRGen: a lowered graph -> a LIR program (one instruction per primitive node).

Every result gets an activation (allocated before, deallocated at the end); `view` ops
become tensor views; each graph output is a copy into its mutable weight.  The passes in
`passes.py` then remove what this naive form wastes.
"""
from __future__ import annotations

from ..engine.graph import Function, Node, Value
from ..errors import GlowgenError
from .ir import Activation, Instr, Program, TensorView, WeightBuffer


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
    buffers: dict[int, object] = {}
    names: set[str] = set()

    def unique(name: str) -> str:
        base, i = name, 1
        while name in names:
            name = f"{base}.{i}"
            i += 1
        names.add(name)
        return name

    for p in function.placeholders:
        w = WeightBuffer(unique(p.name), p.type, "mutable")
        w.io = "input"
        prog.weights.append(w)
        prog.inputs[p.name] = w
        buffers[id(p)] = w
    for c in function.constants:
        w = WeightBuffer(unique(c.name), c.type, "constant", data=c.data)
        prog.weights.append(w)
        buffers[id(c)] = w
    for name, v in function.outputs:
        w = WeightBuffer(unique(name if name not in names else f"{name}.out"), v.type, "mutable")
        w.io = "output"
        prog.weights.append(w)
        prog.outputs[name] = w

    for node in schedule(function):
        kind = registry.instructions.get(node.OP)
        if kind is None:
            raise GlowgenError(f"{node.OP} (node {node.name!r}) is not a primitive; lower the "
                               f"graph before IRGen")
        if "view" in node.TRAITS:
            base = buffers[id(node.inputs[0])]
            view = TensorView(unique(node.outputs[0].name), node.outputs[0].type, base)
            buffers[id(node.outputs[0])] = view
            prog.instrs.append(Instr(Instr.VIEW, [("out", view), ("in", base)], node))
            continue
        operands, groups = [], []
        for out in node.outputs:
            act = Activation(unique(out.name), out.type)
            prog.activations.append(act)
            buffers[id(out)] = act
            prog.instrs.append(Instr(Instr.ALLOC, [("out", act)]))
            operands.append(("out", act))
            groups.append(1)
        for v in node.inputs:
            if isinstance(v, tuple):
                operands += [("in", buffers[id(x)]) for x in v]
                groups.append(len(v))
            else:
                operands.append(("in", buffers[id(v)] if v is not None else None))
                groups.append(1)
        prog.instrs.append(Instr(node.OP, operands, node, tuple(groups)))

    for name, v in function.outputs:
        prog.instrs.append(Instr(Instr.COPY, [("out", prog.outputs[name]), ("in", buffers[id(v)])]))
    for act in prog.activations:
        prog.instrs.append(Instr(Instr.DEALLOC, [("out", act)]))
    return prog
