"""Intra-op threads: every kernel that splits its work gives, for any number of threads, the
same bits as one thread, and matches onnxruntime.  Each model below is sized so that the
kernel it is about is really split (the test checks the step appears among the split ones),
including ragged shares (3 threads over counts that 3 does not divide)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowgen
from glowgen.errors import GlowgenError

from conftest import make_model, require_bench_dir, run_ort

import onnx

RNG = np.random.default_rng(11)


def _w(*shape, scale=0.1):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _conv(x_shape, w_shape, name, **attrs):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, {"x": np.zeros(x_shape, np.float32)}, ["y"],
                      {"w": _w(*w_shape), "b": _w(w_shape[0])}), name


def _models():
    yield _conv((1, 32, 56, 56), (64, 32, 3, 3), "Conv", pads=[1, 1, 1, 1])            # im2col panels
    yield _conv((1, 64, 56, 56), (72, 64, 1, 1), "Conv")                               # pointwise, by filters
    yield _conv((1, 96, 56, 56), (96, 1, 3, 3), "Conv", pads=[1, 1, 1, 1], group=96)    # depthwise planes
    yield _conv((1, 256, 7, 7), (200, 256, 3, 3), "Conv", pads=[1, 1, 1, 1])           # transposed product
    yield _conv((1, 64, 112, 112), (64, 64, 3, 3), "Conv", pads=[1, 1, 1, 1])          # panel by panel
    yield make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                     {"x": np.zeros((1, 45, 112, 112), np.float32)}, ["y"]), "MaxPool"
    yield make_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1])],
                     {"x": np.zeros((1, 45, 64, 64), np.float32)}, ["y"]), "AvgPool"
    yield make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                     {"a": np.zeros((3, 128, 96), np.float32), "b": np.zeros((3, 96, 160), np.float32)},
                     ["y"]), "BatchMatMul"                                                  # by batch
    yield make_model([helper.make_node("MatMul", ["a", "w"], ["y"])],
                     {"a": np.zeros((40, 512), np.float32)}, ["y"], {"w": _w(512, 1000)}), "BatchMatMul"  # packed panels
    yield make_model([helper.make_node("MatMul", ["a", "c"], ["y"])],
                     {"a": np.zeros((203, 300), np.float32), "c": np.zeros((300, 120), np.float32)},
                     ["y"]), "BatchMatMul"                                                  # by row blocks
    yield make_model([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])],
                     {"x": np.zeros((100_003,), np.float32)}, ["y"]), "Tanh+Mul"           # a flat loop
    yield make_model([helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
                      helper.make_node("Mul", ["e", "x"], ["y"])],
                     {"x": np.zeros((1, 37, 61, 67), np.float32)}, ["y"], {"b": _w(1, 37, 1, 1)}), "Add+Erf+Mul"
    yield make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=3)],                  # by outer rows
                     {"x": np.zeros((1, 45, 80, 80), np.float32)}, ["y"],
                     {"i": np.repeat(np.arange(80), 2).astype(np.int64)}), "Gather"
    yield make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 2, 4, 3, 5])],    # pixel shuffle
                     {"x": np.zeros((1, 24, 81, 2, 80, 2), np.float32)}, ["y"]), "Transpose"
    yield make_model([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)],                 # each input's share
                     {"a": np.zeros((1, 40, 90, 90), np.float32), "b": np.zeros((1, 17, 90, 90), np.float32)},
                     ["y"]), "Concat"


def _feeds(model):
    return {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}}


@pytest.mark.parametrize("model,kind", list(_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_split_kernels_give_the_same_bits_for_any_thread_count(model, kind):
    feeds = _feeds(model)
    one = glowgen.compile(model, threads=1).run(feeds)
    for threads in (2, 3):
        compiled = glowgen.compile(model, threads=threads)
        split = compiled._runner.split_steps
        assert any(name.startswith(kind) for name, _ in split), (kind, split)
        many = compiled.run(feeds)
        for k in one:
            assert np.array_equal(one[k], many[k]), f"{kind}: {threads} threads differ from 1"
    expected = run_ort(model, feeds)
    for k in expected:
        np.testing.assert_allclose(one[k], expected[k], rtol=1e-4, atol=1e-4)


def test_threads_must_be_a_positive_integer():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros((4,), np.float32)}, ["y"])
    for bad in (0, -2, 1.5, "2", True):
        with pytest.raises(GlowgenError, match="threads must be a positive integer"):
            glowgen.compile(model, threads=bad)
    assert glowgen.compile(model).options["threads"] >= 1          # default: this machine's cores


def test_a_model_too_small_to_gain_runs_without_workers():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros((64,), np.float32)}, ["y"])
    compiled = glowgen.compile(model, threads=4)
    assert compiled._runner.split_steps == [] and compiled._runner.pool is None


# Each bench model at one and two threads, bit for bit: in test_bench_models.py, beside its
# check against onnxruntime (one compile fewer per model).
