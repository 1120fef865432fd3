"""Ops whose output shapes depend on run-time values (NonZero, Compress with a computed
condition, Unique): the specializing model cuts the graph at them, runs the part before,
computes the op natively and compiles the part after per resulting shape
(glowgen/staged.py).  Every answer is checked against onnxruntime."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen
from glowgen.errors import GlowgenError, UnsupportedError

from conftest import run_ort

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, initializers=None, opset=17):
    """inputs/outputs: [(name, elem type, dims)]; dims may hold names (dynamic)."""
    graph = helper.make_graph(
        nodes, "dd", [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _nonzero_gather(dims=("a", "b")):
    """x -> Relu -> NonZero -> Transpose -> GatherND of x by the indices -> ReduceSum, with
    the indices, the gathered values and their sum as outputs."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["picked"]),
             helper.make_node("ReduceSum", ["picked"], ["total"], keepdims=0)]
    rank = len(dims)
    return _model(nodes, [("x", F, list(dims))],
                  [("idx", I64, ["n", rank]), ("picked", F, ["n"]), ("total", F, [])])


def _nonzero_gather_rows():
    """NonZero of a 1-D mask computed from x, the rows of x it selects by Gather (axis 0)
    and their column sums by ReduceSum over axis 0."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=0),
             helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Squeeze", ["nz", "zero"], ["rows"]),
             helper.make_node("Gather", ["x", "rows"], ["g"], axis=0),
             helper.make_node("ReduceSum", ["g", "zero"], ["s"], keepdims=0)]
    return _model(nodes, [("x", F, ["a", "b"])], [("g", F, ["n", "b"]), ("s", F, ["b"])],
                  {"zero": np.array([0], np.int64)})


def _check(model, onnx_model, feeds):
    want = run_ort(onnx_model, feeds)
    got = model.run(feeds)
    for name, w in want.items():
        assert got[name].dtype == w.dtype, name
        assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=name)


def _sparse(shape, density, seed):
    """Values in [-1, 1], about `density` of them positive (so nonzero after Relu)."""
    rng = np.random.default_rng(seed)
    x = -rng.uniform(0.1, 1, shape).astype(np.float32)
    keep = rng.uniform(0, 1, shape) < density
    x[keep] = -x[keep]
    return x


DENSITIES = [0.0, 0.1, 0.5, 1.0]


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_nonzero_gather_and_sum_over_sparsities_and_shapes(backend):
    onnx_model = _nonzero_gather()
    model = glowgen.compile(onnx_model, backend=backend)
    for shape in [(3, 4), (5, 7), (1, 1)]:
        for k, density in enumerate(DENSITIES):
            _check(model, onnx_model, {"x": _sparse(shape, density, k)})
    assert len(model.pieces) == 2
    pieces = {v.piece for v in model.variants}
    assert pieces == {"until NonZero 'nz'", "after NonZero 'nz'"}


def test_nonzero_of_a_rank_3_tensor_and_rows_selected_by_gather():
    onnx_model = _nonzero_gather(("a", "b", "c"))
    model = glowgen.compile(onnx_model)
    for density in DENSITIES:
        _check(model, onnx_model, {"x": _sparse((2, 3, 4), density, 7)})
    onnx_model = _nonzero_gather_rows()
    model = glowgen.compile(onnx_model)
    for shape, density in [((6, 3), 0.3), ((6, 3), 0.0), ((4, 5), 1.0), ((9, 2), 0.5)]:
        _check(model, onnx_model, {"x": _sparse(shape, density, 3)})


def test_all_zeros_gives_an_empty_extent():
    onnx_model = _nonzero_gather()
    model = glowgen.compile(onnx_model)
    x = np.zeros((3, 4), np.float32)
    got = model.run({"x": x})
    assert got["idx"].shape == (0, 2) and got["picked"].shape == (0,)
    _check(model, onnx_model, {"x": x})


def test_a_repeated_extent_reuses_its_compiled_variant(caplog):
    onnx_model = _nonzero_gather()
    model = glowgen.compile(onnx_model)
    with caplog.at_level(logging.INFO, logger="glowgen.specialize"):
        _check(model, onnx_model, {"x": _sparse((4, 4), 0.5, 1)})
    compiles = model.stats["compiles"]
    assert compiles == 2                          # the part before and the part after
    assert "cut the graph at NonZero 'nz'" in caplog.text
    assert "[after NonZero 'nz'] nz=2x" in caplog.text
    n = int(np.count_nonzero(_sparse((4, 4), 0.5, 1) > 0))
    # Other values, as many nonzeros: both pieces are found compiled.
    x = _sparse((4, 4), 0.5, 1)[::-1].copy()
    assert np.count_nonzero(x > 0) == n
    _check(model, onnx_model, {"x": x})
    assert model.stats["compiles"] == compiles
    assert model.stats["hits"] == 2
    after = [v for v in model.variants if v.piece.startswith("after")]
    assert [v.shapes["nz"] for v in after] == [(2, n)] and after[0].calls == 2


def test_the_cache_bound_covers_every_piece():
    onnx_model = _nonzero_gather()
    model = glowgen.compile(onnx_model, max_variants=3)
    for k in range(4):                          # four extents: 1 + 4 variants wanted
        x = np.full((4, 4), -1, np.float32)
        x.reshape(-1)[:k + 1] = 1
        _check(model, onnx_model, {"x": x})
    assert len(model.variants) == 3
    assert model.stats["evictions"] == 2


def _compress(axis):
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("Greater", ["score", "limit"], ["keep"]),
             helper.make_node("Compress", ["x", "keep"], ["c"], **attrs),
             helper.make_node("Mul", ["c", "two"], ["y"])]
    out = ["n"] if axis is None else (["n", "b"] if axis == 0 else ["a", "n"])
    return _model(nodes, [("x", F, ["a", "b"]), ("score", F, ["k"])], [("y", F, out)],
                  {"limit": np.array(0.0, np.float32), "two": np.array(2.0, np.float32)})


@pytest.mark.parametrize("axis", [0, 1, -1, None], ids=["axis0", "axis1", "axis-1", "flattened"])
def test_compress_with_a_run_time_condition(axis):
    onnx_model = _compress(axis)
    model = glowgen.compile(onnx_model)
    rng = np.random.default_rng(2)
    for shape in [(4, 5), (3, 6)]:
        size = shape[0] * shape[1] if axis is None else shape[axis]
        for length in (size, size - 1):         # a shorter condition selects among the first
            for density in (0.0, 0.5, 1.0):
                score = np.where(rng.uniform(0, 1, length) < density, 1.0, -1.0).astype(np.float32)
                _check(model, onnx_model, {"x": rng.standard_normal(shape).astype(np.float32),
                                           "score": score})


def test_compress_with_a_condition_input_on_a_static_model():
    """Fixed shapes, the condition a model input: glowgen.compile cuts too (it used to compile
    a variant per condition value)."""
    nodes = [helper.make_node("Compress", ["x", "cond"], ["c"], axis=0),
             helper.make_node("Relu", ["c"], ["y"])]
    onnx_model = _model(nodes, [("x", F, [4, 3]), ("cond", B, [4])], [("y", F, ["n", 3])])
    model = glowgen.compile(onnx_model)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    for cond in ([1, 0, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]):
        _check(model, onnx_model, {"x": x, "cond": np.array(cond, bool)})
    # The first two conditions keep 3 and 2 rows: one variant after the cut each (and one
    # for the empty one); none for the part before, since Compress reads the inputs.
    assert sorted(v.shapes["c"][0] for v in model.variants) == [0, 2, 3]


def _unique(sorted_, axis=None):
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Unique", ["a"], ["y", "indices", "inverse", "counts"], **attrs),
             helper.make_node("Neg", ["y"], ["ny"]),
             helper.make_node("Cast", ["counts"], ["cf"], to=F),
             helper.make_node("ReduceSum", ["cf"], ["total"], keepdims=0)]
    y_dims = ["n"] if axis is None else ["a", "n"]
    return _model(nodes, [("x", I64 if axis is None else F, ["a", "b"])],
                  [("ny", I64 if axis is None else F, y_dims), ("indices", I64, ["n"]),
                   ("inverse", I64, ["m"]), ("counts", I64, ["n"]), ("total", F, [])])


@pytest.mark.parametrize("sorted_", [1, 0], ids=["sorted", "unsorted"])
def test_unique_with_all_outputs(sorted_):
    onnx_model = _unique(sorted_)
    model = glowgen.compile(onnx_model)
    rng = np.random.default_rng(5)
    for shape, high in [((3, 4), 3), ((5, 6), 50), ((2, 2), 1)]:
        _check(model, onnx_model, {"x": rng.integers(-high, high + 1, shape).astype(np.int64)})


def test_unique_along_an_axis():
    onnx_model = _unique(1, axis=1)
    model = glowgen.compile(onnx_model)
    x = np.array([[1, 2, 1, 3, 2], [0, 5, 0, 4, 5]], np.float32)
    _check(model, onnx_model, {"x": x})


def _nms(center_point_box, with_score_threshold):
    """Boxes and scores computed from the inputs (x 1, so the op reads run-time values),
    NonMaxSuppression, then the selected box indices gathered from the boxes."""
    inputs = ["b", "s", "limit", "iou"] + (["score_limit"] if with_score_threshold else [])
    nodes = [helper.make_node("Mul", ["boxes", "one"], ["b"]),
             helper.make_node("Mul", ["scores", "one"], ["s"]),
             helper.make_node("NonMaxSuppression", inputs, ["sel"],
                              center_point_box=center_point_box),
             helper.make_node("Gather", ["sel", "two"], ["which"], axis=1),
             helper.make_node("Gather", ["b", "which"], ["picked"], axis=1)]
    consts = {"one": np.array(1.0, np.float32), "two": np.array(2, np.int64),
              "limit": np.array([3], np.int64), "iou": np.array([0.4], np.float32),
              "score_limit": np.array([0.3], np.float32)}
    return _model(nodes, [("boxes", F, ["n", "k", 4]), ("scores", F, ["n", "c", "k"])],
                  [("sel", I64, ["m", 3]), ("picked", F, ["n", "m", 4])], consts)


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("with_score_threshold", [True, False], ids=["score_threshold", "all"])
def test_non_max_suppression(center_point_box, with_score_threshold):
    onnx_model = _nms(center_point_box, with_score_threshold)
    model = glowgen.compile(onnx_model)
    rng = np.random.default_rng(11)
    for batches, classes, k in [(1, 1, 6), (2, 3, 10), (1, 2, 1), (2, 1, 30)]:
        corners = rng.uniform(0, 10, (batches, k, 2)).astype(np.float32)
        sizes = rng.uniform(0.5, 4, (batches, k, 2)).astype(np.float32)
        if center_point_box:
            boxes = np.concatenate([corners, sizes], axis=2)
        else:                      # [y1, x1, y2, x2], some corners flipped
            boxes = np.concatenate([corners, corners + sizes], axis=2)[..., [0, 1, 2, 3]]
            boxes[:, ::3] = boxes[:, ::3][..., [2, 3, 0, 1]]
        scores = rng.uniform(0, 1, (batches, classes, k)).astype(np.float32)
        scores[..., ::4] = 0.5                                # ties
        _check(model, onnx_model, {"boxes": boxes, "scores": scores})


def test_two_cuts_in_sequence():
    """NonZero, then Compress on a condition computed after it: the part after the first
    cut is cut again."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["v"]),
             helper.make_node("Greater", ["v", "half"], ["big"]),
             helper.make_node("Compress", ["v", "big"], ["c"], axis=0),
             helper.make_node("Exp", ["c"], ["y"])]
    onnx_model = _model(nodes, [("x", F, ["a", "b"])], [("y", F, ["m"])],
                        {"half": np.array(0.5, np.float32)})
    model = glowgen.compile(onnx_model)
    for shape, density in [((3, 5), 0.5), ((3, 5), 1.0), ((2, 2), 0.0), ((6, 2), 0.7)]:
        x = _sparse(shape, density, 9)
        _check(model, onnx_model, {"x": x})
    pieces = {v.piece for v in model.variants}
    assert "after NonZero 'nz' | after Compress 'c'" in pieces
    assert "after NonZero 'nz' | until Compress 'c'" in pieces


