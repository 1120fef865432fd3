"""Emit `generated/instrs.py`: one low-level instruction kind per op a backend may run:
the primitives and every op with an elementwise kernel.

Operand roles come from the declaration: results are `@out`, operands `@in`; an
`inplace(result, operand)` trait says the result may reuse that operand's buffer."""
from __future__ import annotations

from .specs import SpecSet


def emit_instrs(specs: SpecSet) -> str:
    lines = ["from glowgen.lir.kinds import InstrKind, OperandRole", "", "INSTRUCTIONS = {"]
    for op in specs.ops.values():
        if "primitive" not in op.trait_names() and op.name not in specs.kernels:
            continue
        roles = [f"OperandRole({o.name!r}, 'out')" for o in op.outputs]
        roles += [f"OperandRole({o.name!r}, 'in', optional={o.optional}, variadic={o.variadic})"
                  for o in op.inputs]
        inplace = tuple(tuple(t.args) for t in op.traits if t.name == "inplace")
        lines.append(f"    {op.name!r}: InstrKind({op.name!r}, ({''.join(r + ', ' for r in roles)}), "
                     f"inplace={inplace!r}, elementwise={'elementwise' in op.trait_names()}),")
    lines += ["}", ""]
    return "\n".join(lines)
