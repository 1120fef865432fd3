"""Load the spec files of a spec directory into one checked `SpecSet`."""
from __future__ import annotations

from pathlib import Path

import attrs

from ..engine.types import DTYPES
from . import ast as A
from .parser import op_from_items, parse_file
from .pyexpr import spec_error

SPEC_FILES = ("helpers.glowdef", "ops.glowdef", "lowerings.glowdef", "cpu_kernels.glowdef")
# The closed vocabulary of traits the engine understands:
#   elementwise  one result element from the same-index operand elements (stackable)
#   broadcast    operands broadcast NumPy-style
#   commutative  the two operands may be swapped (patterns match both orders)
#   primitive    survives lowering; backends implement it
#   inplace(r, o)  result r may reuse operand o's buffer
#   shape_only   the result depends only on operand types (folded at compile time)
#   view         the result is the operand's bytes with another type (no data moves)
#   quantized    the integer result is quantized with the op's attributes scale and offset
#   quant_passthrough  a result of the first operand's element type keeps its quantization
TRAITS = {"elementwise", "broadcast", "commutative", "primitive", "inplace", "shape_only", "view",
          "quantized", "quant_passthrough"}
ATTR_KINDS = {"int", "ints", "float", "floats", "string", "strings", "dtype"}
PHASES = ("canonicalize", "quantize", "lower", "legalize")


@attrs.define
class SpecSet:
    directory: Path
    files: dict = attrs.field(factory=dict)          # file name -> SpecFile
    typevars: dict = attrs.field(factory=dict)
    fns: dict = attrs.field(factory=dict)
    ops: dict = attrs.field(factory=dict)
    rules: list = attrs.field(factory=list)
    builds: dict = attrs.field(factory=dict)
    kernels: dict = attrs.field(factory=dict)
    scalars: dict = attrs.field(factory=dict)
    externs: list = attrs.field(factory=list)         # (name, Pos)
    templates: dict = attrs.field(factory=dict)
    families: dict = attrs.field(factory=dict)        # template name -> names of its ops
    groups: dict = attrs.field(factory=dict)          # group name -> Group
    helpers: dict = attrs.field(factory=dict)         # helper name -> Helper

    @property
    def callables(self) -> dict:
        """What a call in a spec expression may name: `fn` definitions and declared helpers."""
        return {**self.helpers, **self.fns}

    def group_members(self, name: str) -> tuple:
        """The ops a pattern naming `name` (a family or a group) matches; () for neither."""
        if name in self.families:
            return tuple(self.families[name])
        if name in self.groups:
            out: dict = {}
            for m in self.groups[name].members:
                for op in ((m,) if m in self.ops else self.group_members(m)):
                    out[op] = None
            return tuple(out)
        return ()


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

    if isinstance(item, A.Template):
        unique(specs.templates, item.name, "template")
        specs.templates[item.name] = item
        specs.families[item.name] = []
    elif isinstance(item, A.OpInstance):
        op = instantiate(specs, item)
        unique(specs.ops, op.name, "op")
        specs.ops[op.name] = op
        specs.families[item.template].append(op.name)
    elif isinstance(item, A.Group):
        if item.name in specs.groups or item.name in specs.templates or item.name in specs.ops:
            raise spec_error(f"group {item.name!r}: the name is taken by another declaration", item.pos)
        for m in item.members:      # declared before: so groups cannot form cycles
            if m not in specs.ops and m not in specs.families and m not in specs.groups:
                raise spec_error(f"group {item.name}: {m!r} is not an op, template or group "
                                 f"declared before it", item.pos)
        specs.groups[item.name] = item
    elif isinstance(item, A.Helper):
        unique(specs.helpers, item.name, "helper")
        specs.helpers[item.name] = item
    elif isinstance(item, A.TypeVar):
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
    elif isinstance(item, A.Build):
        unique(specs.builds, item.name, "build")
        specs.builds[item.name] = item
    elif isinstance(item, A.Kernel):
        unique(specs.kernels, item.name, "kernel")
        specs.kernels[item.name] = item
    elif isinstance(item, A.Scalar):
        unique(specs.scalars, item.name, "scalar")
        specs.scalars[item.name] = item
    elif isinstance(item, A.Extern):
        specs.externs.extend((n, item.pos) for n in item.names)