def test_threads_one_and_two_give_identical_results():
    onnx_model = _nonzero_gather_rows()
    one, two = glowgen.compile(onnx_model, threads=1), glowgen.compile(onnx_model, threads=2)
    for shape, density in [((64, 33), 0.4), ((128, 17), 0.9), ((5, 5), 0.0)]:
        x = _sparse(shape, density, 4)
        a, b = one.run({"x": x}), two.run({"x": x})
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
        _check(two, onnx_model, {"x": x})


def test_concurrent_callers_get_right_answers():
    onnx_model = _nonzero_gather()
    model = glowgen.compile(onnx_model)
    feeds = [{"x": _sparse(shape, d, seed)} for seed, (shape, d) in
             enumerate([((3, 4), 0.5), ((5, 2), 0.0), ((3, 4), 1.0), ((6, 6), 0.3)] * 2)]
    wants = [run_ort(onnx_model, f) for f in feeds]
    errors, barrier = [], threading.Barrier(4)

    def call(t):
        try:
            barrier.wait()
            for k in range(t, len(feeds), 4):
                got = model.run(feeds[k])
                for name, w in wants[k].items():
                    assert got[name].shape == w.shape
                    np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5)
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=call, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    # each signature compiled once, however many threads met it at once
    keys = [(v.piece, tuple(sorted(v.shapes.items()))) for v in model.variants]
    assert len(keys) == len(set(keys))


