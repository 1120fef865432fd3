"""The int8 product's `ubsw` path (backends/cpu/qgemm.py): on AVX2 (x86-64-v3) and on
AVX-512BW without VNNI (x86-64-v4), a product whose constant weights all lie in [-64, 63]
multiplies u8 activations by s8 weights with `vpmaddubsw`, whose 16-bit pair sums cannot
saturate with such weights; any other weight keeps the exact `madd16`.  Both against the
exact NumPy reference of test_int8_kernels, bit for bit at 1, 2 and 3 threads, including
the extremes: weights -64 and 63 against activations 0 and 255 (as u8: -128 and 127 + 128).
And the quantizer's default: 7-bit weights on targets without VNNI, 8 on the others."""
from __future__ import annotations

import numpy as np
import pytest

from glowgen.backends.cpu.kernels import qlanes
from glowgen.backends.cpu.kernels.qlinalg import Geometry
from glowgen.backends.cpu.qgemm import QShape, fast_weight_bits
from glowgen.backends.cpu.target import level_features
from test_int8_kernels import _AVX512BW, _compile, conv_case, matmul_case

CPUS = ["x86-64-v3"] + (["x86-64-v4"] if _AVX512BW else [])
SEVEN_BITS = np.arange(-64, 64)
EXTREMES = dict(w_values=[-64, 63], x_values=[-128, 127])   # the largest pair sums there are

CONVS = [
    # n, c, h, w, m, k, strides, pads, dilations (, group)
    (1, 3, 20, 18, 10, 7, (2, 2), (3, 3, 3, 3), (1, 1)),     # a stem: 3 of 4 channels a group
    (2, 8, 8, 8, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 33, 7, 7, 70, 3, (1, 1), (1, 1, 1, 1), (1, 1)),      # ragged channels and filters
    (1, 16, 12, 12, 24, 1, (1, 1), (0, 0, 0, 0), (1, 1)),    # 1x1: tiles store into y
    (1, 64, 13, 14, 64, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    (1, 16, 10, 9, 24, 3, (2, 1), (0, 1, 2, 1), (1, 1), 2),  # grouped
    (1, 32, 30, 30, 48, 3, (1, 1), (1, 1, 1, 1), (1, 1)),    # split among threads
    (1, 64, 7, 7, 64, 3, (1, 1), (1, 1, 1, 1), (1, 1)),      # features in the lanes (qlanes.py):
    (1, 72, 14, 14, 64, 3, (1, 1), (1, 1, 1, 1), (1, 1)),    # ... 49 and 196 pixels broadcast
    (1, 64, 14, 13, 64, 3, (2, 2), (1, 1, 1, 1), (1, 1)),    # ... at stride 2, 7x7 from 14x13
    (1, 64, 40, 40, 16, 3, (1, 1), (1, 1, 1, 1), (1, 1)),    # a larger image: pixels in the lanes
    (1, 64, 5, 6, 48, 3, (1, 1), (1, 1, 1, 1), (1, 1)),      # 30 pixels: 7 blocks of 4 rows and one of 2
    (1, 72, 3, 9, 40, 3, (1, 1), (1, 1, 1, 1), (1, 1)),      # 27 pixels: 6 blocks of 4 and one of 3
    (1, 128, 56, 56, 16, 3, (2, 2), (1, 1, 1, 1), (1, 1)),   # 784 outputs in 816 lanes (rows of 29
    (1, 64, 56, 56, 16, 3, (2, 2), (1, 1, 1, 1), (1, 1)),    # for 28): lanes from 1024 products an output
]
# The CONVS above with their features in the lanes, by the product's kind: 16 features
# fill AVX2's tiles of 16, but only half of AVX-512's of 32 (case 13: pixels there).
IN_LANES = {"ubsw": (4, 7, 8, 9, 11, 12, 13), "ubsw-512": (4, 7, 8, 9, 11, 12)}
MATMULS = [((1,), 512, 100), ((2, 5), 37, 33), ((64,), 130, 257)]   # one row: in the lanes


def _strategy(model, kind):
    (plan,) = [i.plan for i in model.program.instrs if i.kind == kind]
    return plan.strategy


def _check(text, feeds, want, cpu, kind, strategy):
    results = []
    for threads in (1, 2, 3):
        model, ops = _compile(text, cpu, threads)
        assert _strategy(model, kind) == strategy
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()


def _ubsw(cpu):
    return "ubsw" if cpu == "x86-64-v3" else "ubsw-512"


def _product(text, cpu, kind):
    """The strategy and the qlinalg.Geometry of the one `kind` product `text` compiles to
    for `cpu`, at one thread."""
    model, _ = _compile(text, cpu, 1)
    (ins,) = [i for i in model.program.instrs if i.kind == kind]
    qs = QShape(ins.plan.strategy)
    return qs, Geometry(ins.node, qs)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("extremes", [False, True])
def test_ubsw_conv_exact(case, cpu, extremes):
    values = EXTREMES if extremes else dict(w_values=SEVEN_BITS)
    text, feeds, want = conv_case(np.random.default_rng(300 + case), *CONVS[case], **values)
    _check(text, feeds, want, cpu, "QuantizedConv", _ubsw(cpu))


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(MATMULS)))
@pytest.mark.parametrize("extremes", [False, True])
def test_ubsw_matmul_exact(case, cpu, extremes):
    values = EXTREMES if extremes else dict(w_values=SEVEN_BITS)
    text, feeds, want = matmul_case(np.random.default_rng(320 + case), *MATMULS[case], **values)
    _check(text, feeds, want, cpu, "QuantizedMatMul", _ubsw(cpu))


