"""3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) (conv strategy "winograd",
kernels/conv_winograd.py): against onnxruntime, bit for bit across thread counts, on the
host's vectors and on AVX2 (x86-64-v3: 8-channel blocks, 16-filter panels); and which
convolutions take it."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from glowgen.backends.cpu.kernels.conv_winograd import WinogradGeometry, winograd_weights
from conftest import assert_close, make_model, run_ort

CASES = {
    # name: (x shape, w shape, pads, epilogue): "relu", "add" (Add of a second input, then
    # Relu: a residual block's end) or None
    "64->64 @56 relu (bands of tile rows)": ((1, 64, 56, 56), (64, 64, 3, 3), [1, 1, 1, 1], "relu"),
    "32->32 @31x33 (odd: half tiles), no bias": ((1, 32, 31, 33), (32, 32, 3, 3), [1, 1, 1, 1], None),
    "32->64 @16x14, batch 2, add": ((2, 32, 16, 14), (64, 32, 3, 3), [1, 1, 1, 1], "add"),
    "32->32 @21x30 uneven pads": ((1, 32, 21, 30), (32, 32, 3, 3), [2, 1, 0, 2], "relu"),
    "32->64 @18x19 no padding": ((1, 32, 18, 19), (64, 32, 3, 3), [0, 0, 0, 0], None),
    # Transformed weights past L2 (4 MB): one band per task
    "256->256 @14, weights past L2": ((1, 256, 14, 14), (256, 256, 3, 3), [1, 1, 1, 1], "add"),
    "128->128 @28": ((1, 128, 28, 28), (128, 128, 3, 3), [1, 1, 1, 1], "relu"),
}


def _model(case, seed=0):
    xs, ws, pads, epilogue = CASES[case]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(9 * ws[1])).astype(np.float32)
    inits = {"w": w}
    conv_inputs = ["x", "w"]
    if "no bias" not in case:
        inits["b"] = rng.standard_normal(ws[0]).astype(np.float32)
        conv_inputs.append("b")
    nodes = [helper.make_node("Conv", conv_inputs, ["c" if epilogue else "y"], pads=pads)]
    feeds = {"x": x}
    if epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif epilogue == "add":
        oh, ow = xs[2] + pads[0] + pads[2] - 2, xs[3] + pads[1] + pads[3] - 2
        feeds["r"] = rng.standard_normal((xs[0], ws[0], oh, ow)).astype(np.float32)
        nodes += [helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return make_model(nodes, feeds, ["y"], inits), feeds


def _strategies(compiled):
    return [ins.plan.strategy for s in compiled.program.plan.steps for ins in s.instrs
            if ins.kind == "Conv" and ins.plan is not None]


@pytest.mark.parametrize("cpu", [None, "x86-64-v3"], ids=["host", "x86-64-v3"])
@pytest.mark.parametrize("case", list(CASES))
def test_winograd_matches_onnxruntime(case, cpu):
    model, feeds = _model(case)
    compiled = glowgen.compile(model, threads=1, **({"cpu": cpu} if cpu else {}))
    assert _strategies(compiled) == ["winograd"], compiled.program.plan.describe()
    assert_close(compiled.run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", [None, "x86-64-v3"], ids=["host", "x86-64-v3"])
@pytest.mark.parametrize("case", ["64->64 @56 relu (bands of tile rows)", "32->32 @31x33 (odd: half tiles), no bias",
                                  "32->64 @16x14, batch 2, add", "256->256 @14, weights past L2"])
def test_winograd_same_bits_for_any_thread_count(case, cpu):
    """Tasks share out bands of tile rows (three tasks: bands of unequal size, the last
    one ragged); every tile is computed by the same code whichever task computes it."""
    model, feeds = _model(case, seed=1)
    options = {"cpu": cpu} if cpu else {}
    one = glowgen.compile(model, threads=1, **options).run(feeds)["y"]
    for threads in (2, 3):
        split = glowgen.compile(model, threads=threads, **options)
        assert any(s.parts > 1 for s in split.program.plan.steps)
        np.testing.assert_array_equal(split.run(feeds)["y"], one)


def test_winograd_is_as_accurate_as_a_direct_convolution():
    """Against a float64 convolution, Winograd's error stays within a few times that of
    onnxruntime's direct float32 one (its transforms add inputs before multiplying)."""
    model, feeds = _model("64->64 @56 relu (bands of tile rows)", seed=2)
    ours = glowgen.compile(model, threads=1).run(feeds)["y"].astype(np.float64)
    theirs = run_ort(model, feeds)["y"].astype(np.float64)
    import onnx.numpy_helper as nh
    inits = {t.name: nh.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = np.pad(feeds["x"].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))   # [1, C, 56, 56, 3, 3]
    exact = np.maximum(np.einsum("nchwij,mcij->nmhw", windows, inits["w"]) + inits["b"][None, :, None, None], 0)
    ours_err, theirs_err = np.abs(ours - exact).max(), np.abs(theirs - exact).max()
    assert ours_err <= 4 * theirs_err + 1e-6, (ours_err, theirs_err)