def substitute(node, mapping: dict):
    """`node` (any spec AST, or tuples of it) with every name in `mapping` replaced."""
    if isinstance(node, A.Name):
        return mapping.get(node.id, node)
    if isinstance(node, tuple):
        return tuple(substitute(x, mapping) for x in node)
    if isinstance(node, list):
        return [substitute(x, mapping) for x in node]
    if attrs.has(type(node)) and not isinstance(node, A.Pos):
        changes = {}
        for f in attrs.fields(type(node)):
            old = getattr(node, f.name)
            new = substitute(old, mapping)
            if new is not old:
                changes[f.name] = new
        return attrs.evolve(node, **changes) if changes else node
    return node


def instantiate(specs: SpecSet, inst: A.OpInstance) -> A.OpDef:
    """The op `op Name = Template(args) { items }` declares."""
    template = specs.templates.get(inst.template)
    if template is None:
        raise spec_error(f"op {inst.name}: no template named {inst.template!r} is declared "
                         f"before it", inst.pos)
    if len(inst.args) != len(template.params):
        raise spec_error(f"op {inst.name}: template {template.name} takes {len(template.params)} "
                         f"arguments ({', '.join(template.params)}), got {len(inst.args)}", inst.pos)
    mapping = dict(zip(template.params, inst.args))
    items = []
    for kind, val in template.items:
        if kind == "doc_param":
            if val not in mapping or not isinstance(mapping[val], A.Str):
                raise spec_error(f"op {inst.name}: 'doc {val}' in template {template.name} needs "
                                 f"a string argument {val}", inst.pos)
            items.append(("doc", mapping[val].value))
        else:
            items.append((kind, substitute(val, mapping)))
    return op_from_items(inst.name, items + list(inst.items), inst.pos)


def _check_helpers(specs: SpecSet) -> None:
    """Every declared helper is a registered function of its module that accepts the declared
    parameters, and every registered helper is declared."""
    import inspect

    from .. import speclib
    for h in specs.helpers.values():
        if h.name in specs.fns:
            raise spec_error(f"helper {h.name}: an fn of that name is declared too "
                             f"({specs.fns[h.name].pos})", h.pos)
        if h.module not in speclib.MODULES:
            raise spec_error(f"helper {h.module}.{h.name}: no module glowgen/speclib/{h.module}.py "
                             f"(modules: {', '.join(sorted(speclib.MODULES))})", h.pos)
        fn = speclib.HELPERS.get(h.name)
        if fn is None or speclib.module_of(fn) != h.module:
            raise spec_error(f"helper {h.module}.{h.name}: glowgen/speclib/{h.module}.py registers no "
                             f"helper {h.name!r} (mark the function with @helper)", h.pos)
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = sum(1 for p in positional if p.default is p.empty)
        star = any(p.kind == p.VAR_POSITIONAL for p in params)
        declared_min, declared_max = h.arity()
        python_max = None if star else len(positional)
        if declared_min < required or (python_max is not None and
                                       (declared_max is None or declared_max > python_max)):
            sig = f"{h.name}{inspect.signature(fn)}"
            raise spec_error(f"helper {h.module}.{h.name}: the declaration "
                             f"({', '.join(('*' if p.star else '') + p.name + ('?' if p.optional else '') for p in h.params)}) "
                             f"does not fit the Python function {sig}", h.pos)
    declared = set(specs.helpers)
    missing = sorted(n for n in speclib.HELPERS if n not in declared)
    if missing:
        from ..errors import SpecError
        raise SpecError(f"glowgen/speclib registers helpers that {display_name(specs.directory, 'helpers.glowdef')} "
                        f"does not declare: {', '.join(missing)} (declare each as "
                        f"`helper module.name(params)`)")


def _check(specs: SpecSet) -> None:
    """Checks that span declarations; per-expression name checks happen while emitting."""
    _check_helpers(specs)
    for op in specs.ops.values():
        for t in op.traits:
            if t.name not in TRAITS:
                raise spec_error(f"op {op.name}: unknown trait {t.name!r}; traits are "
                                 f"{', '.join(sorted(TRAITS))}", t.pos)
        for a in op.attrs:
            if a.kind not in ATTR_KINDS:
                raise spec_error(f"op {op.name}: attribute {a.name}: unknown type {a.kind!r}; "
                                 f"use one of {', '.join(sorted(ATTR_KINDS))}", a.pos)
        for a in op.attrs:
            if a.name == "shape":
                # `n.shape` in a spec is always the result's shape; an attribute may not hide it.
                raise spec_error(f"op {op.name}: an attribute may not be called 'shape' (n.shape is "
                                 f"the result's shape); call it 'dims' or what it means", a.pos)
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
