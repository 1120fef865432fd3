"""Transcendentals on the CPU backend: the `scalar` definitions of specs/cpu_kernels.glowdef
(range reduction + polynomial, inlined so they vectorize) against float64 NumPy over a wide
range -- log-spaced ±[1e-38, 1e38], denormals, a dense linear sweep, ±0, ±inf, NaN -- with a
relative error bound of 2e-7, the same NaN/inf results, and vector code in a stacked loop.

Error measure: |y - ref| / max(|ref|, smallest normal f32), so results in the denormal range
are held to an absolute error there; an inf or NaN must match the reference rounded to f32."""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from llvmlite import ir

import glowgen
from glowgen.backends.cpu.jit import JitFunction, host_target
from glowgen.backends.cpu.target import resolve_cpu
from glowgen.backends.cpu.llvmutil import F32, I64, for_range
from glowgen.backends.cpu.scalar import ScalarEmitter
from glowgen.backends.cpu.values import Value
from glowgen.reference.elementwise import compile_tree
from glowgen.scalars import SCALAR_FUNCTIONS
from glowgen.engine.registry import Registry

from conftest import make_model

BOUND = 2e-7
TINY = float(np.finfo(np.float32).tiny)
_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _np(fn):
    def ref(x):
        with np.errstate(all="ignore"):
            return fn(x)
    return ref


REFERENCES = {
    "exp": _np(np.exp), "expm1": _np(np.expm1), "log": _np(np.log), "log1p": _np(np.log1p),
    "tanh": _np(np.tanh), "erf": _erf64,
}

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3e-39, -3e-39, TINY, -TINY,
                     3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, -0.5, 88.72283, 88.72284, -87.33655,
                     -103.97208, -103.97209, -1.0000001, -0.99999994, 0.625, 9.0, 3.92, 1e-8, -1e-8],
                    np.float32)


def sample(n=150_000, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    wide = np.exp(rng.uniform(math.log(1e-38), math.log(1e38), n))
    denormal = rng.uniform(0, TINY, n // 10)
    linear = rng.uniform(-20, 20, n)
    unit = rng.uniform(-2, 2, n)
    x = np.concatenate([wide, -wide, denormal, -denormal, linear, unit]).astype(np.float32)
    return np.concatenate([x, SPECIALS])


def rel_err(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    y64 = y.astype(np.float64)
    with np.errstate(all="ignore"):
        ref32 = ref.astype(np.float32).astype(np.float64)
        err = np.abs(y64 - ref) / np.maximum(np.abs(ref), TINY)
    nan_y, nan_r = np.isnan(y64), np.isnan(ref)
    err = np.where(nan_y | nan_r, np.where(nan_y == nan_r, 0.0, np.inf), err)
    inf = (np.isinf(ref32) | np.isinf(y64)) & ~nan_r & ~nan_y
    return np.where(inf, np.where(y64 == ref32, 0.0, np.inf), err)


def check(name, x, y, ref, bound=BOUND):
    err = rel_err(y, ref)
    i = int(np.argmax(err))
    assert err[i] <= bound, (f"{name}: max relative error {err[i]:.3g} at x={x[i]!r}: "
                             f"got {y[i]!r}, float64 reference {ref[i]!r}")
    # Zeros keep their sign where the reference has one (exp(-inf) = +0, tanh(-0) = -0, ...).
    zero = (ref == 0) & (y == 0)
    assert np.array_equal(np.signbit(y[zero]), np.signbit(ref[zero])), name
    return err[i]


# ------------------------------------------------------------------ the scalar functions
def scalar_kernel(fname: str):
    """JIT `out[i] = fname(in[i])` over f32 with the CPU backend's ScalarEmitter."""
    reg = Registry.default()
    mod = ir.Module(name=f"t_{fname}")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [F32.as_pointer(), F32.as_pointer(), I64]),
                     name="kernel")
    for a in fn.args[:2]:
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    with for_range(b, fn.args[2]) as i:
        x = Value(b.load(b.gep(fn.args[0], [i])), "f32")
        y = ScalarEmitter(b, reg.scalars).emit(("call", fname, (("param", 0),)), [x], {})
        b.store(y.v, b.gep(fn.args[1], [i]))
    b.ret_void()
    jit = JitFunction(str(mod), "kernel", cpu=resolve_cpu())   # the target the tests compile for
    cfn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        jit.engine.get_function_address("kernel"))

    def run(x):
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty_like(x)
        cfn(x.ctypes.data, out.ctypes.data, x.size)
        return out
    run.jit = jit
    return run


