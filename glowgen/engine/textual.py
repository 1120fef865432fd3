"""The textual form of a graph: printed by `glowgen dump`, parsed back by tests.

    graph main {
      input %x: f32[1, 3, 8, 8]
      const %w: f32[3] = dense<[0.5, -1.25, 2.0]>
      %r = SomeOp(%x, %w) {axis = 1} : f32[1, 3, 8, 8]
      output "y" = %r
    }

Constants print their data (`dense<...>`, or `splat<v>` when every element is equal);
larger ones than `max_elements` print `elided<N values>` and need their data passed
to `parse_function(constants=...)`.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Optional

import lark
import numpy as np

from ..errors import GlowgenError, ParseError
from .graph import Constant, Function, Value
from .types import Quant, Type, numpy_dtype

_BARE = re.compile(r"^[A-Za-z0-9_.\/\-]+(:[A-Za-z0-9_.\/\-]+)*$")


def value_ref(v: Value) -> str:
    return "%" + (v.name if _BARE.match(v.name) else '"' + v.name.replace('\\', '\\\\').replace('"', '\\"') + '"')


def _num(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "1" if x else "0"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    f = float(x)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if isinstance(x, np.floating):
        return str(x)       # the shortest text that reads back to the same value at its precision
    return repr(f)


def _literal(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace('\\', '\\\\').replace('"', '\\"') + '"'
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    return _num(v)


def _constant_data(c: Constant, max_elements: Optional[int]) -> str:
    flat = c.data.reshape(-1)
    if flat.size > 1 and c.data.dtype.kind != "O" and np.all(flat == flat[0]) and not (
            flat.dtype.kind == "f" and np.isnan(flat[0])):
        return f"splat<{_num(flat[0])}>"
    if max_elements is not None and flat.size > max_elements:
        return f"elided<{flat.size} values>"
    return "dense<[" + ", ".join(_num(x) for x in flat) + "]>"


def print_function(fn: Function, max_elements: Optional[int] = None, trace: bool = False) -> str:
    """The textual form of `fn`; `max_elements` elides large constants (dumps of big models)."""
    lines = [f"graph {fn.name} {{"]
    for p in fn.placeholders:
        lines.append(f"  input {value_ref(p)}: {p.type}")
    for c in fn.constants:
        lines.append(f"  const {value_ref(c)}: {c.type} = {_constant_data(c, max_elements)}")
    for n in fn.nodes:
        operands = []
        for v in n.inputs:
            if v is None:
                operands.append("_")
            elif isinstance(v, tuple):
                operands.append("[" + ", ".join(value_ref(x) for x in v) + "]")
            else:
                operands.append(value_ref(v))
        attrs = n.attr_values()
        attr_text = (" {" + ", ".join(f"{k} = {_literal(v)}" for k, v in attrs.items()) + "}") if attrs else ""
        results = ", ".join(value_ref(o) for o in n.outputs)
        types = ", ".join(str(o.type) for o in n.outputs)
        line = f"  {results} = {n.OP}({', '.join(operands)}){attr_text} : {types}"
        if trace and (n.origin or n.rules):
            line += f"  # from {', '.join(n.origin) or '?'}" + (f" via {', '.join(n.rules)}" if n.rules else "")
        lines.append(line)
        # Sub-functions (a conditional's branches), indented under their node.  (Printed
        # for reading: the parser reads graphs without control flow.)
        for sub in n.subfunctions():
            text = print_function(sub, max_elements, trace)
            lines.extend("    " + t for t in text.rstrip("\n").split("\n"))
    for name, v in fn.outputs:
        lines.append(f"  output {_literal(name)} = {value_ref(v)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- parsing
_GRAMMAR = r"""
start: "graph" NAME "{" item* "}"
?item: input | const | node | output
input: "input" VALUE ":" type
const: "const" VALUE ":" type "=" cdata
cdata: DENSE                                           -> dense
     | "splat" "<" number ">"                          -> splat
     | "elided" "<" INT "values" ">"                   -> elided
node: VALUE ("," VALUE)* "=" NAME "(" [operand ("," operand)*] ")" [attrs] ":" type ("," type)*
?operand: VALUE                                        -> ref
        | "_"                                          -> absent
        | "[" [VALUE ("," VALUE)*] "]"                 -> refs
