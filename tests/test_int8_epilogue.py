"""A residual's QuantizedAdd fused into the store of the int8 convolution before it
(epilogue.py, qlinalg.q_product_space): with 512-bit products, a 1x1 convolution storing
its runs of pixels straight into its output hands each run to the sum, which reads the
residual there and writes the requantized sum; the convolution's own result never reaches
memory unless something else reads it.  Held to the exact sum of the exact convolution
(float64), within a step, and to the same code with the fusion off, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from glowgen.backends.cpu import epilogue
from test_int8_kernels import _compile, _dense, _shape, multipliers, ref_conv, requantize

from conftest import HOST_AND_AVX2

_AVX512BW = "avx512bw" in open("/proc/cpuinfo").read()
# The host's int8 path, AVX2's, and AVX-512BW's without VNNI (x86-64-v4) where it runs.
CPUS = HOST_AND_AVX2 + (["x86-64-v4"] if _AVX512BW else [])
R_Q, Y_Q = (0.031, -7), (0.047, -20)


def residual_case(rng, n, c, h, w, m, conv_out: bool, relu: bool, k: int = 1):
    """A QuantizedConv (1x1, or k x k padded to keep the image's size) whose result meets a
    residual input %r in a QuantizedAdd (and, with `conv_out`, is an output of its own
    too); its inputs and the exact results."""
    p = k // 2
    xs, xo, cs, co = 0.02, int(rng.integers(-20, 20)), 0.05, int(rng.integers(-10, 10))
    (rs, ro), (ys, yo) = R_Q, Y_Q
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    r = rng.integers(-128, 128, (n, m, h, w)).astype(np.int8)
    wt = rng.integers(-127, 128, (m, c, k, k)).astype(np.int8)
    ws = (rng.random(m) * 0.01 + 0.001).astype(np.float32)
    b = rng.integers(-5000, 5000, m).astype(np.int32)
    low = f", low = {yo}" if relu else ""
    dims = _shape((n, m, h, w))
    text = f"""graph test {{
  input %x: i8{_shape(x.shape)} q({xs}, {xo})
  input %r: i8{dims} q({rs}, {ro})
  const %w: i8{_shape(wt.shape)} = {_dense(wt)}
  const %ws: f32[{m}] = {_dense(ws)}
  const %b: i32[{m}] = {_dense(b)}
  %c = QuantizedConv(%x, %w, %ws, %b) {{strides = [1, 1], pads = [{p}, {p}, {p}, {p}], dilations = [1, 1], group = 1, scale = {cs}, offset = {co}}} : i8{dims} q({cs}, {co})
  %y = QuantizedAdd(%c, %r) {{a_scale = {cs}, a_offset = {co}, b_scale = {rs}, b_offset = {ro}, scale = {ys}, offset = {yo}{low}}} : i8{dims} q({ys}, {yo})
  output "y" = %y
{'  output "c" = %c' if conv_out else ''}
}}"""
    acc = ref_conv(x.astype(np.int64), xo, wt, b.astype(np.int64), (1, 1), (p, p, p, p), (1, 1))
    conv = requantize(acc, multipliers(xs, ws, cs).reshape(1, m, 1, 1), co)
    v = (conv.astype(np.float64) - co) * cs + (r.astype(np.float64) - ro) * rs
    q = np.rint(v / ys) + yo
    y = np.clip(np.maximum(q, yo) if relu else q, -128, 127)
    return text, {"x": x, "r": r}, conv, y


# n, c, h, w, m, conv_out, relu, k: 100 pixels (a last run of 4 of 32 lanes), 20 filters
# (the last block of 8 rows half padding), the convolution's result also an output, two
# images; 3x3 convolutions whose plane rows carry two columns past the output's, which with
# AVX-512 VBMI2 store their runs compressed (qlinalg.store_compressed): rows of 40 pixels
# (runs across two rows), of 7 (across five), of 31 (the second run starting on a dropped
# column).
CASES = [
    (1, 16, 10, 10, 20, False, True, 1),
    (1, 24, 9, 13, 16, True, False, 1),
    (2, 8, 12, 12, 24, False, False, 1),
    (1, 16, 11, 40, 20, False, True, 3),
    (2, 8, 9, 7, 16, True, False, 3),
    (1, 32, 30, 31, 8, False, False, 3),
]
_VBMI2 = "avx512_vbmi2" in open("/proc/cpuinfo").read()


def _fused(model) -> bool:
    return any(s.epilogue is not None and [i.kind for i in s.instrs] == ["QuantizedConv", "QuantizedAdd"]
               for s in model.program.plan.steps)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_residual_sum_in_the_convolutions_store(case, threads, cpu, monkeypatch):
    n, c, h, w, m, conv_out, relu, k = CASES[case]
    text, feeds, conv, want = residual_case(np.random.default_rng(case), n, c, h, w, m, conv_out, relu, k)
    model, _ = _compile(text, cpu, threads)
    # Fused with AVX-512BW's 512-bit products only (qlinalg.q_product_space), padded ones
    # with VBMI2's compress (not x86-64-v4's).
    if k == 1:
        assert _fused(model) == (_AVX512BW and cpu != "x86-64-v3")
    else:
        assert _fused(model) == (_VBMI2 and cpu is None)
    got = model.run(feeds)
    assert np.abs(got["y"].astype(np.int64) - want).max() <= 1
    assert (got["y"] == want).mean() > 0.99
    if conv_out:
        np.testing.assert_array_equal(got["c"], conv)
    monkeypatch.setattr(epilogue, "PRODUCT_TYPES", ("f32",))
    apart, _ = _compile(text, cpu, threads)
    assert not _fused(apart)
    for name, value in apart.run(feeds).items():
        np.testing.assert_array_equal(got[name], value)
