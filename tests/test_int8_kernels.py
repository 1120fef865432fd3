"""The cpu backend's int8 kernels for QuantizedConv and QuantizedMatMul (kernels/qlinalg.py)
against an exact NumPy reference of their semantics: sums of (x - x_offset) * w in int64,
plus the i32 bias, requantized in f32 as the kernels do (the accumulator and the per-channel
multiplier x_scale * w_scale[m] / scale as f32, rounded halves to even, plus the offset,
saturated).  Both x86 paths: AVX-512 VNNI where the host has it, and AVX2 (`cpu=x86-64-v3`)
with exact 16-bit products; one and two threads must agree bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from glowgen import pipeline
from glowgen.api import CompiledModel
from glowgen.backends.cpu import amx
from glowgen.backends.cpu.amx import without
from glowgen.backends.cpu.kernels import qlanes
from glowgen.backends.cpu.kernels.qlinalg import Geometry
from glowgen.backends.cpu.kernels.qplanes import interleaves_rows
from glowgen.backends.cpu.qgemm import QSHAPES, QShape
from glowgen.backends.cpu.target import level_features
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function

from conftest import HOST_AND_AVX2

CPUS = HOST_AND_AVX2
# The host's own int8 path, AVX2's, and AVX-512BW's without VNNI (x86-64-v4) where it runs.
_AVX512BW = "avx512bw" in open("/proc/cpuinfo").read()
RUNNABLE_CPUS = CPUS + (["x86-64-v4"] if _AVX512BW else [])
THREADS = [1, 2]


def _dense(a) -> str:
    return "dense<[" + ", ".join(repr(float(v)) if a.dtype.kind == "f" else str(int(v))
                                 for v in a.ravel()) + "]>"


def _shape(s) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def requantize(acc, mult, offset, bounds=(-128, 127)):
    """The requantization the kernels compute: f32(acc) * f32(mult), halves to even,
    + offset, saturated to i8 and then to the product's bounds (low, high) (acc: int64 sums
    with the bias; mult broadcast along it)."""
    v = np.round(acc.astype(np.float32) * mult.astype(np.float32))
    v = np.clip(v + np.float32(offset), -128, 127)
    return np.minimum(np.maximum(v, bounds[0]), bounds[1]).astype(np.int8)


def _bounds_attrs(bounds) -> str:
    return "" if bounds is None else f", low = {bounds[0]}, high = {bounds[1]}"


def multipliers(x_scale, ws, y_scale):
    """x_scale * ws / y_scale in f64, rounded to f32; x_scale as x's quantized type holds it
    (an f32: 0.02 is 0.0199999995, which moves a product such as 29313 * mult off a tie)."""
    return (np.float64(np.float32(x_scale)) * ws.astype(np.float64) / np.float64(y_scale)).astype(np.float32)


def ref_conv(x, xo, w, b, strides, pads, dilations, group=1):
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.full((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), xo, np.int64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    acc = np.zeros((n, m, oh, ow), np.int64)
    xs = xp - xo
    for i in range(kh):
        for j in range(kw):
            patch = xs[:, :, i * dilations[0]:i * dilations[0] + strides[0] * (oh - 1) + 1:strides[0],
                       j * dilations[1]:j * dilations[1] + strides[1] * (ow - 1) + 1:strides[1]]
            for gi in range(group):
                mg = m // group
                acc[:, gi * mg:(gi + 1) * mg] += np.einsum(
                    "nchw,mc->nmhw", patch[:, gi * cg:(gi + 1) * cg], w[gi * mg:(gi + 1) * mg, :, i, j].astype(np.int64))
    return acc + b.reshape(1, m, 1, 1)


def _compile(text, cpu, threads, winograd=False, amx=False):
    """The graph compiled for `cpu` at `threads`; off Winograd and AMX tiles by default (the
    VNNI and AVX2 products these tests hold to the reference: test_int8_winograd.py and the
    AMX tests below have their own)."""
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "cpu")
    ops = {n.OP for n in fn.nodes}
    return CompiledModel(fn, registry, "cpu", threads=threads, cpu=cpu, winograd=winograd, amx=amx), ops


def _draw(rng, values, shape, low, high):
    """int8 values: drawn from `values` when given, else uniform in [low, high]."""
    if values is None:
        return rng.integers(low, high + 1, shape).astype(np.int8)
    return rng.choice(np.asarray(values, np.int8), shape)


def conv_case(rng, n, c, h, w_, m, k, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, ys=0.05,
              bounds=None, w_values=None, x_values=None):
    """A QuantizedConv graph, its input and the exact result; weights and inputs uniform
    over i8 (weights from -127), or drawn from `w_values` / `x_values`."""
    xs, xo, yo = 0.02, int(rng.integers(-20, 20)), int(rng.integers(-10, 10))
    x = _draw(rng, x_values, (n, c, h, w_), -128, 127)
    w = _draw(rng, w_values, (m, c // group, k, k), -127, 127)
    ws = (rng.random(m) * 0.01 + 0.001).astype(np.float32)
    b = rng.integers(-5000, 5000, m).astype(np.int32)
    oh = (h + pads[0] + pads[2] - dilations[0] * (k - 1) - 1) // strides[0] + 1
    ow = (w_ + pads[1] + pads[3] - dilations[1] * (k - 1) - 1) // strides[1] + 1
    text = f"""graph test {{
  input %x: i8{_shape(x.shape)} q({xs}, {xo})
  const %w: i8{_shape(w.shape)} = {_dense(w)}
  const %ws: f32[{m}] = {_dense(ws)}
  const %b: i32[{m}] = {_dense(b)}
  %y = QuantizedConv(%x, %w, %ws, %b) {{strides = {list(strides)}, pads = {list(pads)}, dilations = {list(dilations)}, group = {group}, scale = {ys}, offset = {yo}{_bounds_attrs(bounds)}}} : i8[{n}, {m}, {oh}, {ow}] q({ys}, {yo})
  output "y" = %y
}}"""
    acc = ref_conv(x.astype(np.int64), xo, w, b.astype(np.int64), strides, pads, dilations, group)
    want = requantize(acc, multipliers(xs, ws, ys).reshape(1, m, 1, 1), yo, bounds or (-128, 127))
    return text, {"x": x}, want


def matmul_case(rng, batch, k, n, bounds=None, w_values=None, x_values=None):
    xs, xo, ys, yo = 0.03, int(rng.integers(-20, 20)), 0.2, int(rng.integers(-10, 10))
    x = _draw(rng, x_values, tuple(batch) + (k,), -128, 127)
    w = _draw(rng, w_values, (k, n), -127, 127)
    ws = (rng.random(n) * 0.01 + 0.001).astype(np.float32)
    b = rng.integers(-5000, 5000, n).astype(np.int32)
    text = f"""graph test {{
  input %x: i8{_shape(x.shape)} q({xs}, {xo})
  const %w: i8{_shape(w.shape)} = {_dense(w)}
  const %ws: f32[{n}] = {_dense(ws)}
  const %b: i32[{n}] = {_dense(b)}
  %y = QuantizedMatMul(%x, %w, %ws, %b) {{scale = {ys}, offset = {yo}{_bounds_attrs(bounds)}}} : i8{_shape(tuple(batch) + (n,))} q({ys}, {yo})
  output "y" = %y
}}"""
    acc = (x.astype(np.int64) - xo) @ w.astype(np.int64) + b
    want = requantize(acc, multipliers(xs, ws, ys), yo, bounds or (-128, 127))
    return text, {"x": x}, want


CONV_CASES = [
    # n, c, h, w, m, k, strides, pads, dilations
    (1, 3, 9, 11, 5, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (2, 8, 8, 8, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 7, 13, 10, 9, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 16, 12, 12, 24, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    (2, 6, 11, 11, 13, 1, (2, 2), (0, 0, 0, 0), (1, 1)),
    (1, 3, 20, 18, 10, 7, (2, 2), (3, 3, 3, 3), (1, 1)),
    (1, 5, 10, 10, 7, 3, (1, 1), (2, 0, 1, 2), (2, 2)),
    (1, 33, 7, 7, 70, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    # Small images (with VNNI) and single pixels: features in the lanes, pixels broadcast
    # (qlanes.py); IN_LANES says which cases do.
    (1, 64, 7, 7, 64, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (2, 520, 7, 7, 64, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 64, 13, 14, 64, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (2, 40, 2, 2, 24, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    (1, 600, 9, 9, 130, 1, (2, 2), (0, 0, 0, 0), (1, 1)),      # 130 features: 2 past a multiple of 4
    # A window narrower than the stride: the plane holds the phases it reads (rows 0, 2 of
    # 4; columns 0, 2, 3 of 4).
    (1, 5, 17, 19, 6, 3, (4, 4), (1, 1, 1, 1), (2, 3)),
    (1, 512, 7, 7, 256, 1, (1, 1), (0, 0, 0, 0), (1, 1)),      # split among 2 threads
    (2, 32, 20, 20, 40, 3, (1, 1), (1, 1, 1, 1), (1, 1)),      # split among 2 threads
]
SPLIT_CONV = {len(CONV_CASES) - 2, len(CONV_CASES) - 1}
IN_LANES = {"vnni": {8, 9, 10, 11, 12, 14}, "madd16": {11}}


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_quantized_conv_native(case, cpu):
    n, c, h, w, m, k, s, p, d = CONV_CASES[case]
    text, feeds, want = conv_case(np.random.default_rng(case), n, c, h, w, m, k, s, p, d)
    results = []
    for threads in THREADS:
        model, ops = _compile(text, cpu, threads)
        assert "QuantizedConv" in ops and "Conv" not in ops, ops      # native, not in float
        strategy = [str(i.plan) for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        assert ("madd16" if cpu else "") in strategy and "loops" not in strategy, strategy
        if threads == 2 and case in SPLIT_CONV:
            assert max(s.parts for s in model.program.plan.steps) == 2
        ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        qs = QShape(ins.plan.strategy)
        assert qlanes.in_lanes(Geometry(ins.node, qs), qs) == (case in IN_LANES["vnni" if qs.kind == "vnni" else "madd16"])
        got = model.run(feeds)["y"]
        np.testing.assert_array_equal(got, want)
        results.append(got)
    assert all(np.array_equal(results[0], r) for r in results)


# Up to a tile's broadcast rows (6 for AVX2, 8 for VNNI), the product has its features in
# the lanes (qlanes.py): ragged feature counts, K not a multiple of the group, a split.
@pytest.mark.parametrize("cpu", CPUS)
def test_requantization_out_of_i32_range(cpu):
    """A result scale so small that the requantized sums leave the i32 range: the store
    requantizes in f32 and saturates (the i32 requantization's precondition does not hold)."""
    from glowgen.backends.cpu.kernels.qlinalg import PACKED_IN_RANGE
    text, feeds, want = conv_case(np.random.default_rng(7), 1, 16, 12, 12, 24, 1, ys=1e-9)
    assert np.any(want == 127) and np.any(want == -128)
    for threads in THREADS:
        model, _ = _compile(text, cpu, threads)
        ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        assert ins.plan.packed == "a"
        np.testing.assert_array_equal(model.run(feeds)["y"], want)
    text, feeds, want = conv_case(np.random.default_rng(7), 1, 16, 12, 12, 24, 1)
    model, _ = _compile(text, cpu, 1)
    assert [i for i in model.program.instrs if i.kind == "QuantizedConv"][0].plan.packed == PACKED_IN_RANGE
    np.testing.assert_array_equal(model.run(feeds)["y"], want)


# VNNI's tiles of one-tap products in the lanes broadcast up to 14 rows a block
# (qlanes.LANES_ROWS), products of several taps 10: 49 pixels in 13, 13, 13 and 10 (as
# few rows and blocks as 14, 14, 14 and 7, the last block larger; or four blocks of 10 and
# one of 9), 196 in 14 blocks of 14, 81 in 5 of 14 and one of 11.  The sums are exact where
# the host has VNNI.
ROW_BLOCKS = [((1, 520, 7, 7, 64, 1), (13, 10)),
              ((1, 1024, 14, 14, 64, 1), (14, 14)),
              ((2, 600, 9, 9, 96, 1), (14, 11)),
              ((1, 64, 7, 7, 64, 3, (1, 1), (1, 1, 1, 1)), (10, 9))]


@pytest.mark.parametrize("case", range(len(ROW_BLOCKS)))
def test_vnni_lanes_blocks_of_rows(case):
    args, blocks = ROW_BLOCKS[case]
    text, feeds, want = conv_case(np.random.default_rng(600 + case), *args)
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "cpu")
    node = [n for n in fn.nodes if n.OP == "QuantizedConv"][0]
    qs = QShape("vnni")
    geo = Geometry(node, qs)
    lanes = qlanes.Lanes(geo, qs)
    assert qlanes.in_lanes(geo, qs) and (lanes.mr, lanes.tail_rows) == blocks
    if "avx512_vnni" not in open("/proc/cpuinfo").read():
        return                                  # (no VNNI to run them on)
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, None, threads)
        assert [i.plan.strategy for i in model.program.instrs if i.kind == "QuantizedConv"] == ["vnni"]
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want, err_msg=f"{threads} threads")


