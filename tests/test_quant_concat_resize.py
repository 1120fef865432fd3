"""Concatenations and nearest resizes between quantized values stay int8: a concatenation's
parts are rescaled to its parameters (or kept as they are where they have them) and joined as
i8, a nearest resize picks i8 elements, in QDQ models (onnx.helper's and onnxruntime's
quantize_static's) and in models quantized from a profile; compared with onnxruntime within
one quantization step of the output (or, from a profile, with the float model)."""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import glowgen
from glowgen import api

from conftest import make_model, ort_quantize_static, ort_session, run_ort

rng = np.random.default_rng(1414)


@pytest.fixture(autouse=True)
def _own_random_data(request):
    """Each test draws the same data however the tests are ordered or split among workers."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _optimized(model, quantize=None):
    """The optimized graph (with `quantize`, a profile: after the [quantize] rules)."""
    from glowgen.frontend.onnx import CheckedModel, load_model
    checked = CheckedModel(load_model(model))
    fn = api.load(checked)
    api.optimize(fn, stage="optimized", backend="cpu", quantization=api.quantization_options(checked, quantize))
    return fn


def _ops(fn):
    return [n.OP for n in fn.nodes]


def _int8_nodes(fn, op):
    """The nodes of kind `op`, each asserted to compute on quantized i8 values."""
    nodes = [n for n in fn.nodes if n.OP == op]
    for n in nodes:
        assert n.outputs[0].type.dtype == "i8" and n.outputs[0].type.quant is not None, n
    return nodes


def _assert_within_steps(model, feeds, step, steps=1):
    expected = run_ort(model, feeds)["y"]
    for backend in ("cpu", "interpreter"):
        got = glowgen.compile(model, backend=backend).run(feeds)["y"]
        diff = float(np.abs(got - expected).max())
        assert diff <= steps * step * 1.0001, (backend, diff, step)


# ------------------------------------------------------------------ QDQ models from onnx.helper
U8, I8 = np.uint8, np.int8


@pytest.mark.parametrize("act", [U8, I8], ids=["u8", "i8"])
@pytest.mark.parametrize("same", [False, True], ids=["different_parameters", "same_parameters"])
def test_qdq_concat_joins_int8_parts(act, same):
    """DequantizeLinear of each part -> Concat -> QuantizeLinear: each part whose parameters
    differ from the result's is rescaled; one with the result's is joined as it is."""
    shift = 128 if act is U8 else 0
    params = [(0.03, 2), (0.05, -7), (0.02, 11)] if not same else [(0.04, -5)] * 3
    y_scale, y_zero = (0.05, -7) if not same else (0.04, -5)
    consts = {"ys": np.float32(y_scale), "yz": act(y_zero + shift)}
    nodes, feeds = [], {}
    for i, (s, z) in enumerate(params):
        consts[f"s{i}"], consts[f"z{i}"] = np.float32(s), act(z + shift)
        nodes += [helper.make_node("QuantizeLinear", [f"x{i}", f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"])]
        feeds[f"x{i}"] = rng.uniform(-4, 4, (1, i + 1, 3, 4)).astype(np.float32)
    nodes += [helper.make_node("Concat", ["d0", "d1", "d2"], ["c"], axis=1),
              helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
              helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"])]
    model = make_model(nodes, feeds, ["y"], consts, opset=17)
    fn = _optimized(model)
    assert len(_int8_nodes(fn, "Concat")) == 1, _ops(fn)
    assert _ops(fn).count("Rescale") == (0 if same else 2), _ops(fn)
    assert _ops(fn).count("Dequantize") == 1, _ops(fn)
    _assert_within_steps(model, feeds, y_scale)


# ------------------------------------------------------------------ an FPN-like network
def _fpn(mode="nearest"):
    """conv -> relu (a), conv stride 2 -> resize x2 (b), concat(a, b) -> conv: the top-down
    path of a feature pyramid; a's range and b's differ, and a feeds two convolutions."""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "w2", "b2"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["b", "", "scales"], ["up"], mode=mode),
             helper.make_node("Concat", ["ar", "up"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3", "b3"], ["y"])]
    consts = {"w1": w(4, 3, 3, 3), "b1": w(4), "w2": w(5, 4, 3, 3), "b2": w(5) * 5,
              "scales": np.float32([1, 1, 2, 2]), "w3": w(2, 9, 1, 1), "b3": w(2)}
    return make_model(nodes, {"x": np.zeros((1, 3, 8, 8), np.float32)}, ["y"], consts, opset=17)


def _samples(n):
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("act", ["QUInt8", "QInt8"])
def test_quantize_static_fpn_concatenates_and_resizes_int8(tmp_path, act):
    """onnxruntime's QDQ model of the FPN: one integer island from the input's Quantize to
    the output's Dequantize, agreeing with onnxruntime on the file."""
    onnx.save(_fpn(), tmp_path / "f.onnx")
    ort_quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", _samples(8), "QDQ", act)
    qdq = onnx.load(tmp_path / "q.onnx")
    fn = _optimized(qdq)
    ops = _ops(fn)
    assert len(_int8_nodes(fn, "Concat")) == 1 and len(_int8_nodes(fn, "Resize")) == 1, ops
    assert ops.count("Quantize") == 1 and ops.count("Dequantize") == 1, ops
    assert ops.count("QuantizedConv") == 3 and "Conv" not in ops, ops
    # The resized part's convolution requantizes once, to the concatenation's parameters,
    # where onnxruntime rounds to its own and again: a step apart here and there, two after
    # the last convolution.
    for s in _samples(3):
        _assert_within_steps(qdq, s, _output_step(qdq), steps=2)


