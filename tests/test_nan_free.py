"""Values that cannot be NaN (backends/cpu/values.Value.nan_free): a quantized loop's
dequantize, add and requantize converts to i8 without a NaN test, and a chain whose values
can be NaN keeps it.  The emitted IR says which; compiled graphs are held to NumPy and the
interpreter, NaN converting to 0."""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from glowgen import pipeline
from glowgen.api import CompiledModel
from glowgen.backends.cpu.llvmutil import F32, I8
from glowgen.backends.cpu.scalar import ScalarEmitter, Value
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function

SHAPE = (1, 8, 9, 10)
DIMS = "[1, 8, 9, 10]"
REGISTRY = Registry.default()


class Chain:
    """Spec kernels emitted one after another into a fresh function of (y: i8, r: i8, x: f32),
    unoptimized: what a stacked loop computes for one element."""

    def __init__(self):
        self.module = ir.Module()
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I8, I8, F32]), "f")
        self.b = ir.IRBuilder(fn.append_basic_block())
        self.em = ScalarEmitter(self.b, REGISTRY.scalars)
        self.y, self.r, self.x = Value(fn.args[0], "i8"), Value(fn.args[1], "i8"), Value(fn.args[2], "f32")

    def __call__(self, kind, *args, **attrs):
        return self.em.emit(REGISTRY.kernels[kind]["body"], list(args), attrs)

    def nan_tests(self) -> int:
        """`fcmp uno`: the NaN test of each float -> i8 conversion."""
        self.b.ret_void()
        return str(self.module).count("fcmp uno")


def test_a_quantized_residual_add_needs_no_nan_test():
    k = Chain()
    d = k("Dequantize", k.y, in_scale=0.04, in_offset=2)
    e = k("Dequantize", k.r, in_scale=0.05, in_offset=-4)
    assert d.nan_free and d.range == (-5.2, 5.0)
    t = k("Relu", k("Add", d, e))
    z = k("Quantize", t, scale=0.06, offset=-128, dtype="i8")
    assert t.nan_free and z.dtype == "i8"
    assert k.nan_tests() == 0


def test_what_may_be_nan_keeps_its_nan_test():
    cases = {
        "a float input": lambda k: k.x,
        "a division by what may be 0 (0 / 0)": lambda k: k("Div", k("Dequantize", k.y, in_scale=0.04, in_offset=2),
                                                            k("Dequantize", k.r, in_scale=0.05, in_offset=-4)),
        "a product with a float input (0 * inf)": lambda k: k("Mul", k("Dequantize", k.y, in_scale=0.04, in_offset=2), k.x),
        "a sum with a float input": lambda k: k("Add", k("Dequantize", k.y, in_scale=0.04, in_offset=2), k.x),
        "the max of a float input": lambda k: k("Max", k("Dequantize", k.y, in_scale=0.04, in_offset=2), k.x),
        # a clamp bounds the range but lets NaN through: the range alone cannot say NaN-free
        "a clamped float input": lambda k: k("Clip", k.x, min=-1.0, max=1.0),
        "a sum with a clamped float input": lambda k: k("Add", k("Dequantize", k.y, in_scale=0.04, in_offset=2),
                                                         k("Clip", k.x, min=-1.0, max=1.0)),
    }
    for name, make in cases.items():
        k = Chain()
        k("Quantize", make(k), scale=0.06, offset=3, dtype="i8")
        assert k.nan_tests() == 1, name


def test_a_division_by_a_nonzero_constant_stays_nan_free():
    k = Chain()
    d = k("Dequantize", k.y, in_scale=0.04, in_offset=2)
    q = k("Div", d, 0.5)
    assert q.nan_free and q.range == (-10.4, 10.0)
    k("Quantize", k("Round", q), scale=0.06, offset=3, dtype="i8")
    assert k.nan_tests() == 0


# --------------------------------------------------------------------------- compiled graphs
def _compile(text, backend="cpu"):
    fn = parse_function(text, REGISTRY)
    pipeline.run(fn, REGISTRY, pipeline.PIPELINE, backend)
    return CompiledModel(fn, REGISTRY, backend, **(dict(threads=1) if backend == "cpu" else {}))


def _ints(rng):
    return rng.integers(-128, 128, SHAPE).astype(np.int8)


def _dequantized_pair(body: str) -> str:
    """A graph of two i8 inputs y and r, dequantized to %d and %e, then `body`, which makes
    the output %z."""
    return f"""graph test {{
  input %y: i8{DIMS} q(0.04, 2)
  input %r: i8{DIMS} q(0.05, -4)
  %d = Dequantize(%y) {{in_scale = 0.04, in_offset = 2}} : f32{DIMS}
  %e = Dequantize(%r) {{in_scale = 0.05, in_offset = -4}} : f32{DIMS}
{body}  output "z" = %z
}}"""


def test_quantized_residual_add_against_numpy():
    text = _dequantized_pair(f"""  %s = Add(%d, %e) : f32{DIMS}
  %t = Relu(%s) : f32{DIMS}
  %z = Quantize(%t) {{scale = 0.0613, offset = -128}} : i8{DIMS} q(0.0613, -128)
""")
    rng = np.random.default_rng(0)
    feeds = {"y": _ints(rng), "r": _ints(rng)}
    got = _compile(text).run(feeds)["z"]
    # One op (QuantizedAdd), rounded once: against the exact sum, in float64.
    v = (feeds["y"].astype(np.float64) - 2) * 0.04 + (feeds["r"].astype(np.float64) + 4) * 0.05
    want = np.clip(np.rint(np.maximum(v, 0) / 0.0613) - 128, -128, 127).astype(np.int8)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert (got == want).mean() > 0.99
    ref = _compile(text, backend="interpreter").run(feeds)["z"]
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1


def test_nan_and_infinities_convert_as_the_interpreter_has_them():
    """0 / 0 converts to 0 (not the offset), x / 0 saturates; and a float input's NaN too."""
    text = _dequantized_pair(f"""  %q = Div(%d, %e) : f32{DIMS}
  %z = Quantize(%q) {{scale = 0.06, offset = -128}} : i8{DIMS} q(0.06, -128)
""")
    rng = np.random.default_rng(1)
    feeds = {"y": _ints(rng), "r": _ints(rng)}
    feeds["y"].flat[:5], feeds["r"].flat[:5] = 2, -4        # 0 / 0
    feeds["r"].flat[5:9] = -4                               # x / 0
    got = _compile(text).run(feeds)["z"]
    ref = _compile(text, backend="interpreter").run(feeds)["z"]
    assert (got.flat[:5] == 0).all() and (ref.flat[:5] == 0).all()
    assert np.array_equal(got.flat[5:9], ref.flat[5:9])
    assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1

    text = f"""graph test {{
  input %x: f32{DIMS}
  %z = Quantize(%x) {{scale = 0.06, offset = 3}} : i8{DIMS} q(0.06, 3)
  output "z" = %z
}}"""
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    x.flat[:3] = [np.nan, np.inf, -np.inf]
    got = _compile(text).run({"x": x})["z"]
    assert list(got.flat[:3]) == [0, 127, -128]
    assert np.array_equal(got, _compile(text, backend="interpreter").run({"x": x})["z"])
