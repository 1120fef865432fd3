"""A pointwise QuantizedConv with a residual r (quantize_conv_residual folds a residual sum
into the convolution before it): r - r_offset, times r_scale / scale, joins the scaled sums
before their one rounding.  The int8 kernels read r where they store each vector of results:
the pixels-in-lanes product at each vector's place, the features-in-lanes one (qlanes.py)
from its result block, into which it first copies r transposed; the plain loops (int16, or a
target without an int8 product) element by element.  Held to the formula bit for bit (for
int8 two fused multiply-adds, computed here in exact rationals and rounded to f32 once each;
for int16 products and sums in f64), and to the exact sum in float64 within one step."""
from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest

from glowgen.backends.cpu.kernels import qlanes
from glowgen.errors import GlowgenError
from glowgen.backends.cpu.kernels.qlinalg import Geometry
from glowgen.backends.cpu.qgemm import QShape
from test_int8_kernels import _compile, _dense, _shape, multipliers, ref_conv

from conftest import HOST_AND_AVX2

_FLAGS = open("/proc/cpuinfo").read()
# The host's int8 path, AVX2's, AVX-512BW's without VNNI (x86-64-v4) where it runs, and plain
# loops (x86-64: no int8 product).
CPUS = HOST_AND_AVX2 + (["x86-64-v4"] if "avx512bw" in _FLAGS else []) + ["x86-64"]
X_Q, R_Q, Y_Q = (0.02, 3), (0.031, -7), (0.047, -20)

# n, c, h, w, m, bounds (low, high or None), conv output also read elsewhere: 100 pixels (the
# last vector partly past them), 20 filters (the last block of rows half padding); two images
# of 117; 28 x 28 from 32 in whole tiles; 7 x 7 and 5 x 5 from 512 channels, and 6 pixels,
# which the int8 products compute with the features in the lanes (qlanes): rows of 49 and
# 25 pixels (in read_residual and write_conv_out blocks of 16 pixels, the last overlapping,
# by 16 features where the host has AVX-512 VBMI, then by 4: 102 features as 96, 4 and 2 a
# byte at a time), of 6 (a byte at a time only).
CASES = [
    (1, 16, 10, 10, 20, None),
    (2, 24, 9, 13, 16, (-20, 127)),
    (1, 32, 28, 28, 64, None),
    (1, 512, 7, 7, 102, (-20, 127)),
    (2, 512, 5, 5, 64, (-30, 40)),
    (1, 16, 2, 3, 40, None),
]


def residual_case(rng, n, c, h, w, m, bounds, dtype="i8"):
    """A pointwise QuantizedConv with a residual %r: its text, inputs, and the results the
    formula gives (f32 steps for i8, f64 for i16) and the exact ones (float64)."""
    info = np.iinfo(np.int8 if dtype == "i8" else np.int16)
    npt = np.int8 if dtype == "i8" else np.int16
    (xs, xo), (rs, ro), (ys, yo) = X_Q, R_Q, Y_Q
    x = rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(npt)
    r = rng.integers(info.min, info.max + 1, (n, m, h, w)).astype(npt)
    top = 127 if dtype == "i8" else 3000
    wt = rng.integers(-top, top + 1, (m, c, 1, 1)).astype(npt)
    ws = (rng.random(m) * 0.01 + 0.001).astype(np.float32)
    acc_t = "i32" if dtype == "i8" else "i64"
    bias = rng.integers(-5000, 5000, m).astype(np.int32 if dtype == "i8" else np.int64)
    if dtype == "i16":
        ws = ws / 256
        ys = ys / 256
    bound_attrs = "" if bounds is None else f", low = {bounds[0]}, high = {bounds[1]}"
    dims = _shape((n, m, h, w))
    text = f"""graph test {{
  input %x: {dtype}{_shape(x.shape)} q({xs}, {xo})
  input %r: {dtype}{dims} q({rs}, {ro})
  const %w: {dtype}{_shape(wt.shape)} = {_dense(wt)}
  const %ws: f32[{m}] = {_dense(ws)}
  const %b: {acc_t}[{m}] = {_dense(bias)}
  %y = QuantizedConv(%x, %w, %ws, %b, %r) {{strides = [1, 1], pads = [0, 0, 0, 0], dilations = [1, 1], group = 1, scale = {ys}, offset = {yo}, r_scale = {rs}, r_offset = {ro}{bound_attrs}}} : {dtype}{dims} q({ys}, {yo})
  output "y" = %y
}}"""
    acc = ref_conv(x.astype(np.int64), xo, wt.astype(np.int64), bias.astype(np.int64), (1, 1), (0, 0, 0, 0), (1, 1))
    low, high = bounds if bounds is not None else (info.min, info.max)
    shifted = r.astype(np.int64) - ro
    if dtype == "i8":
        # Two fused multiply-adds in f32, each rounded once: fma(r, ratio, fma(sums, mult,
        # -r_offset * ratio)), computed exactly in rationals and rounded here.
        mult = np.broadcast_to(multipliers(xs, ws, ys).reshape(1, m, 1, 1), acc.shape)
        ratio = np.float32(np.float64(rs) / np.float64(ys))     # the attributes r_scale / scale, in f64
        scaled = _fma(acc.astype(np.float32), mult, np.float32(-ro) * ratio)
        v = _fma(r.astype(np.float32), ratio, scaled)
    else:
        mult = (np.float64(np.float32(xs)) * ws.astype(np.float64) / np.float64(np.float32(ys))).reshape(1, m, 1, 1)
        v = acc.astype(np.float64) * mult + shifted.astype(np.float64) * (np.float64(np.float32(rs)) / np.float64(np.float32(ys)))
    formula = np.clip(np.minimum(np.maximum(np.clip(np.round(v) + yo, info.min, info.max), low), high),
                      info.min, info.max).astype(npt)
    real = (acc * np.float64(np.float32(xs)) * ws.astype(np.float64).reshape(1, m, 1, 1)
            + shifted * np.float64(np.float32(rs)))
    exact = np.clip(np.minimum(np.maximum(np.rint(real / np.float64(np.float32(ys))) + yo, low), high),
                    info.min, info.max)
    return text, {"x": x, "r": r}, formula, exact


