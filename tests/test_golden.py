"""One golden test per rule of specs/lowerings.glowdef.

Each rule has a case: a small ONNX model in which the rule applies (or, for ops ONNX does not
have, a graph in textual form and a NumPy oracle).  tests/golden/<rule>.txt holds the graph
before (as imported) and after applying that rule alone.  The test checks that the rule fires,
that before/after match the golden text, and that the rewritten graph, lowered and run, computes
what onnxruntime computes on the original model.

    pytest tests/test_golden.py --regen-golden      # rewrite the files, then review the diff
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from glowgen import api
from glowgen.backends.interpreter.evaluate import evaluate
from glowgen.engine.registry import Registry
from glowgen.engine.rewrite import apply_rules
from glowgen.engine.textual import parse_function, print_function

from conftest import make_model, run_ort

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
    return {"text": text, "feeds": feeds, "oracle": oracle}


_FC_X, _FC_W, _FC_B = f32(2, 3), f32(3, 4), f32(4)
_fc_text = f"""graph fc {{
  input %x: f32[2, 3]
  const %w: f32[3, 4] = dense<[{', '.join(str(v) for v in _FC_W.reshape(-1))}]>
  const %b: f32[4] = dense<[{', '.join(str(v) for v in _FC_B)}]>
  %fc = FullyConnected(%x, %w, %b) : f32[2, 4]
  output "y" = %fc
}}
"""

CASES = {
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
    "gemm_no_bias_to_matmul": onnx_case("Gemm", {"a": f32(3, 2), "b": f32(3, 4)}, attrs={"transA": 1}),
    "fc_to_matmul": text_case(_fc_text, {"x": _FC_X}, lambda f: {"y": f["x"] @ _FC_W + _FC_B}),
    "matmul_vector_lhs": onnx_case("MatMul", {"a": f32(3), "b": f32(3, 2)}),
    "matmul_vector_rhs": onnx_case("MatMul", {"a": f32(2, 3), "b": f32(3)}),
    "matmul_shared_rhs": onnx_case("MatMul", {"a": f32(2, 2, 3), "b": f32(3, 2)}),
    "matmul_batched": onnx_case("MatMul", {"a": f32(2, 1, 2, 3), "b": f32(2, 3, 2)}),
    "batchnorm_to_affine": onnx_case("BatchNormalization", {"x": f32(1, 2, 2, 2)},
                                     consts={"s": pos(2), "b": f32(2), "m": f32(2), "v": pos(2)}),
    "layernorm_expand": onnx_case("LayerNormalization", {"x": f32(2, 4)}, consts={"s": f32(4), "b": f32(4)}),
    "layernorm_no_bias_expand": onnx_case("LayerNormalization", {"x": f32(2, 4)}, consts={"s": f32(4)}),
    "softmax_expand": onnx_case("Softmax", {"x": f32(2, 3)}),
    "logsoftmax_expand": onnx_case("LogSoftmax", {"x": f32(2, 3)}),
    "softmax_flat_to_2d": onnx_case("Softmax", {"x": f32(2, 2, 3)}, attrs={"axis": 1}, opset=11),
    "logsoftmax_flat_to_2d": onnx_case("LogSoftmax", {"x": f32(2, 2, 3)}, attrs={"axis": 1}, opset=11),
    "reducemean_to_sum": onnx_case("ReduceMean", {"x": f32(2, 3)}, attrs={"axes": [1]}),
    "global_avgpool_to_mean": onnx_case("GlobalAveragePool", {"x": f32(1, 2, 3, 3)}),
    "global_maxpool_to_max": onnx_case("GlobalMaxPool", {"x": f32(1, 2, 3, 3)}),
    "lrn_expand": onnx_case("LRN", {"x": f32(1, 3, 2, 2)}, attrs={"size": 3}),
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
    "convn_2d": onnx_case("Conv", {"x": f32(1, 2, 4, 4)}, consts={"w": f32(3, 2, 3, 3), "b": f32(3)}),
    "convn_2d_no_bias": onnx_case("Conv", {"x": f32(1, 2, 4, 4)}, consts={"w": f32(3, 2, 3, 3)},
                                  attrs={"pads": [1, 1, 1, 1]}),
    "convn_1d": onnx_case("Conv", {"x": f32(1, 2, 6)}, consts={"w": f32(3, 2, 3), "b": f32(3)},
                          attrs={"strides": [2], "pads": [1, 0]}),
    "convn_1d_no_bias": onnx_case("Conv", {"x": f32(1, 2, 6)}, consts={"w": f32(3, 2, 3)},
                                  attrs={"dilations": [2]}),
    "maxpooln_2d": onnx_case("MaxPool", {"x": f32(1, 2, 4, 4)}, attrs={"kernel_shape": [2, 2]}),
    "maxpooln_1d": onnx_case("MaxPool", {"x": f32(1, 2, 7)}, attrs={"kernel_shape": [3], "strides": [2]}),
    "avgpooln_2d": onnx_case("AveragePool", {"x": f32(1, 2, 4, 4)}, attrs={"kernel_shape": [2, 2]}),
    "avgpooln_1d": onnx_case("AveragePool", {"x": f32(1, 2, 7)}, attrs={"kernel_shape": [3], "pads": [1, 1]}),
}

HEADER = ("# Golden test of rule {rule}: the graph before, and after applying the rule alone.\n"
          "# Regenerate for review with: pytest tests/test_golden.py --regen-golden\n")


def _before(case, registry):
    if "text" in case:
        return parse_function(case["text"], registry)
    return api.load(case["model"], registry=registry)


def _golden_text(rule_name, before, after):
    return (HEADER.format(rule=rule_name) + "# ---- before\n" + before + "# ---- after\n" + after)


def _rules():
    return [r.name for r in Registry.default().rules]


def test_every_rule_has_a_case_and_a_golden_file():
    rules = _rules()
    assert not sorted(set(rules) - set(CASES)), "rules without a golden case in tests/test_golden.py"
    assert not sorted(set(CASES) - set(rules)), "golden cases for rules that no longer exist"
    missing = [r for r in rules if not (GOLDEN / f"{r}.txt").exists()]
    assert not missing, f"rules without tests/golden/<rule>.txt (run with --regen-golden): {missing}"
    stray = sorted(p.stem for p in GOLDEN.glob("*.txt") if p.stem not in rules)
    assert not stray, f"golden files for unknown rules: {stray}"


@pytest.mark.parametrize("rule_name", _rules())
def test_rule_golden(rule_name, request):
    registry = Registry.default()
    case = CASES[rule_name]
    rule = next(r for r in registry.rules if r.name == rule_name)
    fn = _before(case, registry)
    before = print_function(fn)
    stats = apply_rules(fn, registry, [rule])
    fn.dead_code_elimination()
    assert stats.fired[rule_name] >= 1, f"rule {rule_name} did not fire on its golden case"
    after = print_function(fn)
    text = _golden_text(rule_name, before, after)
    path = GOLDEN / f"{rule_name}.txt"
    if request.config.getoption("--regen-golden"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; run pytest tests/test_golden.py --regen-golden"
    assert path.read_text() == text, f"{path} differs from what the rule produces now"

    # Numeric check: the rewritten graph, lowered and run, against an independent oracle.
    api.lower(fn, registry)
    actual = evaluate(fn, case["feeds"], registry)
    expected = case["oracle"](case["feeds"]) if "oracle" in case else run_ort(case["model"], case["feeds"])
    for k, v in expected.items():
        np.testing.assert_allclose(actual[k], v, rtol=1e-5, atol=1e-6, err_msg=f"{rule_name}: {k}")
