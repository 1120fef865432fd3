"""The spec AST: what the parser produces and the emitters consume.

Every node carries a `Pos` so errors and generated code can point at `file:line:col`.
"""
from __future__ import annotations

from typing import Optional, Union

import attrs


@attrs.frozen
class Pos:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


# ---------------------------------------------------------------------------- expressions
@attrs.frozen
class Num:
    value: Union[int, float]
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Str:
    value: str
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Name:
    id: str
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class ListLit:
    items: tuple
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Call:
    func: str
    args: tuple            # Expr or Star
    kwargs: tuple          # (name, Expr) pairs
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Star:
    """`*expr`: splice a sequence into an argument list or a shape."""
    value: "Expr"
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Forward:
    """`...node` in the arguments of an op built by a rule: the attributes of the matched
    `node` that the built op declares too, unless given explicitly."""
    name: str
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class GetAttr:
    obj: "Expr"
    name: str
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Index:
    obj: "Expr"
    index: "Expr"
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Slice:
    obj: "Expr"
    lo: Optional["Expr"]
    hi: Optional["Expr"]
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class BinOp:
    op: str                 # + - * / // % ** == != < <= > >= and or
    lhs: "Expr"
    rhs: "Expr"
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class UnaryOp:
    op: str                 # - + not
    operand: "Expr"
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Cond:
    test: "Expr"
    then: "Expr"
    orelse: "Expr"
    pos: Pos = attrs.field(eq=False)


Expr = Union[Num, Str, Name, ListLit, Call, GetAttr, Index, Slice, BinOp, UnaryOp, Cond]


def walk(expr):
    """Yield every sub-expression of `expr`, `expr` first."""
    yield expr
    if isinstance(expr, (ListLit,)):
        for e in expr.items:
            yield from walk(e)
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from walk(a)
        for _, v in expr.kwargs:
            yield from walk(v)
    elif isinstance(expr, Star):
        yield from walk(expr.value)
    elif isinstance(expr, Forward):
        yield Name(expr.name, expr.pos)
    elif isinstance(expr, GetAttr):
        yield from walk(expr.obj)
    elif isinstance(expr, Index):
        yield from walk(expr.obj)
        yield from walk(expr.index)
    elif isinstance(expr, Slice):
        yield from walk(expr.obj)
        for e in (expr.lo, expr.hi):
            if e is not None:
                yield from walk(e)
    elif isinstance(expr, BinOp):
        yield from walk(expr.lhs)
        yield from walk(expr.rhs)
    elif isinstance(expr, UnaryOp):
        yield from walk(expr.operand)
    elif isinstance(expr, Cond):
        yield from walk(expr.test)
        yield from walk(expr.then)
        yield from walk(expr.orelse)


# ---------------------------------------------------------------------------- ops
@attrs.frozen
class TypeEntry:
    star: bool
    expr: Expr


@attrs.frozen
class Operand:
    name: str
    elem: Expr                      # element type: typevar, dtype name or expression
    dims: tuple                     # TypeEntry
    optional: bool
    variadic: bool
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Attr:
    name: str
    kind: str                       # int ints float floats string dtype
    length: Optional[int]
    default: Optional[Expr]
    where: Optional[Expr]
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Check:
    expr: Expr
    message: str
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Trait:
    name: str
    args: tuple
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class OnnxClause:
    onnx_op: str
    since: Optional[int]
    until: Optional[int]
    maps: tuple                     # (onnx_name, target, Pos, (start, step) or None)
    sets: tuple                     # (attr_name, Expr, Pos)
    ignore: tuple                   # names
    checks: tuple                   # Check
    pos: Pos = attrs.field(eq=False)
    guard: Optional[Expr] = None    # `where` condition: the clause applies only when it holds
    lets: tuple = ()                # (name, Expr, Pos): values the settings share


@attrs.frozen
class OpDef:
    name: str
    doc: str
    traits: tuple                   # Trait
    inputs: tuple                   # Operand
    outputs: tuple                  # Operand
    attrs: tuple                    # Attr
    checks: tuple                   # Check
    verify_py: tuple                # (str, Pos)
    onnx: tuple                     # OnnxClause
    pos: Pos = attrs.field(eq=False)

    def trait_names(self) -> set[str]:
        return {t.name for t in self.traits}


@attrs.frozen
class Template:
    """`template Name(params) { op items }`: the items are kept as parsed, (kind, value)
    pairs, and substituted for each op made from the template."""
    name: str
    params: tuple
    items: tuple
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class OpInstance:
    """`op Name = Template(args) { more items }`."""
    name: str
    template: str
    args: tuple                     # Expr
    items: tuple                    # (kind, value) pairs added to the template's
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Group:
    """`group Name = A | B | ...`: ops and families (templates) a pattern may name at once."""
    name: str
    members: tuple
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class HelperParam:
    name: str
    star: bool
    optional: bool


@attrs.frozen
class Helper:
    """`helper module.name(params)`: a Python function of glowgen/speclib/<module>.py that
    spec expressions may call."""
    module: str
    name: str
    params: tuple                   # HelperParam
    pos: Pos = attrs.field(eq=False)

    def arity(self) -> tuple:
        """(fewest, most) positional arguments; most is None for a `*rest` parameter."""
        required = sum(1 for p in self.params if not p.optional and not p.star)
        most = None if any(p.star for p in self.params) else len(self.params)
        return required, most


@attrs.frozen
class TypeVar:
    name: str
    dtypes: tuple
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class FnDef:
    name: str
    params: tuple
    body: Expr
    pos: Pos = attrs.field(eq=False)


# ---------------------------------------------------------------------------- rules
@attrs.frozen
class PatOp:
    op: str
    args: tuple                     # patterns
    bind: Optional[str]
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class PatVar:
    name: str                       # "_" matches anything without binding
    bind: Optional[str]
    pos: Pos = attrs.field(eq=False)
    optional: bool = False          # `x?`: also matches an absent optional operand (binds none)


@attrs.frozen
class PatRest:
    name: str
    pos: Pos = attrs.field(eq=False)


def pattern_size(p) -> int:
    """Number of op nodes a pattern matches: larger patterns are tried first."""
    if isinstance(p, PatOp):
        return 1 + sum(pattern_size(a) for a in p.args)
    return 0


@attrs.frozen
class Rule:
    name: str
    phases: tuple                   # the phases the rule runs in, e.g. ("canonicalize", "lower")
    pattern: PatOp
    where: Optional[Expr]
    when: Optional[Expr]
    lets: tuple                     # (name, Expr)
    result: Expr
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Build:
    """`build name(params) = let ... expr`: a right-hand side with parameters."""
    name: str
    params: tuple
    lets: tuple                     # (name, Expr)
    result: Expr
    pos: Pos = attrs.field(eq=False)


# ---------------------------------------------------------------------------- kernels
@attrs.frozen
class Kernel:
    name: str
    params: tuple
    lets: tuple
    body: Expr
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class Scalar:
    name: str
    params: tuple
    lets: tuple
    body: Expr
    pos: Pos = attrs.field(eq=False)
    # Element type each parameter is written for (`scalar exp(x: f32)`), None where unsaid.
    dtypes: tuple = ()
    # Declared `increasing`: a range of the argument bounds the result (value ranges).
    increasing: bool = False


@attrs.frozen
class Extern:
    names: tuple
    pos: Pos = attrs.field(eq=False)


@attrs.frozen
class SpecFile:
    path: str
    items: tuple