def test_constant_operands_fold_at_import():
    nodes = [helper.make_node("NonZero", ["c"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["f"], to=F),
             helper.make_node("Add", ["x", "f"], ["y"])]
    c = np.array([[0, 3, 0], [2, 0, 1]], np.float32)
    onnx_model = _model(nodes, [("x", F, [2, 3])], [("y", F, [2, 3])], {"c": c})
    model = glowgen.compile(onnx_model)
    assert isinstance(model, glowgen.CompiledModel)         # compiled ahead of time
    _check(model, onnx_model, {"x": np.ones((2, 3), np.float32)})


def test_a_data_dependent_op_in_a_loop_body_is_not_cut():
    """Inside a Loop body the graph is not cut: compiled ahead of time, a clear error says
    so; glowgen.compile(model) compiles per value of the input behind it instead."""
    body = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]),
         helper.make_node("ReduceSum", ["nz"], ["s"], keepdims=0),
         helper.make_node("Cast", ["s"], ["sf"], to=F),
         helper.make_node("Add", ["acc", "sf"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []),
                 helper.make_tensor_value_info("cond", B, []),
                 helper.make_tensor_value_info("acc", F, [])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("acc_out", F, [])])
    onnx_model = _model([helper.make_node("Loop", ["two", "", "zero"], ["y"], body=body)],
                        [("x", F, [3])], [("y", F, [])],
                        {"zero": np.array(0.0, np.float32), "two": np.array(2, np.int64)})
    with pytest.raises(UnsupportedError, match="NonZero node 'nz' is inside a Loop, If or Scan "
                                               "body.*per value of 'x'"):
        glowgen.compile(onnx_model, specialize=False)
    model = glowgen.compile(onnx_model)
    for x in ([1, 0, 2], [0, 0, 0], [3, 3, 3]):
        _check(model, onnx_model, {"x": np.array(x, np.float32)})
    assert model.deciding_inputs == ["x"] and not model.pieces


