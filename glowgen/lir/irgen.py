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
from ..engine.types import Type, dtype_of
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
    return _delay_expanding(function, order)


def _nbytes(v: Value):
    """The value's size in bytes, or None for a shape not known at compile time."""
    shape = v.type.shape
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        return None
    return v.type.nbytes


def _delay_expanding(function: Function, order: list[Node]) -> list[Node]:
    """Each node with one output read by one node, whose result is at least twice the size
    of its computed inputs (an int8 tensor dequantized to f32), moved to just before that
    reader: the post-order may place it far earlier, next to its input's producer, where its
    big result is written out and held while other branches run.  ResNet-50 int8: the
    shortcut's Dequantize (a 3.2 MB f32 result at 56x56) ran right after the shortcut's
    convolution, three convolutions before the Add it feeds; next to the Add, the two stack
    into one loop over the int8 tensors."""
    outputs = {id(v) for _, v in function.outputs}
    position = {id(n): i for i, n in enumerate(order)}
    later: dict[int, list[Node]] = {}
    for node in order:
        if len(node.outputs) != 1 or id(node.outputs[0]) in outputs:
            continue
        users = {id(u): u for u, _ in node.outputs[0].users}
        computed = [v for v in node.flat_inputs() if v.producer is not None]
        if len(users) != 1 or not computed:
            continue
        (user,) = users.values()
        sizes = [_nbytes(v) for v in [node.outputs[0], *computed]]
        if id(user) in position and None not in sizes and sizes[0] >= 2 * sum(sizes[1:]) \
                and position[id(user)] > position[id(node)] + 1:
            later.setdefault(id(user), []).append(node)
    if not later:
        return order
    moved = {id(n) for nodes in later.values() for n in nodes}
    out: list[Node] = []

    def emit(node):             # a moved node's own moved inputs go just before it
        for n in later.get(id(node), []):
            emit(n)
        out.append(node)

    for node in order:
        if id(node) not in moved:
            emit(node)
    return out


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
        elimination turns into computing it there.  A state the body computes anew is kept
        in two alternating slots (`_alternate`)."""
        n_state = node.n_state
        state = [self.activation(out, buffers) for out in node.outputs[:n_state]]
        stacked = [self.activation(out, buffers) for out in node.outputs[n_state:]]
        counter = self.buffer(f"{node.name}.iter", Type("i64", ()))
        flag = self.buffer(f"{node.name}.cond", Type("bool", ()))
        initial = []                        # the copies of the initial state
        for s, v in zip(state, node.initial):
            self.copy(s, buffers[id(v)])
            initial.append(self.prog.instrs[-1])
        if node.condition is not None:
            self.copy(flag, buffers[id(node.condition)])
        else:                   # no condition: the body's is not read, the flag stays true
            self.copy(flag, self.scalar_constant(f"{node.name}.true", np.array(True)))
        trip = buffers[id(node.trip_count)] if node.trip_count is not None else None
        control = [("in", trip), ("inout", counter), ("in", flag)]
        self.emit(Instr(Instr.LOOP, list(control), node))
        body_start = len(self.prog.instrs)
        body_buffers = len(self.prog.activations)
        slices = [SliceView(self.unique(f"{buffers[id(v)].name}.slice"), buffers[id(v)], counter,
                            reverse) for v, reverse in zip(node.scanned, node.reverse_scanned)]
        captured = [buffers[id(v)] for v in node.captured]
        inner = {id(p): b for p, b in zip(node.body.placeholders,
                                          [counter, flag] + state + slices + captured)}
        self.function(node.body, inner)
        results = [inner[id(v)] for _, v in node.body.outputs]
        for whole, piece, reverse in zip(stacked, results[1 + n_state:], node.reverse_stacked):
            self.copy(SliceView(self.unique(f"{whole.name}.slice"), whole, counter, reverse), piece)
        computed = {id(a) for a in self.prog.activations[body_buffers:]}
        next_state = results[1:1 + n_state]
        alternating = [k for k, (dst, src) in enumerate(zip(state, next_state))
                       if any(src.root() is s for s in state if s is not dst)
                       or (id(src.root()) in computed and self._not_in_place(dst, src, body_start))]
        slots = self._alternate(node, state, alternating, counter, initial, body_start)
        updates = [slots.get(k, (dst, dst)) + (src,) for k, (dst, src) in enumerate(zip(state, next_state))]
        if node.condition is not None:
            updates.append((flag, flag, results[0]))
        # The next state replaces the old one only once all of it is computed: a next value
        # that is itself old state kept in one buffer (which a copy of this list may write
        # before another reads it: a body that swaps two values) is first copied aside.  An
        # alternating state's old slot is never written here.
        rename = {id(state[k]): old for k, (old, _) in slots.items()}
        single = {id(old) for old, new, _ in updates if old is new} | {id(counter)}
        staged = []
        for old, new, src in updates:
            src = _rebased(src, rename)
            if src.root() is old:
                continue                    # passed through unchanged
            if id(src.root()) in single:
                aside = self.buffer(f"{new.name}.next", src.type)
                self.copy(aside, src)
                src = aside
            staged.append((new, src))
        for dst, src in staged:
            self.copy(dst, src)
        self.emit(Instr(Instr.ENDLOOP, list(control), node))
        for k, (old, _) in slots.items():   # the final state: where the last iteration left it
            self.copy(state[k], old)

    def _not_in_place(self, old, new, body_start: int) -> bool:
        """Would the body's value `new` of a state kept in one buffer, `old`, be computed
        aside and copied over it, or keep a product from storing through its epilogue?

        The next state goes straight into the state's buffer (copy elimination) unless the
        old state is read once the new one is being computed (by the op computing it: s +
        x; or later).  Two slots double the state's footprint: a 4096-float state updated
        in place, s <- tanh(s + x_t), ran 2.27 us per step, 2.76-2.85 us in two slots (Zen 4,
        its 16 KB more per step out of L1).  They also let an op like a matrix product that
        reads the old state apply the elementwise ops computing the new one in its store
        (epilogue.can_fuse refuses a store into what the product reads), the product then
        being the step's whole cost: they are used for that too."""
        body = [ins for ins in self.prog.instrs[body_start:]
                if ins.kind not in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW)]
        writes_new = [i for i, ins in enumerate(body) if any(b.root() is new.root() for b in ins.writes())]
        if not writes_new:
            return False
        first = writes_new[0]
        reads_old = [i for i, ins in enumerate(body) if any(b.root() is old for b in ins.reads())]
        if any(i >= first for i in reads_old):
            return True
        elementwise = self.registry.kernels
        return body[first].kind in elementwise and any(
            body[i].kind not in elementwise and body[i].kind not in Instr.CONTROL + (Instr.COPY,)
            for i in reads_old)

    def _alternate(self, node, state, which, counter, initial, body_start) -> dict:
        """Two alternating slots for each state in `which` (indices), {index: (old, new)}.

        A body that computes a state's next value from the old one (an RNN's matrix
        product reads the old state while it writes the new) cannot write it over the
        old: it would compute it aside and copy it over the old once per iteration.
        Kept in slots (counter + 0) % 2 and (counter + 1) % 2 of a buffer of two, each
        iteration reads the one the last wrote, writes the other (copy elimination has the
        op that computes it write there), and nothing is copied; the final state is copied
        once after the loop (from the slot the last iteration wrote).  The initial state is
        copied into slot 0 (the counter is 0 when the loop starts)."""
        if not which:
            return {}
        zero = self.scalar_constant(f"{node.name}.zero", np.array(0, np.int64))
        slots, rename = {}, {}
        for k in which:
            s = state[k]
            pair = self.buffer(f"{s.name}.slots", s.type.with_shape((2,) + tuple(s.type.shape)))
            old = SliceView(self.unique(f"{s.name}.old"), pair, counter, phase=0)
            new = SliceView(self.unique(f"{s.name}.new"), pair, counter, phase=1)
            first = SliceView(self.unique(f"{s.name}.first"), pair, zero)
            initial[k].operands[0] = ("out", first)
            slots[k], rename[id(s)] = (old, new), old
        for ins in self.prog.instrs[body_start:]:       # the body reads the old slot
            ins.operands = [(r, _rebased(b, rename)) for r, b in ins.operands]
        return slots

    def scalar_constant(self, name: str, value: np.ndarray) -> WeightBuffer:
        """A constant of one element (a loop's `true` flag, the counter of its first slot)."""
        w = WeightBuffer(self.unique(name), Type(dtype_of(value), ()), "constant", data=value)
        self.prog.weights.append(w)
        return w


def _rebased(buf, rename: dict):
    """`buf` with the buffer at its root replaced as `rename` says (by id), views over it
    made over the replacement (views are shared objects: rebased in place)."""
    if buf is None:
        return None
    if id(buf) in rename:
        return rename[id(buf)]
    b = buf
    while isinstance(b, TensorView):
        if id(b.base) in rename:
            b.base = rename[id(b.base)]
            break
        b = b.base
    return buf
