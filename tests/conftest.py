"""Shared test helpers: build ONNX models with onnx.helper and run them through glowgen
and an independent oracle (onnxruntime or ONNX's reference evaluator)."""
from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen

REPO = Path(__file__).resolve().parents[1]
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"

_CPU_FLAGS = set(open("/proc/cpuinfo").read().split()) if Path("/proc/cpuinfo").exists() else set()
# The targets a test of the cpu backend's vector code compiles for: the host's, and AVX2's
# (x86-64-v3) where the host has AVX-512.  On an AVX2 host without AVX-512 the host's code
# is AVX2's: a second pass for x86-64-v3 would pick the same kernels and compile them again
# (about a minute of the suite); .ci/run's x86-64-v3 pass covers that target's name there.
HOST_AND_AVX2 = [None] if "avx2" in _CPU_FLAGS and "avx512f" not in _CPU_FLAGS else [None, "x86-64-v3"]
HOST_AND_AVX2_IDS = ["host", "x86-64-v3"][:len(HOST_AND_AVX2)]

NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
              np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int64): TensorProto.INT64,
              np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int8): TensorProto.INT8,
              np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.bool_): TensorProto.BOOL,
              np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}


def value_info(name, array_or_dtype, shape=None):
    dt = np.dtype(getattr(array_or_dtype, "dtype", array_or_dtype))
    if shape is None:
        shape = array_or_dtype.shape
    return helper.make_tensor_value_info(name, NP_TO_ONNX[dt], list(shape))


def make_model(nodes, inputs: dict, outputs, initializers: dict | None = None, opset=17,
               output_dtypes=None):
    """A model whose graph inputs are `inputs` (name -> array, for name/type/shape) and whose
    outputs are `outputs` (names; shapes left to inference)."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    ins = [value_info(k, v) for k, v in inputs.items()]
    outs = []
    for i, name in enumerate(outputs):
        dt = (output_dtypes or {}).get(name, TensorProto.UNDEFINED)
        outs.append(helper.make_tensor_value_info(name, dt, None))
    graph = helper.make_graph(nodes, "test", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    # Give the outputs their types from ONNX's shape inference (onnxruntime wants them).
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:
        return model          # e.g. an op of an unknown domain, for error tests
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in model.graph.output:
        if out.name in known and known[out.name].type.tensor_type.elem_type:
            out.CopyFrom(known[out.name])
    return model


def make_ms_model(nodes, inputs: dict, outputs: dict, initializers: dict | None = None, opset=17):
    """A model that may use onnxruntime's com.microsoft ops (nodes made with that domain);
    `outputs` maps each output name to its (ONNX element type, shape): ONNX cannot infer them."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "test", [value_info(k, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(k, dt, shape) for k, (dt, shape) in outputs.items()],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)], ir_version=8)


def ort_quantize_static(model_path, out_path, samples, quant_format="QDQ", activation="QUInt8",
                        per_channel=True):
    """onnxruntime's quantize_static of the model at `model_path` into `out_path`, calibrated
    on `samples` (feed dicts), i8 weights; returns `out_path`."""
    ortq = pytest.importorskip("onnxruntime.quantization")

    class Reader(ortq.CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    ortq.quantize_static(str(model_path), str(out_path), Reader(),
                         quant_format=getattr(ortq.QuantFormat, quant_format), per_channel=per_channel,
                         activation_type=getattr(ortq.QuantType, activation), weight_type=ortq.QuantType.QInt8)
    return out_path


# Ops onnxruntime computes with u8 x s8 integer products.  On x86 without VNNI its kernels
# sum pairs of those with `vpmaddubsw`, which saturates at 16 bits (weights outside [-64, 63]
# against large activations: one QGemm row gave -32768 for -41102), unless the session
# converts them to u8 x u8 products: the graph transform `session.x64quantprecision` turns
# on, which runs at the ORT_ENABLE_ALL level only.  Exact integer semantics are what the
# tests check glowgen against, so such models get that transform.
INTEGER_PRODUCT_OPS = {"QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger",
                       "DynamicQuantizeMatMul", "QAttention", "DequantizeLinear"}


def ort_session(model):
    """An onnxruntime session for a test oracle: no graph optimizations (float results as the
    ops define them) but for models with integer products, which get the transform that keeps
    their sums exact on x86 (INTEGER_PRODUCT_OPS)."""
    import onnxruntime as ort
    if any(node.op_type in INTEGER_PRODUCT_OPS for node in model.graph.node):
        try:
            return _ort_session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, exact=True)
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:
            pass        # s8 activations: the transform makes u8 weights no kernel takes them with
    return _ort_session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def _ort_session(model, level, exact: bool = False):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = level
    if exact:
        opts.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_ort(model, feeds):
    sess = ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def run_reference(model, feeds):
    from onnx.reference import ReferenceEvaluator
    ref = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ref.run(None, feeds)))


