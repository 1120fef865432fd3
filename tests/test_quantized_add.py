"""QuantizedAdd: a sum of two dequantized integers quantized again is one op (the
[quantize] rules quantized_add, quantized_add_relu, relu_of_quantized_add), computed as
a * ra + (b * rb + k) rounded once; and the cpu backend's cast(saturate(x, t), t) of a
bounded value converts with the rounding and clamps as integers
(scalar.ScalarEmitter._saturating_cast).  Results are held to the exact requantized sum,
computed in float64, and to the interpreter."""
from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from glowgen import pipeline
from glowgen.api import CompiledModel
from glowgen.backends.cpu.llvmutil import F32, I8
from glowgen.backends.cpu.scalar import ScalarEmitter, Value
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function

REGISTRY = Registry.default()
SHAPE = (1, 16, 11, 13)
DIMS = "[1, 16, 11, 13]"
A_Q, B_Q = (0.0437, 3), (0.0519, -6)      # scales that put few exact ties in the sums


def _sum_graph(dtype: str, scale: float, offset: int, relu: bool) -> str:
    (sa, za), (sb, zb) = A_Q, B_Q
    relu_line = f"  %r = Relu(%s) : f32{DIMS}\n" if relu else ""
    return f"""graph test {{
  input %a: {dtype}{DIMS} q({sa}, {za})
  input %b: {dtype}{DIMS} q({sb}, {zb})
  %da = Dequantize(%a) {{in_scale = {sa}, in_offset = {za}}} : f32{DIMS}
  %db = Dequantize(%b) {{in_scale = {sb}, in_offset = {zb}}} : f32{DIMS}
  %s = Add(%da, %db) : f32{DIMS}
{relu_line}  %y = Quantize({"%r" if relu else "%s"}) {{scale = {scale}, offset = {offset}, dtype = "{dtype}"}} : {dtype}{DIMS} q({scale}, {offset})
  output "y" = %y
}}"""


def _compile(text: str, backend: str = "cpu"):
    fn = parse_function(text, REGISTRY)
    pipeline.run(fn, REGISTRY, pipeline.PIPELINE, backend)
    model = CompiledModel(fn, REGISTRY, backend, **(dict(threads=1) if backend == "cpu" else {}))
    return fn, model


def _feeds(dtype: str, seed: int = 0) -> dict:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    return {k: rng.integers(info.min, info.max + 1, SHAPE).astype(dtype) for k in "ab"}


def _exact(feeds, dtype: str, scale: float, offset: int, relu: bool, low=None) -> np.ndarray:
    (sa, za), (sb, zb) = A_Q, B_Q
    v = (feeds["a"].astype(np.float64) - za) * sa + (feeds["b"].astype(np.float64) - zb) * sb
    q = np.rint((np.maximum(v, 0) if relu else v) / scale) + offset
    if low is not None:
        q = np.maximum(q, low)
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max)


@pytest.mark.parametrize("dtype,scale,offset,relu", [
    ("int8", 0.0613, -9, False),
    ("int8", 0.0277, -100, True),          # the ReLU's bound inside the range
    ("int8", 0.0109, 20, False),           # most sums saturate, at both ends
    ("int16", 0.000231, 17, True),
])
def test_the_sum_is_one_op_within_a_step_of_the_exact_sum(dtype, scale, offset, relu):
    text = _sum_graph({"int8": "i8", "int16": "i16"}[dtype], scale, offset, relu)
    fn, model = _compile(text)
    ops = [n.OP for n in fn.nodes]
    assert ops == ["QuantizedAdd"], ops
    feeds = _feeds(dtype)
    got = model.run(feeds)["y"].astype(np.int64)
    want = _exact(feeds, dtype, scale, offset, relu)
    assert np.abs(got - want).max() <= 1
    assert (got == want).mean() > 0.995
    if relu:
        assert got.min() >= offset
    _, ref = _compile(text, backend="interpreter")
    assert np.abs(got - ref.run(feeds)["y"].astype(np.int64)).max() <= 1


def _quantized_add(low: int) -> str:
    (sa, za), (sb, zb) = A_Q, B_Q
    return f"""graph test {{
  input %a: i8{DIMS} q({sa}, {za})
  input %b: i8{DIMS} q({sb}, {zb})
  %y = QuantizedAdd(%a, %b) {{a_scale = {sa}, a_offset = {za}, b_scale = {sb}, b_offset = {zb}, scale = 0.0613, offset = -9, low = {low}}} : i8{DIMS} q(0.0613, -9)
  output "y" = %y
}}"""


@pytest.mark.parametrize("low", [-300, -128, 40, 127, 200])
def test_the_lower_bound_joins_the_saturation(low):
    """low below the type's range is none; above it, every result is the type's maximum."""
    feeds = _feeds("int8", seed=1)
    got = _compile(_quantized_add(low))[1].run(feeds)["y"].astype(np.int64)
    want = _exact(feeds, "int8", 0.0613, -9, False, low=low)
    assert np.abs(got - want).max() <= 1 and (got == want).mean() > 0.995
    if low > -128:                  # some sums fall below the bound, which binds
        assert got.min() == min(low, 127)
    if low >= 127:
        assert (got == 127).all()


def _emit(kind: str, **attrs) -> str:
    """The IR of one element of kernel `kind` of two i8 operands (QuantizedAdd) or one f32
    (Quantize), unoptimized."""
    module = ir.Module()
    args = [I8, I8] if kind == "QuantizedAdd" else [F32]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    em = ScalarEmitter(b, REGISTRY.scalars)
    values = [Value(a, "i8" if t == I8 else "f32") for a, t in zip(fn.args, args)]
    y = em.emit(REGISTRY.kernels[kind]["body"], values, attrs)
    assert y.dtype == attrs["dtype"]
    b.ret_void()
    return str(module)


def test_a_bounded_sum_saturates_in_integers_and_a_float_input_in_floats():
    (sa, za), (sb, zb) = A_Q, B_Q
    text = _emit("QuantizedAdd", a_scale=sa, a_offset=za, b_scale=sb, b_offset=zb,
                 scale=0.0613, offset=-9, low=40, dtype="i8")
    assert "fcmp" not in text                       # no float max or min, no NaN test
    assert "llvm.smax.i32" in text and "llvm.smin.i32" in text
    assert "llvm.lrint" in text and "roundeven" not in text     # the conversion rounds
    text = _emit("Quantize", scale=0.06, offset=3, dtype="i8")
    assert "llvm.smax" not in text and "fcmp uno" in text   # unbounded, may be NaN: as before
