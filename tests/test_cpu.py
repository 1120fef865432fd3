"""The cpu backend's code generation: stacking and epilogue fusion, checked on the step
structure and against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen

from conftest import HOST_AND_AVX2, HOST_AND_AVX2_IDS, assert_close, make_model, run_ort

rng = np.random.default_rng(11)


def _steps(model, stacking=True):
    """The steps the cpu backend's passes formed (stacking=False: of a model compiled so)."""
    if model.program.plan.stacking != stacking:
        model = glowgen.api.CompiledModel(model.function, model.registry, "cpu", stacking=stacking)
    return model.program.plan.steps


def test_elementwise_chain_is_one_loop():
    x = rng.standard_normal((2, 8, 5, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "c1"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["d"]), helper.make_node("Mul", ["d", "c2"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"c1": rng.standard_normal((1, 8, 1, 1)).astype(np.float32),
                                               "c2": np.float32(1.7)})
    compiled = glowgen.compile(model, backend="cpu")
    steps = _steps(compiled)
    assert len(steps) == 1 and [i.kind for i in steps[0].instrs] == ["Relu", "Add", "Sigmoid", "Mul"]
    assert len(_steps(compiled, stacking=False)) == 4
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-5, atol=1e-6)
    unstacked = glowgen.compile(model, backend="cpu", stacking=False)
    assert_close(unstacked.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-5, atol=1e-6)