def _output_step(qdq):
    """The scale of the model's output (its last DequantizeLinear's)."""
    out_dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    return float(numpy_helper.to_array(next(t for t in qdq.graph.initializer if t.name == out_dq.input[1])))


def test_quantize_static_fpn_with_a_linear_resize_resizes_in_float(tmp_path):
    """A linear resize computes between the quantized values (no int8 kernel rounds its sums
    as onnxruntime does); the concatenation after it still joins int8 parts."""
    onnx.save(_fpn("linear"), tmp_path / "f.onnx")
    ort_quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", _samples(8), "QDQ", "QUInt8")
    qdq = onnx.load(tmp_path / "q.onnx")
    fn = _optimized(qdq)
    assert len(_int8_nodes(fn, "Concat")) == 1, _ops(fn)
    assert [n.outputs[0].type.dtype for n in fn.nodes if n.OP == "Resize"] == ["f32"], _ops(fn)
    for s in _samples(3):
        _assert_within_steps(qdq, s, _output_step(qdq), steps=2)


def test_profile_quantized_fpn_concatenates_and_resizes_int8():
    """Quantized from glowgen's profile: one integer island from the input to the output,
    the resized part stored by its convolution at the concatenation's parameters, and the
    result within a few steps of the float model's."""
    model, samples = _fpn(), _samples(8)
    prof = glowgen.profile(model, samples, bins=128)
    fn = _optimized(model, quantize=prof)
    ops = _ops(fn)
    assert len(_int8_nodes(fn, "Concat")) == 1 and len(_int8_nodes(fn, "Resize")) == 1, ops
    assert ops.count("Quantize") == 1 and ops.count("Dequantize") == 1, ops
    assert all(n.outputs[0].type.dtype == "i8" for n in fn.nodes if n.OP != "Dequantize"), ops
    resized = next(n for n in fn.nodes if n.OP == "Resize").inputs[0].producer
    assert resized.OP in ("QuantizedConv", "Min", "Max"), resized       # no Rescale between
    step = (prof["y"].max - prof["y"].min) / 255
    # 7-bit weights (what the cpu backend takes without VNNI) have twice the step of 8-bit
    # ones: 3.5 to 4.1 output steps from the float result where 8-bit weights gave 2.6.
    for backend, bits, steps in (("cpu", 8, 4), ("interpreter", 8, 4), ("cpu", 7, 6)):
        q = glowgen.compile(model, backend=backend, quantize=prof, weight_bits=bits)
        for s in samples[:3]:
            expected = run_ort(model, s)["y"]
            assert np.abs(q.run(s)["y"] - expected).max() < steps * step, (backend, bits)


def test_a_concatenation_of_differently_quantized_parts_is_refused():
    """Joined as they are, i8 parts of other parameters would mean other numbers: the graph
    says which parts to rescale."""
    from glowgen.engine.registry import Registry
    from glowgen.engine.textual import parse_function
    from glowgen.errors import GlowgenError
    text = ("graph g {\n  input %a: i8[2, 3] q(0.02, 5)\n  input %b: i8[2, 2] q(0.05, -3)\n"
            "  %y = Concat([%a, %b]) {axis = 1} : i8[2, 5] q(0.02, 5)\n  output \"y\" = %y\n}")
    with pytest.raises(GlowgenError, match="quantized operands must share their scale and offset"):
        parse_function(text, Registry.default())


def test_quantize_static_det_fpn_keeps_its_feature_pyramid_int8(tmp_path):
    """The bench set's det_fpn as onnxruntime's QDQ file: its six nearest upsamplings and its
    concatenation of four levels (each of its own parameters) run on i8, every convolution
    is an integer one, and the output agrees with onnxruntime's on the file within one step."""
    from conftest import require_bench_dir
    path = require_bench_dir() / "det_fpn.onnx"
    samples = [{"input": rng.random((1, 3, 640, 640)).astype(np.float32)} for _ in range(3)]
    ort_quantize_static(path, tmp_path / "q.onnx", samples[:2], "QDQ", "QUInt8")
    qdq = onnx.load(tmp_path / "q.onnx")
    fn = _optimized(qdq)
    assert len(_int8_nodes(fn, "Concat")) == 1 and len(_int8_nodes(fn, "Resize")) == 6, _ops(fn)
    assert _ops(fn).count("QuantizedConv") == 34 and "Conv" not in _ops(fn)
    sess = ort_session(onnx.load(tmp_path / "q.onnx"))
    got = glowgen.compile(qdq, backend="cpu").run(samples[2])["output"]
    step = next(float(numpy_helper.to_array(t)) for t in qdq.graph.initializer if t.name == "output_scale")
    assert np.abs(got - sess.run(None, samples[2])[0]).max() <= step * 1.0001
