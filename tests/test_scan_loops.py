"""Loops that scan and stack, run natively: an ONNX Loop with scan outputs and a Scan become a
WhileLoop over their body compiled once (engine/control.py) when they run more than
`onnx_control.UNROLL_AT_MOST` iterations; iteration i reads slice i of each scan input and
writes slice i of each scan output in place (lir.ir.SliceView).  Every case runs both ways
(natively, with the limit set to 0, and as the importer chooses), on both backends, and is
checked against onnxruntime."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen
from glowgen.api import CompiledModel
from glowgen.cli import main
from glowgen.engine.control import WhileLoop
from glowgen.errors import UnsupportedError
from glowgen.frontend import onnx_control
from glowgen.lir.control import regions
from glowgen.lir.ir import Instr, SliceView, dynamic_views

from conftest import assert_close, run_ort

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _model(nodes, inputs, outputs, initializers=None, opset=17):
    graph = helper.make_graph(nodes, "scan_loops", [_vi(*i) for i in inputs], [_vi(*o) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(params=["native", "chosen"])
def unroll_limit(request, monkeypatch):
    """`native`: every Loop with a known trip count and every Scan runs as a native loop,
    however short; `chosen`: the importer's own limit (short ones unrolled)."""
    if request.param == "native":
        monkeypatch.setattr(onnx_control, "UNROLL_AT_MOST", 0)
    return request.param


def _loops(model) -> list:
    return [r for r in regions(model.program.instrs) if r.kind == Instr.LOOP]


# ----------------------------------------------------------------------------- Loop
def _loop_with_scan_output(n=8):
    """s <- tanh(s * w + x) + i / 8 for M iterations, M a model input; the scan outputs
    stack 2 * s and the iteration number."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["fi", "eighth"], ["fi8"]),
         helper.make_node("Mul", ["s_in", "w"], ["a"]),
         helper.make_node("Add", ["a", "x"], ["b"]),
         helper.make_node("Tanh", ["b"], ["t"]),
         helper.make_node("Add", ["t", "fi8"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "two"], ["doubled"]),
         helper.make_node("Identity", ["i"], ["index"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("s_in", F, [n])],
        [_vi("c_out", BOOL, []), _vi("s_out", F, [n]), _vi("doubled", F, [n]), _vi("index", I64, [])])
    loop = helper.make_node("Loop", ["M", "", "x"], ["s", "ys", "indices"], body=body)
    return _model([loop], [("x", F, [n]), ("M", I64, [])],
                  [("s", F, [n]), ("ys", F, [None, n]), ("indices", I64, [None])],
                  {"w": np.linspace(-1, 1, n).astype(np.float32), "two": np.array(2, np.float32),
                   "eighth": np.array(0.125, np.float32)})


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_loop_with_a_run_time_trip_count_and_scan_outputs(backend, unroll_limit):
    """The scan outputs' length is the trip count, so glowgen.compile specializes per trip
    count; each variant runs the body as a loop (or unrolls a few iterations)."""
    onnx_model = _loop_with_scan_output()
    model = glowgen.compile(onnx_model, backend=backend)
    for trips in (0, 1, 7, 300, 7):
        feeds = {"x": _f32(8, seed=trips), "M": np.array(trips, np.int64)}
        got = model.run(feeds)
        assert got["ys"].shape == (trips, 8) and got["indices"].shape == (trips,)
        assert_close(got, run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)
    assert model.stats["compiles"] == 4


def test_a_long_loop_with_a_known_trip_count_compiles_to_one_loop():
    """300 iterations bound at compile time: one loop in the LIR whose body writes the
    stacked result straight into its slice (no copy), and the state in place."""
    model = glowgen.compile(_loop_with_scan_output(), constant_inputs={"M": np.array(300, np.int64)})
    assert isinstance(model, CompiledModel)
    (loop,) = _loops(model)
    body = model.program.instrs[loop.start + 1:loop.end]
    assert any(ins.kind == "Mul" and isinstance(ins.writes()[0], SliceView) for ins in body)
    # No copy of an f32[8] (the state, or 2 * s): only the iteration number, the loop
    # counter itself, is copied into its slice.
    assert [ins.reads()[0].type for ins in body if ins.kind == Instr.COPY] == [
        model.program.instrs[loop.start].operands[1][1].type]


def test_scan_outputs_of_a_loop_that_may_stop_early_are_a_clear_error():
    """A scan output's length is the number of iterations run: with a condition computed
    from data, which may stop the loop before its trip count, it is not known while
    compiling, so such a loop is never a native loop; unrolling cannot fold the condition
    either, and the error says both."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "one"], ["s_out"]),
         helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["c_out"]),
         helper.make_node("Identity", ["s_out"], ["scan"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("s_in", F, [2])],
        [_vi("c_out", BOOL, []), _vi("s_out", F, [2]), _vi("scan", F, [2])])
    onnx_model = _model([helper.make_node("Loop", ["M", "go", "x"], ["s", "ys"], body=body)],
                        [("x", F, [2])], [("s", F, [2]), ("ys", F, [None, 2])],
                        {"M": np.array(40, np.int64), "go": np.array(True), "one": np.array(1, np.float32),
                         "limit": np.array(30.0, np.float32)})
    with pytest.raises(UnsupportedError, match=r"condition depends on data computed in the loop.*"
                                               r"it has scan outputs"):
        glowgen.compile(onnx_model)


