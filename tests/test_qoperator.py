"""ONNX QOperator models (onnxruntime's quantize_static with QuantFormat.QOperator): ONNX's
QLinearConv and QLinearMatMul and onnxruntime's com.microsoft quantized ops compile to the
quantized types and int8 kernels glowgen's own quantization uses, and agree with onnxruntime
within one quantization step of the output."""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glowgen
from glowgen import api
from glowgen.errors import UnsupportedError

from conftest import make_ms_model, ort_quantize_static, ort_session, run_ort

rng = np.random.default_rng(14)


@pytest.fixture(autouse=True)
def _own_random_data(request):
    """Each test draws the same data however the tests are ordered or split among workers."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
MS = "com.microsoft"
U8, I8 = np.uint8, np.int8
ONNX_TYPE = {U8: TensorProto.UINT8, I8: TensorProto.INT8}


def _zero(dtype, value):
    """A zero point of `dtype` near `value` (u8 ranges are i8's moved by 128)."""
    return dtype(value + (128 if dtype is U8 else 0))


def _quantized_model(core_nodes, x_shape, y_shape, consts, act=U8, x_scale=0.05, y_scale=0.1):
    """x (f32) -> QuantizeLinear -> the nodes (reading "xq", writing "yq") -> DequantizeLinear -> y:
    a QOperator model as onnxruntime's quantizer writes one, with activations of type `act`."""
    consts = dict(consts, xs=np.float32(x_scale), xz=_zero(act, -3), ys=np.float32(y_scale), yz=_zero(act, 4))
    nodes = ([helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])] + core_nodes
             + [helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])])
    x = rng.uniform(-5, 5, x_shape).astype(np.float32)
    return make_ms_model(nodes, {"x": x}, {"y": (TensorProto.FLOAT, y_shape)}, consts), x


def _optimized_ops(model):
    fn = api.load(model)
    api.optimize(fn, stage="optimized", backend="cpu")
    return [n.OP for n in fn.nodes]


def _assert_within_steps(model, feeds, step, backends=("cpu", "interpreter"), steps=1):
    expected = run_ort(model, feeds)["y"]
    for backend in backends:
        got = glowgen.compile(model, backend=backend).run(feeds)["y"]
        diff = float(np.abs(got - expected).max())
        assert diff <= steps * step * 1.0001, (backend, diff, step)


def _weights(dtype, shape, per_channel):
    """Quantized weights as onnxruntime writes them: i8 symmetric (zero point 0), u8 with
    a zero point near the middle; scales per output channel (axis 0) or one."""
    m = shape[0]
    if dtype is I8:
        w = rng.integers(-127, 128, shape).astype(I8)
        z = np.zeros(m if per_channel else (), I8)
    else:
        w = rng.integers(0, 256, shape).astype(U8)
        z = np.full(m if per_channel else (), 128, U8)
    s = rng.uniform(0.002, 0.01, m).astype(np.float32) if per_channel else np.float32(0.005)
    return w, s, z


# ------------------------------------------------------------------ QLinearConv / QLinearMatMul
# The type pairs onnxruntime implements (it has no i8 activations with u8 weights).
@pytest.mark.parametrize("act, wtype", [(U8, I8), (U8, U8), (I8, I8)], ids=["u8_i8", "u8_u8", "i8_i8"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_qlinear_conv_becomes_quantized_conv(act, wtype, per_channel):
    w, ws, wz = _weights(wtype, (6, 3, 3, 3), per_channel)
    b = rng.integers(-500, 500, 6).astype(np.int32)
    conv = helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                            pads=[1, 1, 1, 1], strides=[2, 1])
    model, x = _quantized_model([conv], (1, 3, 7, 6), (1, 6, 4, 6), {"w": w, "ws": ws, "wz": wz, "b": b}, act=act)
    ops = _optimized_ops(model)
    assert "QuantizedConv" in ops and "QLinearConv" not in ops and "Conv" not in ops, ops
    _assert_within_steps(model, {"x": x}, 0.1)


def test_u8_weights_about_128_stay_exact():
    """u8 weights of zero point 128 (every weight within i8's range of it) are the integer
    op's i8 weights as they are, not quantized again from their float values: the same
    integers as onnxruntime (quantized again, 255 of 6480 outputs were a step off)."""
    w = rng.integers(0, 256, (16, 8, 3, 3)).astype(U8)
    wz, ws = np.full(16, 128, U8), rng.uniform(0.002, 0.01, 16).astype(np.float32)
    b = rng.integers(-500, 500, 16).astype(np.int32)
    conv = helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                            pads=[1, 1, 1, 1])
    model, x = _quantized_model([conv], (2, 8, 9, 9), (2, 16, 9, 9), {"w": w, "ws": ws, "wz": wz, "b": b},
                                y_scale=0.5)
    fn = api.load(model)
    api.optimize(fn, stage="optimized", backend="cpu")
    (q,) = [n for n in fn.nodes if n.OP == "QuantizedConv"]
    np.testing.assert_array_equal(q.inputs[1].data, w.astype(np.int16) - 128)
    expected = run_ort(model, {"x": x})["y"]
    for backend in ("cpu", "interpreter"):
        np.testing.assert_array_equal(glowgen.compile(model, backend=backend).run({"x": x})["y"], expected)


