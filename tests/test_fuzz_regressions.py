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


@pytest.mark.parametrize("backend", BACKENDS)
def test_division_by_a_constant_whose_reciprocal_is_not_normal_stays_a_division(backend):
    # x / c became x * (1 / c): for a denormal c, 1 / c overflows and 0 / c gave NaN; for a
    # huge c, 1 / c is denormal and x / c lost its digits.
    c = np.array([1e-40, -3e-42, 3e38, 2.5, 1e-30, np.inf], np.float32)
    x = np.array([0.0, 1e-42, 1e30, 5.0, 3.0, 7.0], np.float32)
    model = make_model([helper.make_node("Div", ["x", "c"], ["y"])], {"x": x}, ["y"], {"c": c})
    assert_close(run_glowgen(model, {"x": x}, backend=backend), run_ort(model, {"x": x}),
                 rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_reads_what_the_step_before_it_wrote(backend):
    # CumSum -> GatherElements, and a Max of the CumSum as a second output: once LLVM had
    # inlined the steps, its SLP vectorizer sank the CumSum's last stores below the
    # GatherElements reading them, which then read the arena's old zeros (the cpu backend now
    # puts a compiler-only barrier between steps).
    x = np.arange(1, 8, dtype=np.int64)
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"]),
             helper.make_node("GatherElements", ["c", "i"], ["g"], axis=-1),
             helper.make_node("Max", ["c", "x"], ["m"])]
    consts = {"axis": np.array(-1, np.int64), "i": np.array([-6, 5, -7, 0, 3, -3, -7, 6], np.int64)}
    model = make_model(nodes, {"x": x}, ["g", "m"], consts)
    for threads in (1, 2):
        kw = {"threads": threads} if backend == "cpu" else {}
        assert_close(run_glowgen(model, {"x": x}, backend=backend, **kw), run_ort(model, {"x": x}))