MATMUL_CASES = [((1,), 512, 100), ((3,), 5, 7), ((2, 5), 37, 33), ((17,), 64, 16), ((1,), 3, 1),
                ((2, 3), 71, 50), ((1, 1), 1000, 33), ((64,), 130, 257), ((16,), 256, 512),
                ((1,), 1280, 1000)]     # a classifier: one row, its weights shared out by tiles
SPLIT_MATMUL = {len(MATMUL_CASES) - 3, len(MATMUL_CASES) - 2, len(MATMUL_CASES) - 1}


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(MATMUL_CASES)))
def test_quantized_matmul_native(case, cpu):
    batch, k, n = MATMUL_CASES[case]
    text, feeds, want = matmul_case(np.random.default_rng(100 + case), batch, k, n)
    for threads in THREADS:
        model, ops = _compile(text, cpu, threads)
        assert "QuantizedMatMul" in ops and "MatMul" not in ops and "BatchMatMul" not in ops, ops
        if threads == 2 and case in SPLIT_MATMUL:
            assert max(s.parts for s in model.program.plan.steps) == 2
        np.testing.assert_array_equal(model.run(feeds)["y"], want)



# Products whose blocks of filters (features' tiles, in the lanes) do not share out evenly
# among 2 tasks: split by panels of pixels (blocks of rows) instead (parallel.splits_blocks),
# each task writing its own columns of the result.
UNEVEN = [("conv", (1, 144, 56, 56, 24, 1)),                           # 3 blocks, stored direct
          ("conv", (1, 32, 27, 27, 24, 3, (1, 1), (1, 1, 1, 1))),      # 3 blocks, via the result block
          ("conv", (1, 576, 14, 14, 96, 1)),                           # 3 tiles in the lanes (VNNI)
          ("matmul", ((512,), 256, 24))]                               # 3 blocks of a matrix product


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(UNEVEN)))
def test_uneven_blocks_split_by_pixels(case, cpu):
    kind, args = UNEVEN[case]
    text, feeds, want = (conv_case if kind == "conv" else matmul_case)(np.random.default_rng(300 + case), *args)
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        if threads > 1:
            assert max(s.parts for s in model.program.plan.steps) == threads
        np.testing.assert_array_equal(model.run(feeds)["y"], want, err_msg=f"{cpu} {threads} threads")

