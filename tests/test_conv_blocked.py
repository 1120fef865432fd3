"""Convolutions over a channel-blocked (NCHWc) copy of their input, the product computed
transposed with its left-hand side read in place (conv strategy "blocked",
kernels/conv_blocked.py): against onnxruntime, bit for bit across thread counts, on the
host's vectors and on AVX2 (x86-64-v3: 8-channel blocks, 16-filter panels)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from glowgen.backends.cpu.kernels.conv_blocked import BlockedGeometry
from conftest import HOST_AND_AVX2, HOST_AND_AVX2_IDS, assert_close, conv_model, conv_strategies, make_model, run_ort

CASES = {
    # name: (x shape, w shape, attrs, epilogue): "relu", "add" (Add of a second input, then
    # Relu: a residual block's end) or None
    # (a stride-1 3x3 over 196 pixels or more, or 49 with AVX-512, is Winograd's:
    # test_conv_winograd.py)
    "64->64 3x3 dilated 2 @13 relu": ((1, 64, 13, 13), (64, 64, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]},
                                      "relu"),
    "16->32 3x3 stride 2, odd sizes": ((1, 16, 19, 23), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]},
                                       None),
    "32->64 3x3 @6, batch 2, add": ((2, 32, 6, 6), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "add"),
    "64->128 3x3/2 @14 uneven pads": ((1, 64, 14, 14), (128, 64, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 2]},
                                      "relu"),
    "32->32 dilated 2, no bias": ((1, 32, 15, 12), (32, 32, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]},
                                  None),
    "16->64 5x5 no padding": ((1, 16, 12, 17), (64, 16, 5, 5), {}, "relu"),
    # A copy over 1 MB, made band by band (BlockedGeometry.progressive)
    "96->64 3x3/2 @60x50, copied by bands": ((1, 96, 60, 50), (64, 96, 3, 3), {"pads": [1, 1, 1, 1],
                                                                             "strides": [2, 2]}, "relu"),
    # Strided 1x1 ones copy only the pixels their stride picks (conv_blocked.subsampled):
    # odd and even widths (the last source vector partly past the row), batch 2 with a residual
    "64->64 1x1 stride 2": ((1, 64, 21, 20), (64, 64, 1, 1), {"strides": [2, 2]}, "relu"),
    "32->64 1x1 stride 2 @37x45, no bias": ((1, 32, 37, 45), (64, 32, 1, 1), {"strides": [2, 2]}, None),
    "64->96 1x1 stride 3x2, batch 2, add": ((2, 64, 17, 34), (96, 64, 1, 1), {"strides": [3, 2], "pads": [0, 0, 0, 0]},
                                            "add"),
    "128->256 1x1 stride 2 @57x55 (1.6 MB), add": ((1, 128, 57, 55), (256, 128, 1, 1), {"strides": [2, 2],
                                                    "pads": [0, 0, 0, 0]}, "add"),
    "32->64 1x1 stride 1x2 @9x33": ((1, 32, 9, 33), (64, 32, 1, 1), {"strides": [1, 2]}, "relu"),
    "64->64 1x1 stride 2 padded": ((1, 64, 13, 14), (64, 64, 1, 1), {"strides": [2, 2], "pads": [1, 0, 0, 1]},
                                   None),
    "32->96 2x2 stride 1x2": ((1, 32, 9, 30), (96, 32, 2, 2), {"pads": [0, 1, 0, 0], "strides": [1, 2]}, None),
    # Weights past L2 (4.7 MB), a small plane: one band, panel by panel (BlockedGeometry.panels_outer)
    "256->512 3x3 @6x7, panel by panel": ((1, 256, 6, 7), (512, 256, 3, 3), {"pads": [1, 1, 1, 1]}, "add"),
    # A ResNet-50 downsample's shape: 4 MB of weights, a C^T of 400 KB (WHOLE_BAND_BYTES)
    "512->2048 1x1/2 @14, panel by panel": ((1, 512, 14, 14), (2048, 512, 1, 1),
                                            {"strides": [2, 2], "pads": [0, 0, 0, 0]}, "add"),
    # Pointwise, few pixels, weights past L2 (2 MB): blocked too (_pointwise_panel_by_panel)
    "512->1024 1x1 @7, panel by panel": ((1, 512, 7, 7), (1024, 512, 1, 1), {"pads": [0, 0, 0, 0]}, "add"),
}


def _model(case, seed=0):
    xs, ws, attrs, epilogue = CASES[case]
    return conv_model(xs, ws, attrs, epilogue, bias="no bias" not in case, seed=seed,
                      weight_scale=0.2)


@pytest.mark.parametrize("cpu", HOST_AND_AVX2, ids=HOST_AND_AVX2_IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_blocked_matches_onnxruntime(case, cpu):
    model, feeds = _model(case)
    options = {"cpu": cpu} if cpu else {}
    compiled = glowgen.compile(model, threads=1, **options)
    assert conv_strategies(compiled) == ["blocked"], compiled.program.plan.describe()
    assert_close(compiled.run(feeds), run_ort(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", HOST_AND_AVX2, ids=HOST_AND_AVX2_IDS)
@pytest.mark.parametrize("case", ["64->64 3x3 dilated 2 @13 relu", "32->64 3x3 @6, batch 2, add",
                                  "64->128 3x3/2 @14 uneven pads", "96->64 3x3/2 @60x50, copied by bands",
                                  "128->256 1x1 stride 2 @57x55 (1.6 MB), add", "256->512 3x3 @6x7, panel by panel",
                                  "512->2048 1x1/2 @14, panel by panel", "512->1024 1x1 @7, panel by panel"])
def test_blocked_same_bits_for_any_thread_count(case, cpu):
    model, feeds = _model(case, seed=1)
    options = {"cpu": cpu} if cpu else {}
    one = glowgen.compile(model, threads=1, **options).run(feeds)["y"]
    for threads in (2, 3):              # three tasks: shares of bands or panels, some empty
        split = glowgen.compile(model, threads=threads, **options)
        assert any(s.parts > 1 for s in split.program.plan.steps) or "@6," in case or "@6x7," in case
        np.testing.assert_array_equal(split.run(feeds)["y"], one)


def _geometry(case, cpu=None) -> BlockedGeometry:
    """The blocked geometry of case's convolution, compiled for `cpu` (default: this host)."""
    model, _ = _model(case)
    compiled = glowgen.compile(model, threads=1, **({"cpu": cpu} if cpu else {}))
    conv = next(ins for s in compiled.program.plan.steps for ins in s.instrs if ins.kind == "Conv")
    return BlockedGeometry(conv.node, compiled.program.plan.gemm_shape)


