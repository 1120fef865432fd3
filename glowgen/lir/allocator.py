"""Static memory allocation of the activation arena.

Each buffer has a size and a lifetime [start, end] (instruction indices).  Two buffers whose
lifetimes overlap must not overlap in memory.  Finding the smallest arena is NP-hard, so
several greedy orders are tried and the smallest result is kept; the max-live bound (the
largest total size of buffers live at one time) says how far from optimal that is.
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

import attrs

from .ir import ALIGNMENT, align


@attrs.frozen
class Block:
    key: Hashable
    size: int
    start: int
    end: int

    def conflicts(self, other: "Block") -> bool:
        return self.start <= other.end and other.start <= self.end


@attrs.frozen
class Plan:
    offsets: dict
    size: int
    strategy: str


def max_live(blocks: Sequence[Block]) -> int:
    """The largest total (aligned) size of blocks live at the same instruction."""
    events = []
    for b in blocks:
        events.append((b.start, 0, align(b.size)))
        events.append((b.end, 1, -align(b.size)))
    live = peak = 0
    for _, _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


def _place(order: Sequence[Block]) -> tuple[dict, int]:
    """Put each block at the lowest aligned offset free for its whole lifetime."""
    placed: list[tuple[Block, int]] = []
    offsets, top = {}, 0
    for b in order:
        size = align(max(b.size, 1))
        busy = sorted((off, off + align(max(p.size, 1))) for p, off in placed if p.conflicts(b))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        offsets[b.key] = offset
        placed.append((b, offset))
        top = max(top, offset + size)
    return offsets, top


STRATEGIES: dict[str, Callable[[Sequence[Block]], list]] = {
    # Glow's order: as the program allocates.
    "in_order": lambda bs: sorted(bs, key=lambda b: (b.start, -b.size)),
    # Big blocks first leave small gaps for small blocks (TFLite's greedy by size).
    "by_size": lambda bs: sorted(bs, key=lambda b: (-b.size, b.start)),
    # Long-lived big blocks first: they constrain everything they overlap.
    "by_area": lambda bs: sorted(bs, key=lambda b: (-(b.end - b.start + 1) * b.size, b.start)),
    "by_lifetime": lambda bs: sorted(bs, key=lambda b: (-(b.end - b.start), -b.size, b.start)),
}


def plan(blocks: Sequence[Block]) -> Plan:
    """Try every strategy, keep the smallest arena (ties: the first strategy)."""
    best = None
    for name, order in STRATEGIES.items():
        offsets, size = _place(order(blocks))
        if best is None or size < best.size:
            best = Plan(offsets, size, name)
    return best or Plan({}, 0, "empty")


def check_plan(blocks: Sequence[Block], offsets: dict) -> None:
    """Raise AssertionError if two live blocks overlap or an offset is misaligned."""
    for b in blocks:
        assert offsets[b.key] % ALIGNMENT == 0, f"{b.key}: offset {offsets[b.key]} not aligned"
    for i, a in enumerate(blocks):
        for b in blocks[i + 1:]:
            if a.conflicts(b):
                oa, ob = offsets[a.key], offsets[b.key]
                assert oa + a.size <= ob or ob + b.size <= oa, f"{a.key} and {b.key} overlap"