# 1x1 convolutions at stride 1 whose plane interleaves whole channel rows
# (qplanes.interleave_channels): pixels in steps of 64 (32 with AVX-512 VBMI), of 16, and
# one at a time.
INTERLEAVED = [(1, 24, 13, 11, 40, 1),      # 143 pixels: 2 x 64 + 15 single (VBMI: 4 x 32 + 15)
               (1, 16, 20, 20, 96, 1),      # 400: 6 x 64 + 16 (12 x 32 + 16)
               (1, 64, 7, 7, 72, 1),        # 49: 3 x 16 + 1 (32 + 16 + 1; features in the lanes with VNNI)
               (1, 40, 16, 16, 8, 1),       # 256: 4 x 64
               (1, 64, 30, 30, 64, 1)]      # 900: 14 x 64 + 4; split, its plane built in shares
SPLIT_INTERLEAVED = {len(INTERLEAVED) - 1}


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(INTERLEAVED)))
def test_plane_of_interleaved_rows(case, cpu):
    text, feeds, want = conv_case(np.random.default_rng(400 + case), *INTERLEAVED[case], bounds=(-30, 100))
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        assert interleaves_rows(Geometry(ins.node, QShape(ins.plan.strategy)))
        if case in SPLIT_INTERLEAVED:
            assert max(s.parts for s in model.program.plan.steps) == threads
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want, err_msg=f"{cpu} {threads} threads")
    assert all(r.tobytes() == results[0].tobytes() for r in results)


# Padded and strided planes built a row at a time in masked 16-element steps with AVX-512BW
# (qplanes.build_plane_rows; x86-64-v3 builds them element by element): rows narrower than
# a step, of one step, of whole and of ragged steps; the input's columns all inside, all
# past either edge, and taps dealt by stride 2 into two column phases; pads up to 3 either
# side, asymmetric, dilated; two groups; the last two split (each task the whole small plane,
# and its own pixels' rows; test_int8_phases has a plane built in shares).
PLANE_ROWS = [
    # n, c, h, w, m, k, strides, pads, dilations, group
    (1, 8, 5, 5, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),        # rows of 7: a masked store
    (1, 4, 14, 14, 8, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),       # rows of 16: one step
    (2, 12, 9, 21, 10, 3, (1, 1), (0, 3, 2, 1), (1, 1), 1),      # 25: two steps, overlapping
    (1, 8, 6, 40, 8, 5, (2, 1), (2, 2, 2, 2), (1, 2), 1),        # 48: three whole steps
    (1, 8, 28, 28, 16, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),      # stride 2: two phases of 15
    (1, 16, 11, 45, 12, 3, (2, 2), (0, 2, 1, 0), (1, 1), 2),     # 24 a phase, two groups
    (1, 8, 9, 9, 8, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1),         # 1x1 at stride 2: one phase
    (1, 64, 28, 28, 128, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1),    # split by filters: each task all
    (1, 32, 40, 40, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),     # split: each task its rows
]


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(PLANE_ROWS)))
def test_plane_rows_in_vectors(case, cpu):
    n, c, h, w, m, k, s, p, d, group = PLANE_ROWS[case]
    text, feeds, want = conv_case(np.random.default_rng(500 + case), n, c, h, w, m, k, s, p, d, group,
                                  bounds=(-40, 110))
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        ins = [i for i in model.program.instrs if i.kind == "QuantizedConv"][0]
        geo = Geometry(ins.node, QShape(ins.plan.strategy))
        assert not geo.im2col and not interleaves_rows(geo)
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want, err_msg=f"{cpu} {threads} threads")
    assert all(r.tobytes() == results[0].tobytes() for r in results)


