"""Golden tests of the rules of specs/lowerings.glowdef: one case per rule, or per form a rule
handles (a case `rule.variant`, e.g. `gemm_to_matmul.no_bias` for a Gemm without its
optional operand, `unary_transpose_sink.tanh` for one member of the family it matches).

Each case is a small ONNX model in which the rule applies (or, for ops ONNX does not
have, a graph in textual form and a NumPy oracle).  tests/golden/<case>.txt holds the graph
before (as imported) and after applying its rule alone.  The test checks that the rule fires,
that before/after match the golden text, and that the rewritten graph, lowered and run, computes
what onnxruntime computes on the original model.

    pytest tests/test_golden.py --regen-golden      # rewrite the files, then review the diff
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from glowgen import api, pipeline
from glowgen.reference import evaluate
from glowgen.engine.registry import Registry
from glowgen.engine.rewrite import RewriteContext, apply_rules
from glowgen.engine.textual import parse_function, print_function

from conftest import make_model, make_ms_model, run_ort

GOLDEN = Path(__file__).parent / "golden"
rng = np.random.default_rng(2024)


def f32(*shape):
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


def pos(*shape):
    return rng.uniform(0.5, 2, size=shape).astype(np.float32)


def onnx_case(op, inputs, attrs=None, consts=None, opset=17, outputs=("y",)):
    names = list(inputs) + list(consts or {})
    node = helper.make_node(op, names, list(outputs), **(attrs or {}))
    return {"model": make_model([node], inputs, list(outputs), consts, opset=opset), "feeds": inputs}


def _with_reference(case):
    """A case whose oracle is ONNX's reference evaluator (onnxruntime lacks the opset)."""
    from conftest import run_reference
    case["oracle"] = lambda feeds: run_reference(case["model"], feeds)
    return case


def text_case(text, feeds, oracle):
    """A graph in textual form (for ops ONNX does not have); `oracle` is a NumPy function of
    the feeds or an equivalent ONNX model for onnxruntime."""
    return {"text": text, "feeds": feeds, "oracle": oracle}


def graph_case(nodes, inputs, consts=None, outputs=("y",), opset=17):
    """Several ONNX nodes: (op, inputs, outputs, attrs) tuples."""
    made = [helper.make_node(op, list(ins), list(outs), **(attrs or {})) for op, ins, outs, attrs in nodes]
    return {"model": make_model(made, inputs, list(outputs), consts, opset=opset), "feeds": inputs}


def _resize_case(inputs, consts, **attrs):
    """ONNX Resize (opset 19) of inputs[x] with the given roi / scales / sizes constants."""
    names = ["x"] + [n if n in consts else "" for n in ("roi", "scales", "sizes")]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    return {"model": make_model([node], inputs, ["y"], consts, opset=19), "feeds": inputs}


def binary_text(op, lhs_shape, const, x):
    """text graph `y = op(x, c)` for a constant c, with an ONNX model of the same as oracle."""
    dims = ", ".join(map(str, x.shape))
    cdims = ", ".join(map(str, np.shape(const)))
    data = ", ".join(str(v) for v in np.asarray(const, np.float32).reshape(-1))
    text = (f"graph g {{\n  input %x: f32[{dims}]\n  const %c: f32[{cdims}] = dense<[{data}]>\n"
            f"  %y = {op}(%x, %c) : f32[{dims}]\n  output \"y\" = %y\n}}\n")
    onnx_op = {"Max": "Max", "Min": "Min"}[op]
    model = make_model([helper.make_node(onnx_op, ["x", "c"], ["y"])], {"x": x}, ["y"],
                       {"c": np.asarray(const, np.float32)})
    return text_case(text, {"x": x}, model)


_X23 = f32(2, 3)
_max_min_text = """graph g {
  input %x: f32[2, 3]
  const %lo: f32[] = dense<[LO]>
  const %hi: f32[] = dense<[HI]>
  %m = INNER : f32[2, 3]
  %y = Min(%m, %hi) : f32[2, 3]
  output "y" = %y
}
"""
_swish_text = """graph g {
  input %x: f32[2, 3]
  %y = Swish(%x) : f32[2, 3]
  output "y" = %y
}
"""
_max_same_text = """graph g {
  input %x: f32[2, 3]
  %y = Max(%x, %x) : f32[2, 3]
  output "y" = %y
}
"""


def _onnx_chain(ops, x, consts=None):
    """A chain of ONNX nodes, each reading the previous result (and named constants)."""
    nodes, prev = [], "x"
    for i, (op, extra, attrs) in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"t{i}"
        nodes.append((op, [prev] + list(extra), [out], attrs))
        prev = out
    return graph_case(nodes, {"x": x}, consts)


_FC_X, _FC_W, _FC_B = f32(2, 3), f32(3, 4), f32(4)
_fc_text = f"""graph fc {{
  input %x: f32[2, 3]
  const %w: f32[3, 4] = dense<[{', '.join(str(v) for v in _FC_W.reshape(-1))}]>
  const %b: f32[4] = dense<[{', '.join(str(v) for v in _FC_B)}]>
  %fc = FullyConnected(%x, %w, %b) : f32[2, 4]
  output "y" = %fc
}}
"""


# ---- float16 legalization: the primitive in f16 (textual), oracle = the same ONNX op in f32
# on onnxruntime, rounded once to f16 (the semantics the rule implements).
_rng16 = np.random.default_rng(16)      # its own stream: the other cases' data stays as it was


def _h16(*shape):
    return _rng16.uniform(-1, 1, size=shape).astype(np.float16)


def _f16_case(prim, onnx_op, feeds, out_shape, attrs_text="", onnx_attrs=None, onnx_consts=None):
    def dims(a):
        return ", ".join(map(str, a))
    lines = [f"  input %{k}: f16[{dims(v.shape)}]" for k, v in feeds.items()]
    args = ", ".join(f"%{k}" for k in feeds)
    attrs = f" {{{attrs_text}}}" if attrs_text else ""
    text = ("graph g {\n" + "\n".join(lines) + "\n"
            f"  %y = {prim}({args}){attrs} : f16[{dims(out_shape)}]\n  output \"y\" = %y\n}}\n")
    names = list(feeds) + list(onnx_consts or {})
    model = make_model([helper.make_node(onnx_op, names, ["y"], **(onnx_attrs or {}))],
                       {k: v.astype(np.float32) for k, v in feeds.items()}, ["y"], onnx_consts)

    def oracle(f):
        wide = run_ort(model, {k: v.astype(np.float32) for k, v in f.items()})
        return {k: v.astype(np.float16) for k, v in wide.items()}
    # One f16 ulp (~1e-3 relative) of slack: the f32 sums may round to either neighbour
    # when they land next to a half-way point, depending on summation order.
    return dict(text_case(text, feeds, oracle), rtol=1e-3, atol=1e-3)


_reflect_text = """graph reflect {
  input %x: f32[7]
  const %lo: f32[] = dense<[-0.5]>
  const %hi: f32[] = dense<[2.5]>
  %y = Reflect(%x, %lo, %hi) : f32[7]
  output "y" = %y
}
"""
# Reflection into [-0.5, 2.5] (span 3), written out: past the low border by 1.25 lands at
# 0.75; past the high border by 4 (one whole span and 1 more) lands 1 above the low border;
# past the low border by 6.5 (two spans and 0.5) lands 0.5 above it again.
_REFLECT_X = np.array([-1.75, 0.3, 2.5, 6.5, -7.0, 3.0, 12.25], np.float32)
_REFLECT_Y = np.array([0.75, 0.3, 2.5, 0.5, 0.0, 2.0, 0.25], np.float32)

# Quantization cases draw from their own generator, so the cases above keep their data.
_qrng = np.random.default_rng(2025)


def _u8(*shape):
    return _qrng.integers(0, 256, size=shape).astype(np.uint8)


_QP_AXIS = _qrng.uniform(-2, 2, size=3).astype(np.float32)
_quant_param_axis_text = """graph qp {
  input %p: f32[3]
  %y = QuantParam(%p) {like = [2, 3, 4], axis = 1, block_size = 0} : f32[3, 1]
  output "y" = %y
}
"""
_QP_BLOCKED = _qrng.uniform(-2, 2, size=(2, 3)).astype(np.float32)
_quant_param_blocked_text = """graph qp {
  input %p: f32[2, 3]
  %y = QuantParam(%p) {like = [2, 5], axis = 1, block_size = 2} : f32[2, 5]
  output "y" = %y
}
"""

