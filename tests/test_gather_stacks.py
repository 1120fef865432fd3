"""Gathers with constant indices read by an elementwise stack through their index tables
(glowgen/backends/cpu/stacking.py GatherRead, loops.Indexed), and the linear Resize that
lowers to them (specs rule resize_axis_two_taps): against onnxruntime, and bit for bit across
thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort


def _stacked_gathers(compiled) -> int:
    return sum(ins.kind == "Gather" for s in compiled.program.plan.steps if s.stacked for ins in s.instrs)


def _resize(x, consts, **attrs):
    names = ["x"] + [n if n in consts else "" for n in ("roi", "scales", "sizes")]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return make_model([node], {"x": x}, ["y"], consts, opset=19)


RESIZES = {
    "x2 half_pixel 4d": ((1, 8, 20, 24), {"scales": np.array([1, 1, 2, 2], np.float32)}, {}),
    "x3 asymmetric": ((2, 3, 7, 9), {"scales": np.array([1, 1, 3, 3], np.float32)},
                      {"coordinate_transformation_mode": "asymmetric"}),
    "align_corners sizes": ((1, 4, 10, 13), {"sizes": np.array([1, 4, 17, 29], np.int64)},
                            {"coordinate_transformation_mode": "align_corners"}),
    "down 0.6": ((1, 5, 30, 40), {"scales": np.array([1, 1, 0.6, 0.6], np.float32)}, {}),
    "one axis 2d": ((33, 50), {"scales": np.array([1, 2.5], np.float32)}, {}),
    "pytorch_half_pixel to 1": ((1, 2, 9, 9), {"sizes": np.array([1, 2, 1, 18], np.int64)},
                                {"coordinate_transformation_mode": "pytorch_half_pixel"}),
    "crop extrapolates": ((1, 2, 8, 8), {"roi": np.array([0, 0, -0.2, 0.1, 1, 1, 1.3, 0.9], np.float32),
                                         "sizes": np.array([1, 2, 12, 11], np.int64)},
                          {"coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 2.5}),
}


@pytest.mark.parametrize("case", list(RESIZES))
def test_linear_resize_matches_onnxruntime(case):
    shape, consts, attrs = RESIZES[case]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    model = _resize(x, consts, mode="linear", **attrs)
    compiled = glowgen.compile(model, threads=1)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-5, atol=1e-5)


def test_linear_resize_reads_gathers_in_its_stacks():
    x = np.random.default_rng(1).standard_normal((1, 16, 40, 40)).astype(np.float32)
    model = _resize(x, {"scales": np.array([1, 1, 2, 2], np.float32)}, mode="linear")
    compiled = glowgen.compile(model, threads=1)
    steps = compiled.program.plan.steps
    assert len(steps) == 2 and all(s.stacked for s in steps), compiled.program.plan.describe()
    assert _stacked_gathers(compiled) == 4
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-5, atol=1e-5)


def test_linear_resize_same_bits_for_any_thread_count():
    x = np.random.default_rng(2).standard_normal((1, 24, 64, 48)).astype(np.float32)
    model = _resize(x, {"scales": np.array([1, 1, 2, 2], np.float32)}, mode="linear")
    one = glowgen.compile(model, threads=1)
    two = glowgen.compile(model, threads=2)
    assert any(s.parts > 1 for s in two.program.plan.steps)
    np.testing.assert_array_equal(one.run({"x": x})["y"], two.run({"x": x})["y"])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_constant_gather_in_a_stack(axis):
    """Gather (negative indices too, repeated ones) then elementwise ops; the gathered tensor
    is also an output (the stack stores it)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 7, 40)).astype(np.float32)
    dim = x.shape[axis]
    idx = np.array([0, dim - 1, -1, 2, 2, -dim, 1], np.int64)
    out_shape = list(x.shape)
    out_shape[axis] = len(idx)
    b = rng.standard_normal(out_shape).astype(np.float32)
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=axis),
             helper.make_node("Mul", ["g", "b"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["y"])]
    model = make_model(nodes, {"x": x, "b": b}, ["y", "g"], {"i": idx})
    compiled = glowgen.compile(model, threads=1)
    assert _stacked_gathers(compiled) == 1
    assert_close(compiled.run({"x": x, "b": b}), run_ort(model, {"x": x, "b": b}))


def test_gather_of_a_value_the_stack_computes_is_not_read_through():
    """Gathering along an axis needs other elements of its input: an input this stack
    computes must reach memory first (the gather starts a new stack)."""
    x = np.random.default_rng(4).standard_normal((5, 32)).astype(np.float32)
    idx = np.arange(31, -1, -1, dtype=np.int64)          # reverse: same shape as x
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gather", ["r", "i"], ["g"], axis=1),
             helper.make_node("Sub", ["g", "r"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"i": idx})
    compiled = glowgen.compile(model, threads=2)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}))


def test_gather_alone_keeps_the_gather_kernel():
    x = np.random.default_rng(5).standard_normal((4, 30)).astype(np.float32)
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"x": x}, ["y"],
                       {"i": np.array([3, 1, 4, 1, 5], np.int64)})
    compiled = glowgen.compile(model, threads=1)
    assert _stacked_gathers(compiled) == 0
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}))


def test_rows_gathered_in_a_stack_are_copied_not_gathered_lane_by_lane():
    """Nearest upsampling of rows then a residual Add (det_fpn's top-down path): the
    table's loop is not vectorized (loops.Indexed), so each gathered row is a run of plain
    vector loads.  With AVX-512, LLVM once widened the table's loop into vgather and
    vscatter instructions, 17 times as slow.  Against onnxruntime too."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 96, 20, 40)).astype(np.float32)
    lateral = rng.standard_normal((1, 96, 40, 40)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=2), helper.make_node("Add", ["g", "lateral"], ["y"])]
    model = make_model(nodes, {"x": x, "lateral": lateral}, ["y"], {"i": np.repeat(np.arange(20), 2)})
    compiled = glowgen.compile(model, threads=1)
    assert _stacked_gathers(compiled) == 1
    machine_code = compiled._runner.assembly()
    assert "vgather" not in machine_code and "vscatter" not in machine_code
    assert_close(compiled.run({"x": x, "lateral": lateral}), run_ort(model, {"x": x, "lateral": lateral}))