def test_ubsw_in_the_lanes():
    """A product of one row takes the lanes layout (qlanes.py), activations broadcast as the
    u8 operand: covered by MATMULS[0]."""
    text, _, _ = matmul_case(np.random.default_rng(320), *MATMULS[0], w_values=SEVEN_BITS)
    qs, geo = _product(text, "x86-64-v3", "QuantizedMatMul")
    assert qs.kind == "ubsw" and qlanes.in_lanes(geo, qs)


@pytest.mark.parametrize("cpu", CPUS)
def test_ubsw_convs_in_the_lanes(cpu):
    """Small images whose pixels would leave lanes idle (the padding columns of each row of
    the plane) put the filters in the lanes and broadcast the pixels; larger ones do not."""
    for case, conv in enumerate(CONVS):
        in_lanes = case in IN_LANES[_ubsw(cpu)]
        if conv[1] * conv[5] ** 2 < qlanes.MIN_PRODUCTS_PER_OUTPUT and not in_lanes:
            continue
        text, _, _ = conv_case(np.random.default_rng(300 + case), *conv, w_values=SEVEN_BITS)
        qs, geo = _product(text, cpu, "QuantizedConv")
        assert qs.kind == _ubsw(cpu) and qlanes.in_lanes(geo, qs) == in_lanes, case


@pytest.mark.parametrize("case, blocks", [(7, (4, 1)), (8, (4, 4)), (9, (4, 1)), (11, (4, 2)), (12, (4, 3))])
def test_lanes_last_block_takes_the_rows_left(case, blocks):
    """AVX2's tiles of 4 rows: the rows divide into whole blocks and a last one of the rows
    left (49 pixels: 12 x 4 + 1), which computes no row past the end; CONVS[7, 9, 11, 12]
    check its sums, at 1, 2 and 3 threads."""
    text, _, _ = conv_case(np.random.default_rng(300 + case), *CONVS[case], w_values=SEVEN_BITS)
    qs, geo = _product(text, "x86-64-v3", "QuantizedConv")
    lanes = qlanes.Lanes(geo, qs)
    assert (lanes.mr, lanes.tail_rows) == blocks


DEPTHWISE = [
    # n, c, h, w, m, k, strides, pads, dilations, group (= c = m), and the int8 path on AVX2:
    # 7-bit weights take `ubsw` where the lanes run interleaved (unit strides, no dilation)
    (1, 8, 9, 9, 8, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8, "madd16"),    # 97 lanes: in steps of 32
    #                                                    they would waste more than 5% (128 for 112)
    (1, 5, 20, 13, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 5, "ubsw"),    # 5 taps a row: 2 groups of 4
    (1, 40, 7, 7, 40, 3, (1, 1), (1, 1, 1, 1), (1, 1), 40, "ubsw"),
    (1, 3, 70, 71, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3, "ubsw"),    # rows of several vectors
    (1, 32, 40, 40, 32, 3, (1, 1), (1, 1, 1, 1), (1, 1), 32, "ubsw"),  # split among threads
    (2, 16, 14, 13, 16, 3, (2, 2), (1, 1, 1, 1), (1, 1), 16, "madd16"),
    (1, 4, 11, 12, 4, 3, (1, 1), (2, 2, 2, 2), (2, 2), 4, "madd16"),   # dilated
]


@pytest.mark.parametrize("case", range(len(DEPTHWISE)))
@pytest.mark.parametrize("extremes", [False, True])
def test_ubsw_depthwise_exact(case, extremes):
    """The depthwise kernel (qdepthwise.py) with 7-bit weights on AVX2: groups of 4 taps of a
    row in 32-bit elements, `vpmaddubsw` and `vpmaddwd` with ones, as VNNI's `vpdpbusd`."""
    values = EXTREMES if extremes else dict(w_values=SEVEN_BITS)
    *conv, kind = DEPTHWISE[case]
    text, feeds, want = conv_case(np.random.default_rng(360 + case), *conv, **values)
    _check(text, feeds, want, "x86-64-v3", "QuantizedConv", "depthwise-" + kind)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("outlier", [-65, 64, -128, 127])
