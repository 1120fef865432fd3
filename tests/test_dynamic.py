"""Dynamic shapes and run-time decisions: a model with dynamic dimensions, or with inputs
whose values decide shapes or control flow, is compiled once per call signature and cached
(glowgen/specialize.py).  Every answer is checked against onnxruntime."""
from __future__ import annotations

import logging
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen
from glowgen.api import CompiledModel
from glowgen.errors import CompileTimeInputError, GlowgenError, InputError
from glowgen.specialize import SpecializingModel

from conftest import assert_close, run_ort

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=None, opset=17):
    """inputs/outputs: [(name, elem type, dims)], dims may hold -1, names or None."""
    graph = helper.make_graph(
        nodes, "dyn", [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _mlp(batch_dim=-1):
    """An MLP whose batch dimension is dynamic (-1, as exporters write it, or a name)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32) * 0.2
    b1 = rng.standard_normal(32).astype(np.float32)
    w2 = rng.standard_normal((32, 5)).astype(np.float32) * 0.2
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    return _model(nodes, [("x", F, [batch_dim, 16])], [("y", F, [batch_dim, 5])],
                  {"w1": w1, "b1": b1, "w2": w2})


def cli(*args):
    return subprocess.run([sys.executable, "-m", "glowgen.cli", *map(str, args)],
                          capture_output=True, text=True)


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _batches(model):
    return [v.shapes["x"][0] for v in model.variants]


def test_batch_minus_one_compiles_a_variant_per_batch_and_caches_it():
    onnx_model = _mlp(-1)
    model = glowgen.compile(onnx_model)
    assert isinstance(model, SpecializingModel)
    assert model.input_names == ["x"] and model.output_names == ["y"]
    assert model.input_types["x"].shape == (None, 16) and str(model.input_types["x"]) == "f32[?, 16]"
    assert str(model.output_types["y"]) == "f32[?, 5]"
    for batch in (1, 3, 7, 1, 3, 7):
        x = _x(batch, 16, seed=batch)
        assert_close(model.run({"x": x}), run_ort(onnx_model, {"x": x}), rtol=1e-5, atol=1e-6)
    assert sorted(_batches(model)) == [1, 3, 7]
    assert model.stats == {"compiles": 3, "hits": 3, "waits": 0, "evictions": 0}
    assert all(v.compile_seconds > 0 and v.calls == 2 for v in model.variants)
    assert all(isinstance(v.model, CompiledModel) for v in model.variants)


def test_least_recently_used_variant_is_evicted_at_max_variants():
    onnx_model = _mlp(-1)
    model = glowgen.compile(onnx_model, max_variants=2)
    for batch in (1, 3, 1, 7):          # 1 used again after 3: 3 is the least recently used
        model.run({"x": _x(batch, 16)})
    assert _batches(model) == [1, 7] and model.stats["evictions"] == 1
    x = _x(3, 16, seed=9)                # evicted, so compiled again
    assert_close(model.run({"x": x}), run_ort(onnx_model, {"x": x}), rtol=1e-5, atol=1e-6)
    assert _batches(model) == [7, 3] and model.stats == {"compiles": 4, "hits": 1, "waits": 0, "evictions": 2}


def test_symbolic_dimensions_and_the_interpreter():
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1), helper.make_node("Mul", ["s", "x"], ["y"])]
    onnx_model = _model(nodes, [("x", F, ["batch", "seq", 4])], [("y", F, ["batch", "seq", 4])])
    for backend in ("interpreter", "cpu"):
        model = glowgen.compile(onnx_model, backend=backend)
        assert model.input_types["x"].dims == ("batch", "seq", 4)
        for shape in ((2, 5, 4), (1, 3, 4), (2, 5, 4)):
            x = _x(*shape)
            assert_close(model.run({"x": x}), run_ort(onnx_model, {"x": x}), rtol=1e-5, atol=1e-6)
        assert model.stats["compiles"] == 2


def test_input_shapes_still_compile_ahead_of_time():
    model = glowgen.compile(_mlp("batch"), input_shapes={"x": (4, 16)})
    assert isinstance(model, CompiledModel) and model.input_types["x"].shape == (4, 16)
    with pytest.raises(InputError, match=r"dimension 1 is 16 in the model"):
        glowgen.compile(_mlp(-1), input_shapes={"x": (4, 15)})
    with pytest.raises(InputError, match=r"dynamic dimension 0.*--input-shape x=Nx16"):
        glowgen.compile(_mlp(-1), specialize=False)


def test_wrong_inputs_are_refused_before_compiling():
    model = glowgen.compile(_mlp(-1))
    with pytest.raises(InputError, match=r"input 'x' has shape \[2, 15\], expected f32\[\?, 16\]"):
        model.run({"x": _x(2, 15)})
    with pytest.raises(InputError, match="element type i64"):
        model.run({"x": np.zeros((2, 16), np.int64)})
    with pytest.raises(InputError, match="unknown input 'z'"):
        model.run({"x": _x(2, 16), "z": _x(1)})
    assert model.variants == []
    with pytest.raises(GlowgenError, match="max_variants must be a positive integer"):
        glowgen.compile(_mlp(-1), max_variants=0)


def _reshape_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    return _model(nodes, [("x", F, [-1, 6]), ("shape", TensorProto.INT64, [2])], [("y", F, [None, None])])


def test_reshape_target_from_an_input_is_specialized_per_value(caplog):
    onnx_model = _reshape_model()
    model = glowgen.compile(onnx_model)
    cases = [((2, 6), [3, 4]), ((2, 6), [4, -1]), ((4, 6), [-1, 3]), ((2, 6), [3, 4])]
    with caplog.at_level(logging.INFO, logger="glowgen.specialize"):
        for shape, target in cases:
            feeds = {"x": _x(*shape), "shape": np.array(target, np.int64)}
            assert_close(model.run(feeds), run_ort(onnx_model, feeds))
    assert model.deciding_inputs == ["shape"]
    assert model.stats["compiles"] == 3 and model.stats["hits"] == 1
    compiled = [r.getMessage() for r in caplog.records if "compiled variant" in r.getMessage()]
    assert len(compiled) == 3 and "x=2x6 shape=[3,4]" in compiled[0]
    assert any("'shape' decide" in r.getMessage() for r in caplog.records)


def test_missing_deciding_input_is_named():
    model = glowgen.compile(_reshape_model())
    model.run({"x": _x(2, 6), "shape": np.array([12, 1], np.int64)})
    with pytest.raises(InputError, match=r"missing input 'shape'.*'shape' decides shapes or control "
                                         r"flow, so the model is compiled for each value it takes"):
        model.run({"x": _x(2, 6)})
    # Ahead of time, it must be bound as a constant, as before.
    with pytest.raises(CompileTimeInputError, match="'shape'.*constant_inputs"):
        glowgen.compile(_reshape_model(), input_shapes={"x": (2, 6)})
    fixed = glowgen.compile(_reshape_model(), input_shapes={"x": (2, 6)},
                            constant_inputs={"shape": np.array([3, 4], np.int64)})
    assert isinstance(fixed, CompiledModel) and fixed.input_names == ["x"]


def _if_on_sample_rate(same_types: bool = True):
    """The shape of the two audio models of issue 15: If(Equal(sr, 16000)) between two
    branches of the same type, on a signal of dynamic length.  With `same_types=False` the
    else-branch gives a longer signal (x and its sine, concatenated)."""
    k = numpy_helper.from_array(np.array(16000, np.int64), "k")
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, [1, None])],
                             [numpy_helper.from_array(np.array(2, np.float32), "two")])
    other_nodes = [helper.make_node("Sin", ["x"], ["e" if same_types else "s"])]
    if not same_types:
        other_nodes.append(helper.make_node("Concat", ["x", "s"], ["e"], axis=1))
    other = helper.make_graph(other_nodes, "else", [],
                              [helper.make_tensor_value_info("e", F, [1, None])])
    nodes = [helper.make_node("Equal", ["sr", "k"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "audio",
                              [helper.make_tensor_value_info("x", F, [1, "samples"]),
                               helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", F, [1, None])], [k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_on_an_input_condition_is_decided_at_run_time():
    """Branches of the same type: both compiled into each variant, one run per call, so
    only the signal's length makes variants (tests/test_control_flow.py has more)."""
    onnx_model = _if_on_sample_rate()
    model = glowgen.compile(onnx_model)
    for n, sr in ((160, 16000), (160, 8000), (160, 44100), (480, 16000), (160, 16000), (480, 22050)):
        feeds = {"x": _x(1, n, seed=n), "sr": np.array(sr, np.int64)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)
    assert model.deciding_values == [] and model.deciding_inputs == []
    assert model.stats["compiles"] == 2
    assert sorted(v.shapes["x"][1] for v in model.variants) == [160, 480]


def test_if_between_branches_of_different_types_takes_both_branches():
    onnx_model = _if_on_sample_rate(same_types=False)
    model = glowgen.compile(onnx_model)
    for n, sr in ((160, 16000), (160, 8000), (160, 44100), (480, 16000), (160, 16000), (160, 22050)):
        feeds = {"x": _x(1, n, seed=n), "sr": np.array(sr, np.int64)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)
    # The condition is the deciding value, not the sample rate: one variant per branch taken.
    assert model.deciding_values == ["c"] and model.deciding_inputs == []
    assert model.stats["compiles"] == 3
    assert sorted((v.shapes["x"][1], bool(v.bound["c"])) for v in model.variants) == [
        (160, False), (160, True), (480, True)]
    with pytest.raises(InputError, match=r"missing input 'sr'.*'sr' decides shapes or control flow"):
        model.run({"x": _x(1, 160)})


def test_if_on_a_static_model_specializes_on_the_condition_input():
    onnx_model = _if_on_sample_rate(same_types=False)
    onnx_model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 64
    model = glowgen.compile(onnx_model)      # static: tries ahead of time, then per value
    assert isinstance(model, SpecializingModel) and model.deciding_values == ["c"]
    for sr in (16000, 44100, 8000):
        feeds = {"x": _x(1, 64), "sr": np.array(sr, np.int64)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)
    assert model.stats["compiles"] == 2


def test_loop_trip_count_from_an_input():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "acc_out"], ["sq"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [3]),
         helper.make_tensor_value_info("sq", F, [3])])
    node = helper.make_node("Loop", ["n", "", "acc0"], ["acc", "squares"], body=body)
    onnx_model = _model([node], [("n", TensorProto.INT64, []), ("acc0", F, [3]), ("x", F, [3])],
                        [("acc", F, [3]), ("squares", F, [None, 3])], opset=13)
    model = glowgen.compile(onnx_model)
    for n in (1, 4, 2):
        feeds = {"n": np.array(n, np.int64), "acc0": _x(3), "x": _x(3, seed=1)}
        got = model.run(feeds)
        assert got["squares"].shape == (n, 3)
        assert_close(got, run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)
    assert model.deciding_inputs == ["n"] and model.stats["compiles"] == 3


