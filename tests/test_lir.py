"""The low-level IR: memory planning, copy elimination, in-place reuse, and an interpreter
that really runs over the planned byte arenas."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import helper

import glowgen
from glowgen import api, lir
from glowgen.reference import evaluate
from glowgen.backends.interpreter.lir_runner import LirRunner
from glowgen.engine.registry import Registry
from glowgen.lir.allocator import Block, check_plan, max_live, plan
from glowgen.lir.printer import memory_report, print_program

from conftest import ONNX_DATA, REPO, make_model, require_bench_dir, run_ort

# vgg19 (12 s here) is left to test_light_models.py, which runs it against its shipped output:
# this check adds nothing its other convolution chains do not.
LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "zfnet512"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 40), st.integers(0, 15)),
                min_size=1, max_size=40))
def test_allocator_never_overlaps_live_buffers(specs):
    blocks = [Block(i, size, start, start + length) for i, (size, start, length) in enumerate(specs)]
    p = plan(blocks)
    check_plan(blocks, p.offsets)                       # aligned, no live overlap
    assert p.size >= max_live(blocks)
    assert all(p.offsets[b.key] + b.size <= p.size for b in blocks)


def _compiled(path):
    return glowgen.compile(path, backend="interpreter")


def test_wrong_plan_gives_wrong_numbers():
    """Force two simultaneously live activations onto the same bytes: the output changes."""
    model = _compiled(REPO / "examples" / "tiny_cnn.onnx")      # random weights: outputs vary
    prog, reg = model.program, model.registry
    x = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)
    good = model.run({"image": x})["probs"]
    life = lir.lifetimes(prog)
    acts = sorted(prog.activations, key=lambda a: life[a][0])
    a, b = next((a, b) for a in acts for b in acts
                if a is not b and life[a][0] < life[b][0] < life[a][1] and a.nbytes >= b.nbytes)
    b.offset = a.offset                                  # a is still live when b is written
    bad = LirRunner(prog, reg).run({"image": x})["probs"]
    assert not np.allclose(bad, good, rtol=1e-3, atol=1e-5)


def test_reshape_relu_reshape_has_no_copies():
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Reshape", ["b", "s2"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"s1": np.array([6, 4], np.int64),
                                                "s2": np.array([4, 6], np.int64)})
    compiled = glowgen.compile(model, backend="interpreter")
    text = print_program(compiled.program)
    assert " copy " not in text and "allocactivation" not in text, text
    assert "tensorview" in text
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], run_ort(model, {"x": x})["y"])


def test_elementwise_chain_runs_in_place():
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"])
    compiled = glowgen.compile(model, backend="interpreter")
    rep = memory_report(compiled.program)
    assert rep["activation_bytes"] == 128 and rep["copies"] == 0   # one 4x8 buffer, reused
    np.testing.assert_allclose(compiled.run({"x": x})["y"], run_ort(model, {"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_a_sum_of_two_dying_operands_goes_over_the_older():
    """Add(b, a) with both operands dying: the sum overwrites a, written before b (b may
    never reach memory when its producer stores the sum instead: a product's epilogue)."""
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Add", ["b", "a"], ["c"]), helper.make_node("Neg", ["c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"])
    compiled = glowgen.compile(model, backend="interpreter")
    (add,) = [ins for ins in compiled.program.instrs if ins.kind == "Add"]
    out, lhs, rhs = (buf.root() for _, buf in add.operands)
    assert out is rhs and out is not lhs, print_program(compiled.program)
    np.testing.assert_allclose(compiled.run({"x": x})["y"], run_ort(model, {"x": x})["y"], rtol=1e-6)


@pytest.mark.parametrize("name", LIGHT)
def test_lir_matches_graph_evaluation_on_light_models(name):
    model = _compiled(ONNX_DATA / "light" / f"light_{name}.onnx")
    (inp,) = model.input_names
    x = np.random.default_rng(3).random(model.input_types[inp].shape, dtype=np.float32)
    lir_out = model.run({inp: x})
    graph_out = evaluate(model.function, {inp: x}, model.registry)
    for k in graph_out:     # BLAS rounding may depend on buffer alignment: not bit-exact
        np.testing.assert_allclose(lir_out[k], graph_out[k], rtol=1e-5, atol=1e-7)


def _memory_figures(path):
    rep = memory_report(glowgen.compile(path, backend="interpreter").program)
    print(f"\n{path.name}: arena {rep['activation_bytes']:,} B, max-live {rep['max_live_bytes']:,} B, "
          f"naive {rep['naive_activation_bytes']:,} B, arena/max-live {rep['arena_over_max_live']:.3f}, "
          f"arena/naive {rep['arena_over_naive']:.3f} ({rep['strategy']})")
    assert rep["activation_bytes"] <= 1.1 * rep["max_live_bytes"]
    assert rep["activation_bytes"] <= 0.25 * rep["naive_activation_bytes"]


def test_resnet50_memory_plan_light():
    _memory_figures(ONNX_DATA / "light" / "light_resnet50.onnx")


@pytest.mark.bench_models
def test_resnet50_memory_plan_bench():
    _memory_figures(require_bench_dir() / "resnet50.onnx")


@pytest.mark.bench_models
@pytest.mark.parametrize("name", ["resnet50", "resnet18", "mobilenet_v2", "mlp", "tiny_bert", "lenet",
                                  "eltwise_chain"])
def test_lir_matches_graph_evaluation_on_bench_models(name):
    directory = require_bench_dir()
    manifest = json.loads((directory / "manifest.json").read_text())[name]
    model = _compiled(directory / manifest["file"])
    x = np.random.default_rng(4).standard_normal(manifest["input_shape"]).astype(np.float32)
    lir_out = model.run({manifest["input"]: x})
    graph_out = evaluate(model.function, {manifest["input"]: x}, model.registry)
    for k in graph_out:     # BLAS rounding may depend on buffer alignment: not bit-exact
        np.testing.assert_allclose(lir_out[k], graph_out[k], rtol=1e-5, atol=1e-7)


def test_dump_lir_and_memory_report():
    r = subprocess.run([sys.executable, "-m", "glowgen.cli", "dump", str(REPO / "examples" / "tiny_cnn.onnx"),
                        "--stage", "lir"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("declare {") and "program tiny_cnn {" in r.stdout
    assert "Conv @out" in r.stdout and "@in %image (mutable@0)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "glowgen.cli", "dump", str(REPO / "examples" / "tiny_cnn.onnx"),
                        "--stage", "lir", "--memory"], capture_output=True, text=True)
    assert r.returncode == 0 and "max-live bound" in r.stdout and "arena / naive" in r.stdout