DEPTHWISE_CASES = [
    # n, c, h, w, m, k, strides, pads, dilations, group (= c = m: one filter per channel)
    (1, 8, 9, 9, 8, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),
    (2, 16, 14, 13, 16, 3, (2, 2), (1, 1, 1, 1), (1, 1), 16),
    (1, 5, 12, 11, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 5),
    (1, 5, 12, 11, 5, 5, (2, 2), (2, 1, 2, 2), (1, 1), 5),
    (1, 4, 10, 10, 4, 3, (1, 2), (0, 0, 0, 0), (2, 1), 4),       # no padding; dilated rows
    (1, 40, 7, 7, 40, 3, (1, 1), (1, 1, 1, 1), (1, 1), 40),
    (1, 3, 20, 21, 3, 7, (2, 1), (3, 3, 3, 3), (1, 4), 3),        # 7x7, dilated columns
    (1, 3, 70, 71, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3),        # rows of several vectors
    (1, 6, 14, 14, 6, 3, (1, 1), (1, 1, 1, 1), (1, 1), 6),         # VNNI: 224 lanes of 32, not 256
    (1, 4, 11, 12, 4, 3, (1, 1), (2, 2, 2, 2), (2, 2), 4),         # dilated at unit strides
    (1, 32, 40, 40, 32, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32),     # split among 2 threads
]
SPLIT_DEPTHWISE = {len(DEPTHWISE_CASES) - 1}


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(DEPTHWISE_CASES)))
def test_quantized_depthwise_conv_native(case, cpu):
    """Depthwise convolutions take the int8 depthwise kernel (qdepthwise.py), exactly, in
    each of its modes (interleaved, expand, shuffle) and int8 paths."""
    text, feeds, want = conv_case(np.random.default_rng(70 + case), *DEPTHWISE_CASES[case])
    results = []
    for threads in THREADS:
        model, ops = _compile(text, cpu, threads)
        assert "QuantizedConv" in ops and "Conv" not in ops, ops
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        kind = {None: "", "x86-64-v3": "-madd16", "x86-64-v4": "-madd16-512"}[cpu]
        assert plan.strategy.startswith("depthwise-") and plan.strategy.endswith(kind), plan
        if threads == 2 and case in SPLIT_DEPTHWISE:
            assert max(s.parts for s in model.program.plan.steps) == 2
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes()


WIDE_STRIDE_DEPTHWISE = [
    # n, c, h, w, m, k, strides, pads, dilations, group: strides past 2, the lanes of a
    # vector within one 64-byte load (3, 4) or in chunks (5 and 8 on VNNI, 11 on AVX2)
    (1, 6, 17, 19, 6, 3, (3, 3), (1, 1, 1, 1), (1, 1), 6),
    (2, 5, 13, 30, 5, 5, (2, 4), (2, 2, 2, 2), (1, 1), 5),
    (1, 4, 16, 90, 4, 3, (5, 5), (0, 1, 2, 1), (1, 2), 4),
    (1, 3, 9, 140, 3, 7, (3, 8), (3, 3, 3, 3), (1, 1), 3),
    (1, 34, 12, 200, 34, 3, (1, 11), (1, 1, 1, 1), (1, 1), 34),     # split among threads
]


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(WIDE_STRIDE_DEPTHWISE)))
def test_quantized_depthwise_conv_any_stride(case, cpu):
    """Depthwise convolutions at strides of 3 and more take the depthwise kernel too (not the
    general grouped product), exactly as the NumPy reference, bit for bit at 1, 2, 3 threads."""
    text, feeds, want = conv_case(np.random.default_rng(90 + case), *WIDE_STRIDE_DEPTHWISE[case])
    results = []
    for threads in (1, 2, 3):
        model, ops = _compile(text, cpu, threads)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert plan.strategy.startswith("depthwise-"), plan
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()


# Saturation bounds (a ReLU's, a folded Rescale's: low, high) in every store: the general
# product (sums in and out of the i32 requantization's range), features in the lanes, the
# depthwise kernel, a matrix product and the plain loops of a target without AVX2.
BOUNDED = [("conv", (2, 8, 8, 8, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1)), {}),
           ("conv", (1, 16, 12, 12, 24, 1), dict(ys=1e-9)),
           ("conv", CONV_CASES[8], {}),
           ("conv", DEPTHWISE_CASES[0], {}),
           ("matmul", ((2, 5), 37, 33), {}),
           ("matmul", ((1,), 512, 100), {})]


@pytest.mark.parametrize("bounds", [(-20, 127), (-5, 40)])
@pytest.mark.parametrize("case", range(len(BOUNDED)))
def test_saturation_bounds(case, bounds):
    """The cpu kernels and the interpreter saturate to the bounds exactly (a max with low,
    then a min with high, as the Max and Min the rules fold into the product)."""
    kind, args, kw = BOUNDED[case]
    make = conv_case if kind == "conv" else matmul_case
    text, feeds, want = make(np.random.default_rng(200 + case), *args, bounds=bounds, **kw)
    assert np.any(want == bounds[0]) and np.any(want == bounds[1])
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "interpreter")
    np.testing.assert_array_equal(CompiledModel(fn, registry, "interpreter").run(feeds)["y"], want)
    for cpu, threads in [(None, 1), (None, 2)] + [(c, 1) for c in RUNNABLE_CPUS[1:] + ["x86-64"]]:
        model, ops = _compile(text, cpu, threads)
        assert ops <= {"QuantizedConv", "QuantizedMatMul"}, ops
        np.testing.assert_array_equal(model.run(feeds)["y"], want, err_msg=f"{cpu} {threads}")


@pytest.mark.parametrize("case", [0, 3, 6])
def test_quantized_depthwise_conv_matches_interpreter(case):
    """The cpu kernel and the interpreter (reference.primitives.quantized_conv) agree bit for
    bit; so do the plain loops of a target without AVX2."""
    text, feeds, want = conv_case(np.random.default_rng(70 + case), *DEPTHWISE_CASES[case])
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "interpreter")
    assert {n.OP for n in fn.nodes} == {"QuantizedConv"}
    reference = CompiledModel(fn, registry, "interpreter").run(feeds)["y"]
    np.testing.assert_array_equal(reference, want)
    for cpu in CPUS + ["x86-64"]:
        model, _ = _compile(text, cpu, 1)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert (plan.strategy == "loops") == (cpu == "x86-64"), (cpu, plan)
        assert model.run(feeds)["y"].tobytes() == reference.tobytes(), cpu


def test_quantized_depthwise_conv_out_of_range_takes_loops():
    """Sums whose requantized values could leave the i32 range (an absurdly small result
    scale) are beyond the depthwise kernel's requantization: the plain loops saturate them."""
    text, feeds, want = conv_case(np.random.default_rng(9), *DEPTHWISE_CASES[0], ys=1e-9)
    model, _ = _compile(text, None, 1)
    (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
    assert plan.strategy == "loops", plan
    got = model.run(feeds)["y"]
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(got)) <= {-128, 127}


