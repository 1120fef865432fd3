"""Parse `.glowdef` text into the spec AST (`dsl/ast.py`)."""
from __future__ import annotations

import ast as pyast
from functools import lru_cache
from pathlib import Path

import lark
from lark import Token, Transformer, v_args

from ..errors import SpecError
from . import ast as A

_GRAMMAR = Path(__file__).with_name("grammar.lark")


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(_GRAMMAR.read_text(), parser="lalr", propagate_positions=True,
                     maybe_placeholders=True)


_EXPECTED_NAMES = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'",
    "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "STAR": "'*'",
}


def _describe_expected(expected) -> str:
    names = sorted({_EXPECTED_NAMES.get(e, e.strip('"').lower()) for e in expected})
    if len(names) > 8:
        names = names[:8] + ["..."]
    return ", ".join(names)


class _ToAst(Transformer):
    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _pos(self, meta_or_tok) -> A.Pos:
        line = getattr(meta_or_tok, "line", 0) or 0
        col = getattr(meta_or_tok, "column", 0) or 0
        return A.Pos(self.file, line, col)

    # ---------------------------------------------------------------- expressions
    @v_args(meta=True)
    def int_lit(self, meta, c):
        return A.Num(int(c[0]), self._pos(c[0]))

    @v_args(meta=True)
    def float_lit(self, meta, c):
        return A.Num(float(c[0]), self._pos(c[0]))

    @v_args(meta=True)
    def str_lit(self, meta, c):
        return A.Str(_unquote(c[0]), self._pos(c[0]))

    @v_args(meta=True)
    def name(self, meta, c):
        return A.Name(str(c[0]), self._pos(c[0]))

    @v_args(meta=True)
    def list_lit(self, meta, c):
        return A.ListLit(tuple(x for x in c if x is not None), self._pos(meta))

    @v_args(meta=True)
    def cond(self, meta, c):
        then, test, orelse = c
        return A.Cond(test, then, orelse, self._pos(meta))

    @v_args(meta=True)
    def or_(self, meta, c):
        return A.BinOp("or", c[0], c[1], self._pos(meta))

    @v_args(meta=True)
    def and_(self, meta, c):
        return A.BinOp("and", c[0], c[1], self._pos(meta))

    @v_args(meta=True)
    def not_(self, meta, c):
        return A.UnaryOp("not", c[0], self._pos(meta))

    @v_args(meta=True)
    def compare(self, meta, c):
        return A.BinOp(str(c[1]), c[0], c[2], self._pos(c[1]))

    @v_args(meta=True)
    def binop(self, meta, c):
        return A.BinOp(str(c[1]), c[0], c[2], self._pos(c[1]))

    @v_args(meta=True)
    def unary(self, meta, c):
        return A.UnaryOp(str(c[0]), c[1], self._pos(meta))

    @v_args(meta=True)
    def pow(self, meta, c):
        return A.BinOp("**", c[0], c[1], self._pos(meta))

    @v_args(meta=True)
    def getattr(self, meta, c):
        return A.GetAttr(c[0], str(c[1]), self._pos(c[1]))

    @v_args(meta=True)
    def index(self, meta, c):
        return A.Index(c[0], c[1], self._pos(meta))

    @v_args(meta=True)
    def slice(self, meta, c):
        return A.Slice(c[0], c[1], c[2], self._pos(meta))

    @v_args(meta=True)
    def call(self, meta, c):
        func, arglist = c
        args, kwargs = [], []
        for a in (arglist or []):
            if isinstance(a, tuple):
                kwargs.append(a)
            elif isinstance(a, A.Forward):
                args.append(a)          # `...node` may come anywhere
            else:
                if kwargs:
                    raise SpecError("positional argument after keyword argument",
                                    self.file, meta.line, meta.column)
                args.append(a)
        return A.Call(str(func), tuple(args), tuple(kwargs), self._pos(func))

    def arglist(self, c):
        return c

    def kwarg(self, c):
        return (str(c[0]), c[1])

    @v_args(meta=True)
    def star_arg(self, meta, c):
        return A.Star(c[1], self._pos(c[0]))

    @v_args(meta=True)
    def forward_arg(self, meta, c):
        return A.Forward(str(c[1]), self._pos(c[0]))

    # ---------------------------------------------------------------- declarations
    def start(self, c):
        return c

    def name_list(self, c):
        return tuple(str(x) for x in c)

    @v_args(meta=True)
    def typevar_def(self, meta, c):
        return A.TypeVar(str(c[0]), tuple(str(x) for x in c[1:]), self._pos(meta))

    @v_args(meta=True)
    def fn_def(self, meta, c):
        return A.FnDef(str(c[0]), c[1] or (), c[2], self._pos(meta))

    def doc(self, c):
        return ("doc", " ".join(_unquote(s) for s in c))

    @v_args(meta=True)
    def trait(self, meta, c):
        return A.Trait(str(c[0]), c[1] or (), self._pos(meta))

    def traits(self, c):
        return ("traits", tuple(c))

    def inputs(self, c):
        return ("in", tuple(c))

    def outputs(self, c):
        return ("out", tuple(c))

    def type_entry(self, c):
        return A.TypeEntry(c[0] is not None, c[1])

    @v_args(meta=True)
    def operand(self, meta, c):
        name = str(c[0])
        rest = list(c[1:])
        variadic = rest.pop() is not None
        optional = rest.pop() is not None
        if not rest or rest[0].star:
            raise SpecError(f"operand {name!r}: the first entry of Tensor[...] is the element type",
                            self.file, meta.line, meta.column)
        return A.Operand(name, rest[0].expr, tuple(rest[1:]), optional, variadic, self._pos(meta))

    @v_args(meta=True)
    def attr_decl(self, meta, c):
        name, kind, length, default, where = c
        return ("attr", A.Attr(str(name), str(kind), int(length) if length is not None else None,
                               default, where, self._pos(meta)))

    @v_args(meta=True)
    def check(self, meta, c):
        return ("check", A.Check(c[0], _unquote(c[1]), self._pos(meta)))

    @v_args(meta=True)
    def verify_py(self, meta, c):
        return ("verify", (_unquote(c[0]), self._pos(meta)))

    def since(self, c):
        return int(c[0])

    def until(self, c):
        return int(c[0])

    @v_args(meta=True)
    def onnx_map(self, meta, c):
        return ("map", (str(c[0]), str(c[2]), self._pos(meta), c[1]))

    def onnx_every(self, c):
        return (int(c[0]), int(c[1]))

    @v_args(meta=True)
    def onnx_set(self, meta, c):
        return ("set", (str(c[0]), c[1], self._pos(meta)))

    def onnx_ignore(self, c):
        return ("ignore", tuple(str(x) for x in c))

    def onnx_name(self, c):
        return ".".join(str(x) for x in c)

    def onnx_guard(self, c):
        return c[0]

    @v_args(meta=True)
    def onnx_let(self, meta, c):
        return ("let", (str(c[0]), c[1], self._pos(meta)))

    @v_args(meta=True)
    def onnx_clause(self, meta, c):
        name, since, until, guard, *items = c
        maps, sets, ignore, checks, lets = [], [], [], [], []
        for kind, val in items:
            if kind == "map":
                maps.append(val)
            elif kind == "set":
                sets.append(val)
            elif kind == "ignore":
                ignore.extend(val)
            elif kind == "let":
                lets.append(val)
            else:
                checks.append(val)
        return ("onnx", A.OnnxClause(str(name), since, until, tuple(maps), tuple(sets),
                                     tuple(ignore), tuple(checks), self._pos(meta), guard,
                                     tuple(lets)))

    @v_args(meta=True)
    def op_def(self, meta, c):
        return op_from_items(str(c[0]), c[1:], self._pos(meta))

    @v_args(meta=True)
    def op_inst(self, meta, c):
        name, template, args, *items = c
        args = args or []
        if any(isinstance(a, tuple) for a in args):
            raise SpecError("template arguments are positional", self.file, meta.line, meta.column)
        return A.OpInstance(str(name), str(template), tuple(args),
                            tuple(i for i in items if i is not None), self._pos(meta))

    @v_args(meta=True)
    def template_def(self, meta, c):
        name, params, *items = c
        return A.Template(str(name), tuple(params or ()), tuple(items), self._pos(meta))

    @v_args(meta=True)
    def group_def(self, meta, c):
        return A.Group(str(c[0]), tuple(str(x) for x in c[1:]), self._pos(meta))

    def doc_param(self, c):
        return ("doc_param", str(c[0]))

    @v_args(meta=True)
    def helper_def(self, meta, c):
        module, name, *params = c
        params = tuple(p for p in params if p is not None)
        return A.Helper(str(module), str(name), params, self._pos(meta))

    def helper_param(self, c):
        star, name, optional = c
        return A.HelperParam(str(name), star is not None, optional is not None)

    # ---------------------------------------------------------------- rules
    @v_args(meta=True)
    def pattern(self, meta, c):
        term, bind = c
        bind = str(bind) if bind is not None else None
        if isinstance(term, A.PatRest):
            if bind:
                raise SpecError("a rest pattern '*name' cannot be bound with 'as'",
                                self.file, meta.line, meta.column)
            return term
        return attrs_evolve(term, bind=bind)

    @v_args(meta=True)
    def pat_op(self, meta, c):
        return A.PatOp(str(c[0]), tuple(x for x in c[1:] if x is not None), None, self._pos(c[0]))

    @v_args(meta=True)
    def pat_var(self, meta, c):
        return A.PatVar(str(c[0]), None, self._pos(c[0]))

    @v_args(meta=True)
    def pat_opt(self, meta, c):
        return A.PatVar(str(c[0]), None, self._pos(c[0]), optional=True)

    @v_args(meta=True)
    def pat_rest(self, meta, c):
        return A.PatRest(str(c[1]), self._pos(c[1]))

    def where(self, c):
        return c[0]

    def when(self, c):
        return c[0]

    @v_args(meta=True)
    def let_binding(self, meta, c):
        return (str(c[0]), c[1])

    def phases(self, c):
        return tuple(str(x) for x in c)

    @v_args(meta=True)
    def rule_def(self, meta, c):
        name, phases, pattern, where, when, *rest = c
        lets, result = tuple(rest[:-1]), rest[-1]
        if not isinstance(pattern, A.PatOp):
            raise SpecError(f"rule {name}: the left-hand side must be an op pattern",
                            self.file, meta.line, meta.column)
        return A.Rule(str(name), phases, pattern, where, when, lets, result, self._pos(meta))

    @v_args(meta=True)
    def build_def(self, meta, c):
        name, params, *rest = c
        return A.Build(str(name), tuple(str(p) for p in params or ()), tuple(rest[:-1]), rest[-1],
                       self._pos(meta))

    # ---------------------------------------------------------------- kernels
    @v_args(meta=True)
    def kernel_def(self, meta, c):
        name, params, *rest = c
        return A.Kernel(str(name), params or (), tuple(rest[:-1]), rest[-1], self._pos(meta))

    @v_args(meta=True)
    def scalar_def(self, meta, c):
        name, params, increasing, *rest = c
        params = params or ()
        return A.Scalar(str(name), tuple(p for p, _ in params), tuple(rest[:-1]), rest[-1],
                        self._pos(meta), tuple(t for _, t in params), increasing is not None)

    def scalar_params(self, c):
        return tuple(c)

    def scalar_param(self, c):
        return (str(c[0]), str(c[1]) if c[1] is not None else None)

    @v_args(meta=True)
    def extern_def(self, meta, c):
        return A.Extern(tuple(str(x) for x in c), self._pos(meta))


