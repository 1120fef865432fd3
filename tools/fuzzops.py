"""The fuzzer's op generators: one function per op family, each appending one node to a
`fuzzgen.Builder` (or raising `Rejected`).  Every ONNX op glowgen maps is drawn from here
with attributes from their valid domains and the dtypes onnxruntime's CPU kernels take."""
from __future__ import annotations

import numpy as np

from fuzzgen import BOOL, F16, F32, F64, FLOATS, I32, I64, INTS, NUMERIC, Rejected

GENERATORS: list = []       # (weight, function)


def gen(weight=1.0):
    def register(fn):
        GENERATORS.append((weight, fn))
        return fn
    return register


def floats(v, tame=False, dtypes=(F32, F64)):
    return v.dtype in dtypes and not (tame and v.wild)


def exact(v):
    """Usable by an op whose result jumps with a one-ulp change of the operand."""
    return v.exact or v.dtype.kind != "f"


# ---- elementwise unary

# Ops defined on every float, NaN and infinities included (IEEE semantics), and whose result
# may be wild even from tame operands (overflow, poles, outside the domain).
UNARY_ANY = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf", "Ceil", "Floor", "Round",
             "Sign", "Reciprocal", "Relu", "LeakyRelu", "Elu", "Selu", "Softplus", "HardSigmoid",
             "HardSwish", "ThresholdedRelu", "Shrink", "Atan", "Asin", "Acos", "Sinh", "Cosh",
             "Asinh", "Acosh", "Atanh"]
# Sin, Cos, Tan of huge arguments depend on the range reduction: tame operands only.
UNARY_TAME = ["Sin", "Cos", "Tan"]
MAKES_WILD = {"Exp", "Log", "Sqrt", "Reciprocal", "Asin", "Acos", "Acosh", "Atanh", "Sinh", "Cosh",
              "Tan"}
UNARY_F16 = {"Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Ceil", "Floor",
             "Round", "Reciprocal", "LeakyRelu", "Erf", "Sign", "HardSigmoid"}
UNARY_INT = ["Abs", "Neg", "Sign"]
# The unary ops onnxruntime's CPU kernels take doubles for (the others are float only).
UNARY_F64 = {"Abs", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Ceil", "Floor", "Round", "Sign",
             "Reciprocal", "Relu", "Sin", "Cos"}
# Discontinuous: a one-ulp change of the operand can change the result a lot.
FLOAT_ATTRS = {"Shrink", "HardSwish", "HardSigmoid", "LeakyRelu", "Elu", "Selu", "ThresholdedRelu"}
JUMPS = {"Ceil", "Floor", "Round", "Sign", "ThresholdedRelu", "Shrink"}


def unary_attrs(b, op):
    if op == "LeakyRelu":
        return {"alpha": float(b.choice((0.01, 0.2, 1.5)))}
    if op in ("Elu",):
        return {"alpha": float(b.choice((1.0, 0.5, 2.0)))}
    if op == "Selu" and b.chance(0.5):
        return {"alpha": 1.5, "gamma": 0.8}
    if op == "HardSigmoid" and b.chance(0.5):
        return {"alpha": 0.3, "beta": 0.4}
    if op == "ThresholdedRelu":
        return {"alpha": float(b.choice((1.0, 0.0, -0.5)))}
    if op == "Shrink":
        return {"lambd": float(b.choice((0.5, 0.0, 1.5))), "bias": float(b.choice((0.0, 0.5)))}
    return {}


@gen(6)
def unary_float(b):
    op = b.choice(UNARY_ANY + UNARY_TAME)
    tame = op in UNARY_TAME
    jumps = op in JUMPS
    dtypes = (F32, F32, F32) + ((F64,) if op in UNARY_F64 else ()) + ((F16,) if op in UNARY_F16 else ())
    if op in FLOAT_ATTRS:
        # onnxruntime computes these on doubles with float constants (Shrink rounds x - bias
        # to float, HardSwish's 1/6 is a float): ONNX computes in T.  Float only.
        dtypes = (F32,)
    x = b.pick(lambda v: floats(v, tame, dtypes) and (exact(v) or not jumps),
               b.fresh(dtypes, wild_ok=not tame))
    wild = True if op in MAKES_WILD else None
    b.node(op, [x], unary_attrs(b, op), wild=wild)


