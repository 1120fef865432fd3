"""Render the kernel expression trees of specs/cpu_kernels.glowdef as LLVM IR.

A value is carried as (llvm value, element type name).  Booleans live in registers as i1
and in memory as one byte.  Python constants take the type of the other operand, as
NumPy's weak scalars do.  Functions with a `scalar` definition in the spec (exp, tanh, ...)
are inlined from it, so they vectorize inside a stacked loop; the rest map to LLVM
instructions and intrinsics.
"""
from __future__ import annotations

import math

import numpy as np

from llvmlite import ir

from ...engine.types import numpy_dtype
from ...lir.ir import slot
from .llvmutil import (I1, call_intrinsic, intrinsic, is_float, is_signed, round_to_i32, storage_type, target_has,
                       type_suffix)

from .values import arith_nan_free, arith_range, finite, image_range, known_bool, never_holds, union_range
# Re-exported: what callers of the emitter build its operands with.
from .values import Value, const, convert, load_elem, round_to_bf16, store_elem  # noqa: F401

_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}


def _plain_constant(v) -> bool:
    """A float constant (scalar or splat, its lanes ir.Constants or floats) with no NaN."""
    if isinstance(v, ir.Constant):
        v = v.constant
    if isinstance(v, (list, tuple)):
        return all(_plain_constant(x) for x in v)
    return isinstance(v, float) and not math.isnan(v)


def _freeze(b: ir.IRBuilder, v):
    """LLVM's `freeze` (llvmlite's builder has none): poison becomes an arbitrary value."""
    from llvmlite.ir import instructions
    instr = instructions.Instruction(b.block, v.type, "freeze", [v])
    b._insert(instr)
    return instr


