"""Convolutions with few filters per group read their patch matrix in place from the padded
planes, columns dealt by their remainder mod the column stride (conv strategy gemm-planes:
gemm.emit_gemm's b_table): against onnxruntime, and bit for bit across thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from glowgen.backends.cpu.kernels.conv import planes_band
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (x shape, w shape, attrs, relu); output rows that fill the tiles (conv_reads_planes)
    # (92 channels: 96, in whole blocks of 8, are channel-blocked on AVX2, in 24-filter panels)
    "92->24 3x3 pad 1 relu": ((1, 92, 64, 64), (24, 92, 3, 3), {"pads": [1, 1, 1, 1]}, True),
    "ragged last tile, batch 2": ((2, 5, 40, 62), (8, 5, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    "row stride 2": ((1, 6, 121, 31), (12, 6, 3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 1]}, True),
    "dilated, uneven pads": ((1, 4, 70, 34), (16, 4, 3, 3), {"pads": [0, 1, 2, 1], "dilations": [2, 2]}, False),
    "groups": ((1, 32, 32, 32), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}, True),
    "5x5 8 filters": ((1, 8, 50, 60), (8, 8, 5, 5), {"pads": [2, 2, 2, 2]}, False),
    "2x2 no padding": ((1, 16, 40, 33), (9, 16, 2, 2), {}, False),
    # Column strides: every tap reads its sub-plane of dealt columns in place.
    "stem 3->16 3x3/2, HardSwish": ((1, 3, 130, 250), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]},
                                    "HardSwish"),
    "stride 2 ragged rows, batch 2": ((2, 3, 99, 119), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]},
                                      True),
    "5x5/2 uneven pads": ((1, 4, 50, 126), (8, 4, 5, 5), {"pads": [2, 1, 1, 2], "strides": [2, 2]}, False),
    "3x3/3 no padding": ((1, 3, 130, 190), (12, 3, 3, 3), {"strides": [3, 3]}, True),
    # Many filters, but a tile's few patch rows read in place stay in L1 (in_place_rows_fit_l1).
    "7x7/2 stem, 64 filters": ((1, 3, 96, 120), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, True),
    "16 -> 40 3x3": ((1, 16, 40, 64), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    # Planes over 512 KB, dealt a band of output rows at a time (conv.planes_band).
    "bands, stride 2, ragged last band": ((1, 3, 400, 250), (16, 3, 3, 3), {"pads": [2, 1, 0, 1], "strides": [2, 2]},
                                          "HardSwish"),
    "bands, stride 1, batch 2": ((2, 2, 300, 300), (8, 2, 3, 3), {"pads": [1, 1, 1, 1]}, True),
}
BANDED = ["92->24 3x3 pad 1 relu", "bands, stride 2, ragged last band", "bands, stride 1, batch 2"]


def _model(case, seed=0):
    xs, ws, attrs, act = CASES[case]          # act: True for Relu, or another op's name
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.2).astype(np.float32)
    bias = rng.standard_normal(ws[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], **attrs)]
    if act:
        nodes.append(helper.make_node("Relu" if act is True else act, ["c"], ["y"]))
    return make_model(nodes, {"x": x}, ["y"], {"w": w, "b": bias}), x


def _strategies(compiled):
    return [ins.plan.strategy for s in compiled.program.plan.steps for ins in s.instrs
            if ins.kind == "Conv" and ins.plan is not None]


@pytest.mark.parametrize("case", list(CASES))
def test_gemm_planes_matches_onnxruntime(case):
    model, x = _model(case)
    compiled = glowgen.compile(model, threads=1)
    assert _strategies(compiled) == ["gemm-planes"], compiled.program.plan.describe()
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["row stride 2", "groups", "stride 2 ragged rows, batch 2",
                                  "stem 3->16 3x3/2, HardSwish"] + BANDED)
def test_gemm_planes_same_bits_for_any_thread_count(case):
    model, x = _model(case, seed=1)
    one = glowgen.compile(model, threads=1)
    two = glowgen.compile(model, threads=2)
    assert any(s.parts > 1 for s in two.program.plan.steps) or case != "92->24 3x3 pad 1 relu"
    np.testing.assert_array_equal(one.run({"x": x})["y"], two.run({"x": x})["y"])


@pytest.mark.parametrize("case", list(CASES))
def test_planes_dealt_by_bands_when_large(case):
    model, _ = _model(case)
    compiled = glowgen.compile(model, threads=1)
    conv = next(ins for s in compiled.program.plan.steps for ins in s.instrs if ins.kind == "Conv")
    assert (planes_band(conv.node, compiled.program.plan.gemm_shape.vw) is not None) == (case in BANDED)


def test_narrow_rows_keep_the_patch_matrix():
    """Rows much narrower than a tile would leave most of its columns idle."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 80, 12)).astype(np.float32)
    w = (rng.standard_normal((16, 64, 3, 3)) * 0.1).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"], {"w": w})
    compiled = glowgen.compile(model, threads=1)
    assert "gemm-planes" not in _strategies(compiled)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_many_filters_keep_the_copied_panels():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64, 40, 40)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) * 0.1).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"], {"w": w})
    compiled = glowgen.compile(model, threads=1)
    assert "gemm-planes" not in _strategies(compiled)