@gen(1)
def unary_int(b):
    op = b.choice(UNARY_INT)
    x = b.pick(lambda v: v.dtype in INTS, b.fresh(INTS))
    b.node(op, [x])


@gen(1)
def nan_inf(b):
    op = b.choice(["IsNaN", "IsInf"])
    x = b.pick(lambda v: floats(v), b.fresh((F32, F64)))
    attrs = {}
    if op == "IsInf" and b.chance(0.5):
        attrs = {"detect_positive": int(b.chance(0.5)), "detect_negative": 1}
    b.node(op, [x], attrs)


# ---- elementwise binary, with broadcasting

def second_operand(b, x, dtype=None, wild_ok=True, positive=False, need_exact=False):
    """An operand to combine with x: an existing value whose shape broadcasts with x's, or a
    fresh one shaped to broadcast."""
    dtype = dtype or x.dtype

    def fits(v):
        if v.dtype != dtype or v is x or (v.wild and not wild_ok) or positive or (need_exact and not exact(v)):
            return False
        return all(p == q or p == 1 or q == 1 for p, q in zip(v.shape[::-1], x.shape[::-1]))
    if b.chance(0.4):
        return b.pick(fits, lambda: b.broadcast_partner(x, dtype, wild_ok, positive))
    return b.broadcast_partner(x, dtype, wild_ok, positive)


@gen(6)
def binary_arith(b):
    op = b.choice(["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Mod", "PRelu"])
    dtypes = {"Pow": (F32, F64), "Mean": (F32,), "PRelu": (F32,),
              "Sum": (F32, F64), "Mod": (F32, I64, I32)}.get(op, (F32, F32, F64, I64, I32, F16))
    if op in ("Max", "Min", "Add", "Mul", "Sub", "Div") and b.chance(0.2):
        dtypes = (F16,)
    x = b.pick(lambda v: v.dtype in dtypes and (op != "Mod" or exact(v)), b.fresh(dtypes))
    attrs = {}
    positive = x.dtype.kind == "i" and op in ("Div", "Mod")    # no division by zero
    if op == "Mod":
        attrs = {"fmod": 1} if x.dtype.kind == "f" else {"fmod": int(b.chance(0.5))}
    if op == "PRelu":
        # The slope broadcasts to x (unidirectionally): trailing dimensions or ones.
        y = b.source(x.dtype, [d if b.chance(0.5) else 1 for d in x.shape[len(x.shape) -
                                                                              int(b.rng.integers(len(x.shape) + 1)):]])
    else:
        y = second_operand(b, x, positive=positive, need_exact=op == "Mod")
    operands = [x, y] if b.chance(0.8) or positive or op == "PRelu" else [y, x]
    if op in ("Max", "Min", "Mean", "Sum") and b.chance(0.3):
        operands = operands[:1] if b.chance(0.4) else operands + [second_operand(b, x, need_exact=op == "Mod")]
    wild = True if op in ("Div", "Pow") and x.dtype.kind == "f" else None
    b.node(op, operands, attrs, wild=wild)