# ----------------------------------------------------------------------------- Scan
def _scan_model(length, reverse, n=6, axis=0):
    """Two states (a running sum through tanh, and a product), one scan input read forwards
    or backwards (along `axis`), two scan outputs written forwards or backwards (along
    `axis`); the body reads `k` from the enclosing graph."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["a"]),
         helper.make_node("Tanh", ["a"], ["s_out"]),
         helper.make_node("Mul", ["p_in", "k"], ["p_out"]),
         helper.make_node("Mul", ["s_out", "x_t"], ["y_t"]),
         helper.make_node("Sub", ["p_out", "s_in"], ["z_t"])], "body",
        [_vi("s_in", F, [n]), _vi("p_in", F, [n]), _vi("x_t", F, [n])],
        [_vi("s_out", F, [n]), _vi("p_out", F, [n]), _vi("y_t", F, [n]), _vi("z_t", F, [n])])
    scan = helper.make_node("Scan", ["s0", "p0", "xs"], ["s", "p", "ys", "zs"], body=body,
                            num_scan_inputs=1, scan_input_directions=[reverse],
                            scan_output_directions=[reverse, 1 - reverse],
                            scan_input_axes=[axis], scan_output_axes=[axis, 0])
    xs_shape = [length, n] if axis == 0 else [n, length]
    return _model([scan], [("s0", F, [n]), ("p0", F, [n]), ("xs", F, xs_shape)],
                  [("s", F, [n]), ("p", F, [n]), ("ys", F, xs_shape), ("zs", F, [length, n])],
                  {"k": np.full(n, 0.99, np.float32)})


def _scan_feeds(length, n=6, axis=0, seed=0):
    xs = _f32(length, n, seed=seed)
    return {"s0": _f32(n, seed=seed + 1), "p0": _f32(n, seed=seed + 2),
            "xs": xs if axis == 0 else np.ascontiguousarray(xs.T)}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("length", [1, 5, 200])
def test_scan_forward_and_reverse(backend, reverse, length, unroll_limit):
    onnx_model = _scan_model(length, reverse)
    model = glowgen.compile(onnx_model, backend=backend)
    feeds = _scan_feeds(length, seed=length)
    assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)
    native = unroll_limit == "native" or length > onnx_control.UNROLL_AT_MOST
    assert len(_loops(model)) == (1 if native else 0)


@pytest.mark.parametrize("reverse", [0, 1])
def test_the_graph_reference_runs_a_scanning_loop(reverse):
    """glowgen/reference evaluates the WhileLoop node itself (what constant folding and the
    golden tests use), slices and directions included."""
    from glowgen.reference import evaluate
    onnx_model = _scan_model(30, reverse)
    feeds = _scan_feeds(30, seed=11)
    model = glowgen.compile(onnx_model, backend="interpreter")
    assert any(isinstance(n, WhileLoop) for n in model.function.nodes)
    assert_close(evaluate(model.function, feeds, model.registry), run_ort(onnx_model, feeds),
                 rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_scan_along_another_axis(backend, unroll_limit):
    """A scan input and output along axis 1: transposed before and after the loop."""
    onnx_model = _scan_model(40, 1, axis=1)
    feeds = _scan_feeds(40, axis=1, seed=3)
    model = glowgen.compile(onnx_model, backend=backend)
    assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)


def _scan_in_a_model(length, batch, n):
    """A small recurrent net: a MatMul projects every step's input before the Scan, whose
    body multiplies the state by a recurrent weight it captures and adds the step's
    projection; a Relu and a ReduceMean follow it."""
    rng = np.random.default_rng(7)
    w_in = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    w_rec = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "w_rec"], ["r"]),
         helper.make_node("Add", ["r", "u_t"], ["a"]),
         helper.make_node("Tanh", ["a"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["y_t"])], "body",
        [_vi("h_in", F, [batch, n]), _vi("u_t", F, [batch, n])],
        [_vi("h_out", F, [batch, n]), _vi("y_t", F, [batch, n])])
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["u"]),
             helper.make_node("Scan", ["h0", "u"], ["h", "ys"], body=body, num_scan_inputs=1),
             helper.make_node("Relu", ["ys"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[0], keepdims=0),
             helper.make_node("Add", ["m", "h"], ["out"])]
    return _model(nodes, [("x", F, [length, batch, n]), ("h0", F, [batch, n])],
                  [("out", F, [batch, n]), ("ys", F, [length, batch, n])],
                  {"w_in": w_in, "w_rec": w_rec}, opset=17)


def test_scan_inside_a_model_at_one_and_two_threads():
    """Steps inside the loop are split among threads like any others, each element computed
    by the same code in the same order: two threads give the answer of one bit for bit."""
    onnx_model = _scan_in_a_model(length=24, batch=64, n=256)
    feeds = {"x": _f32(24, 64, 256, seed=1), "h0": _f32(64, 256, seed=2)}
    want = run_ort(onnx_model, feeds)
    one = glowgen.compile(onnx_model, threads=1)
    two = glowgen.compile(onnx_model, threads=2)
    got1, got2 = one.run(feeds), two.run(feeds)
    assert_close(got1, want, rtol=1e-4, atol=1e-4)
    for name in got1:
        np.testing.assert_array_equal(got1[name], got2[name])
    assert len(_loops(two)) == 1
    steps, inside, depth = two.program.plan.steps, [], 0
    for step in steps:
        depth += step.instrs[0].kind == Instr.LOOP
        depth -= step.instrs[0].kind == Instr.ENDLOOP
        if depth and step.instrs[0].kind not in Instr.CONTROL:
            inside.append(step)
    assert any(step.parts > 1 for step in inside)
    assert isinstance(next(n for n in two.function.nodes if n.subfunctions()), WhileLoop)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_scan_inside_a_model(backend):
    onnx_model = _scan_in_a_model(length=20, batch=2, n=8)
    feeds = {"x": _f32(20, 2, 8, seed=4), "h0": _f32(2, 8, seed=5)}
    assert_close(glowgen.compile(onnx_model, backend=backend).run(feeds), run_ort(onnx_model, feeds),
                 rtol=1e-5, atol=1e-5)


def test_a_long_scan_compiles_to_one_loop_over_its_body():
    """1000 steps: one loop whose body is compiled once (the LIR has as many instructions as
    for 20 steps), reading its scan input's slices in place."""
    short, long = (glowgen.compile(_scan_model(length, 0)) for length in (20, 1000))
    assert len(long.program.instrs) == len(short.program.instrs)
    (loop,) = _loops(long)
    body = long.program.instrs[loop.start + 1:loop.end]
    assert any(isinstance(b, SliceView) and b.root() is long.program.inputs["xs"]
               for ins in body for b in ins.reads())


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_scan_bundle(tmp_path, capsys):
    """A bundle's entry point computes the slices' addresses from the loop counter too."""
    length, n = 40, 6
    onnx_model = _scan_model(length, 1, n)
    program = _built_bundle(onnx_model, "sc", tmp_path, capsys)
    feeds = _scan_feeds(length, n, seed=9)
    got = _run_bundle(program, feeds, {"s": (n,), "p": (n,), "ys": (length, n), "zs": (length, n)}, tmp_path)
    assert_close(got, run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)


