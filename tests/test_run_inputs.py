"""Every form of a valid input array reaches the compiled code as its values: arrays passed by
pointer (C-contiguous, aligned: writable ones through the buffer protocol, read-only ones
through NumPy's ctypes interface) and arrays copied first (Fortran order, strided views,
misaligned data), through run()'s quick test of its feeds or through check_feeds (an
ndarray subclass, a mapping that is not a dict).  Held to ONNX's reference evaluator; the caller's
arrays are left as they were."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import glowgen

from conftest import make_model

SHAPE = (3, 4, 5)


@pytest.fixture(scope="module")
def model():
    x = np.zeros(SHAPE, np.float32)
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "w"], ["y"])]
    w = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    onnx_model = make_model(nodes, {"x": x}, ["y"], {"two": np.float32(2.0), "w": w})
    return glowgen.compile(onnx_model), ReferenceEvaluator(onnx_model)


def _values():
    return np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)


def _read_only():
    a = _values()
    a.flags.writeable = False
    return a


def _strided():
    wide = np.zeros((3, 4, 10), np.float32)
    wide[:, :, ::2] = _values()
    return wide[:, :, ::2]


def _misaligned():
    raw = np.zeros(_values().nbytes + 1, np.uint8)
    a = raw[1:].view(np.float32).reshape(SHAPE)
    a[...] = _values()
    return a


FORMS = {
    "contiguous": _values,
    "read-only": _read_only,
    "fortran order": lambda: np.asfortranarray(_values()),
    "strided view": _strided,
    "misaligned": _misaligned,
}


@pytest.mark.parametrize("form", list(FORMS))
def test_input_array_forms(model, form):
    compiled, reference = model
    x = FORMS[form]()
    before = x.copy()
    (want,) = reference.run(None, {"x": np.ascontiguousarray(x)})
    for _ in range(2):                      # the second call reuses the first's context
        got = compiled.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x, before)


class _Subclass(np.ndarray):
    pass


@pytest.mark.parametrize("feeds", ["an ndarray subclass", "an OrderedDict"])
def test_feeds_that_check_feeds_passes(model, feeds):
    compiled, reference = model
    x = _values()
    (want,) = reference.run(None, {"x": x})
    given = {"an ndarray subclass": {"x": x.view(_Subclass)}, "an OrderedDict": OrderedDict(x=x)}[feeds]
    np.testing.assert_allclose(compiled.run(given)["y"], want, rtol=1e-6, atol=1e-6)
