"""ONNX import: constant folding of shape computations, Constant nodes, dynamic dimensions."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glowgen
from glowgen import api
from glowgen.engine.graph import Constant

from conftest import assert_close, make_model, run_ort


def test_shape_subgraph_is_folded_at_import():
    """x.reshape(x.shape[0], -1) written the way exporters write it."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        helper.make_node("Constant", [], ["minus1"], value_ints=[-1]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], {"axes0": np.array([0], np.int64)})
    fn = api.load(model)
    reshape = next(n for n in fn.nodes if n.OP == "Reshape")
    assert reshape.shape == (2, 12) and tuple(reshape.attr_values()["dims"]) == (2, 12)
    lowered = api.lower(fn)
    assert {n.OP for n in lowered.nodes} == {"Reshape", "Relu"}   # Shape/Gather/Concat gone
    assert_close(glowgen.compile(model).run({"x": x}), run_ort(model, {"x": x}))


def test_constant_of_shape_from_computed_shape():
    x = np.ones((3, 5), np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5])),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"])
    fn = api.lower(api.load(model))
    assert [n.OP for n in fn.nodes] == ["Mul"] and isinstance(fn.nodes[0].inputs[1], Constant)
    assert_close(glowgen.compile(model).run({"x": x}), run_ort(model, {"x": x}))


def test_value_computed_from_an_input_cannot_be_an_attribute():
    x = np.zeros((2, 3), np.float32)
    shape_in = np.array([3, 2], np.int64)
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": x, "s": shape_in}, ["y"])
    with pytest.raises(glowgen.GlowgenError, match="must be computable at compile time"):
        glowgen.compile(model, specialize=False)


def test_dynamic_dimension_bound_by_user():
    node = helper.make_node("Softmax", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = glowgen.compile(model, input_shapes={"x": (3, 4)})
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    assert_close(compiled.run({"x": x}), run_ort(model, {"x": x}))
    assert compiled.input_names == ["x"] and compiled.output_names == ["y"]


def test_graph_output_that_is_an_input_or_initializer():
    x = np.ones((2,), np.float32)
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    np.testing.assert_array_equal(glowgen.compile(model).run({"x": x})["x"], x)
