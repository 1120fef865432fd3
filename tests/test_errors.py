"""Bad input: a clear GlowgenError (what, where, what to do); from the CLI, `error: ...` on
stderr, exit status 2 and no traceback.  Bad models, one case per kind: tests/test_bad_input.py;
here: run-time inputs, command-line mistakes and unsupported features."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glowgen
from glowgen.errors import GlowgenError, InputError, ModelError, UnsupportedError

from conftest import REPO, make_model

EXAMPLE = REPO / "examples" / "tiny_cnn.onnx"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "glowgen.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def assert_user_error(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


def test_missing_file(tmp_path):
    assert_user_error(cli("run", tmp_path / "nope.onnx"), "no such file")


def _model_with(op_type, domain=""):
    x = np.zeros((2, 3), np.float32)
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain)
    m = make_model([node], {"x": x}, ["y"])
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]))
    if domain:
        m.opset_import.append(helper.make_opsetid(domain, 1))
    return m


def test_unsupported_op_names_it_and_the_ops_command(tmp_path):
    m = _model_with("Det")
    with pytest.raises(UnsupportedError) as e:
        glowgen.compile(m)
    assert "Det" in str(e.value) and "glowgen ops" in str(e.value)
    path = tmp_path / "hardmax.onnx"
    onnx.save(m, path)
    assert_user_error(cli("run", path), "Det", "glowgen ops")


def test_op_in_foreign_domain(tmp_path):
    m = _model_with("FusedGelu", domain="com.example")
    with pytest.raises(UnsupportedError, match="com.example"):
        glowgen.compile(m)


def test_unsupported_attribute_is_named():
    x = np.zeros((1, 2, 4, 4), np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], storage_order=1)
    with pytest.raises(UnsupportedError, match="storage_order"):
        glowgen.compile(make_model([node], {"x": x}, ["y"]))


def test_unsupported_pad_mode_is_named():
    x = np.zeros((2, 3), np.float32)
    for mode, pads, message in [("mirror", [1, 0, 0, 1], "mode must be constant, reflect, edge or wrap")]:
        node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
        model = make_model([node], {"x": x}, ["y"], {"p": np.array(pads, np.int64)}, opset=19)
        with pytest.raises(GlowgenError, match=message):
            glowgen.compile(model)


def _dynamic_model():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_unbound_dynamic_dimension(tmp_path):
    m = _dynamic_model()
    with pytest.raises(InputError) as e:        # ahead of time only: it must be bound
        glowgen.compile(m, specialize=False)
    msg = str(e.value)
    assert "'x'" in msg and "batch" in msg and "--input-shape x=Nx3" in msg
    path = tmp_path / "dyn.onnx"
    onnx.save(m, path)
    assert_user_error(cli("compile", path, "-o", tmp_path / "bundle"), "batch", "--input-shape")
    r = cli("run", path, "--input-shape", "x=4x3")
    assert r.returncode == 0 and "shape=[4, 3]" in r.stdout


def test_bound_dimension_conflicts():
    with pytest.raises(InputError, match="dimension 1 is 3"):
        glowgen.compile(_dynamic_model(), input_shapes={"x": (2, 5)})
    with pytest.raises(InputError, match="not an input"):
        glowgen.compile(_dynamic_model(), input_shapes={"z": (2, 3)})


def test_wrong_inputs_at_run_time():
    model = glowgen.compile(EXAMPLE)
    good = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(InputError, match="unknown input 'img'"):
        model.run({"img": good})
    with pytest.raises(InputError, match="missing input 'image'"):
        model.run({})
    with pytest.raises(InputError, match=r"shape \[1, 3, 8, 9\], expected \[1, 3, 8, 8\]"):
        model.run({"image": np.zeros((1, 3, 8, 9), np.float32)})
    with pytest.raises(InputError, match="element type f64"):
        model.run({"image": good.astype(np.float64)})
    assert model.run({"image": good})["probs"].shape == (1, 10)


def test_cli_input_file_errors(tmp_path):
    bad = tmp_path / "x.npy"
    np.save(bad, np.zeros((2, 2), np.float32))
    assert_user_error(cli("run", EXAMPLE, "--input", f"image={bad}"), "shape [2, 2]")
    assert_user_error(cli("run", EXAMPLE, "--input", "nosuch=x.npy"), "nosuch")
    assert_user_error(cli("run", EXAMPLE, "--input", f"image={tmp_path / 'missing.npy'}"), "cannot read")
    assert_user_error(cli("run", EXAMPLE, "--input-shape", "image=1xQ"), "bad shape")


def test_every_error_is_a_glowgen_error():
    assert issubclass(ModelError, GlowgenError) and issubclass(InputError, GlowgenError)


def test_cli_run_saves_outputs(tmp_path):
    r = cli("run", EXAMPLE, "--save-outputs", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "random input" in r.stdout and "probs: shape=[1, 10] dtype=float32" in r.stdout
    saved = np.load(tmp_path / "out" / "probs.npy")
    assert saved.shape == (1, 10) and abs(saved.sum() - 1) < 1e-5


def test_cli_help_teaches():
    r = cli("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "glowgen run" in r.stdout
    r = cli("run", "--help")
    assert "--input-shape" in r.stdout and "--save-outputs" in r.stdout


def test_cli_ops_lists_ops():
    r = cli("ops")
    assert r.returncode == 0 and "Conv" in r.stdout and "primitive" in r.stdout


@pytest.mark.parametrize("x, attrs, message", [
    (np.zeros((1, 1, 2, 2), np.int32), {"mode": "linear"},
     "linear and cubic Resize of integer tensors is not supported"),
    (np.zeros((1, 1, 2, 2), np.float32), {"mode": "area"}, "mode must be nearest, linear or cubic"),
    (np.zeros((1, 1, 2, 2), np.float32), {"coordinate_transformation_mode": "center"},
     "coordinate_transformation_mode must be one of"),
])
def test_unsupported_resize_is_named(x, attrs, message):
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], **attrs)
    model = make_model([node], {"x": x}, ["y"], {"s": np.array([1, 1, 2, 2], np.float32)}, opset=19)
    with pytest.raises(GlowgenError, match=message):
        glowgen.compile(model)


def test_col2im_with_the_wrong_block_count_is_named():
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"])
    model = make_model([node], {"x": np.zeros((1, 4, 5), np.float32)}, ["y"],
                       {"image": np.array([3, 3], np.int64), "block": np.array([2, 2], np.int64)}, opset=18)
    with pytest.raises(GlowgenError, match="the last dimension must count the blocks"):
        glowgen.compile(model)


def test_gridsample_with_a_mismatched_grid_is_named():
    node = helper.make_node("GridSample", ["x", "grid"], ["y"])
    model = make_model([node], {"x": np.zeros((1, 1, 3, 3), np.float32), "grid": np.zeros((1, 2, 2, 3), np.float32)},
                       ["y"], opset=16)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2]))
    with pytest.raises(GlowgenError, match="grid must be"):
        glowgen.compile(model)