@pytest.mark.parametrize("fname", sorted(REFERENCES))
def test_scalar_function_accuracy(fname):
    assert fname in Registry.default().scalars, f"specs define no scalar {fname}"
    run = scalar_kernel(fname)
    x = sample()
    if fname == "erf":              # math.erf is slow; erf is flat beyond 4 anyway
        x = np.concatenate([x[::5], SPECIALS])
    check(fname, x, run(x), REFERENCES[fname](x.astype(np.float64)))
    # The kernel calls nothing (no libm, no intrinsic that becomes a call).
    assert "call" not in run.jit.assembly().split("kernel:", 1)[1].split(".Lfunc_end", 1)[0]


def test_special_values():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -1.0, -2.0], np.float32)
    expect = {
        "exp": [np.inf, 0, np.nan, 1, 1, math.exp(-1), math.exp(-2)],
        "expm1": [np.inf, -1, np.nan, 0, -0.0, math.expm1(-1), math.expm1(-2)],
        "log": [np.inf, np.nan, np.nan, -np.inf, -np.inf, np.nan, np.nan],
        "log1p": [np.inf, np.nan, np.nan, 0, -0.0, -np.inf, np.nan],
        "tanh": [1, -1, np.nan, 0, -0.0, math.tanh(-1), math.tanh(-2)],
        "erf": [1, -1, np.nan, 0, -0.0, math.erf(-1), math.erf(-2)],
    }
    for fname, want in expect.items():
        y = scalar_kernel(fname)(x)
        want = np.array(want, np.float32)
        np.testing.assert_allclose(y, want, rtol=2e-7, atol=0, err_msg=fname)
        assert np.array_equal(np.signbit(y), np.signbit(want)) or fname in ("log", "log1p"), fname


# ------------------------------------------------------------------ ONNX ops on the cpu backend
def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


OPS = [
    ("Exp", {}, np.exp),
    ("Log", {}, np.log),
    ("Tanh", {}, np.tanh),
    ("Erf", {}, _erf64),
    ("Sigmoid", {}, lambda x: 1 / (1 + np.exp(-x))),
    ("Softplus", {}, _softplus),
    ("Elu", {"alpha": 1.0}, lambda x: np.where(x < 0, np.expm1(x), x)),
    ("Elu", {"alpha": 0.5}, lambda x: np.where(x < 0, np.float32(0.5) * np.expm1(x), x)),
]


@pytest.mark.parametrize("op,attrs,ref", OPS, ids=[f"{o}{a.get('alpha', '')}" for o, a, _ in OPS])
def test_op_accuracy_on_cpu(op, attrs, ref):
    from onnx import helper
    x = sample(40_000, seed=1)
    if op == "Erf":
        x = np.concatenate([x[::3], SPECIALS])
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"])
    y = glowgen.compile(model, backend="cpu").run({"x": x})["y"]
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
    check(op, x, y, want)


def test_f64_and_f16_exp():
    """The f32 definitions serve f16 (computed in f32); f64 keeps an f64-accurate exp."""
    from onnx import helper
    x64 = np.linspace(-50, 50, 1001)
    m = make_model([helper.make_node("Exp", ["x"], ["y"])], {"x": x64}, ["y"])
    np.testing.assert_allclose(glowgen.compile(m, backend="cpu").run({"x": x64})["y"], np.exp(x64), rtol=1e-14)
    x16 = np.linspace(-10, 10, 1001).astype(np.float16)
    m = make_model([helper.make_node("Exp", ["x"], ["y"])], {"x": x16}, ["y"])
    y = glowgen.compile(m, backend="cpu").run({"x": x16})["y"]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.exp(x16.astype(np.float64)).astype(np.float16))


# ------------------------------------------------------------------ vector code
def test_stacked_transcendentals_vectorize():
    features = resolve_cpu().features        # the target the tests compile for
    width = "zmm" if "+avx512f" in features else "ymm" if "+avx2" in features else None
    if width is None:
        pytest.skip("host has neither AVX2 nor AVX-512")
    from onnx import helper
    x = np.random.default_rng(0).standard_normal((1, 16, 32, 32)).astype(np.float32)
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["y"])]
    m = glowgen.compile(make_model(nodes, {"x": x}, ["y"]), backend="cpu")
    asm = m._runner.jit.assembly()
    assert width in asm
    for sym in ("expf", "tanhf", "exp@", "tanh@", "call\texp", "call\ttanh"):
        assert sym not in asm, sym
    with np.errstate(all="ignore"):
        want = 1 / (1 + np.exp(-np.tanh(np.exp(x.astype(np.float64)))))
    check("Exp-Tanh-Sigmoid", x.ravel(), m.run({"x": x})["y"].ravel(), want.ravel())


