"""Wrong answers and crashes that differential fuzzing (tools/fuzz.py) found, shrunk to one
node each, against onnxruntime on both backends."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import assert_close, make_model, run_glowgen, run_ort

BACKENDS = ["interpreter", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_slice_start_before_the_first_element_clamps_to_it(backend):
    # starts -5 on a dimension of 3 is -2: ONNX clamps a backward slice's start to [0, d - 1],
    # so the slice holds element 0 (glowgen clamped it to -1: an empty slice).
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    consts = {"starts": np.array([-5, 3]), "ends": np.array([-10, 0]), "axes": np.array([0, 1]),
              "steps": np.array([-1, -2])}
    model = make_model([node], {"x": x}, ["y"], consts)
    assert_close(run_glowgen(model, {"x": x}, backend=backend), run_ort(model, {"x": x}))
