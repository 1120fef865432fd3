"""int8 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) on AVX2 (kernels/qwinograd.py):
exact in integers, so held bit for bit to the exact NumPy reference of test_int8_kernels at
1, 2 and 3 threads, with 8-bit and 7-bit weights and the extremes (weights -128 and 127
against activations -128 and 127: the largest transformed values there are).  Compiled
for x86-64-v3, which every x86-64 host these tests run on can run."""
from __future__ import annotations

import numpy as np
import pytest

from glowgen import pipeline
from glowgen.backends.cpu.kernels import qwinograd
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function
from test_int8_kernels import _compile, conv_case

CPU = "x86-64-v3"
EXTREMES = dict(w_values=[-128, 127], x_values=[-128, 127])
SEVEN_BITS = dict(w_values=np.arange(-64, 64))

CONVS = [
    # n, c, h, w, m, pads (stride 1, 3x3)
    (1, 64, 56, 56, 64, (1, 1, 1, 1)),     # ResNet's: tile rows of 28, output rows stored whole
    (1, 32, 28, 28, 40, (1, 1, 1, 1)),     # 14 tiles a row: the last vector overlaps
    (1, 16, 14, 14, 20, (1, 1, 1, 1)),     # 7 tiles a row: through the staging block
    (1, 24, 7, 7, 13, (1, 1, 1, 1)),       # 7 x 7: odd rows and columns, 13 filters (ragged)
    (2, 8, 17, 15, 10, (1, 1, 1, 1)),      # two images, odd sizes
    (1, 8, 20, 23, 7, (0, 0, 0, 0)),       # no padding
    (1, 10, 20, 21, 7, (1, 0, 2, 1)),      # uneven padding
    (1, 6, 40, 44, 16, (1, 1, 1, 1)),      # 22 tiles a row, 21 tile rows: bands share unevenly
    (1, 192, 10, 10, 178, (1, 1, 1, 1)),   # weights streamed: a split shares out filters
]
STREAMED = 8


def _check(case, rng, bounds=None, **values):
    n, c, h, w, m, pads = case
    text, feeds, want = conv_case(rng, n, c, h, w, m, 3, (1, 1), pads, (1, 1), bounds=bounds, **values)
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, CPU, threads, winograd=True)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert plan.strategy == qwinograd.STRATEGY, plan
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("values", ["eight bits", "seven bits", "extremes"])
def test_winograd_conv_exact(case, values):
    kwargs = {"eight bits": {}, "seven bits": SEVEN_BITS, "extremes": EXTREMES}[values]
    _check(CONVS[case], np.random.default_rng(400 + case), **kwargs)


def test_streamed_weights_split_filters():
    n, c, h, w, m, _ = CONVS[STREAMED]
    text, _, _ = conv_case(np.random.default_rng(0), n, c, h, w, m, 3, (1, 1), (1, 1, 1, 1))
    node = _node(text)
    assert not qwinograd.QWinogradGeometry(node, 1).split_filters
    assert qwinograd.QWinogradGeometry(node, 2).split_filters


def test_scratch_holds_every_split():
    """A task's bands depend on how many tasks share them; the scratch the kernel is given
    (computed without knowing) holds the largest."""
    for n, c, h, w, m, pads in CONVS + [(1, 64, 28, 56, 64, (1, 1, 1, 1)), (1, 32, 56, 56, 48, (1, 1, 1, 1))]:
        text, _, _ = conv_case(np.random.default_rng(0), n, c, h, w, m, 3, (1, 1), pads)
        node = _node(text)
        most = qwinograd.QWinogradGeometry(node).most_scratch()
        for parts in range(1, 9):
            g = qwinograd.QWinogradGeometry(node, parts)
            assert g.v_bytes + g.m_bytes + g.z_bytes <= most, (node, parts)