CASES = {
    "f16_matmul_in_f32": _f16_case("BatchMatMul", "MatMul", {"a": _h16(2, 3, 40), "b": _h16(2, 40, 4)}, (2, 3, 4)),
    "f16_conv_in_f32": _f16_case(
        "Conv", "Conv", {"x": _h16(1, 4, 6, 6), "w": _h16(3, 4, 3, 3), "b": _h16(3)}, (1, 3, 6, 6),
        "strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1", {"pads": [1, 1, 1, 1]}),
    "f16_convn_in_f32": _f16_case(
        "ConvN", "Conv", {"x": _h16(1, 4, 9), "w": _h16(3, 4, 3), "b": _h16(3)}, (1, 3, 7),
        "strides = [1], pads = [0, 0], dilations = [1], group = 1"),
    "f16_reducesum_in_f32": _f16_case("ReduceSum", "ReduceSum", {"x": _h16(3, 50)}, (3, 1),
                                      "axes = [1], keepdims = 1",
                                      onnx_consts={"axes": np.array([1], np.int64)}),
    "f16_avgpool_in_f32": _f16_case(
        "AvgPool", "AveragePool", {"x": _h16(1, 2, 6, 6)}, (1, 2, 3, 3),
        "kernel = [2, 2], strides = [2, 2], pads = [0, 0, 0, 0], ceil_mode = 0, count_include_pad = 0",
        {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "identity_remove": onnx_case("Identity", {"x": f32(2, 3)}),
    "dropout_remove": onnx_case("Dropout", {"x": f32(2, 3)}),
    "dropout_mask": onnx_case("Dropout", {"x": f32(2, 3)}, outputs=("y", "mask")),
    "reciprocal_to_div": onnx_case("Reciprocal", {"x": pos(2, 3)}),
    "clip_to_max_min": onnx_case("Clip", {"x": f32(2, 3)}, consts={"lo": np.float32(-1), "hi": np.float32(1)}),
    "hardsigmoid_expand": onnx_case("HardSigmoid", {"x": f32(2, 3)}, attrs={"alpha": 0.3}),
    "hardswish_expand": onnx_case("HardSwish", {"x": f32(2, 3) * 3}),
    "sum_single": onnx_case("Sum", {"a": f32(2, 3)}),
    "sum_chain": onnx_case("Sum", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}),
    "mean_to_sum": onnx_case("Mean", {"a": f32(2, 3), "b": f32(3)}),
    "max_single": onnx_case("Max", {"a": f32(2, 3)}),
    "max_chain": onnx_case("Max", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}),
    "min_single": onnx_case("Min", {"a": f32(2, 3)}),
    "min_chain": onnx_case("Min", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}),
    "flatten_to_reshape": onnx_case("Flatten", {"x": f32(2, 3, 2)}),
    "squeeze_to_reshape": onnx_case("Squeeze", {"x": f32(1, 3, 1)}),
    "unsqueeze_to_reshape": onnx_case("Unsqueeze", {"x": f32(2, 3)}, consts={"axes": np.array([1], np.int64)}),
    "gemm_to_matmul": onnx_case("Gemm", {"a": f32(2, 3), "b": f32(4, 3), "c": f32(4)},
                                attrs={"transB": 1, "alpha": 0.5, "beta": 2.0}),
    "gemm_to_matmul.no_bias": onnx_case("Gemm", {"a": f32(3, 2), "b": f32(3, 4)}, attrs={"transA": 1}),
    "fc_to_matmul": text_case(_fc_text, {"x": _FC_X}, lambda f: {"y": f["x"] @ _FC_W + _FC_B}),
    "matmul_vector_lhs": onnx_case("MatMul", {"a": f32(3), "b": f32(3, 2)}),
    "matmul_vector_rhs": onnx_case("MatMul", {"a": f32(2, 3), "b": f32(3)}),
    "matmul_shared_rhs": onnx_case("MatMul", {"a": f32(2, 2, 3), "b": f32(3, 2)}),
    "matmul_batched": onnx_case("MatMul", {"a": f32(2, 1, 2, 3), "b": f32(2, 3, 2)}),
    "batchnorm_to_affine": onnx_case("BatchNormalization", {"x": f32(1, 2, 2, 2)},
                                     consts={"s": pos(2), "b": f32(2), "m": f32(2), "v": pos(2)}),
    "layernorm_expand": onnx_case("LayerNormalization", {"x": f32(2, 4)}, consts={"s": f32(4), "b": f32(4)}),
    "layernorm_expand.no_bias": onnx_case("LayerNormalization", {"x": f32(2, 4)}, consts={"s": f32(4)}),
    "softmax_expand": onnx_case("Softmax", {"x": f32(2, 3)}),
    "logsoftmax_expand": onnx_case("LogSoftmax", {"x": f32(2, 3)}),
    "softmax_flat_to_2d": onnx_case("Softmax", {"x": f32(2, 2, 3)}, attrs={"axis": 1}, opset=11),
    "logsoftmax_flat_to_2d": onnx_case("LogSoftmax", {"x": f32(2, 2, 3)}, attrs={"axis": 1}, opset=11),
    "reducemean_to_sum": onnx_case("ReduceMean", {"x": f32(2, 3)}, attrs={"axes": [1]}),
    "global_avgpool_to_mean": onnx_case("GlobalAveragePool", {"x": f32(1, 2, 3, 3)}),
    "global_maxpool_to_max": onnx_case("GlobalMaxPool", {"x": f32(1, 2, 3, 3)}),
    "lrn_expand": onnx_case("LRN", {"x": f32(1, 3, 2, 2)}, attrs={"size": 3}),
    "swish_expand": text_case(_swish_text, {"x": _X23}, make_model(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        {"x": _X23}, ["y"])),
    # ---- canonicalization
    "cast_same_type": onnx_case("Cast", {"x": f32(2, 3)}, attrs={"to": TensorProto.FLOAT}),
    "add_zero": onnx_case("Add", {"x": f32(2, 3)}, consts={"z": np.zeros(3, np.float32)}),
    "sub_zero": onnx_case("Sub", {"x": f32(2, 3)}, consts={"z": np.zeros(1, np.float32)}),
    "mul_one": onnx_case("Mul", {"x": f32(2, 3)}, consts={"o": np.ones((2, 3), np.float32)}),
    "div_one": onnx_case("Div", {"x": f32(2, 3)}, consts={"o": np.ones(3, np.float32)}),
    "relu_relu": _onnx_chain([("Relu", [], None), ("Relu", [], None)], f32(2, 3)),
    "max_same": text_case(_max_same_text, {"x": _X23}, make_model(
        [helper.make_node("Max", ["x", "x"], ["y"])], {"x": _X23}, ["y"])),
    "clip_unbounded": onnx_case("Clip", {"x": f32(2, 3)}),
    "max_zero_to_relu": binary_text("Max", (2, 3), np.float32(0), _X23),
    "min_max_to_clip": text_case(
        _max_min_text.replace("LO", "-1.0").replace("HI", "0.5").replace("INNER", "Max(%lo, %x)"),
        {"x": _X23}, make_model([helper.make_node("Max", ["lo", "x"], ["m"]),
                                 helper.make_node("Min", ["m", "hi"], ["y"])], {"x": _X23}, ["y"],
                                {"lo": np.float32(-1), "hi": np.float32(0.5)})),
    "min_relu_to_clip": text_case(
        _max_min_text.replace("LO", "0.0").replace("HI", "1.5").replace("INNER", "Relu(%x)"),
        {"x": _X23}, make_model([helper.make_node("Relu", ["x"], ["m"]),
                                 helper.make_node("Min", ["m", "hi"], ["y"])], {"x": _X23}, ["y"],
                                {"hi": np.float32(1.5)})),
    "swish_fuse": graph_case([("Sigmoid", ["x"], ["s"], None), ("Mul", ["s", "x"], ["y"], None)],
                             {"x": f32(2, 3)}),
    "sub_const_to_add": onnx_case("Sub", {"x": f32(2, 3)}, consts={"c": f32(3)}),
    "div_const_to_mul": onnx_case("Div", {"x": f32(2, 3)}, consts={"c": pos(3)}),
    "add_const_reassociate": _onnx_chain([("Add", ["a"], None), ("Add", ["b"], None)], f32(2, 3),
                                         {"a": f32(3), "b": f32(2, 1)}),
    "mul_const_reassociate": _onnx_chain([("Mul", ["a"], None), ("Mul", ["b"], None)], f32(2, 3),
                                         {"a": f32(3), "b": f32(2, 1)}),
    "mul_add_distribute": _onnx_chain([("Add", ["a"], None), ("Mul", ["b"], None)], f32(2, 3),
                                      {"a": f32(3), "b": f32(2, 1)}),
    "conv_bias_zero": _onnx_chain([("Conv", ["w"], {"pads": [1, 1, 1, 1]})], f32(1, 2, 4, 4),
                                  {"w": f32(3, 2, 3, 3)}),
    "conv_batchnorm_fold": _onnx_chain(
        [("Conv", ["w", "b"], {"strides": [2, 2]}), ("BatchNormalization", ["s", "bb", "m", "v"], None)],
        f32(1, 2, 5, 5), {"w": f32(3, 2, 3, 3), "b": f32(3), "s": pos(3), "bb": f32(3), "m": f32(3), "v": pos(3)}),
    "conv_mul_fold": _onnx_chain([("Conv", ["w", "b"], None), ("Mul", ["s"], None)], f32(1, 2, 4, 4),
                                 {"w": f32(3, 2, 3, 3), "b": f32(3), "s": f32(1, 3, 1, 1)}),
    "conv_add_fold": _onnx_chain([("Conv", ["w", "b"], None), ("Add", ["t"], None)], f32(1, 2, 4, 4),
                                 {"w": f32(3, 2, 3, 3), "b": f32(3), "t": f32(3, 1, 1)}),
    "matmul_mul_fold": _onnx_chain([("MatMul", ["w"], None), ("Mul", ["s"], None)], f32(2, 3),
                                   {"w": f32(3, 4), "s": f32(4)}),
    "conv_pad_merge": _onnx_chain([("Pad", ["pads"], None), ("Conv", ["w", "b"], {"pads": [1, 0, 0, 1]})],
                                  f32(1, 2, 4, 4), {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
                                                    "w": f32(3, 2, 3, 3), "b": f32(3)}),
    "avgpool_pad_merge": _onnx_chain([("Pad", ["pads"], None),
                                      ("AveragePool", [], {"kernel_shape": [3, 3], "strides": [2, 2]})],
                                     f32(1, 2, 5, 5), {"pads": np.array([0, 0, 1, 1, 0, 0, 2, 1], np.int64)}),
    "maxpool_pad_merge": _onnx_chain([("Relu", [], None), ("Pad", ["pads"], None),
                                      ("MaxPool", [], {"kernel_shape": [3, 3], "strides": [2, 2]})],
                                     f32(1, 2, 5, 5), {"pads": np.array([0, 0, 1, 1, 0, 0, 2, 1], np.int64)}),
    "transpose_identity": onnx_case("Transpose", {"x": f32(2, 3)}, attrs={"perm": [0, 1]}),
    "transpose_transpose": _onnx_chain([("Transpose", [], {"perm": [1, 2, 0]}), ("Transpose", [], {"perm": [0, 2, 1]})],
                                       f32(2, 3, 4)),
    "transpose_to_reshape": onnx_case("Transpose", {"x": f32(2, 1, 3)}, attrs={"perm": [1, 0, 2]}),
    "reshape_noop": onnx_case("Reshape", {"x": f32(2, 3)}, consts={"s": np.array([2, 3], np.int64)}),
    "reshape_reshape": _onnx_chain([("Reshape", ["s1"], None), ("Reshape", ["s2"], None)], f32(2, 3),
                                   {"s1": np.array([6], np.int64), "s2": np.array([3, 2], np.int64)}),
    "concat_single": onnx_case("Concat", {"x": f32(2, 3)}, attrs={"axis": 1}),
    "concat_flatten": graph_case([("Concat", ["a", "b"], ["ab"], {"axis": 1}),
                                  ("Concat", ["c", "ab"], ["y"], {"axis": -1})],
                                 {"a": f32(2, 1), "b": f32(2, 2), "c": f32(2, 3)}),
    "unary_transpose_sink.relu": _onnx_chain([("Transpose", [], {"perm": [1, 0]}), ("Relu", [], None)], f32(2, 3)),
    "unary_transpose_sink.sigmoid": _onnx_chain([("Transpose", [], {"perm": [1, 0]}), ("Sigmoid", [], None)], f32(2, 3)),
    "unary_transpose_sink.tanh": _onnx_chain([("Transpose", [], {"perm": [1, 0]}), ("Tanh", [], None)], f32(2, 3)),
    "add_transpose_sink": graph_case([("Transpose", ["a"], ["ta"], {"perm": [2, 0, 1]}),
                                      ("Transpose", ["b"], ["tb"], {"perm": [2, 0, 1]}),
                                      ("Add", ["ta", "tb"], ["y"], None)],
                                     {"a": f32(2, 3, 4), "b": f32(1, 3, 1)}),
    "mul_transpose_sink": graph_case([("Transpose", ["a"], ["ta"], {"perm": [1, 0]}),
                                      ("Transpose", ["b"], ["tb"], {"perm": [1, 0]}),
                                      ("Mul", ["ta", "tb"], ["y"], None)],
                                     {"a": f32(2, 3), "b": f32(2, 3)}),
    "add_const_transpose_sink": _onnx_chain([("Transpose", [], {"perm": [2, 0, 1]}), ("Add", ["c"], None)],
                                            f32(2, 3, 4), {"c": f32(3)}),
    "mul_const_transpose_sink": _onnx_chain([("Transpose", [], {"perm": [2, 0, 1]}), ("Mul", ["c"], None)],
                                            f32(2, 3, 4), {"c": f32(2, 1)}),
    # ---- conformance (issue 6)
    "prelu_to_select": onnx_case("PRelu", {"x": f32(2, 3)}, consts={"slope": f32(3)}),
    "castlike_to_cast": onnx_case("CastLike", {"x": f32(2, 3)}, consts={"like": np.zeros(1, np.float64)}),
    "tile_to_expand": onnx_case("Tile", {"x": f32(2, 3)}, consts={"r": np.array([2, 1], np.int64)}),
    "depth_to_space_dcr": onnx_case("DepthToSpace", {"x": f32(1, 8, 2, 2)}, attrs={"blocksize": 2}),
    "depth_to_space_crd": onnx_case("DepthToSpace", {"x": f32(1, 8, 2, 2)},
                                    attrs={"blocksize": 2, "mode": "CRD"}),
    "space_to_depth_dcr": onnx_case("SpaceToDepth", {"x": f32(1, 2, 4, 4)}, attrs={"blocksize": 2}),
    "space_to_depth_crd": _with_reference(onnx_case("SpaceToDepth", {"x": f32(1, 2, 4, 4)},
                                                    attrs={"blocksize": 2, "mode": "CRD"}, opset=28)),
    "instancenorm_expand": onnx_case("InstanceNormalization", {"x": f32(2, 3, 4)},
                                     consts={"s": pos(3), "b": f32(3)}),
    "lpnorm_l2": onnx_case("LpNormalization", {"x": pos(2, 3)}),
    "lpnorm_l1": onnx_case("LpNormalization", {"x": pos(2, 3)}, attrs={"p": 1, "axis": 0}),
    "convn_1d": onnx_case("Conv", {"x": f32(1, 2, 6)}, consts={"w": f32(3, 2, 3), "b": f32(3)},
                          attrs={"strides": [2], "pads": [1, 0]}),
    "convn_1d.no_bias": onnx_case("Conv", {"x": f32(1, 2, 6)}, consts={"w": f32(3, 2, 3)},
                                  attrs={"dilations": [2]}),
    "maxpooln_1d": onnx_case("MaxPool", {"x": f32(1, 2, 7)}, attrs={"kernel_shape": [3], "strides": [2]}),
    "avgpooln_1d": onnx_case("AveragePool", {"x": f32(1, 2, 7)}, attrs={"kernel_shape": [3], "pads": [1, 1]}),
    # ---- legacy broadcasting
    "legacy_broadcast_expand": onnx_case("Add", {"a": f32(2, 3, 4), "b": f32(3)},
                                         attrs={"broadcast": 1, "axis": 1}, opset=6)
    | {"oracle": lambda f: {"y": f["a"] + f["b"][:, None]}},
    # ---- pooling as window sums
    "avgpool_dilated_to_conv": onnx_case("AveragePool", {"x": f32(1, 1, 5, 4)},
                                         attrs={"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [1, 0, 0, 1]},
                                         opset=19),
    "lppool_to_conv": onnx_case("LpPool", {"x": f32(1, 2, 4)}, attrs={"kernel_shape": [2], "p": 3}, opset=18),
    "col2im_to_convtranspose": onnx_case("Col2Im", {"x": f32(1, 4, 4)},
                                         consts={"image": np.array([3, 3], np.int64),
                                                 "block": np.array([2, 2], np.int64)}, opset=18),
    # ---- grid sampling
    "gridsample_expand": _with_reference(onnx_case(
        "GridSample", {"x": f32(1, 2, 3, 4), "grid": f32(1, 2, 3, 2)},
        attrs={"mode": "linear", "padding_mode": "zeros"}, opset=20)),
    "reflect_expand": text_case(_reflect_text, {"x": _REFLECT_X}, lambda f: {"y": _REFLECT_Y}),
    # ---- spatial resampling
    "resize_identity": _resize_case({"x": f32(2, 3)}, {"scales": np.array([1, 1], np.float32)}),
    "resize_one_axis_at_a_time": _resize_case({"x": f32(1, 1, 2, 2)},
                                              {"scales": np.array([1, 1, 2, 1.5], np.float32)}),
    "resize_nearest_gather": _resize_case({"x": f32(2, 3)}, {"sizes": np.array([2, 5], np.int64)},
                                          nearest_mode="floor"),
    "resize_axis_taps": _resize_case({"x": f32(4, 2)}, {"roi": np.array([-0.2, 1.1], np.float32),
                                                        "sizes": np.array([3], np.int64)},
                                     mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                                     extrapolation_value=5.0, axes=[0]),
    # Recurrent layers unroll over two steps (hidden size 1 keeps the golden text short).
    "lstm_unroll": onnx_case("LSTM", {"x": f32(2, 1, 2)}, consts={"w": f32(1, 4, 2), "r": f32(1, 4, 1),
                                                                   "b": f32(1, 8)},
                             attrs={"hidden_size": 1}, outputs=("y", "y_h", "y_c")),
    "gru_unroll": onnx_case("GRU", {"x": f32(2, 1, 2)}, consts={"w": f32(1, 3, 2), "r": f32(1, 3, 1)},
                            attrs={"hidden_size": 1, "linear_before_reset": 1}, outputs=("y", "y_h")),
    "rnn_unroll": onnx_case("RNN", {"x": f32(2, 1, 2)}, consts={"w": f32(1, 1, 2), "r": f32(1, 1, 1)},
                            attrs={"hidden_size": 1, "direction": "reverse"}, outputs=("y", "y_h")),
    # ---- quantization
    "quant_param_to_reshape": text_case(_quant_param_axis_text, {"p": _QP_AXIS},
                                        lambda f: {"y": f["p"].reshape(3, 1)}),
    "quant_param_blocked_to_gather": text_case(_quant_param_blocked_text, {"p": _QP_BLOCKED},
                                               lambda f: {"y": np.repeat(f["p"], 2, axis=1)[:, :5]}),
    "quantize_linear_expand": onnx_case("QuantizeLinear", {"x": f32(2, 3, 4) * 100, "s": pos(3)},
                                        consts={"z": np.array([-3, 0, 7], np.int8)}, opset=13),
    "quantize_linear_expand.no_zero_point": onnx_case("QuantizeLinear", {"x": f32(2, 3) * 300, "s": pos()}, opset=13),
    "dequantize_linear_expand": onnx_case("DequantizeLinear", {"x": _u8(2, 3), "s": pos()},
                                          consts={"z": np.uint8(128)}, opset=13),
    "dequantize_linear_expand.no_zero_point": onnx_case("DequantizeLinear", {"x": _u8(2, 3), "s": pos(3)},
                                                 attrs={"axis": 1}, opset=13),
    "qlinear_matmul_expand": graph_case(
        [("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], None)],
        {"a": _u8(2, 3), "b": _u8(3, 4)},
        {"as": np.float32(0.02), "az": np.uint8(120), "bs": np.float32(0.03), "bz": np.uint8(130),
         "ys": np.float32(0.4), "yz": np.uint8(20)}),
    "matmul_integer_expand": onnx_case("MatMulInteger", {"a": _u8(2, 3), "b": _u8(3, 4)},
                                       consts={"az": np.uint8(3), "bz": np.uint8(250)}),
    "matmul_integer_expand.a_zero_point": onnx_case("MatMulInteger", {"a": _u8(2, 3), "b": _u8(3, 4)},
                                             consts={"az": np.uint8(100)}),
    "matmul_integer_expand.no_zero_point": onnx_case("MatMulInteger", {"a": _u8(2, 3), "b": _u8(3, 4)}),
    "conv_integer_expand": onnx_case("ConvInteger", {"x": _u8(1, 2, 4, 4)},
                                     consts={"w": _u8(3, 2, 2, 2), "xz": np.uint8(9), "wz": np.uint8(100)}),
    "conv_integer_expand.x_zero_point": onnx_case("ConvInteger", {"x": _u8(1, 2, 4, 4)},
                                           consts={"w": _u8(3, 2, 2, 2), "xz": np.uint8(9)},
                                           attrs={"pads": [1, 1, 0, 0]}),
    "conv_integer_expand.no_zero_point": onnx_case("ConvInteger", {"x": _u8(1, 2, 5)}, consts={"w": _u8(3, 2, 2)}),
    "qlinear_conv_expand": graph_case(
        [("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], None)],
        {"x": _u8(1, 2, 4, 4)},
        {"xs": np.float32(0.05), "xz": np.uint8(128), "w": _u8(3, 2, 2, 2), "ws": np.float32(0.01),
         "wz": np.uint8(127), "ys": np.float32(0.3), "yz": np.uint8(100),
         "b": np.array([-300, 0, 200], np.int32)}),
    "qlinear_conv_expand.no_bias": graph_case(
        [("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], None)],
        {"x": _u8(1, 2, 4, 4)},
        {"xs": np.float32(0.05), "xz": np.uint8(128), "w": _u8(3, 2, 2, 2),
         "ws": np.array([0.01, 0.02, 0.005], np.float32), "wz": np.uint8(127), "ys": np.float32(0.3),
         "yz": np.uint8(100)}),
    # ---- signal processing and Compress
    "dft_to_matmul": _with_reference(onnx_case("DFT", {"x": _qrng.uniform(-1, 1, (2, 4, 3, 1)).astype(np.float32)},
                                               attrs={"axis": 1}, opset=17)),
    "compress_to_gather": onnx_case("Compress", {"x": _qrng.uniform(-1, 1, (3, 2)).astype(np.float32)},
                                    consts={"c": np.array([True, False, True])}, attrs={"axis": 0}),
    "compress_flat_to_gather": onnx_case("Compress", {"x": _qrng.uniform(-1, 1, (3, 2)).astype(np.float32)},
                                         consts={"c": np.array([False, True, True, False, False, True])}),
    "stft_expand": _with_reference(onnx_case(
        "STFT", {"s": _qrng.uniform(-1, 1, (1, 10, 1)).astype(np.float32)},
        consts={"step": np.array(3, np.int64), "w": np.hanning(4).astype(np.float32)},
        attrs={"onesided": 1}, opset=17)),
    "stft_expand.no_window": _with_reference(graph_case(
        [("STFT", ["s", "step", "", "n"], ["y"], {"onesided": 0})], {"s": _qrng.uniform(-1, 1, (1, 10, 1)).astype(np.float32)},
        {"step": np.array(2, np.int64), "n": np.array(4, np.int64)}, opset=17)),
    # (appended: the module's random draws above stay as their golden files recorded them)
    "convtranspose_bias_zero": _onnx_chain([("ConvTranspose", ["w"], {"strides": [2, 2]})], f32(1, 2, 3, 3),
                                           {"w": f32(2, 3, 3, 3)}),
    "convtranspose_batchnorm_fold": _onnx_chain(
        [("ConvTranspose", ["w", "b"], {"strides": [2, 2]}), ("BatchNormalization", ["s", "bb", "m", "v"], None)],
        f32(1, 2, 3, 3), {"w": f32(2, 3, 2, 2), "b": f32(3), "s": pos(3), "bb": f32(3), "m": f32(3), "v": pos(3)}),
    "convtranspose_mul_fold": _onnx_chain([("ConvTranspose", ["w", "b"], None), ("Mul", ["s"], None)],
                                          f32(1, 2, 3, 3), {"w": f32(2, 3, 3, 3), "b": f32(3), "s": f32(1, 3, 1, 1)}),
    "convtranspose_add_fold": _onnx_chain([("ConvTranspose", ["w", "b"], None), ("Add", ["t"], None)],
                                          f32(1, 2, 3, 3), {"w": f32(2, 3, 3, 3), "b": f32(3), "t": f32(3, 1, 1)}),
    # (a kernel two taps wide stays a ConvTranspose, computed with the shuffle in its store)
    "convtranspose_nonoverlapping_to_conv": _onnx_chain(
        [("ConvTranspose", ["w", "b"], {"strides": [4, 1]})], f32(1, 2, 3, 3), {"w": f32(2, 3, 4, 1), "b": f32(3)}),
    "convtranspose_phases_to_convs": _onnx_chain(
        [("ConvTranspose", ["w", "b"], {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]})],
        f32(1, 2, 3, 4), {"w": f32(2, 3, 3, 2), "b": f32(3)}),
    # The family rule rebuilds whichever op it matched, with its attributes.
    "unary_transpose_sink.leaky_relu": _onnx_chain(
        [("Transpose", [], {"perm": [1, 0]}), ("LeakyRelu", [], {"alpha": 0.3})], f32(2, 3)),
    "unary_transpose_sink.is_nan": _onnx_chain([("Transpose", [], {"perm": [1, 0]}), ("IsNaN", [], None)], f32(2, 3)),
    # An elementwise op sinks below a reshape, and so reaches what is behind it.
    "unary_reshape_sink.relu": _onnx_chain([("Reshape", ["s"], None), ("Relu", [], None)], f32(2, 6),
                                           {"s": np.array([3, 4], np.int64)}),
    "unary_reshape_sink.exp": _onnx_chain([("Transpose", [], {"perm": [1, 0]}), ("Reshape", ["s"], None),
                                           ("Exp", [], None)], f32(2, 6), {"s": np.array([4, 3], np.int64)}),
    # Profiling's histogram (not an ONNX op): values below, inside and above [-1, 1].
    "histogram_to_scatter": text_case("""graph g {
  input %x: f32[2, 5]
  const %lo: f32[] = dense<[-1.0]>
  const %hi: f32[] = dense<[1.0]>
  %y = Histogram(%x, %lo, %hi) {bins = 4} : f32[4]
  output "y" = %y
}""", {"x": np.array([[-3, -1, -0.6, -0.4, 0], [0.2, 0.5, 0.99, 1, 7]], np.float32)},
        lambda f: {"y": np.histogram(np.clip(f["x"], -1, np.nextafter(np.float32(1), 0)),
                                     bins=4, range=(-1, 1))[0].astype(np.float32)}),
    "resize_axis_two_taps": _resize_case({"x": f32(1, 2, 3)}, {"scales": np.array([2], np.float32)},
                                         mode="linear", axes=[2]),
    "resize_axis_two_taps.extrapolates": _resize_case({"x": f32(4, 2)}, {"roi": np.array([-0.2, 1.1], np.float32),
                                                                         "sizes": np.array([3], np.int64)},
                                                      mode="linear", extrapolation_value=5.0, axes=[0],
                                                      coordinate_transformation_mode="tf_crop_and_resize"),
    # Half precision divides by the row sum (no rounded reciprocal).
    "softmax_expand.f16": _with_reference(onnx_case("Softmax", {"x": f32(2, 3).astype(np.float16)})),
}

# ------------------------------------------------------------------ quantization cases
# Values of their own generator, so that the cases above keep their random values.
_qrng = np.random.default_rng(4321)


def _q8(x, scale, offset):
    return np.clip(np.rint(np.asarray(x, np.float32) / np.float32(scale)) + offset, -128, 127).astype(np.int8)


def _dq(q, scale, offset):
    return ((q.astype(np.float32) - np.float32(offset)) * np.float32(scale)).astype(np.float32)


def _rescale(q, in_scale, in_offset, scale, offset):
    ratio = np.float32(in_scale) / np.float32(scale)
    return np.clip(np.rint((q.astype(np.float32) - np.float32(in_offset)) * ratio) + offset,
                   -128, 127).astype(np.int8)


def _i8(*shape):
    return _qrng.integers(-128, 128, size=shape).astype(np.int8)


def _dense(a):
    return "dense<[" + ", ".join(str(v) for v in np.asarray(a).reshape(-1)) + "]>"


def _calibrated(case, ranges, atol, dtype="i8"):
    """A float case whose values `ranges` names are calibrated to those ranges in `dtype` (as a
    profile would give them); the quantized result is within `atol` of the float one."""
    return dict(case, calibrate=ranges, calibrate_dtype=dtype, rtol=0.0, atol=atol)


# An integer product of x [2, 3] (scale 0.02, offset 5) and per-column weights, requantized.
_QX, _QW, _QWS, _QB = _i8(2, 3), _i8(3, 4), np.float32([0.01, 0.02, 0.015, 0.03]), np.int32([100, -50, 0, 7])


def _qmatmul_float(x, in_scale=0.02, in_offset=5):
    acc = _dq(x, in_scale, in_offset) @ (_QW.astype(np.float32) * _QWS)
    return acc + _QB.astype(np.float32) * (_QWS * np.float32(in_scale))


_QMATMUL = f"""  input %x: i8[2, 3] q(0.02, 5)
  const %w: i8[3, 4] = {_dense(_QW)}
  const %ws: f32[4] = {_dense(_QWS)}
  const %b: i32[4] = {_dense(_QB)}
  %q = QuantizedMatMul(%x, %w, %ws, %b) {{scale = 0.05, offset = -3}} : i8[2, 4] q(0.05, -3)
"""

# A 1x1 integer convolution of x [1, 3, 2, 2] with 2 filters: a product per pixel.
_QCX, _QCW = _i8(1, 3, 2, 2), _i8(2, 3, 1, 1)
_QCWS, _QCB = np.float32([0.01, 0.02]), np.int32([30, -40])


def _qconv_float(x, in_scale=0.02, in_offset=-4):
    w = _QCW.reshape(2, 3).astype(np.float32) * _QCWS[:, None]
    acc = np.einsum("mc,nchw->nmhw", w, _dq(x, in_scale, in_offset))
    return acc + (_QCB.astype(np.float32) * _QCWS * np.float32(in_scale))[None, :, None, None]


_QCONV = f"""  input %x: i8[1, 3, 2, 2] q(0.02, -4)
  const %w: i8[2, 3, 1, 1] = {_dense(_QCW)}
  const %ws: f32[2] = {_dense(_QCWS)}
  const %b: i32[2] = {_dense(_QCB)}
  %q = QuantizedConv(%x, %w, %ws, %b) {{scale = 0.05, offset = 2}} : i8[1, 2, 2, 2] q(0.05, 2)
"""


# A residual of the product's shape (its own generator: the cases after it keep their draws).
_QCR = np.random.default_rng(77).integers(-128, 128, size=(1, 2, 2, 2)).astype(np.int8)


def _qtext(body, outputs="y"):
    return "graph q {\n" + body + f'  output "{outputs}" = %y\n' + "}"


_QI = _i8(1, 2, 4, 4)
_QUANTIZATION_CASES = {
    "quantize_conv": _calibrated(graph_case(
        [("Conv", ["x", "w", "b"], ["y"], {"pads": [1, 1, 1, 1]})],
        {"x": _qrng.uniform(-2, 2, (1, 2, 5, 5)).astype(np.float32)},
        {"w": _qrng.uniform(-0.5, 0.5, (3, 2, 3, 3)).astype(np.float32),
         "b": _qrng.uniform(-1, 1, 3).astype(np.float32)}), {"x": (-2.0, 2.0), "y": (-8.0, 8.0)}, 0.25),
    "quantize_matmul": _calibrated(graph_case(
        [("MatMul", ["x", "w"], ["y"], None)], {"x": _qrng.uniform(-2, 2, (2, 3)).astype(np.float32)},
        {"w": _qrng.uniform(-1, 1, (3, 4)).astype(np.float32)}), {"x": (-2.0, 2.0), "y": (-6.0, 6.0)}, 0.1),
    # Precision int16: i16 activations and weights, an i64 bias; steps 256 times finer.
    "quantize_conv.int16": _calibrated(graph_case(
        [("Conv", ["x", "w", "b"], ["y"], {"pads": [1, 1, 1, 1]})],
        {"x": _qrng.uniform(-2, 2, (1, 2, 5, 5)).astype(np.float32)},
        {"w": _qrng.uniform(-0.5, 0.5, (3, 2, 3, 3)).astype(np.float32),
         "b": _qrng.uniform(-1, 1, 3).astype(np.float32)}), {"x": (-2.0, 2.0), "y": (-8.0, 8.0)}, 0.002, "i16"),
    "quantize_matmul.int16": _calibrated(graph_case(
        [("MatMul", ["x", "w"], ["y"], None)], {"x": _qrng.uniform(-2, 2, (2, 3)).astype(np.float32)},
        {"w": _qrng.uniform(-1, 1, (3, 4)).astype(np.float32)}), {"x": (-2.0, 2.0), "y": (-6.0, 6.0)}, 0.001, "i16"),
    "bias_into_quantized_matmul": dict(text_case(_qtext(
        _QMATMUL + "  %d = Dequantize(%q) {in_scale = 0.05, in_offset = -3} : f32[2, 4]\n"
        "  const %c: f32[4] = dense<[0.5, -0.25, 1.0, 0.0]>\n  %y = Add(%d, %c) : f32[2, 4]\n"),
        {"x": _QX}, lambda f: {"y": _qmatmul_float(f["x"]) + np.float32([0.5, -0.25, 1.0, 0.0])}),
        calibrate={"y": (-16.0, 16.0)}, rtol=0.0, atol=0.25),
    "quantize_dequantize_same": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %y = Quantize(%d) {scale = 0.02, offset = 5} : i8[2, 3] q(0.02, 5)\n"), {"x": _QX}, lambda f: {"y": f["x"]}),
    "quantize_dequantize_to_rescale": dict(text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %y = Quantize(%d) {scale = 0.03, offset = -7} : i8[2, 3] q(0.03, -7)\n"),
        {"x": _QX}, lambda f: {"y": _q8(_dq(f["x"], 0.02, 5), 0.03, -7)}), rtol=0.0, atol=1),
    "rescale_same": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        "  %y = Rescale(%x) {in_scale = 0.02, in_offset = 5, scale = 0.02, offset = 5} : i8[2, 3] q(0.02, 5)\n"),
        {"x": _QX}, lambda f: {"y": f["x"]}),
    "rescale_into_quantized_conv": dict(text_case(_qtext(
        _QCONV + "  %y = Rescale(%q) {in_scale = 0.05, in_offset = 2, scale = 0.08, offset = -10} : "
        "i8[1, 2, 2, 2] q(0.08, -10)\n"), {"x": _QCX},
        lambda f: {"y": _rescale(_q8(_qconv_float(f["x"]), 0.05, 2), 0.05, 2, 0.08, -10)}),
        rtol=0.0, atol=1),
    "rescale_into_quantized_matmul": dict(text_case(_qtext(
        _QMATMUL + "  %y = Rescale(%q) {in_scale = 0.05, in_offset = -3, scale = 0.08, offset = 1} : "
        "i8[2, 4] q(0.08, 1)\n"), {"x": _QX},
        lambda f: {"y": _rescale(_q8(_qmatmul_float(f["x"]), 0.05, -3), 0.05, -3, 0.08, 1)}),
        rtol=0.0, atol=1),
    # A ReLU of the product (relu_of_dequantized's max with the zero point) and a bound below
    # its range's top: the product's saturation bounds, applied in its store.
    "max_into_quantized_conv": dict(text_case(_qtext(
        _QCONV + "  const %k: i8[] = dense<[5]>\n  %y = Max(%q, %k) : i8[1, 2, 2, 2] q(0.05, 2)\n"), {"x": _QCX},
        lambda f: {"y": np.maximum(_q8(_qconv_float(f["x"]), 0.05, 2), np.int8(5))}), rtol=0.0, atol=1),
    "min_into_quantized_conv": dict(text_case(_qtext(
        _QCONV + "  const %k: i8[] = dense<[-6]>\n  %y = Min(%q, %k) : i8[1, 2, 2, 2] q(0.05, 2)\n"), {"x": _QCX},
        lambda f: {"y": np.minimum(_q8(_qconv_float(f["x"]), 0.05, 2), np.int8(-6))}), rtol=0.0, atol=1),
    "max_into_quantized_matmul": dict(text_case(_qtext(
        _QMATMUL + "  const %k: i8[] = dense<[-3]>\n  %y = Max(%q, %k) : i8[2, 4] q(0.05, -3)\n"), {"x": _QX},
        lambda f: {"y": np.maximum(_q8(_qmatmul_float(f["x"]), 0.05, -3), np.int8(-3))}), rtol=0.0, atol=1),
    "min_into_quantized_matmul": dict(text_case(_qtext(
        _QMATMUL + "  const %k: i8[] = dense<[20]>\n  %y = Min(%q, %k) : i8[2, 4] q(0.05, -3)\n"), {"x": _QX},
        lambda f: {"y": np.minimum(_q8(_qmatmul_float(f["x"]), 0.05, -3), np.int8(20))}), rtol=0.0, atol=1),
    # A ReLU of the product, calibrated to its own range [0, 3]: the product requantized to
    # it, the zero point its lower bound (within a step of the float ReLU of the product).
    "relu_of_quantized_conv": dict(text_case(_qtext(
        _QCONV + "  %d = Dequantize(%q) {in_scale = 0.05, in_offset = 2} : f32[1, 2, 2, 2]\n"
        "  %y = Relu(%d) : f32[1, 2, 2, 2]\n"), {"x": _QCX},
        lambda f: {"y": np.clip(_qconv_float(f["x"]), 0, 3)}), calibrate={"y": (0.0, 3.0)}, rtol=0.0, atol=3.0 / 255),
    # A residual sum after the pointwise product joins it: the residual's value enters the
    # product's requantization, to the sum's calibrated range, before its one rounding.
    "quantize_conv_residual": dict(text_case(_qtext(
        "  input %r: i8[1, 2, 2, 2] q(0.03, 1)\n" + _QCONV
        + "  %d = Dequantize(%q) {in_scale = 0.05, in_offset = 2} : f32[1, 2, 2, 2]\n"
        "  %e = Dequantize(%r) {in_scale = 0.03, in_offset = 1} : f32[1, 2, 2, 2]\n"
        "  %y = Add(%d, %e) : f32[1, 2, 2, 2]\n"), {"x": _QCX, "r": _QCR},
        lambda f: {"y": np.clip(_qconv_float(f["x"]) + _dq(f["r"], 0.03, 1), -4, 4)}),
        calibrate={"y": (-4.0, 4.0)}, rtol=0.0, atol=8.0 / 255),
    # ... and a ReLU after that sum joins the product with its residual.
    "relu_of_quantized_conv.residual": dict(text_case(_qtext(
        "  input %r: i8[1, 2, 2, 2] q(0.03, 1)\n" + _QCONV.replace(
            "%q = QuantizedConv(%x, %w, %ws, %b) {scale = 0.05, offset = 2}",
            "%q = QuantizedConv(%x, %w, %ws, %b, %r) {scale = 0.05, offset = 2, r_scale = 0.03, r_offset = 1}")
        + "  %d = Dequantize(%q) {in_scale = 0.05, in_offset = 2} : f32[1, 2, 2, 2]\n"
        "  %y = Relu(%d) : f32[1, 2, 2, 2]\n"), {"x": _QCX, "r": _QCR},
        lambda f: {"y": np.clip(_qconv_float(f["x"]) + _dq(f["r"], 0.03, 1), 0, 3)}),
        calibrate={"y": (0.0, 3.0)}, rtol=0.0, atol=3.0 / 255),
    "relu_of_quantized_matmul": dict(text_case(_qtext(
        _QMATMUL + "  %d = Dequantize(%q) {in_scale = 0.05, in_offset = -3} : f32[2, 4]\n"
        "  %y = Relu(%d) : f32[2, 4]\n"), {"x": _QX},
        lambda f: {"y": np.clip(_qmatmul_float(f["x"]), 0, 3)}), calibrate={"y": (0.0, 3.0)}, rtol=0.0, atol=3.0 / 255),
    "relu_of_dequantized": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n  %y = Relu(%d) : f32[2, 3]\n"),
        {"x": _QX}, lambda f: {"y": np.maximum(_dq(f["x"], 0.02, 5), 0)}),
    "maxpool_of_dequantized": text_case(_qtext(
        "  input %x: i8[1, 2, 4, 4] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[1, 2, 4, 4]\n"
        "  %y = MaxPool(%d) {kernel = [2, 2], strides = [2, 2]} : f32[1, 2, 2, 2]\n"),
        {"x": _QI}, lambda f: {"y": _dq(f["x"], 0.02, 5).reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5))}),
    "flatten_of_dequantized": text_case(_qtext(
        "  input %x: i8[1, 2, 4, 4] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[1, 2, 4, 4]\n"
        "  %y = Flatten(%d) {axis = 1} : f32[1, 32]\n"), {"x": _QI}, lambda f: {"y": _dq(f["x"], 0.02, 5).reshape(1, 32)}),
    "reshape_of_dequantized": text_case(_qtext(
        "  input %x: i8[1, 2, 4, 4] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[1, 2, 4, 4]\n"
        "  %y = Reshape(%d) {dims = [2, 16]} : f32[2, 16]\n"), {"x": _QI}, lambda f: {"y": _dq(f["x"], 0.02, 5).reshape(2, 16)}),
    "transpose_of_dequantized": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %y = Transpose(%d) {perm = [1, 0]} : f32[3, 2]\n"), {"x": _QX}, lambda f: {"y": _dq(f["x"], 0.02, 5).T}),
    "slice_of_dequantized": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %y = Slice(%d) {starts = [0, 1], stops = [2, 3], steps = [1, 1]} : f32[2, 2]\n"),
        {"x": _QX}, lambda f: {"y": _dq(f["x"], 0.02, 5)[:, 1:3]}),
    "gather_of_dequantized": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n  const %i: i64[4] = dense<[2, 0, -1, 1]>\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %y = Gather(%d, %i) {axis = 1} : f32[2, 4]\n"),
        {"x": _QX}, lambda f: {"y": _dq(f["x"], 0.02, 5)[:, [2, 0, -1, 1]]}),
    "rescale_through_max": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n  const %k: i8[] = dense<[5]>\n"
        "  %m = Max(%x, %k) : i8[2, 3] q(0.02, 5)\n"
        "  %y = Rescale(%m) {in_scale = 0.02, in_offset = 5, scale = 0.01, offset = -128} : i8[2, 3] q(0.01, -128)\n"),
        {"x": _QX}, lambda f: {"y": _rescale(np.maximum(f["x"], 5), 0.02, 5, 0.01, -128)}),
    "rescale_through_maxpool": text_case(_qtext(
        "  input %x: i8[1, 2, 4, 4] q(0.02, 5)\n"
        "  %p = MaxPool(%x) {kernel = [2, 2], strides = [2, 2]} : i8[1, 2, 2, 2] q(0.02, 5)\n"
        "  %y = Rescale(%p) {in_scale = 0.02, in_offset = 5, scale = 0.03, offset = 0} : i8[1, 2, 2, 2] q(0.03, 0)\n"),
        {"x": _QI}, lambda f: {"y": _rescale(f["x"].reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5)), 0.02, 5, 0.03, 0)}),
    "max_with_floor_remove": text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, -128)\n  const %k: i8[] = dense<[-128]>\n"
        "  %y = Max(%x, %k) : i8[2, 3] q(0.02, -128)\n"), {"x": _QX}, lambda f: {"y": f["x"]}),
    "quantized_conv_in_float": dict(text_case(_qtext(_QCONV + "  %y = Dequantize(%q) {in_scale = 0.05, in_offset = 2} : f32[1, 2, 2, 2]\n"),
        {"x": _QCX}, lambda f: {"y": _dq(_q8(_qconv_float(f["x"]), 0.05, 2), 0.05, 2)}), rtol=0.0, atol=0.051),
    # With a residual: its dequantized value added to the float product before the Quantize.
    "quantized_conv_in_float.residual": dict(text_case(_qtext(
        "  input %r: i8[1, 2, 2, 2] q(0.03, 1)\n" + _QCONV.replace(
            "%q = QuantizedConv(%x, %w, %ws, %b) {scale = 0.05, offset = 2}",
            "%q = QuantizedConv(%x, %w, %ws, %b, %r) {scale = 0.05, offset = 2, r_scale = 0.03, r_offset = 1}")
        + "  %y = Dequantize(%q) {in_scale = 0.05, in_offset = 2} : f32[1, 2, 2, 2]\n"),
        {"x": _QCX, "r": _QCR},
        lambda f: {"y": _dq(_q8(_qconv_float(f["x"]) + _dq(f["r"], 0.03, 1), 0.05, 2), 0.05, 2)}),
        rtol=0.0, atol=0.051),
    "quantized_matmul_in_float": dict(text_case(_qtext(_QMATMUL + "  %y = Dequantize(%q) {in_scale = 0.05, in_offset = -3} : f32[2, 4]\n"),
        {"x": _QX}, lambda f: {"y": _dq(_q8(_qmatmul_float(f["x"]), 0.05, -3), 0.05, -3)}), rtol=0.0, atol=0.051),
    # onnxruntime's QDQ form: a u8 pair becomes an i8 quantized type (offset moved by 128).
    "qdq_pair_to_quantized": graph_case(
        [("QuantizeLinear", ["x", "s", "z"], ["q"], None), ("DequantizeLinear", ["q", "s", "z"], ["y"], None)],
        {"x": _qrng.uniform(-3, 3, (2, 5)).astype(np.float32)},
        {"s": np.float32(0.02), "z": np.uint8(100)}),
    "conv_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[1, 3, 2, 2] q(0.02, -4)\n"
        f"  const %w: f32[2, 3, 1, 1] = {_dense(_QCW.astype(np.float32) * _QCWS[:, None, None, None])}\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = -4} : f32[1, 3, 2, 2]\n"
        "  %c = Conv(%d, %w) : f32[1, 2, 2, 2]\n"
        "  %y = Quantize(%c) {scale = 0.05, offset = 2} : i8[1, 2, 2, 2] q(0.05, 2)\n"),
        {"x": _QCX}, lambda f: {"y": _q8(_qconv_float(f["x"]) - (_QCB.astype(np.float32) * _QCWS * np.float32(0.02))
                                         [None, :, None, None], 0.05, 2)}), rtol=0.0, atol=1),
    "conv_relu_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[1, 3, 2, 2] q(0.02, -4)\n"
        f"  const %w: f32[2, 3, 1, 1] = {_dense(_QCW.astype(np.float32) * _QCWS[:, None, None, None])}\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = -4} : f32[1, 3, 2, 2]\n"
        "  %c = Conv(%d, %w) : f32[1, 2, 2, 2]\n  %r = Relu(%c) : f32[1, 2, 2, 2]\n"
        "  %y = Quantize(%r) {scale = 0.05, offset = -128} : i8[1, 2, 2, 2] q(0.05, -128)\n"),
        {"x": _QCX}, lambda f: {"y": _q8(np.maximum(_qconv_float(f["x"]) - (_QCB.astype(np.float32) * _QCWS
                                         * np.float32(0.02))[None, :, None, None], 0), 0.05, -128)}), rtol=0.0, atol=1),
    "matmul_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        f"  const %w: f32[3, 4] = {_dense(_QW.astype(np.float32) * _QWS)}\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %m = MatMul(%d, %w) : f32[2, 4]\n"
        "  %y = Quantize(%m) {scale = 0.05, offset = -3} : i8[2, 4] q(0.05, -3)\n"),
        {"x": _QX}, lambda f: {"y": _q8(_dq(f["x"], 0.02, 5) @ (_QW.astype(np.float32) * _QWS), 0.05, -3)}),
        rtol=0.0, atol=1),
    # A ReLU6 before a quantization of [0, 5.1]: the saturation clips.
    "quantize_of_clip_within_range": text_case(_qtext(
        "  input %x: f32[2, 5]\n  %c = Clip(%x) {min = 0.0, max = 6.0} : f32[2, 5]\n"
        "  %y = Quantize(%c) {scale = 0.02, offset = -128} : i8[2, 5] q(0.02, -128)\n"),
        {"x": np.float32([[-3, -0.01, 0, 0.3, 2.5], [5.09, 5.1, 5.2, 6, 9]])},
        lambda f: {"y": _q8(np.clip(f["x"], 0, 6), 0.02, -128)}),
}
CASES.update(_QUANTIZATION_CASES)