# ------------------------------------------------------------------ the interpreter split
def test_interpreter_uses_numpy_over_scalar_definitions():
    scalars = Registry.default().scalars
    x = np.random.default_rng(2).uniform(-5, 5, 1000).astype(np.float32)
    for fname in ("exp", "log1p", "tanh", "expm1"):
        assert fname in scalars and fname in SCALAR_FUNCTIONS
        f = compile_tree(("call", fname, (("param", 0),)), scalars)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(f([x], {}), SCALAR_FUNCTIONS[fname].numpy(x))
    # A name NumPy lacks is inlined from its definition.
    fake = {"twice": {"params": ("x",), "dtypes": (None,),
                      "body": ("call", "mul", (("param", 0), ("const", 2.0)))}}
    f = compile_tree(("call", "twice", (("param", 0),)), fake)
    np.testing.assert_array_equal(f([x], {}), x * 2)


def test_scalar_definition_calling_its_own_name_uses_the_builtin():
    """`scalar exp(x) = exp(x) * 1` must not inline forever: the inner exp is the built-in."""
    body = ("call", "mul", (("call", "exp", (("param", 0),)), ("const", 1.0)))
    scalars = {"exp": {"params": ("x",), "dtypes": ("f32",), "body": body}}
    mod = ir.Module(name="rec")
    fn = ir.Function(mod, ir.FunctionType(F32, [F32]), name="f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    v = ScalarEmitter(b, scalars).emit(("call", "exp", (("param", 0),)), [Value(fn.args[0], "f32")], {})
    b.ret(v.v)
    assert "llvm.exp.f32" in str(mod)


def test_ldexp_frexp_primitives_match_numpy():
    """The bit-level primitives agree with their NumPy definitions on the CPU backend."""
    reg = Registry.default()
    rng = np.random.default_rng(3)
    x = np.concatenate([np.exp(rng.uniform(-80, 80, 20000)) * rng.choice([-1, 1], 20000),
                        rng.uniform(-TINY, TINY, 1000), SPECIALS]).astype(np.float32)
    n = np.round(rng.uniform(-300, 300, x.size)).astype(np.float32)
    m = np.clip(x, -2, 2)
    m = np.where(np.abs(m) < 2.0 ** -60, 1.5, m).astype(np.float32)      # ldexp's exact domain
    cases = {"frexp_mant": (x,), "frexp_exp": (x,), "ldexp": (m, n), "copysign": (x, -x), "trunc": (x,)}
    for fname, args in cases.items():
        mod = ir.Module(name=fname)
        k = len(args)
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [F32.as_pointer()] * (k + 1) + [I64]), name="kernel")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        with for_range(b, fn.args[-1]) as i:
            vals = [Value(b.load(b.gep(fn.args[j], [i])), "f32") for j in range(k)]
            tree = ("call", fname, tuple(("param", j) for j in range(k)))
            b.store(ScalarEmitter(b, reg.scalars).emit(tree, vals, {}).v, b.gep(fn.args[k], [i]))
        b.ret_void()
        jit = JitFunction(str(mod), "kernel", cpu=resolve_cpu())   # the target the tests compile for
        cfn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (k + 1)), ctypes.c_int64)(
            jit.engine.get_function_address("kernel"))
        out = np.empty_like(x)
        cfn(*[a.ctypes.data for a in args], out.ctypes.data, x.size)
        with np.errstate(all="ignore"):
            want = np.asarray(SCALAR_FUNCTIONS[fname].numpy(*args), np.float32)
        np.testing.assert_array_equal(out, want, err_msg=fname)


