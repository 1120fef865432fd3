"""Emit `generated/kernels.py`: elementwise semantics as expression trees.

A kernel body becomes a tree of tuples, `("call", fn, args)`, `("param", i)`,
`("const", v)`, `("attr", name)`, `("dtype", name)`.  Backends render the same tree
their own way: the interpreter with NumPy, the CPU backend as LLVM IR.
"""
from __future__ import annotations

import pprint

from ..engine.types import DTYPES
from ..scalars import SCALAR_FUNCTIONS
from . import ast as A
from .pyexpr import spec_error, unparse
from .specs import SpecSet

# The scalar functions a kernel may call, with their arity (glowgen/scalars.py).
KERNEL_FUNCS = {f.name: f.arity for f in SCALAR_FUNCTIONS.values()}
_BINOPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "**": "pow",
           "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne",
           "and": "and", "or": "or"}


class _KernelTranslator:
    def __init__(self, specs: SpecSet, owner, params, attrs_):
        self.specs, self.owner = specs, owner
        self.env = {p: ("param", i) for i, p in enumerate(params)}
        self.attrs = attrs_

    def tree(self, e):
        if isinstance(e, A.Num):
            return ("const", e.value)
        if isinstance(e, A.Name):
            if e.id in self.env:
                return self.env[e.id]
            if e.id in DTYPES:
                return ("dtype", e.id)
            if e.id == "inf":
                return ("const", float("inf"))
            if e.id == "nan":
                return ("const", float("nan"))
            raise spec_error(f"undefined name {e.id!r} in kernel {self.owner}", e.pos)
        if isinstance(e, A.GetAttr):
            if isinstance(e.obj, A.Name) and e.obj.id == "attr":
                if self.attrs is None or e.name not in self.attrs:
                    raise spec_error(f"kernel {self.owner}: op has no attribute {e.name!r}", e.pos)
                return ("attr", e.name)
            raise spec_error(f"kernel {self.owner}: only attr.NAME may be used with '.'", e.pos)
        if isinstance(e, A.BinOp):
            return ("call", _BINOPS[e.op], (self.tree(e.lhs), self.tree(e.rhs)))
        if isinstance(e, A.UnaryOp):
            inner = self.tree(e.operand)
            return inner if e.op == "+" else ("call", "neg" if e.op == "-" else "not", (inner,))
        if isinstance(e, A.Cond):
            return ("call", "select", (self.tree(e.test), self.tree(e.then), self.tree(e.orelse)))
        if isinstance(e, A.Call):
            if e.kwargs:
                raise spec_error("kernel functions take no keyword arguments", e.pos)
            args = tuple(self.tree(a) for a in e.args)
            if e.func == "poly":
                # poly(x, c0, c1, ..., cn) = c0 + c1 x + ... + cn x**n, by Horner's rule with
                # one fused multiply-add per coefficient: fma(...fma(cn, x, cn-1)..., x, c0).
                if len(args) < 3:
                    raise spec_error("poly(x, c0, c1, ...) takes the variable and at least two "
                                     "coefficients", e.pos)
                x, coeffs = args[0], args[1:]
                acc = coeffs[-1]
                for c in reversed(coeffs[:-1]):
                    acc = ("call", "fma", (acc, x, c))
                return acc
            if e.func in self.specs.scalars:
                sc = self.specs.scalars[e.func]
                if len(args) != len(sc.params):
                    raise spec_error(f"scalar {e.func} takes {len(sc.params)} arguments", e.pos)
                return ("call", e.func, args)
            if e.func not in KERNEL_FUNCS:
                raise spec_error(f"unknown kernel function {e.func!r}; kernels may use "
                                 f"{', '.join(sorted(KERNEL_FUNCS))} and scalar definitions", e.pos)
            if len(args) != KERNEL_FUNCS[e.func]:
                raise spec_error(f"{e.func} takes {KERNEL_FUNCS[e.func]} arguments, got {len(args)}", e.pos)
            return ("call", e.func, args)
        raise spec_error(f"kernel {self.owner}: {unparse(e)!r} is not a scalar expression",
                         getattr(e, "pos", None))

    def body(self, lets, result):
        for name, e in lets:
            self.env[name] = self.tree(e)
        return self.tree(result)


def _calls(tree, out: set) -> set:
    if tree[0] == "call":
        out.add(tree[1])
        for t in tree[2]:
            _calls(t, out)
    return out


def _check_recursion(specs: SpecSet, scalars: dict) -> None:
    """A scalar definition may call its own name only when that name is also a built-in
    (`scalar exp` may use the built-in `exp`); backends then take the built-in.  Any
    other cycle would inline forever."""
    graph = {n: {c for c in _calls(s["body"], set()) if c in scalars and c not in KERNEL_FUNCS}
             for n, s in scalars.items()}
    state: dict = {}

    def visit(n, path):
        if state.get(n) == "done":
            return
        if state.get(n) == "open":
            cycle = path[path.index(n):] + [n]
            raise spec_error(f"scalar definitions call each other in a cycle: {' -> '.join(cycle)}",
                             specs.scalars[n].pos)
        state[n] = "open"
        for c in sorted(graph[n]):
            visit(c, path + [n])
        state[n] = "done"

    for n in scalars:
        visit(n, [])


def emit_kernels(specs: SpecSet) -> str:
    kernels = {}
    for k in specs.kernels.values():
        op = specs.ops[k.name]
        t = _KernelTranslator(specs, k.name, k.params, {a.name for a in op.attrs})
        kernels[k.name] = {"params": tuple(k.params), "body": t.body(k.lets, k.body),
                           "source": unparse(k.body), "location": str(k.pos)}
    scalars = {}
    for s in specs.scalars.values():
        for d in s.dtypes:
            if d is not None and d not in DTYPES:
                raise spec_error(f"scalar {s.name}: unknown element type {d!r}", s.pos)
        builtin = SCALAR_FUNCTIONS.get(s.name)
        if s.increasing and (len(s.params) != 1 or builtin is None or not builtin.increasing):
            # The bounds of the result are the exact function's values at the argument's
            # bounds, so an increasing scalar must approximate a built-in that is increasing.
            raise spec_error(f"scalar {s.name}: only an increasing one-argument built-in function "
                             f"({', '.join(sorted(f.name for f in SCALAR_FUNCTIONS.values() if f.increasing))}) "
                             f"can be declared increasing", s.pos)
        t = _KernelTranslator(specs, s.name, s.params, None)
        scalars[s.name] = {"params": tuple(s.params), "dtypes": tuple(s.dtypes),
                           "body": t.body(s.lets, s.body), "location": str(s.pos)}
        if s.increasing:
            scalars[s.name]["increasing"] = True
    _check_recursion(specs, scalars)
    externs = sorted(n for n, _ in specs.externs)
    return "\n".join([
        "# Elementwise kernels: expression trees over ('param', i), ('const', v), ('attr', name),",
        "# ('dtype', name) and ('call', fn, args).",
        "",
        "inf, nan = float('inf'), float('nan')     # as pprint writes them",
        "",
        "KERNELS = " + pprint.pformat(kernels, width=100, sort_dicts=False),
        "",
        "SCALARS = " + pprint.pformat(scalars, width=100, sort_dicts=False),
        "",
        "# Primitives the CPU backend implements with hand-written loop nests.",
        "EXTERN = " + pprint.pformat(tuple(externs), width=100),
        "",
    ])