# (appended after the other cases: their random draws stay as their golden files recorded them)
CASES.update({
    # A pad past a phase's first tap: that phase's input is cut instead (odd output, cropped).
    "convtranspose_phases_to_convs.cut_input": _onnx_chain(
        [("ConvTranspose", ["w", "b"], {"strides": [2, 2], "pads": [3, 2, 3, 3]})],
        f32(1, 2, 5, 5), {"w": f32(2, 3, 3, 3), "b": f32(3)}),
    # A kernel a multiple of the stride: one Conv over all phases, no zero taps.
    "convtranspose_phases_to_conv": _onnx_chain(
        [("ConvTranspose", ["w", "b"], {"strides": [2, 2], "pads": [1, 1, 1, 1]})],
        f32(1, 2, 3, 4), {"w": f32(2, 3, 4, 2), "b": f32(3)}),
    # A unary op sinks into each part of a concatenation it alone reads.
    "unary_concat_sink": graph_case([("Neg", ["x"], ["n"], None), ("Concat", ["x", "n"], ["c"], {"axis": 1}),
                                     ("Relu", ["c"], ["y"], None)], {"x": f32(2, 3)}),
    # ... and into a slice that keeps most of its operand.
    "unary_slice_sink": _onnx_chain([("Slice", ["s0", "s1"], None), ("Tanh", [], None)], f32(4, 6),
                                    {"s0": np.array([0, 1], np.int64), "s1": np.array([4, 6], np.int64)}),
})