class ScalarEmitter:
    """Emits one kernel tree for one element (or, with `vw`, for a vector of `vw` elements:
    constants become splats); `args` are Values or Python numbers."""

    def __init__(self, b: ir.IRBuilder, scalars: dict, vw: int | None = None, handoffs=None):
        self.b, self.scalars, self.vw = b, scalars, vw
        self._inlining: list[str] = []     # scalar definitions being expanded (no recursion)
        # A handoffs.PassEmission when this emission is one pass of a chain cut at its
        # `handoff`s; None: `handoff` is the identity.
        self.handoffs = handoffs

    def _const(self, value, dtype: str):
        c = const(value, dtype)
        if not self.vw:
            return c
        return ir.Constant(ir.VectorType(c.type, self.vw), [c.constant] * self.vw)

    # -------------------------------------------------------------- typing
    def unify(self, xs: list) -> list:
        """Give Python numbers the type of the first real operand (NumPy weak scalars)."""
        typed = [x for x in xs if isinstance(x, Value)]
        if not typed:
            dtype = "f32" if any(isinstance(x, float) for x in xs) else "i64"
        else:
            dtype = typed[0].dtype
            if dtype == "bool" and any(isinstance(x, Value) and x.dtype != "bool" for x in typed):
                dtype = next(x.dtype for x in typed if x.dtype != "bool")
        out = []
        for x in xs:
            if isinstance(x, Value):
                out.append(convert(self.b, x, dtype) if x.dtype != dtype else x)
            else:
                if (not is_float(dtype) and dtype != "bool" and isinstance(x, float)
                        and not math.isnan(x) and (math.isinf(x) or x == int(x))):
                    # An integral bound (Clip's default +-inf) saturates into the integer range.
                    info = np.iinfo(numpy_dtype(dtype))
                    out.append(Value(const(int(min(max(x, info.min), info.max)), dtype), dtype))
                    continue
                if not is_float(dtype) and isinstance(x, float) and dtype != "bool":
                    dtype_f = "f32"
                    out.append(Value(self._const(x, dtype_f), dtype_f))
                    continue
                known = is_float(dtype) and not math.isnan(float(x))
                out.append(Value(self._const(x, dtype), dtype, (float(x), float(x)) if known else None,
                                 nan_free=known))
        return out

    # -------------------------------------------------------------- trees
    def emit(self, tree, args: list, attrs: dict, memo: dict | None = None):
        memo = {} if memo is None else memo
        key = id(tree)
        if key in memo:
            return memo[key]
        kind = tree[0]
        if kind == "param":
            r = args[tree[1]]
        elif kind == "const":
            r = tree[1]
        elif kind == "attr":
            r = attrs[tree[1]]
        elif kind == "dtype":
            r = tree[1]
        else:
            fname, subs = tree[1], tree[2]
            if fname == "select":
                # A condition the value ranges decide: only the branch taken is emitted.
                cond = self.emit(subs[0], args, attrs, memo)
                known = known_bool(cond.v) if isinstance(cond, Value) else None
                if known is not None:
                    r = self.emit(subs[1] if known else subs[2], args, attrs, memo)
                    memo[key] = r
                    return r
                vals = [cond] + [self.emit(t, args, attrs, memo) for t in subs[1:]]
            else:
                cast = self._saturating_cast(subs, args, attrs, memo) if fname == "cast" else None
                if cast is not None:
                    r, operand = cast
                    if self.handoffs is not None:
                        r = self.handoffs.track(r, [operand])
                    memo[key] = r
                    return r
                vals = [self.emit(t, args, attrs, memo) for t in subs]
            if fname in self.scalars and fname not in self._inlining and self._inlines(fname, vals):
                r = self._inline(fname, vals, attrs)
            else:
                r = getattr(self, "f_" + fname)(*vals)
            if isinstance(r, Value) and r.dtype == "bf16":
                # bf16 arithmetic is f32 arithmetic rounded back after every operation.
                r = Value(round_to_bf16(self.b, r.v), "bf16")
            if self.handoffs is not None:
                r = self.handoffs.track(r, vals)
        memo[key] = r
        return r

    def _inlines(self, fname, vals) -> bool:
        """Use the spec's definition unless it is written for another element type and a
        built-in exists: `scalar exp(x: f32)` serves f32 (and f16, computed in f32); an
        f64 exp keeps the f64 intrinsic rather than an f32-accurate polynomial."""
        declared = self.scalars[fname].get("dtypes") or ()
        if not hasattr(self, "f_" + fname):
            return True
        for v, d in zip(vals, declared):
            if d is None or not isinstance(v, Value) or v.dtype == d:
                continue
            if d == "f32" and v.dtype in ("f16", "bf16"):
                continue
            return False
        return True

    def _inline(self, fname, vals, attrs):
        sc = self.scalars[fname]
        declared = sc.get("dtypes") or (None,) * len(vals)
        narrow = None
        args = []
        for v, d in zip(vals, declared):
            if d is not None and isinstance(v, Value) and v.dtype != d:
                narrow = narrow or v.dtype
                v = convert(self.b, v, d)
            args.append(v)
        self._inlining.append(fname)
        try:
            r = self.emit(sc["body"], args, attrs, {})
        finally:
            self._inlining.pop()
        if narrow is not None and isinstance(r, Value) and is_float(r.dtype):
            r = convert(self.b, r, narrow)
        if sc.get("increasing") and isinstance(r, Value) and is_float(r.dtype):
            arg = vals[0]
            rng = arg.range if isinstance(arg, Value) else (float(arg), float(arg))
            r = Value(r.v, r.dtype, image_range(fname, r.dtype, rng))
        return r

    # -------------------------------------------------------------- functions
    def _arith(self, a, b_, fop, iop, uop=None):
        a, c = self.unify([a, b_])
        if is_float(a.dtype):
            # `contract`: LLVM may fuse a product into the sum that uses it (one rounding
            # instead of two, as C compilers do by default), e.g. x * scale + shift.
            return Value(getattr(self.b, fop)(a.v, c.v, flags=("contract",)), a.dtype,
                         arith_range(fop, a.range, c.range), arith_nan_free(fop, a, c))
        op = uop if (uop and not is_signed(a.dtype)) else iop
        return Value(getattr(self.b, op)(a.v, c.v), a.dtype)

    def f_add(self, a, c): return self._arith(a, c, "fadd", "add")
    def f_sub(self, a, c): return self._arith(a, c, "fsub", "sub")
    def f_mul(self, a, c): return self._arith(a, c, "fmul", "mul")
    def f_div(self, a, c): return self._arith(a, c, "fdiv", "sdiv", "udiv")
    def f_mod(self, a, c): return self._arith(a, c, "frem", "srem", "urem")

    def f_pow(self, a, c):
        if isinstance(a, Value) and not is_float(a.dtype):
            # Integer base (ONNX Pow keeps the base's type): the power in double, converted
            # back (exact while the result fits 53 bits), whatever the exponent's type.
            af = convert(self.b, a, "f64")
            cf = convert(self.b, c, "f64") if isinstance(c, Value) else Value(const(c, "f64"), "f64")
            return convert(self.b, Value(call_intrinsic(self.b, "pow", [af.v, cf.v]), "f64"), a.dtype)
        a, c = self.unify([a, c])
        return Value(call_intrinsic(self.b, "pow", [a.v, c.v]), a.dtype)

    def f_neg(self, a):
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return -a                     # a literal stays a literal (-104.0 in the spec)
        (a,) = self.unify([a])
        if is_float(a.dtype):
            return Value(self.b.fneg(a.v), a.dtype, (-a.range[1], -a.range[0]) if a.range else None,
                         a.nan_free)
        return Value(self.b.neg(a.v), a.dtype)

    def _cmp(self, a, c, op):
        a, c = self.unify([a, c])
        if is_float(a.dtype):
            if op != "ne" and never_holds(op, a.range, c.range):
                # Folds to false only: an ordered comparison with NaN is false too, whereas
                # one the ranges say always holds would still fail for NaN.
                return Value(ir.Constant(I1, 0) if not self.vw else
                             ir.Constant(ir.VectorType(I1, self.vw), [0] * self.vw), "bool")
            if op == "ne":
                return Value(self.b.fcmp_unordered("!=", a.v, c.v), "bool")
            return Value(self.b.fcmp_ordered(_FCMP[op], a.v, c.v), "bool")
        sym = _FCMP.get(op, "!=")
        if is_signed(a.dtype) and a.dtype != "bool":
            return Value(self.b.icmp_signed(sym, a.v, c.v), "bool")
        return Value(self.b.icmp_unsigned(sym, a.v, c.v), "bool")

    def f_lt(self, a, c): return self._cmp(a, c, "lt")
    def f_le(self, a, c): return self._cmp(a, c, "le")
    def f_gt(self, a, c): return self._cmp(a, c, "gt")
    def f_ge(self, a, c): return self._cmp(a, c, "ge")
    def f_eq(self, a, c): return self._cmp(a, c, "eq")
    def f_ne(self, a, c): return self._cmp(a, c, "ne")

    def _bool(self, x):
        return convert(self.b, x, "bool") if isinstance(x, Value) else Value(self._const(x, "bool"), "bool")

    def f_and(self, a, c): return Value(self.b.and_(self._bool(a).v, self._bool(c).v), "bool")
    def f_or(self, a, c): return Value(self.b.or_(self._bool(a).v, self._bool(c).v), "bool")
    def f_xor(self, a, c): return Value(self.b.xor(self._bool(a).v, self._bool(c).v), "bool")
    def f_not(self, a): return Value(self.b.not_(self._bool(a).v), "bool")

    def f_select(self, c, a, d):
        a, d = self.unify([a, d])
        cond = self._bool(c).v
        known = known_bool(cond)
        if known is not None:
            return a if known else d
        return Value(self.b.select(cond, a.v, d.v), a.dtype, union_range(a.range, d.range),
                     a.nan_free and d.nan_free)

    def _minmax(self, a, c, which):
        a, c = self.unify([a, c])
        if is_float(a.dtype):
            # NumPy's maximum is `a >= c or isnan(a) ? a : c` (NaN from either side; of -0
            # and +0, the first).  Against a constant that is not NaN that is one compare
            # and select, which x86 does in one vmaxps; llvm.maximum would add a fix-up
            # for the sign of zero.
            ge = ">=" if which == "max" else "<="
            if _plain_constant(c.v) and c.range:
                bound = c.range[0]
                if a.range and (a.range[0] >= bound if which == "max" else a.range[1] <= bound):
                    return a              # the clamp cannot bind (NaN passes either way)
                pick = max if which == "max" else min
                rng = (pick(a.range[0], bound), pick(a.range[1], bound)) if a.range else \
                    ((bound, math.inf) if which == "max" else (-math.inf, bound))
                return Value(self.b.select(self.b.fcmp_unordered(ge, a.v, c.v), a.v, c.v), a.dtype, rng,
                             a.nan_free)
            both = a.nan_free and c.nan_free
            if _plain_constant(a.v):
                return Value(self.b.select(self.b.fcmp_ordered(ge, a.v, c.v), a.v, c.v), a.dtype,
                             nan_free=both)
            return Value(call_intrinsic(self.b, "maximum" if which == "max" else "minimum", [a.v, c.v]), a.dtype,
                         nan_free=both)
        prefix = ("s" if is_signed(a.dtype) else "u") + which
        return Value(call_intrinsic(self.b, prefix, [a.v, c.v]), a.dtype)

    def f_max(self, a, c): return self._minmax(a, c, "max")
    def f_min(self, a, c): return self._minmax(a, c, "min")

    def f_abs(self, a):
        (a,) = self.unify([a])
        if is_float(a.dtype):
            top = max(abs(a.range[0]), abs(a.range[1])) if a.range else math.inf
            lo = 0.0 if not a.range or a.range[0] <= 0 <= a.range[1] else min(abs(a.range[0]), abs(a.range[1]))
            return Value(call_intrinsic(self.b, "fabs", [a.v]), a.dtype, (lo, top), a.nan_free)
        if not is_signed(a.dtype):
            return a
        fn = intrinsic(self.b.module, f"llvm.abs.i{a.v.type.width}", a.v.type, [a.v.type, I1])
        return Value(self.b.call(fn, [a.v, ir.Constant(I1, 0)]), a.dtype)

    def f_sign(self, a):
        (a,) = self.unify([a])
        zero = const(0, a.dtype)
        pos = self._cmp(a, 0, "gt").v
        neg = self._cmp(a, 0, "lt").v
        one, mone = const(1, a.dtype), const(-1, a.dtype) if is_signed(a.dtype) else const(0, a.dtype)
        v = self.b.select(pos, one, self.b.select(neg, mone, zero))
        if is_float(a.dtype):      # sign(NaN) is NaN
            v = self.b.select(self.b.fcmp_unordered("uno", a.v, a.v), a.v, v)
        return Value(v, a.dtype)

    def _unary_intrinsic(self, name, a):
        (a,) = self.unify([a])
        if not is_float(a.dtype):
            a = convert(self.b, a, "f32")
        return Value(call_intrinsic(self.b, name, [a.v]), a.dtype)

    def f_sqrt(self, a): return self._unary_intrinsic("sqrt", a)
    def _rounding(self, name, a, fn):
        """floor / ceil / roundeven / trunc: increasing, so a value range maps end to end."""
        (a,) = self.unify([a])
        r = self._unary_intrinsic(name, a)
        if is_float(a.dtype):
            r.nan_free = a.nan_free
            if finite(a.range):
                r.range = (float(fn(a.range[0])), float(fn(a.range[1])))
        return r

    def f_floor(self, a): return self._rounding("floor", a, math.floor)
    def f_ceil(self, a): return self._rounding("ceil", a, math.ceil)
    def f_round(self, a): return self._rounding("roundeven", a, round)
    def f_trunc(self, a): return self._rounding("trunc", a, math.trunc)
    def f_exp(self, a): return self._unary_intrinsic("exp", a)
    def f_log(self, a): return self._unary_intrinsic("log", a)
    def f_sin(self, a): return self._unary_intrinsic("sin", a)
    def f_cos(self, a): return self._unary_intrinsic("cos", a)

    def _libm(self, name, a):
        """Fallback for functions without a `scalar` definition: a libm call per element
        (half precision goes through the float version)."""
        (a,) = self.unify([a])
        if not is_float(a.dtype):
            a = convert(self.b, a, "f32")
        half = isinstance(a.v.type, ir.HalfType)
        x = convert(self.b, a, "f32") if half else a
        t = x.v.type
        sym = name + ("f" if isinstance(t, ir.FloatType) else "")
        fn = intrinsic(self.b.module, sym, t, [t])
        r = Value(self.b.call(fn, [x.v]), x.dtype)
        return convert(self.b, r, "f16") if half else r

    def f_tanh(self, a): return self._libm("tanh", a)
    def f_erf(self, a): return self._libm("erf", a)
    def f_log1p(self, a): return self._libm("log1p", a)
    def f_expm1(self, a): return self._libm("expm1", a)

    def f_isnan(self, a):
        (a,) = self.unify([a])
        return Value(self.b.fcmp_unordered("uno", a.v, a.v), "bool")

    def f_isinf(self, a):
        (a,) = self.unify([a])
        av = call_intrinsic(self.b, "fabs", [a.v])
        return Value(self.b.fcmp_ordered("==", av, ir.Constant(a.v.type, math.inf)), "bool")

    def f_cast(self, a, dtype):
        if not isinstance(a, Value):
            return Value(const(a, dtype), dtype)
        return convert(self.b, a, dtype)

    def _saturating_cast(self, subs, args, attrs, memo):
        """cast(saturate(x, t), t) to an integer type t of at most 16 bits, for a float x that
        cannot be NaN and lies within i32: converted to i32 first, then clamped as integers,
        which x86 does in the saturating packs that narrow the lanes anyway (packssdw,
        packsswb: no float max and min, no masks before an unsigned pack).  Truncation
        commutes with clamping to integer bounds, so the values are those of the float
        clamp.  A `round` right inside (or inside a max with an integer constant) is the
        conversion's own, as a requantizing store's is (round_to_i32).  (The result, x), or
        None: the caller emits the two calls."""
        inner = subs[0]
        if inner[0] != "call" or inner[1] != "saturate":
            return None
        dtype = self.emit(subs[1], args, attrs, memo)
        if dtype != self.emit(inner[2][1], args, attrs, memo) or not isinstance(dtype, str):
            return None
        if is_float(dtype) or dtype == "bool" or storage_type(dtype).width > 16:
            return None
        info = np.iinfo(numpy_dtype(dtype))
        bounds = [int(info.min), int(info.max)]
        tree = inner[2][0]
        # A max with an integer constant inside (QuantizedAdd's `low`) joins the clamp:
        # clamp(max(y, c), lo, hi) = clamp(y, min(hi, max(lo, c)), hi).
        if tree[0] == "call" and tree[1] == "max":
            c = self.emit(tree[2][1], args, attrs, memo)
            if (not isinstance(c, bool) and isinstance(c, (int, float)) and math.isfinite(c)
                    and c == int(c)):
                bounds[0] = min(bounds[1], max(bounds[0], int(c)))
                tree = tree[2][0]
        # Rounding to an integer right before is the conversion's own (round_to_i32).
        rounds = tree[0] == "call" and tree[1] == "round"
        x = self.emit(tree[2][0] if rounds else tree, args, attrs, memo)
        if not (isinstance(x, Value) and is_float(x.dtype) and x.nan_free and finite(x.range)
                and -2.0 ** 31 < x.range[0] - 1 and x.range[1] + 1 < 2.0 ** 31):
            return None
        if rounds and x.dtype == "f32":
            wide = Value(round_to_i32(self.b, x.v), "i32")
        else:
            x = self.f_round(x) if rounds else x
            i32 = ir.IntType(32) if not self.vw else ir.VectorType(ir.IntType(32), self.vw)
            wide = Value(self.b.fptosi(x.v, i32), "i32")
        lo, hi = (Value(self._const(v, "i32"), "i32") for v in bounds)
        clamped = self.f_min(self.f_max(wide, lo), hi)
        return Value(self.b.trunc(clamped.v, storage_type(dtype) if not self.vw
                                  else ir.VectorType(storage_type(dtype), self.vw)), dtype), x

    def f_saturate(self, a, dtype):
        """a (float) clamped to the range of integer type `dtype`: a max and a min with its
        bounds, as a kernel writing them out would compile."""
        info = np.iinfo(numpy_dtype(dtype))
        return self.f_min(self.f_max(a, float(info.min)), float(info.max))

    # ---------------------------------------------------------- more libm and integer ops
    def f_tan(self, a): return self._libm("tan", a)
    def f_asin(self, a): return self._libm("asin", a)
    def f_acos(self, a): return self._libm("acos", a)
    def f_atan(self, a): return self._libm("atan", a)
    def f_sinh(self, a): return self._libm("sinh", a)
    def f_cosh(self, a): return self._libm("cosh", a)
    def f_asinh(self, a): return self._libm("asinh", a)
    def f_acosh(self, a): return self._libm("acosh", a)
    def f_atanh(self, a): return self._libm("atanh", a)

    def f_fmod(self, a, c):
        """C fmod: the remainder has the sign of the dividend."""
        return self._arith(a, c, "frem", "srem", "urem")

    def f_rem(self, a, c):
        """Python/NumPy remainder: the result has the sign of the divisor."""
        a, c = self.unify([a, c])
        r = self._arith(a, c, "frem", "srem", "urem")
        if not is_float(a.dtype) and not is_signed(a.dtype):
            return r
        zero = const(0, a.dtype)
        if is_float(a.dtype):
            nonzero = self.b.fcmp_ordered("!=", r.v, zero)
            differ = self.b.xor(self.b.fcmp_ordered("<", r.v, zero), self.b.fcmp_ordered("<", c.v, zero))
            fixed = self.b.fadd(r.v, c.v)
        else:
            nonzero = self.b.icmp_signed("!=", r.v, zero)
            differ = self.b.xor(self.b.icmp_signed("<", r.v, zero), self.b.icmp_signed("<", c.v, zero))
            fixed = self.b.add(r.v, c.v)
        return Value(self.b.select(self.b.and_(nonzero, differ), fixed, r.v), a.dtype)

    def _bits(self, a, c, op):
        a, c = self.unify([a, c])
        return Value(getattr(self.b, op)(a.v, c.v), a.dtype)

    def f_bitand(self, a, c): return self._bits(a, c, "and_")
    def f_bitor(self, a, c): return self._bits(a, c, "or_")
    def f_bitxor(self, a, c): return self._bits(a, c, "xor")

    def f_bitnot(self, a):
        (a,) = self.unify([a])
        return Value(self.b.not_(a.v), a.dtype)

    def _shift(self, a, c, op):
        """LLVM shifts by >= the width are poison; NumPy and ONNX give 0 (or the sign)."""
        a, c = self.unify([a, c])
        width = a.v.type.width
        r = getattr(self.b, op)(a.v, c.v)
        too_far = self.b.icmp_unsigned(">=", c.v, ir.Constant(a.v.type, width))
        fill = (self.b.ashr(a.v, ir.Constant(a.v.type, width - 1)) if op == "ashr"
                else ir.Constant(a.v.type, 0))
        return Value(self.b.select(too_far, fill, r), a.dtype)

    def f_shl(self, a, c): return self._shift(a, c, "shl")

    def f_shr(self, a, c):
        signed = is_signed(a.dtype if isinstance(a, Value) else "i64")
        return self._shift(a, c, "ashr" if signed else "lshr")


    # ---------------------------------------------------------- bit-level float primitives
    # What range reductions need, without calls or branches (they vectorize):
    #   ldexp(x, n)    x * 2**n for integral-valued n, as x * 2**(n//2) * 2**(n - n//2) (three
    #                  factors for f64): rounded once -- into the denormal range, or to ±inf --
    #                  whenever 2**-60 <= |x| <= 2**60 (a range reduction scales a value near
    #                  1); for x outside that an intermediate may under/overflow first (double
    #                  rounding in the denormal range).  ±0, ±inf and NaN x are kept; |n| is
    #                  clamped to 2*(emax-1) (±inf acts as huge); n = NaN gives NaN.
    #   scale2(x, n)   ldexp for a range reduction that bounds n: integral |n| <= 300, and n
    #                  NaN only where x is NaN too.  Outside that the result is unspecified
    #                  (not undefined); within it, with AVX-512, it is one vscalef.
    #   frexp_mant(x)  m with x = m * 2**e, 0.5 <= |m| < 1 (denormals included), sign of x;
    #                  frexp_mant(±0) = ±0, frexp_mant(±inf) = ±inf, frexp_mant(NaN) = NaN.
    #   frexp_exp(x)   that e, as a float of x's type; 0 for ±0, ±inf and NaN (numpy.frexp).
    #   fma(a, b, c)   a * b + c, fused (one rounding) where the target has FMA, otherwise
    #                  two roundings (llvm.fmuladd): never a call.
    #   copysign(a, b) |a| with the sign bit of b (NaNs too).
    _LAYOUT = {"f16": (16, 10, 15), "f32": (32, 23, 127), "f64": (64, 52, 1023)}

    def _floats(self, xs):
        xs = self.unify(xs)
        if not is_float(xs[0].dtype):
            xs = [convert(self.b, x, "f32") for x in xs]
        return xs

    def _pow2(self, k, dtype):
        """2**k as a `dtype` float, for an integral-valued float k in the normal exponent
        range: adding 2**mbits + bias puts k + bias in the low mantissa bits, which a shift
        moves into the exponent field (no float->int conversion, which AVX2 lacks for f64)."""
        bits, mbits, bias = self._LAYOUT[dtype]
        it, t = ir.IntType(bits), storage_type(dtype)
        biased = self.b.bitcast(self.b.fadd(k, ir.Constant(t, float(2 ** mbits + bias))), it)
        return self.b.bitcast(self.b.shl(biased, ir.Constant(it, mbits)), t)

    def _clamp(self, v, lim):
        """v clamped to [-lim, lim]; NaN stays NaN (the bit tricks after it make garbage of
        it, not poison, and f_ldexp selects NaN for those lanes)."""
        t, b = v.type, self.b
        v = b.select(b.fcmp_ordered("<", v, ir.Constant(t, -lim)), ir.Constant(t, -lim), v)
        return b.select(b.fcmp_ordered(">", v, ir.Constant(t, lim)), ir.Constant(t, lim), v)

    def f_ldexp(self, x, n):
        return self._ldexp(x, n)

    def _ldexp(self, x, n, nan_n: bool = True):
        """ldexp; without `nan_n`, a NaN n need not give NaN (scale2's contract)."""
        x, n = self._floats([x, n])
        if target_has(self.b.module, "avx512f") and x.dtype in ("f32", "f64"):
            return self._ldexp_scalef(x, n)
        dt, b = x.dtype, self.b
        t = x.v.type
        bits, mbits, bias = self._LAYOUT[dt]
        half = lambda v: call_intrinsic(b, "floor", [b.fmul(v, ir.Constant(t, 0.5))])
        rng = n.range if finite(n.range) else None
        if dt != "f64" and rng is not None and -(bias - 1) <= rng[0] and rng[1] <= bias - 1:
            # n's value range keeps 2**n normal: one factor, no clamp (exp(x) of a value
            # range that keeps it out of the denormals).
            ks = (n.v,)
        elif dt != "f64" and rng is not None and rng[1] - rng[0] <= 2 * (bias - 1):
            # n's value range fits the normal exponents once shifted to centre on 0: x *
            # 2**(n + k) is exact (a range reduction's x is near 1), and the constant 2**-k
            # the one rounding -- as with the halves below, in four operations instead of
            # nine (sigmoid's exp(-|x|), n in [-150, 0]: bit-identical results; the stacked
            # eltwise_chain loop on x86-64-v3 37 -> 33 instructions a vector, 0.679 -> 0.621
            # ms, best of 150 runs on a shared Zen 4).
            shift = float(-round((rng[0] + rng[1]) / 2))
            r = b.fmul(b.fmul(x.v, self._pow2(b.fadd(n.v, ir.Constant(t, shift)), dt)),
                       ir.Constant(t, 2.0 ** -shift))
            if not nan_n:
                return Value(r, dt)
            return Value(b.select(b.fcmp_unordered("uno", n.v, n.v), n.v, r), dt)
        elif dt != "f64":
            # Two normal powers of two, 2**(n//2) and 2**(n - n//2): x * 2**(n//2) stays
            # normal for the |x| of a range reduction, so the second product is the only
            # rounding (into denormals, or to ±inf).  No clamp where n's value range needs
            # none (an exp's n is within [-150, 128]).
            lim = 2.0 * (bias - 1)
            nc = n.v if rng is not None and -lim <= rng[0] and rng[1] <= lim else self._clamp(n.v, lim)
            k1 = half(nc)
            ks = (k1, b.fsub(nc, k1))
        else:
            nc = self._clamp(n.v, 3.0 * (bias - 1))
            k1 = call_intrinsic(b, "trunc", [b.fdiv(nc, ir.Constant(t, 3.0))])
            k2 = half(b.fsub(nc, k1))
            ks = (k1, k2, b.fsub(b.fsub(nc, k1), k2))
        r = x.v
        for kk in ks:
            r = b.fmul(r, self._pow2(kk, dt))
        if not nan_n:
            return Value(r, dt)
        nan = b.fcmp_unordered("uno", n.v, n.v)
        return Value(b.select(nan, n.v, r), dt)

    def f_scale2(self, x, n):
        x, n = self._floats([x, n])
        if not (target_has(self.b.module, "avx512f") and x.dtype in ("f32", "f64")):
            # n is NaN only where x is (the contract): x's NaN comes through the products,
            # whatever the powers of two made of a NaN n are.
            return self._ldexp(x, n, nan_n=False)
        # freeze: fptosi of NaN is poison; frozen it is some integer, and x is NaN then.
        ni = _freeze(self.b, self.b.fptosi(n.v, self._i32()))
        return Value(self._llvm_ldexp(x.v, ni), x.dtype)

    def _i32(self):
        return ir.IntType(32) if not self.vw else ir.VectorType(ir.IntType(32), self.vw)

    def _llvm_ldexp(self, x, ni):
        fn = intrinsic(self.b.module, f"llvm.ldexp.{type_suffix(x.type)}.{type_suffix(ni.type)}",
                       x.type, [x.type, ni.type])
        return self.b.call(fn, [x, ni])

    def _ldexp_scalef(self, x, n):
        """llvm.ldexp, which AVX-512 does in one instruction (vscalef): exact, one rounding
        for every x.  |n| beyond 2 * (emax + mbits) already gives 0 or ±inf for every
        finite x, so clamping there keeps the result and makes the int conversion safe."""
        b, dt = self.b, x.dtype
        bits, mbits, bias = self._LAYOUT[dt]
        lim = float(2 * (bias + mbits + 1))
        r = self._llvm_ldexp(x.v, b.fptosi(self._clamp(n.v, lim), self._i32()))
        nan = b.fcmp_unordered("uno", n.v, n.v)
        return Value(b.select(nan, n.v, r), dt)

    def _frexp(self, x):
        (x,) = self._floats([x])
        dt = x.dtype
        bits, mbits, bias = self._LAYOUT[dt]
        it, t = ir.IntType(bits), x.v.type
        b = self.b
        # Denormals: scale into the normal range first (exact), then undo in the exponent.
        absx = call_intrinsic(b, "fabs", [x.v])
        tiny = b.fcmp_ordered("<", absx, ir.Constant(t, 2.0 ** (1 - bias)))
        xs = b.select(tiny, b.fmul(x.v, ir.Constant(t, 2.0 ** (mbits + 1))), x.v)
        xi = b.bitcast(xs, it)
        emask = (1 << (bits - 1)) - (1 << mbits)                 # exponent field
        efield = b.lshr(b.and_(xi, ir.Constant(it, emask)), ir.Constant(it, mbits))
        e = b.sub(efield, ir.Constant(it, bias - 1))
        e = b.sub(e, b.select(tiny, ir.Constant(it, mbits + 1), ir.Constant(it, 0)))
        mi = b.or_(b.and_(xi, ir.Constant(it, ((1 << bits) - 1) ^ emask)),
                   ir.Constant(it, (bias - 1) << mbits))
        m = b.bitcast(mi, t)
        # ±0, ±inf, NaN: mantissa is x itself, exponent 0.
        special = b.or_(b.fcmp_unordered("==", absx, ir.Constant(t, 0.0)),
                        b.fcmp_unordered("==", absx, ir.Constant(t, math.inf)))
        m = b.select(special, x.v, m)
        ef = b.select(special, ir.Constant(t, 0.0), b.sitofp(e, t))
        return Value(m, dt), Value(ef, dt)

    def f_frexp_mant(self, x): return self._frexp(x)[0]
    def f_frexp_exp(self, x): return self._frexp(x)[1]

    def f_fma(self, a, c, d):
        a, c, d = self._floats([a, c, d])
        return Value(call_intrinsic(self.b, "fmuladd", [a.v, c.v, d.v]), a.dtype)

    def f_handoff(self, a):
        if self.handoffs is not None:
            self.handoffs.cut()
        return a

    def f_copysign(self, a, c):
        a, c = self._floats([a, c])
        return Value(call_intrinsic(self.b, "copysign", [a.v, c.v]), a.dtype)


def emit_stack(em: "ScalarEmitter", instrs, kernels: dict, current: dict, load) -> None:
    """Evaluate a run of elementwise instructions for one element (or vector).

    `current` maps buffers' memory (ir.slot) to the values this run has computed so far and
    is updated in place; an operand not in it is external and comes from `load(buffer)`."""
    for ins in instrs:
        if ins.kind not in kernels:       # a gather a stack reads through (stacking.GatherRead)
            current[slot(ins.writes()[0])] = load(ins)
            continue
        args = [current[slot(buf)] if slot(buf) in current else load(buf)
                for _, buf in ins.operands[1:]]
        value = em.emit(kernels[ins.kind]["body"], args, ins.node.attr_values())
        if not isinstance(value, Value):      # a constant expression: materialize it
            dtype = ins.node.outputs[0].type.dtype
            value = Value(em._const(value, dtype), dtype)
        current[slot(ins.writes()[0])] = value