GROUPED = [
    # n, c, h, w, m, k, strides, pads, dilations, group
    (2, 4, 7, 8, 6, 3, (2, 2), (1, 0, 1, 1), (1, 1), 2),        # 2 channels, 3 filters a group
    (1, 16, 9, 10, 8, 3, (1, 1), (1, 1, 1, 1), (1, 1), 4),      # 4 channels, 2 filters
    (1, 128, 12, 12, 128, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32),  # ResNeXt's 32 groups of 4
    (2, 64, 11, 13, 64, 3, (3, 3), (1, 1, 1, 1), (1, 1), 8),    # 8 channels, stride 3
    (1, 16, 10, 9, 24, 3, (2, 1), (0, 1, 2, 1), (1, 1), 2),     # 12 filters a group (2 x 6 rows)
    (1, 8, 13, 11, 20, 3, (3, 3), (2, 1, 0, 1), (1, 1), 4),     # 2 channels, 5 filters, stride 3
    (1, 8, 8, 8, 40, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2),       # 20 filters a group (3 blocks of 7)
    (1, 8, 17, 17, 8, 5, (4, 4), (2, 2, 2, 2), (1, 1), 2),      # stride 4, 5x5
    (1, 8, 12, 12, 8, 3, (1, 1), (2, 2, 2, 2), (2, 2), 4),      # dilated
    (1, 24, 10, 10, 36, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),    # 1x1: tiles store into y
    (1, 4, 9, 9, 8, 3, (1, 1), (1, 1, 1, 1), (1, 1), 4),        # one channel, two filters a group
    (1, 4, 16, 15, 4, 3, (3, 3), (5, 5, 5, 5), (5, 5), 4),      # depthwise dilated past 4
    (1, 256, 14, 14, 256, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32),  # split among 2 threads
]
SPLIT_GROUPED = {len(GROUPED) - 1}
# The general product's int8 path by target: AVX2's, AVX-512BW's (and the host's: its own).
KINDS = {"x86-64-v3": "madd16", "x86-64-v4": "madd16-512"}


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("case", range(len(GROUPED)))
def test_quantized_conv_grouped_native(case, cpu):
    """Grouped convolutions other than the depthwise kernel's (several channels or filters a
    group, dilations above 4) run the general int8 product group by group, exactly, at one
    and two threads alike."""
    text, feeds, want = conv_case(np.random.default_rng(50 + case), *GROUPED[case])
    results = []
    for threads in THREADS:
        model, ops = _compile(text, cpu, threads)
        assert ops == {"QuantizedConv"}, ops
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert plan.strategy == KINDS.get(cpu, plan.strategy) and plan.strategy in QSHAPES, plan
        if threads == 2 and case in SPLIT_GROUPED:
            assert max(s.parts for s in model.program.plan.steps) == 2
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes()


@pytest.mark.parametrize("case", [0, 3, 5])
def test_quantized_conv_grouped_matches_interpreter(case):
    """The grouped product and the interpreter (reference.primitives.quantized_conv) agree
    bit for bit; so do the plain loops of a target without AVX2."""
    text, feeds, want = conv_case(np.random.default_rng(50 + case), *GROUPED[case])
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "interpreter")
    assert {n.OP for n in fn.nodes} == {"QuantizedConv"}
    reference = CompiledModel(fn, registry, "interpreter").run(feeds)["y"]
    np.testing.assert_array_equal(reference, want)
    for cpu in CPUS + ["x86-64"]:
        model, _ = _compile(text, cpu, 1)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert (plan.strategy == "loops") == (cpu == "x86-64"), (cpu, plan)
        assert model.run(feeds)["y"].tobytes() == reference.tobytes(), cpu


@pytest.mark.parametrize("make, case", [(conv_case, CONV_CASES[2]), (matmul_case, MATMUL_CASES[2])])
def test_weights_at_run_time_take_loops(make, case):
    """Weights that are not constants (here an input) run the plain loops, exactly."""
    text, feeds, want = make(np.random.default_rng(60), *case)
    line = [ln for ln in text.splitlines() if ln.strip().startswith("const %w:")][0]
    w = np.array([int(v) for v in line.split("dense<[")[1].split("]>")[0].split(",")], np.int8)
    shape = tuple(int(d) for d in line.split("i8[")[1].split("]")[0].split(","))
    text = text.replace(line, "  input %w: i8" + line.split("i8", 1)[1].split(" =")[0])
    feeds = dict(feeds, w=w.reshape(shape))
    model, ops = _compile(text, None, 1)
    kind = "QuantizedConv" if make is conv_case else "QuantizedMatMul"
    assert [str(i.plan) for i in model.program.instrs if i.kind == kind][0] == "strategy loops"
    np.testing.assert_array_equal(model.run(feeds)["y"], want)


@pytest.mark.parametrize("make", [conv_case, matmul_case])
def test_interpreter_reference_matches(make):
    """The interpreter's QuantizedConv / QuantizedMatMul (reference.primitives) compute the
    same semantics exactly."""
    args = CONV_CASES[2] if make is conv_case else MATMUL_CASES[2]
    text, feeds, want = make(np.random.default_rng(3), *args)
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "interpreter")
    got = CompiledModel(fn, registry, "interpreter").run(feeds)["y"]
    np.testing.assert_array_equal(got, want)


def _small_cnn(rng):
    """Conv -> Relu -> Conv stride 2 -> Relu -> Flatten -> MatMul -> Add, batch 2."""
    import onnx  # noqa: F401
    from onnx import helper
    from conftest import make_model
    w1 = (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32) * 0.1
    w2 = (rng.standard_normal((24, 16, 3, 3)) * 0.1).astype(np.float32)
    m = (rng.standard_normal((24 * 5 * 5, 10)) * 0.05).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"])]
    return make_model(nodes, {"x": np.zeros((2, 3, 10, 10), np.float32)}, ["y"],
                      {"w1": w1, "b1": b1, "w2": w2, "m": m, "b": b})


def test_quantized_model_cpu_matches_interpreter():
    """A profile-quantized CNN on cpu (native int8 kernels, 1 and 2 threads, VNNI and AVX2)
    against the interpreter, with the same weights (7 or 8 bits): within one quantization
    step of the output."""
    import glowgen
    rng = np.random.default_rng(11)
    model = _small_cnn(rng)
    samples = [{"x": rng.standard_normal((2, 3, 10, 10)).astype(np.float32)} for _ in range(4)]
    profile = glowgen.profile(model, samples)
    x = {"x": rng.standard_normal((2, 3, 10, 10)).astype(np.float32)}
    for bits in (7, 8):
        ref = glowgen.compile(model, backend="interpreter", quantize=profile, weight_bits=bits)
        want = ref.run(x)["y"]
        step = max(n.in_scale for n in ref.function.nodes if n.OP == "Dequantize")
        for cpu in CPUS:
            for threads in THREADS:
                q = glowgen.compile(model, quantize=profile, threads=threads, cpu=cpu, weight_bits=bits)
                ops = {n.OP for n in q.function.nodes}
                assert {"QuantizedConv", "QuantizedMatMul"} <= ops and "Conv" not in ops, ops
                got = q.run(x)["y"]
                assert np.abs(got - want).max() <= step * 1.001, (bits, cpu, threads, np.abs(got - want).max(), step)


_POOLS = [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
          dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0]),
          dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
          dict(kernel_shape=[3, 2], strides=[1, 1], pads=[2, 1, 1, 1], dilations=[2, 3]),
          dict(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2]),
          dict(kernel_shape=[1, 1], strides=[2, 2]),
          dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
          dict(kernel_shape=[2, 4], strides=[2, 1], pads=[1, 2, 0, 1], dilations=[1, 2])]


