"""Emit `generated/fns.py` and `generated/ops.py`: one attrs node class per op."""
from __future__ import annotations

from ..engine.types import DTYPES
from . import ast as A
from .pyexpr import Scope, py_ident, spec_error, to_py, unparse
from .specs import SpecSet


def emit_fns(specs: SpecSet) -> str:
    lines = ["from glowgen import speclib as sl", "from glowgen.engine import specrt as rt", ""]
    for fn in specs.fns.values():
        scope = Scope({p: py_ident(p) for p in fn.params}, specs.callables, what=f"fn {fn.name}")
        lines += ["", f"def fn_{fn.name}({', '.join(py_ident(p) for p in fn.params)}):",
                  f'    """{fn.name}({", ".join(fn.params)}) = {unparse(fn.body)}  ({fn.pos})"""',
                  f"    return {to_py(fn.body, scope)}", ""]
    return "\n".join(lines)


def _operand_signature(o: A.Operand) -> str:
    entries = [unparse(o.elem)] + [("*" if d.star else "") + unparse(d.expr) for d in o.dims]
    return (f"{o.name}: Tensor[{', '.join(entries)}]" + ("?" if o.optional else "")
            + ("..." if o.variadic else ""))


def _attr_signature(a: A.Attr) -> str:
    s = f"{a.name}: {a.kind}" + (f"[{a.length}]" if a.length else "")
    if a.default is not None:
        s += f" = {unparse(a.default)}"
    if a.where is not None:
        s += f" where {unparse(a.where)}"
    return s