# ---- QOperator models (onnxruntime's quantize_static): the com.microsoft ops and ONNX's
# QLinearConv / QLinearMatMul, against onnxruntime within one quantization step.
_qorng = np.random.default_rng(1414)
_MS = "com.microsoft"


def _ms_case(nodes, inputs, consts, shape, out_dtype=TensorProto.UINT8, atol=1):
    """ONNX nodes (op, inputs, attrs, domain), chained into y of `shape`, against onnxruntime."""
    made = [helper.make_node(op, list(ins), ["y" if i == len(nodes) - 1 else f"t{i}"], domain=domain, **attrs)
            for i, (op, ins, attrs, domain) in enumerate(nodes)]
    model = make_ms_model(made, inputs, {"y": (out_dtype, shape)}, consts)
    return {"model": model, "feeds": inputs, "rtol": 0.0, "atol": atol}


def _qu8(*shape):
    return _qorng.integers(0, 256, size=shape).astype(np.uint8)


def _qi8(*shape):
    return _qorng.integers(-128, 128, size=shape).astype(np.int8)


_QOP_PARAMS = {"s": np.float32(0.05), "z": np.uint8(120), "s2": np.float32(0.03), "z2": np.uint8(100),
               "ys": np.float32(0.06), "yz": np.uint8(110)}