attrs: "{" [attr ("," attr)*] "}"
attr: NAME "=" literal
?literal: number | STRING -> string | "[" [literal ("," literal)*] "]" -> list
output: "output" STRING "=" VALUE
type: NAME "[" [INT ("," INT)*] "]" [quant]
quant: "q" "(" number "," number ")"
number: SIGNED_NUMBER | INF | NAN
INF: /-?inf/
DENSE: /dense\s*<\s*\[[^\]]*\]\s*>/
NAN: "nan"
VALUE: /%[A-Za-z0-9_.\/\-]+(:[A-Za-z0-9_.\/\-]+)*/ | /%"(\\.|[^"\\])*"/
NAME: /[A-Za-z_][A-Za-z0-9_]*/
STRING: /"(\\.|[^"\\])*"/
%import common.SIGNED_NUMBER
%import common.INT
%import common.WS
COMMENT: /#[^\n]*/
%ignore WS
%ignore COMMENT
"""


@lru_cache(maxsize=1)
def _parser():
    return lark.Lark(_GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _unquote(s: str) -> str:
    return s[1:-1].replace('\\"', '"').replace('\\\\', '\\')


def _vname(tok) -> str:
    s = str(tok)[1:]
    return _unquote(s) if s.startswith('"') else s


def _number(tree):
    tok = str(tree.children[0])
    if tok in ("inf", "-inf", "nan"):
        return float(tok)
    return int(tok) if re.fullmatch(r"[-+]?\d+", tok) else float(tok)


def _dense_data(token: str, dtype, shape, cname: str, where: str) -> np.ndarray:
    """The array of a `dense<[...]>` constant.  The whole list is one token, converted by
    NumPy: a large constant lexed number by number made the parse the slowest part of
    compiling a test graph (51,200 int8 weights: 2.4 s of 2.5)."""
    body = token[token.index("[") + 1:token.rindex("]")].strip()
    words = [w.strip() for w in body.split(",")] if body else []
    try:
        if np.dtype(dtype).kind in "iub":   # exactly, even past float64's 53 bits
            vals = [int(w) if re.fullmatch(r"[-+]?\d+", w) else float(w) for w in words]
            arr = np.array(vals, dtype)
        else:
            arr = np.array(words, np.float64).astype(dtype)
        return arr.reshape(shape)
    except ValueError:
        raise ParseError(f"{where}: constant %{cname}: its data is not {int(np.prod(shape))} "
                         f"numbers ({len(words)} values, or one is not a number)") from None


def _lit(t):
    if isinstance(t, lark.Tree):
        if t.data == "number":
            return _number(t)
        if t.data == "string":
            return _unquote(str(t.children[0]))
        if t.data == "list":
            return tuple(_lit(x) for x in t.children if x is not None)
    raise ParseError(f"bad literal {t!r}")


def parse_function(text: str, registry, constants: Optional[dict] = None) -> Function:
    """Parse the textual form back into a Function (types are re-inferred and checked)."""
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedInput as e:
        raise ParseError(f"line {e.line}, column {e.column}: cannot parse the graph text here:\n"
                         f"{e.get_context(text)}") from None
    name, *items = tree.children
    fn = Function(str(name))
    env: dict[str, Value] = {}

    def where(t):
        return f"line {t.meta.line}"

    def ty(t) -> Type:
        dtype, *dims, quant = t.children
        q = Quant(_number(quant.children[0]), _number(quant.children[1])) if quant is not None else None
        return Type(str(dtype), tuple(int(d) for d in dims if d is not None), q)

    for item in items:
        try:
            if item.data == "input":
                v, t = item.children
                env[_vname(v)] = fn.add_placeholder(_vname(v), ty(t))
            elif item.data == "const":
                v, t, data = item.children
                t = ty(t)
                cname = _vname(v)
                if data.data == "elided":
                    if not constants or cname not in constants:
                        raise ParseError(f"{where(item)}: constant %{cname} is elided; pass its "
                                         f"data in constants={{{cname!r}: array}}")
                    arr = np.asarray(constants[cname])
                elif data.data == "splat":
                    arr = np.full(t.shape, _number(data.children[0]), numpy_dtype(t.dtype))
                else:
                    arr = _dense_data(str(data.children[0]), numpy_dtype(t.dtype), t.shape, cname,
                                      where(item))
                if Type.of(arr) != t:
                    raise ParseError(f"{where(item)}: constant %{cname} data has type {Type.of(arr)}, "
                                     f"declared {t}")
                env[cname] = fn.add_constant(arr, cname)
            elif item.data == "node":
                ch = list(item.children)
                results = []
                while isinstance(ch[0], lark.Token) and ch[0].type == "VALUE":
                    results.append(_vname(ch.pop(0)))
                op = str(ch.pop(0))
                operands, attrs_, types = [], {}, []
                for c in ch:
                    if c is None:
                        continue
                    if isinstance(c, lark.Tree) and c.data == "ref":
                        operands.append(_lookup(env, _vname(c.children[0]), item))
                    elif isinstance(c, lark.Tree) and c.data == "absent":
                        operands.append(None)
                    elif isinstance(c, lark.Tree) and c.data == "refs":
                        operands.append(tuple(_lookup(env, _vname(x), item) for x in c.children if x is not None))
                    elif isinstance(c, lark.Tree) and c.data == "attrs":
                        for a in c.children:
                            if a is not None:
                                attrs_[str(a.children[0])] = _lit(a.children[1])
                    elif isinstance(c, lark.Tree) and c.data == "type":
                        types.append(ty(c))
                cls = registry.op(op)
                node = fn.add_node(cls, operands, attrs_, name=results[0], output_names=results)
                got = [o.type for o in node.outputs]
                if got != types[:len(got)] or len(types) != len(got):
                    raise ParseError(f"{where(item)}: {op} %{results[0]} is declared "
                                     f"{', '.join(map(str, types))} but infers {', '.join(map(str, got))}")
                for rname, o in zip(results, node.outputs):
                    env[rname] = o
            elif item.data == "output":
                s, v = item.children
                fn.add_output(_unquote(str(s)), _lookup(env, _vname(v), item))
        except ParseError:
            raise
        except GlowgenError as e:
            raise ParseError(f"{where(item)}: {e}") from None
    return fn


def _lookup(env, name, item):
    try:
        return env[name]
    except KeyError:
        raise ParseError(f"line {item.meta.line}: %{name} is used before it is defined") from None


# ----------------------------------------------------------------------------- Graphviz
def to_dot(fn: Function) -> str:
    """Graphviz DOT: nodes are boxes (op and attributes), inputs and constants ellipses."""
    def q(s):
        return '"' + str(s).replace('\\', '\\\\').replace('"', '\\"') + '"'

    ids: dict[int, str] = {}
    lines = [f"digraph {q(fn.name)} {{", "  rankdir=TB;", "  node [fontname=\"Helvetica\", fontsize=10];"]
    for i, p in enumerate(fn.placeholders):
        ids[id(p)] = f"in{i}"
        lines.append(f"  in{i} [shape=ellipse, style=filled, fillcolor=lightblue, "
                     f"label={q(p.name + chr(10) + str(p.type))}];")
    for i, c in enumerate(fn.constants):
        ids[id(c)] = f"c{i}"
        lines.append(f"  c{i} [shape=ellipse, style=filled, fillcolor=lightgrey, "
                     f"label={q(c.name + chr(10) + str(c.type))}];")
    for i, n in enumerate(fn.nodes):
        for o in n.outputs:
            ids[id(o)] = f"n{i}"
        attrs = "\n".join(f"{k} = {_literal(v)}" for k, v in n.attr_values().items())
        label = f"{n.OP}\n{n.name}" + (f"\n{attrs}" if attrs else "") + "\n" + ", ".join(str(o.type) for o in n.outputs)
        lines.append(f"  n{i} [shape=box, style=rounded, label={q(label)}];")
        for v in n.flat_inputs():
            lines.append(f"  {ids[id(v)]} -> n{i};")
    for i, (name, v) in enumerate(fn.outputs):
        lines.append(f"  out{i} [shape=ellipse, style=filled, fillcolor=palegreen, label={q(name)}];")
        lines.append(f"  {ids[id(v)]} -> out{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"
