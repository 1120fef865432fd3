"""Strided ConvTranspose as one small convolution per output phase, each with only its own
taps (specs/lowerings.glowdef: convtranspose_phases_to_convs): against onnxruntime, with
bias and a fused activation, and bit for bit across thread counts."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (x shape, w shape [C, M, KH, KW], attrs, activation)
    "3x3/2 pad 1 out_pad 1 (even out)": ((1, 16, 9, 9), (16, 24, 3, 3),
                                         {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, None),
    "3x3/2 pad 1 (odd out)": ((1, 16, 9, 10), (16, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "Relu"),
    "3x3/2 no pads, batch 2": ((2, 8, 7, 6), (8, 16, 3, 3), {"strides": [2, 2]}, None),
    "3x3/2 uneven pads": ((1, 12, 8, 11), (12, 20, 3, 3),
                          {"strides": [2, 2], "pads": [0, 2, 1, 0], "output_padding": [1, 0]}, "Sigmoid"),
    "3x3/2 pads past a tap (input cut)": ((1, 8, 10, 9), (8, 16, 3, 3), {"strides": [2, 2], "pads": [3, 2, 3, 4]},
                                          None),
    "3x3/2 64->64 @28, like the layer bench": ((1, 64, 28, 28), (64, 64, 3, 3),
                                               {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
                                               "Relu"),
    "5x5/3 stride 3 pad 2": ((1, 6, 7, 8), (6, 10, 5, 5),
                             {"strides": [3, 3], "pads": [2, 2, 2, 2], "output_padding": [2, 1]}, None),
    "3x2/2 mixed kernel, no bias": ((1, 5, 6, 7), (5, 7, 3, 2), {"strides": [2, 2], "pads": [1, 0, 0, 1]}, None),
    "stride 2x1": ((1, 8, 9, 10), (8, 12, 3, 3), {"strides": [2, 1], "pads": [1, 1, 1, 1]}, "Relu"),
}


def _model(case, seed=0):
    xs, ws, attrs, act = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(ws[0] * ws[2] * ws[3])).astype(np.float32)
    consts = {"w": w}
    inputs = ["x", "w"]
    if "no bias" not in case:
        consts["b"] = rng.standard_normal(ws[1]).astype(np.float32)
        inputs.append("b")
    nodes = [helper.make_node("ConvTranspose", inputs, ["c" if act else "y"], kernel_shape=list(ws[2:]), **attrs)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    return make_model(nodes, {"x": x}, ["y"], consts), x


def _convs(compiled):
    return [ins.node.inputs[1].type.shape[2:] for s in compiled.program.plan.steps for ins in s.instrs
            if ins.kind == "Conv"]


@pytest.mark.parametrize("case", list(CASES))
def test_phases_match_onnxruntime(case):
    model, x = _model(case)
    compiled = glowgen.compile(model, threads=1)
    xs, ws, attrs, _ = CASES[case]
    s = attrs["strides"]
    # One convolution per phase, with only its taps: no zero taps multiplied.
    kernels = _convs(compiled)
    assert len(kernels) == s[0] * s[1], compiled.program.plan.describe()
    assert sum(kh * kw for kh, kw in kernels) == ws[2] * ws[3], kernels
    if CASES[case][3] == "Relu":          # the activation sinks into each phase's store
        assert all("epilogue Relu" in line for line in compiled.program.plan.describe() if "Conv" in line)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["3x3/2 pad 1 out_pad 1 (even out)", "3x3/2 pad 1 (odd out)",
                                  "3x3/2 64->64 @28, like the layer bench", "stride 2x1"])
def test_phases_same_bits_for_any_thread_count(case):
    model, x = _model(case, seed=1)
    one = glowgen.compile(model, threads=1)
    two = glowgen.compile(model, threads=2)
    np.testing.assert_array_equal(one.run({"x": x})["y"], two.run({"x": x})["y"])


@pytest.mark.parametrize("kernel, pads, act", [((1, 3), [0, 1, 0, 1], None), ((4, 4), [1, 1, 1, 1], "Relu"),
                                               ((4, 2), [1, 0, 2, 1], None)])
def test_other_kernels_keep_one_product_over_the_phases(kernel, pads, act):
    """A kernel narrower than its stride (1x3 at stride 2: row phases without taps) or a
    multiple of it (4x4 at stride 2: no zero taps) stays one Conv over all phases
    (convtranspose_phases_to_conv)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 8, 9, 10)).astype(np.float32)
    w = rng.standard_normal((8, 6, *kernel)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c" if act else "y"], strides=[2, 2], pads=pads)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b})
    compiled = glowgen.compile(model, threads=1)
    assert len(_convs(compiled)) == 1
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    two = glowgen.compile(model, threads=2)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], two.run({"x": x})["y"])


def _sweep(count: int, seed: int):
    """Seeded random ConvTransposes (strides 2-3, kernels 2-5, pads up to past the kernel,
    every output_padding below the stride), those with an output: phases or not."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        s = [int(v) for v in rng.integers(2, 4, 2)]
        k = [int(v) for v in rng.integers(2, 6, 2)]
        pads = [int(rng.integers(0, k[i % 2] + 3)) for i in range(4)]
        op = [int(rng.integers(0, s[i])) for i in range(2)]
        x = [int(v) for v in rng.integers(1, 8, 2)]
        if all(s[i] * (x[i] - 1) + op[i] + k[i] - pads[i] - pads[i + 2] >= 1 for i in range(2)):
            out.append((s, k, pads, op, x))
    return out


@pytest.mark.parametrize("s, k, pads, op, x", _sweep(24, 18))
def test_random_configurations_match_onnxruntime(s, k, pads, op, x):
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((1, 3, *x)).astype(np.float32)
    consts = {"w": rng.standard_normal((3, 4, *k)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    model = make_model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=s, pads=pads,
                                         output_padding=op)], {"x": xv}, ["y"], consts)
    assert_close(glowgen.compile(model, threads=1).run({"x": xv}), run_ort(model, {"x": xv}), rtol=1e-4, atol=1e-4)
