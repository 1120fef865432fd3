"""3x3 stride-1 convolutions by Winograd's F(4x4, 3x3) or F(2x2, 3x3) (conv strategy "winograd",
kernels/conv_winograd.py): against onnxruntime, bit for bit across thread counts, on the
host's vectors and on AVX2 (x86-64-v3: 8-channel blocks, 16-filter panels); and which
convolutions take it."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import glowgen
from glowgen.backends.cpu.kernels.conv_winograd import TRANSFORMS, WinogradGeometry, tile_size, winograd_weights
from conftest import HOST_AND_AVX2, HOST_AND_AVX2_IDS, assert_close, conv_model, conv_strategies, make_model, run_ort

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
    # det_fpn's 96 -> 24: panels of three AVX2 vectors (conv_blocked.blocked_tile), AVX-512 too
    "96->24 @40x36 (24-filter panels)": ((1, 96, 40, 36), (24, 96, 3, 3), [1, 1, 1, 1], "relu"),
}


def _model(case, seed=0):
    xs, ws, pads, epilogue = CASES[case]
    return conv_model(xs, ws, {"pads": pads}, epilogue, bias="no bias" not in case, seed=seed,
                      weight_scale=1 / np.sqrt(9 * ws[1]))


@pytest.mark.parametrize("cpu", HOST_AND_AVX2, ids=HOST_AND_AVX2_IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_winograd_matches_onnxruntime(case, cpu):
    model, feeds = _model(case)
    compiled = glowgen.compile(model, threads=1, **({"cpu": cpu} if cpu else {}))
    assert conv_strategies(compiled) == ["winograd"], compiled.program.plan.describe()
    assert_close(compiled.run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", HOST_AND_AVX2, ids=HOST_AND_AVX2_IDS)
@pytest.mark.parametrize("case", ["64->64 @56 relu (bands of tile rows)", "32->32 @31x33 (odd: half tiles), no bias",
                                  "256->256 @14, weights past L2", "128->128 @28",
                                  "96->24 @40x36 (24-filter panels)"])
def test_winograd_same_bits_for_any_thread_count(case, cpu):
    """Tasks share out bands of tile rows (three tasks: bands of unequal size, the last
    one ragged), or tiles where the rows do not share out evenly (256 @14 and 128 @28:
    7 tile rows; a task's first and last tile rows partial); every tile is computed by the
    same code whichever task computes it."""
    model, feeds = _model(case, seed=1)
    options = {"cpu": cpu} if cpu else {}
    one = glowgen.compile(model, threads=1, **options).run(feeds)["y"]
    for threads in (2, 3):
        split = glowgen.compile(model, threads=threads, **options)
        assert any(s.parts > 1 for s in split.program.plan.steps)
        np.testing.assert_array_equal(split.run(feeds)["y"], one)


_AVX512 = "avx512f" in open("/proc/cpuinfo").read()


@pytest.mark.parametrize("cpu", ["x86-64-v3"] + (["x86-64-v4"] if _AVX512 else []))
def test_seven_by_seven_planes_take_winograd_with_avx512_only(cpu):
    """ResNet's last stage, 7 x 7 (16 tiles of 2 x 2): Winograd with AVX-512's 8-tile blocks,
    blocked with AVX2's 6-tile ones (conv_winograd.MIN_PIXELS); against onnxruntime, and bit
    for bit at 2 threads."""
    model, feeds = conv_model((2, 256, 7, 7), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}, "add", seed=4,
                              weight_scale=1 / 48)
    compiled = glowgen.compile(model, threads=1, cpu=cpu)
    assert conv_strategies(compiled) == (["winograd"] if cpu == "x86-64-v4" else ["blocked"])
    y = compiled.run(feeds)["y"]
    assert_close({"y": y}, run_ort(model, feeds), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(glowgen.compile(model, threads=2, cpu=cpu).run(feeds)["y"], y)


@pytest.mark.parametrize("case, tile, bound", [("64->64 @56 relu (bands of tile rows)", 4, 32),
                                               ("256->256 @14, weights past L2", 2, 4)])
def test_winograd_is_nearly_as_accurate_as_a_direct_convolution(case, tile, bound):
    """Against a float64 convolution, the error of F(2x2, 3x3) stays within 4 times that of
    onnxruntime's direct float32 one, and F(4x4, 3x3)'s (its transforms multiply by up to 8,
    and by fractions in G) within 32 times; the whole ResNets' outputs differ from
    onnxruntime's by as much as before (1e-6 of their largest)."""
    model, feeds = _model(case, seed=2)
    compiled = glowgen.compile(model, threads=1)
    conv = next(i.node for s in compiled.program.plan.steps for i in s.instrs if i.kind == "Conv")
    assert WinogradGeometry(conv, compiled.program.plan.gemm_shape).t == tile
    ours = compiled.run(feeds)["y"].astype(np.float64)
    theirs = run_ort(model, feeds)["y"].astype(np.float64)
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = np.pad(feeds["x"].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))   # [N, C, OH, OW, 3, 3]
    exact = np.einsum("nchwij,mcij->nmhw", windows, inits["w"]) + inits["b"][None, :, None, None]
    if "r" in feeds:
        exact = exact + feeds["r"]
    exact = np.maximum(exact, 0)
    ours_err, theirs_err = np.abs(ours - exact).max(), np.abs(theirs - exact).max()
    assert ours_err <= bound * theirs_err, (ours_err, theirs_err)