_QOP_PARAMS_I8 = {"s": np.float32(0.05), "z": np.int8(-8), "ys": np.float32(0.02), "yz": np.int8(3)}

# Their own generator: the cases below keep the data their golden files recorded.
_QCONCAT_A, _QCONCAT_B = (np.random.default_rng(15).integers(-128, 128, shape).astype(np.int8)
                          for shape in ((2, 3), (2, 2)))

_QRESIZE_X = np.random.default_rng(16).integers(0, 256, (1, 2, 2, 3)).astype(np.uint8)

_qgrng = np.random.default_rng(17)
_QGEMM_X, _QGEMM_W = _qgrng.uniform(-3, 3, (2, 6)).astype(np.float32), _qgrng.integers(-127, 128, (4, 6)).astype(np.int8)
_QGEMM_A = _qgrng.integers(0, 256, (2, 6)).astype(np.uint8)

_QOPERATOR_CASES = {
    "qlinear_add_to_float": _ms_case(
        [("QLinearAdd", ["a", "s", "z", "b", "s2", "z2", "ys", "yz"], {}, _MS)],
        {"a": _qu8(2, 3, 4), "b": _qu8(3, 1)}, _QOP_PARAMS, (2, 3, 4)),
    "qlinear_mul_to_float": _ms_case(
        [("QLinearMul", ["a", "s", "z", "b", "s2", "z2", "ys", "yz"], {}, _MS)],
        {"a": _qu8(2, 5), "b": _qu8(2, 5)}, dict(_QOP_PARAMS, ys=np.float32(0.05)), (2, 5)),
    "qlinear_sigmoid_to_float": _ms_case(
        [("QLinearSigmoid", ["x", "s", "z", "ys", "yz"], {}, _MS)],
        {"x": _qi8(2, 6)}, dict(_QOP_PARAMS_I8, ys=np.float32(1 / 256), yz=np.int8(-128)), (2, 6), out_dtype=TensorProto.INT8),
    "qlinear_leaky_relu_to_float": _ms_case(
        [("QLinearLeakyRelu", ["x", "s", "z", "ys", "yz"], {"alpha": 0.2}, _MS)],
        {"x": _qi8(2, 6)}, _QOP_PARAMS_I8, (2, 6), out_dtype=TensorProto.INT8),
    "qlinear_global_average_pool_to_float": _ms_case(
        [("QLinearGlobalAveragePool", ["x", "s", "z", "ys", "yz"], {}, _MS)],
        {"x": _qu8(1, 3, 4, 5)}, _QOP_PARAMS, (1, 3, 1, 1)),
    "qlinear_average_pool_to_float": _ms_case(
        [("QLinearAveragePool", ["x", "s", "z", "ys", "yz"],
          {"kernel_shape": [2, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}, _MS)],
        {"x": _qu8(1, 2, 5, 5)}, _QOP_PARAMS, (1, 2, 3, 5)),
    # Weights [N, K] (transB) quantized per column of op(b), an i32 bias, alpha.
    "qgemm_to_float": _ms_case(
        [("QGemm", ["a", "s", "z", "w", "ws", "wz", "c", "ys", "yz"], {"transB": 1, "alpha": 0.5}, _MS)],
        {"a": _qu8(2, 6)},
        {"s": np.float32(0.05), "z": np.uint8(120), "w": _qi8(4, 6),
         "ws": np.float32([0.01, 0.02, 0.005, 0.015]), "wz": np.zeros(4, np.int8),
         "c": np.int32([300, -200, 0, 1000]), "ys": np.float32(0.08), "yz": np.uint8(128)}, (2, 4)),
    "qgemm_to_float_result": _ms_case(
        [("QGemm", ["a", "s", "z", "w", "ws", "wz", "c"], {"transB": 1}, _MS)],
        {"a": _QGEMM_A}, {"s": np.float32(0.05), "z": np.uint8(120), "w": _QGEMM_W, "ws": np.float32(0.01),
                          "wz": np.int8(0), "c": np.int32([300, -200, 0, 1000])}, (2, 4),
        out_dtype=TensorProto.FLOAT, atol=1e-5),
    # A QLinearConv over a value the model quantized (per-channel i8 weights, a bias).
    "qlinear_conv_between_quantized": _ms_case(
        [("QuantizeLinear", ["x", "s", "z"], {}, ""),
         ("QLinearConv", ["t0", "s", "z", "w", "ws", "wz", "ys", "yz", "b"], {"pads": [1, 1, 1, 1]}, "")],
        {"x": _qorng.uniform(-4, 4, (1, 2, 4, 4)).astype(np.float32)},
        {"s": np.float32(0.05), "z": np.uint8(120), "w": _qi8(3, 2, 3, 3),
         "ws": np.float32([0.004, 0.002, 0.003]), "wz": np.zeros(3, np.int8),
         "ys": np.float32(0.3), "yz": np.uint8(100), "b": np.int32([-300, 0, 200])}, (1, 3, 4, 4)),
    "qlinear_matmul_between_quantized": _ms_case(
        [("QuantizeLinear", ["x", "s", "z"], {}, ""),
         ("QLinearMatMul", ["t0", "s", "z", "w", "ws", "wz", "ys", "yz"], {}, "")],
        {"x": _qorng.uniform(-1, 1, (2, 3, 5)).astype(np.float32)},
        {"s": np.float32(0.01), "z": np.int8(3), "w": _qi8(5, 4), "ws": np.float32([0.01, 0.02, 0.005, 0.015]),
         "wz": np.zeros(4, np.int8), "ys": np.float32(0.05), "yz": np.int8(-5)}, (2, 3, 4), out_dtype=TensorProto.INT8),
    "dequantize_linear_of_maxpool": _ms_case(
        [("MaxPool", ["x"], {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}, ""),
         ("DequantizeLinear", ["t0", "s", "z"], {}, "")],
        {"x": _qu8(1, 2, 3, 3)}, {"s": np.float32(0.05), "z": np.uint8(120)}, (1, 2, 4, 4), out_dtype=TensorProto.FLOAT, atol=0),
    "dequantize_linear_of_nearest_resize": _ms_case(
        [("Resize", ["x", "", "scales"], {"mode": "nearest", "coordinate_transformation_mode": "asymmetric"}, ""),
         ("DequantizeLinear", ["t0", "s", "z"], {}, "")],
        {"x": _QRESIZE_X}, {"scales": np.float32([1, 1, 2, 2]), "s": np.float32(0.05), "z": np.uint8(120)},
        (1, 2, 4, 6), out_dtype=TensorProto.FLOAT, atol=0),
    "dequantize_linear_of_flatten": _ms_case(
        [("Flatten", ["x"], {}, ""), ("DequantizeLinear", ["t0", "s", "z"], {}, "")],
        {"x": _qi8(2, 3, 2)}, {"s": np.float32(0.05), "z": np.int8(-7)}, (2, 6), out_dtype=TensorProto.FLOAT, atol=0),
    "dequantize_linear_of_reshape": _ms_case(
        [("Reshape", ["x", "shape"], {}, ""), ("DequantizeLinear", ["t0", "s", "z"], {}, "")],
        {"x": _qu8(2, 6)}, {"shape": np.int64([3, 4]), "s": np.float32(0.05), "z": np.uint8(120)},
        (3, 4), out_dtype=TensorProto.FLOAT, atol=0),
    "dequantize_linear_of_transpose": _ms_case(
        [("Transpose", ["x"], {"perm": [1, 0]}, ""), ("DequantizeLinear", ["t0", "s", "z"], {}, "")],
        {"x": _qu8(2, 3)}, {"s": np.float32(0.05), "z": np.uint8(120)}, (3, 2), out_dtype=TensorProto.FLOAT, atol=0),
    "qlinear_concat_to_float": _ms_case(
        [("QLinearConcat", ["ys", "yz", "a", "s", "z", "b", "s2", "z2"], {"axis": 1}, _MS)],
        {"a": _qu8(2, 3), "b": _qu8(2, 2)}, _QOP_PARAMS, (2, 5)),
    "dequantized_concat_peel": text_case(
        "graph g {\n  input %a: i8[2, 3]\n  input %b: i8[2, 2]\n"
        "  %y = DequantizedConcat([%a, %b]) {axis = 1, scales = [0.05, 0.02], zero_points = [3, -2]} : f32[2, 5]\n"
        '  output "y" = %y\n}',
        {"a": _QCONCAT_A, "b": _QCONCAT_B},
        lambda f: {"y": np.concatenate([_dq(f["a"], 0.05, 3), _dq(f["b"], 0.02, -2)], axis=1)}),
    "dequantized_concat_single": text_case(
        "graph g {\n  input %a: i8[2, 3]\n"
        "  %y = DequantizedConcat([%a]) {axis = 1, scales = [0.05], zero_points = [3]} : f32[2, 3]\n"
        '  output "y" = %y\n}',
        {"a": _QCONCAT_A}, lambda f: {"y": _dq(f["a"], 0.05, 3)}),
    # The model's i8 weights (per filter) dequantized in the float form: kept as they are.
    # u8 weights within i8's range of their zero points (per row here): i8 weights, zero point 0.
    "dequantize_linear_of_centered_u8_weights": dict(text_case(_qtext(
        "  input %x: f32[2, 3]\n"
        "  const %w: u8[2, 3] = dense<[0, 128, 255, 100, 200, 150]>\n  const %s: f32[2] = dense<[0.5, 0.25]>\n"
        "  const %z: u8[2] = dense<[128, 130]>\n"
        '  %wd = DequantizeLinear(%w, %s, %z) {axis = 0, block_size = 0, dtype = "f32"} : f32[2, 3]\n'
        "  %y = Add(%x, %wd) : f32[2, 3]\n"),
        {"x": np.float32([[1, 2, 3], [4, 5, 6]])},
        lambda f: {"y": f["x"] + np.float32([[-64, 0, 63.5], [-7.5, 17.5, 5]])}), rtol=0.0, atol=0),
    "conv_of_quantized_weights_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[1, 3, 2, 2] q(0.02, -4)\n"
        f"  const %w: i8[2, 3, 1, 1] = {_dense(_QCW)}\n  const %ws: f32[2] = {_dense(_QCWS)}\n"
        "  const %b: f32[2] = dense<[0.5, -0.25]>\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = -4} : f32[1, 3, 2, 2]\n"
        '  %wd = DequantizeLinear(%w, %ws) {axis = 0, block_size = 0, dtype = "f32"} : f32[2, 3, 1, 1]\n'
        "  %c = Conv(%d, %wd, %b) : f32[1, 2, 2, 2]\n"
        "  %y = Quantize(%c) {scale = 0.05, offset = 2} : i8[1, 2, 2, 2] q(0.05, 2)\n"),
        {"x": _QCX}, lambda f: {"y": _q8(_qconv_float(f["x"]) + (np.float32([0.5, -0.25]) - _QCB.astype(np.float32)
                                         * _QCWS * np.float32(0.02))[None, :, None, None], 0.05, 2)}), rtol=0.0, atol=1),
    "matmul_of_quantized_weights_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        f"  const %w: i8[3, 4] = {_dense(_QW)}\n  const %ws: f32[4] = {_dense(_QWS)}\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        '  %wd = DequantizeLinear(%w, %ws) {axis = 1, block_size = 0, dtype = "f32"} : f32[3, 4]\n'
        "  %m = MatMul(%d, %wd) : f32[2, 4]\n"
        "  %y = Quantize(%m) {scale = 0.05, offset = -3} : i8[2, 4] q(0.05, -3)\n"),
        {"x": _QX}, lambda f: {"y": _q8(_dq(f["x"], 0.02, 5) @ (_QW.astype(np.float32) * _QWS), 0.05, -3)}),
        rtol=0.0, atol=1),
    "matmul_bias_of_quantized_weights_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        f"  const %w: i8[3, 4] = {_dense(_QW)}\n  const %ws: f32[] = dense<[0.015]>\n"
        "  const %c: f32[4] = dense<[0.5, -0.25, 1.0, 0.0]>\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        '  %wd = DequantizeLinear(%w, %ws) {axis = 1, block_size = 0, dtype = "f32"} : f32[3, 4]\n'
        "  %m = MatMul(%d, %wd) : f32[2, 4]\n  %a = Add(%m, %c) : f32[2, 4]\n"
        "  %y = Quantize(%a) {scale = 0.05, offset = -3} : i8[2, 4] q(0.05, -3)\n"),
        {"x": _QX}, lambda f: {"y": _q8(_dq(f["x"], 0.02, 5) @ (_QW.astype(np.float32) * np.float32(0.015))
                                        + np.float32([0.5, -0.25, 1.0, 0.0]), 0.05, -3)}),
        rtol=0.0, atol=1),
    # A QGemm over a value the model quantized (transB: the weights transposed at compile time).
    "qgemm_between_quantized": _ms_case(
        [("QuantizeLinear", ["x", "s", "z"], {}, ""),
         ("QGemm", ["t0", "s", "z", "w", "ws", "wz", "c", "ys", "yz"], {"transB": 1}, _MS)],
        {"x": _QGEMM_X},
        {"s": np.float32(0.05), "z": np.uint8(120), "w": _QGEMM_W,
         "ws": np.float32([0.01, 0.02, 0.005, 0.015]), "wz": np.zeros(4, np.int8),
         "c": np.int32([300, -200, 0, 1000]), "ys": np.float32(0.08), "yz": np.uint8(128)}, (2, 4)),
    # A Gemm's bias after the integer product's float form, before its quantization.
    "matmul_bias_between_quantized": dict(text_case(_qtext(
        "  input %x: i8[2, 3] q(0.02, 5)\n"
        f"  const %w: f32[3, 4] = {_dense(_QW.astype(np.float32) * _QWS)}\n"
        "  const %c: f32[4] = dense<[0.5, -0.25, 1.0, 0.0]>\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %m = MatMul(%d, %w) : f32[2, 4]\n  %a = Add(%m, %c) : f32[2, 4]\n"
        "  %y = Quantize(%a) {scale = 0.05, offset = -3} : i8[2, 4] q(0.05, -3)\n"),
        {"x": _QX}, lambda f: {"y": _q8(_dq(f["x"], 0.02, 5) @ (_QW.astype(np.float32) * _QWS)
                                        + np.float32([0.5, -0.25, 1.0, 0.0]), 0.05, -3)}),
        rtol=0.0, atol=1),
}
CASES.update(_QOPERATOR_CASES)