def test_large_copies_made_band_by_band():
    assert _geometry("96->64 3x3/2 @60x50, copied by bands").progressive
    assert not _geometry("64->64 3x3 dilated 2 @13 relu").progressive


def test_weights_past_l2_computed_panel_by_panel():
    for cpu in ("x86-64-v3", None):
        assert _geometry("256->512 3x3 @6x7, panel by panel", cpu).panels_outer
        assert _geometry("512->2048 1x1/2 @14, panel by panel", cpu).panels_outer
        assert _geometry("512->1024 1x1 @7, panel by panel", cpu).panels_outer
    assert not _geometry("64->64 3x3 dilated 2 @13 relu").panels_outer


def test_large_input_mostly_unread_copied_only_where_read():
    """A 1x1 stride 2 convolution reads a quarter of its input: blocked with only that
    quarter copied (conv_blocked.subsampled), but not copied whole when that is over 1 MB
    (conv_blocked._copies_unread_input; padded, it is not subsampled)."""
    x = np.ones((1, 256, 56, 56), np.float32)
    for pads, blocked in (([0, 0, 0, 0], True), ([1, 1, 1, 1], False)):
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=pads)], {"x": x},
                           ["y"], {"w": np.ones((512, 256, 1, 1), np.float32)})
        assert (conv_strategies(glowgen.compile(model, threads=1)) == ["blocked"]) == blocked


# AVX-512's 32-filter panels do not divide 24 or 72 filters either: 8 x 24 tiles of AVX2
# vectors there (conv_blocked._ymm_panels), where the host or x86-64-v4 runs it.
_AVX512 = "avx512f" in open("/proc/cpuinfo").read()
THREE_VECTOR_CPUS = ["x86-64-v3"] + (["x86-64-v4"] if _AVX512 else [])


