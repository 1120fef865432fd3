"""Elementwise primitives for the interpreter: the kernel expression trees of
`specs/cpu_kernels.glowdef`, rendered as NumPy closures once per kernel."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ...engine.types import numpy_dtype


def _is_int(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.integer)


def _div(a, b):
    if _is_int(a) and _is_int(b):
        # Integer division truncates toward zero (C and ONNX semantics), not floor.
        q = np.floor_divide(a, b)
        fix = (np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
        return q + fix
    return np.true_divide(a, b)


def _mod(a, b):
    return np.fmod(a, b) if not (_is_int(a) and _is_int(b)) else np.remainder(a, b)


_SQRT_PI_2 = 2.0 / math.sqrt(math.pi)


def erf(x):
    """erf in float64 to < 2e-7 relative error: a Taylor series near zero (where erf is
    tiny and 1 - erfc would cancel), Numerical Recipes' Chebyshev erfc elsewhere."""
    x64 = np.asarray(x, dtype=np.float64)
    z = np.abs(x64)
    small = z < 0.5
    zs = np.where(small, x64, 0.0)
    x2 = zs * zs
    term, total = zs.copy(), zs.copy()
    for n in range(1, 12):
        term = term * (-x2) / n
        total = total + term / (2 * n + 1)
    series = _SQRT_PI_2 * total
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    with np.errstate(over="ignore", under="ignore"):
        erfc = t * np.exp(poly)
    big = np.sign(x64) * (1.0 - erfc)
    out = np.where(small, series, big)
    return out.astype(np.asarray(x).dtype) if np.asarray(x).dtype.kind == "f" else out


def _fdtype(*xs):
    dt = np.result_type(*[np.asarray(x) if not isinstance(x, (int, float)) else x for x in xs])
    return dt if dt.kind == "f" else np.dtype(np.float32)


def _ldexp(x, n):
    """x * 2**n for integral-valued n (see backends/cpu/scalar.py for the exact semantics)."""
    dt = _fdtype(x, n)
    x, n = np.asarray(x, dt), np.asarray(n, dt)
    k = np.clip(np.where(np.isnan(n), 0, n), -10000, 10000).astype(np.int32)
    return np.where(np.isnan(n), n, np.ldexp(x, k)).astype(dt)


def _frexp_mant(x):
    x = np.asarray(x, _fdtype(x))
    return np.frexp(x)[0]


def _frexp_exp(x):
    x = np.asarray(x, _fdtype(x))
    return np.frexp(x)[1].astype(x.dtype)


def _fma(a, b, c):
    """a * b + c rounded once for f16/f32 (exact in float64, then one rounding)."""
    dt = _fdtype(a, b, c)
    if dt.itemsize < 8:
        r = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
        return r.astype(dt)
    return np.asarray(a, dt) * np.asarray(b, dt) + np.asarray(c, dt)


def _copysign(a, b):
    dt = _fdtype(a, b)
    return np.copysign(np.asarray(a, dt), np.asarray(b, dt))


def _cast(x, dtype):
    return np.asarray(x).astype(numpy_dtype(dtype))


NUMPY_FUNCS: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "mod": _mod,
    "pow": np.power, "neg": np.negative,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "not": np.logical_not,
    "select": np.where, "max": np.maximum, "min": np.minimum, "abs": np.abs, "sign": np.sign,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "erf": erf,
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "round": np.round, "log1p": np.log1p, "expm1": np.expm1,
    "sin": np.sin, "cos": np.cos, "cast": _cast, "isnan": np.isnan, "isinf": np.isinf,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "fmod": np.fmod, "bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor,
    "bitnot": np.invert, "shl": np.left_shift, "shr": np.right_shift,
    "rem": np.remainder,
    "ldexp": _ldexp, "scale2": _ldexp, "frexp_mant": _frexp_mant, "frexp_exp": _frexp_exp, "fma": _fma,
    "copysign": _copysign,
}


def compile_tree(tree, scalars: dict) -> Callable:
    """Turn a kernel tree into `f(args, attrs) -> array`.

    The interpreter is the reference: a function NumPy implements (exp, log, tanh, ...) is
    NumPy's even when the spec also has a `scalar` definition of it (the approximation the
    CPU backend compiles); only names without a NumPy function are inlined from the spec."""
    kind = tree[0]
    if kind == "param":
        i = tree[1]
        return lambda args, attrs: args[i]
    if kind == "const":
        v = tree[1]
        return lambda args, attrs: v
    if kind == "attr":
        name = tree[1]
        return lambda args, attrs: attrs[name]
    if kind == "dtype":
        name = tree[1]
        return lambda args, attrs: name
    if kind == "call":
        fname, subtrees = tree[1], tree[2]
        subs = [compile_tree(t, scalars) for t in subtrees]
        if fname not in NUMPY_FUNCS and fname in scalars:
            inner = compile_tree(scalars[fname]["body"], scalars)
            return lambda args, attrs: inner([s(args, attrs) for s in subs], attrs)
        fn = NUMPY_FUNCS[fname]
        if len(subs) == 1:
            s0 = subs[0]
            return lambda args, attrs: fn(s0(args, attrs))
        if len(subs) == 2:
            s0, s1 = subs
            return lambda args, attrs: fn(s0(args, attrs), s1(args, attrs))
        return lambda args, attrs: fn(*[s(args, attrs) for s in subs])
    raise ValueError(f"bad kernel tree node {tree!r}")


class ElementwiseKernels:
    """Compiled NumPy closures for every kernel of a registry."""

    def __init__(self, registry):
        self._fns = {name: compile_tree(k["body"], registry.scalars)
                     for name, k in registry.kernels.items()}

    def __contains__(self, op: str) -> bool:
        return op in self._fns

    def run(self, op: str, args: list, attrs: dict, out_dtype: np.dtype):
        # NumPy warns on overflow to inf, log(0) and the like; those are the
        # IEEE results the semantics ask for.
        with np.errstate(all="ignore"):
            result = self._fns[op](args, attrs)
        return np.asarray(result).astype(out_dtype, copy=False)