# ---- int8 through concatenations and nearest resizes; QLinearSoftmax (own generator)
_qcrng = np.random.default_rng(1415)
_QCAT_A, _QCAT_B = (_qcrng.integers(-128, 128, shape).astype(np.int8) for shape in ((2, 3), (2, 2)))
_QUP_X = _qcrng.integers(-128, 128, (1, 2, 2, 3)).astype(np.int8)
_NEAREST_X2 = ('{axes = [2, 3], sizes = [1, 2, 4, 6], scales = [1.0, 1.0, 2.0, 2.0], '
               'roi = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], mode = "nearest", '
               'coordinate_transformation_mode = "asymmetric", nearest_mode = "floor"}')


def _up2(x):
    """A nearest 2x upsampling of the last two dimensions."""
    return x.repeat(2, axis=-2).repeat(2, axis=-1)


CASES.update({
    # Parts of different parameters; the second has the result's already.
    "quantize_of_concat": text_case(_qtext(
        "  input %a: i8[2, 3] q(0.02, 5)\n  input %b: i8[2, 2] q(0.05, -3)\n"
        "  %da = Dequantize(%a) {in_scale = 0.02, in_offset = 5} : f32[2, 3]\n"
        "  %db = Dequantize(%b) {in_scale = 0.05, in_offset = -3} : f32[2, 2]\n"
        "  %c = Concat([%da, %db]) {axis = 1} : f32[2, 5]\n"
        "  %y = Quantize(%c) {scale = 0.05, offset = -3} : i8[2, 5] q(0.05, -3)\n"),
        {"a": _QCAT_A, "b": _QCAT_B},
        lambda f: {"y": np.concatenate([_q8(_dq(f["a"], 0.02, 5), 0.05, -3), f["b"]], axis=1)}),
    "resize_of_dequantized": text_case(_qtext(
        "  input %x: i8[1, 2, 2, 3] q(0.02, 5)\n"
        "  %d = Dequantize(%x) {in_scale = 0.02, in_offset = 5} : f32[1, 2, 2, 3]\n"
        f"  %y = Resize(%d) {_NEAREST_X2} : f32[1, 2, 4, 6]\n"),
        {"x": _QUP_X}, lambda f: {"y": _up2(_dq(f["x"], 0.02, 5))}),
    "rescale_through_resize": text_case(_qtext(
        "  input %x: i8[1, 2, 2, 3] q(0.02, 5)\n"
        f"  %r = Resize(%x) {_NEAREST_X2} : i8[1, 2, 4, 6] q(0.02, 5)\n"
        "  %y = Rescale(%r) {in_scale = 0.02, in_offset = 5, scale = 0.03, offset = -7} : i8[1, 2, 4, 6] q(0.03, -7)\n"),
        {"x": _QUP_X}, lambda f: {"y": _up2(_rescale(f["x"], 0.02, 5, 0.03, -7))}),
    # The rescale's range lies within the product's: its saturation is the only one left.
    "rescale_into_quantized_conv.within_range": dict(text_case(_qtext(
        _QCONV + "  %y = Rescale(%q) {in_scale = 0.05, in_offset = 2, scale = 0.04, offset = 0} : "
        "i8[1, 2, 2, 2] q(0.04, 0)\n"), {"x": _QCX},
        lambda f: {"y": _rescale(_q8(_qconv_float(f["x"]), 0.05, 2), 0.05, 2, 0.04, 0)}),
        rtol=0.0, atol=1),
    "qlinear_softmax_to_float": _ms_case(
        [("QLinearSoftmax", ["x", "s", "z", "ys", "yz"], {"opset": 13, "axis": -1}, _MS)],
        {"x": _qcrng.integers(-128, 128, (2, 6)).astype(np.int8)},
        dict(_QOP_PARAMS_I8, ys=np.float32(1 / 256), yz=np.int8(-128)), (2, 6), out_dtype=TensorProto.INT8),
    # Before opset 13: the softmax of x seen as 2-D from axis on.
    "qlinear_softmax_to_float.flat": _ms_case(
        [("QLinearSoftmax", ["x", "s", "z", "ys", "yz"], {"opset": 12, "axis": 1}, _MS)],
        {"x": _qcrng.integers(0, 256, (2, 3, 4)).astype(np.uint8)},
        dict(_QOP_PARAMS, ys=np.float32(1 / 256), yz=np.uint8(0)), (2, 3, 4)),
})

