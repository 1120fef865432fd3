"""The structure of the control flow written inline in a LIR instruction list (ir.Instr:
`cond` ... `else` ... `endcond`): where each region's parts are, and its nesting."""
from __future__ import annotations

import attrs

from ..errors import GlowgenError
from .ir import Instr


@attrs.frozen
class Region:
    cond: int                 # index of its `cond`
    orelse: int               # of its `else`
    end: int                  # of its `endcond`
    depth: int                # 0 for a region no other region holds


def regions(instrs) -> list[Region]:
    """Every region of `instrs` (a list of instructions, or of anything with a `kind`), in
    order of its `cond`; a malformed nesting is an internal error."""
    found, open_ = [], []
    for i, ins in enumerate(instrs):
        kind = getattr(ins, "kind", None)
        if kind == Instr.COND:
            open_.append([i, None])
        elif kind == Instr.ELSE:
            if not open_ or open_[-1][1] is not None:
                raise GlowgenError(f"internal error: LIR `else` at {i} outside a `cond`")
            open_[-1][1] = i
        elif kind == Instr.ENDCOND:
            if not open_ or open_[-1][1] is None:
                raise GlowgenError(f"internal error: LIR `endcond` at {i} without `cond`/`else`")
            c, e = open_.pop()
            found.append(Region(c, e, i, len(open_)))
    if open_:
        raise GlowgenError(f"internal error: LIR `cond` at {open_[-1][0]} is never closed")
    return sorted(found, key=lambda r: r.cond)


def jumps(instrs) -> dict[int, int]:
    """Where control goes from a region's markers when it does not fall through: from a
    `cond` whose condition is false, to just after its `else`; from an `else` (reached at
    the end of the then-branch), to just after its `endcond`."""
    out = {}
    for r in regions(instrs):
        out[r.cond] = r.orelse + 1
        out[r.orelse] = r.end + 1
    return out
