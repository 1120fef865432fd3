"""Elementwise primitives, the reference way: the kernel expression trees of
`specs/cpu_kernels.glowdef`, rendered as NumPy closures once per kernel (each call is the
NumPy function of glowgen/scalars.py)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..scalars import SCALAR_FUNCTIONS



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
        if fname not in SCALAR_FUNCTIONS and fname in scalars:
            inner = compile_tree(scalars[fname]["body"], scalars)
            return lambda args, attrs: inner([s(args, attrs) for s in subs], attrs)
        fn = SCALAR_FUNCTIONS[fname].numpy
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