@pytest.mark.parametrize("cpu", CPUS + ["x86-64"])
@pytest.mark.parametrize("width", [40, 112, 150])
@pytest.mark.parametrize("attrs", _POOLS)
def test_int8_max_pool_taps(attrs, width, cpu):
    """The 2-D max pool of int8 tensors (quantized models' pooling), by whole rows in byte
    vectors where it can (the last vector of a row overlapping the one before) and separably
    over rows of maxima otherwise, against onnxruntime, split in two; rows of 40, 112 (ResNet's
    pool) and 150 bytes, with 16-, 32- and 64-byte vectors."""
    import glowgen
    import onnxruntime as ort
    from onnx import helper
    from conftest import make_model
    from glowgen.backends.cpu.kernels.pool import by_rows
    x = np.random.default_rng(5).integers(-128, 128, (2, 5, 13, width)).astype(np.int8)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], {"x": x}, ["y"])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for threads in THREADS:
        compiled = glowgen.compile(model, threads=threads, cpu=cpu)
        (pool,) = [i for i in compiled.program.instrs if i.kind == "MaxPool"]
        assert pool.plan.strategy == "taps"
        rows = attrs["strides"][1] <= 2 and attrs.get("dilations", [1])[0] == 1 and want.shape[3] >= 16
        assert by_rows(pool.node) == rows
        np.testing.assert_array_equal(compiled.run({"x": x})["y"], want)


@pytest.mark.skipif(__import__("shutil").which("gcc") is None, reason="gcc is not installed")
def test_quantized_bundle_matches_jit(tmp_path):
    """A quantized bundle (int8 kernels, packed i8 weights in the weights file), built with
    gcc, computes what the JIT computes, bit for bit."""
    import glowgen
    from test_bundle import build, run_bundle
    rng = np.random.default_rng(12)
    model = _small_cnn(rng)
    profile = glowgen.profile(model, [{"x": rng.standard_normal((2, 3, 10, 10)).astype(np.float32)}
                                      for _ in range(3)])
    x = {"x": rng.standard_normal((2, 3, 10, 10)).astype(np.float32)}
    bundle = glowgen.write_bundle(model, tmp_path / "b", name="qcnn", quantize=profile)
    exe = build(bundle)
    want = glowgen.compile(model, quantize=profile).run(x)
    got = run_bundle(exe, bundle.program, x, tmp_path)
    assert got["y"].tobytes() == want["y"].tobytes()


def _qdq_depthwise(tmp_path, c, hw, k, stride, pads, activation, relu, seed):
    """A depthwise Conv (+ Relu) quantized by onnxruntime's quantize_static in QDQ form:
    per-channel i8 weights, u8 or i8 activations."""
    return _qdq_conv(tmp_path, c, c, c, (1, hw, hw), k, stride, pads, activation, relu, seed)


def _qdq_conv(tmp_path, c, m, group, nhw, k, stride, pads, activation, relu, seed):
    """A Conv of `group` groups, c -> m channels, on inputs (n, c, h, w) (+ Relu), quantized
    by onnxruntime's quantize_static in QDQ form: per-channel i8 weights, u8 or i8
    activations."""
    pytest.importorskip("onnxruntime.quantization")
    from onnx import helper
    import onnx
    from conftest import make_model, ort_quantize_static
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((m, c // group, k, k)) * rng.uniform(0.05, 0.5, (m, 1, 1, 1))).astype(np.float32)
    b = (rng.standard_normal(m) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], group=group, kernel_shape=[k, k],
                              strides=[stride, stride], pads=list(pads))]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    shape = (nhw[0], c, nhw[1], nhw[2])
    model = make_model(nodes, {"x": np.zeros(shape, np.float32)}, ["y"], {"w": w, "b": b})
    onnx.save(model, tmp_path / "f.onnx")
    samples = [{"x": (rng.standard_normal(shape) + 0.3).astype(np.float32)} for _ in range(8)]
    return ort_quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", samples, "QDQ", activation), shape


QDQ_DEPTHWISE = [
    # channels, size, kernel, stride, pads, activations, relu
    (16, 14, 3, 1, (1, 1, 1, 1), "QUInt8", True),
    (16, 15, 3, 2, (1, 1, 1, 1), "QUInt8", False),
    (8, 12, 5, 1, (2, 2, 2, 2), "QInt8", False),
    (8, 13, 5, 2, (2, 2, 2, 2), "QInt8", True),
    (24, 9, 3, 2, (0, 1, 1, 0), "QUInt8", False),
]