def _count_nonzero(src):
    """Nodes counting the nonzero elements of `src` into `cf` (f32[]) through NonZero."""
    return [helper.make_node("NonZero", [src], ["nz"], name="nz"),
            helper.make_node("Shape", ["nz"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["count"], axis=0),
            helper.make_node("Cast", ["count"], ["cf"], to=F)]


def test_a_data_dependent_op_in_a_run_time_if_branch():
    """An If with a run-time condition whose branch holds a NonZero of a model input: the
    If cannot run as a conditional (its branch is not static), so the model is compiled per
    value of the condition and the input (each call here a new variant), matching
    onnxruntime on either branch."""
    then = helper.make_graph(_count_nonzero("x"), "then", [], [helper.make_tensor_value_info("cf", F, [])])
    orelse = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)], "else", [],
                               [helper.make_tensor_value_info("total", F, [])])
    onnx_model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=orelse)],
                        [("x", F, [4]), ("c", B, [])], [("y", F, [])], {"one": np.array(0, np.int64)})
    with pytest.raises(UnsupportedError, match="condition.*NonZero node 'nz' is inside a Loop, If or "
                                               "Scan body.*per value of 'x'"):
        glowgen.compile(onnx_model, specialize=False)
    model = glowgen.compile(onnx_model)
    for x, c in (([1, 0, 2, 0], True), ([0, 0, 0, 0], True), ([1, 0, 2, 0], False), ([3, 3, 0, 3], True)):
        _check(model, onnx_model, {"x": np.array(x, np.float32), "c": np.array(c)})
    assert model.stats["compiles"] == 4


