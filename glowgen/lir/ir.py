"""The low-level IR: instructions over buffers, addressed by region and offset.

Buffers live in one of three regions, as in Glow's bundles:
  constant   read-only weights, one blob
  mutable    the model's inputs and outputs, each at a fixed offset
  activation everything else, between `allocactivation` and `deallocactivation`,
             at offsets chosen by the static memory planner
A `TensorView` reinterprets another buffer's bytes with a new type (Reshape costs nothing);
a `SliceView`, one slice of another buffer chosen by a loop's counter at run time (a Loop's
or Scan's iteration reads its slice of a scan input and writes its slice of a scan output
in place).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..engine.types import Type

ALIGNMENT = 64


def align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


class Buffer:
    """Something an instruction reads or writes."""

    def __init__(self, name: str, type: Type):
        self.name = name
        self.type = type

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    def root(self) -> "Buffer":
        return self

    def __repr__(self):
        return f"<{type(self).__name__} %{self.name}: {self.type}>"


class WeightBuffer(Buffer):
    """A buffer in the constant or mutable region, at a fixed offset."""

    def __init__(self, name: str, type: Type, region: str, data: Optional[np.ndarray] = None):
        super().__init__(name, type)
        self.region = region              # "constant" | "mutable"
        self.data = data                  # constant data
        self.offset: int = -1
        self.io: Optional[str] = None     # "input" | "output" for mutable weights


class Activation(Buffer):
    """A buffer in the activation arena; its offset comes from the memory planner."""

    def __init__(self, name: str, type: Type):
        super().__init__(name, type)
        self.offset: int = -1


class TensorView(Buffer):
    """`base`'s bytes seen with another type of the same size."""

    def __init__(self, name: str, type: Type, base: Buffer):
        super().__init__(name, type)
        self.base = base

    def root(self) -> Buffer:
        b: Buffer = self
        while isinstance(b, TensorView):
            b = b.base
        return b


class SliceView(TensorView):
    """Slice `index` of `base` along its first axis, `index` read at run time from `counter`
    (an i64 buffer, a loop's iteration number): slice `counter`, or `length - 1 - counter`
    when `reverse`.  Its bytes start `slice_bytes * index` past its base's, so its place is
    known only while running: every pass that reasons over roots sees it as a use of the
    whole base (which it is, over a loop's iterations), and the backends add `dynamic_offset`
    to the root's address where they take an operand's address."""

    def __init__(self, name: str, base: Buffer, counter: Buffer, reverse: bool = False,
                 phase: Optional[int] = None):
        length = base.type.shape[0]
        super().__init__(name, base.type.with_shape(tuple(base.type.shape[1:])), base)
        self.counter, self.reverse, self.length = counter, reverse, length
        self.slice_bytes = self.type.nbytes
        # A loop's state kept in two alternating slots (`base` has two): slot
        # (counter + phase) % 2.  Phase 0 is the state an iteration reads, phase 1 the one
        # it writes; the next iteration's counter swaps them (irgen._Generator.loop).
        self.phase = phase
        assert phase is None or (length == 2 and not reverse)

    def index(self, counter_value: int) -> int:
        if self.phase is not None:
            return (counter_value + self.phase) % 2
        return self.length - 1 - counter_value if self.reverse else counter_value


def dynamic_views(buf: Optional[Buffer]) -> list:
    """The slice views between `buf` and its root (a buffer whose place is fixed: none)."""
    out = []
    while isinstance(buf, TensorView):
        if isinstance(buf, SliceView):
            out.append(buf)
        buf = buf.base
    return out


def slot(buf) -> tuple:
    """What `buf` names while one instruction runs: its root, and which of the two slots of
    an alternating loop state (SliceView with a phase) it is, if any.  The two slots of one
    state are disjoint at any time (the same counter places both), so passes that track
    values by their memory (copy elimination, stacks keeping values in registers) key them
    by slot, not by root: an iteration reads the old slot and writes the new one."""
    buf = getattr(buf, "buffer", buf)          # a stack's gather read: its input's
    phase = next((v.phase for v in dynamic_views(buf) if v.phase is not None), None)
    return (id(buf.root()), phase)