# ---- quantized sums (own generator)
_qsrng = np.random.default_rng(1416)
_QSUM_V = _qsrng.uniform(-3, 3, (2, 5)).astype(np.float32)
_QSUM_A, _QSUM_B = (_qsrng.integers(-128, 128, (2, 3, 4)).astype(np.int8) for _ in range(2))
_QSUM_INPUTS = "  input %a: i8[2, 3, 4] q(0.02, 5)\n  input %b: i8[2, 3, 4] q(0.01, -3)\n"
_QSUM_IN = (_QSUM_INPUTS +
            "  %da = Dequantize(%a) {in_scale = 0.02, in_offset = 5} : f32[2, 3, 4]\n"
            "  %db = Dequantize(%b) {in_scale = 0.01, in_offset = -3} : f32[2, 3, 4]\n")


def _qsum(feeds, scale, offset, relu=False):
    """The requantized sum of a and b (as _QSUM_IN dequantizes them), exactly: float64."""
    v = (feeds["a"].astype(np.float64) - 5) * 0.02 + (feeds["b"].astype(np.float64) + 3) * 0.01
    return np.clip(np.rint((np.maximum(v, 0) if relu else v) / scale) + offset, -128, 127)


CASES.update({
    # The sum of two dequantized integers, calibrated to its own range: it runs between
    # conversions (within a step of the result's parameters of the float sum).
    "quantize_add": dict(text_case(
        _qtext(_QSUM_IN + "  %y = Add(%da, %db) : f32[2, 3, 4]\n"), {"a": _QSUM_A, "b": _QSUM_B},
        lambda f: {"y": _dq(f["a"], 0.02, 5) + _dq(f["b"], 0.01, -3)}),
        calibrate={"y": (-4.0, 4.0)}, rtol=0.0, atol=8.0 / 255),
    # The ReLU of a quantized sum: quantized once, with the ReLU's range [0, 3].
    "relu_of_quantized_sum": dict(text_case(_qtext(
        "  input %v: f32[2, 5]\n"
        "  %q = Quantize(%v) {scale = 0.025, offset = 0} : i8[2, 5] q(0.025, 0)\n"
        "  %d = Dequantize(%q) {in_scale = 0.025, in_offset = 0} : f32[2, 5]\n"
        "  %y = Relu(%d) : f32[2, 5]\n"), {"v": _QSUM_V}, lambda f: {"y": np.clip(f["v"], 0, 3)}),
        calibrate={"y": (0.0, 3.0)}, rtol=0.0, atol=3.0 / 255),
    # Dequantize, Add, Quantize as one op: within one step of the exact requantized sum
    # (computed here in float64), which it rounds once where the three ops rounded thrice.
    "quantized_add": dict(text_case(_qtext(
        _QSUM_IN + "  %s = Add(%da, %db) : f32[2, 3, 4]\n"
        "  %y = Quantize(%s) {scale = 0.023, offset = 7} : i8[2, 3, 4] q(0.023, 7)\n"),
        {"a": _QSUM_A, "b": _QSUM_B}, lambda f: {"y": _qsum(f, 0.023, 7)}), rtol=0.0, atol=1.0),
    # ... and a ReLU between the sum and the Quantize, the lower bound of the result.
    "quantized_add_relu": dict(text_case(_qtext(
        _QSUM_IN + "  %s = Add(%da, %db) : f32[2, 3, 4]\n  %r = Relu(%s) : f32[2, 3, 4]\n"
        "  %y = Quantize(%r) {scale = 0.011, offset = -100} : i8[2, 3, 4] q(0.011, -100)\n"),
        {"a": _QSUM_A, "b": _QSUM_B}, lambda f: {"y": _qsum(f, 0.011, -100, relu=True)}), rtol=0.0, atol=1.0),
    # The ReLU of a sum already one op (quantize_add, then quantized_add): quantized with the
    # ReLU's range [0, 3], whose offset is the bound.
    "relu_of_quantized_add": dict(text_case(_qtext(
        _QSUM_INPUTS + "  %s = QuantizedAdd(%a, %b) {a_scale = 0.02, a_offset = 5, b_scale = 0.01, b_offset = -3, "
        "scale = 0.03, offset = 0} : i8[2, 3, 4] q(0.03, 0)\n"
        "  %d = Dequantize(%s) {in_scale = 0.03, in_offset = 0} : f32[2, 3, 4]\n"
        "  %y = Relu(%d) : f32[2, 3, 4]\n"), {"a": _QSUM_A, "b": _QSUM_B},
        lambda f: {"y": np.clip(_dq(f["a"], 0.02, 5) + _dq(f["b"], 0.01, -3), 0, 3)}),
        calibrate={"y": (0.0, 3.0)}, rtol=0.0, atol=3.0 / 255),
})

