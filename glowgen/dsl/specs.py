"""Load the spec files of a spec directory into one checked `SpecSet`."""
from __future__ import annotations

from pathlib import Path

import attrs

from ..engine.types import DTYPES
from . import ast as A
from .parser import parse_file
from .pyexpr import spec_error

SPEC_FILES = ("ops.glowdef", "lowerings.glowdef", "cpu_kernels.glowdef")
# The closed vocabulary of traits the engine understands:
#   elementwise  one result element from the same-index operand elements (stackable)
#   broadcast    operands broadcast NumPy-style
#   commutative  the two operands may be swapped (patterns match both orders)
#   primitive    survives lowering; backends implement it
#   inplace(r, o)  result r may reuse operand o's buffer
#   shape_only   the result depends only on operand types (folded at compile time)
#   view         the result is the operand's bytes with another type (no data moves)
TRAITS = {"elementwise", "broadcast", "commutative", "primitive", "inplace", "shape_only", "view"}
ATTR_KINDS = {"int", "ints", "float", "floats", "string", "dtype"}
PHASES = ("canonicalize", "lower", "legalize")


@attrs.define
class SpecSet:
    directory: Path
    files: dict = attrs.field(factory=dict)          # file name -> SpecFile
    typevars: dict = attrs.field(factory=dict)
    fns: dict = attrs.field(factory=dict)
    ops: dict = attrs.field(factory=dict)
    rules: list = attrs.field(factory=list)
    kernels: dict = attrs.field(factory=dict)
    scalars: dict = attrs.field(factory=dict)
    externs: list = attrs.field(factory=list)         # (name, Pos)


def display_name(spec_dir: Path, file: str) -> str:
    return f"{Path(spec_dir).name}/{file}"


def load_specs(spec_dir: Path) -> SpecSet:
    spec_dir = Path(spec_dir)
    specs = SpecSet(spec_dir)
    for file in SPEC_FILES:
        path = spec_dir / file
        if not path.exists():
            from ..errors import SpecError
            raise SpecError(f"spec file {path} is missing (a spec directory holds "
                            f"{', '.join(SPEC_FILES)})")
        sf = parse_file(path, display_name(spec_dir, file))
        specs.files[file] = sf
        for item in sf.items:
            _add(specs, item)
    _check(specs)
    return specs


def _add(specs: SpecSet, item) -> None:
    def unique(table, name, what):
        if name in table:
            raise spec_error(f"{what} {name!r} is defined twice (first at {table[name].pos})", item.pos)

    if isinstance(item, A.TypeVar):
        unique(specs.typevars, item.name, "typevar")
        for d in item.dtypes:
            if d not in DTYPES:
                raise spec_error(f"typevar {item.name}: {d!r} is not an element type "
                                 f"(one of {', '.join(DTYPES)})", item.pos)
        specs.typevars[item.name] = item
    elif isinstance(item, A.FnDef):
        unique(specs.fns, item.name, "fn")
        specs.fns[item.name] = item
    elif isinstance(item, A.OpDef):
        unique(specs.ops, item.name, "op")
        specs.ops[item.name] = item
    elif isinstance(item, A.Rule):
        for r in specs.rules:
            if r.name == item.name:
                raise spec_error(f"rule {item.name!r} is defined twice (first at {r.pos})", item.pos)
        specs.rules.append(item)
    elif isinstance(item, A.Kernel):
        unique(specs.kernels, item.name, "kernel")
        specs.kernels[item.name] = item
    elif isinstance(item, A.Scalar):
        unique(specs.scalars, item.name, "scalar")
        specs.scalars[item.name] = item
    elif isinstance(item, A.Extern):
        specs.externs.extend((n, item.pos) for n in item.names)


def _check(specs: SpecSet) -> None:
    """Checks that span declarations; per-expression name checks happen while emitting."""
    for op in specs.ops.values():
        for t in op.traits:
            if t.name not in TRAITS:
                raise spec_error(f"op {op.name}: unknown trait {t.name!r}; traits are "
                                 f"{', '.join(sorted(TRAITS))}", t.pos)
        for a in op.attrs:
            if a.kind not in ATTR_KINDS:
                raise spec_error(f"op {op.name}: attribute {a.name}: unknown type {a.kind!r}; "
                                 f"use one of {', '.join(sorted(ATTR_KINDS))}", a.pos)
        seen = {}
        for o in list(op.inputs) + list(op.outputs) + list(op.attrs):
            if o.name in seen:
                raise spec_error(f"op {op.name}: {o.name!r} is declared twice", o.pos)
            seen[o.name] = o
        if not op.outputs:
            raise spec_error(f"op {op.name} declares no result ('out ...')", op.pos)
    for rule in specs.rules:
        for phase in rule.phases:
            if phase not in PHASES:
                raise spec_error(f"rule {rule.name}: unknown phase [{phase}]; phases are "
                                 f"{', '.join(PHASES)}", rule.pos)
    clauses: dict = {}
    for op in specs.ops.values():
        for c in op.onnx:
            lo, hi = c.since or 1, c.until or 10**9
            for other_op, o in clauses.get(c.onnx_op, []):
                if c.guard is not None or o.guard is not None:
                    continue        # guarded clauses are tried in order; the first that holds wins
                if lo <= (o.until or 10**9) and (o.since or 1) <= hi:
                    raise spec_error(f"the mappings of ONNX {c.onnx_op} in op {op.name} and op "
                                     f"{other_op} ({o.pos}) overlap in opsets; give them disjoint "
                                     f"'since'/'until' ranges", c.pos)
            clauses.setdefault(c.onnx_op, []).append((op.name, c))
    for name, pos in specs.externs:
        if name not in specs.ops:
            raise spec_error(f"extern {name}: no op of that name is declared in ops.glowdef", pos)
    for k in specs.kernels.values():
        op = specs.ops.get(k.name)
        if op is None:
            raise spec_error(f"kernel {k.name}: no op of that name is declared in ops.glowdef", k.pos)
        if "elementwise" not in op.trait_names():
            raise spec_error(f"kernel {k.name}: op {k.name} is not declared elementwise", k.pos)
        if len(k.params) != len(op.inputs):
            raise spec_error(f"kernel {k.name} takes {len(k.params)} parameters but op {k.name} "
                             f"has {len(op.inputs)} operands", k.pos)