def run_glowgen(model, feeds, **kw):
    return glowgen.compile(model, **kw).run(feeds)


def conv_model(xs, ws, attrs: dict, epilogue, bias: bool = True, seed: int = 0, weight_scale: float = 0.2):
    """(model, feeds) of a Conv (x of shape `xs`, constant weights `ws` times `weight_scale`,
    a constant bias unless not `bias`) and its `epilogue`: "relu", "add" (Add of a second
    input, then Relu: a residual block's end) or None."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    inits = {"w": (rng.standard_normal(ws) * weight_scale).astype(np.float32)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(ws[0]).astype(np.float32)
        conv_inputs.append("b")
    nodes = [helper.make_node("Conv", conv_inputs, ["c" if epilogue else "y"], **attrs)]
    feeds = {"x": x}
    if epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif epilogue == "add":
        (sh, sw), pads = attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0])
        oh = (xs[2] + pads[0] + pads[2] - ws[2]) // sh + 1
        ow = (xs[3] + pads[1] + pads[3] - ws[3]) // sw + 1
        feeds["r"] = rng.standard_normal((xs[0], ws[0], oh, ow)).astype(np.float32)
        nodes += [helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return make_model(nodes, feeds, ["y"], inits), feeds


def conv_strategies(compiled) -> list:
    """The strategy of each Conv a compiled model runs (backends/cpu/plan.CONV_STRATEGIES)."""
    return [ins.plan.strategy for s in compiled.program.plan.steps for ins in s.instrs
            if ins.kind == "Conv" and ins.plan is not None]


def assert_close(actual: dict, expected: dict, rtol=1e-5, atol=1e-6):
    assert set(actual) == set(expected), (set(actual), set(expected))
    for k in expected:
        a, e = np.asarray(actual[k]), np.asarray(expected[k])
        assert a.shape == e.shape, f"{k}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"{k}: dtype {a.dtype} != {e.dtype}"
        if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, e, err_msg=k)
        else:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=k, equal_nan=True)


def bench_dir(bn: bool = False) -> Path | None:
    env = os.environ.get("GLOWGEN_BENCH_MODELS_BN" if bn else "GLOWGEN_BENCH_MODELS")
    path = Path(env) if env else REPO / ".cache" / ("bench_models_bn" if bn else "bench_models")
    return path if (path / "manifest.json").exists() else None


def require_bench_dir(bn: bool = False) -> Path:
    path = bench_dir(bn)
    if path is None:
        if os.environ.get("GLOWGEN_REQUIRE_BENCH_MODELS"):
            pytest.fail("benchmark models are required here but missing; run tools/make_bench_models.sh")
        pytest.skip("benchmark models not built; run tools/make_bench_models.sh"
                    + (" --keep-bn" if bn else ""))
    return path


def pytest_addoption(parser):
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite tests/golden/<rule>.txt from what the rules produce now")
    parser.addoption("--conformance", action="store_true", default=False,
                     help="run every ONNX backend conformance case (default: a representative half)")
    parser.addoption("--cpu", default=None,
                     help="the cpu backend's default target for this run, e.g. x86-64-v3 (sets "
                          "GLOWGEN_CPU; tests that pin their own target keep it)")


def pytest_configure(config):
    cpu = config.getoption("--cpu")
    if cpu:
        os.environ["GLOWGEN_CPU"] = cpu       # xdist workers, started later, inherit it


# On an AVX-512 host, tests parametrized by target run for the host's own path and, beside
# it, for x86-64-v3 (AVX2's path) and x86-64-v4 (AVX-512BW without VNNI: Skylake-SP's int8
# path): about 280 more tests than on an AVX2 host, where the host's path is AVX2's.  Those
# variants are marked `slow` there (run by `-m slow`, as CI does after the suite), so that
# the suite stays under ten minutes on every host (Emerald Rapids, 2 cores: 654 s with them).
SLOW_CPU_VARIANTS = {"x86-64-v3", "x86-64-v4"} if "avx512f" in _CPU_FLAGS else set()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(v, str) and v in SLOW_CPU_VARIANTS for v in params.values()):
            item.add_marker(pytest.mark.slow)


def pytest_report_header(config):
    cpu = os.environ.get("GLOWGEN_CPU")
    return f"glowgen cpu target: {cpu or 'this machine'} (GLOWGEN_CPU / --cpu)"
