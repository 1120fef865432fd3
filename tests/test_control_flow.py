"""Control flow decided at run time: an If whose condition is known only when the model runs
(and whose branches give the same types) is compiled once, both branches into one program
(a `cond` region of the LIR), one branch run per call.  Every answer is checked against
onnxruntime, on both backends, at one and two threads, and in a bundle built with gcc."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen
from glowgen.api import CompiledModel
from glowgen.cli import main
from glowgen.errors import GlowgenError
from glowgen.lir.control import regions
from glowgen.lir.ir import Activation, Instr

from conftest import assert_close, run_ort

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def _model(nodes, inputs, outputs, initializers=None, opset=17):
    graph = helper.make_graph(
        nodes, "cond", [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _branch(nodes, outputs, name):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(n, F, None) for n in outputs])


def _sample_rate_model(rows=128, n=256):
    """y = If(Equal(sr, 16000)) between a matrix product with a Relu and one with a Tanh,
    both over a value computed before the If, and used after it: the audio models of
    issue 15, big enough that the products split among two threads."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    w2 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    then = _branch([helper.make_node("MatMul", ["h", "w1"], ["a"]),
                    helper.make_node("Relu", ["a"], ["t"])], ["t"], "then")
    other = _branch([helper.make_node("MatMul", ["h", "w2"], ["b"]),
                     helper.make_node("Tanh", ["b"], ["u"]),
                     helper.make_node("Mul", ["u", "h"], ["e"])], ["e"], "else")
    nodes = [helper.make_node("Equal", ["sr", "k"], ["c"]),
             helper.make_node("Mul", ["x", "half"], ["h"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["y", "x"], ["z"])]
    return _model(nodes, [("x", F, [rows, n]), ("sr", I64, [])], [("z", F, [rows, n])],
                  {"k": np.array(16000, np.int64), "half": np.array(0.5, np.float32),
                   "w1": w1, "w2": w2})


def _feeds(sr, seed, rows=128, n=256):
    x = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)
    return {"x": x, "sr": np.array(sr, np.int64)}


RATES = (16000, 8000, 44100, 16000, 22050)


def _branch_steps(program):
    """The cpu plan's steps inside a region (between a `cond` and its `endcond`)."""
    steps = program.plan.steps
    inside, depth = [], 0
    for step in steps:
        kind = step.instrs[0].kind
        if kind == Instr.COND:
            depth += 1
        elif kind == Instr.ENDCOND:
            depth -= 1
        elif depth and kind != Instr.ELSE:
            inside.append(step)
    return inside


@pytest.mark.parametrize("backend, threads", [("interpreter", 1), ("cpu", 1), ("cpu", 2)])
def test_if_on_an_input_compiles_once_and_runs_either_branch(backend, threads):
    onnx_model = _sample_rate_model()
    options = {"threads": threads} if backend == "cpu" else {}
    model = glowgen.compile(onnx_model, backend=backend, **options)
    assert isinstance(model, CompiledModel)          # no specialization per condition value
    for seed, sr in enumerate(RATES):
        feeds = _feeds(sr, seed)
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-5)
    kinds = [ins.kind for ins in model.program.instrs]
    assert kinds.count(Instr.COND) == kinds.count(Instr.ELSE) == kinds.count(Instr.ENDCOND) == 1
    if backend == "cpu" and threads == 2:
        # The products inside the branches are split among the threads as anywhere else.
        assert any(step.parts > 1 for step in _branch_steps(model.program))
        assert model._runner.split_steps


