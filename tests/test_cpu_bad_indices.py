"""Native code never reads or writes outside a buffer, whatever indices a model is fed:
the cpu backend's gathers clamp an out-of-range run-time index into its dimension, its
scatters skip the update (see backends/cpu/kernels/gather_scatter.py)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from conftest import make_model, run_glowgen

X = np.arange(12, dtype=np.float32).reshape(3, 4)
BIG = 1 << 40


def _run(op, inputs, **attrs):
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    return run_glowgen(make_model([node], inputs, ["y"]), inputs, backend="cpu")["y"]


def test_gather_elements_clamps():
    idx = np.array([[0, 7, -9, BIG]] * 3, np.int64)
    y = _run("GatherElements", {"x": X, "i": idx}, axis=1)
    np.testing.assert_array_equal(y, np.take_along_axis(X, np.array([[0, 3, 0, 3]] * 3), axis=1))


def test_gather_nd_clamps():
    idx = np.array([[5, -1], [-BIG, 2]], np.int64)
    y = _run("GatherND", {"x": X, "i": idx})
    np.testing.assert_array_equal(y, [X[2, 3], X[0, 2]])


def test_scatter_elements_skips():
    idx = np.array([[4, -5, 1, BIG]], np.int64)
    upd = np.full((1, 4), -1, np.float32)
    y = _run("ScatterElements", {"x": X, "i": idx, "u": upd}, axis=1)
    expect = X.copy()
    expect[0, 1] = -1
    np.testing.assert_array_equal(y, expect)


def test_scatter_nd_skips():
    idx = np.array([[3], [-4], [-1], [BIG]], np.int64)
    upd = np.full((4, 4), -1, np.float32)
    y = _run("ScatterND", {"x": X, "i": idx, "u": upd})
    expect = X.copy()
    expect[2] = -1
    np.testing.assert_array_equal(y, expect)


def test_one_hot_out_of_range_is_cold():
    idx = np.array([0, 3, -1, 9, -9], np.int64)
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"])
    inits = {"depth": np.array(3, np.int64), "values": np.array([0, 1], np.float32)}
    model = make_model([node], {"i": idx}, ["y"], inits)
    y = run_glowgen(model, {"i": idx}, backend="cpu")["y"]
    np.testing.assert_array_equal(y, [[1, 0, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]])
