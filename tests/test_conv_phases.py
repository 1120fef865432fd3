"""Split convolutions over one image run in phases (plan.Phases): the tasks fill the padded
input planes together, each its share of the channels, then (transposed) build the patch
matrix together, then compute, each round after the last, in scratch they share.  Against
onnxruntime, bit for bit across thread counts, and phased only where they share data."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (x shape, w shape, attrs, the strategy the cpu backend takes with AVX-512's
    # 16-lane vectors, phases at 2 threads)
    "3x3 64->64 @56 (panels)": ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "gemm-panels", 2),
    "3x3 stride 2 ragged (whole patch matrix)": ((1, 24, 45, 37), (40, 24, 3, 3),
                                                 {"pads": [1, 0, 1, 2], "strides": [2, 2]}, "gemm", 2),
    "3x3 96->24 @32 (planes in place)": ((1, 96, 32, 32), (24, 96, 3, 3), {"pads": [1, 1, 1, 1]}, "gemm-planes", 2),
    # Planes over 512 KB are dealt a band of rows at a time, each task its own rows: unphased.
    "3x3 96->24 @64 (planes in bands)": ((1, 96, 64, 64), (24, 96, 3, 3), {"pads": [1, 1, 1, 1]}, "gemm-planes", 1),
    "3x3 256->256 @7 (transposed)": ((1, 256, 7, 7), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}, "transposed", 3),
    "3x3 stride 2 96->272 @13 (transposed)": ((1, 96, 13, 13), (272, 96, 3, 3),
                                              {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "transposed", 3),
    "1x1 stride 2 256->512 (transposed)": ((1, 256, 14, 14), (512, 256, 1, 1), {"strides": [2, 2]},
                                           "transposed", 3),
    "1x1 512->272 @7 (transposed, pointwise)": ((1, 512, 7, 7), (272, 512, 1, 1), {}, "transposed", 2),
    # Three filter panels: two tasks share out runs of pixels instead (transposed_split_pixels).
    "1x1 576->96 @14 (transposed, by pixels)": ((1, 576, 14, 14), (96, 576, 1, 1), {}, "transposed", 2),
    "3x3 64->96 @10 (transposed, by pixels, ragged)": ((1, 64, 10, 10), (96, 64, 3, 3), {"pads": [1, 1, 1, 1]},
                                                       "transposed", 3),
    "batch 2 (unphased)": ((2, 64, 28, 28), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, None, 1),
    "batch 2 (unphased, transposed by pixels)": ((2, 576, 14, 14), (96, 576, 1, 1), {}, "transposed", 1),
}


def _model(case, seed=0):
    xs, ws, attrs, _, _ = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
    bias = rng.standard_normal(ws[0]).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)
    # A fused epilogue after the product: it runs in the last phase only.
    relu = helper.make_node("Relu", ["c"], ["y"])
    return make_model([conv, relu], {"x": x}, ["y"], {"w": w, "b": bias}), x


# Phases at 2 threads by strategy: planes filled together, then (transposed) the patch
# matrix built together, then the product.
PHASES = {"gemm": 2, "gemm-panels": 2, "gemm-planes": 2, "transposed": 3}


def _conv_steps(compiled):
    return [(ins.plan.strategy, step.phases) for step in compiled.program.plan.steps for ins in step.instrs
            if ins.kind == "Conv" and ins.plan is not None]


@pytest.mark.parametrize("case", list(CASES))
def test_phased_convolution_matches_onnxruntime_and_every_thread_count(case):
    model, x = _model(case)
    strategy, phases = CASES[case][3:]
    two = glowgen.compile(model, threads=2)
    (got_strategy, got_phases), = _conv_steps(two)
    if two.program.plan.gemm_shape.vw == 16:      # the strategies the cases were chosen for
        assert (got_strategy, got_phases) == (strategy or got_strategy, phases), two.program.plan.describe()
    elif phases > 1 and got_phases > 1:           # other tiles may choose other strategies
        pointwise = CASES[case][1][2:] == (1, 1) and "strides" not in CASES[case][2]
        want = PHASES.get(got_strategy, 1) - (pointwise and got_strategy == "transposed")
        assert got_phases == want, two.program.plan.describe()
    y2 = two.run({"x": x})["y"]
    assert_close({"y": y2}, run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    y1 = glowgen.compile(model, threads=1).run({"x": x})["y"]
    np.testing.assert_array_equal(y1, y2)
    # Three tasks share out channels, blocks and panels unevenly.
    np.testing.assert_array_equal(y1, glowgen.compile(model, threads=3).run({"x": x})["y"])


def test_one_thread_is_unphased():
    model, _ = _model("3x3 256->256 @7 (transposed)")
    assert [phases for _, phases in _conv_steps(glowgen.compile(model, threads=1))] == [1]


def test_concurrent_calls_keep_their_shared_scratch_apart():
    """The shared scratch lies in each call's own activation region: two Python threads
    calling one phased model at once get their own answers."""
    from concurrent.futures import ThreadPoolExecutor
    model, _ = _model("3x3 256->256 @7 (transposed)")
    compiled = glowgen.compile(model, threads=2)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 256, 7, 7)).astype(np.float32) for _ in range(6)]
    want = [compiled.run({"x": x})["y"] for x in xs]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda x: compiled.run({"x": x})["y"], xs * 5))
    for i, y in enumerate(got):
        np.testing.assert_array_equal(y, want[i % len(xs)])