# ------------------------------------------------------------------ value ranges
@pytest.mark.parametrize("size", [200, 16 * 32 * 32], ids=["one-loop", "strip-mined"])
def test_tanh_of_a_sigmoid_is_its_polynomial(size):
    """A sigmoid's output lies in [0, 1], so the tanh after it in a stack needs neither its
    exp nor its divide (`a >= 1.0625` folds to false), in one loop and when the stack is
    strip-mined into groups that hand values over in memory -- and stays as accurate,
    NaN, ±inf and ±0 included."""
    from onnx import helper
    x = np.concatenate([sample(size // 6, seed=3)[:size - len(SPECIALS)], SPECIALS])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Tanh", ["s"], ["y"])]
    m = glowgen.compile(make_model(nodes, {"x": x}, ["y"]), backend="cpu")

    def divides(model):      # fdivs in the module as generated
        return model._runner.llvm_ir(optimized=False).count("fdiv")
    sigmoid = glowgen.compile(make_model(nodes[:1], {"x": x}, ["s"]), backend="cpu")
    assert divides(m) == divides(sigmoid), "tanh kept its divide: the sigmoid's range was lost"
    with np.errstate(all="ignore"):
        want = np.tanh(1 / (1 + np.exp(-x.astype(np.float64))))
    # tanh' <= 1 there: the sigmoid's error carries over at most once more.
    check("Sigmoid-Tanh", x, m.run({"x": x})["y"], want, bound=2 * BOUND)
    # Without a known range (the tanh alone) both branches stay.
    alone = glowgen.compile(make_model(nodes[1:], {"s": x}, ["y"]), backend="cpu")
    assert divides(alone) > 0


def test_comparisons_fold_only_to_false():
    """A comparison the ranges decide folds to false, never to true: NaN compares false, so
    `x >= 0` after a Relu still takes the other branch for NaN (Relu(NaN) is NaN)."""
    from onnx import helper
    x = np.array([np.nan, -1.0, 0.0, 2.0, np.inf, -np.inf], np.float32)
    # Where(Relu(x) >= 0, 1, -1): the ranges say Relu(x) >= 0 holds -- except for NaN.
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Constant", [], ["z"], value=helper.make_tensor("z", 1, [], [0.0])),
             helper.make_node("GreaterOrEqual", ["r", "z"], ["c"]),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", 1, [], [1.0])),
             helper.make_node("Constant", [], ["mone"], value=helper.make_tensor("mone", 1, [], [-1.0])),
             helper.make_node("Where", ["c", "one", "mone"], ["y"])]
    y = glowgen.compile(make_model(nodes, {"x": x}, ["y"]), backend="cpu").run({"x": x})["y"]
    np.testing.assert_array_equal(y, np.where(np.maximum(x, 0) >= 0, 1.0, -1.0).astype(np.float32))


# ------------------------------------------------------------------ chains cut at `handoff`
def _cut_arrays(compiled) -> list:
    """The per-block arrays values crossing a cut wait in, left after LLVM's optimizations."""
    import re
    return re.findall(r'%"?cut[\w.]*"? = alloca', compiled._runner.llvm_ir())


def _cut_chain_model():
    from onnx import helper
    x = np.concatenate([sample(3000, seed=3)[:2958], SPECIALS, np.linspace(-9, 9, 13, dtype=np.float32)])
    x = x.astype(np.float32).reshape(3, 1000)      # 3000 elements: blocks of 256 and a ragged one
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Exp", ["a"], ["e"]),
             helper.make_node("Add", ["e", "m"], ["b"]), helper.make_node("Sigmoid", ["b"], ["s"]),
             helper.make_node("Erf", ["x"], ["f"]), helper.make_node("Tanh", ["x"], ["t"])]
    consts = {"k": np.array(0.7, np.float32), "m": np.array(-3.0, np.float32)}
    return make_model(nodes, {"x": x}, ["e", "s", "f", "t"], consts), x


@pytest.mark.parametrize("threads", [1, 2])
def test_avx2_runs_long_chains_as_passes_over_blocks(threads, monkeypatch):
    """For 8-lane vectors a transcendental's chain is cut at the spec's `handoff` (exp's,
    after its reduction) into passes over a block (backends/cpu/handoffs.py): exp, erf, a
    sigmoid (a mask crosses the cut) and tanh, with an intermediate that is an output too.
    The passes compute what the uncut loop computes, bit for bit, and match float64."""
    if "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("host has no AVX2")
    from glowgen.backends.cpu import codegen
    model, x = _cut_chain_model()
    cut = glowgen.compile(model, backend="cpu", cpu="x86-64-v3", threads=threads)
    assert _cut_arrays(cut)
    monkeypatch.setattr(codegen, "handoffs_to_cut", lambda module: 99)
    whole = glowgen.compile(model, backend="cpu", cpu="x86-64-v3", threads=threads)
    assert not _cut_arrays(whole)
    got, want = cut.run({"x": x}), whole.run({"x": x})
    for name in ("e", "s", "f", "t"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        b = (got["e"] - np.float32(3)).astype(np.float64)       # the sigmoid's operand, in f32
        refs = {"e": np.exp((np.float32(0.7) * x).astype(np.float64)),
                "s": 1 / (1 + np.exp(-b)), "f": _erf64(x64), "t": np.tanh(x64)}
    for name, ref in refs.items():
        check(name, x.ravel(), got[name].ravel(), ref.ravel())


def test_avx512_cuts_only_chains_with_two_handoffs():
    """16-lane vectors hold twice the elements in flight: exp, a sigmoid and tanh (one cut,
    in exp) ran 8-20% slower cut, erf (cut after its division and in its exp) 9% faster."""
    if "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("host has no AVX-512")
    from onnx import helper
    x = sample(3000, seed=4)
    for op, cut in (("Exp", False), ("Sigmoid", False), ("Tanh", False), ("Erf", True)):
        model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"])
        compiled = glowgen.compile(model, backend="cpu", cpu="x86-64-v4")
        assert bool(_cut_arrays(compiled)) == cut, op
        if op == "Erf":
            check(op, x, compiled.run({"x": x})["y"], _erf64(x.astype(np.float64)))