def test_branches_share_the_arena():
    """Only one branch runs per call, so the buffers of the then-branch and those of the
    else-branch may take the same bytes: the arena is smaller than both together."""
    rng = np.random.default_rng(1)
    ws = {f"w{i}": rng.standard_normal((64, 64)).astype(np.float32) for i in range(4)}
    then = _branch([helper.make_node("MatMul", ["x", "w0"], ["a"]),
                    helper.make_node("MatMul", ["x", "w1"], ["b"]),
                    helper.make_node("Add", ["a", "b"], ["t"])], ["t"], "then")
    other = _branch([helper.make_node("MatMul", ["x", "w2"], ["c"]),
                     helper.make_node("MatMul", ["x", "w3"], ["d"]),
                     helper.make_node("Mul", ["c", "d"], ["e"])], ["e"], "else")
    onnx_model = _model([helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
                        [("x", F, [64, 64]), ("flag", BOOL, [])], [("y", F, [64, 64])], ws)
    model = glowgen.compile(onnx_model, backend="interpreter")
    prog = model.program
    (region,) = regions(prog.instrs)

    def written(lo, hi):
        return {id(b.root()): b.root() for ins in prog.instrs[lo:hi] for b in ins.writes()
                if isinstance(b.root(), Activation) and ins.kind != Instr.ALLOC}

    then_bufs = written(region.start + 1, region.orelse)
    else_bufs = [b for k, b in written(region.orelse + 1, region.end).items() if k not in then_bufs]
    shared = [(a, b) for a in then_bufs.values() for b in else_bufs
              if a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes]
    assert shared, "no buffer of the else-branch reuses the then-branch's bytes"
    both = sum(b.nbytes for b in prog.activations)
    assert prog.region_sizes["activation"] < both
    for flag in (True, False, True):
        feeds = {"x": rng.standard_normal((64, 64)).astype(np.float32), "flag": np.array(flag)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-4)


def _nested_model():
    """An If inside a branch of another, deciding on another input; the inner branches read
    a value the outer branch computed, a model input, and a constant of the main graph.
    Two outputs, one of which a branch returns as it is (its Identity removed)."""
    inner_then = _branch([helper.make_node("Add", ["p", "bias"], ["q"])], ["q"], "inner_then")
    inner_else = _branch([helper.make_node("Sub", ["p", "x"], ["r"])], ["r"], "inner_else")
    outer_then = _branch([helper.make_node("Sigmoid", ["x"], ["p"]),
                          helper.make_node("Greater", ["mode", "zero"], ["c2"]),
                          helper.make_node("If", ["c2"], ["o"], then_branch=inner_then,
                                           else_branch=inner_else),
                          helper.make_node("Identity", ["x"], ["xi"])], ["o", "xi"], "outer_then")
    outer_else = _branch([helper.make_node("Neg", ["x"], ["n"]),
                          helper.make_node("Abs", ["x"], ["m"])], ["n", "m"], "outer_else")
    nodes = [helper.make_node("Equal", ["sr", "k"], ["c"]),
             helper.make_node("If", ["c"], ["y1", "y2"], then_branch=outer_then, else_branch=outer_else)]
    return _model(nodes, [("x", F, [3, 5]), ("sr", I64, []), ("mode", I64, [1])],
                  [("y1", F, [3, 5]), ("y2", F, [3, 5])],
                  {"k": np.array(16000, np.int64), "zero": np.array([0], np.int64),
                   "bias": np.arange(5, dtype=np.float32)})


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_nested_ifs_with_captured_values_and_two_outputs(backend):
    onnx_model = _nested_model()
    model = glowgen.compile(onnx_model, backend=backend)
    assert isinstance(model, CompiledModel)
    rng = np.random.default_rng(2)
    for sr in (16000, 8000):
        for mode in (1, -1):
            feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32),
                     "sr": np.array(sr, np.int64), "mode": np.array([mode], np.int64)}
            assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)
    assert len(regions(model.program.instrs)) == 2


def test_graph_and_lir_dumps_show_the_branches(tmp_path, capsys):
    path = tmp_path / "sr.onnx"
    path.write_bytes(_sample_rate_model(rows=2, n=8).SerializeToString())
    assert main(["dump", str(path), "--stage", "lowered"]) == 0
    text = capsys.readouterr().out
    assert "= Conditional(%c, [%h])" in text and "graph y.then {" in text and "graph y.else {" in text
    assert main(["dump", str(path), "--stage", "lir"]) == 0
    text = capsys.readouterr().out
    assert "cond @in %c" in text and "\n  " in text and "endcond" in text
    assert "step" in text and "else" in text