def test_requantization_out_of_i32_range():
    """A result scale so small that the requantized sums leave the i32 range: the output
    transform's requantization runs in f32 and saturates (qgemm.requantize), as the direct
    product's."""
    n, c, h, w, m, pads = CONVS[2]
    text, feeds, want = conv_case(np.random.default_rng(460), n, c, h, w, m, 3, (1, 1), pads, ys=1e-9)
    assert np.any(want == 127) and np.any(want == -128)
    for threads in (1, 2):
        model, _ = _compile(text, CPU, threads, winograd=True)
        (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
        assert plan.strategy == qwinograd.STRATEGY and plan.packed == "a", plan
        np.testing.assert_array_equal(model.run(feeds)["y"], want)


def test_winograd_conv_saturates_to_its_bounds():
    """A fused ReLU's bounds (the result's low and high) saturate as the direct product's."""
    _check(CONVS[1], np.random.default_rng(420), bounds=(-3, 90))


@pytest.mark.parametrize("change, why", [
    (dict(c=9), "odd channels: no whole pairs"),
    (dict(strides=(2, 2)), "stride 2"),
    (dict(k=5), "5x5"),
    (dict(h=6, w=6), "36 output pixels"),
    (dict(group=2), "grouped"),
])
def test_winograd_only_where_it_applies(change, why):
    args = dict(n=1, c=8, h=16, w_=16, m=8, k=3, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
    args.update({("w_" if key == "w" else key): v for key, v in change.items()})
    text, feeds, want = conv_case(np.random.default_rng(430), **args)
    model, _ = _compile(text, CPU, 1, winograd=True)
    (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
    assert plan.strategy != qwinograd.STRATEGY, why
    np.testing.assert_array_equal(model.run(feeds)["y"], want)


def test_winograd_off_and_on_vnni():
    """winograd=False keeps the direct product; so does a target with VNNI, whose 64 products
    an instruction beat 2.25x fewer at 16 an instruction."""
    text, feeds, want = conv_case(np.random.default_rng(440), 1, 16, 16, 16, 16, 3, (1, 1), (1, 1, 1, 1))
    from glowgen.backends.cpu.qgemm import QShape
    assert not qwinograd.covers(_node(text), QShape("vnni"))
    assert qwinograd.covers(_node(text), QShape("madd16")) and qwinograd.covers(_node(text), QShape("ubsw"))
    model, _ = _compile(text, CPU, 1, winograd=False)
    (plan,) = [i.plan for i in model.program.instrs if i.kind == "QuantizedConv"]
    assert plan.strategy == "madd16", plan


def _node(text):
    """The lowered graph's QuantizedConv (not compiled: its geometry needs only the node)."""
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, "cpu")
    (node,) = [n for n in fn.nodes if n.OP == "QuantizedConv"]
    return node


def test_sums_out_of_range_stay_direct():
    """4 (sum + bias) must fit i32 (A^T M A computes it): a bias near 2^29 does not."""
    w = np.full((2, 8, 3, 3), 127, np.int8)
    assert qwinograd.sums_in_range(w, np.array([5000, -5000]))
    assert not qwinograd.sums_in_range(w, np.array([2 ** 29, 0]))


def test_transformed_weights_are_four_times_g_g_gt():
    """U = (2G) g (2G)^T is 4 G g G^T, within i16 for any int8 filter."""
    from glowgen.backends.cpu.kernels.conv_winograd import TRANSFORMS
    g = np.random.default_rng(450).integers(-128, 128, (3, 2, 3, 3))
    _, gt, _ = TRANSFORMS[2]
    want = 4 * np.einsum("ik,mckl,jl->ijmc", gt, g.astype(np.float64), gt).reshape(16, 3, 2)
    np.testing.assert_array_equal(qwinograd.transformed_weights(g), want)
    worst = qwinograd.transformed_weights(np.full((1, 1, 3, 3), -128))
    assert np.abs(worst).max() == 9 * 128 < 2 ** 15