def _nearest_f32(x: Fraction) -> np.float32:
    """The rational x rounded to the nearest f32, halves to even."""
    near = np.float32(float(x))
    around = [near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))]
    return min(around, key=lambda v: (abs(Fraction(float(v)) - x), int(v.view(np.uint32)) & 1))


def _fma(a, b, c) -> np.ndarray:
    """a * b + c (f32 arrays that broadcast) exactly, rounded once to f32."""
    a, b, c = np.broadcast_arrays(np.float32(a), np.float32(b), np.float32(c))
    out = [_nearest_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
           for x, y, z in zip(a.ravel(), b.ravel(), c.ravel())]
    return np.array(out, np.float32).reshape(a.shape)


@lru_cache(maxsize=None)
def _case(index: int):
    return residual_case(np.random.default_rng(40 + index), *CASES[index])


def _run(text, feeds, cpu, threads):
    model, _ = _compile(text, cpu, threads)
    [kind] = [i.kind for s in model.program.plan.steps for i in s.instrs if i.kind == "QuantizedConv"]
    return np.asarray(model.run(feeds)["y"])


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_residual_joins_the_sums_before_the_rounding(case, threads, cpu):
    text, feeds, formula, exact = _case(case)
    y = _run(text, feeds, cpu, threads)
    np.testing.assert_array_equal(y, formula)
    assert np.abs(y.astype(np.int64) - exact).max() <= 1


@pytest.mark.parametrize("threads", [1, 2])
def test_int16_residual_in_the_plain_loops(threads):
    rng = np.random.default_rng(7)
    text, feeds, formula, exact = residual_case(rng, 1, 12, 6, 7, 10, (-500, 30000), dtype="i16")
    y = _run(text, feeds, None, threads)
    np.testing.assert_array_equal(y, formula)
    assert np.abs(y.astype(np.int64) - exact).max() <= 1


def test_cases_take_both_layouts_of_the_host_product():
    """The cases above reach both kinds of int8 product on a 512-bit VNNI host: pixels in the
    lanes and features in the lanes (else the features-in-lanes store goes untested)."""
    if "avx512_vnni" not in _FLAGS:
        pytest.skip("the cases are chosen for a 512-bit VNNI host's tiles")
    qs = QShape("vnni")
    kinds = set()
    for n, c, h, w, m, _ in CASES:
        text, _, _, _ = residual_case(np.random.default_rng(0), n, c, h, w, m, None)
        model, _ = _compile(text, None, 1)
        [ins] = [i for s in model.program.plan.steps for i in s.instrs if i.kind == "QuantizedConv"]
        kinds.add(qlanes.in_lanes(Geometry(ins.node, qs), qs))
    assert kinds == {True, False}


def test_residual_of_another_shape_or_quantization_is_refused():
    rng = np.random.default_rng(1)
    text, _, _, _ = residual_case(rng, 1, 8, 4, 4, 8, None)
    with pytest.raises(GlowgenError, match="residual must have the result's shape"):
        _compile(text.replace("input %r: i8[1, 8, 4, 4]", "input %r: i8[1, 8, 4, 5]"), None, 1)
    with pytest.raises(GlowgenError, match="residual must be quantized with r_scale and r_offset"):
        _compile(text.replace("r_offset = -7", "r_offset = -6"), None, 1)