def test_weight_transform_is_exact_on_a_delta_window():
    """U = G g G^T, contracted with the transforms of a window holding one 1 (B^T d B) and
    back (A^T . A), gives the filter's taps: the three transforms are consistent."""
    m = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    model = make_model([m], {"x": np.zeros((1, 1, 4, 4), np.float32)}, ["y"], {"w": w})
    plan = glowgen.compile(model, threads=1).program.plan
    conv = next(i.node for s in plan.steps for i in s.instrs if i.kind == "Conv")
    u = winograd_weights(w, conv).reshape(4, 4, 1, 2).astype(np.float64)
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
    at = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
    for r in range(4):
        for c in range(4):
            d = np.zeros((4, 4))
            d[r, c] = 1.0
            y = at @ (u[:, :, 0, 0] * (bt @ d @ bt.T)) @ at.T        # filter 0's 2 x 2 outputs
            direct = np.array([[sum(d[i + a, j + b] * w[0, 0, a, b] for a in range(3) for b in range(3))
                                for j in range(2)] for i in range(2)])
            np.testing.assert_allclose(y, direct, atol=1e-6)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 64, 7, 7), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),                  # 49 pixels: too few tiles
    ((1, 64, 28, 28), (64, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 64, 28, 28), (64, 64, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 64, 28, 28), (64, 64, 5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 64, 28, 28), (64, 16, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),
])
def test_other_convolutions_keep_their_strategies(x_shape, w_shape, attrs):
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], {"x": x}, ["y"],
                       {"w": np.random.default_rng(1).standard_normal(w_shape).astype(np.float32) * 0.1})
    compiled = glowgen.compile(model, threads=1)
    assert "winograd" not in _strategies(compiled)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_weights_fed_at_run_time_are_not_transformed():
    """Winograd's filter transform is done at compile time: filters that are an input of
    the model take another strategy (and give the same answer)."""
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 32, 20, 20)).astype(np.float32),
             "w": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1}
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], feeds, ["y"], {})
    compiled = glowgen.compile(model, threads=1)
    assert "winograd" not in _strategies(compiled)
    assert_close(compiled.run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-4)


def test_two_tasks_share_resnet_layers_evenly():
    """Bands of tile rows balanced between two tasks (band_rows): 28 and 14 tile rows split
    evenly, 7 as 4 and 3."""
    for cin, size, busiest in ((64, 56, 14), (128, 28, 7), (256, 14, 4)):
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                           {"x": np.zeros((1, cin, size, size), np.float32)}, ["y"],
                           {"w": np.zeros((cin, cin, 3, 3), np.float32)})
        compiled = glowgen.compile(model, threads=1)
        conv = next(i.node for s in compiled.program.plan.steps for i in s.instrs if i.kind == "Conv")
        g = WinogradGeometry(conv, compiled.program.plan.gemm_shape, 2)
        per_task = -(-g.bands // 2) * g.rows                # Split.range over the bands
        shares = [min(g.th, (t + 1) * per_task) - min(g.th, t * per_task) for t in range(2)]
        assert max(shares) == busiest, (cin, size, g.rows, g.bands, shares)