@pytest.mark.parametrize("cpu", THREE_VECTOR_CPUS)
@pytest.mark.parametrize("cout, size", [(24, 11), (72, 13)])      # (196 pixels or more: Winograd)
def test_panels_of_three_avx2_vectors_where_the_targets_do_not_divide_the_filters(cout, size, cpu):
    """24 or 72 filters: AVX2's 16-filter panels do not divide them, 24-filter ones (a 4 x 24
    tile, conv_blocked.blocked_tile) do; with AVX-512, an 8 x 24 tile of AVX2 vectors.
    Against onnxruntime, bit for bit across thread counts."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 96, size, size)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": x}, ["y"],
                       {"w": (rng.standard_normal((cout, 96, 3, 3)) * 0.1).astype(np.float32),
                        "b": rng.standard_normal(cout).astype(np.float32)})
    one = glowgen.compile(model, threads=1, cpu=cpu)
    assert conv_strategies(one) == ["blocked"], one.program.plan.describe()
    conv = next(ins for s in one.program.plan.steps for ins in s.instrs if ins.kind == "Conv")
    assert BlockedGeometry(conv.node, one.program.plan.gemm_shape).nr == 24
    y = one.run({"x": x})["y"]
    assert_close({"y": y}, run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    for threads in (2, 3):
        np.testing.assert_array_equal(glowgen.compile(model, threads=threads, cpu=cpu).run({"x": x})["y"], y)


def test_half_empty_filter_panels_keep_their_strategy():
    """16 filters fill half of AVX-512's 32-filter panel: not blocked (conv_is_blocked); they
    fill AVX2's 16-filter panel, blocked.  (Without Winograd, which AVX2 takes for this layer.)"""
    x = np.ones((1, 16, 20, 20), np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"],
                       {"w": np.ones((16, 16, 3, 3), np.float32)})
    compiled = glowgen.compile(model, threads=1, winograd=False)
    assert (conv_strategies(compiled) == ["blocked"]) == (compiled.program.plan.gemm_shape.nr == 16)


@pytest.mark.parametrize("cin, cout, size", [(64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7)])
def test_two_tasks_share_resnet_layers_evenly(cin, cout, size):
    """Split in two, the busier task computes at most 52% of a ResNet 3x3 layer (by bands
    of pixels or by filter panels, conv_blocked.blocked_split_pixels); seven bands of 32
    pixels once gave one task 65% of 256 -> 256 at 14 x 14."""
    from glowgen.backends.cpu.gemm import choose_shape
    from glowgen.backends.cpu.kernels.conv_blocked import blocked_split_pixels, busiest
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": rng.standard_normal((1, cin, size, size)).astype(np.float32)}, ["y"],
                       {"w": rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)})
    compiled = glowgen.compile(model, threads=1)
    (node,) = [i.node for s in compiled.program.plan.steps for i in s.instrs if i.kind == "Conv"]
    for features in ("+avx512f", "+avx2"):
        shape = choose_shape(features)
        if blocked_split_pixels(node, shape, 2):
            g = BlockedGeometry(node, shape, 2)
            most = busiest(g.bands, g.band, 2, g.n) / g.n
        else:
            g = BlockedGeometry(node, shape)
            most = busiest(g.panels, 1, 2, g.panels) / g.panels
        assert most <= 0.52, (features, most)


def test_tiles_of_one_pixel_fewer_where_a_ragged_tile_wastes_much():
    """49 pixels in AVX2's 6-pixel tiles: 4 of 6 and 5 of 5, not 9 of 6 (pixel_tiles); the
    7 x 7 cases above run so on x86-64-v3."""
    from glowgen.backends.cpu.kernels.conv_transposed import pixel_tiles
    assert pixel_tiles(49, 6) == [(4, 6), (5, 5)]
    assert pixel_tiles(25, 6) == [(5, 5)]
    assert pixel_tiles(49, 7) == [(7, 7)]           # AVX-512's 7-pixel tiles
    assert pixel_tiles(196, 6) == [(33, 6)]         # 2 of 198 rows: not worth a second loop
    assert pixel_tiles(7, 6) == [(2, 6)]            # too few tiles to give up rows