class _OpEmitter:
    def __init__(self, specs: SpecSet, op: A.OpDef):
        self.specs, self.op = specs, op
        self.lines: list[str] = []
        self.loc = str(op.pos)

    def emit(self) -> list[str]:
        op = self.op
        w = self.lines.append
        doc = [op.doc or f"The {op.name} op."]
        doc += ["", "Operands:"] + [f"    {_operand_signature(o)}" for o in op.inputs]
        doc += ["Results:"] + [f"    {_operand_signature(o)}" for o in op.outputs]
        if op.attrs:
            doc += ["Attributes:"] + [f"    {_attr_signature(a)}" for a in op.attrs]
        if op.traits:
            doc += ["Traits: " + ", ".join(t.name + (f"({', '.join(t.args)})" if t.args else "")
                                           for t in op.traits)]
        doc += [f"Declared at {op.pos}."]
        w("")
        w("")
        w("@attrs.define(eq=False, repr=False, kw_only=True)")
        w(f"class {op.name}(Node):")
        w('    """' + "\n    ".join(doc).rstrip() + '\n    """')
        w("")
        w(f"    OP: ClassVar[str] = {op.name!r}")
        w("    INPUTS: ClassVar[tuple] = (" + "".join(
            f"OperandInfo({o.name!r}, optional={o.optional}, variadic={o.variadic}), " for o in op.inputs) + ")")
        w("    OUTPUTS: ClassVar[tuple] = (" + "".join(
            f"OperandInfo({o.name!r}, optional={o.optional}{', variadic=True' if o.variadic else ''}), "
            for o in op.outputs) + ")")
        attr_infos = []
        for a in op.attrs:
            default = self._default_py(a)
            attr_infos.append(f"AttrInfo({a.name!r}, {a.kind!r}, {default if default is not None else 'None'}, "
                              f"{default is not None})")
        w("    ATTRS: ClassVar[tuple] = (" + "".join(x + ", " for x in attr_infos) + ")")
        w(f"    TRAITS: ClassVar[frozenset] = frozenset({sorted(op.trait_names())!r})")
        inplace = [t.args for t in op.traits if t.name == "inplace"]
        w(f"    INPLACE: ClassVar[tuple] = {tuple(tuple(x) for x in inplace)!r}")
        w(f"    LOCATION: ClassVar[str] = {self.loc!r}")
        w("")
        for a in op.attrs:
            default = self._default_py(a)
            conv = f"rt.CONVERTERS[{a.kind!r}]"
            if default is None:
                w(f"    {py_ident(a.name)}: object = attrs.field(converter={conv})")
            else:
                w(f"    {py_ident(a.name)}: object = attrs.field(default={default}, converter={conv})")
        for i, o in enumerate(op.inputs):
            w("")
            w("    @property")
            w(f"    def {py_ident(o.name)}(self):")
            w(f'        """Operand {_operand_signature(o)}"""')
            w(f"        return self.inputs[{i}]")
        for i, o in enumerate(op.outputs):
            if o.name in {x.name for x in op.inputs}:
                continue
            w("")
            w("    @property")
            w(f"    def {py_ident(o.name)}(self):")
            w(f'        """Result {_operand_signature(o)}"""')
            w(f"        return self.outputs[{i}] if len(self.outputs) > {i} else None")
        self._emit_infer()
        return self.lines

    def _default_py(self, a: A.Attr):
        if a.default is None:
            return None
        return to_py(a.default, Scope({}, self.specs.callables, what=f"default of {self.op.name}.{a.name}"))

    def _emit_infer(self):
        op, specs = self.op, self.specs
        w = self.lines.append
        params = []
        for o in op.inputs:
            params.append(py_ident(o.name) + ("=None" if o.optional else ""))
        kw = ["_node=''"] + [f"{py_ident(a.name)}=None" for a in op.attrs]
        w("")
        w("    @staticmethod")
        w(f"    def infer({''.join(p + ', ' for p in params)}*, {', '.join(kw)}):")
        w('        """Check operand types and attributes against the declaration; return the result types."""')
        w(f"        u = rt.Unifier({op.name!r}, _node)")
        names: dict[str, str] = {}
        for o in op.inputs:
            names[o.name] = py_ident(o.name)
        for a in op.attrs:
            names[a.name] = py_ident(a.name)
        bound_types: set[str] = set()
        bound_dims: set[str] = set()
        all_syms: set[str] = set()
        variadic_syms: set[str] = set()
        for o in op.inputs:
            loc = repr(str(o.pos))
            ind = "        "
            var = py_ident(o.name)
            if o.optional:
                w(f"        if {var} is not None:")
                ind += "    "
            elem = o.elem
            if o.variadic:
                w(f"{ind}if len({var}) == 0:")
                w(f"{ind}    rt.fail({op.name!r}, _node, 'operand {o.name} needs at least one value', {loc})")
                w(f"{ind}for _t in {var}:")
                self._emit_elem(ind + "    ", o, "_t", elem, loc, bound_types)
                if len(o.dims) != 1 or not o.dims[0].star or not isinstance(o.dims[0].expr, A.Name):
                    raise spec_error(f"op {op.name}: variadic operand {o.name} must be declared "
                                     f"Tensor[T, *S]... (its shapes are bound to S as a list)", o.pos)
                sym = o.dims[0].expr.id
                w(f"{ind}{sym} = tuple(_t.shape for _t in {var})")
                variadic_syms.add(sym)
                names[sym] = sym
                continue
            self._emit_elem(ind, o, var, elem, loc, bound_types)
            prefix, rest, suffix = [], None, []
            for d in o.dims:
                if d.star:
                    if rest is not None:
                        raise spec_error(f"operand {o.name}: only one '*rest' entry is allowed", o.pos)
                    if not isinstance(d.expr, A.Name):
                        raise spec_error(f"operand {o.name}: '*' must be followed by a name", o.pos)
                    rest = d.expr.id
                    continue
                if isinstance(d.expr, A.Name):
                    sym = d.expr.id
                elif isinstance(d.expr, A.Num) and isinstance(d.expr.value, int):
                    sym = d.expr.value
                else:
                    raise spec_error(f"operand {o.name}: input dimensions must be names or integers, "
                                     f"not {unparse(d.expr)!r}", o.pos)
                (suffix if rest is not None else prefix).append(sym)
            w(f"{ind}u.shape({o.name!r}, {var}, {tuple(prefix)!r}, {rest!r}, {tuple(suffix)!r}, {loc})")
            for sym in prefix + suffix + ([rest] if rest else []):
                if isinstance(sym, str):
                    if sym in {x.name for x in op.inputs} | {a.name for a in op.attrs}:
                        raise spec_error(f"op {op.name}: dimension symbol {sym!r} clashes with an "
                                         f"operand or attribute name", o.pos)
                    if not o.optional:
                        bound_dims.add(sym)
                    all_syms.add(sym)
                    names[sym] = sym
        # Bind symbols to locals (a symbol only an absent optional operand binds is None).
        for sym in sorted(all_syms - variadic_syms):
            if sym in bound_dims:
                w(f"        {sym} = u.dim({sym!r})")
            else:
                w(f"        {sym} = u.dims[{sym!r}][0] if {sym!r} in u.dims else None")
        for tv in sorted(bound_types):
            w(f"        {tv} = u.dtype({tv!r})")
            names.setdefault(tv, tv)
        scope = Scope(names, specs.callables, what=f"op {op.name}")
        for a in op.attrs:
            if a.length is not None:
                w(f"        rt.check(len({py_ident(a.name)}) == {a.length}, {op.name!r}, _node, "
                  f"f'attribute {a.name} must have {a.length} entries, got {{{py_ident(a.name)}!r}}', {str(a.pos)!r})")
            if a.where is not None:
                msg = f"attribute {a.name} must satisfy {unparse(a.where)}, got {{{py_ident(a.name)}!r}}"
                w(f"        rt.check({to_py(a.where, scope)}, {op.name!r}, _node, f{msg!r}, {str(a.pos)!r})")
        for c in op.checks:
            w(f"        rt.check({to_py(c.expr, scope)}, {op.name!r}, _node, {c.message!r}, {str(c.pos)!r})")
        for target, pos in op.verify_py:
            if ":" not in target:
                raise spec_error(f"verify py needs \"module:function\", got {target!r}", pos)
            args = ", ".join(f"{k}={v}" for k, v in names.items() if k.isidentifier())
            w(f"        rt_py({target!r})({op.name!r}, _node, {str(pos)!r}, {args})")
        results = []
        for k, o in enumerate(op.outputs):
            elem = self._out_elem(o, scope, bound_types)
            if o.variadic:
                # `out ys: Tensor[T, *shapes]...`: one result per shape in the list `shapes`.
                if k != len(op.outputs) - 1 or len(o.dims) != 1 or not o.dims[0].star:
                    raise spec_error(f"op {op.name}: a variadic result must come last and be "
                                     f"declared Tensor[T, *shapes]... (a list of shapes)", o.pos)
                results.append(f"*(rt.result_type({op.name!r}, _node, {elem}, _s, {str(o.pos)!r}) "
                               f"for _s in {to_py(o.dims[0].expr, scope)})")
                continue
            dims = ", ".join(("*" if d.star else "") + to_py(d.expr, scope) for d in o.dims)
            results.append(f"rt.result_type({op.name!r}, _node, {elem}, ({dims}{',' if o.dims else ''}), {str(o.pos)!r})")
        w("        return (" + "".join(r + ", " for r in results) + ")")

    def _emit_elem(self, ind, o, var, elem, loc, bound_types):
        w = self.lines.append
        if isinstance(elem, A.Name) and elem.id in self.specs.typevars:
            allowed = self.specs.typevars[elem.id].dtypes
            w(f"{ind}u.elem({o.name!r}, {var}, {elem.id!r}, {tuple(allowed)!r}, {loc})")
            if not o.optional:
                bound_types.add(elem.id)
        elif isinstance(elem, A.Name) and elem.id in DTYPES:
            w(f"{ind}u.exact_elem({o.name!r}, {var}, {elem.id!r}, {loc})")
        elif isinstance(elem, A.Name):
            raise spec_error(f"undefined type variable {elem.id!r} in operand {o.name!r} of op "
                             f"{self.op.name} (declare it with 'typevar {elem.id} : f32 | ...' or "
                             f"use an element type: {', '.join(DTYPES)})", elem.pos)
        else:
            raise spec_error(f"operand {o.name}: the element type of an operand must be a type "
                             f"variable or an element type", o.pos)

    def _out_elem(self, o, scope, bound_types) -> str:
        elem = o.elem
        if isinstance(elem, A.Name):
            if elem.id in self.specs.typevars:
                if elem.id not in bound_types:
                    raise spec_error(f"result {o.name}: type variable {elem.id} is not bound by any "
                                     f"required operand", elem.pos)
                return elem.id
            if elem.id in DTYPES:
                return repr(elem.id)
            if elem.id not in scope.names:
                raise spec_error(f"undefined type variable {elem.id!r} in result {o.name!r} of op "
                                 f"{self.op.name}", elem.pos)
        return to_py(elem, scope)


HEADER_IMPORTS = """\
from typing import ClassVar

import attrs

from glowgen import speclib as sl
from glowgen.engine import specrt as rt
from glowgen.engine.graph import AttrInfo, Node, OperandInfo
from glowgen.engine.specpy import call_py as rt_py

from .fns import *  # noqa: F401,F403  (the spec's fn definitions)
"""


def emit_ops(specs: SpecSet) -> str:
    lines = [HEADER_IMPORTS]
    for op in specs.ops.values():
        lines += _OpEmitter(specs, op).emit()
    lines += ["", "", "OPS = {" + "".join(f"\n    {n!r}: {n}," for n in specs.ops) + "\n}", ""]
    return "\n".join(lines)
