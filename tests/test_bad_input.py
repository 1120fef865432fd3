"""Bad models, one case per kind: each is refused with a GlowgenError of the right class whose
message has the key words (what, where, what to do), through the Python API and through the
CLI (`error: ...` on stderr, exit status 2, no traceback).

The hand-made models of issue 16 (a 3.64 TiB ConstantOfShape, a 2^40-element input, a
constant Gather index out of range, opset 99) are here with the ones answered well before
(truncated files, non-ONNX bytes, external weights outside the model's folder, cycles,
dangling names, channel and reshape mismatches).  Run-time inputs: tests/test_errors.py.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen
from glowgen.cli import main
from glowgen.errors import MemoryLimitError, ModelError, ShapeError, UnsupportedError

from conftest import REPO, make_model

EXAMPLE = REPO / "examples" / "tiny_cnn.onnx"
F = TensorProto.FLOAT


def _graph_model(nodes, inputs, outputs, inits=(), opset=17):
    """A model from value infos (make_model infers them from arrays, which a 2^40-element
    input cannot be)."""
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _save(model, path):
    onnx.save(model, path)
    return path


# ------------------------------------------------------------------ the cases
# Each builds the bad model in `tmp` and returns its path.
def truncated(tmp):
    data = EXAMPLE.read_bytes()
    (tmp / "m.onnx").write_bytes(data[: len(data) // 2])
    return tmp / "m.onnx"


def not_onnx(tmp):
    (tmp / "m.onnx").write_text("these are not the weights you are looking for\n" * 20)
    return tmp / "m.onnx"


def external_data_outside_folder(tmp):
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for key, value in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "16")):
        w.external_data.add(key=key, value=value)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       {"x": np.zeros((2, 2), np.float32)}, ["y"])
    model.graph.initializer.append(w)
    (tmp / "sub").mkdir()
    # onnx.save would try to resolve the external data; write the bytes as they are.
    (tmp / "sub" / "m.onnx").write_bytes(model.SerializeToString())
    return tmp / "sub" / "m.onnx"


def cycle(tmp):
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    return _save(_graph_model(nodes, [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("b", F, [2])]), tmp / "m.onnx")


def dangling_name(tmp):
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"])]
    return _save(_graph_model(nodes, [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])]), tmp / "m.onnx")


def channel_mismatch(tmp):
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    model = make_model([node], {"x": np.zeros((1, 3, 5, 5), np.float32)}, ["y"],
                       {"w": np.zeros((4, 2, 3, 3), np.float32)})
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, ["n", "c", "h", "w"]))
    return _save(model, tmp / "m.onnx")


def reshape_mismatch(tmp):
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    model = make_model([node], {"x": np.zeros((3, 4), np.float32)}, ["y"],
                       {"s": np.array([5, 3], np.int64)})
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F, ["a", "b"]))
    return _save(model, tmp / "m.onnx")


def huge_constant_of_shape(tmp):
    s = numpy_helper.from_array(np.array([100000, 100000, 100], np.int64), "s")
    return _save(_graph_model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [],
                              [helper.make_tensor_value_info("y", F, [100000, 100000, 100])], [s]),
                 tmp / "m.onnx")


def huge_input(tmp):
    n = 1 << 40
    return _save(_graph_model([helper.make_node("Relu", ["x"], ["y"])],
                              [helper.make_tensor_value_info("x", F, [n])],
                              [helper.make_tensor_value_info("y", F, [n])]), tmp / "m.onnx")


def huge_fold(tmp):
    """A fill that constant folding would materialize (a MatMul reads it): 37 GiB."""
    s = numpy_helper.from_array(np.array([100000, 100000], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    return _save(_graph_model(nodes, [helper.make_tensor_value_info("x", F, [1, 100000])],
                              [helper.make_tensor_value_info("y", F, [1, 100000])], [s]), tmp / "m.onnx")


def opset_99(tmp):
    x = np.zeros(4, np.float32)
    return _save(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"], opset=99),
                 tmp / "m.onnx")


def _indexed(op, data, indices, updates=None, **attrs):
    def build(tmp):
        inputs = {"x": data} if updates is None else {"x": data, "u": updates}
        names = ["x", "i"] + ([] if updates is None else ["u"])
        node = helper.make_node(op, names, ["y"], name="picker", **attrs)
        return _save(make_model([node], inputs, ["y"], {"i": np.asarray(indices, np.int64)}), tmp / "m.onnx")
    return build


X = np.arange(12, dtype=np.float32).reshape(3, 4)

# (id, build, error class, key words of the message)
CASES = [
    ("truncated", truncated, ModelError, ["m.onnx", "truncated"]),
    ("not-onnx", not_onnx, ModelError, ["m.onnx", "not an ONNX model"]),
    ("external-data-outside-folder", external_data_outside_folder, ModelError,
     ["cannot load external weights", "outside"]),
    ("cycle", cycle, ModelError, ["not a valid ONNX model", "topologically sorted"]),
    ("dangling-name", dangling_name, ModelError, ["not a valid ONNX model", "nowhere"]),
    ("channel-mismatch", channel_mismatch, ShapeError, ["Conv", "channels"]),
    ("reshape-mismatch", reshape_mismatch, ShapeError, ["Reshape", "cannot reshape", "[3, 4]", "[5, 3]"]),
    ("huge-constant-of-shape", huge_constant_of_shape, MemoryLimitError,
     ["output 'y'", "f32[100000, 100000, 100]", "3.64 TiB", "max_memory", "--max-memory"]),
    ("huge-input", huge_input, MemoryLimitError, ["input 'x'", "f32[1099511627776]", "4 TiB", "8 TiB"]),
    ("huge-fold", huge_fold, MemoryLimitError, ["folding", "'w'", "f32[100000, 100000]", "37.3 GiB"]),
    ("opset-99", opset_99, UnsupportedError, ["opset 99", "opsets 1 to 28", "version_converter"]),
    ("gather-constant-index", _indexed("Gather", np.arange(4, dtype=np.float32), [7]), ShapeError,
     ["Gather node 'picker'", "constant index 7", "[-4, 3]"]),
    ("gather-elements-constant-index", _indexed("GatherElements", X, [[0, -5, 1, 2]], axis=1), ShapeError,
     ["GatherElements node 'picker'", "constant index -5", "[-4, 3]"]),
    ("gather-nd-constant-index", _indexed("GatherND", X, [[2, 1], [3, 0]]), ShapeError,
     ["GatherND node 'picker'", "constant index 3", "dimension 0 of size 3"]),
    ("scatter-elements-constant-index", _indexed("ScatterElements", X, [[3, 0]], np.ones((1, 2), np.float32),
                                                 axis=0), ShapeError,
     ["ScatterElements node 'picker'", "constant index 3", "[-3, 2]"]),
    ("scatter-nd-constant-index", _indexed("ScatterND", X, [[1, 4]], np.ones(1, np.float32)), ShapeError,
     ["ScatterND node 'picker'", "constant index 4", "dimension 1 of size 4"]),
]


@pytest.mark.parametrize("build, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_model_is_refused_by_the_api(tmp_path, build, error, words):
    path = build(tmp_path)
    with pytest.raises(error) as e:
        glowgen.compile(path)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
@pytest.mark.parametrize("build, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_model_is_refused_by_the_cli(tmp_path, capsys, build, error, words, backend):
    path = build(tmp_path)
    assert main(["run", str(path), "--backend", backend]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


# ------------------------------------------------------------------ the memory limit itself
def test_max_memory_names_the_constant_and_the_sizes(capsys):
    with pytest.raises(MemoryLimitError, match=r"constant 'fc_w' \(f32\[10, 64\]\) needs 2.5 KiB, "
                                               r"more than the max_memory 512 bytes"):
        glowgen.compile(EXAMPLE, max_memory=512)
    assert main(["run", str(EXAMPLE), "--max-memory", "1K"]) == 2
    assert "fc_w" in capsys.readouterr().err
    assert main(["compile", str(EXAMPLE), "-o", "/nonexistent/never", "--max-memory", "1K"]) == 2
    assert "needs" in capsys.readouterr().err
    assert glowgen.compile(EXAMPLE, max_memory="64M").run(
        {"image": np.zeros((1, 3, 8, 8), np.float32)})["probs"].shape == (1, 10)


def test_max_memory_counts_one_call_of_the_plan():
    """Constants alone fit, the plan with the inputs, outputs and activations does not."""
    model = glowgen.compile(EXAMPLE)
    sizes = model.program.region_sizes
    with pytest.raises(MemoryLimitError, match="the compiled model"):
        glowgen.compile(EXAMPLE, max_memory=sum(sizes.values()) - 1)
    glowgen.compile(EXAMPLE, max_memory=sum(sizes.values()) + (1 << 20))


@pytest.mark.parametrize("bad", ["lots", "-5", "0", "8X"])
def test_a_bad_max_memory_is_refused(bad, capsys):
    with pytest.raises(MemoryLimitError, match="max_memory"):
        glowgen.compile(EXAMPLE, max_memory=bad)
    assert main(["run", str(EXAMPLE), "--max-memory", bad]) == 2
    assert "error: max_memory" in capsys.readouterr().err


def test_external_weights_are_measured_before_they_are_read(tmp_path):
    w = np.ones((64, 64), np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       {"x": np.zeros((2, 64), np.float32)}, ["y"], {"w": w})
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.weights", size_threshold=0)
    with pytest.raises(MemoryLimitError, match="external weight 'w'"):
        glowgen.compile(tmp_path / "m.onnx", max_memory=8192)
    assert glowgen.compile(tmp_path / "m.onnx").run({"x": np.ones((2, 64), np.float32)})["y"][0, 0] == 64


def test_run_time_indices_keep_their_checks():
    """An index fed at run time is not a compile error: the cpu backend clamps it (as
    tests/test_cpu_bad_indices.py shows), the interpreter refuses it by name."""
    from glowgen.errors import InputError
    x = np.arange(4, dtype=np.float32)
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"])], {"x": x, "i": np.array([7])}, ["y"])
    assert glowgen.compile(model, backend="cpu").run({"x": x, "i": np.array([7])})["y"].tolist() == [3.0]
    with pytest.raises(InputError, match="Gather node 'y': an index known only at run time is out of range"):
        glowgen.compile(model, backend="interpreter").run({"x": x, "i": np.array([7])})


def test_a_bad_cpu_target_names_where_it_came_from(monkeypatch, capsys):
    with pytest.raises(glowgen.GlowgenError, match=r"cpu='zen9': .*x86-64-v3"):
        glowgen.compile(EXAMPLE, cpu="zen9")
    monkeypatch.setenv("GLOWGEN_CPU", "pentium9")
    assert main(["run", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: GLOWGEN_CPU='pentium9'") and "x86-64-v3" in err and "Traceback" not in err


def test_an_attribute_out_of_range_names_the_node_once():
    x = np.arange(4, dtype=np.float32)
    model = make_model([helper.make_node("CumSum", ["x", "a"], ["y"])], {"x": x}, ["y"],
                       {"a": np.array(3, np.int64)})
    with pytest.raises(ShapeError) as e:
        glowgen.compile(model)
    assert str(e.value).count("CumSum node 'y'") == 1 and "axis 3 is out of range for rank 1" in str(e.value)


# ------------------------------------------------------------------ conformance runner
def test_conformance_without_matching_case_is_a_clear_error(capsys):
    assert main(["conformance", "--include", "no_such_case_zzz"]) == 2
    err = capsys.readouterr().err
    assert "no conformance case matches --include" in err and "Traceback" not in err