@pytest.mark.parametrize("case", range(len(QDQ_DEPTHWISE)))
def test_qdq_depthwise_against_onnxruntime(case, tmp_path):
    """onnxruntime's QDQ depthwise convolutions run on the int8 depthwise kernel: within a
    quantization step of onnxruntime (whose integer kernels round their own way), and bit
    for bit the interpreter's result at 1 and 2 threads, with AVX-512 VNNI and with AVX2."""
    import glowgen
    from onnx import numpy_helper
    import onnx
    from conftest import ort_session
    c, hw, k, stride, pads, activation, relu = QDQ_DEPTHWISE[case]
    path, shape = _qdq_depthwise(tmp_path, c, hw, k, stride, pads, activation, relu, 80 + case)
    qdq = onnx.load(path)
    (y_scale,) = [float(numpy_helper.to_array(t)) for t in qdq.graph.initializer
                  if t.name == [n for n in qdq.graph.node if n.op_type == "QuantizeLinear"][-1].input[1]]
    sess = ort_session(qdq)
    x = {"x": (np.random.default_rng(case).standard_normal(shape) + 0.3).astype(np.float32)}
    expected = sess.run(None, x)[0]
    reference = glowgen.compile(path, backend="interpreter").run(x)["y"]
    assert np.abs(reference - expected).max() <= y_scale * 1.001, np.abs(reference - expected).max() / y_scale
    for cpu in CPUS:
        for threads in THREADS:
            model = glowgen.compile(path, threads=threads, cpu=cpu)
            (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
            assert plan.strategy.startswith("depthwise-"), plan
            assert model.run(x)["y"].tobytes() == reference.tobytes(), (cpu, threads)


QDQ_GROUPED = [
    # channels in, out, groups, (n, h, w), kernel, stride, pads, activations, relu
    (128, 128, 32, (1, 14, 14), 3, 1, (1, 1, 1, 1), "QUInt8", True),   # ResNeXt's 3x3
    (64, 64, 8, (2, 15, 13), 3, 2, (1, 1, 1, 1), "QInt8", False),
    (16, 32, 4, (1, 17, 16), 3, 3, (1, 0, 1, 2), "QUInt8", False),
    (8, 12, 2, (2, 9, 9), 3, 1, (0, 0, 0, 0), "QInt8", True),
    (24, 24, 12, (1, 10, 11), 3, 1, (1, 1, 1, 1), "QUInt8", False),    # 2 channels a group
]


@pytest.mark.parametrize("case", range(len(QDQ_GROUPED)))
def test_qdq_grouped_against_onnxruntime(case, tmp_path):
    """onnxruntime's QDQ grouped convolutions run on the general int8 product group by
    group: within a quantization step of onnxruntime, and bit for bit the interpreter's
    result at 1 and 2 threads, with AVX-512 VNNI, AVX-512BW (x86-64-v4) and AVX2."""
    import glowgen
    from onnx import numpy_helper
    import onnx
    from conftest import ort_session
    c, m, group, nhw, k, stride, pads, activation, relu = QDQ_GROUPED[case]
    path, shape = _qdq_conv(tmp_path, c, m, group, nhw, k, stride, pads, activation, relu, 100 + case)
    qdq = onnx.load(path)
    (y_scale,) = [float(numpy_helper.to_array(t)) for t in qdq.graph.initializer
                  if t.name == [n for n in qdq.graph.node if n.op_type == "QuantizeLinear"][-1].input[1]]
    sess = ort_session(qdq)
    x = {"x": (np.random.default_rng(case).standard_normal(shape) + 0.3).astype(np.float32)}
    expected = sess.run(None, x)[0]
    reference = glowgen.compile(path, backend="interpreter").run(x)["y"]
    assert np.abs(reference - expected).max() <= y_scale * 1.001, np.abs(reference - expected).max() / y_scale
    for cpu in RUNNABLE_CPUS:
        for threads in THREADS:
            model = glowgen.compile(path, threads=threads, cpu=cpu)
            (ins,) = [i for i in model.program.instrs if i.kind == "QuantizedConv"]
            assert ins.node.group == group and ins.plan.strategy == KINDS.get(cpu, ins.plan.strategy), ins.plan
            assert ins.plan.strategy in QSHAPES, ins.plan
            assert model.run(x)["y"].tobytes() == reference.tobytes(), (cpu, threads)


@pytest.mark.skipif(__import__("shutil").which("gcc") is None, reason="gcc is not installed")
def test_qdq_depthwise_bundle_matches_jit(tmp_path):
    """A bundle of onnxruntime's QDQ depthwise convolution (the depthwise kernel's packed
    constants in the weights file), split in two, computes what the JIT computes."""
    import glowgen
    from test_bundle import build, run_bundle
    c, hw, k, stride, pads, activation, relu = QDQ_DEPTHWISE[0]
    path, shape = _qdq_depthwise(tmp_path, c, hw * 3, k, stride, pads, activation, relu, 90)
    x = {"x": (np.random.default_rng(91).standard_normal(shape) + 0.3).astype(np.float32)}
    bundle = glowgen.write_bundle(path, tmp_path / "b", name="qdw", threads=2)
    assert [i.plan.strategy for i in bundle.program.instrs if i.kind == "QuantizedConv"][0].startswith("depthwise-")
    assert max(s.parts for s in bundle.program.plan.steps) == 2
    got = run_bundle(build(bundle), bundle.program, x, tmp_path)
    assert got["y"].tobytes() == glowgen.compile(path, threads=1).run(x)["y"].tobytes()


def test_depthwise_row_copies_every_length():
    """qdepthwise.copy_bytes, the depthwise kernel's copies of input rows into its plane and
    of result rows into y, for every row length from 1 to 3 COPY vectors: byte for byte the
    source (its top bits flipped for `flip`, widened to i16 for an i16 destination), and not
    a byte written before or past the row (a row shorter than COPY is two moves, the second
    overlapping the first)."""
    import ctypes

    from llvmlite import ir

    from glowgen.backends.cpu.jit import JitFunction
    from glowgen.backends.cpu.kernels.qdepthwise import COPY, copy_bytes
    from glowgen.backends.cpu.llvmutil import I8, I16
    from glowgen.backends.cpu.target import resolve_cpu

    counts = range(1, 3 * COPY + 1)
    kinds = [(False, I8), (True, I8), (True, I16)]     # (flip, destination element)
    mod = ir.Module(name="t_copy_bytes")
    for count in counts:
        for k, (flip, elem) in enumerate(kinds):
            fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), elem.as_pointer()]),
                             name=f"copy_{count}_{k}")
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            copy_bytes(b, fn.args[0], fn.args[1], count, flip)
            b.ret_void()
    jit = JitFunction(str(mod), "copy_1_0", cpu=resolve_cpu())
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
    rng = np.random.default_rng(3)
    src = rng.integers(-128, 128, 3 * COPY + 16, dtype=np.int8)
    for count in counts:
        for k, (flip, elem) in enumerate(kinds):
            fn = proto(jit.engine.get_function_address(f"copy_{count}_{k}"))
            dtype = np.int16 if elem == I16 else np.int8
            guard = 8                                  # elements each side of the row
            dst = np.full(count + 2 * guard, 77, dtype)
            fn(src.ctypes.data, dst.ctypes.data + guard * dst.itemsize)
            want = src[:count] ^ np.int8(-128) if flip else src[:count]
            assert np.array_equal(dst[guard:guard + count], want.astype(dtype)), (count, flip, elem)
            assert (dst[:guard] == 77).all() and (dst[guard + count:] == 77).all(), (count, flip, elem)


# ----------------------------------------------------------------------------- AMX tiles
# Products on AMX tiles (amx.py), where the host has them: every shape qlinalg gives them
# (filters not a multiple of the tile's 32, a last panel of one vector, strides, dilations,
# uneven pads, batches, splits among threads), against the exact reference.
AMX_HOST = {"amx_tile", "amx_int8"} <= set(open("/proc/cpuinfo").read().split()) and amx.permitted()
needs_amx = pytest.mark.skipif(not AMX_HOST, reason="this CPU has no AMX tiles (Intel Sapphire Rapids "
                                                    "and later): nothing to run them on")
AMX_CONV = [(1, 64, 56, 56, 64, 1),                                   # interleaved bands, stored direct
            (1, 128, 28, 28, 70, 3, (1, 1), (1, 1, 1, 1)),            # 70 filters: 3 blocks of 32
            (2, 64, 13, 14, 40, 3, (2, 2), (1, 1, 1, 1)),             # phases, two images
            (1, 128, 14, 14, 96, 1),                                  # 196 pixels: a last panel of 1 vector
            (1, 64, 9, 9, 64, 3, (1, 1), (2, 0, 1, 2), (2, 2)),       # dilated, uneven pads
            (1, 256, 7, 7, 64, 3, (2, 2), (1, 1, 1, 1)),              # 4 tiles of channels, 3 x 3 taps
            (1, 64, 30, 30, 64, 1),                                   # split: plane in shares
            # Channels short of whole tiles (16 groups of 4): the tiles read plane rows past
            # the plane's own, against zero weights.
            (1, 96, 14, 14, 40, 1),                                   # 24 groups of 32
            (1, 40, 20, 20, 64, 3, (1, 1), (1, 1, 1, 1)),             # 10 of 16
            (2, 130, 9, 9, 33, 1, (2, 2)),                            # 33 (the last 2 channels) of 48
            (1, 144, 28, 28, 24, 1),                                  # 36 of 48, interleaved bands
            (1, 3, 64, 64, 40, 7, (2, 2), (3, 3, 3, 3))]              # a stem: row elements, 42 of 48
