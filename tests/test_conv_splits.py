"""How split convolutions share out their work (conv.conv_work): a pointwise one its blocks
of filters when they divide evenly among the tasks, else its input's column panels; a
transposed one its runs of pixels when it builds patches from planes, else its filter
panels, else runs of pixels; a channel-blocked one its filter panels, else bands of pixels.
Against onnxruntime, and bit for bit across thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (x shape, w shape, attrs, the strategy the cpu backend takes with AVX-512's
    # 16-lane vectors, or None for any)
    "1x1 4 filters @320 (column panels)": ((1, 24, 320, 320), (4, 24, 1, 1), {}, "pointwise"),
    "1x1 24 filters @56 (column panels)": ((1, 96, 56, 56), (24, 96, 1, 1), {}, "pointwise"),
    "1x1 12 filters @80 (column panels)": ((1, 64, 80, 80), (12, 64, 1, 1), {}, "pointwise"),
    "1x1 64 filters @56 (filter blocks)": ((1, 32, 56, 56), (64, 32, 1, 1), {}, "pointwise"),
    # AVX2: over K in blocks of 128 input channels (conv.pointwise_k_block), partial sums in y.
    "1x1 256->64 @20 (filter blocks, blocks of K)": ((1, 256, 20, 20), (64, 256, 1, 1), {}, "pointwise"),
    "1x1 200->12 @56 (column panels, blocks of K)": ((1, 200, 56, 56), (12, 200, 1, 1), {}, "pointwise"),
    # Inputs over 2 MB, few filters: each column panel meets every filter block in turn
    # (conv.pointwise_panels_outer); 40 filters leave AVX2's 6-row tile a block of 4.
    "1x1 48->24 @160 (panels outer)": ((1, 48, 160, 160), (24, 48, 1, 1), {}, "pointwise"),
    "1x1 72->40 @128 (panels outer, ragged rows)": ((1, 72, 128, 128), (40, 72, 1, 1), {}, "pointwise"),
    # (Input channels not in whole blocks of 16: the 3x3 ones are not "blocked".)
    "3x3 248->256 @7 (filter panels)": ((1, 248, 7, 7), (256, 248, 3, 3), {"pads": [1, 1, 1, 1]}, "transposed"),
    # AVX2: 49 pixels in 4 tiles of 6 and 5 of 5 (conv_transposed.pixel_tiles).
    "1x1 512->256 @7 (filter panels)": ((1, 512, 7, 7), (256, 512, 1, 1), {}, "transposed"),
    # Patches from planes, twelve runs of 16 pixels: each task builds its own pixels' only.
    "3x3 60->256 @14 (pixels, patches from planes)": ((1, 60, 14, 14), (256, 60, 3, 3), {"pads": [1, 1, 1, 1]},
                                                      "transposed"),
    "3x3 60->256 @28 stride 2 (pixels)": ((1, 60, 28, 28), (256, 60, 3, 3),
                                          {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "transposed"),
    # Three filter panels: two tasks share out runs of pixels instead (transposed_split_pixels).
    "1x1 576->96 @14 (pixels)": ((1, 576, 14, 14), (96, 576, 1, 1), {}, "transposed"),
    "3x3 60->96 @10 (pixels, ragged)": ((1, 60, 10, 10), (96, 60, 3, 3), {"pads": [1, 1, 1, 1]}, "transposed"),
    "1x1 576->96 @14 batch 2 (pixels)": ((2, 576, 14, 14), (96, 576, 1, 1), {}, "transposed"),
    # Channel-blocked (conv_blocked.blocked_split_pixels): filter panels, or bands of pixels.
    # (Dilated: a stride-1 3x3 over 49 pixels or more is Winograd's with AVX-512.)
    "3x3 256->256 @7 blocked (filter panels)": ((1, 256, 7, 7), (256, 256, 3, 3),
                                                {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, "blocked"),
    "3x3 64->96 @10 blocked (two bands)": ((1, 64, 10, 10), (96, 64, 3, 3), {"pads": [2, 2, 2, 2],
                                                                             "dilations": [2, 2]}, "blocked"),
    # Winograd F(2x2, 3x3) (conv_winograd.py): bands of tile rows (AVX2: blocked)
    "3x3 256->256 @7 winograd (bands)": ((1, 256, 7, 7), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}, "winograd"),
    "3x3/2 32->64 @40 blocked (bands)": ((1, 32, 40, 40), (64, 32, 3, 3), {"pads": [1, 1, 1, 1],
                                                                          "strides": [2, 2]}, "blocked"),
}


def _model(case, seed=0):
    xs, ws, attrs, _ = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
    bias = rng.standard_normal(ws[0]).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    relu = helper.make_node("Relu", ["c"], ["y"])            # a fused epilogue in the store
    return make_model([conv, relu], {"x": x}, ["y"], {"w": w, "b": bias}), x


@pytest.mark.parametrize("case", list(CASES))
def test_split_convolution_matches_onnxruntime_and_every_thread_count(case):
    model, x = _model(case)
    two = glowgen.compile(model, threads=2)
    steps = [(ins.plan.strategy, step.parts) for step in two.program.plan.steps for ins in step.instrs
             if ins.kind == "Conv"]
    assert [parts for _, parts in steps] == [2], two.program.plan.describe()
    if two.program.plan.gemm_shape.vw == 16:      # the strategies the cases were chosen for
        assert steps[0][0] == CASES[case][3], two.program.plan.describe()
    y2 = two.run({"x": x})["y"]
    assert_close({"y": y2}, run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    for threads in (1, 3):              # three tasks share out blocks and runs unevenly
        np.testing.assert_array_equal(glowgen.compile(model, threads=threads).run({"x": x})["y"], y2)


def test_pointwise_panels_outer_where_the_input_is_the_traffic():
    """det_fpn's reducing 1x1 convolutions at 160 x 160 stream their input once; ones with
    more filters than channels, or small inputs, keep rows outer."""
    from glowgen.backends.cpu.gemm import choose_shape
    from glowgen.backends.cpu.kernels.conv import pointwise_panels_outer
    for features in ("+avx512f", "+avx2"):
        shape = choose_shape(features)
        assert pointwise_panels_outer(shape, 24, 72, 160 * 160)
        assert not pointwise_panels_outer(shape, 72, 24, 160 * 160)          # expanding
        assert not pointwise_panels_outer(shape, 16, 32, 112 * 112)          # input 1.6 MB
        assert not pointwise_panels_outer(shape, 256, 1024, 56 * 56)        # filters past L1