def test_concurrent_callers_compile_each_signature_once():
    onnx_model = _mlp("batch")
    model = glowgen.compile(onnx_model)
    batches = [2, 3, 4, 5] * 2          # 8 threads, two per new signature, all at once
    start = threading.Barrier(len(batches))
    results, errors = [None] * len(batches), []

    def call(t):
        try:
            start.wait()
            for _ in range(3):
                results[t] = model.run({"x": _x(batches[t], 16, seed=batches[t])})
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call, args=(t,)) for t in range(len(batches))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert model.stats["compiles"] == 4 and sorted(_batches(model)) == [2, 3, 4, 5]
    # The second caller of a signature found it compiled or waited for its compilation.
    assert model.stats["hits"] + model.stats["waits"] == 3 * len(batches) - 4
    assert sum(v.calls for v in model.variants) == 3 * len(batches)
    for t, batch in enumerate(batches):
        x = _x(batch, 16, seed=batch)
        assert_close(results[t], run_ort(onnx_model, {"x": x}), rtol=1e-5, atol=1e-6)


def test_cli_run_on_a_dynamic_model_uses_ones_for_dynamic_dimensions(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(_mlp(-1), path)
    r = cli("run", path)
    assert r.returncode == 0, r.stderr
    assert "shape=[1, 5]" in r.stdout
    assert "dynamic dimensions of random inputs set to 1: x=1x16" in r.stderr
    r = cli("run", path, "--input-shape", "x=3x16")
    assert r.returncode == 0 and "shape=[3, 5]" in r.stdout and "set to 1" not in r.stderr
    np.save(tmp_path / "x.npy", _x(6, 16))
    r = cli("run", path, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0 and "shape=[6, 5]" in r.stdout and "set to 1" not in r.stderr


def _bert_layer(d=32, heads=4, vocab=50, max_len=128):
    """A BERT-style encoder layer as exporters write it: a dynamic sequence length, and the
    head split computed from it at run time (Shape -> Gather -> Concat -> Reshape)."""
    rng = np.random.default_rng(3)

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    dh = d // heads
    inits = {"emb": w(vocab, d, scale=1.0), "pos": w(max_len, d, scale=1.0),
             "wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d), "w1": w(d, 2 * d),
             "w2": w(2 * d, d), "g": w(d) + 1, "b": w(d), "one": np.array(1, np.int64),
             "zero": np.array(0, np.int64), "step": np.array(1, np.int64),
             "head_dims": np.array([heads, dh], np.int64), "batch": np.array([1], np.int64),
             "model_dim": np.array([d], np.int64), "scale": np.array(dh ** -0.5, np.float32),
             "half": np.array(0.5, np.float32), "rsqrt2": np.array(2 ** -0.5, np.float32),
             "onef": np.array(1, np.float32)}
    N = helper.make_node
    nodes = [
        N("Gather", ["emb", "ids"], ["tok"]),
        N("Shape", ["ids"], ["ids_shape"]), N("Gather", ["ids_shape", "one"], ["seq"]),
        N("Range", ["zero", "seq", "step"], ["positions"]), N("Gather", ["pos", "positions"], ["pe"]),
        N("Add", ["tok", "pe"], ["x0"]),
        N("LayerNormalization", ["x0", "g", "b"], ["x"], axis=-1),
        N("Unsqueeze", ["seq", "zero"], ["seq1"]),
        N("Concat", ["batch", "seq1", "head_dims"], ["split_shape"], axis=0),
        N("Concat", ["batch", "seq1", "model_dim"], ["merge_shape"], axis=0),
    ]
    for name in ("q", "k", "v"):
        nodes += [N("MatMul", ["x", "w" + name], [name + "_"]),
                  N("Reshape", [name + "_", "split_shape"], [name + "_h"]),
                  N("Transpose", [name + "_h"], [name + "_t"],
                    perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [N("MatMul", ["q_t", "k_t"], ["scores"]), N("Mul", ["scores", "scale"], ["scaled"]),
              N("Softmax", ["scaled"], ["attn"], axis=-1), N("MatMul", ["attn", "v_t"], ["ctx_h"]),
              N("Transpose", ["ctx_h"], ["ctx_t"], perm=[0, 2, 1, 3]),
              N("Reshape", ["ctx_t", "merge_shape"], ["ctx"]), N("MatMul", ["ctx", "wo"], ["o"]),
              N("Add", ["o", "x"], ["r1"]), N("LayerNormalization", ["r1", "g", "b"], ["h"], axis=-1),
              N("MatMul", ["h", "w1"], ["f1"]), N("Mul", ["f1", "rsqrt2"], ["f1s"]),
              N("Erf", ["f1s"], ["erf"]), N("Add", ["erf", "onef"], ["erf1"]),
              N("Mul", ["f1", "erf1"], ["gx"]), N("Mul", ["gx", "half"], ["gelu"]),
              N("MatMul", ["gelu", "w2"], ["f2"]), N("Add", ["f2", "h"], ["r2"]),
              N("LayerNormalization", ["r2", "g", "b"], ["y"], axis=-1)]
    return _model(nodes, [("ids", TensorProto.INT64, [1, "sequence"])], [("y", F, [1, "sequence", d])],
                  inits)


def test_bert_style_encoder_serves_sequence_lengths_in_any_order():
    onnx_model = _bert_layer()
    model = glowgen.compile(onnx_model)        # max_variants: 8
    rng = np.random.default_rng(4)
    order = [32, 8, 128, 16, 64, 8, 128, 32, 4, 12, 20, 24]   # 9 lengths: 9th evicts LRU
    for n in order:
        feeds = {"ids": rng.integers(0, 50, (1, n)).astype(np.int64)}
        assert_close(model.run(feeds), run_ort(onnx_model, feeds), rtol=1e-4, atol=1e-4)
    assert model.stats["compiles"] == 9 and model.stats["evictions"] == 1
    lengths = [v.shapes["ids"][1] for v in model.variants]
    assert 16 not in lengths and lengths == [64, 8, 128, 32, 4, 12, 20, 24]


def test_conformance_runner_can_give_every_input_at_run_time():
    from glowgen import conformance as C
    model = _reshape_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    feeds = {"x": _x(2, 6), "shape": np.array([4, -1], np.int64)}
    case = C.Case("reshape", "node", model, [([feeds["x"], feeds["shape"]],
                                              [run_ort(model, feeds)["y"]])])
    assert C.run_case(case, "interpreter") == (C.PASS, "", True)     # shape bound as a constant
    assert C.run_case(case, "interpreter", specialize=True) == (C.PASS, "", True)   # per value
    relu = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2, 3])], [("y", F, [2, 3])])
    x = _x(2, 3)
    plain = C.Case("relu", "node", relu, [([x], [np.maximum(x, 0)])])
    assert C.run_case(plain, "interpreter", specialize=True) == (C.PASS, "", False)