def test_a_weight_outside_seven_bits_keeps_madd16(cpu, outlier):
    """One weight outside [-64, 63] could saturate a pair sum: that product keeps madd16,
    and stays exact with activations at their extremes."""
    madd16 = "madd16" if cpu == "x86-64-v3" else "madd16-512"
    for make, case, kind, strategy in ((conv_case, CONVS[1], "QuantizedConv", madd16),
                                       (matmul_case, MATMULS[1], "QuantizedMatMul", madd16),
                                       (conv_case, DEPTHWISE[2][:-1], "QuantizedConv", "depthwise-" + madd16)):
        rng = np.random.default_rng(340)
        text, feeds, want = make(rng, *case, w_values=[-64, 63, outlier], x_values=[-128, 127])
        assert str(outlier) in text
        _check(text, feeds, want, cpu, kind, strategy)


def test_weight_bits_by_target():
    """7-bit weights where the product lacks VNNI, 8 where it has it."""
    assert fast_weight_bits(level_features("x86-64-v3")) == 7
    assert fast_weight_bits(level_features("x86-64-v4")) == 7
    assert fast_weight_bits(level_features("x86-64-v4").replace("-avx512vnni", "+avx512vnni")) == 8
    assert fast_weight_bits("+sse2") == 8          # no int8 product: plain loops either way


# ----------------------------------------------------------------------------- the quantizer
@pytest.fixture(scope="module")
def digits():
    import glowgen
    from test_quantization import _digits
    model, data = _digits()
    calib = [{"input": data["calib_x"][i:i + 1]} for i in range(100)]
    return model, data, glowgen.profile(model, calib, input_shapes={"input": (1, 1, 8, 8)})


def _weights(model):
    """(strategy, |largest weight|) of each int8 product of a compiled model."""
    return [(i.plan.strategy, int(np.abs(i.node.inputs[1].data).max()))
            for i in model.program.instrs if i.kind in ("QuantizedConv", "QuantizedMatMul")]


@pytest.mark.parametrize("cpu, weight_bits, strategy, top", [
    ("x86-64-v3", None, "ubsw", 63), ("x86-64-v3", "auto", "ubsw", 63), ("x86-64-v3", 8, "madd16", 127),
    ("x86-64-v4", None, "ubsw-512", 63), ("x86-64-v3", 7, "ubsw", 63)])
def test_quantizer_weight_bits_by_target(digits, cpu, weight_bits, strategy, top):
    """Without VNNI the quantizer's weights take 7 bits ([-63, 63]: ubsw) unless asked for 8
    (madd16); digits top-1 stays within half a point of float either way."""
    import glowgen
    if cpu not in CPUS:
        pytest.skip(f"this machine cannot run {cpu}")
    model, data, profile = digits
    x, y = data["test_x"], data["test_y"]
    shapes = {"input": x.shape}
    float_top1 = (glowgen.compile(model, input_shapes=shapes, cpu=cpu).run({"input": x})["logits"]
                  .argmax(1) == y).mean()
    q = glowgen.compile(model, input_shapes=shapes, cpu=cpu, quantize=profile, weight_bits=weight_bits,
                        winograd=False)     # the direct products (not test_int8_winograd's)
    weights = _weights(q)
    assert len(weights) == 5 and all(w == (strategy, top) for w in weights), weights
    top1 = (q.run({"input": x})["logits"].argmax(1) == y).mean()
    assert top1 >= float_top1 - 0.005, (top1, float_top1)


def test_quantizer_keeps_eight_bits_with_vnni(digits):
    """The host's own target: 8-bit weights where it has VNNI (the interpreter: always 8)."""
    import glowgen
    from glowgen.backends.cpu.target import resolve_cpu
    model, data, profile = digits
    shapes = {"input": (1, 1, 8, 8)}
    host = glowgen.compile(model, input_shapes=shapes, quantize=profile)
    expected = 127 if fast_weight_bits(resolve_cpu("host").features) == 8 else 63
    assert {w for _, w in _weights(host)} == {expected}


def test_weight_bits_are_checked(digits):
    import glowgen
    from glowgen.errors import GlowgenError
    from glowgen.quantization.quantizer import check_weight_bits
    assert check_weight_bits("7") == 7 and check_weight_bits("auto") is None
    with pytest.raises(GlowgenError, match="7 or 8 bits"):
        check_weight_bits(6)
    with pytest.raises(GlowgenError, match="int16"):
        check_weight_bits(7, "i16")
    with pytest.raises(GlowgenError, match="give quantize= a profile"):
        glowgen.compile(digits[0], input_shapes={"input": (1, 1, 8, 8)}, weight_bits=7)
