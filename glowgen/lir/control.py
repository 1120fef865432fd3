"""The structure of the control flow written inline in a LIR instruction list (ir.Instr):
regions `cond` ... `else` ... `endcond` and `loop` ... `endloop`, their nesting, where their
markers jump, and what a loop does to lifetimes."""
from __future__ import annotations

from typing import Optional

import attrs

from ..errors import GlowgenError
from .ir import Instr


@attrs.frozen
class Region:
    kind: str                 # Instr.COND or Instr.LOOP
    start: int                # index of its `cond` / `loop`
    end: int                  # of its `endcond` / `endloop`
    depth: int                # 0 for a region no other region holds
    orelse: Optional[int] = None   # of a conditional's `else`


def regions(instrs) -> list[Region]:
    """Every region of `instrs` (instructions, or anything with a `kind`), in order of its
    start; a malformed nesting is an internal error."""
    found, open_ = [], []
    for i, ins in enumerate(instrs):
        kind = getattr(ins, "kind", None)
        if kind in (Instr.COND, Instr.LOOP):
            open_.append([kind, i, None])
        elif kind == Instr.ELSE:
            if not open_ or open_[-1][0] != Instr.COND or open_[-1][2] is not None:
                raise GlowgenError(f"internal error: LIR `else` at {i} outside a `cond`")
            open_[-1][2] = i
        elif kind in (Instr.ENDCOND, Instr.ENDLOOP):
            want = Instr.COND if kind == Instr.ENDCOND else Instr.LOOP
            if not open_ or open_[-1][0] != want or (want == Instr.COND and open_[-1][2] is None):
                raise GlowgenError(f"internal error: LIR `{kind}` at {i} closes no `{want}`")
            k, s, e = open_.pop()
            found.append(Region(k, s, i, len(open_), e))
    if open_:
        raise GlowgenError(f"internal error: LIR `{open_[-1][0]}` at {open_[-1][1]} is never closed")
    return sorted(found, key=lambda r: r.start)


def jumps(instrs) -> dict[int, int]:
    """Where control goes from a marker when it does not fall through: from a `cond` whose
    condition is false, to just after its `else`; from an `else` (reached at the end of the
    then-branch), to just after its `endcond`; from a `loop` that runs no iteration, to just
    after its `endloop`; from an `endloop` that goes round again, to just after its `loop`."""
    out = {}
    for r in regions(instrs):
        if r.kind == Instr.COND:
            out[r.start] = r.orelse + 1
            out[r.orelse] = r.end + 1
        else:
            out[r.start] = r.end + 1
            out[r.end] = r.start + 1
    return out


def loop_lifetimes(spans: dict, instrs) -> None:
    """Lifetimes over a list with loops, in place (`spans`: key -> [first, last] index).

    A run goes round a loop's body again, so a buffer used both inside a loop and outside
    it (its state, the values it reads from before it) holds a value every iteration
    needs: it is live over the whole loop, not only to its last use in the list.  A buffer
    used only inside the body lives within one iteration.  Inner loops first, so a buffer
    widened to an inner loop is widened again to the loop around it."""
    loops = loop_regions(instrs)
    if not loops:
        return
    for span in spans.values():
        span[0], span[1] = widened(span, loops)


def loop_regions(instrs) -> list[Region]:
    """The loops of `instrs`, inner loops first (the order `widened` takes them in)."""
    return sorted((r for r in regions(instrs) if r.kind == Instr.LOOP), key=lambda r: -r.depth)


def widened(span, loops: list[Region]) -> tuple[int, int]:
    """A buffer's [first, last] use widened over the loops (loop_regions) it is used both
    inside and outside of (loop_lifetimes)."""
    s, e = span
    for r in loops:
        if s <= r.end and e >= r.start and (s < r.start or e > r.end):
            s, e = min(s, r.start), max(e, r.end)
    return s, e
