"""Translate spec expressions into Python source for the generated modules.

Names are resolved at generation time through a `Scope`, so a misspelled name is a
`SpecError` at the spec's file:line:col, never a NameError at run time.
"""
from __future__ import annotations

import keyword
import math
from typing import Callable, Optional

from ..engine import specrt
from ..errors import SpecError
from . import ast as A

_ARITH = {"+": "rt.add", "-": "rt.sub", "*": "rt.mul", "/": "rt.truediv", "//": "rt.floordiv",
          "%": "rt.mod", "**": "rt.power", "<": "rt.lt", "<=": "rt.le", ">": "rt.gt",
          ">=": "rt.ge", "==": "rt.eq", "!=": "rt.ne"}


def py_ident(name: str) -> str:
    """A spec name as a Python identifier (keywords get a trailing underscore)."""
    return name + "_" if keyword.iskeyword(name) or name in ("rt", "sl", "attrs", "math") else name


def spec_error(message: str, pos: A.Pos) -> SpecError:
    return SpecError(message, pos.file, pos.line, pos.column)


class Scope:
    """Maps spec names to Python expressions; `calls` handles calls the context owns
    (op constructors in rule right-hand sides, for instance)."""

    def __init__(self, names: dict[str, str], fns: dict[str, A.FnDef],
                 call_hook: Optional[Callable] = None, what: str = "expression"):
        self.names = names
        self.fns = fns
        self.call_hook = call_hook
        self.what = what

    def child(self, extra: dict[str, str]) -> "Scope":
        return Scope({**self.names, **extra}, self.fns, self.call_hook, self.what)


def _literal_builtin(name: str) -> Optional[str]:
    value = specrt.BUILTINS.get(name)
    if value is None and name == "none":
        return "None"
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float) and math.isinf(value):
        return "float('inf')"
    if isinstance(value, str):
        return repr(value)
    return None


def to_py(e, scope: Scope) -> str:
    if isinstance(e, A.Num):
        return repr(e.value)
    if isinstance(e, A.Str):
        return repr(e.value)
    if isinstance(e, A.Name):
        if e.id in scope.names:
            return scope.names[e.id]
        lit = _literal_builtin(e.id)
        if lit is not None:
            return lit
        raise spec_error(f"undefined name {e.id!r} in {scope.what}", e.pos)
    if isinstance(e, A.ListLit):
        return "(" + "".join(to_py(x, scope) + ", " for x in e.items) + ")"
    if isinstance(e, A.Star):
        return "*" + to_py(e.value, scope)
    if isinstance(e, A.Forward):
        raise spec_error(f"...{e.name} forwards attributes only to an op a rule builds", e.pos)
    if isinstance(e, A.Call):
        if scope.call_hook is not None:
            hooked = scope.call_hook(e, scope)
            if hooked is not None:
                return hooked
        args = [to_py(a, scope) for a in e.args] + [f"{py_ident(k)}={to_py(v, scope)}"
                                                    for k, v in e.kwargs]
        if isinstance(scope.fns.get(e.func), A.Helper):
            return _helper_call(e, scope.fns[e.func], args, scope)
        if e.func in scope.fns:
            fn = scope.fns[e.func]
            if e.kwargs or (len(e.args) != len(fn.params) and not any(isinstance(a, A.Star) for a in e.args)):
                raise spec_error(f"fn {e.func} takes {len(fn.params)} arguments "
                                 f"({', '.join(fn.params)}), got {len(e.args)}", e.pos)
            return f"fn_{e.func}({', '.join(args)})"
        fn = specrt.BUILTINS.get(e.func)
        if callable(fn):
            return f"rt.b_{e.func}({', '.join(args)})"
        raise spec_error(f"unknown function {e.func!r} in {scope.what}: no fn, builtin or helper "
                         f"of that name (declare a Python helper of glowgen/speclib in "
                         f"specs/helpers.glowdef: `helper module.{e.func}(params)`)", e.pos)
    if isinstance(e, A.GetAttr):
        return f"{to_py(e.obj, scope)}.{e.name}"
    if isinstance(e, A.Index):
        return f"{to_py(e.obj, scope)}[{to_py(e.index, scope)}]"
    if isinstance(e, A.Slice):
        lo = to_py(e.lo, scope) if e.lo is not None else ""
        hi = to_py(e.hi, scope) if e.hi is not None else ""
        return f"tuple({to_py(e.obj, scope)})[{lo}:{hi}]"
    if isinstance(e, A.BinOp):
        lhs, rhs = to_py(e.lhs, scope), to_py(e.rhs, scope)
        if e.op in ("and", "or"):
            return f"({lhs} {e.op} {rhs})"
        return f"{_ARITH[e.op]}({lhs}, {rhs})"
    if isinstance(e, A.UnaryOp):
        inner = to_py(e.operand, scope)
        if e.op == "not":
            return f"(not {inner})"
        if e.op == "-":
            return f"rt.neg({inner})"
        return inner
    if isinstance(e, A.Cond):
        return f"({to_py(e.then, scope)} if {to_py(e.test, scope)} else {to_py(e.orelse, scope)})"
    raise TypeError(f"not an expression: {e!r}")