def _built_bundle(onnx_model, name: str, tmp_path, capsys):
    """`glowgen compile` of the model into a bundle, linked with its example main.c by gcc:
    the program's path."""
    import subprocess
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    out = tmp_path / "out"
    assert main(["compile", str(path), "-o", str(out), "--name", name]) == 0
    capsys.readouterr()
    done = subprocess.run(["gcc", "-O2", "-pthread", "main.c", f"{name}.o", "-lm", "-o", name], cwd=out,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out / name


def _run_bundle(program, feeds: dict, shapes: dict, tmp_path) -> dict:
    """The bundle program run on the feeds (written to .bin files): its outputs of `shapes`."""
    import subprocess
    for name, value in feeds.items():
        value.tofile(tmp_path / f"{name}.bin")     # each in its own type (a trip count: i64)
    files = [str(tmp_path / f"{k}.bin") for k in list(feeds) + list(shapes)]
    done = subprocess.run([str(program), *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {k: np.fromfile(tmp_path / f"{k}.bin", "<f4").reshape(shape) for k, shape in shapes.items()}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_scan_inside_a_scan(backend):
    """Nested loops: the inner Scan scans the outer one's slice (a slice of a slice, two
    counters) and its stacked result becomes the outer one's slice (computed there)."""
    outer_len, inner_len, n = 20, 18, 5
    inner = helper.make_graph(
        [helper.make_node("Add", ["t_in", "r"], ["a"]),
         helper.make_node("Tanh", ["a"], ["t_out"]),
         helper.make_node("Mul", ["t_out", "r"], ["y"])], "inner",
        [_vi("t_in", F, [n]), _vi("r", F, [n])], [_vi("t_out", F, [n]), _vi("y", F, [n])])
    outer = helper.make_graph(
        [helper.make_node("Scan", ["s_in", "x_t"], ["s_out", "ys_t"], body=inner, num_scan_inputs=1,
                          scan_input_directions=[1])], "outer",
        [_vi("s_in", F, [n]), _vi("x_t", F, [inner_len, n])],
        [_vi("s_out", F, [n]), _vi("ys_t", F, [inner_len, n])])
    onnx_model = _model(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=outer, num_scan_inputs=1,
                          scan_output_directions=[1])],
        [("s0", F, [n]), ("xs", F, [outer_len, inner_len, n])],
        [("s", F, [n]), ("ys", F, [outer_len, inner_len, n])])
    model = glowgen.compile(onnx_model, backend=backend)
    assert [r.depth for r in _loops(model)] == [0, 1]
    feeds = {"s0": _f32(n, seed=1), "xs": _f32(outer_len, inner_len, n, seed=2)}
    assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- alternating state
def _recurrent_loop(n, scan_output=True, last="Sub"):
    """A Loop of M iterations (a model input) carrying three states: a leaky RNN's h <- h -
    (h - tanh(h @ W + x)) / 2 (its last op, like its first, reads the old h: the new one
    cannot be computed over it) or, with `last="Relu"`, h <- relu(h @ W + x) (a product
    whose input is the old state, the stack in its store writing the new); and two values
    a, b swapped every iteration.  With `scan_output`, every h is also stacked."""
    if last == "Relu":
        nodes = [helper.make_node("Gemm", ["h_in", "W", "x"], ["g"]),
                 helper.make_node("Relu", ["g"], ["h_out"])]
    else:
        nodes = [helper.make_node("MatMul", ["h_in", "W"], ["r"]),
                 helper.make_node("Add", ["r", "x"], ["u"]),
                 helper.make_node("Tanh", ["u"], ["t"]),
                 helper.make_node("Sub", ["h_in", "t"], ["d"]),
                 helper.make_node("Mul", ["d", "half"], ["e"]),
                 helper.make_node("Sub", ["h_in", "e"], ["h_out"])]
    nodes += [helper.make_node("Identity", ["b_in"], ["a_out"]),
              helper.make_node("Identity", ["a_in"], ["b_out"]),
              helper.make_node("Identity", ["c_in"], ["c_out"])]
    outs = [_vi("c_out", BOOL, []), _vi("h_out", F, [1, n]), _vi("a_out", F, [3]), _vi("b_out", F, [3])]
    if scan_output:
        nodes.append(helper.make_node("Identity", ["h_out"], ["h_seq"]))
        outs.append(_vi("h_seq", F, [1, n]))
    body = helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("h_in", F, [1, n]),
                                             _vi("a_in", F, [3]), _vi("b_in", F, [3])], outs)
    results = ["h", "a", "b"] + (["hs"] if scan_output else [])
    loop = helper.make_node("Loop", ["M", "", "h0", "a0", "b0"], results, body=body)
    rng = np.random.default_rng(3)
    return _model([loop], [("h0", F, [1, n]), ("a0", F, [3]), ("b0", F, [3]), ("x", F, [1, n]), ("M", I64, [])],
                  [("h", F, [1, n]), ("a", F, [3]), ("b", F, [3])] + ([("hs", F, [None, 1, n])] if scan_output else []),
                  {"W": (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32),
                   "half": np.array(0.5, np.float32)})