@needs_gcc
def test_bundle_runs_either_branch(tmp_path, capsys):
    """`glowgen compile` writes one program with both branches; built with gcc and run by
    main.c on one and two threads, it gives onnxruntime's answers for either branch."""
    import subprocess
    onnx_model = _sample_rate_model()
    path = tmp_path / "sr.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    out = tmp_path / "out"
    assert main(["compile", str(path), "-o", str(out), "--name", "sr", "--threads", "2"]) == 0
    capsys.readouterr()
    done = subprocess.run(["gcc", "-O2", "-pthread", "main.c", "sr.o", "-lm", "-o", "sr"], cwd=out,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for seed, sr in enumerate(RATES[:3]):
        feeds = _feeds(sr, seed)
        feeds["x"].astype("<f4").tofile(tmp_path / "x.bin")
        feeds["sr"].astype("<i8").tofile(tmp_path / "sr.bin")
        for threads in ("1", "2"):
            done = subprocess.run([str(out / "sr"), "--threads", threads, str(tmp_path / "x.bin"),
                                   str(tmp_path / "sr.bin"), str(tmp_path / "z.bin")],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            got = np.fromfile(tmp_path / "z.bin", "<f4").reshape(128, 256)
            assert_close({"z": got}, run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-5)


def test_ahead_of_time_and_a_condition_given_as_an_input():
    then = _branch([helper.make_node("Exp", ["x"], ["t"])], ["t"], "then")
    other = _branch([helper.make_node("Identity", ["x"], ["e"])], ["e"], "else")
    onnx_model = _model([helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
                        [("x", F, [4, 7]), ("flag", BOOL, [1])], [("y", F, [4, 7])])
    model = glowgen.compile(onnx_model, specialize=False)
    x = np.random.default_rng(3).standard_normal((4, 7)).astype(np.float32)
    for flag in (False, True, False):
        feeds = {"x": x, "flag": np.array([flag])}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cond_type, dims, message", [
    (BOOL, [2], r"the condition 'flag' is bool\[2\], with 2 elements; an If's condition is one bool"),
    (TensorProto.FLOAT, [], r"the condition 'flag' is f32\[\]; an If's condition is a bool"),
])
def test_a_bad_condition_is_a_clear_error(cond_type, dims, message):
    then = _branch([helper.make_node("Exp", ["x"], ["t"])], ["t"], "then")
    other = _branch([helper.make_node("Neg", ["x"], ["e"])], ["e"], "else")
    onnx_model = _model([helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
                        [("x", F, [2, 3]), ("flag", cond_type, dims)], [("y", F, [2, 3])])
    with pytest.raises(GlowgenError, match=message):
        glowgen.compile(onnx_model, backend="interpreter")


def test_the_runtime_serves_a_model_with_a_run_time_if():
    """The partitioner copies nodes into partitions (a conditional with copies of its
    branches) and counts the branches' weights."""
    from glowgen.runtime import Device, Host
    onnx_model = _sample_rate_model(rows=16, n=64)
    with Host([Device("cpu", threads=1), Device("interpreter")]) as host:
        plan = host.add_network("sr", onnx_model)
        assert sum(p.weights for p in plan.partitions) >= 2 * 64 * 64 * 4
        for seed, sr in enumerate(RATES[:3]):
            feeds = _feeds(sr, seed, rows=16, n=64)
            assert_close(host.run("sr", feeds), run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- Loop
def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _loop_model(rows=4, n=8):
    """sf, accf = Loop(M): s <- tanh(s @ w + h), acc <- acc + s, with the trip count a model
    input and h computed before the loop (read by every iteration, never after it)."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "w"], ["m"]),
         helper.make_node("Add", ["m", "h"], ["mh"]),
         helper.make_node("Tanh", ["mh"], ["s_out"]),
         helper.make_node("Add", ["acc_in", "s_out"], ["acc_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("s_in", F, [rows, n]), _vi("acc_in", F, [rows, n])],
        [_vi("c_out", BOOL, []), _vi("s_out", F, [rows, n]), _vi("acc_out", F, [rows, n])])
    nodes = [helper.make_node("Mul", ["x", "half"], ["h"]),
             helper.make_node("Loop", ["M", "", "x", "zero"], ["sf", "accf"], body=body)]
    return _model(nodes, [("x", F, [rows, n]), ("M", I64, [])], [("sf", F, [rows, n]), ("accf", F, [rows, n])],
                  {"w": w, "half": np.array(0.5, np.float32), "zero": np.zeros((rows, n), np.float32)})


TRIPS = (0, 1, 3, 7, 2)


def _loop_feeds(trips, seed, rows=4, n=8):
    x = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)
    return {"x": x, "M": np.array(trips, np.int64)}


def _inside_loops(program):
    steps, inside, depth = program.plan.steps, [], 0
    for step in steps:
        kind = step.instrs[0].kind
        depth += kind == Instr.LOOP
        depth -= kind == Instr.ENDLOOP
        if depth and kind not in Instr.CONTROL:
            inside.append(step)
    return inside


@pytest.mark.parametrize("backend, threads", [("interpreter", 1), ("cpu", 1), ("cpu", 2)])
def test_loop_with_a_run_time_trip_count_compiles_once(backend, threads):
    rows, n = (128, 256) if threads == 2 else (4, 8)
    onnx_model = _loop_model(rows, n)
    options = {"threads": threads} if backend == "cpu" else {}
    model = glowgen.compile(onnx_model, backend=backend, **options)
    assert isinstance(model, CompiledModel)          # no variant per trip count
    for seed, trips in enumerate(TRIPS):
        feeds = _loop_feeds(trips, seed, rows, n)
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-5)
    (loop,) = regions(model.program.instrs)
    assert loop.kind == Instr.LOOP
    if threads == 2:
        assert any(step.parts > 1 for step in _inside_loops(model.program))


def _while_model(trip_count: bool):
    """x doubles (plus the iteration number) while its sum stays below `limit`, a model input
    (and at most 50 times, with a trip count): the loop stops on data."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x_in", "two"], ["x2"]),
         helper.make_node("Add", ["x2", "fi"], ["x_out"]),
         helper.make_node("ReduceSum", ["x_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["c_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("x_in", F, [2, 3])],
        [_vi("c_out", BOOL, []), _vi("x_out", F, [2, 3])])
    inputs = ["M" if trip_count else "", "go", "x"]
    return _model([helper.make_node("Loop", inputs, ["y"], body=body)],
                  [("x", F, [2, 3]), ("limit", F, []), ("go", BOOL, [])], [("y", F, [2, 3])],
                  {"two": np.array(2, np.float32), **({"M": np.array(50, np.int64)} if trip_count else {})},
                  opset=13)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("trip_count", [True, False])
def test_a_loop_that_stops_on_data(backend, trip_count):
    onnx_model = _while_model(trip_count)
    model = glowgen.compile(onnx_model, backend=backend)
    x = np.abs(np.random.default_rng(6).standard_normal((2, 3))).astype(np.float32) + 0.1
    for limit, go in ((10.0, True), (1e4, True), (1e4, False), (-1.0, True), (1e30, True)):
        feeds = {"x": x, "limit": np.array(limit, np.float32), "go": np.array(go)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_loop_whose_body_swaps_its_state(backend):
    """Fibonacci: (a, b) <- (b, a + b); the next a is the old b, so it is copied aside
    before b is overwritten."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a_in", "b_in"], ["b_out"]),
         helper.make_node("Identity", ["b_in"], ["a_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("a_in", I64, [2]), _vi("b_in", I64, [2])],
        [_vi("c_out", BOOL, []), _vi("a_out", I64, [2]), _vi("b_out", I64, [2])])
    onnx_model = _model([helper.make_node("Loop", ["M", "", "a", "b"], ["fa", "fb"], body=body)],
                        [("M", I64, []), ("a", I64, [2]), ("b", I64, [2])],
                        [("fa", I64, [2]), ("fb", I64, [2])])
    model = glowgen.compile(onnx_model, backend=backend)
    for trips in (0, 1, 2, 10, 40):
        feeds = {"M": np.array(trips, np.int64), "a": np.array([0, 2], np.int64),
                 "b": np.array([1, 1], np.int64)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds))


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_an_if_inside_a_run_time_loop(backend):
    """Even iterations double the state, odd ones subtract one: a run-time If on the
    iteration number inside a loop with a run-time trip count."""
    double = _branch([helper.make_node("Mul", ["s_in", "two"], ["d"])], ["d"], "double")
    less = _branch([helper.make_node("Sub", ["s_in", "one"], ["e"])], ["e"], "less")
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two_i"], ["parity"]),
         helper.make_node("Equal", ["parity", "zero_i"], ["even"]),
         helper.make_node("If", ["even"], ["s_out"], then_branch=double, else_branch=less),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("s_in", F, [3])],
        [_vi("c_out", BOOL, []), _vi("s_out", F, [3])])
    onnx_model = _model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
                        [("x", F, [3]), ("M", I64, [])], [("y", F, [3])],
                        {"two": np.array(2, np.float32), "one": np.array(1, np.float32),
                         "two_i": np.array(2, np.int64), "zero_i": np.array(0, np.int64)})
    model = glowgen.compile(onnx_model, backend=backend)
    kinds = [r.kind for r in regions(model.program.instrs)]
    assert kinds == [Instr.LOOP, Instr.COND]
    for trips in (0, 1, 2, 5, 8):
        feeds = {"x": np.array([1.0, -2.0, 0.5], np.float32), "M": np.array(trips, np.int64)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds))


@needs_gcc
def test_loop_bundle(tmp_path, capsys):
    import subprocess
    onnx_model = _loop_model(128, 256)
    path = tmp_path / "loop.onnx"
    path.write_bytes(onnx_model.SerializeToString())
    out = tmp_path / "out"
    assert main(["compile", str(path), "-o", str(out), "--name", "lp", "--threads", "2"]) == 0
    capsys.readouterr()
    done = subprocess.run(["gcc", "-O2", "-pthread", "main.c", "lp.o", "-lm", "-o", "lp"], cwd=out,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for seed, trips in enumerate((0, 3, 5)):
        feeds = _loop_feeds(trips, seed, 128, 256)
        feeds["x"].astype("<f4").tofile(tmp_path / "x.bin")
        feeds["M"].astype("<i8").tofile(tmp_path / "m.bin")
        for threads in ("1", "2"):
            files = [str(tmp_path / f) for f in ("x.bin", "m.bin", "sf.bin", "accf.bin")]
            done = subprocess.run([str(out / "lp"), "--threads", threads, *files],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            got = {k: np.fromfile(tmp_path / f"{k}.bin", "<f4").reshape(128, 256) for k in ("sf", "accf")}
            assert_close(got, run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-4)


def test_what_cannot_run_at_run_time_says_why():
    """Scan outputs (their length is the trip count) and branches of different types still
    need their deciding values at compile time: ahead of time that is an error that says
    why; glowgen.compile specializes per value instead (tests/test_dynamic.py)."""
    from glowgen.errors import CompileTimeInputError
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Neg", ["s_in"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["scan"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("s_in", F, [3])],
        [_vi("c_out", BOOL, []), _vi("s_out", F, [3]), _vi("scan", F, [3])])
    scans = _model([helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], body=body)],
                   [("x", F, [3]), ("M", I64, [])], [("y", F, [3]), ("ys", F, [None, 3])])
    with pytest.raises(CompileTimeInputError, match=r"trip count .*must be known at compile time.*"
                                                    r"it has scan outputs"):
        glowgen.compile(scans, specialize=False)
    then = _branch([helper.make_node("Neg", ["x"], ["t"])], ["t"], "then")
    other = _branch([helper.make_node("Concat", ["x", "x"], ["e"], axis=0)], ["e"], "else")
    types = _model([helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
                   [("x", F, [2, 3]), ("flag", BOOL, [])], [("y", F, [None, 3])])
    with pytest.raises(CompileTimeInputError, match=r"condition .*must be known at compile time.*"
                                                    r"its branches give different types"):
        glowgen.compile(types, specialize=False)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_loop_with_one_element_tensors_for_trip_count_and_conditions(backend):
    """A trip count, an initial condition and a body condition of shape [1] (exporters
    write them so), a negative trip count (no iteration) and a false initial condition."""
    body = helper.make_graph([helper.make_node("Add", ["s_in", "one"], ["s_out"]),
                              helper.make_node("Less", ["s_out", "lim"], ["c_out"])], "body",
                             [_vi("i", I64, []), _vi("c_in", BOOL, [1]), _vi("s_in", F, [1])],
                             [_vi("c_out", BOOL, [1]), _vi("s_out", F, [1])])
    onnx_model = _model([helper.make_node("Loop", ["M", "go", "s0"], ["s"], body=body)],
                        [("M", I64, [1]), ("go", BOOL, [1]), ("s0", F, [1]), ("lim", F, [1])],
                        [("s", F, [1])], {"one": np.array([1], np.float32)}, opset=13)
    model = glowgen.compile(onnx_model, backend=backend)
    for trips, go, lim in ((5, True, 3.0), (5, True, 100.0), (0, True, 3.0), (5, False, 3.0),
                           (-2, True, 9.0)):
        feeds = {"M": np.array([trips], np.int64), "go": np.array([go]),
                 "s0": np.array([0.5], np.float32), "lim": np.array([lim], np.float32)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds))


def test_concurrent_calls_take_their_own_branches_and_trip_counts():
    """Each call runs in its own execution context: the loop counter and condition live in
    its activation region, so calls at once with different trip counts and branches do not
    disturb each other."""
    import threading
    loop_model, if_model = _loop_model(), _sample_rate_model(rows=16, n=64)
    loop, branch = glowgen.compile(loop_model, threads=1), glowgen.compile(if_model, threads=1)
    start, errors = threading.Barrier(4), []

    def call(t):
        try:
            start.wait()
            for k in range(20):
                feeds = _loop_feeds(TRIPS[(t + k) % len(TRIPS)], t)
                assert_close(loop.run(feeds), run_ort(loop_model, feeds), rtol=1e-4, atol=1e-5)
                feeds = _feeds(RATES[(t + k) % len(RATES)], t, rows=16, n=64)
                assert_close(branch.run(feeds), run_ort(if_model, feeds), rtol=1e-4, atol=1e-5)
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