HEADER = ("# Golden test of rule {rule}{variant}: the graph before, and after applying the rule alone.\n"
          "# Regenerate for review with: pytest tests/test_golden.py --regen-golden\n")


def _before(case, registry):
    fn = parse_function(case["text"], registry) if "text" in case else api.load(case["model"], registry=registry)
    if "calibrate" in case:             # the [quantize] rules read calibrated values
        from glowgen.quantization import choose_params
        values = {v.name: v for v in list(fn.placeholders) + [o for n in fn.nodes for o in n.outputs]}
        dtype = case.get("calibrate_dtype", "i8")
        for name, (lo, hi) in case["calibrate"].items():
            values[name].calibrated = (dtype, choose_params(lo, hi, dtype=dtype))
    return fn


def _golden_text(case_name, before, after):
    rule, _, variant = case_name.partition(".")
    return (HEADER.format(rule=rule, variant=f" (case {variant})" if variant else "")
            + "# ---- before\n" + before + "# ---- after\n" + after)


def _rules():
    return [r.name for r in Registry.default().rules]


def _rule_of(case_name):
    return case_name.partition(".")[0]


def test_every_rule_has_a_case_and_a_golden_file():
    rules = _rules()
    covered = {_rule_of(c) for c in CASES}
    assert not sorted(set(rules) - covered), "rules without a golden case in tests/test_golden.py"
    assert not sorted(covered - set(rules)), "golden cases for rules that no longer exist"
    missing = [c for c in CASES if not (GOLDEN / f"{c}.txt").exists()]
    assert not missing, f"cases without tests/golden/<case>.txt (run with --regen-golden): {missing}"
    stray = sorted(p.stem for p in GOLDEN.glob("*.txt") if p.stem not in CASES)
    assert not stray, f"golden files for unknown cases: {stray}"


@pytest.mark.parametrize("case_name", list(CASES))
def test_rule_golden(case_name, request):
    registry = Registry.default()
    case = CASES[case_name]
    rule_name = _rule_of(case_name)
    rule = next(r for r in registry.rules if r.name == rule_name)
    fn = _before(case, registry)
    before = print_function(fn)
    ctx = RewriteContext(set(pipeline.backend_ops("interpreter", registry)))
    stats = apply_rules(fn, registry, [rule], ctx)
    fn.dead_code_elimination()
    assert stats.fired[rule_name] >= 1, f"rule {rule_name} did not fire on its golden case"
    after = print_function(fn)
    text = _golden_text(case_name, before, after)
    path = GOLDEN / f"{case_name}.txt"
    if request.config.getoption("--regen-golden"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; run pytest tests/test_golden.py --regen-golden"
    assert path.read_text() == text, f"{path} differs from what the rule produces now"

    # Numeric check: the rewritten graph, lowered and run, against an independent oracle.
    api.lower(fn, registry)
    actual = evaluate(fn, case["feeds"], registry)
    oracle = case.get("oracle", case.get("model"))
    expected = run_ort(oracle, case["feeds"]) if hasattr(oracle, "graph") else oracle(case["feeds"])
    for k, v in expected.items():
        np.testing.assert_allclose(actual[k], v, rtol=case.get("rtol", 1e-5), atol=case.get("atol", 1e-6),
                                   err_msg=f"{rule_name}: {k}")