def _recurrent_feeds(n, trips, seed=0):
    return {"h0": _f32(1, n, seed=seed), "a0": _f32(3, seed=seed + 1), "b0": _f32(3, seed=seed + 2),
            "x": _f32(1, n, seed=seed + 3), "M": np.array(trips, np.int64)}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("scan_output", [False, True])
def test_a_state_computed_from_itself_alternates_between_two_slots(backend, scan_output, unroll_limit):
    """The new h is computed while the old one is read (ir.SliceView with a phase): each
    iteration reads one slot and writes the other, the final state is wherever the last
    iteration left it (0, 1, 2, odd and even trip counts), the swapped pair is swapped an
    odd number of times or not, and the state is stacked as well."""
    onnx_model = _recurrent_loop(16, scan_output)
    model = glowgen.compile(onnx_model, backend=backend)
    for trips in (0, 1, 2, 3, 4, 7, 40):
        feeds = _recurrent_feeds(16, trips, seed=trips)
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)


def test_an_alternating_state_is_not_copied_in_the_loop():
    """In the loop's body, the op computing h writes the slot the next iteration reads (no
    copy of h), and each of the swapped values is copied once (not aside and back)."""
    model = glowgen.compile(_recurrent_loop(16, scan_output=False))
    (loop,) = _loops(model)
    body = model.program.instrs[loop.start + 1:loop.end]
    last = [ins for ins in body if ins.kind == "Sub"][-1]
    assert [v.phase for v in dynamic_views(last.writes()[0])] == [1]
    assert sorted(str(ins.reads()[0].type) for ins in body if ins.kind == Instr.COPY) == ["f32[3]"] * 2


