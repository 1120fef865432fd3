"""The textual form prints and parses back; DOT output is well formed."""
from __future__ import annotations

import numpy as np

import glowgen
from glowgen import api
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function, print_function, to_dot
from glowgen.errors import ParseError

from conftest import ONNX_DATA, REPO

import pytest


def _roundtrip(fn):
    text = print_function(fn)
    again = parse_function(text, Registry.default())
    assert print_function(again) == text
    return again


def test_roundtrip_loaded_and_lowered_example():
    fn = api.load(REPO / "examples" / "tiny_cnn.onnx")
    _roundtrip(fn)
    _roundtrip(api.lower(fn))


def test_roundtrip_light_model_keeps_semantics():
    fn = api.lower(api.load(ONNX_DATA / "light" / "light_squeezenet.onnx"))
    again = _roundtrip(fn)
    from glowgen.reference import evaluate
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    reg = Registry.default()
    a = evaluate(fn, {"data_0": x}, reg)
    b = evaluate(again, {"data_0": x}, reg)
    np.testing.assert_array_equal(a["softmaxout_1"], b["softmaxout_1"])


def test_parse_variadic_optional_multi_output():
    text = """graph g {
  input %a: f32[2, 3]
  input %"b/weird name": f32[3]
  const %c: f32[] = dense<[1.5]>
  %s = SumN([%a, %"b/weird name", %c]) : f32[2, 3]
  %d, %d:mask = Dropout(%s) : f32[2, 3], bool[2, 3]
  %p = MaxPool(%x4) {kernel = [1, 1]} : f32[1, 1, 2, 3]
  output "y" = %d
}
"""
    with pytest.raises(ParseError, match="x4"):
        parse_function(text, Registry.default())
    text = text.replace("  %p = MaxPool(%x4) {kernel = [1, 1]} : f32[1, 1, 2, 3]\n", "")
    fn = parse_function(text, Registry.default())
    assert [n.OP for n in fn.nodes] == ["SumN", "Dropout"]
    assert print_function(parse_function(print_function(fn), Registry.default())) == print_function(fn)


def test_parse_rejects_wrong_declared_type():
    text = "graph g {\n  input %a: f32[2]\n  %r = Relu(%a) : f32[3]\n  output \"y\" = %r\n}\n"
    with pytest.raises(ParseError, match="line 3"):
        parse_function(text, Registry.default())


def test_elided_constants_need_their_data():
    fn = api.load(REPO / "examples" / "tiny_cnn.onnx")
    text = print_function(fn, max_elements=16)
    assert "elided<" in text
    with pytest.raises(ParseError, match="elided"):
        parse_function(text, Registry.default())
    data = {c.name: c.data for c in fn.constants}
    again = parse_function(text, Registry.default(), constants=data)
    assert print_function(again) == print_function(fn)


def test_dot_output():
    fn = api.load(REPO / "examples" / "tiny_cnn.onnx")
    dot = to_dot(fn)
    assert dot.startswith('digraph "tiny_cnn" {') and dot.rstrip().endswith("}")
    assert dot.count("shape=box") == len(fn.nodes)
    assert "Conv" in dot and "->" in dot