def op_from_items(name: str, items, pos: A.Pos) -> A.OpDef:
    """An op declaration from its items, (kind, value) pairs in the order written."""
    fields = {"doc": [], "traits": [], "in": [], "out": [], "attr": [], "check": [],
              "verify": [], "onnx": []}
    for kind, val in items:
        if kind == "doc_param":
            raise SpecError(f"op {name}: 'doc {val}' names a template parameter outside a "
                            f"template", pos.file, pos.line, pos.column)
        if kind in ("traits", "in", "out"):
            fields[kind].extend(val)
        else:
            fields[kind].append(val)
    return A.OpDef(name, " ".join(fields["doc"]), tuple(fields["traits"]), tuple(fields["in"]),
                   tuple(fields["out"]), tuple(fields["attr"]), tuple(fields["check"]),
                   tuple(fields["verify"]), tuple(fields["onnx"]), pos)


def attrs_evolve(obj, **changes):
    import attrs as _attrs
    return _attrs.evolve(obj, **changes)


def _unquote(tok: Token) -> str:
    return pyast.literal_eval(str(tok))


@lru_cache(maxsize=16)
def parse_text(text: str, file: str) -> A.SpecFile:
    """Parse one spec file; syntax errors become `SpecError` with file:line:col.

    Remembered by text and name: the result is immutable (frozen attrs, tuples), and a
    process that loads the same specs again (`regen` then `regen --check`, the spec tests
    that each change one file of a copy) parses each unchanged file once, not 0.7 s a time.
    An error is not remembered."""
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedCharacters as e:
        raise SpecError(f"unexpected character {text[e.pos_in_stream]!r}", file, e.line, e.column) from None
    except lark.UnexpectedToken as e:
        tok = e.token
        got = "end of file" if tok.type == "$END" else repr(str(tok))
        raise SpecError(f"unexpected {got}; expected {_describe_expected(e.expected)}",
                        file, e.line if e.line != -1 else text.count("\n") + 1,
                        e.column if e.column != -1 else 1) from None
    except lark.UnexpectedEOF:
        raise SpecError("unexpected end of file", file, text.count("\n") + 1, 1) from None
    try:
        items = _ToAst(file).transform(tree)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, SpecError):
            raise e.orig_exc from None
        raise
    return A.SpecFile(file, tuple(items))


def parse_file(path: Path, display_name: str | None = None) -> A.SpecFile:
    return parse_text(Path(path).read_text(), display_name or str(path))
