"""Row fusion (glowgen/backends/cpu/rows.py) and the row reductions it runs: steps that work
row by row over the same rows run block by block; checked against onnxruntime (and NumPy
for the signs of zero extremes), and bit for bit across thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort


def _groups(compiled):
    return [s for s in compiled.program.plan.steps if s.members]


def _softmax_input(shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    rows = x.reshape(-1, shape[-1])
    rows[1, 5] = np.nan                     # a NaN row: all NaN
    rows[2, :] = -np.inf                    # all -inf: NaN (0/0), as onnxruntime
    rows[3, 7] = np.inf                     # an inf: NaN except where inf - inf
    rows[4, :] = 0.0                        # equal values: uniform
    rows[5, :] = -0.0
    rows[6, ::2] = 1e30                     # large values
    return x


@pytest.mark.parametrize("shape", [(4, 128, 128), (3, 100, 77), (64, 1000)])
def test_softmax_row_group_matches_onnxruntime(shape):
    x = _softmax_input(shape)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": x}, ["y"])
    compiled = glowgen.compile(model, threads=1)
    assert _groups(compiled), "softmax did not become a row group"
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum"])
def test_row_reduction_in_a_group_matches(op):
    """A reduction then an elementwise use of it (a group), with NaNs, infinities and
    zeros of both signs; extremes of zeros follow llvm.maximum / minimum (+0 above -0)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((96, 160)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, :] = -0.0
    x[2, :] = 0.0
    x[2, 150] = -0.0
    x[3, :] = -0.0
    x[3, 9] = 0.0
    x[4, 11] = np.inf
    x[5, 12] = -np.inf
    x[6, :] = -np.inf
    x[7, :] = -x[7, :] ** 2                 # all negative: the extreme is no zero
    x[7, 100] = -0.0                        # ... except one
    nodes = [helper.make_node(op, ["x", "axes"], ["r"], keepdims=1),
             helper.make_node("Sub", ["x", "r"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y", "r"], {"axes": np.array([1], np.int64)}, opset=18)
    compiled = glowgen.compile(model, threads=1)
    assert _groups(compiled)
    got = compiled.run({"x": x})
    if op == "ReduceSum":
        assert_close(got, run_ort(model, {"x": x}), rtol=1e-5, atol=1e-5)
        return
    r = got["r"][:, 0]
    fold = np.maximum if op == "ReduceMax" else np.minimum
    np.testing.assert_array_equal(r, fold.reduce(x, axis=1))     # NaN where a NaN is
    # Zero extremes: +0 is the larger zero, whatever the order of the zeros.
    for row in (1, 2, 3, 7):
        zeros = x[row][x[row] == 0]
        if op == "ReduceMax":
            want_neg = bool(np.all(np.signbit(zeros)))
        else:
            want_neg = bool(np.any(np.signbit(zeros)))
        if row == 7 and op == "ReduceMin":
            continue                                 # its minimum is no zero
        assert r[row] == 0 and bool(np.signbit(r[row])) == want_neg, (op, row, r[row])
    assert_close({"y": got["y"]}, {"y": x - got["r"]})


@pytest.mark.parametrize("shape", [(4, 128, 128), (37, 200)])
def test_row_group_same_bits_for_any_thread_count(shape):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": x}, ["y"])
    one = glowgen.compile(model, threads=1)
    two = glowgen.compile(model, threads=2)
    assert _groups(two) and any(s.parts > 1 for s in _groups(two))
    np.testing.assert_array_equal(one.run({"x": x})["y"], two.run({"x": x})["y"])


def test_layer_norm_in_a_row_group_matches_onnxruntime():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 256)).astype(np.float32)
    g, b = rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)
    model = make_model([node], {"x": x}, ["y"], {"g": g, "b": b})
    compiled = glowgen.compile(model, threads=2)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-5)