@gen(3)
def compare(b):
    op = b.choice(["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
    dtypes = (F32, F32, I64, I32, F64) + ((BOOL,) if op == "Equal" else ())
    x = b.pick(lambda v: v.dtype in dtypes and exact(v), b.fresh(dtypes))
    b.node(op, [x, second_operand(b, x, need_exact=True)][::(1 if b.chance(0.7) else -1)])


@gen(2)
def logic(b):
    op = b.choice(["And", "Or", "Xor", "Not"])
    x = b.pick(lambda v: v.dtype == BOOL, b.fresh((BOOL,)))
    b.node(op, [x] if op == "Not" else [x, second_operand(b, x)])


@gen(1)
def bitwise(b):
    op = b.choice(["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
    if b.opset < 18:
        raise Rejected("bitwise ops are opset 18")
    x = b.pick(lambda v: v.dtype in INTS, b.fresh(INTS))
    b.node(op, [x] if op == "BitwiseNot" else [x, second_operand(b, x)])


@gen(3)
def where(b):
    x = b.pick(lambda v: v.dtype in NUMERIC, b.fresh(NUMERIC))
    y = second_operand(b, x)
    cond = b.pick(lambda v: v.dtype == BOOL and len(v.shape) <= len(x.shape),
                  lambda: b.broadcast_partner(x, BOOL))
    b.node("Where", [cond, x, y] if b.chance(0.7) else [cond, y, x])


@gen(2)
def clip(b):
    x = b.pick(lambda v: v.dtype in (F32, F64, I64, I32), b.fresh((F32, I64)))
    lo, hi = sorted(b.rng.integers(-4, 5, size=2) * (0.5 if x.dtype.kind == "f" else 1))
    # A missing bound is numeric_limits::lowest() / max() for onnxruntime, so it clamps an
    # infinity to the largest finite value; ONNX's reference (and glowgen) leave infinities
    # alone.  Both bounds are given for wild operands.
    both = x.wild
    ins = [x, b.const(lo, x.dtype) if both or b.chance(0.7) else "",
           b.const(hi, x.dtype) if both or b.chance(0.7) else ""]
    while ins and ins[-1] == "":
        ins.pop()
    b.node("Clip", ins)


@gen(2)
def cast(b):
    x = b.pick(lambda v: exact(v) and (not v.wild or b.chance(0.3)),
               b.fresh(NUMERIC + (BOOL,), wild_ok=False))
    targets = [F32, F64, I64, I32, BOOL, F16]
    if x.wild:
        targets = [F32, F64, F16]     # a float to int cast of NaN, inf or 1e30 is undefined
    to = b.choice(targets)
    from fuzzgen import ONNX_OF
    b.node("Cast", [x], {"to": ONNX_OF[to]})


# ---- reductions and normalizations (tame operands: their accumulation order is free)

def axes_subset(b, rank):
    if rank == 0:
        return []
    k = int(b.rng.integers(0, rank + 1))
    axes = sorted(b.rng.choice(rank, size=k, replace=False).tolist())
    return [a - rank if b.chance(0.3) else a for a in axes]


@gen(4)
def reduce(b):
    op = b.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
    dtypes = (F32, F64) if op == "ReduceMean" else (F32, F64, I64, I32)    # glowgen: float means
    x = b.pick(lambda v: v.dtype in dtypes and not v.wild and len(v.shape) >= 1,
               b.fresh(dtypes, wild_ok=False, lo=1))
    axes = axes_subset(b, len(x.shape))
    attrs = {"keepdims": int(b.chance(0.5))}
    ins = [x]
    if op == "ReduceSum" or b.opset >= 18:
        if axes or b.chance(0.5):
            ins.append(b.const(axes))
    elif axes:
        attrs["axes"] = axes
    if not axes and len(ins) == 2 and b.chance(0.5):
        ins.pop()
    b.node(op, ins, attrs)


@gen(1)
def argreduce(b):
    x = b.pick(lambda v: v.dtype in (F32, I64, I32) and not v.wild and len(v.shape) >= 1 and exact(v),
               b.fresh((F32, I64), wild_ok=False, lo=1))
    r = len(x.shape)
    attrs = {"axis": int(b.rng.integers(-r, r)), "keepdims": int(b.chance(0.5)),
             "select_last_index": int(b.chance(0.3))}
    b.node(b.choice(["ArgMax", "ArgMin"]), [x], attrs)


@gen(3)
def softmax(b):
    op = b.choice(["Softmax", "LogSoftmax", "Hardmax"])
    x = b.pick(lambda v: floats(v, True, (F32,) if op == "Hardmax" else (F32, F64)) and len(v.shape) >= 1
               and (op != "Hardmax" or exact(v)),
               b.fresh((F32, F64), wild_ok=False, lo=1))
    r = len(x.shape)
    b.node(op, [x], {"axis": int(b.rng.integers(-r, r))} if b.chance(0.8) else {})


@gen(1)
def cumsum(b):
    x = b.pick(lambda v: v.dtype in (F32, F64, I64, I32) and not v.wild and len(v.shape) >= 1,
               b.fresh((F32, I64), wild_ok=False, lo=1))
    r = len(x.shape)
    axis = b.const(int(b.rng.integers(-r, r)), I64)
    b.node("CumSum", [x, axis], {"exclusive": int(b.chance(0.3)), "reverse": int(b.chance(0.3))})


@gen(1)
def topk(b):
    x = b.pick(lambda v: v.dtype in (F32, I64) and not v.wild and len(v.shape) >= 1 and exact(v),
               b.fresh((F32, I64), wild_ok=False, lo=1))
    r = len(x.shape)
    axis = int(b.rng.integers(-r, r))
    k = int(b.rng.integers(1, x.shape[axis] + 1))
    b.node("TopK", [x, b.const([k])], {"axis": axis, "largest": int(b.chance(0.7))}, n_out=2)


@gen(2)
def layernorm(b):
    x = b.pick(lambda v: floats(v, True, (F32,)) and len(v.shape) >= 1,
               b.fresh((F32,), wild_ok=False, lo=1))
    r = len(x.shape)
    axis = int(b.rng.integers(-r, r))
    norm_shape = x.shape[axis:]
    scale = b.source(F32, norm_shape, wild_ok=False, initializer=b.chance(0.7))
    ins = [x, scale] + ([b.source(F32, norm_shape, wild_ok=False)] if b.chance(0.5) else [])
    b.node("LayerNormalization", ins, {"axis": axis, "epsilon": float(b.choice((1e-5, 1e-2)))})


@gen(1)
def batch_instance_norm(b):
    x = b.pick(lambda v: floats(v, True, (F32,)) and len(v.shape) >= 3,
               b.fresh((F32,), wild_ok=False, lo=3))
    c = x.shape[1]
    if b.chance(0.5):
        scale, bias = b.source(F32, [c], False, initializer=True), b.source(F32, [c], False, initializer=True)
        b.node("InstanceNormalization", [x, scale, bias], {"epsilon": 1e-3})
    else:
        mean = b.source(F32, [c], False, initializer=True)
        var = b.source(F32, [c], False, positive=True, initializer=True)
        scale, bias = b.source(F32, [c], False, initializer=True), b.source(F32, [c], False, initializer=True)
        b.node("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": 1e-4})


@gen(1)
def lrn_lpnorm(b):
    x = b.pick(lambda v: floats(v, True, (F32,)) and len(v.shape) >= 3,
               b.fresh((F32,), wild_ok=False, lo=3))
    if b.chance(0.5) and len(x.shape) == 4:
        b.node("LRN", [x], {"size": int(b.choice((1, 3, 5))), "alpha": 1e-3, "beta": 0.75, "bias": 1.0})
    else:
        r = len(x.shape)
        b.node("LpNormalization", [x], {"axis": int(b.rng.integers(-r, r)), "p": int(b.choice((1, 2)))})


# ---- linear algebra and convolutions

@gen(3)
def matmul(b):
    x = b.pick(lambda v: floats(v, True, (F32,)) and 1 <= len(v.shape) <= 4,
               b.fresh((F32,), wild_ok=False, lo=1))
    k = x.shape[-1]
    n = int(b.choice((1, 2, 3, 5, 8)))
    if len(x.shape) == 1 or b.chance(0.5):
        shape = [k] if b.chance(0.15) else [k, n]
    else:
        batch = [d if b.chance(0.7) else 1 for d in x.shape[:-2]]
        shape = batch[int(b.rng.integers(len(batch) + 1)):] + [k, n]
    w = b.source(F32, shape, wild_ok=False)
    b.node("MatMul", [x, w] if len(shape) > 1 or b.chance(0.5) else [x, w])


@gen(2)
def gemm(b):
    x = b.pick(lambda v: floats(v, True, (F32,)) and len(v.shape) == 2,
               b.fresh((F32,), wild_ok=False, rank=2))
    trans_a, trans_b = int(b.chance(0.3)), int(b.chance(0.5))
    k = x.shape[0] if trans_a else x.shape[1]
    m = x.shape[1] if trans_a else x.shape[0]
    n = int(b.choice((1, 3, 4, 8)))
    w = b.source(F32, [n, k] if trans_b else [k, n], wild_ok=False)
    ins = [x, w]
    if b.chance(0.7):
        ins.append(b.source(F32, b.choice(([n], [m, n], [1, n], [m, 1], [])), wild_ok=False))
    attrs = {"transA": trans_a, "transB": trans_b}
    if b.chance(0.3):
        attrs.update(alpha=0.5, beta=float(b.choice((0.0, 2.0))))
    b.node("Gemm", ins, attrs)


def spatial_input(b, lo=3, hi=4):
    return b.pick(lambda v: floats(v, True, (F32,)) and lo <= len(v.shape) <= hi,
                  lambda: b.source(F32, (int(b.choice((1, 2))), int(b.choice((1, 2, 3, 4))))
                                   + tuple(int(b.choice((3, 4, 5, 6, 7))) for _ in range(
                                       int(b.rng.integers(lo - 2, hi - 1)))), wild_ok=False))


def window(b, spatial, max_k=3, dilate=True):
    """Kernel, strides, dilations and pads valid for `spatial`."""
    kernel, strides, dil, pads_lo, pads_hi = [], [], [], [], []
    for s in spatial:
        d = int(b.choice((1, 1, 2))) if dilate else 1
        k = int(b.rng.integers(1, max_k + 1))
        pl, ph = (int(b.rng.integers(0, k)), int(b.rng.integers(0, k))) if b.chance(0.5) else (0, 0)
        while (k - 1) * d + 1 > s + pl + ph and k > 1:
            k -= 1
        kernel.append(k)
        strides.append(int(b.choice((1, 1, 2, 3))))
        dil.append(d if (k - 1) * d + 1 <= s + pl + ph else 1)
        pads_lo.append(min(pl, k - 1))
        pads_hi.append(min(ph, k - 1))
    return kernel, strides, dil, pads_lo + pads_hi


@gen(3)
def conv(b):
    x = spatial_input(b)
    c = x.shape[1]
    group = int(b.choice([g for g in (1, 1, 2, 3, 4) if c % g == 0]))
    m = group * int(b.choice((1, 2, 3)))
    kernel, strides, dil, pads = window(b, x.shape[2:])
    attrs = {"kernel_shape": kernel, "strides": strides, "group": group}
    if b.chance(0.5):
        attrs["dilations"] = dil
    if b.chance(0.2):
        attrs["auto_pad"] = b.choice(("SAME_UPPER", "SAME_LOWER", "VALID"))
        attrs.pop("dilations", None)
    else:
        attrs["pads"] = pads
    w = b.source(F32, [m, c // group] + kernel, wild_ok=False, initializer=b.chance(0.8))
    ins = [x, w] + ([b.source(F32, [m], wild_ok=False, initializer=True)] if b.chance(0.6) else [])
    b.node("Conv", ins, attrs)


@gen(1.5)
def conv_transpose(b):
    x = spatial_input(b)
    c = x.shape[1]
    group = int(b.choice([g for g in (1, 1, 2) if c % g == 0]))
    m = group * int(b.choice((1, 2)))
    kernel = [int(b.rng.integers(1, 4)) for _ in x.shape[2:]]
    strides = [int(b.choice((1, 2, 3))) for _ in kernel]
    attrs = {"kernel_shape": kernel, "strides": strides, "group": group}
    if b.chance(0.4):
        attrs["output_padding"] = [int(b.rng.integers(0, s)) for s in strides]
    if b.chance(0.4):
        attrs["pads"] = [int(b.rng.integers(0, k)) for k in kernel] * 2
    if b.chance(0.2):
        attrs["dilations"] = [int(b.choice((1, 2))) for _ in kernel]
        attrs.pop("output_padding", None)
    w = b.source(F32, [c, m // group] + kernel, wild_ok=False, initializer=True)
    ins = [x, w] + ([b.source(F32, [m], wild_ok=False, initializer=True)] if b.chance(0.5) else [])
    b.node("ConvTranspose", ins, attrs)


def last_window_outside(spatial, kernel, strides, dilations, pads):
    """With ceil_mode, would the last window start past the input and its left padding?
    onnxruntime (and glowgen, and PyTorch) drop such a window, ONNX's shape inference counts
    it: the model's declared output shape is then wrong."""
    n = len(spatial)
    for i, d in enumerate(spatial):
        eff = (kernel[i] - 1) * dilations[i] + 1
        total = d + pads[i] + pads[n + i]
        out = -(-(total - eff) // strides[i]) + 1
        if (out - 1) * strides[i] >= d + pads[i]:
            return True
    return False


@gen(3)
def pool(b):
    op = b.choice(["MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"])
    x = spatial_input(b)
    if op.startswith("Global"):
        b.node(op, [x])
        return
    kernel, strides, dil, pads = window(b, x.shape[2:], dilate=op == "MaxPool")
    attrs = {"kernel_shape": kernel, "strides": strides}
    if any(pads):
        attrs["pads"] = pads
    if op == "MaxPool" and b.chance(0.3):
        attrs["dilations"] = dil
    dilations = attrs.get("dilations", [1] * len(kernel))
    if op != "LpPool" and b.chance(0.3) and not last_window_outside(x.shape[2:], kernel, strides,
                                                                       dilations, pads):
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and b.chance(0.5):
        attrs["count_include_pad"] = 1
    if op == "LpPool":
        attrs["p"] = int(b.choice((1, 2, 3)))
    b.node(op, [x], attrs)


# ---- data movement

@gen(2)
def transpose(b):
    x = b.pick(lambda v: len(v.shape) >= 2, b.fresh(NUMERIC, lo=2))
    perm = b.rng.permutation(len(x.shape)).tolist()
    b.node("Transpose", [x], {"perm": perm} if b.chance(0.85) else {})


@gen(2)
def reshape(b):
    x = b.pick(lambda v: True, b.fresh(NUMERIC))
    op = b.choice(["Reshape", "Flatten", "Squeeze", "Unsqueeze"])
    r = len(x.shape)
    if op == "Flatten":
        b.node(op, [x], {"axis": int(b.rng.integers(-r, r + 1))})
    elif op == "Squeeze":
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if not ones:
            raise Rejected("nothing to squeeze")
        axes = [a for a in ones if b.chance(0.6)] or ones[:1]
        b.node(op, [x] + ([b.const(axes)] if b.chance(0.85) else []))
    elif op == "Unsqueeze":
        n = int(b.rng.integers(1, 3))
        axes = sorted(b.rng.choice(r + n, size=n, replace=False).tolist())
        b.node(op, [x, b.const(axes)])
    else:
        size = int(np.prod(x.shape))
        dims, rest = [], size
        for _ in range(int(b.rng.integers(0, 4))):
            divs = [d for d in range(1, rest + 1) if rest % d == 0]
            d = int(b.choice(divs))
            dims.append(d)
            rest //= d
        dims.append(rest)
        if b.chance(0.4):
            dims[int(b.rng.integers(len(dims)))] = -1
        if r and b.chance(0.2) and len(dims) > 0 and dims[0] == x.shape[0]:
            dims[0] = 0
        b.node(op, [x, b.const(dims)])


@gen(2)
def concat(b):
    x = b.pick(lambda v: len(v.shape) >= 1, b.fresh(NUMERIC, lo=1))
    r = len(x.shape)
    axis = int(b.rng.integers(-r, r))
    parts = [x]
    for _ in range(int(b.rng.integers(1, 3))):
        same = [v for v in b.values if v.dtype == x.dtype and len(v.shape) == r and all(
            p == q for i, (p, q) in enumerate(zip(v.shape, x.shape)) if i != axis % r)]
        if same and b.chance(0.4):
            parts.append(b.choice(same))
        else:
            shape = list(x.shape)
            shape[axis] = int(b.choice((1, 2, 3)))
            parts.append(b.source(x.dtype, shape))
    b.node("Concat", parts, {"axis": axis})


@gen(2)
def split(b):
    x = b.pick(lambda v: len(v.shape) >= 1 and max(v.shape) >= 2, b.fresh(NUMERIC, lo=1))
    r = len(x.shape)
    axes = [a for a in range(r) if x.shape[a] >= 2]
    axis = int(b.choice(axes))
    d = x.shape[axis]
    if b.chance(0.5):
        cut = sorted(set(b.rng.integers(1, d, size=int(b.rng.integers(1, min(d, 4)))).tolist()))
        sizes = np.diff([0] + cut + [d]).tolist()
        b.node("Split", [x, b.const(sizes)], {"axis": axis - r if b.chance(0.3) else axis},
               n_out=len(sizes))
    elif b.opset >= 18:
        n = int(b.rng.integers(2, min(d, 4) + 1))
        b.node("Split", [x], {"axis": axis, "num_outputs": n}, n_out=n)
    else:
        n = int(b.choice([k for k in (2, 3) if d % k == 0] or [d]))
        b.node("Split", [x], {"axis": axis}, n_out=n)


@gen(3)
def slice_(b):
    x = b.pick(lambda v: len(v.shape) >= 1, b.fresh(NUMERIC, lo=1))
    r = len(x.shape)
    axes = sorted(b.rng.choice(r, size=int(b.rng.integers(1, r + 1)), replace=False).tolist())
    starts, ends, steps = [], [], []
    for a in axes:
        d = x.shape[a]
        step = int(b.choice((1, 1, 1, 2, -1, -2)))
        lo, hi = sorted(b.rng.integers(-d - 2, d + 3, size=2).tolist())
        if step > 0:
            starts.append(lo), ends.append(hi if hi != lo else hi + 1)
        else:
            starts.append(hi), ends.append(lo if hi != lo else lo - 1)
        if b.chance(0.1):
            ends[-1] = int(np.iinfo(np.int64).max if step > 0 else np.iinfo(np.int64).min)
        steps.append(step)
    ins = [x, b.const(starts), b.const(ends)]
    if b.chance(0.8) or any(s != 1 for s in steps) or axes != list(range(len(axes))):
        ins.append(b.const([a - r if b.chance(0.3) else a for a in axes]))
        ins.append(b.const(steps))
    b.node("Slice", ins)


@gen(3)
def gather(b):
    x = b.pick(lambda v: len(v.shape) >= 1, b.fresh(NUMERIC, lo=1))
    r = len(x.shape)
    axis = int(b.rng.integers(-r, r))
    d = x.shape[axis]
    dtype = b.choice((I64, I64, I32))
    if b.chance(0.3):
        # GatherElements: indices shaped like x except along axis.
        shape = list(x.shape)
        shape[axis] = int(b.rng.integers(1, d + 2))
        idx = b.rng.integers(-d, d, size=shape).astype(dtype)
        b.node("GatherElements", [x, b.const(idx, dtype)], {"axis": axis})
        return
    ishape = b.shape(lo=0, hi=2)
    idx = b.rng.integers(-d, d, size=ishape).astype(dtype)
    b.node("Gather", [x, b.const(idx, dtype)], {"axis": axis})


@gen(2)
def pad(b):
    x = b.pick(lambda v: len(v.shape) >= 1, b.fresh(NUMERIC, lo=1))
    r = len(x.shape)
    modes = ["constant", "reflect", "edge"] + (["wrap"] if b.opset >= 19 else [])
    mode = b.choice(modes)
    pads = []
    for side in range(2):
        for d in x.shape:
            if mode == "constant":
                pads.append(int(b.rng.integers(-min(d - 1, 1), 3)))
            elif mode == "reflect":
                pads.append(int(b.rng.integers(0, d)))        # reflect needs pads < the dimension
            else:
                pads.append(int(b.rng.integers(0, 3)))
    ins = [x, b.const(pads)]
    if mode == "constant" and b.chance(0.5) and x.dtype != BOOL:
        ins.append(b.const(np.array(1.5 if x.dtype.kind == "f" else 3).astype(x.dtype), x.dtype))
    b.node("Pad", ins, {"mode": mode})


@gen(1.5)
def tile_expand(b):
    x = b.pick(lambda v: True, b.fresh(NUMERIC))
    r = len(x.shape)
    if b.chance(0.5) and r:
        reps = [int(b.choice((1, 1, 2, 3))) for _ in range(r)]
        b.node("Tile", [x, b.const(reps)])
    else:
        shape = [int(b.choice((2, 3))) if d == 1 and b.chance(0.5) else (1 if b.chance(0.2) else d)
                 for d in x.shape]
        if b.chance(0.3):
            shape = [int(b.choice((1, 2)))] + shape
        b.node("Expand", [x, b.const(shape)])


@gen(1.5)
def resize(b):
    x = b.pick(lambda v: floats(v, True, (F32,)) and len(v.shape) == 4,
               lambda: b.source(F32, (1, int(b.choice((1, 2, 3)))) + b.shape(2, 2, 2), wild_ok=False))
    mode = b.choice(("nearest", "linear", "cubic"))
    attrs = {"mode": mode}
    ctm = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]
    if mode == "nearest":
        ctm.append("tf_half_pixel_for_nn")
        attrs["nearest_mode"] = b.choice(("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))
    attrs["coordinate_transformation_mode"] = b.choice(ctm)
    if mode == "cubic" and b.chance(0.5):
        attrs["cubic_coeff_a"] = -0.5
    if b.chance(0.5):
        # With align_corners (pytorch_half_pixel alike), onnxruntime divides by the output length rounded down, ONNX's
        # reference (and glowgen) by the unrounded one (input length * scale): give it scales
        # that make whole lengths, where the two agree.
        whole = attrs["coordinate_transformation_mode"] in ("align_corners", "pytorch_half_pixel")
        scales = [1.0, 1.0] + [float(b.choice([s for s in (0.5, 1.0, 1.5, 2.0, 3.0)
                                               if not whole or ((d * s).is_integer() and d * s != 1)]))
                               for d in x.shape[2:]]
        b.node("Resize", [x, "", b.const(scales, np.float32)], attrs)
    else:
        # pytorch_half_pixel samples an output of length 1 at 0 says the spec (onnxruntime),
        # at -0.5 says ONNX's reference (glowgen, checked by the conformance suite): with
        # cubic weights the two differ.  No such outputs (unless the input has length 1).
        low = 2 if attrs["coordinate_transformation_mode"] == "pytorch_half_pixel" else 1
        sizes = list(x.shape[:2]) + [1 if d == 1 and b.chance(0.3) else int(b.rng.integers(low, 9))
                                     for d in x.shape[2:]]
        b.node("Resize", [x, "", "", b.const(sizes)], attrs)


@gen(1)
def depth_space(b):
    x = b.pick(lambda v: len(v.shape) == 4 and v.dtype in (F32,), b.fresh((F32,), rank=4))
    n, c, h, w = x.shape
    if b.chance(0.5):
        bs = [k for k in (2, 3) if h % k == 0 and w % k == 0]
        if not bs:
            raise Rejected("no block")
        b.node("SpaceToDepth", [x], {"blocksize": int(b.choice(bs))})
    else:
        bs = [k for k in (2,) if c % (k * k) == 0]
        if not bs:
            raise Rejected("no block")
        b.node("DepthToSpace", [x], {"blocksize": 2, "mode": b.choice(("DCR", "CRD"))})


@gen(1)
def trilu(b):
    x = b.pick(lambda v: len(v.shape) >= 2 and v.dtype in (F32, I64), b.fresh((F32, I64), lo=2))
    ins = [x] + ([b.const(int(b.rng.integers(-2, 3)))] if b.chance(0.6) else [])
    b.node("Trilu", ins, {"upper": int(b.chance(0.5))})


@gen(1)
def shape_ops(b):
    x = b.pick(lambda v: True, b.fresh(NUMERIC))
    op = b.choice(["Shape", "Size", "EyeLike", "Identity"])
    if op == "EyeLike":
        if len(x.shape) != 2 or x.dtype not in (F32, I64, I32, F64):
            raise Rejected("EyeLike is 2-D")
        b.node(op, [x], {"k": int(b.rng.integers(-2, 3))} if b.chance(0.5) else {})
    elif op == "Shape" and b.chance(0.4):
        r = len(x.shape)
        b.node(op, [x], {"start": int(b.rng.integers(-r - 1, r + 1))})
    else:
        b.node(op, [x])


@gen(0.7)
def onehot(b):
    depth = int(b.rng.integers(2, 6))
    idx = b.source(I64, b.shape(lo=1, hi=2), wild_ok=False)
    r = len(idx.shape)
    values = b.const(np.array([0.5, 2.0], np.float32), np.float32)
    b.node("OneHot", [idx, b.const(depth), values], {"axis": int(b.rng.integers(-r - 1, r + 1))})