def _helper_call(e: A.Call, h: A.Helper, args: list, scope: Scope) -> str:
    """A call of a declared helper, checked against its declaration."""
    fewest, most = h.arity()
    if not any(isinstance(a, A.Star) for a in e.args):
        n = len(e.args)
        if n < fewest or (most is not None and n > most):
            want = (f"{fewest}" if fewest == most else f"{fewest} to {most}" if most is not None
                    else f"at least {fewest}")
            raise spec_error(f"helper {e.func} takes {want} arguments "
                             f"({', '.join(('*' if p.star else '') + p.name + ('?' if p.optional else '') for p in h.params)}; "
                             f"declared at {h.pos}), got {n}", e.pos)
    names = {p.name for p in h.params if not p.star}
    for k, _ in e.kwargs:
        if k not in names:
            raise spec_error(f"helper {e.func} has no parameter {k!r} (declared at {h.pos})", e.pos)
    return f"sl.{h.module}.{h.name}({', '.join(args)})"


def unparse(e) -> str:
    """The spec text of an expression (for messages and docstrings)."""
    if isinstance(e, A.Num):
        return repr(e.value)
    if isinstance(e, A.Str):
        return repr(e.value).replace("'", '"')
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.ListLit):
        return "[" + ", ".join(unparse(x) for x in e.items) + "]"
    if isinstance(e, A.Star):
        return "*" + unparse(e.value)
    if isinstance(e, A.Forward):
        return "..." + e.name
    if isinstance(e, A.Call):
        args = [unparse(a) for a in e.args] + [f"{k} = {unparse(v)}" for k, v in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    if isinstance(e, A.GetAttr):
        return f"{unparse(e.obj)}.{e.name}"
    if isinstance(e, A.Index):
        return f"{unparse(e.obj)}[{unparse(e.index)}]"
    if isinstance(e, A.Slice):
        return (f"{unparse(e.obj)}[{unparse(e.lo) if e.lo else ''}:"
                f"{unparse(e.hi) if e.hi else ''}]")
    if isinstance(e, A.BinOp):
        return f"{_paren(e.lhs)} {e.op} {_paren(e.rhs)}"
    if isinstance(e, A.UnaryOp):
        return f"{e.op}{' ' if e.op == 'not' else ''}{_paren(e.operand)}"
    if isinstance(e, A.Cond):
        return f"{unparse(e.then)} if {unparse(e.test)} else {unparse(e.orelse)}"
    return str(e)


def _paren(e) -> str:
    s = unparse(e)
    return f"({s})" if isinstance(e, (A.BinOp, A.Cond)) else s


def names_in(e) -> set[str]:
    return {x.id for x in A.walk(e) if isinstance(x, A.Name)}
