"""ConvTranspose with a KH x 2 kernel equal to its stride (2x2 stride 2): one matrix product
whose store interleaves the two column taps into the output rows
(backends/cpu/kernels/conv_transpose_gemm.py), with the bias and a fused activation in that
store: against onnxruntime, and bit for bit across thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (x shape [N, C, H, W], filters M, kernel rows KH, activation, bias)
    "24->24, rows of whole vectors": ((1, 24, 16, 32), 24, 2, None, True),
    "batch 2, ragged rows, Relu": ((2, 5, 9, 21), 7, 2, "Relu", True),
    "narrow image, HardSwish, no bias": ((1, 3, 5, 3), 4, 2, "HardSwish", False),
    "3x2 kernel, stride 3x2": ((1, 8, 7, 40), 6, 3, None, True),
    "filter rows past whole tiles, batch 2": ((2, 20, 11, 37), 13, 2, "Relu", True),
    "one input row": ((1, 16, 1, 70), 9, 2, "LeakyRelu", True),
}


def _model(case, seed=0):
    xs, m, kh, act, bias = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    consts = {"w": (rng.standard_normal((xs[1], m, kh, 2)) / np.sqrt(xs[1] * kh * 2)).astype(np.float32)}
    inputs = ["x", "w"]
    if bias:
        consts["b"] = rng.standard_normal(m).astype(np.float32)
        inputs.append("b")
    nodes = [helper.make_node("ConvTranspose", inputs, ["c" if act else "y"], strides=[kh, 2])]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    return make_model(nodes, {"x": x}, ["y"], consts), x


def _kernels(compiled):
    """(kind, strategy) of every instruction the compiled program runs."""
    return [(ins.kind, ins.plan.strategy if ins.plan else None)
            for step in compiled.program.plan.steps for ins in step.instrs]


@pytest.mark.parametrize("case", list(CASES))
def test_interleaved_product_matches_onnxruntime(case):
    model, x = _model(case)
    compiled = glowgen.compile(model, threads=1)
    kernels = _kernels(compiled)
    # One product, the shuffle in its store: no Conv, no Transpose pass after it.
    assert ("ConvTranspose", "interleaved") in kernels, kernels
    assert not any(kind in ("Conv", "Transpose") for kind, _ in kernels), kernels
    if CASES[case][3]:
        assert any("epilogue" in line for line in compiled.program.plan.describe()), compiled.program.plan.describe()
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_interleaved_same_bits_for_any_thread_count(case):
    model, x = _model(case, seed=1)
    one = glowgen.compile(model, threads=1)
    two = glowgen.compile(model, threads=2)
    np.testing.assert_array_equal(one.run({"x": x})["y"], two.run({"x": x})["y"])


def test_shared_weights_read_unpacked():
    """Two ConvTransposes reading one weight tensor: it cannot be repacked for either, and
    the product reads the filters in their own [C, M * KH * 2] layout."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 6, 8, 19)).astype(np.float32)
    w = rng.standard_normal((6, 5, 2, 2)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c1"], strides=[2, 2]),
             helper.make_node("ConvTranspose", ["x", "w"], ["c2"], strides=[2, 2]),
             helper.make_node("Add", ["c1", "c2"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b})
    compiled = glowgen.compile(model, threads=1)
    assert _kernels(compiled).count(("ConvTranspose", "interleaved")) == 2
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], glowgen.compile(model, threads=2).run({"x": x})["y"])


def test_batchnorm_folds_then_runs_in_the_store():
    """A BatchNormalization and Relu after it: folded into the filters and bias, the Relu
    fused into the interleaving store."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 12, 10, 16)).astype(np.float32)
    m = 8
    consts = {"w": rng.standard_normal((12, m, 2, 2)).astype(np.float32) * 0.2,
              "b": rng.standard_normal(m).astype(np.float32),
              "s": rng.uniform(0.5, 2, m).astype(np.float32), "t": rng.standard_normal(m).astype(np.float32),
              "mu": rng.standard_normal(m).astype(np.float32), "var": rng.uniform(0.5, 2, m).astype(np.float32)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "s", "t", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], consts)
    compiled = glowgen.compile(model, threads=1)
    assert [kind for kind, _ in _kernels(compiled)] == ["ConvTranspose", "Relu"], _kernels(compiled)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
