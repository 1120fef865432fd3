"""Intra-op parallelism: how a step's work is shared among the threads of a pool.

A step that is worth splitting becomes `parts` tasks.  Its function takes the task's index
as a last argument, and its kernel computes only its share of the outermost loop it
declares splittable (`Split.range`); the entry point hands the tasks to the pool's
`parallel_for` (threads.py for the JIT, the linking program's for a bundle).  The split is
decided here, at compile time, from the static shapes.  A share is a range of whole output
elements (rows, channels, tiles, panels): every element is computed by the same code in the
same order whichever task computes it, so results are identical bit for bit for any number
of threads.

Kernels that can split register `PARALLEL[kind] = fn(node, gemm_shape) -> Work`: how many
independent items their outermost loop has and what the whole step costs.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from llvmlite import ir

from .llvmutil import I64, i64

# A parallel_for round costs a few microseconds (waking workers, claiming, waiting for the
# last): a step is split only when each share keeps a core busy well beyond that.
MIN_FLOPS_PER_PART = 2_000_000          # ~10 us of FMAs at 100+ GFLOPS
MIN_ELEMENTS_PER_PART = 16_384          # ~10 us of a short elementwise stack
FLAT_ALIGN = 64                         # a flat loop's shares start on whole vector groups


class Work:
    """What a kernel's splittable loop offers: `items` independent iterations, and the
    step's cost in floating-point operations (or elements, for memory-bound kernels)."""

    def __init__(self, items: int, flops: float = 0.0, elements: float = 0.0):
        self.items, self.flops, self.elements = items, flops, elements

    def parts(self, threads: int) -> int:
        if threads <= 1 or self.items <= 1:
            return 1
        by_cost = max(int(self.flops // MIN_FLOPS_PER_PART), int(self.elements // MIN_ELEMENTS_PER_PART))
        return max(1, min(threads, self.items, by_cost))


PARALLEL: dict[str, Callable] = {}


def parallel(*kinds):
    """Register how the kernels of `kinds` split (see Work)."""
    def register(fn):
        for kind in kinds:
            PARALLEL[kind] = fn
        return fn
    return register


class Split:
    """The share of a step one task computes: task `index` (an i64 value of the step
    function) of `parts`.  The whole step is Split(None, 1)."""

    def __init__(self, index: Optional[ir.Value], parts: int):
        self.index, self.parts = index, parts

    @property
    def whole(self) -> bool:
        return self.parts == 1

    def chunk(self, extent: int, align: int = 1) -> int:
        per = -(-extent // self.parts)
        return -(-per // align) * align

    def range(self, b: ir.IRBuilder, extent: int, align: int = 1, short_first: bool = False):
        """(lo, hi) of this task's share of [0, extent): consecutive shares of
        ceil(extent / parts) items rounded up to a multiple of `align` (the last may be
        shorter or empty; `short_first`: the first instead, where the last item is only
        partly work, which the task with the fewest items then takes: with `align` 1 only,
        since the short share's start is no multiple of it)."""
        assert align == 1 or not short_first
        if self.whole:
            return i64(0), i64(extent)
        chunk = self.chunk(extent, align)
        if short_first:
            # Shares counted back from the end: task i ends (parts - 1 - i) chunks before it.
            hi = b.sub(i64(extent), b.mul(b.sub(i64(self.parts - 1), self.index), i64(chunk)))
            hi = b.select(b.icmp_signed(">", hi, i64(0)), hi, i64(0))
            lo = b.sub(hi, i64(chunk))
            return b.select(b.icmp_signed(">", lo, i64(0)), lo, i64(0)), hi
        lo = b.mul(self.index, i64(chunk))
        lo = b.select(b.icmp_signed("<", lo, i64(extent)), lo, i64(extent))
        hi = b.add(lo, i64(chunk))
        hi = b.select(b.icmp_signed("<", hi, i64(extent)), hi, i64(extent))
        return lo, hi

    def blocks_or_panels(self, b: ir.IRBuilder, blocks: int, panels: int, pixels: bool,
                         ragged: tuple[bool, bool] = (False, False)):
        """((lo, hi) of the blocks, (lo, hi) of the panels) this task computes of a product
        of `blocks` x `panels` tiles: every block and its share of the panels where the
        product shares out its `pixels`, else its share of the blocks and every panel.
        `ragged`: whether the last block, and the last panel, computes less than the others
        (range's short_first).  ResNet-50's int8 1024 -> 256 1x1 at 14 x 14 at two threads,
        25 blocks of 8 rows shared out 13 and 12 (the last of 4 rows): tasks 105 and 89 us;
        12 and 13: 100 and 94."""
        if pixels:
            return (i64(0), i64(blocks)), self.range(b, panels, short_first=ragged[1])
        return self.range(b, blocks, short_first=ragged[0]), (i64(0), i64(panels))

    def is_last(self, b: ir.IRBuilder) -> ir.Value:
        """An i1: this task takes what does not divide evenly (a loop's ragged tail)."""
        if self.whole:
            return ir.Constant(ir.IntType(1), 1)
        return b.icmp_signed("==", self.index, i64(self.parts - 1))


WHOLE = Split(None, 1)


def for_claimed(b: ir.IRBuilder, words, total: int, split: Split, body) -> None:
    """body(lo, hi) (i64 values) for each run of [0, total) this task claims, until none is
    left.  Every task has a home range, its share of a fixed split (Split.range), and a
    claim word of its own in `words` (i64s, zeroed before the round: plan.claim_bytes): the
    items taken from the front of the range in its low 32 bits, from the back in its high.
    A task claims half of what is left of its own range from the front, again and again,
    then half of what is left of each other task's from the back: where the cores run alike
    each task computes (nearly) its own share, the data it writes where the next step's
    fixed share of it reads (claims from one counter for all, run after run, gave each task
    every other run: the next step read half its operands from the other core's cache); a
    task on a core running slower than the others (a VM's vCPU sharing its core) takes
    less of the work.  Which task computes an item never changes what it computes."""
    parts = split.parts
    fn = b.function
    with b.goto_entry_block():                                  # not on the stack once a loop
        step = b.alloca(I64, name="claim.range")
    b.store(i64(0), step)
    head, look, take, run, done = (fn.append_basic_block(n) for n in
                                   ("claim", "claim.look", "claim.take", "claimed", "claims.done"))
    b.branch(head)
    b.position_at_end(head)
    k = b.load(step)
    b.cbranch(b.icmp_signed("<", k, i64(parts)), look, done)
    b.position_at_end(look)
    r = b.urem(b.add(split.index, k), i64(parts))             # the range: own first
    word = b.gep(words, [r])
    start, end = Split(r, parts).range(b, total)
    seen = b.load_atomic(word, "monotonic", 8)
    lo = b.add(start, b.and_(seen, i64(0xFFFFFFFF)))
    hi = b.sub(end, b.lshr(seen, i64(32)))
    left = b.sub(hi, lo)
    with b.if_then(b.icmp_signed("<=", left, i64(0))):
        b.store(b.add(k, i64(1)), step)                         # this range is done
        b.branch(head)
    b.branch(take)
    b.position_at_end(take)
    chunk = b.sdiv(b.add(left, i64(1)), i64(2))
    own = b.icmp_signed("==", k, i64(0))
    first = b.select(own, lo, b.sub(hi, chunk))
    claimed = b.add(seen, b.select(own, chunk, b.shl(chunk, i64(32))))
    won = b.extract_value(b.cmpxchg(word, seen, claimed, "monotonic", "monotonic"), 1)
    b.cbranch(won, run, head)
    b.position_at_end(run)
    body(first, b.add(first, chunk))
    b.branch(head)
    b.position_at_end(done)


def splits_blocks(blocks: int, split: Split) -> bool:
    """Whether a split product shares out its blocks of filters (or of features, in the lanes)
    rather than its panels of pixels (or blocks of rows): when the blocks divide among the
    tasks evenly or are many.  MobileNetV2's int8 144 -> 24 1x1 at
    56x56 was three blocks of 8 filters, and 576 -> 96 at 14x14 three tiles of 32 features:
    one task computed two, the other one (0.116 / 0.058 ms, 0.128 / 0.062)."""
    parts = split.parts
    return split.whole or (blocks >= parts and (blocks % parts == 0 or blocks >= 4 * parts))


# A product that could share out its filters or its pixels shares out pixels where the
# activations it reads are at least this share of its weights (shares_pixels).
PIXELS_MIN_READ_SHARE = 0.3


def shares_pixels(read_bytes: int, weight_bytes: int) -> bool:
    """Whether a split product whose filters and pixels both share out evenly takes pixels.
    Sharing out filters, every task reads all of the activations (its plane, or a Winograd
    V), half of them written by the other task; sharing out pixels, every task reads all of
    the weights, which no task writes.  Where the two threads' cores share no L3 (a VM whose
    vCPUs the host places on two CCXs, a cache line's round trip 400-500 ns instead of
    75-120), each such byte written by the other core costs several of memory's, and
    ResNet-50 int8 at two threads took 23.3 ms in place of 20.0.  Measured there, per layer,
    pixels won from activations at 0.34x the weights up (256 -> 256 3x3 at stride 2 from
    28x28; 128 -> 128 @28 by Winograd, its V 0.44x its U: 51 us of 443) and lost from 0.19x
    down (256 -> 1024 1x1 @14: 37 us of 290)."""
    return read_bytes >= PIXELS_MIN_READ_SHARE * weight_bytes


def shares(items: int, unit: int, parts: int, total: int) -> list[tuple[int, int]]:
    """What each task of `parts` computes when a kernel takes Split.range(items) in units of
    `unit` (the last task to `total`): [(lo, hi)] per task."""
    chunk = -(-items // parts)
    return [(min(p * chunk, items) * unit, total if p == parts - 1 else min((p + 1) * chunk, items) * unit)
            for p in range(parts)]


def flat_parts(elements: int, threads: int) -> int:
    return Work(math.ceil(elements / FLAT_ALIGN), elements=elements).parts(threads)