def test_concurrent_first_calls_while_the_deciding_value_is_found():
    """Eight threads call a fresh model at once with four sample rates: the first compile
    finds that the If's condition decides, every caller retries with it, and each branch is
    compiled once (branches of different types: decided per value of the condition)."""
    onnx_model = _if_on_sample_rate(same_types=False)
    model = glowgen.compile(onnx_model)
    rates = [16000, 8000, 44100, 16000, 22050, 16000, 8000, 11025]
    start = threading.Barrier(len(rates))
    results, errors = [None] * len(rates), []

    def call(t):
        try:
            start.wait()
            for _ in range(3):
                results[t] = model.run({"x": _x(1, 100), "sr": np.array(rates[t], np.int64)})
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call, args=(t,)) for t in range(len(rates))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert model.stats["compiles"] == 2 and model.deciding_values == ["c"]
    for t, sr in enumerate(rates):
        feeds = {"x": _x(1, 100), "sr": np.array(sr, np.int64)}
        assert_close(results[t], run_ort(onnx_model, feeds), rtol=1e-5, atol=1e-6)


def test_an_unsupported_op_is_refused_at_compile_not_at_the_first_call():
    from glowgen.errors import UnsupportedError
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"])],
                   [("x", F, [-1, 3, 3])], [("y", F, [-1])])
    with pytest.raises(UnsupportedError, match="ONNX op Det .*not supported"):
        glowgen.compile(model)
    custom = _model([helper.make_node("Foo", ["x"], ["y"], domain="com.example")],
                    [("x", F, [-1, 3])], [("y", F, [-1, 3])])
    custom.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedError, match="domain 'com.example'"):
        glowgen.compile(custom)


def test_a_value_that_cannot_be_computed_on_its_own_decides_by_its_inputs():
    """The condition comes out of an If (a node with subgraphs): no small model computes it
    alone, so the sample rate itself becomes part of the signature."""
    k = numpy_helper.from_array(np.array(16000, np.int64), "k")
    inner = helper.make_graph([helper.make_node("Equal", ["sr", "k"], ["eq"])], "inner", [],
                              [helper.make_tensor_value_info("eq", TensorProto.BOOL, [])])
    outer = _if_on_sample_rate(same_types=False)
    g = outer.graph
    equal = g.node[0]
    g.node.remove(equal)
    g.node.insert(0, helper.make_node("If", ["always"], ["c"], then_branch=inner, else_branch=inner))
    g.initializer.extend([numpy_helper.from_array(np.array(True), "always")])
    model = glowgen.compile(outer)
    for sr in (16000, 8000, 8000):
        feeds = {"x": _x(1, 32), "sr": np.array(sr, np.int64)}
        assert_close(model.run(feeds), run_ort(outer, feeds), rtol=1e-5, atol=1e-6)
    assert model.deciding_values == [] and model.deciding_inputs == ["sr"]
    assert model.stats["compiles"] == 2