AMX_MATMUL = [((2, 8), 128, 70), ((16,), 256, 512), ((64,), 192, 33), ((20,), 40, 50),
              ((4, 6), 71, 50)]


@needs_amx
@pytest.mark.parametrize("case", range(len(AMX_CONV)))
def test_amx_conv(case):
    text, feeds, want = conv_case(np.random.default_rng(900 + case), *AMX_CONV[case], bounds=(-100, 120))
    for threads in (1, 2, 3):
        model, _ = _compile(text, None, threads, amx=True)
        assert [i.plan.strategy for i in model.program.instrs if i.kind == "QuantizedConv"] == ["amx"]
        np.testing.assert_array_equal(model.run(feeds)["y"], want, err_msg=f"{threads} threads")


@needs_amx
@pytest.mark.parametrize("case", range(len(AMX_MATMUL)))
def test_amx_matmul(case):
    text, feeds, want = matmul_case(np.random.default_rng(950 + case), *AMX_MATMUL[case])
    for threads in (1, 2):
        model, _ = _compile(text, None, threads, amx=True)
        assert [i.plan.strategy for i in model.program.instrs if i.kind == "QuantizedMatMul"] == ["amx"]
        np.testing.assert_array_equal(model.run(feeds)["y"], want, err_msg=f"{threads} threads")


def test_amx_only_where_tiles_fit():
    """Grouped convolutions, im2col planes (but row elements panel by panel), products of
    fewer channels than half a tile's and of fewer pixels than a vector keep VNNI's
    product, and `amx=False` all of them; x86-64 levels have no tiles."""
    from glowgen.backends.cpu.amx import available, fits
    cases = {(1, 96, 14, 14, 64, 1): True, (1, 64, 14, 14, 64, 1): True, (1, 3, 20, 18, 10, 7): False,
             (1, 64, 14, 14, 64, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2): False,
             (1, 3, 32, 32, 40, 7, (2, 2), (3, 3, 3, 3)): True,      # row elements, panel by panel
             (1, 24, 20, 20, 64, 1): False,                          # 6 channel groups of a tile's 16
             (1, 512, 1, 1, 100, 1): False}                          # one pixel: VNNI's lanes
    for args, tiles in cases.items():
        text, _, _ = conv_case(np.random.default_rng(0), *args)
        fn = parse_function(text, Registry.default())
        pipeline.run(fn, Registry.default(), pipeline.PIPELINE, "cpu")
        node = [n for n in fn.nodes if n.OP == "QuantizedConv"][0]
        assert fits(Geometry(node, QShape("amx"))) == tiles, args
    assert not available(level_features("x86-64-v4") + ",+avx512vnni")
    assert available("+avx512bw,+avx512vnni,+amx-tile,+amx-int8")
    assert not available(without("+avx512bw,+avx512vnni,+amx-tile,+amx-int8"))


def test_amx_weights_packed_a_tile_a_run():
    """pack_a lays the weights out as the kernel loads A's tiles: for block b, tile of 16
    channel groups kb, tap t and row tile r, 16 filters of 64 bytes one after another."""
    from glowgen.backends.cpu.amx import pack_a
    rng = np.random.default_rng(1)
    mr, g, taps = 32, 4, 9
    w = rng.integers(-127, 128, (64, 128, taps)).astype(np.int8)      # [M, C, taps]
    packed = pack_a(w, mr, g).ravel()
    tile = 16 * 64
    for blk, kb, t, r in [(0, 0, 0, 0), (1, 1, 8, 1), (0, 1, 4, 1), (1, 0, 2, 0)]:
        at = ((blk * 2 + kb) * taps + t) * 2 * tile + r * tile
        a = packed[at:at + tile].reshape(16, 64)                       # rows: filters
        want = w[blk * mr + r * 16: blk * mr + r * 16 + 16, kb * 64:(kb + 1) * 64, t]
        np.testing.assert_array_equal(a, want)


@needs_amx
@pytest.mark.skipif(__import__("shutil").which("gcc") is None, reason="gcc is not installed")
def test_amx_bundle_matches_vnni(tmp_path):
    """A bundle whose products run on tiles asks Linux for them itself (a C program has not
    asked, as the JIT's process has) and computes what VNNI's products compute (held to the
    exact reference above), bit for bit."""
    import glowgen
    from onnx import helper
    from conftest import make_model
    from test_bundle import build, run_bundle
    rng = np.random.default_rng(13)
    w1 = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((96, 64, 1, 1)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"])]
    model = make_model(nodes, {"x": np.zeros((1, 64, 12, 12), np.float32)}, ["y"], {"w1": w1, "w2": w2})
    samples = [{"x": rng.standard_normal((1, 64, 12, 12)).astype(np.float32)} for _ in range(3)]
    profile = glowgen.profile(model, samples)
    bundle = glowgen.write_bundle(model, tmp_path / "b", name="qamx", quantize=profile)
    assert [i.plan.strategy for i in bundle.program.instrs if i.kind == "QuantizedConv"] == ["amx", "amx"]
    want = glowgen.compile(model, quantize=profile, amx=False).run(samples[0])
    got = run_bundle(build(bundle), bundle.program, samples[0], tmp_path)
    assert got["y"].tobytes() == want["y"].tobytes()


def test_no_amx_flag(tmp_path):
    """`--no-amx` reaches the cpu backend's `amx=False` (a run with it succeeds, on any CPU)
    and is refused, without a traceback, for a backend that has no such option."""
    import subprocess
    import sys
    import onnx
    from onnx import helper
    from conftest import make_model
    w = np.random.default_rng(3).standard_normal((8, 4, 1, 1)).astype(np.float32)
    path = tmp_path / "conv.onnx"
    onnx.save(make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": np.zeros((1, 4, 6, 6), np.float32)},
                         ["y"], {"w": w}), path)
    for backend, ok in (("cpu", True), ("interpreter", False)):
        run = subprocess.run([sys.executable, "-m", "glowgen.cli", "run", str(path), "--backend", backend,
                              "--no-amx"], capture_output=True, text=True, timeout=120)
        assert (run.returncode == 0) == ok, run.stderr
        assert "Traceback" not in run.stderr
        if not ok:
            assert "--no-amx applies to the cpu backend" in run.stderr