def test_grouped_qlinear_conv_runs_as_the_grouped_fallback():
    """A depthwise QLinearConv: the quantized op, computed by the float convolution on cpu."""
    w, ws, wz = _weights(I8, (4, 1, 3, 3), True)
    conv = helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"],
                            pads=[1, 1, 1, 1], group=4)
    model, x = _quantized_model([conv], (1, 4, 5, 5), (1, 4, 5, 5), {"w": w, "ws": ws, "wz": wz})
    assert "QuantizedConv" in _optimized_ops(model)
    _assert_within_steps(model, {"x": x}, 0.1)


@pytest.mark.parametrize("act", [U8, I8], ids=["u8", "i8"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_column", "per_tensor"])
def test_qlinear_matmul_becomes_quantized_matmul(act, per_channel):
    w = rng.integers(-127, 128, (8, 5)).astype(I8)
    ws = rng.uniform(0.002, 0.01, 5).astype(np.float32) if per_channel else np.float32(0.005)
    wz = np.zeros(5, I8) if per_channel else I8(0)
    mm = helper.make_node("QLinearMatMul", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"])
    model, x = _quantized_model([mm], (2, 3, 8), (2, 3, 5), {"w": w, "ws": ws, "wz": wz}, act=act)
    ops = _optimized_ops(model)
    assert "QuantizedMatMul" in ops and "MatMul" not in ops, ops
    _assert_within_steps(model, {"x": x}, 0.1)


def test_qlinear_conv_of_a_model_input_keeps_the_exact_integer_semantics():
    """Over a u8 model input (no quantization the compiler sees), QLinearConv is computed
    exactly as ONNX defines it: the same integers as onnxruntime."""
    w, ws, wz = _weights(I8, (2, 3, 3, 3), True)
    consts = {"xs": np.float32(0.05), "xz": U8(125), "w": w, "ws": ws, "wz": wz, "ys": np.float32(0.1),
              "yz": U8(128)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    x = rng.integers(0, 256, (1, 3, 5, 5)).astype(U8)
    model = make_ms_model([node], {"x": x}, {"y": (TensorProto.UINT8, (1, 2, 3, 3))}, consts)
    assert "QuantizedConv" not in _optimized_ops(model)
    got = glowgen.compile(model).run({"x": x})["y"]
    np.testing.assert_array_equal(got, run_ort(model, {"x": x})["y"])


# ------------------------------------------------------------------ com.microsoft ops
def _ms(op, inputs, **attrs):
    return helper.make_node(op, inputs, ["yq"], domain=MS, **attrs)


def _binary(op):
    def make(act):
        b = rng.integers(0, 256, (4, 1)) - (0 if act is U8 else 128)
        consts = {"b": b.astype(act), "bs": np.float32(0.04), "bz": _zero(act, 10)}
        return [_ms(op, ["xq", "xs", "xz", "b", "bs", "bz", "ys", "yz"])], (2, 4, 6), (2, 4, 6), consts
    return make


def _unary(op, out_shape=None, **attrs):
    def make(act):
        return [_ms(op, ["xq", "xs", "xz", "ys", "yz"], **attrs)], (1, 3, 4, 6), out_shape or (1, 3, 4, 6), {}
    return make


MS_CASES = {
    "QLinearAdd": _binary("QLinearAdd"),
    "QLinearMul": _binary("QLinearMul"),
    "QLinearSigmoid": _unary("QLinearSigmoid"),
    "QLinearLeakyRelu": _unary("QLinearLeakyRelu", alpha=0.1),
    "QLinearGlobalAveragePool": _unary("QLinearGlobalAveragePool", (1, 3, 1, 1)),
    "QLinearAveragePool": _unary("QLinearAveragePool", (1, 3, 2, 6), kernel_shape=[3, 3], strides=[2, 1],
                                 pads=[1, 1, 0, 1], count_include_pad=1),
}


@pytest.mark.parametrize("act", [U8, I8], ids=["u8", "i8"])
@pytest.mark.parametrize("op", list(MS_CASES))
def test_com_microsoft_op_runs_between_quantized_types(op, act):
    nodes, x_shape, y_shape, consts = MS_CASES[op](act)
    y_scale = 0.01 if op == "QLinearSigmoid" else 0.1
    model, x = _quantized_model(nodes, x_shape, y_shape, consts, act=act, y_scale=y_scale)
    ops = _optimized_ops(model)
    assert not {"QuantizeLinear", "DequantizeLinear", op} & set(ops), ops
    assert "Quantize" in ops and "Dequantize" in ops
    _assert_within_steps(model, {"x": x}, y_scale)


@pytest.mark.parametrize("act", [U8, I8], ids=["u8", "i8"])
@pytest.mark.parametrize("opset, axis", [(13, None), (13, 1), (12, 1), (12, 2)],
                         ids=["opset13_default_axis", "opset13_axis1", "opset12_flat_axis1", "opset12_flat_axis2"])
def test_qlinear_softmax_runs_between_quantized_types(act, opset, axis):
    """onnxruntime's QLinearSoftmax: ONNX Softmax of its `opset` (before 13: over x seen as
    2-D) on the dequantized x, quantized as onnxruntime's quantizer writes it (scale 1/256,
    the zero point at the bottom of the range)."""
    attrs = {"opset": opset} if axis is None else {"opset": opset, "axis": axis}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             _ms("QLinearSoftmax", ["xq", "xs", "xz", "ys", "yz"], **attrs),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    x = rng.uniform(-4, 4, (2, 3, 5)).astype(np.float32)
    consts = {"xs": np.float32(0.04), "xz": _zero(act, 3), "ys": np.float32(1 / 256), "yz": _zero(act, -128)}
    model = make_ms_model(nodes, {"x": x}, {"y": (TensorProto.FLOAT, x.shape)}, consts)
    ops = _optimized_ops(model)
    assert not {"QuantizeLinear", "DequantizeLinear", "QLinearSoftmax"} & set(ops), ops
    assert "Quantize" in ops and "Dequantize" in ops
    _assert_within_steps(model, {"x": x}, 1 / 256)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_qgemm_becomes_quantized_matmul(per_channel):
    w = rng.integers(-127, 128, (5, 8)).astype(I8)              # [N, K], transB
    ws = rng.uniform(0.002, 0.01, 5).astype(np.float32) if per_channel else np.float32(0.005)
    wz = np.zeros(5, I8) if per_channel else I8(0)
    c = rng.integers(-2000, 2000, 5).astype(np.int32)
    gemm = _ms("QGemm", ["xq", "xs", "xz", "w", "ws", "wz", "c", "ys", "yz"], transB=1)
    model, x = _quantized_model([gemm], (3, 8), (3, 5), {"w": w, "ws": ws, "wz": wz, "c": c})
    ops = _optimized_ops(model)
    assert "QuantizedMatMul" in ops and "MatMul" not in ops, ops
    _assert_within_steps(model, {"x": x}, 0.1)


def test_qgemm_with_a_float_result():
    """A QGemm without y_scale gives f32: the product of the dequantized operands plus c."""
    w = rng.integers(-127, 128, (8, 5)).astype(I8)
    consts = {"xs": np.float32(0.05), "xz": U8(120), "w": w, "ws": rng.uniform(0.002, 0.01, 5).astype(np.float32),
              "wz": np.zeros(5, I8), "c": rng.integers(-2000, 2000, 5).astype(np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             _ms("QGemm", ["xq", "xs", "xz", "w", "ws", "wz", "c"], alpha=0.5)]
    nodes[-1].output[0] = "y"
    x = rng.uniform(-5, 5, (3, 8)).astype(np.float32)
    model = make_ms_model(nodes, {"x": x}, {"y": (TensorProto.FLOAT, (3, 5))}, consts)
    expected = run_ort(model, {"x": x})["y"]
    for backend in ("cpu", "interpreter"):
        got = glowgen.compile(model, backend=backend).run({"x": x})["y"]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


def test_unsupported_forms_are_refused_clearly():
    pool = _ms("QLinearGlobalAveragePool", ["xq", "xs", "xz", "ys", "yz"], channels_last=1)
    model, _ = _quantized_model([pool], (1, 3, 4, 4), (1, 1, 1, 4), {})
    with pytest.raises(UnsupportedError, match="channels_last=1 is not supported"):
        glowgen.compile(model)
    w = rng.integers(-127, 128, (4, 5)).astype(I8)
    gemm = helper.make_node("QGemm", ["xq", "xs", "xz", "w", "ws", "wz", "", "", "yz"], ["f"], domain=MS)
    model = make_ms_model([helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), gemm],
                          {"x": np.zeros((2, 4), np.float32)}, {"f": (TensorProto.FLOAT, (2, 5))},
                          {"xs": np.float32(0.1), "xz": U8(128), "w": w, "ws": np.float32(0.01), "wz": I8(0),
                           "yz": U8(128)})
    with pytest.raises(UnsupportedError, match="y_zero_point but no y_scale"):
        glowgen.compile(model)
    softmax = _ms("QLinearSoftmax", ["xq", "xs", "xz", "ys", "yz"])
    model, _ = _quantized_model([softmax], (2, 3), (2, 3), {})
    with pytest.raises(UnsupportedError, match="the attribute opset .* is missing"):
        glowgen.compile(model)
    model = make_ms_model([helper.make_node("QAttention", ["x"], ["y"], domain=MS)],
                          {"x": np.zeros((2, 4), np.float32)}, {"y": (TensorProto.FLOAT, (2, 4))})
    with pytest.raises(UnsupportedError, match="domain 'com.microsoft'.*glowgen ops --onnx"):
        glowgen.compile(model)


# ------------------------------------------------------------------ onnxruntime's quantizer
def _small_cnn():
    """conv -> relu -> conv -> add (residual) -> relu -> global average pool -> flatten -> gemm."""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    consts = {"w1": w(8, 3, 3, 3), "b1": w(8), "w2": w(8, 8, 3, 3), "b2": w(8), "wf": w(5, 8), "bf": w(5)}
    x = np.zeros((1, 3, 8, 8), np.float32)
    return make_ms_model(nodes, {"x": x}, {"y": (TensorProto.FLOAT, (1, 5))}, consts, opset=13)


@pytest.mark.parametrize("act, per_channel", [("QUInt8", True), ("QInt8", True), ("QUInt8", False)])
def test_onnxruntime_qoperator_cnn_compiles_to_int8_kernels(tmp_path, act, per_channel):
    pytest.importorskip("onnxruntime.quantization")
    onnx.save(_small_cnn(), tmp_path / "f.onnx")
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    ort_quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", samples, "QOperator", act, per_channel)
    qop = onnx.load(tmp_path / "q.onnx")
    written = {n.op_type for n in qop.graph.node}
    assert {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= written, written

    fn = api.load(qop)
    api.optimize(fn, stage="optimized", backend="cpu")
    ops = [n.OP for n in fn.nodes]
    assert ops.count("QuantizedConv") == 2 and ops.count("QuantizedMatMul") == 1, ops
    assert not {"Conv", "MatMul", "QLinearConv", "QuantizeLinear", "DequantizeLinear"} & set(ops), ops
    # The convolutions compute with onnxruntime's integer weights, not ones quantized again.
    initializers = {t.name for t in qop.graph.initializer}
    assert all(n.inputs[1].name in initializers for n in fn.nodes if n.OP == "QuantizedConv")

    out_dq = next(n for n in qop.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
    step = float(onnx.numpy_helper.to_array(next(t for t in qop.graph.initializer if t.name == out_dq.input[1])))
    sess = ort_session(onnx.load(tmp_path / "q.onnx"))
    for backend in ("cpu", "interpreter"):
        compiled = glowgen.compile(tmp_path / "q.onnx", backend=backend)
        for _ in range(3):
            s = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
            diff = float(np.abs(compiled.run(s)["y"] - sess.run(None, s)[0]).max())
            assert diff <= step * 1.0001, (backend, diff, step)


@pytest.mark.parametrize("act", [U8, I8], ids=["u8", "i8"])
def test_qlinear_concat_dequantizes_each_input_with_its_own_parameters(act):
    """onnxruntime's QLinearConcat interleaves (tensor, scale, zero point) triples."""
    consts = {"s1": np.float32(0.05), "z1": _zero(act, -3), "s2": np.float32(0.02), "z2": _zero(act, 9),
              "s3": np.float32(0.08), "z3": _zero(act, 0), "ys": np.float32(0.06), "yz": _zero(act, 2)}
    nodes = [helper.make_node("QuantizeLinear", [f"x{i}", f"s{i}", f"z{i}"], [f"q{i}"]) for i in (1, 2, 3)]
    nodes += [helper.make_node("QLinearConcat", ["ys", "yz", "q1", "s1", "z1", "q2", "s2", "z2", "q3", "s3", "z3"],
                               ["yq"], domain=MS, axis=-1),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    feeds = {"x1": rng.uniform(-3, 3, (2, 3, 4)).astype(np.float32),
             "x2": rng.uniform(-3, 3, (2, 3, 1)).astype(np.float32),
             "x3": rng.uniform(-3, 3, (2, 3, 2)).astype(np.float32)}
    model = make_ms_model(nodes, feeds, {"y": (TensorProto.FLOAT, (2, 3, 7))}, consts)
    ops = _optimized_ops(model)
    assert not {"QLinearConcat", "DequantizedConcat", "QuantizeLinear", "DequantizeLinear"} & set(ops), ops
    assert ops.count("Concat") == 1, ops
    _assert_within_steps(model, feeds, 0.06)
