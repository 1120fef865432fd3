"""Long dependency chains cut into passes over a block, where the spec says `handoff`.

A transcendental is one long chain per element (exp: a clamp, a rounding, a reduction, a
polynomial, a scaling; erf: a division and two polynomials before it).  Out-of-order cores
overlap the chains of successive elements only as far as their schedulers reach: an
instruction waits there until its operands are ready, and the scheduler is smaller than
the reorder window.  With 8-lane vectors a scheduler holds half the elements 16-lane
vectors give it, so AVX2 code ran such chains at 1.6-1.9x the cycles of AVX-512 code on
the same Zen 4 core, whose vector pipes do the same work per element either way.

Cut at its `handoff(x)`s, a chain runs as one loop per segment over a block of elements in
L1 (loops.blocked_loops): each computes its part of the chain, loading the values earlier
segments stored and storing those later ones read.  Each loop's instructions wait less.

How a pass is emitted: every pass emits the group's whole expression again, in the same
order (emission is deterministic), numbering the values as they are made.  The first pass
records where the cuts fall in that numbering and which values a later segment reads
from an earlier one; a later pass replaces those by loads from the block's arrays.  What
a pass does not need is dead code LLVM removes: the first pass keeps what leads to the
values it stores, a later pass what follows the values it loads.
"""
from __future__ import annotations

from llvmlite import ir

from .llvmutil import I1, i64, target_has
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

    @property
    def passes(self) -> int:
        return 1 + len(self.cuts)

    def array(self, number: int, llvm_type) -> ir.Value:
        """The block's array for value `number` (made on first use): it crosses a cut."""
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
        self.b, self.j, self.group, self.segment = b, j, cuts, segment
        self.recording = segment == 0
        self._numbers: dict[int, int] = {}     # id(value) -> value number, in this pass
        self._values: list = []                # this pass's values by number (kept alive)

    def cut(self) -> None:
        if self.recording:
            self.group.cuts.append(len(self._values))

    def number(self, value) -> int | None:
        return self._numbers.get(id(value))

    def track(self, value, operands):
        if not isinstance(value, Value) or id(value) in self._numbers:
            return value
        n = len(self._values)
        group = self.group
        if self.recording:
            # A value an operation of a later segment reads crosses the cut between them
            # (constants are rebuilt wherever they are used).
            here = len(group.cuts)
            group.segment_of.append(here)
            for v in operands:
                k = self._numbers.get(id(v))
                if k is not None and group.segment_of[k] < here and not isinstance(v.v, ir.Constant):
                    group.array(k, v.v.type)
        elif n in group.crossing and group.segment_of[n] < self.segment:
            value = Value(self._load(group.crossing[n], value.v.type), value.dtype, value.range,
                          value.nan_free)
        self._numbers[id(value)] = n
        self._values.append(value)
        return value

    def _load(self, array, llvm_type):
        v = self.b.load(self.b.gep(array, [i64(0), self.j]))
        return self.b.icmp_signed("<", v, ir.Constant(_MASK, 0)) if llvm_type == I1 else v

    def finish(self) -> None:
        """After the group's expression: a first pass that met fewer cuts than a chain needs
        to be cut is the only pass; any pass stores its values a later segment reads."""
        group = self.group
        if self.recording and len(group.cuts) < group.needed:
            group.cuts.clear()
            group.segment_of = [0] * len(group.segment_of)
            group.crossing.clear()           # its arrays go unused: LLVM drops them
        for n, array in group.crossing.items():
            if group.segment_of[n] == self.segment:
                v = self._values[n].v
                if v.type == I1:
                    v = self.b.sext(v, _MASK)
                self.b.store(v, self.b.gep(array, [i64(0), self.j]))
