"""Long dependency chains cut into passes over a block, where the spec says `handoff`.

A transcendental is one long chain per element (exp: a clamp, a rounding, a reduction, a
polynomial, a scaling; erf: a division and two polynomials before it).  Out-of-order cores
overlap the chains of successive elements only as far as their schedulers reach: an
instruction waits there until its operands are ready, and the scheduler is smaller than
the reorder window.  With 8-lane vectors a scheduler holds half the elements 16-lane
vectors give it, so AVX2 code ran such chains at 1.6-1.9x the cycles of AVX-512 code on
the same Zen 4 core, whose vector pipes do the same work per element either way.

Cut at a `handoff(x)`, a chain runs as two loops over a block of elements in L1 (loops.
blocked_loops): the first computes up to the cut and stores every value the rest reads;
the second loads them and finishes.  Each loop's instructions wait half as long.

How a pass is emitted: every pass emits the group's whole expression again, in the same
order (emission is deterministic), numbering the values as they are made.  The first pass
records where the cuts fall in that numbering and which values a later segment reads
from an earlier one; a later pass replaces those by loads from the block's arrays.  What
a pass does not need is dead code LLVM removes: the first pass keeps what leads to the
values it stores, a later pass what follows the values it loads.
"""
from __future__ import annotations

from llvmlite import ir

from .llvmutil import I1, target_has
from .values import Value

# A boolean waits as a 32-bit lane mask (sign-extended: all ones or zero), as wide as the
# floats around it: stored and loaded as it is, and a select reads its sign bit directly,
# where bytes would need packing and unpacking shuffles.
_MASK = ir.IntType(32)


def handoffs_to_cut(module) -> int:
    """How many `handoff`s a group's chain must hold to be cut at them.  One for 8-lane
    vectors.  Two for 16-lane ones, which put twice the elements in flight already: there
    (Zen 4) exp cut once ran 12% slower, a sigmoid 8%, tanh 20%, while erf, cut twice
    (after its division and in its exp), ran 9% faster and tiny BERT's GELU 15%."""
    return 2 if target_has(module, "avx512f") else 1


class GroupCuts:
    """What the first pass over a group found: its cuts and the values crossing them, with
    the per-block arrays those values wait in."""

    def __init__(self, entry: ir.IRBuilder, block: int, needed: int = 1):
        self._entry, self._block = entry, block
        self.needed = needed               # cuts a chain must have to be cut (handoffs_to_cut)
        self.cuts: list[int] = []          # value numbers at which a segment starts
        self.segment_of: list[int] = []    # value number -> its segment
        self.crossing: dict[int, object] = {}   # value number -> its array in the block
        self.values: list = []             # the first pass's values, by number

    @property
    def passes(self) -> int:
        return 1 + len(self.cuts)

    def array(self, number: int, llvm_type) -> ir.Value:
        slot = self.crossing.get(number)
        if slot is None:
            memory_type = _MASK if llvm_type == I1 else llvm_type
            # In the function's entry block, so that the array is static; aligned to a cache
            # line, as the arrays of stacking's groups are.
            with self._entry.goto_entry_block():
                self._entry.position_at_start(self._entry.block)
                slot = self._entry.alloca(ir.ArrayType(memory_type, self._block), name="cut")
            slot.align = 64
            self.crossing[number] = slot
        return slot


class PassEmission:
    """One pass over a group's expression: `ScalarEmitter` calls `track` on every value it
    makes and `cut` at every `handoff`."""

    def __init__(self, b: ir.IRBuilder, j, cuts: GroupCuts, segment: int):
        self.b, self.j, self.plan, self.segment = b, j, cuts, segment
        self.recording = segment == 0
        self._numbers: dict[int, int] = {}     # id(value) -> value number, in this pass
        self._values: list = []                # this pass's values by number (kept alive)

    def cut(self) -> None:
        if self.recording:
            self.plan.cuts.append(len(self._values))

    def number(self, value) -> int | None:
        return self._numbers.get(id(value))

    def track(self, value, operands):
        if not isinstance(value, Value) or id(value) in self._numbers:
            return value
        n = len(self._values)
        plan = self.plan
        if self.recording:
            here = len(plan.cuts)
            plan.segment_of.append(here)
            for v in operands:
                k = self._numbers.get(id(v))
                if k is not None and plan.segment_of[k] < here and not isinstance(v.v, ir.Constant):
                    plan.array(k, v.v.type)
            plan.values.append(value)
        elif n in plan.crossing and plan.segment_of[n] < self.segment:
            value = Value(self._load(plan.crossing[n], value.v.type), value.dtype, value.range)
        self._numbers[id(value)] = n
        self._values.append(value)
        return value

    def value(self, number: int):
        return self._values[number]

    def _load(self, array, llvm_type):
        v = self.b.load(self.b.gep(array, [ir.Constant(ir.IntType(64), 0), self.j]))
        return self.b.icmp_signed("<", v, ir.Constant(_MASK, 0)) if llvm_type == I1 else v

    def finish(self) -> None:
        """After the group's expression: a first pass that met fewer cuts than a chain needs
        to be cut is the only pass; any pass stores its values a later segment reads."""
        plan = self.plan
        if self.recording and len(plan.cuts) < plan.needed:
            plan.cuts.clear()
            plan.segment_of = [0] * len(plan.segment_of)
            plan.crossing.clear()            # its arrays go unused: LLVM drops them
        for n, array in plan.crossing.items():
            if plan.segment_of[n] == self.segment:
                v = self._values[n].v
                if v.type == I1:
                    v = self.b.sext(v, _MASK)
                self.b.store(v, self.b.gep(array, [ir.Constant(ir.IntType(64), 0), self.j]))
