"""A split pointwise (1x1) convolution shares out its blocks of filters when they divide
evenly among the tasks, else its input's column panels (conv.pointwise_splits_rows):
against onnxruntime, and bit for bit across thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort


@pytest.mark.parametrize("filters,channels,hw", [(4, 24, 320), (24, 96, 56), (12, 64, 80), (64, 32, 56)])
def test_pointwise_split_matches_onnxruntime_and_one_thread(filters, channels, hw):
    rng = np.random.default_rng(filters)
    x = rng.standard_normal((1, channels, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((filters, channels, 1, 1)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(filters).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": bias})
    two = glowgen.compile(model, threads=2)
    assert [s.parts for s in two.program.plan.steps] == [2], two.program.plan.describe()
    y2 = two.run({"x": x})["y"]
    assert_close({"y": y2}, run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    for threads in (1, 3):
        np.testing.assert_array_equal(glowgen.compile(model, threads=threads).run({"x": x})["y"], y2)