def test_a_data_dependent_op_on_a_run_time_loop_s_state():
    """A Loop with a run-time trip count whose body counts the positive elements of the
    state it carries: not a native loop (its body is not static); the error names the body's
    state, not as an input to bind; glowgen.compile unrolls it per value of the trip count
    and the initial state."""
    body = helper.make_graph(
        [helper.make_node("Greater", ["s", "zero"], ["positive"])] + _count_nonzero("positive") +
        [helper.make_node("Sub", ["s", "half"], ["s_out"]),
         helper.make_node("Add", ["acc", "cf"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond", B, []),
         helper.make_tensor_value_info("s", F, [4]), helper.make_tensor_value_info("acc", F, [])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("s_out", F, [4]),
         helper.make_tensor_value_info("acc_out", F, [])])
    onnx_model = _model([helper.make_node("Loop", ["M", "", "x", "zero"], ["s", "y"], body=body)],
                        [("x", F, [4]), ("M", I64, [])], [("s", F, [4]), ("y", F, [])],
                        {"one": np.array(0, np.int64), "zero": np.array(0, np.float32),
                         "half": np.array(0.5, np.float32)})
    with pytest.raises(UnsupportedError, match="trip count.*NonZero node 'nz'.*per value of the model "
                                               "inputs behind the body's 's'"):
        glowgen.compile(onnx_model, specialize=False)
    model = glowgen.compile(onnx_model)
    for x, trips in (([1, 0, 2, -1], 3), ([1, 0, 2, -1], 0), ([0.4, 2, 3, 1], 5)):
        _check(model, onnx_model, {"x": np.array(x, np.float32), "M": np.array(trips, np.int64)})
    assert sorted(model.deciding_inputs) == ["M", "x"]


def test_fixed_input_shapes_say_how_to_compile_such_a_model():
    with pytest.raises(GlowgenError, match="depends on the values of its operands.*specialize=True"):
        glowgen.compile(_nonzero_gather(), input_shapes={"x": (3, 4)})
