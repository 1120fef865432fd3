"""Row fusion: consecutive steps that all work row by row over the same rows run as one
loop over blocks of rows, each step in turn on the block, so that a row's values stay in
L1 from one step to the next instead of streaming the whole tensor through L2 once per
step.

Softmax lowers to a row maximum, a stack (subtract, exp), a row sum, a per-row reciprocal
and a stack (multiply): five passes over [rows, n].  Over 4x128x128 (256 KB a tensor) each
pass costs a few microseconds of L2 bandwidth; row by row, in blocks of a few KB, they
touch L2 once.

A step can be a member when it splits into rows: a kernel that registers ROWS (the row
reductions) and honours a `RowBlock` share, or a stack whose every operand's index map
factors over [rows, n] (or [rows] for a per-row stack).  Every buffer a member writes must be
addressed by row in every member that touches it (row r of it only while working on row
r): then running the steps block by block does, for each row, what running them one after
another did, in the same order.  Each row is computed by the same code whatever block or
task it falls in, so results do not depend on the block size or the threads.
"""
from __future__ import annotations

import math
from typing import Optional

from llvmlite import ir

from .kernels import ROWS
from .llvmutil import for_range, i64
from .parallel import Split, Work
from .stacking import Step, has_gathers, stack_operands

# A block's bytes (every full-row buffer a group touches, for its rows): well inside L1
# (softmax 4x128x128 ran about 2 us faster with 4 KB blocks than with 16 KB ones).
BLOCK_BYTES = 4 * 1024
# Only groups over at least this many elements: below, the loops' overhead is not repaid.
MIN_ELEMENTS = 4096


class RowBlock(Split):
    """A share of the rows [lo, hi) of a row group, as the Split its members' kernels read:
    `range(extent)` gives the block's rows of a per-row loop (extent == rows) or its elements
    of a flat loop over the rows' elements (extent == rows * n)."""

    def __init__(self, lo: ir.Value, hi: ir.Value, rows: int, n: int):
        super().__init__(None, 2)          # never `whole`: kernels must ask for their range
        self.lo, self.hi, self.rows, self.n = lo, hi, rows, n

    def range(self, b: ir.IRBuilder, extent: int, align: int = 1):
        if extent == self.rows:
            return self.lo, self.hi
        if extent == self.rows * self.n:
            return b.mul(self.lo, i64(self.n)), b.mul(self.hi, i64(self.n))
        raise ValueError(f"a row block of {self.rows} rows of {self.n} asked for a range of {extent}")

    def is_last(self, b: ir.IRBuilder) -> ir.Value:
        return b.icmp_signed("==", self.hi, i64(self.rows))


def _factor(shape, strides, space) -> Optional[tuple]:
    """Strides of an index map over `shape` in the space [rows, n] (or [rows]), or None if
    it does not factor along the space's boundary."""
    from .epilogue import _group_strides
    return _group_strides(shape, strides, space)


def stack_rows(step: Step, prog, life, rows: int, n: int) -> Optional[tuple]:
    """A stack's operands and their index maps over [rows, n] (or [rows, 1] for a per-row
    stack): (externals, stored, maps), or None if the stack does not split into rows."""
    if has_gathers(step):
        return None
    size = math.prod(step.shape)
    if size == rows * n and n > 1:
        space = (rows, n)
    elif size == rows:
        space = (rows,)
    else:
        return None
    externals, stored, maps = stack_operands(step, prog, life)
    out = []
    for m in maps:
        f = _factor(step.shape, m, space)
        if f is None:
            return None
        out.append(tuple(f) if len(space) == 2 else (f[0], 0))
    return externals, stored, out


