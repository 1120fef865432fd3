"""The scalar functions an elementwise kernel may call, in one table.

Each row says what a name in a `kernel` or `scalar` body of specs/cpu_kernels.glowdef means:
its arity, its exact semantics as a NumPy function (the reference the interpreter and constant
folding run, and the bounds value-range analysis takes), whether it computes on whole vectors
exactly as on scalars (what a fused GEMM epilogue may compute), and whether it is increasing
(so ranges pass through it).  `glowgen regen` checks spec calls against this table; each
backend that compiles kernels emits every row (the cpu backend's `ScalarEmitter.f_<name>`,
checked when it loads).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from .engine.types import numpy_dtype


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


def _identity(x):
    return x


def _cast(x, dtype):
    return np.asarray(x).astype(numpy_dtype(dtype))


def _saturate(x, dtype):
    """x clamped to the range of the integer type `dtype` (still in x's float type)."""
    info = np.iinfo(numpy_dtype(dtype))
    return np.minimum(np.maximum(x, float(info.min)), float(info.max))


class ScalarFunction(NamedTuple):
    name: str
    arity: int
    numpy: Callable
    vector_safe: bool = False     # the same instructions on vectors as on scalars
    increasing: bool = False      # f(a) <= f(b) whenever a <= b (over its domain)


def _row(name, arity, fn, *flags: str) -> ScalarFunction:
    unknown = set(flags) - {"vector_safe", "increasing"}
    assert not unknown, unknown
    return ScalarFunction(name, arity, fn, "vector_safe" in flags, "increasing" in flags)


_ROWS = [
    # arithmetic
    _row("add", 2, np.add, "vector_safe"), _row("sub", 2, np.subtract, "vector_safe"),
    _row("mul", 2, np.multiply, "vector_safe"), _row("div", 2, _div, "vector_safe"),
    _row("mod", 2, _mod), _row("pow", 2, np.power), _row("neg", 1, np.negative, "vector_safe"),
    _row("fma", 3, _fma), _row("fmod", 2, np.fmod), _row("rem", 2, np.remainder),
    _row("max", 2, np.maximum, "vector_safe"), _row("min", 2, np.minimum, "vector_safe"),
    _row("abs", 1, np.abs, "vector_safe"), _row("sign", 1, np.sign),
    _row("copysign", 2, _copysign),
    # comparisons and logic
    _row("lt", 2, np.less, "vector_safe"), _row("le", 2, np.less_equal, "vector_safe"),
    _row("gt", 2, np.greater, "vector_safe"), _row("ge", 2, np.greater_equal, "vector_safe"),
    _row("eq", 2, np.equal, "vector_safe"), _row("ne", 2, np.not_equal, "vector_safe"),
    _row("and", 2, np.logical_and, "vector_safe"), _row("or", 2, np.logical_or, "vector_safe"),
    _row("xor", 2, np.logical_xor), _row("not", 1, np.logical_not, "vector_safe"),
    _row("select", 3, np.where, "vector_safe"),
    _row("isnan", 1, np.isnan), _row("isinf", 1, np.isinf),
    # rounding
    _row("floor", 1, np.floor, "vector_safe"), _row("ceil", 1, np.ceil, "vector_safe"),
    _row("trunc", 1, np.trunc, "vector_safe"), _row("round", 1, np.round, "vector_safe"),
    # transcendentals
    _row("sqrt", 1, np.sqrt, "vector_safe", "increasing"),
    _row("exp", 1, np.exp, "increasing"), _row("expm1", 1, np.expm1, "increasing"),
    _row("log", 1, np.log, "increasing"), _row("log1p", 1, np.log1p, "increasing"),
    _row("tanh", 1, np.tanh, "increasing"), _row("erf", 1, erf, "increasing"),
    _row("sin", 1, np.sin), _row("cos", 1, np.cos), _row("tan", 1, np.tan),
    _row("asin", 1, np.arcsin, "increasing"), _row("acos", 1, np.arccos),
    _row("atan", 1, np.arctan, "increasing"), _row("sinh", 1, np.sinh, "increasing"),
    _row("cosh", 1, np.cosh), _row("asinh", 1, np.arcsinh, "increasing"),
    _row("acosh", 1, np.arccosh, "increasing"), _row("atanh", 1, np.arctanh, "increasing"),
    # conversions and bits
    _row("cast", 2, _cast, "vector_safe"), _row("saturate", 2, _saturate, "vector_safe"),
    _row("bitand", 2, np.bitwise_and), _row("bitor", 2, np.bitwise_or),
    _row("bitxor", 2, np.bitwise_xor), _row("bitnot", 1, np.invert),
    _row("shl", 2, np.left_shift), _row("shr", 2, np.right_shift),
    # bit-level float primitives for range reductions (exact semantics: backends/cpu/scalar.py)
    _row("ldexp", 2, _ldexp), _row("scale2", 2, _ldexp),
    _row("frexp_mant", 1, _frexp_mant), _row("frexp_exp", 1, _frexp_exp),
    # scheduling: handoff(x) is x.  It marks where a long dependency chain may be cut: a
    # backend may run what leads up to it and what follows it as two passes over a block
    # (backends/cpu/handoffs.py), so that neither waits so long for its operands.
    _row("handoff", 1, _identity, "vector_safe", "increasing"),
]

SCALAR_FUNCTIONS: dict[str, ScalarFunction] = {r.name: r for r in _ROWS}
