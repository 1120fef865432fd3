"""Instruction kinds: what generated/instrs.py declares for each primitive."""
from __future__ import annotations

import attrs


@attrs.frozen
class OperandRole:
    name: str
    role: str                 # "in" | "out" | "inout"
    optional: bool = False
    variadic: bool = False


@attrs.frozen
class InstrKind:
    name: str
    operands: tuple           # OperandRole: results first, then operands, in declaration order
    inplace: tuple = ()       # (result, operand) pairs that may share a buffer
    elementwise: bool = False