def test_a_qdq_model_keeps_its_rounding_of_the_product():
    """In a QDQ model the product's result has a QuantizeLinear of the model's own: the sum
    after it stays a QuantizedAdd of the rounded product (as onnxruntime computes it, within
    a step), where a profile's calibration folds it into the product."""
    import glowgen
    from onnx import TensorProto, helper, numpy_helper
    from conftest import run_ort
    rng = np.random.default_rng(5)
    c, m, hw = 16, 24, 6
    w = rng.integers(-127, 128, (m, c, 1, 1)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.float32(0.01), "ws"),
             numpy_helper.from_array(np.float32(0.02), "xs"), numpy_helper.from_array(np.uint8(128), "xz"),
             numpy_helper.from_array(np.float32(0.05), "cs"), numpy_helper.from_array(np.uint8(120), "cz"),
             numpy_helper.from_array(np.float32(0.03), "rs"), numpy_helper.from_array(np.uint8(130), "rz"),
             numpy_helper.from_array(np.float32(0.07), "ys"), numpy_helper.from_array(np.uint8(128), "yz"),
             numpy_helper.from_array(np.int8(0), "wz")]
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]), node("Conv", ["xd", "wd"], ["c"]),
             node("QuantizeLinear", ["c", "cs", "cz"], ["cq"]), node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"]),
             node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]), node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"]),
             node("Add", ["cd", "rd"], ["s"]),
             node("QuantizeLinear", ["s", "ys", "yz"], ["sq"]), node("DequantizeLinear", ["sq", "ys", "yz"], ["y"])]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "qdq", [vi("x", TensorProto.FLOAT, [1, c, hw, hw]),
                                             vi("r", TensorProto.FLOAT, [1, m, hw, hw])],
                              [vi("y", TensorProto.FLOAT, [1, m, hw, hw])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.uniform(-2, 2, (1, c, hw, hw)).astype(np.float32),
             "r": rng.uniform(-3, 3, (1, m, hw, hw)).astype(np.float32)}
    q = glowgen.compile(model)
    ops = [n.OP for n in q.function.nodes]
    assert "QuantizedAdd" in ops and "QuantizedConv" in ops, ops
    assert all(n.inputs[4] is None for n in q.function.nodes if n.OP == "QuantizedConv")
    got, expected = q.run(feeds)["y"], run_ort(model, feeds)["y"]
    assert np.abs(got - expected).max() <= 0.07 * 1.001


def test_the_sums_and_the_residual_round_as_two_fused_multiply_adds():
    """Values next to a half, where rounding the product and the residual's term apart moves
    the result by a step: the kernels give the fused multiply-adds' rounding
    (reference.primitives.join_residual), not that one.  Each filter's sums are its bias
    (x at its offset), chosen with small multipliers so that some residual values land
    there; the pixels carry those values."""
    (xs, _), (rs, ro), (ys, yo) = X_Q, R_Q, Y_Q
    ratio = np.float32(np.float64(rs) / np.float64(ys))     # the attributes r_scale / scale, in f64
    const = np.float32(-ro) * ratio
    rng = np.random.default_rng(11)
    filters, pixels = 12, 6
    ws = (rng.random(filters) * 4e-4 + 1e-4).astype(np.float32)
    mults = multipliers(xs, ws, ys)
    r_grid = np.arange(-128, 128, dtype=np.int64)[None, :]
    bias, res = np.zeros(filters, np.int32), rng.integers(-128, 128, (1, filters, 1, pixels)).astype(np.int8)
    found = []
    for m, mult in enumerate(mults):
        start = int(rng.uniform(-60, 60) / mult)
        acc = np.arange(start, start + 4000, dtype=np.int64)[:, None]
        apart = np.round(acc.astype(np.float32) * mult + (r_grid - ro).astype(np.float32) * ratio)
        near = np.round(acc * np.float64(mult) + np.float64(const) + r_grid * np.float64(ratio))
        best = []
        for a in np.unique(np.nonzero(apart != near)[0])[:40]:
            hits = [int(r_grid[0, j]) for j in np.nonzero(apart[a] != near[a])[0]
                    if np.round(_fma(np.float32(r_grid[0, j]), ratio, _fma(np.float32(acc[a, 0]), mult, const)))
                    != apart[a, j]]
            if len(hits) > len(best):
                best, bias[m] = hits, int(acc[a, 0])
        for k, rv in enumerate(best[:pixels]):
            res[0, m, 0, k] = rv
            found.append((m, k))
    assert len(found) >= filters // 2, found            # places where the two roundings differ
    text = f"""graph test {{
  input %x: i8[1, 1, 1, {pixels}] q({xs}, 0)
  input %r: i8[1, {filters}, 1, {pixels}] q({rs}, {ro})
  const %w: i8[{filters}, 1, 1, 1] = {_dense(np.ones((filters, 1, 1, 1), np.int8))}
  const %ws: f32[{filters}] = {_dense(ws)}
  const %b: i32[{filters}] = {_dense(bias)}
  %y = QuantizedConv(%x, %w, %ws, %b, %r) {{scale = {ys}, offset = {yo}, r_scale = {rs}, r_offset = {ro}}} : i8[1, {filters}, 1, {pixels}] q({ys}, {yo})
  output "y" = %y
}}"""
    x = np.zeros((1, 1, 1, pixels), np.int8)
    want = np.round(_fma(res.astype(np.float32), ratio, _fma(bias.astype(np.float32).reshape(1, filters, 1, 1),
                                                             mults.reshape(1, filters, 1, 1), const))) + yo
    for cpu in CPUS:
        y = _run(text, {"x": x, "r": res}, cpu, 1)
        np.testing.assert_array_equal(y, np.clip(want, -128, 127).astype(np.int8), err_msg=str(cpu))
