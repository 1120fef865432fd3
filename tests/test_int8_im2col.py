"""The int8 product's im2col plane (qplanes.build_im2col_plane): a convolution of fewer
input channels than a plane element holds (a stem from 3 with VNNI's and ubsw's 4, one
channel with madd16's 2) sums the window's values, channel by tap, packed G to an element,
in place of one element of mostly padding per tap.  Exactly as the NumPy reference of
test_int8_kernels, bit for bit at 1, 2 and 3 threads: the element rows' vector steps (rows
wide enough) and their edges one value at a time, strides, dilations, asymmetric padding,
windows past the image, a split among threads (each task building its own rows' windows)."""
from __future__ import annotations

import numpy as np
import pytest

from glowgen.backends.cpu.kernels.qlinalg import Geometry
from glowgen.backends.cpu.qgemm import QShape
from conftest import HOST_AND_AVX2
from test_int8_kernels import _AVX512BW, _compile, conv_case

CPUS = HOST_AND_AVX2 + (["x86-64-v4"] if _AVX512BW else [])
SEVEN_BITS = np.arange(-64, 64)         # ubsw's weights on AVX2 (test_int8_ubsw)

CASES = [
    # n, c, h, w, m, k, strides, pads, dilations
    (1, 3, 12, 70, 8, 3, (2, 2), (1, 1, 1, 1), (1, 1)),       # MobileNetV2's stem, rows of vector steps
    (2, 3, 9, 11, 5, 3, (1, 1), (1, 1, 1, 1), (1, 1)),        # rows narrower than a step
    (1, 2, 6, 40, 6, 3, (1, 1), (0, 1, 2, 1), (1, 2)),        # dilated columns, asymmetric pads
    (1, 1, 17, 50, 7, 5, (2, 3), (2, 0, 3, 1), (2, 1)),       # one channel: madd16's too
    (1, 3, 30, 64, 10, 7, (2, 2), (3, 3, 3, 3), (1, 1)),      # ResNet's 7x7 stem
    (1, 3, 160, 160, 32, 3, (2, 2), (1, 1, 1, 1), (1, 1)),    # split among threads
]


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seven_bits", [False, True])
def test_im2col_conv_exact(case, cpu, seven_bits):
    values = dict(w_values=SEVEN_BITS) if seven_bits else {}
    text, feeds, want = conv_case(np.random.default_rng(400 + case), *CASES[case], **values)
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        (ins,) = [i for i in model.program.instrs if i.kind == "QuantizedConv"]
        qs = QShape(ins.plan.strategy)
        assert Geometry(ins.node, qs).im2col == (CASES[case][1] < qs.group), qs.kind
        if threads == 2 and case == len(CASES) - 1:
            # shared out by pixels, each task building its own output rows' windows in one
            # round (qlinalg.owns_pixels): the plane is far larger than the weights
            (step,) = [s for s in model.program.plan.steps if s.instrs[0].kind == "QuantizedConv"]
            assert (step.parts, step.phases) == (2, 1), model.program.plan.describe()
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()


ROW_CASES = [
    # n, c, h, w, m, k, strides, pads, dilations: windows whose rows are whole elements
    (1, 3, 40, 128, 16, 7, (2, 2), (3, 3, 3, 3), (1, 1)),     # ResNet's stem: 64 pixels a row
    (2, 2, 21, 75, 5, 7, (2, 2), (2, 3, 4, 1), (2, 1)),       # asymmetric pads, dilated rows
    (1, 3, 10, 40, 6, 7, (1, 1), (3, 3, 3, 3), (1, 1)),       # stride 1
    (1, 3, 16, 64, 8, 4, (4, 4), (0, 0, 0, 0), (1, 1)),       # a patchify stem: rows of one element
    (1, 3, 96, 224, 24, 7, (2, 2), (3, 3, 3, 3), (1, 1)),     # split among threads
    (1, 3, 30, 90, 12, 7, (2, 2), (3, 3, 3, 3), (1, 1)),      # 45 pixels a row: steps across panels
    (2, 3, 64, 128, 32, 7, (2, 2), (3, 3, 3, 3), (1, 1)),     # two images: split by filters, every band
    (1, 3, 36, 132, 8, 8, (4, 4), (0, 0, 0, 0), (1, 1)),      # runs of a row past one load: a load each
]


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("case", range(len(ROW_CASES)))
def test_row_element_conv_exact(case, cpu):
    """With VNNI's 512-bit products, a window whose rows pad to whole elements at little cost
    (ResNet's 7x7 stem: 42 elements for 37) takes G columns of one row an element, built 16
    pixels a step from one masked load of the input row (qplanes.build_row_element_plane):
    exactly the NumPy reference, at the image's edges and past them, at 1, 2 and 3 threads,
    the plane panel by panel where rows are whole steps of 16 pixels; the other targets'
    plain im2col plane likewise."""
    text, feeds, want = conv_case(np.random.default_rng(500 + case), *ROW_CASES[case])
    results = []
    for threads in (1, 2, 3):
        model, _ = _compile(text, cpu, threads)
        (ins,) = [i for i in model.program.instrs if i.kind == "QuantizedConv"]
        qs = QShape(ins.plan.strategy)
        geo = Geometry(ins.node, qs)
        assert geo.im2col == (ROW_CASES[case][1] < qs.group) and geo.row_elements == (qs.kind == "vnni"), qs.kind
        assert geo.panel_major == (geo.row_elements and geo.ow % 16 == 0)
        if case == len(ROW_CASES) - 1 and geo.row_elements:     # 4 x 15 + 2 runs x 4 > 64 bytes
            assert geo.panel_major and geo.row_values // qs.group == 2
        results.append(model.run(feeds)["y"])
        np.testing.assert_array_equal(results[-1], want)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()