def disjoint(a: Buffer, b: Buffer) -> bool:
    """Do `a` and `b` have the same root but never share a byte (the two slots of an
    alternating loop state)?"""
    va, vb = (next((v for v in dynamic_views(x) if v.phase is not None), None) for x in (a, b))
    return (va is not None and vb is not None and va.base is vb.base and va.counter is vb.counter
            and va.phase != vb.phase)


class Instr:
    """One instruction: a kind (a primitive's name, or one of the memory kinds below) and
    operands as (role, buffer) pairs; variadic operands give several `@in` entries.

    Control flow is structured and written inline, as WebAssembly writes it: `cond @in %c`,
    the then-branch's instructions, `else`, the else-branch's, `endcond`.  Only `cond` has an
    operand (the one-byte condition it reads).  Every pass that reasons over the list in
    order stays right: a call runs the instructions of one branch, a subsequence of the
    list, so two buffers whose lifetimes in the list do not overlap do not overlap in any
    run, and the buffers of the two branches, alive at disjoint times, share the arena.

    A loop is `loop @in %trip, @inout %iter, @in %cond`, its body, and `endloop` with the
    same operands: `iter` counts from 0, and the body runs while `iter < trip` (no trip
    count: always) and `cond` holds; the body's last instructions copy its new state and
    condition over the old.  What a run repeats breaks the in-order argument for values
    that live across iterations; `control.loop_lifetimes` widens theirs to the loop.  The
    body reads and writes the slices of scanned and stacked tensors through `SliceView`s
    of them, whose place the counter decides."""
    ALLOC, DEALLOC, VIEW, COPY = "allocactivation", "deallocactivation", "tensorview", "copy"
    COND, ELSE, ENDCOND = "cond", "else", "endcond"
    LOOP, ENDLOOP = "loop", "endloop"
    CONTROL = (COND, ELSE, ENDCOND, LOOP, ENDLOOP)

    def __init__(self, kind: str, operands: list, node=None, groups: tuple = ()):
        self.kind = kind
        self.operands: list[tuple[str, Optional[Buffer]]] = operands
        self.node = node                  # the graph node: attributes, result types, provenance
        self.groups = groups              # per declared operand: how many operands it spans
        self.plan = None                  # what the backend's LIR passes decided for it (its
        #                                   kernel's strategy, packed layouts...; printed by dump)

    def reads(self):
        return [b for r, b in self.operands if b is not None and r in ("in", "inout")]

    def writes(self):
        return [b for r, b in self.operands if b is not None and r in ("out", "inout")]

    def buffers(self):
        return [b for _, b in self.operands if b is not None]

    def replace(self, old: Buffer, new: Buffer) -> None:
        self.operands = [(r, new if b is old else b) for r, b in self.operands]

    def __repr__(self):
        return f"<Instr {self.kind} " + ", ".join(f"@{r} %{b.name if b else '_'}" for r, b in self.operands) + ">"


class Program:
    """A LIR function: weights, activations and the instruction list, plus the memory plan."""

    def __init__(self, name: str):
        self.name = name
        self.weights: list[WeightBuffer] = []
        self.activations: list[Activation] = []
        self.instrs: list[Instr] = []
        self.inputs: dict[str, WeightBuffer] = {}
        self.outputs: dict[str, WeightBuffer] = {}
        self.region_sizes = {"constant": 0, "mutable": 0, "activation": 0}
        self.strategy = "?"               # the allocator order that planned the arena
        self.scratch_bytes = 0            # of the activation region, at its end: the backend
        #                                   kernels' scratch memory (no activation lives there)
        self.plan = None                  # what the backend's LIR passes decided for the whole
        #                                   program (steps, fusion, scratch...; printed by dump)

    def mutable_weights(self):
        return [w for w in self.weights if w.region == "mutable"]

    def constant_weights(self):
        return [w for w in self.weights if w.region == "constant"]

    def place_weights(self) -> None:
        """Fixed offsets in the constant and mutable regions, 64-byte aligned."""
        for region in ("constant", "mutable"):
            offset = 0
            for w in self.weights:
                if w.region == region:
                    w.offset = offset
                    offset = align(offset + max(w.nbytes, 1))
            self.region_sizes[region] = offset