def _accesses(step: Step, prog, life, rows: int, n: int, gemm_shape) -> Optional[list]:
    """(buffer, row stride, element stride, written) for every buffer a member touches, or
    None if the step cannot be a member for these rows."""
    if step.epilogue is not None or step.scratch:
        return None
    if step.stacked:
        got = stack_rows(step, prog, life, rows, n)
        if got is None:
            return None
        externals, stored, maps = got
        return ([(x, m[0], m[1], False) for x, m in zip(externals, maps)]
                + [(x, m[0], m[1], True) for x, m in zip(stored, maps[len(externals):])])
    ins = step.instrs[0]
    fn = ROWS.get(ins.kind)
    if fn is None or ins.node is None or fn(ins, gemm_shape) != (rows, n):
        return None
    (y,), (x,) = ins.writes(), ins.reads()
    return [(x, n, 1, False), (y, 1, 0, True)]


def _row_kernel(step: Step, gemm_shape) -> Optional[tuple]:
    if step.stacked or step.epilogue is not None or step.scratch:
        return None
    ins = step.instrs[0]
    fn = ROWS.get(ins.kind)
    return fn(ins, gemm_shape) if fn is not None and ins.node is not None else None


def _consistent(accesses: list, rows: int) -> bool:
    """Every buffer written in the group is addressed by row wherever the group touches it."""
    written = {id(b.root()) for b, _, _, w in accesses if w}
    for b, rs, es, _ in accesses:
        if id(b.root()) not in written:
            continue
        size = b.root().type.size
        if size % rows:
            return False
        pitch = size // rows
        if rs != pitch or es not in (0, 1):
            return False
    return True


def fuse_rows(steps: list[Step], prog, life, gemm_shape) -> list[Step]:
    """Runs of steps that split into the same rows, at least one a row kernel, become one
    step with `members` (the steps, in order)."""
    out: list[Step] = []
    i = 0
    while i < len(steps):
        space = _row_kernel(steps[i], gemm_shape)
        if space is None:
            out.append(steps[i])
            i += 1
            continue
        rows, n = space
        members, accesses = [steps[i]], list(_accesses(steps[i], prog, life, rows, n, gemm_shape))
        j = i + 1
        while j < len(steps):
            acc = _accesses(steps[j], prog, life, rows, n, gemm_shape)
            if acc is None or not _consistent(accesses + acc, rows):
                break
            members.append(steps[j])
            accesses += acc
            j += 1
        # Stacks before the row kernel that split into its rows join too.
        while out and i > 0:
            acc = _accesses(out[-1], prog, life, rows, n, gemm_shape) if out[-1] is steps[i - 1] else None
            if acc is None or not _consistent(acc + accesses, rows):
                break
            members.insert(0, out.pop())
            accesses = acc + accesses
            i -= 1
        if len(members) < 2 or rows * n < MIN_ELEMENTS:
            out.extend(members)
            i = j
            continue
        full = {id(b.root()): b.root().nbytes // rows for b, _, _, _ in accesses if b.root().type.size >= rows}
        per_row = max(1, sum(full.values()))
        block = max(1, min(rows, BLOCK_BYTES // per_row))
        group = Step([ins for m in members for ins in m.instrs], False)
        group.members = members
        group.rows = (rows, n, block)
        out.append(group)
        i = j
    return out


def group_work(step: Step) -> Work:
    rows, n, block = step.rows
    return Work(-(-rows // block), elements=rows * n * len(step.instrs))


def emit_group(builder, b: ir.IRBuilder, step: Step, ptr: dict, split: Split) -> None:
    """The members of a row group, block by block: this task's share of the blocks."""
    rows, n, block = step.rows
    blocks = -(-rows // block)
    lo, hi = split.range(b, blocks)
    with for_range(b, hi, start=lo, name="rowblk") as k:
        r0 = b.mul(k, i64(block))
        r1 = b.add(r0, i64(block))
        r1 = b.select(b.icmp_signed("<", r1, i64(rows)), r1, i64(rows))
        share = RowBlock(r0, r1, rows, n)
        for m in step.members:
            if m.stacked:
                builder._emit_stack_rows(b, m, ptr, share)
            else:
                builder._emit_single(b, m.instrs[0], ptr, share)