@pytest.mark.parametrize("tile", sorted(TRANSFORMS))
def test_transforms_compute_a_3x3_correlation(tile):
    """A^T [(G g G^T) .* (B^T d B)] A is the T x T correlation of a (T + 2)^2 window d with
    a 3x3 filter g (float64), and winograd_weights packs G g G^T by window position."""
    bt, gt, at = TRANSFORMS[tile]
    rng = np.random.default_rng(tile)
    g = rng.standard_normal((3, 3))
    for _ in range(4):
        d = rng.standard_normal((tile + 2, tile + 2))
        y = at @ ((gt @ g @ gt.T) * (bt @ d @ bt.T)) @ at.T
        direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(tile)] for i in range(tile)])
        np.testing.assert_allclose(y, direct, atol=1e-12)
    size = {2: 14, 4: 56}[tile]
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": np.zeros((1, 8, size, size), np.float32)}, ["y"], {"w": w})
    plan = glowgen.compile(model, threads=1).program.plan
    conv = next(i.node for s in plan.steps for i in s.instrs if i.kind == "Conv")
    assert tile_size(conv) == tile
    u = winograd_weights(w, conv).reshape(tile + 2, tile + 2, 8, 16)
    np.testing.assert_allclose(u[..., 3, 5], gt @ w[5, 3].astype(np.float64) @ gt.T, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 64, 6, 6), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),                  # 36 pixels: too few tiles
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
    assert "winograd" not in conv_strategies(compiled)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_weights_fed_at_run_time_are_not_transformed():
    """Winograd's filter transform is done at compile time: filters that are an input of
    the model take another strategy (and give the same answer)."""
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 32, 20, 20)).astype(np.float32),
             "w": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1}
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], feeds, ["y"], {})
    compiled = glowgen.compile(model, threads=1)
    assert "winograd" not in conv_strategies(compiled)
    assert_close(compiled.run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-4)


def test_two_tasks_share_resnet_layers_evenly():
    """ResNet's layers in tiles of 4 x 4 (56 x 56, 28 x 28) and 2 x 2 (14 x 14: tiles of 4
    would compute 16 x 16) between two tasks: 14 tile rows in bands of tile rows balanced
    between them (band_rows); 7 tile rows, which would go 4 and 3, as 49 tiles, 25 and 24
    (tile_shares)."""
    for cin, size, tile, busiest in ((64, 56, 4, (7, 14)), (128, 28, 4, (25, 49)), (256, 14, 2, (25, 49))):
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                           {"x": np.zeros((1, cin, size, size), np.float32)}, ["y"],
                           {"w": np.zeros((cin, cin, 3, 3), np.float32)})
        compiled = glowgen.compile(model, threads=1)
        conv = next(i.node for s in compiled.program.plan.steps for i in s.instrs if i.kind == "Conv")
        g = WinogradGeometry(conv, compiled.program.plan.gemm_shape, 2)
        if g.tile_shares:
            shares, total = [hi - lo for lo, hi in g.tile_shares], g.th * g.tw
        else:
            per_task = -(-g.bands // 2) * g.rows                # Split.range over the bands
            shares, total = [min(g.th, (t + 1) * per_task) - min(g.th, t * per_task) for t in range(2)], g.th
        assert (g.t, (max(shares), total)) == (tile, busiest), (cin, size, g.rows, g.bands, shares)


def test_band_tiles_in_register_tiles_of_even_rows():
    """As few register tiles as MR-row ones, with rows as even as can be (tile_blocks): no
    ragged block of one or two rows left to wait on the FMA latency."""
    from glowgen.backends.cpu.kernels.conv_winograd import tile_blocks
    assert tile_blocks(14, 6) == [(2, 5), (1, 4)]
    assert tile_blocks(49, 6) == [(4, 6), (5, 5)]
    assert tile_blocks(7, 8) == [(1, 7)]
    assert tile_blocks(48, 6) == [(8, 6)]
    for tiles in range(1, 100):
        for mr in (4, 6, 8):
            runs = tile_blocks(tiles, mr)
            assert sum(n * r for n, r in runs) == tiles and all(r <= mr for _, r in runs)
            assert sum(n for n, _ in runs) == -(-tiles // mr)


def test_winograd_off_keeps_the_filters_as_they_are(tmp_path):
    """winograd=False (--no-winograd): the blocked product, weights a quarter the size of F(4x4)'s
    transformed ones; the CLI refuses the flag for a backend without the option."""
    import subprocess
    import sys
    model, feeds = _model("64->64 @56 relu (bands of tile rows)")
    on, off = glowgen.compile(model, threads=1), glowgen.compile(model, threads=1, winograd=False)
    assert conv_strategies(on) == ["winograd"] and conv_strategies(off) == ["blocked"]
    assert "winograd off" in off.program.plan.describe()[0]
    filters = 64 * 64 * 9 * 4
    assert on.program.region_sizes["constant"] >= 4 * filters > off.program.region_sizes["constant"]
    assert_close(off.run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-4)
    import onnx
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    run = subprocess.run([sys.executable, "-m", "glowgen.cli", "run", str(path), "--backend", "interpreter",
                          "--no-winograd"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "--no-winograd applies to the cpu backend" in run.stderr
    assert "Traceback" not in run.stderr
