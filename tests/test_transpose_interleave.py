"""Transposes whose output interleaves a few input rows (pixel shuffles: the output's
innermost dimension short and read across the input) move whole vectors and interleave
them in registers (cpu kernels/movement.py): exact against onnxruntime, for 1 and 2
threads, with ragged row ends, 2 to 4 rows, 4-byte integers and NaN payloads."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import make_model, run_ort

CASES = {
    # name: (x shape, perm)
    "pixel shuffle 2x2, rows of 28": ((1, 2, 2, 64, 28, 28), [0, 3, 4, 1, 5, 2]),
    "pixel shuffle 2x2, rows of 160": ((1, 24, 2, 2, 160, 160), [0, 1, 4, 2, 5, 3]),
    "three rows, ragged": ((3, 5, 7, 37), [1, 2, 3, 0]),
    "four rows": ((4, 6, 9, 50), [1, 2, 3, 0]),
    "two rows, one flat loop, ragged": ((2, 40001), [1, 0]),
    "rows shorter than a vector (element by element)": ((2, 3, 5), [1, 2, 0]),
}


def _model(case, dtype=np.float32):
    shape, perm = CASES[case]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    if dtype == np.float32:       # NaNs with payloads and signs: moved bit for bit
        x.reshape(-1)[::97] = np.array([0x7fc12345, 0xffa00001], np.uint32).view(np.float32)[0]
    model = make_model([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], {"x": x}, ["y"])
    return model, x


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_interleaving_transpose_is_exact(case, threads):
    model, x = _model(case)
    got = glowgen.compile(model, threads=threads).run({"x": x})["y"]
    want = run_ort(model, {"x": x})["y"]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16])
def test_other_element_types(dtype):
    model, x = _model("three rows, ragged", dtype)
    got = glowgen.compile(model, threads=2).run({"x": x})["y"]
    np.testing.assert_array_equal(got, run_ort(model, {"x": x})["y"])
