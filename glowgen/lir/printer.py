"""Textual form of a LIR program (`glowgen dump --stage lir`) and its memory report."""
from __future__ import annotations

from .allocator import max_live
from .ir import Activation, Instr, Program, WeightBuffer, dynamic_views


def _where(b) -> str:
    r = b.root()
    # A loop's slice of a tensor: its place moves with the counter (ir.SliceView).
    moves = "".join(f" + ({v.length - 1} - %{v.counter.name}) * {v.slice_bytes}" if v.reverse
                    else f" + ((%{v.counter.name} + {v.phase}) % 2) * {v.slice_bytes}"
                    if v.phase is not None
                    else f" + %{v.counter.name} * {v.slice_bytes}" for v in dynamic_views(b))
    if isinstance(r, WeightBuffer):
        region = "const" if r.region == "constant" else "mutable"
        return f"{region}@{r.offset}{moves}"
    if isinstance(r, Activation):
        return f"act@{r.offset}{moves}"
    return "?"


def _attrs(ins: Instr) -> str:
    if ins.node is None or not ins.node.attr_values():
        return ""
    items = ", ".join(f"{k} = {list(v) if isinstance(v, tuple) else v}" for k, v in ins.node.attr_values().items())
    return " {" + items + "}"


def print_program(prog: Program) -> str:
    lines = ["declare {"]
    for w in prog.weights:
        kind = "const" if w.region == "constant" else f"mutable {w.io or ''}".rstrip()
        lines.append(f"  %{w.name} : {w.type} {kind} @{w.offset} size {w.nbytes}")
    lines.append("}")
    lines.append("")
    lines.append(f"program {prog.name} {{")
    depth = 0                         # regions open here: their instructions are indented
    for i, ins in enumerate(prog.instrs):
        if ins.kind in (Instr.ELSE, Instr.ENDCOND, Instr.ENDLOOP):
            depth -= 1
        pad = "  " * depth
        if ins.kind in Instr.CONTROL:
            if ins.kind not in (Instr.ENDCOND, Instr.ENDLOOP):
                depth += 1
            ops = ", ".join(f"@{r} %{b.name} ({_where(b)})" if b is not None else f"@{r} _"
                            for r, b in ins.operands)
            lines.append(f"  {i:4d}  {pad}{ins.kind}{' ' + ops if ops else ''}")
            continue
        if ins.kind in (Instr.ALLOC, Instr.DEALLOC):
            a = ins.operands[0][1]
            detail = f" : {a.type} act@{a.offset} size {a.nbytes}" if ins.kind == Instr.ALLOC else ""
            lines.append(f"  {i:4d}  {pad}{ins.kind} @out %{a.name}{detail}")
            continue
        if ins.kind == Instr.VIEW:
            v, base = ins.operands[0][1], ins.operands[1][1]
            lines.append(f"  {i:4d}  {pad}%{v.name} = tensorview @in %{base.name} : {v.type} {_where(v)}")
            continue
        ops = ", ".join(f"@{r} %{b.name} ({_where(b)})" if b is not None else f"@{r} _"
                        for r, b in ins.operands)
        plan = f"  ; {ins.plan}" if ins.plan is not None and str(ins.plan) else ""
        lines.append(f"  {i:4d}  {pad}{ins.kind.lower() if ins.kind == Instr.COPY else ins.kind} {ops}{_attrs(ins)}{plan}")
    lines.append("}")
    if prog.plan is not None:
        # What the backend's passes decided for the whole program (steps, fusion, scratch).
        lines.append("")
        lines.extend(prog.plan.describe())
    return "\n".join(lines) + "\n"


def memory_report(prog: Program) -> dict:
    from . import activation_blocks
    blocks = activation_blocks(prog)
    naive = sum(a.nbytes for a in prog.activations)
    bound = max_live(blocks)
    arena = prog.region_sizes["activation"] - prog.scratch_bytes
    return {"constant_bytes": prog.region_sizes["constant"],
            "mutable_bytes": prog.region_sizes["mutable"],
            "activation_bytes": arena,
            "naive_activation_bytes": naive,
            "max_live_bytes": bound,
            "arena_over_max_live": (arena / bound) if bound else 1.0,
            "arena_over_naive": (arena / naive) if naive else 1.0,
            "scratch_bytes": prog.scratch_bytes,
            "strategy": prog.strategy,
            "instructions": sum(1 for i in prog.instrs
                                if i.kind not in (Instr.ALLOC, Instr.DEALLOC) + Instr.CONTROL),
            "copies": sum(1 for i in prog.instrs if i.kind == Instr.COPY)}


def format_memory_report(report: dict) -> str:
    def mib(n):
        return f"{n:>12,d} bytes ({n / 2**20:8.2f} MiB)"
    return "\n".join([
        f"constant weights    {mib(report['constant_bytes'])}",
        f"mutable weights     {mib(report['mutable_bytes'])}",
        f"activation arena    {mib(report['activation_bytes'])}   (strategy: {report['strategy']})",
        f"  naive sum         {mib(report['naive_activation_bytes'])}",
        f"  max-live bound    {mib(report['max_live_bytes'])}",
        f"  arena / max-live  {report['arena_over_max_live']:.3f}",
        f"  arena / naive     {report['arena_over_naive']:.3f}",
    ] + ([f"kernel scratch      {mib(report['scratch_bytes'])}   (after the arena)"]
         if report["scratch_bytes"] else [])) + "\n"