def test_a_state_computed_in_place_keeps_one_buffer():
    """s <- tanh(s + x_t): the old s is read before the new one is computed, so the Tanh
    writes it over the old (two slots would double its footprint for nothing)."""
    n = 64
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["a"]),
                              helper.make_node("Tanh", ["a"], ["s_out"])], "body",
                             [_vi("s_in", F, [n]), _vi("x_t", F, [n])], [_vi("s_out", F, [n])])
    onnx_model = _model([helper.make_node("Scan", ["s0", "xs"], ["s"], body=body, num_scan_inputs=1)],
                        [("s0", F, [n]), ("xs", F, [30, n])], [("s", F, [n])])
    model = glowgen.compile(onnx_model)
    (loop,) = _loops(model)
    body_instrs = model.program.instrs[loop.start + 1:loop.end]
    assert not any(v.phase is not None for ins in body_instrs for b in ins.buffers() for v in dynamic_views(b))
    assert not any(ins.kind == Instr.COPY for ins in body_instrs)
    feeds = {"s0": _f32(n, seed=1), "xs": _f32(30, n, seed=2)}
    assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("last", ["Sub", "Relu"])
def test_alternating_state_at_one_and_two_threads(last):
    """A state wide enough to split: two threads give one's answer bit for bit.  With Relu
    the product reading the old state applies the Relu in its store, into the new one (the
    same buffer, it would read values it has just overwritten: 0.6 off at 1024)."""
    onnx_model = _recurrent_loop(1024, scan_output=False, last=last)
    one = glowgen.compile(onnx_model, threads=1)
    two = glowgen.compile(onnx_model, threads=2)
    for trips in (0, 3, 6):
        feeds = _recurrent_feeds(1024, trips, seed=5)
        got1, got2 = one.run(feeds), two.run(feeds)
        assert_close(got1, run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-4)
        for name in got1:
            np.testing.assert_array_equal(got1[name], got2[name])


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_alternating_state_bundle(tmp_path, capsys):
    """A bundle's entry point places the two slots by the counter's parity too; the trip
    count is the bundle's input."""
    n = 16
    onnx_model = _recurrent_loop(n, scan_output=False)
    program = _built_bundle(onnx_model, "rnn", tmp_path, capsys)
    for trips in (4, 7):
        feeds = _recurrent_feeds(n, trips, seed=trips)
        got = _run_bundle(program, feeds, {"h": (1, n), "a": (3,), "b": (3,)}, tmp_path)
        assert_close(got, run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)