def test_costly_stack_runs_in_groups_over_blocks():
    """Two transcendentals in one stack: the loop is cut into groups run block by block
    (stacking.cost_groups); the second group re-reads the input (an external operand), an
    intermediate is also a graph output, and the inner extent is not a multiple of a block."""
    from glowgen.backends.cpu.stacking import BLOCK, cost_groups
    x = rng.standard_normal((1, 3, 37, 29)).astype(np.float32) * 3
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "c1"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
             helper.make_node("Mul", ["t", "x"], ["m"]), helper.make_node("Erf", ["m"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y", "s"],
                       {"c1": rng.standard_normal((1, 3, 1, 1)).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu")
    steps = _steps(compiled)
    assert len(steps) == 1 and 37 * 29 >= 2 * BLOCK and (37 * 29) % BLOCK
    assert [[i.kind for i in g] for g in cost_groups(steps[0], compiled.registry)] == [
        ["Relu", "Add", "Sigmoid"], ["Tanh", "Mul"], ["Erf"]]
    assert "alloca [%d x float]" % BLOCK in compiled._runner.ir
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-5, atol=1e-6)


def test_residual_add_and_relu_run_in_the_conv_store():
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": rng.standard_normal(16).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu")
    steps = _steps(compiled)
    assert [[i.kind for i in s.instrs] for s in steps] == [["Conv", "Add", "Relu"]]
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("channels,size,kernel", [(32, 20, 1), (160, 20, 1), (64, 7, 1), (32, 12, 3)])
def test_a_fused_residual_sum_is_stored_over_the_residual(channels, size, kernel):
    """A bottleneck's last convolution with the residual Add and Relu in its store writes
    the sum over the residual, which dies there (lir.passes.reuse_in_place), for each
    strategy: pointwise (with AVX2, 160 channels in blocks of K: its partial sums in the
    convolution's own output), transposed (few pixels), a 3x3 one; bit for bit across threads."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    pad = [kernel // 2] * 4
    consts = {f"w{i}": (rng.standard_normal((channels, channels, kernel, kernel)) * 0.1).astype(np.float32)
              for i in range(3)}
    consts.update({f"b{i}": rng.standard_normal(channels).astype(np.float32) for i in range(3)})
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=pad), helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["c1"], pads=pad), helper.make_node("Relu", ["c1"], ["t"]),
             helper.make_node("Conv", ["t", "w2", "b2"], ["c2"], pads=pad),
             helper.make_node("Add", ["c2", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], consts)
    compiled = glowgen.compile(model, backend="cpu")
    assert [[i.kind for i in s.instrs] for s in _steps(compiled)][-1] == ["Conv", "Add", "Relu"]
    (add,) = [ins for ins in compiled.program.instrs if ins.kind == "Add"]
    out, _, residual = (buf.root() for _, buf in add.operands)
    assert out is residual
    y = compiled.run({"x": x})["y"]
    assert_close({"y": y}, run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    for threads in (2, 3):
        np.testing.assert_array_equal(glowgen.compile(model, backend="cpu", threads=threads).run({"x": x})["y"], y)


def test_bias_and_clip_run_in_the_matmul_store():
    a = rng.standard_normal((3, 37)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    model = make_model(nodes, {"a": a}, ["y"], {"w": rng.standard_normal((37, 45)).astype(np.float32),
                                               "bias": rng.standard_normal(45).astype(np.float32),
                                               "lo": np.float32(-1), "hi": np.float32(2)})
    compiled = glowgen.compile(model, backend="cpu")
    kinds = [[i.kind for i in s.instrs] for s in _steps(compiled)]
    assert ["BatchMatMul", "Add", "Clip"] in kinds, kinds
    assert_close(compiled.run({"a": a}), run_ort(model, {"a": a}), rtol=1e-4, atol=1e-5)


def test_constant_gemm_operands_are_packed_at_compile_time():
    """Conv weights (A: blocks of MR rows) and a MatMul's constant right-hand side (B:
    NR-wide panels) are repacked when the cpu backend builds the module; shapes that leave
    partial blocks and panels (M, N not multiples of the tile) still match onnxruntime."""
    from glowgen.backends.cpu.packing import pack_panels, pack_rows
    a = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    pa = pack_rows(a, 2)                                   # [2 blocks, K=5, MR=2]
    assert pa.shape == (2, 5, 2) and pa[0, 3].tolist() == [a[0, 3], a[1, 3]] and pa[1, 4].tolist() == [a[2, 4], 0]
    pb = pack_panels(a.T.copy(), 2)                        # [K=5, N=3] -> [2 panels, 5, NR=2]
    assert pb.shape == (2, 5, 2) and pb[1, 2].tolist() == [a[2, 2], 0]

    x = rng.standard_normal((1, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((20, 3, 3, 3)).astype(np.float32)      # 2 groups of 10 filters
    rhs = rng.standard_normal((81, 37)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=2, pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "s"], ["c2"]), helper.make_node("MatMul", ["c2", "rhs"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "rhs": rhs, "s": np.array([20, 81], np.int64)})
    compiled = glowgen.compile(model, backend="cpu")
    assert sorted(i.plan.packed for i in compiled.program.instrs if i.kind in ("Conv", "BatchMatMul")) == ["a", "b"]
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_outputs_are_fresh_arrays_the_caller_owns():
    """Outputs are written in place by native code (no copy), yet each name gets its own
    array, and an array the caller still holds is never reused by a later run."""
    x = rng.standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["y"], ["z"])]
    model = make_model(nodes, {"x": x}, ["y", "z"])
    compiled = glowgen.compile(model, backend="cpu")
    first = compiled.run({"x": x})
    assert not np.shares_memory(first["y"], first["z"])
    kept = first["y"].copy()
    second = compiled.run({"x": -x})
    np.testing.assert_array_equal(first["y"], kept)
    np.testing.assert_array_equal(second["y"], np.maximum(-x, 0))


def test_profile_counts_cycles_per_kernel():
    from glowgen.errors import GlowgenError
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu", profile=True)
    for _ in range(3):
        out = compiled.run({"x": x})
    assert_close(out, run_ort(model, {"x": x}), rtol=1e-5, atol=1e-5)
    rows = compiled.profile(reset=True)
    assert [name for name, _ in rows] == ["Conv+Relu [1, 8, 6, 6] 3x3 stride 1x1", "MaxPool [1, 8, 3, 3]"]
    assert all(cycles > 0 for _, cycles in rows)
    assert all(cycles == 0 for _, cycles in compiled.profile())       # reset: no run yet
    compiled.run({"x": x})
    assert all(cycles > 0 for _, cycles in compiled.profile())
    with pytest.raises(GlowgenError, match="profile=True"):
        glowgen.compile(model, backend="cpu").profile()


def test_task_profile_times_each_task_of_a_split_step():
    """With threads, a profile also keeps each task's fewest cycles per split step (how
    evenly the split shares the step's work); an unsplit step has none."""
    from glowgen.errors import GlowgenError
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMax", ["c"], ["y"], keepdims=1)]
    model = make_model(nodes, {"x": x}, ["y"], {"w": rng.standard_normal((64, 64, 3, 3)).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu", profile=True, threads=2)
    compiled.run({"x": x})
    parts = [step.parts for step in compiled.program.plan.steps]
    tasks = compiled.task_profile(reset=True)
    assert parts[0] == 2 and [len(t) for t in tasks] == [p if p > 1 else 0 for p in parts]
    assert all(c > 0 for c in tasks[0])
    assert all(c == 0 for c in compiled.task_profile()[0])              # reset: no run yet
    with pytest.raises(GlowgenError, match="profile=True"):
        glowgen.compile(model, backend="cpu", threads=2).task_profile()


@pytest.mark.parametrize("strides, dilations", [([1, 2], [1, 1]), ([1, 1], [1, 2]), ([2, 1], [1, 1])])
def test_large_image_convolution_runs_im2col_panel_by_panel(strides, dilations):
    """When the whole im2col matrix would not stay in L2 but the filters would, each panel is
    built just before every filter block uses it (copied in runs along output rows from the
    padded, dealt planes); a partial last panel, groups, stride, dilation and uneven padding
    included."""
    from glowgen.backends.cpu.kernels.conv import conv_panel_by_panel
    x = rng.standard_normal((1, 64, 71, 69)).astype(np.float32)
    # 40 filters per group: more than gemm-planes takes (conv.PLANES_MAX_FILTERS), and 288
    # patch rows: more than stay in L1 read in place (conv.in_place_rows_fit_l1).
    w = rng.standard_normal((80, 32, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=2, pads=[1, 2, 0, 1],
                                         strides=strides, dilations=dilations)],
                       {"x": x}, ["y"], {"w": w, "b": rng.standard_normal(80).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu")
    (conv,) = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert conv.plan.strategy == "gemm-panels" and conv_panel_by_panel(conv.node) and (conv.node.outputs[0].type.shape[2] * conv.node.outputs[0].type.shape[3]) % 32
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", HOST_AND_AVX2, ids=HOST_AND_AVX2_IDS)
def test_matrix_vector_weights_are_packed_in_wide_panels(cpu):
    """A product with fewer rows than the tile runs wide tiles; its constant B is packed in
    panels that wide (no wider than N needs), so each tile streams one contiguous panel."""
    from glowgen.backends.cpu.packing import gemv_panel_width
    x = rng.standard_normal((3, 70)).astype(np.float32)
    w1 = rng.standard_normal((70, 300)).astype(np.float32)
    w2 = rng.standard_normal((300, 10)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w1": w1, "w2": w2})
    compiled = glowgen.compile(model, backend="cpu", cpu=_cpu_or_skip(cpu))
    widths = [i.plan.packed_nr for i in compiled.program.instrs if i.kind == "BatchMatMul"]
    shape = _target_shape(cpu)
    assert widths == [gemv_panel_width(shape, 3, 300), gemv_panel_width(shape, 3, 10)]
    # Wider than the tile for N = 300; for N = 10, the fewest whole vectors that cover it.
    assert widths[0] > shape.nr and widths[1] == -(-10 // shape.vw) * shape.vw, widths
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


def _host_shape():
    return _target_shape(None)


def _target_shape(cpu):
    """The GEMM tile the cpu backend uses for `cpu` (None: the default target)."""
    from glowgen.backends.cpu.gemm import choose_shape
    from glowgen.backends.cpu.target import resolve_cpu
    return choose_shape(resolve_cpu(cpu).features)


def _cpu_or_skip(cpu):
    """`cpu`, or a skip where this machine cannot run that level's code."""
    from glowgen.backends.cpu.target import resolve_cpu
    try:
        resolve_cpu(cpu)
    except glowgen.GlowgenError as e:
        pytest.skip(str(e))
    return cpu


PLANE_CONVS = [
    # (x shape, w shape, attrs): depthwise at strides 1, 2 and 3, uneven pads, dilation, a
    # channel multiplier, several channels per group, widths under and over one vector.
    ((1, 8, 13, 37), (8, 1, 3, 3), dict(group=8, pads=[1, 1, 1, 1])),
    ((2, 6, 20, 21), (6, 1, 3, 3), dict(group=6, pads=[0, 1, 1, 0], strides=[2, 2])),
    ((1, 4, 17, 40), (8, 1, 5, 3), dict(group=4, pads=[2, 0, 1, 2], strides=[3, 2], dilations=[1, 2])),
    ((1, 4, 9, 7), (4, 2, 3, 3), dict(group=2, pads=[1, 1, 1, 1], dilations=[2, 1])),
    ((1, 3, 32, 32), (6, 3, 5, 5), {}),
    ((1, 2, 5, 300), (2, 1, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("cpu", HOST_AND_AVX2)
@pytest.mark.parametrize("xs, ws, attrs", PLANE_CONVS, ids=["dw", "dw-s2", "dw-s3-dil-mult", "groups", "lenet", "long-rows"])
def test_direct_convolutions_run_over_padded_planes(xs, ws, attrs, cpu):
    """Convolutions with fewer filters per group than a GEMM tile read each input channel
    from a zero-padded copy (columns dealt by stride), and a depthwise one applies the Clip
    after it in its store.  On the host's vectors and AVX2's (whose partial rows are stored
    in plain pieces: vectors.store_lanes)."""
    from glowgen.backends.cpu.kernels.conv import conv_by_planes
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    lo = helper.make_tensor("lo", 1, [], [-0.5])
    hi = helper.make_tensor("hi", 1, [], [0.75])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Constant", [], ["lo"], value=lo),
             helper.make_node("Constant", [], ["hi"], value=hi),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y", "c"],
                       {"w": w, "b": rng.standard_normal(ws[0]).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu", **({"cpu": cpu} if cpu else {}))
    (conv,) = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert conv_by_planes(conv.node) and conv.plan.strategy == "planes"
    if ws[1] == 1:
        assert [i.kind for i in _steps(compiled)[0].instrs] == ["Conv", "Clip"]
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-5)


def test_avx2_stores_partial_rows_without_masked_stores():
    """MobileNetV2's depthwise 3x3 at 14 x 14 compiled for AVX2: each 14-float row is 8 + 6
    lanes, copied into its plane and stored.  vmaskmovps to memory is microcoded on AMD cores
    (it doubled the kernel's time on Zen 4), so partial vectors go out as plain stores of
    4, 2 and 1 lanes (vectors.store_lanes); masked loads stay.  Against onnxruntime."""
    import re
    x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=64, pads=[1, 1, 1, 1])], {"x": x},
                       ["y"], {"w": rng.standard_normal((64, 1, 3, 3)).astype(np.float32),
                               "b": rng.standard_normal(64).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu", cpu="x86-64-v3")
    machine_code = compiled._runner.assembly()
    assert "vmaskmovps" in machine_code                   # the masked loads of partial rows
    assert not re.search(r"vmaskmovps\s+%ymm\d+,\s*%ymm\d+,\s*[^%\s]", machine_code)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("filters", [2, 4, 7])
def test_a_pointwise_convolution_with_few_filters_is_a_matrix_product(filters):
    """A 1x1 convolution with fewer filters than a GEMM tile still runs as a matrix product
    over the input read in place (the direct kernel was 5x slower: det_fpn's 24 -> 4 head)."""
    x = rng.standard_normal((1, 24, 37, 41)).astype(np.float32)
    w = rng.standard_normal((filters, 24, 1, 1)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"])], {"x": x}, ["y"],
                       {"w": w, "b": rng.standard_normal(filters).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu")
    (conv,) = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert conv.plan.strategy == "pointwise"
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strides, dilations, group", [([2, 2], [1, 1], 1), ([1, 3], [2, 2], 2), ([3, 2], [1, 1], 2)])
def test_strided_convolution_reads_dealt_planes(strides, dilations, group):
    """A GEMM convolution first copies each input channel into zero-padded planes, its
    columns dealt by remainder mod the column stride; its patch matrix is then made of
    plain row copies (whole matrix here, panel by panel in the large-image test above)."""
    from glowgen.backends.cpu.kernels.conv import conv_panel_by_panel, conv_uses_gemm
    # 12 input channels: not whole 8-lane blocks, so not "blocked" with AVX2 either.
    x = rng.standard_normal((2, 12, 15, 23)).astype(np.float32)
    w = rng.standard_normal((16, 12 // group, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, pads=[1, 0, 2, 1],
                                         strides=strides, dilations=dilations),
                        helper.make_node("Relu", ["c"], ["y"])],
                       {"x": x}, ["y"], {"w": w, "b": rng.standard_normal(16).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu")
    (conv,) = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert conv_uses_gemm(conv.node) and not conv_panel_by_panel(conv.node) and conv.plan.strategy == "gemm"
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                                   dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 1], ceil_mode=1),
                                   dict(kernel_shape=[3, 2], strides=[3, 1], pads=[0, 1, 2, 0])],
                         ids=["resnet", "dilated-ceil", "uneven"])
def test_max_pooling_runs_over_planes_padded_with_minus_infinity(attrs):
    """2-D max pooling reads planes padded with -inf (columns dealt by stride), matching
    onnxruntime; rows longer than 8 vectors loop.  NaN wins its windows, as NumPy's maximum
    (and the interpreter) have it, and a window of -inf is -inf (onnxruntime says -FLT_MAX):
    those are checked against a NumPy sliding-window max."""
    x = rng.standard_normal((2, 3, 11, 150)).astype(np.float32)
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], {"x": x}, ["y"])
    from glowgen.backends.cpu.kernels.pool import max_pool_by_planes
    compiled = glowgen.compile(model, backend="cpu")
    (pool,) = [i for i in compiled.program.instrs if i.kind == "MaxPool"]
    assert max_pool_by_planes(pool.node) and pool.plan.strategy == "planes"
    want = run_ort(model, {"x": x})
    assert_close(compiled.run({"x": x}), want, rtol=0, atol=0)
    # NaN and -inf: NumPy's max over each window of x padded with -inf.
    x[0, 1, 4, 7] = np.nan
    x[1, 2] = -np.inf
    kh, kw = attrs["kernel_shape"]
    sh, sw = attrs["strides"]
    dh, dw = attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    oh, ow = want["y"].shape[2:]
    rows, cols = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    xp = np.full(x.shape[:2] + (max(rows, 11 + pt), max(cols, 150 + pl)), -np.inf, np.float32)
    xp[:, :, pt:pt + 11, pl:pl + 150] = x
    taps = [xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            for i in range(kh) for j in range(kw)]
    ref = np.stack(taps).max(axis=0)
    got = compiled.run({"x": x})["y"]
    assert np.isnan(ref).any() and np.isneginf(ref).any()
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("ws, attrs", [((200, 20, 1, 1), {}), ((64, 20, 3, 3), dict(pads=[1, 1, 1, 1])),
                                       ((200, 20, 3, 3), dict(pads=[1, 0, 1, 0], strides=[2, 1]))],
                         ids=["pointwise", "3x3", "strided-partial-filters"])
def test_small_output_convolution_runs_transposed(ws, attrs):
    """A convolution whose output pixels would leave vector lanes idle and whose filters fill
    them is computed as C^T = P^T W^T (vectorized along the filters, weights packed
    transposed at compile time), then transposed back in registers through the bias and the
    fused residual Add and Relu; batch 2, partial pixel and filter blocks included."""
    from glowgen.backends.cpu.kernels.conv_transposed import conv_is_transposed
    from glowgen.backends.cpu.gemm import choose_shape
    from glowgen.backends.cpu.target import resolve_cpu
    # 20 input channels: not whole vector blocks (the 3x3 would be "blocked", conv_blocked.py).
    x = rng.standard_normal((2, 20, 7, 7)).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    model0 = make_model(nodes, {"x": x}, ["c"], {"w": w, "b": rng.standard_normal(ws[0]).astype(np.float32)})
    out_shape = run_ort(model0, {"x": x})["c"].shape
    r = rng.standard_normal(out_shape).astype(np.float32)
    nodes += [helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, {"x": x, "r": r}, ["y"], {"w": w, "b": rng.standard_normal(ws[0]).astype(np.float32)})
    compiled = glowgen.compile(model, backend="cpu")
    (conv,) = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert conv_is_transposed(conv.node, choose_shape(resolve_cpu().features)) and conv.plan.packed == "t" and conv.plan.strategy == "transposed"
    assert [[i.kind for i in s.instrs] for s in _steps(compiled)] == [["Conv", "Add", "Relu"]]
    assert_close(compiled.run({"x": x, "r": r}), run_ort(model, {"x": x, "r": r}), rtol=1e-4, atol=1e-4)


def test_generated_code_keeps_no_state():
    """Kernels' scratch memory (padded planes, patch panels) is part of the activation
    region, so the module has no writable global: calls with their own regions are
    independent (what the bundle header promises)."""
    import re
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    dw = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Conv", ["c", "dw"], ["d"], group=16, strides=[2, 2]),
                        helper.make_node("MaxPool", ["d"], ["y"], kernel_shape=[2, 2])],
                       {"x": x}, ["y"], {"w": w, "dw": dw})
    compiled = glowgen.compile(model, backend="cpu")
    ir_text = compiled._runner.llvm_ir(optimized=False)
    assert '%"scratch"' in ir_text
    assert not re.findall(r"^@\S+ = (?:internal )?global", ir_text, re.M)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ the JIT's target CPU
def test_an_x86_64_level_below_the_host_gets_its_own_code():
    """cpu="x86-64-v3" compiles the AVX2 + FMA code a CPU without AVX-512 runs: no zmm register
    in the machine code, 8-float GEMM tiles, and the answer of onnxruntime."""
    cpu = _cpu_or_skip("x86-64-v3")
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Tanh", ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)})
    compiled = glowgen.compile(model, cpu=cpu)
    assert compiled.options["cpu"] == "x86-64-v3"
    asm = compiled._runner.assembly()
    assert "ymm" in asm and "zmm" not in asm
    assert _target_shape(cpu).vw == 8
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, words", [("pentium9", "x86-64-v3"), ("cortex-a76", "x86-64 level")])
def test_a_cpu_the_jit_cannot_target_is_refused(bad, words):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": np.zeros(4, np.float32)}, ["y"])
    with pytest.raises(glowgen.GlowgenError, match=words):
        glowgen.compile(model, cpu=bad)


def test_run_takes_cpu_and_threads(tmp_path, capsys):
    from glowgen.cli import main
    from conftest import REPO
    tiny = str(REPO / "examples" / "tiny_cnn.onnx")
    cpu = _cpu_or_skip("x86-64-v3")
    assert main(["run", tiny, "--cpu", cpu, "--threads", "2"]) == 0
    assert main(["run", tiny, "--cpu", "pentium9"]) == 2
    assert main(["run", tiny, "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "error: cpu='pentium9'" in err and "--threads must be at least 1" in err and "Traceback" not in err


def _decisions_model():
    """A GEMM convolution with a fused Relu, a depthwise one over planes, a 2-D max pool and
    a product with a constant right-hand side.  Its own seed: drawn from the module's
    generator, its data depended on which tests ran before it in the worker, and one draw
    summed 576 products to 1.3 with 2.4e-4 of rounding (over atol 1e-4)."""
    rng = np.random.default_rng(406)
    x = rng.standard_normal((1, 6, 12, 12)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], group=16, pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "w3"], ["y"])]
    inits = {"w1": rng.standard_normal((16, 6, 3, 3)).astype(np.float32),
             "b1": rng.standard_normal(16).astype(np.float32),
             "w2": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
             "w3": rng.standard_normal((16 * 36, 10)).astype(np.float32)}
    return make_model(nodes, {"x": x}, ["y"], inits), x


def test_lir_dump_shows_the_cpu_backends_decisions(tmp_path):
    """`glowgen dump --stage lir` prints the program after the cpu backend's passes: each
    kernel's strategy, packed layouts and scratch, and the steps with their fused epilogues."""
    import subprocess
    import sys
    model, _ = _decisions_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    r = subprocess.run([sys.executable, "-m", "glowgen.cli", "dump", str(path), "--stage", "lir"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    convs = [line for line in lines if " Conv @out" in line]
    assert "; strategy gemm, packed a, scratch " in convs[0], convs[0]
    assert "; strategy planes, scratch " in convs[1] and "packed" not in convs[1], convs[1]
    assert any(" MaxPool @out" in line and "; strategy planes" in line for line in lines)
    assert any(" BatchMatMul @out" in line and "; strategy gemm, packed b nr " in line for line in lines)
    assert any(line.startswith("cpu plan {") and "scratch act@" in line for line in lines)
    assert any("Conv+Relu [1, 16, 12, 12] 3x3 stride 1x1 (epilogue Relu)" in line for line in lines)
    # The memory report keeps the kernels' scratch apart from the arena it is compared with.
    r = subprocess.run([sys.executable, "-m", "glowgen.cli", "dump", str(path), "--stage", "lir", "--memory"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "kernel scratch" in r.stdout and "(after the arena)" in r.stdout, r.stdout


def test_code_emission_follows_the_recorded_strategy():
    """The kernel-strategy pass decides once; a pass after it that overrules it (here: every
    convolution in plain loops) is what the emitted code does, and it still matches."""
    from glowgen import api
    from glowgen.backends.cpu.backend import CpuBackend

    class PlainLoops(CpuBackend):
        name = "cpu-plain-loops"

        def lir_passes(self, options):
            passes = super().lir_passes(options)
            at = [name for name, _ in passes].index("kernel-strategy") + 1
            return passes[:at] + [("all-direct", _all_direct)] + passes[at:]

    def _all_direct(prog, registry):
        for ins in prog.instrs:
            if ins.kind == "Conv":
                ins.plan.strategy = "direct"

    model, x = _decisions_model()
    compiled = api.compile(model, backend=PlainLoops())
    convs = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert [c.plan.strategy for c in convs] == ["direct", "direct"]
    assert all(c.plan.packed is None and c.plan.scratch == 0 for c in convs)
    assert all(s.epilogue is None for s in compiled.program.plan.steps)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_large_window_convolution_with_few_filters_gets_its_scratch():
    """Too few filters per group for a GEMM tile and too many taps for the planes kernel:
    the GEMM strategy, whose padded planes need scratch memory (the scratch used to be
    worked out apart from the kernel's choice, found none, and the build crashed)."""
    x = rng.standard_normal((1, 2, 20, 20)).astype(np.float32)
    w = rng.standard_normal((4, 2, 9, 9)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[4, 4, 4, 4])], {"x": x}, ["y"], {"w": w})
    compiled = glowgen.compile(model, backend="cpu")
    (conv,) = [i for i in compiled.program.instrs if i.kind == "Conv"]
    assert conv.plan.strategy == "gemm" and conv.plan.scratch > 0
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
