"""Profile-guided quantization: profiling (ranges and histograms against onnxruntime's view of
every tensor), the profile file, calibration and the quantization schemas."""
from __future__ import annotations

import functools

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glowgen
from glowgen.errors import GlowgenError, InputError
from glowgen.quantization import (SCHEMAS, Calibration, TensorProfile, choose_params,
                                  load_profile, model_fingerprint, tensor_range)
from glowgen.quantization.calibration import dequantize_array, quantize_array

from conftest import make_model, ort_quantize_static, ort_session

rng = np.random.default_rng(7)


def _cnn(batch=1):
    """Conv -> Relu -> Flatten -> MatMul -> Add: tensors of both signs, one non-negative."""
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    m = rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32) * 0.1
    b = rng.standard_normal(5).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y"])]
    return make_model(nodes, {"x": np.zeros((batch, 2, 6, 6), np.float32)}, ["y"],
                      {"w": w, "m": m, "b": b})


def _ort_tensors(model, names, samples):
    """Every named tensor of `model` for each sample, computed by onnxruntime."""
    import onnxruntime as ort
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for n in names:
        if n not in [o.name for o in probe.graph.output]:
            probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, s))) for s in samples]
    return {n: np.concatenate([o[n].ravel() for o in outs]) if n not in [i.name for i in model.graph.input]
            else np.concatenate([s[n].ravel() for s in samples]) for n in names}


def _samples(n, batch=1):
    return [{"x": rng.standard_normal((batch, 2, 6, 6)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_profile_matches_onnxruntime_tensors(backend):
    model, samples = _cnn(), _samples(5)
    prof = glowgen.profile(model, samples, bins=64, backend=backend)
    assert set(prof.tensors) == {"x", "c", "r", "f", "mm", "y"}
    seen = _ort_tensors(model, list(prof.tensors), samples)
    for name, values in seen.items():
        t = prof[name]
        np.testing.assert_allclose([t.min, t.max], [values.min(), values.max()], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        assert t.count == values.size == t.histogram.sum()
        expected, _ = np.histogram(values, bins=64, range=(t.min, t.max))
        # A value within rounding of a bin edge may land on either side of it.
        assert np.abs(t.histogram - expected).sum() <= 2 * max(1, values.size // 10000), name
    assert prof["r"].min == 0.0 and prof.samples == 5


def test_profile_of_a_dynamic_batch_covers_every_shape():
    model = _cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    samples = _samples(2, batch=1) + _samples(2, batch=3)
    prof = glowgen.profile(model, samples, bins=16)
    seen = _ort_tensors(model, ["c", "y"], samples)
    assert prof["c"].count == seen["c"].size == 8 * 4 * 36
    assert prof["y"].max == pytest.approx(float(seen["y"].max()), rel=1e-5)


def test_profile_file_round_trips_and_names_its_model(tmp_path):
    model = _cnn()
    prof = glowgen.profile(model, _samples(2), bins=32)
    path = tmp_path / "p.json"
    prof.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "glowgen-profile" and data["version"] == 1
    assert data["model"]["sha256"] == model_fingerprint(model)
    back = glowgen.load_profile(path)
    assert back.tensors.keys() == prof.tensors.keys()
    for n in prof.tensors:
        assert back[n].min == prof[n].min and back[n].max == prof[n].max
        assert (back[n].histogram == prof[n].histogram).all()
    back.check_model(model)                     # its own model: accepted

    other = _cnn()                               # same graph, other weights
    with pytest.raises(InputError, match="made for another model"):
        back.check_model(other)


def test_fingerprint_ignores_declared_shapes_only():
    model = _cnn()
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    renamed.producer_name = "someone else"
    assert model_fingerprint(renamed) == model_fingerprint(model)
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.node[0].attribute[0].ints[0] = 0       # a pad
    assert model_fingerprint(changed) != model_fingerprint(model)


@pytest.mark.parametrize("text", ["{}", '{"format": "glowgen-profile", "version": 9}', "not json",
                                  '{"format": "glowgen-profile", "version": 1, "model": {"sha256": "a"},'
                                  ' "tensors": {"t": {"min": 2, "max": 1, "histogram": [1]}}}'])
def test_bad_profile_files_are_refused_clearly(tmp_path, text):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(InputError, match="profile|p.json"):
        load_profile(path)


def test_bad_calibration_samples_are_named():
    model = _cnn()
    with pytest.raises(InputError, match="sample 1: input 'x' has shape"):
        glowgen.profile(model, [{"x": np.zeros((1, 2, 6, 6), np.float32)},
                                {"x": np.zeros((1, 2, 5, 6), np.float32)}])
    with pytest.raises(InputError, match="sample 0: .*lacks 'x'"):
        glowgen.profile(model, [{}])
    with pytest.raises(InputError, match="element type"):
        glowgen.profile(model, [{"x": np.zeros((1, 2, 6, 6), np.float64)}])
    with pytest.raises(InputError, match="non-finite"):
        glowgen.profile(model, [{"x": np.full((1, 2, 6, 6), np.inf, np.float32)}])
    with pytest.raises(InputError, match="at least one"):
        glowgen.profile(model, [])


# ----------------------------------------------------------------------------- schemas
@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("dtype", ["i8", "i16"])
@pytest.mark.parametrize("lo,hi", [(-1.0, 3.0), (0.0, 6.0), (-5.0, -1.0), (-1e-3, 2e-3), (0.0, 0.0)])
def test_schema_round_trips_within_half_a_step(schema, dtype, lo, hi):
    q = choose_params(lo, hi, schema, dtype)
    x = np.concatenate([rng.uniform(lo, hi, 5000), [lo, hi, 0.0]]).astype(np.float32)
    back = dequantize_array(quantize_array(x, q, dtype), q)
    # Half a step, and the float32 rounding of the dequantized value (it matters in i16).
    assert np.abs(back - x).max() <= q.scale / 2 * (1 + 1e-5) + 2 * np.spacing(np.float32(max(-lo, hi)))
    assert dequantize_array(quantize_array(np.zeros(1, np.float32), q, dtype), q)[0] == 0.0
    if schema != "asymmetric" and not (schema == "symmetric_uint8" and lo >= 0):
        assert q.offset == 0
    if schema == "symmetric_power2":
        assert np.log2(q.scale) == int(np.log2(q.scale))


def test_calibration_narrows_a_range_with_an_outlier():
    x = np.concatenate([rng.standard_normal(200_000), [60.0]])
    hist, _ = np.histogram(x, bins=2048)
    t = TensorProfile(float(x.min()), float(x.max()), hist, x.size)
    assert tensor_range(t, "minmax") == (t.min, t.max)
    for cal in ("percentile=99.99", "kl"):
        lo, hi = tensor_range(t, cal, "symmetric")
        assert 2.5 < hi < 8.0 and lo == -hi, (cal, lo, hi)
    lo, hi = tensor_range(t, "percentile=99", "asymmetric")
    assert -3.0 < lo < -2.0 and 2.0 < hi < 3.0
    # A ReLU's output: half exact zeros.  The spike at zero must not pull the entropy
    # threshold down; pixels of a few distinct values keep their whole range.
    relu = np.concatenate([np.zeros(100_000), np.abs(rng.standard_normal(100_000))])
    hist, _ = np.histogram(relu, bins=2048)
    t = TensorProfile(0.0, float(relu.max()), hist, relu.size)
    assert 2.5 < tensor_range(t, "kl", "asymmetric")[1] <= t.max
    pixels = rng.integers(0, 17, 10_000) / 16
    hist, _ = np.histogram(pixels, bins=2048)
    assert tensor_range(TensorProfile(0.0, 1.0, hist, pixels.size), "kl")[1] == 1.0
    with pytest.raises(GlowgenError, match="percentile"):
        Calibration.parse("percentile=30")
    with pytest.raises(GlowgenError, match="unknown calibration"):
        Calibration.parse("entropy")


# ----------------------------------------------------------------------------- command line
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "glowgen.cli", *map(str, args)],
                          capture_output=True, text=True)


def test_cli_profile_writes_a_profile(tmp_path):
    model = _cnn()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((6, 1, 2, 6, 6)).astype(np.float32))
    r = _cli("profile", tmp_path / "m.onnx", "--calibration", tmp_path / "calib.npz",
             "-o", tmp_path / "p.json", "--limit", 4, "--bins", 100)
    assert r.returncode == 0, r.stderr
    assert "profiled 6 tensors on 4 samples" in r.stdout and r.stderr == ""   # piped: no progress
    prof = load_profile(tmp_path / "p.json")
    assert prof.samples == 4 and prof.bins == 100
    prof.check_model(model)


@pytest.mark.parametrize("make,message", [
    (lambda d: np.savez(d / "c.npz", y=np.zeros((2, 1, 2, 6, 6), np.float32)), "'y', not an input"),
    (lambda d: np.savez(d / "c.npz", x=np.zeros((2, 2, 6, 6), np.float32)), "has shape"),
    (lambda d: (d / "c.npz").write_text("hello"), "cannot read it as an .npz"),
])
def test_cli_profile_bad_calibration_data(tmp_path, make, message):
    onnx.save(_cnn(), tmp_path / "m.onnx")
    make(tmp_path)
    r = _cli("profile", tmp_path / "m.onnx", "--calibration", tmp_path / "c.npz", "-o", tmp_path / "p.json")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "p.json").exists()


def test_cli_bench_compare_float(tmp_path):
    """`glowgen bench --quantize P --compare float`: the quantized model timed against the
    same model in float, with the SQNR of its outputs; refused without --quantize."""
    model = _cnn()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((6, 1, 2, 6, 6)).astype(np.float32))
    assert _cli("profile", tmp_path / "m.onnx", "--calibration", tmp_path / "calib.npz",
                "-o", tmp_path / "p.json").returncode == 0
    r = _cli("bench", tmp_path / "m.onnx", "--quantize", tmp_path / "p.json", "--compare", "float",
             "--runs", 6, "--rounds", 3, "--warmup", 1, "--threads", 1)
    assert r.returncode == 0, r.stderr
    speedup = re.search(r"^speed-up +float / quantized = ([0-9.]+)", r.stdout, re.M)
    sqnr = re.search(r"SQNR of the quantized outputs against float's = ([0-9.]+) dB", r.stdout)
    assert speedup and float(speedup.group(1)) > 0 and "by round" in r.stdout, r.stdout
    assert sqnr and float(sqnr.group(1)) > 20, r.stdout      # a profiled 8-bit model: tens of dB
    r = _cli("bench", tmp_path / "m.onnx", "--compare", "float", "--runs", 3)
    assert r.returncode == 2 and "add --quantize" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ----------------------------------------------------------------------------- quantized models
def _digits():
    """The digits CNN of shared/bench/make_digits.py (tools/make_digits.sh): real weights, real
    labelled images."""
    import os
    from pathlib import Path
    env = os.environ.get("GLOWGEN_DIGITS")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / ".cache" / "digits"
    if not (path / "digits_cnn.onnx").exists():
        if os.environ.get("GLOWGEN_REQUIRE_BENCH_MODELS"):
            pytest.fail("the digits model is required here but missing; run tools/make_digits.sh")
        pytest.skip("digits model not built; run tools/make_digits.sh")
    return path / "digits_cnn.onnx", np.load(path / "digits_data.npz")


@pytest.fixture(scope="module")
def digits_profile():
    model, data = _digits()
    calib = [{"input": data["calib_x"][i:i + 1]} for i in range(100)]
    return glowgen.profile(model, calib, input_shapes={"input": (1, 1, 8, 8)})


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_digits_quantized_top1_within_half_a_point_of_float(digits_profile, backend):
    model, data = _digits()
    x, y = data["test_x"], data["test_y"]
    shapes = {"input": x.shape}
    float_top1 = (glowgen.compile(model, backend=backend, input_shapes=shapes)
                  .run({"input": x})["logits"].argmax(1) == y).mean()
    quantized = glowgen.compile(model, backend=backend, input_shapes=shapes, quantize=digits_profile)
    logits = quantized.run({"input": x})["logits"]
    top1 = (logits.argmax(1) == y).mean()
    assert float_top1 > 0.95
    assert top1 >= float_top1 - 0.005, (top1, float_top1)


@functools.lru_cache(maxsize=None)
def _digits_float_logits(images: int) -> np.ndarray:
    """The float model's logits for the first test images: the same for every schema and
    calibration below, compiled once (about 1 s a compile at 128 images)."""
    model, data = _digits()
    x = data["test_x"][:images]
    return glowgen.compile(model, input_shapes={"input": x.shape}).run({"input": x})["logits"]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("calibration", ["minmax", "percentile=99.99", "kl"])
def test_digits_every_schema_stays_accurate(digits_profile, schema, calibration):
    model, data = _digits()
    x = data["test_x"][:128]
    reference = _digits_float_logits(128)
    got = glowgen.compile(model, input_shapes={"input": x.shape}, quantize=digits_profile,
                          schema=schema, calibration=calibration).run({"input": x})["logits"]
    sqnr = 10 * np.log10((reference ** 2).sum() / ((reference - got) ** 2).sum())
    assert sqnr > 25, (schema, calibration, sqnr)


def test_digits_quantized_graph_is_one_integer_island(digits_profile):
    from glowgen import api
    from glowgen.frontend.onnx import CheckedModel, load_model
    model, _ = _digits()
    checked = CheckedModel(load_model(model))
    fn = api.load(checked, {"input": (1, 1, 8, 8)})
    api.optimize(fn, stage="optimized", backend="cpu",
                 quantization=api.quantization_options(checked, digits_profile))
    ops = [n.OP for n in fn.nodes]
    assert ops.count("QuantizedConv") == 3 and ops.count("QuantizedMatMul") == 2
    assert "Conv" not in ops and "MatMul" not in ops and "Relu" not in ops     # ReLUs absorbed
    for n in fn.nodes:      # no conversion back and forth between integer ops
        if n.OP in ("Quantize", "Rescale"):
            assert n.inputs[0].producer is None or n.inputs[0].producer.OP not in ("Dequantize",), n


def test_a_profile_of_another_model_is_refused_when_compiling():
    prof = glowgen.profile(_cnn(), _samples(1), bins=8)
    with pytest.raises(InputError, match="made for another model"):
        glowgen.compile(_cnn(), quantize=prof)
    with pytest.raises(GlowgenError, match="unknown quantization schema"):
        glowgen.compile(_cnn(), quantize=prof, schema="fancy")


def test_quantized_small_model_matches_float_within_steps():
    model, samples = _cnn(), _samples(8)
    prof = glowgen.profile(model, samples, bins=128)
    from conftest import run_ort
    for backend in ("cpu", "interpreter"):
        q = glowgen.compile(model, backend=backend, quantize=prof)
        for s in samples[:3]:
            expected = run_ort(model, s)["y"]
            got = q.run(s)["y"]
            step = (prof["y"].max - prof["y"].min) / 255
            assert np.abs(got - expected).max() < 4 * step + 0.05 * np.abs(expected).max()


def test_cli_quantized_run_and_dump(tmp_path):
    model = _cnn()
    onnx.save(model, tmp_path / "m.onnx")
    glowgen.profile(model, _samples(4)).save(tmp_path / "p.json")
    r = _cli("dump", tmp_path / "m.onnx", "--stage", "optimized", "--quantize", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert "QuantizedConv" in r.stdout and "QuantizedMatMul" in r.stdout and " q(" in r.stdout
    r = _cli("run", tmp_path / "m.onnx", "--quantize", tmp_path / "p.json", "--schema", "symmetric")
    assert r.returncode == 0 and "y: shape=[1, 5]" in r.stdout, r.stderr
    r = _cli("run", tmp_path / "m.onnx", "--keep-float", "Conv")
    assert r.returncode == 2 and "add --quantize" in r.stderr
    r = _cli("run", tmp_path / "m.onnx", "--quantize", tmp_path / "p.json", "--keep-float", "Cnov")
    assert r.returncode == 2 and "unknown op kind Cnov" in r.stderr


def test_onnxruntime_qdq_model_becomes_integer_ops(tmp_path):
    """A QDQ model from onnxruntime's quantize_static (u8 activations, per-channel i8 weights)
    compiles to the same quantized types and integer ops, and agrees with onnxruntime on it."""
    pytest.importorskip("onnxruntime.quantization")
    model = _cnn()
    onnx.save(model, tmp_path / "f.onnx")
    samples = _samples(16)
    ort_quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", samples, "QDQ", "QUInt8")
    qdq = onnx.load(tmp_path / "q.onnx")
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) >= 2

    from glowgen import api
    fn = api.load(qdq)
    api.optimize(fn, stage="optimized", backend="cpu")
    ops = [n.OP for n in fn.nodes]
    assert "QuantizedConv" in ops and "QuantizeLinear" not in ops and "Conv" not in ops, ops
    sess = ort_session(onnx.load(tmp_path / "q.onnx"))
    y_scale = max(float(numpy_helper.to_array(t)) for t in qdq.graph.initializer
                  if t.name.endswith("_scale") and numpy_helper.to_array(t).size == 1)
    for backend in ("cpu", "interpreter"):
        compiled = glowgen.compile(tmp_path / "q.onnx", backend=backend)
        for s in _samples(4):
            expected = sess.run(None, s)[0]
            got = compiled.run(s)["y"]
            # Integer ops computed with other roundings differ by a step here and there.
            assert np.abs(got - expected).max() <= 2 * y_scale, (backend, np.abs(got - expected).max())


def test_quantized_resnet50_has_no_dequantize_quantize_pair():
    """The rescale folding leaves no conversion to float and straight back in ResNet-50."""
    from conftest import require_bench_dir
    from glowgen import api
    from glowgen.frontend.onnx import CheckedModel, load_model
    path = require_bench_dir() / "resnet50.onnx"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    # Profiled by the interpreter: the rewrite needs ranges, not speed (the cpu backend's
    # instrumented ResNet-50 took 30 s to compile, the interpreter 9 s to run).
    prof = glowgen.profile(path, [{"input": x}], bins=16, backend="interpreter")
    checked = CheckedModel(load_model(path))
    fn = api.load(checked)
    api.optimize(fn, stage="optimized", backend="cpu", quantization=api.quantization_options(checked, prof))
    ops = [n.OP for n in fn.nodes]
    assert ops.count("QuantizedConv") == 53 and "Conv" not in ops
    pairs = [n.name for n in fn.nodes if n.OP in ("Quantize", "Rescale") and n.inputs[0].producer is not None
             and n.inputs[0].producer.OP == "Dequantize"]
    assert not pairs, pairs
    # The input and the classifier's input after the average pooling; each residual sum and
    # its ReLU join the 1x1 convolution before it (quantize_conv_residual,
    # relu_of_quantized_conv: the stream between blocks is i8 and no sum is a step).
    quantized = Counter(n.inputs[0].producer.OP if n.inputs[0].producer else "input"
                        for n in fn.nodes if n.OP == "Quantize")
    assert quantized == {"input": 1, "Flatten": 1}, quantized
    residuals = [n for n in fn.nodes if n.OP == "QuantizedConv" and n.inputs[4] is not None]
    assert len(residuals) == 16 and all(n.inputs[1].type.shape[2:] == (1, 1) for n in residuals)
    assert "QuantizedAdd" not in ops and "Add" not in ops and "Relu" not in ops


def _control_flow_model(n=8, steps=20, seed=3):
    """A MatMul and Relu before a Scan of `steps` (a native loop) whose body is an RNN's
    (h <- tanh(h Wr + x_t Wi), stacked through a Relu), then an If on a run-time condition
    (then: relu(h W1), else: 2 h)."""
    weights = np.random.default_rng(seed)

    def w(name):
        return numpy_helper.from_array((weights.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), name)
    vi = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    body = helper.make_graph([helper.make_node("MatMul", ["h_in", "Wr"], ["hr"]),
                              helper.make_node("MatMul", ["x_t", "Wi"], ["xi"]),
                              helper.make_node("Add", ["hr", "xi"], ["pre"]),
                              helper.make_node("Tanh", ["pre"], ["h_out"]),
                              helper.make_node("Relu", ["h_out"], ["y_t"])], "body",
                             [vi("h_in", F, [1, n]), vi("x_t", F, [1, n])],
                             [vi("h_out", F, [1, n]), vi("y_t", F, [1, n])])
    then = helper.make_graph([helper.make_node("MatMul", ["h", "W1"], ["t1"]),
                              helper.make_node("Relu", ["t1"], ["t2"])], "then", [], [vi("t2", F, [1, n])])
    orelse = helper.make_graph([helper.make_node("Mul", ["h", "two"], ["e1"])], "else", [], [vi("e1", F, [1, n])])
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["a"]), helper.make_node("Relu", ["a"], ["h0"]),
             helper.make_node("Scan", ["h0", "xs"], ["h", "ys"], body=body, num_scan_inputs=1),
             helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=orelse),
             helper.make_node("ReduceMean", ["ys"], ["m"], axes=[0], keepdims=0),
             helper.make_node("Add", ["z", "m"], ["y"])]
    graph = helper.make_graph(nodes, "control_flow", [vi("x", F, [1, n]), vi("xs", F, [steps, 1, n]),
                                                      vi("c", TensorProto.BOOL, [])], [vi("y", F, [1, n])],
                              [w("W0"), w("Wr"), w("Wi"), w("W1"), numpy_helper.from_array(np.array(2, np.float32), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _control_flow_samples(count, n=8, steps=20, taken=(True, False), seed=4):
    draw = np.random.default_rng(seed)
    return [{"x": draw.standard_normal((1, n)).astype(np.float32),
             "xs": draw.standard_normal((steps, 1, n)).astype(np.float32),
             "c": np.array(taken[i % len(taken)])} for i in range(count)]


def _rnn_tensors(model, samples):
    """The body's and the then-branch's tensors over every iteration and sample, computed
    with NumPy from the model's weights (onnxruntime does not show a body's tensors)."""
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    seen = {k: [] for k in ("h_in", "x_t", "hr", "xi", "pre", "h_out", "y_t", "t1", "t2")}
    for s in samples:
        h = np.maximum(s["x"] @ w["W0"], 0)
        for x_t in s["xs"]:
            hr, xi = h @ w["Wr"], x_t @ w["Wi"]
            new = np.tanh(hr + xi)
            for k, v in (("h_in", h), ("x_t", x_t), ("hr", hr), ("xi", xi), ("pre", hr + xi),
                         ("h_out", new), ("y_t", np.maximum(new, 0))):
                seen[k].append(v)
            h = new
        if s["c"]:
            seen["t1"].append(h @ w["W1"])
            seen["t2"].append(np.maximum(h @ w["W1"], 0))
    return {k: np.concatenate([v.ravel() for v in vs]) for k, vs in seen.items() if vs}


def test_profile_covers_tensors_inside_loop_bodies_and_branches():
    """A native loop's body tensors are profiled over all its iterations, a run-time
    branch's over the samples that took it; a branch no sample took has no profile."""
    model = _control_flow_model()
    samples = _control_flow_samples(5)
    prof = glowgen.profile(model, samples, bins=32)
    for name, values in _rnn_tensors(model, samples).items():
        t = prof[name]
        np.testing.assert_allclose([t.min, t.max], [values.min(), values.max()], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
        assert t.count == values.size, name
    assert "e1" in prof.tensors and prof["e1"].count == 2 * 8
    never = glowgen.profile(model, _control_flow_samples(2, taken=(False,)), bins=32)
    assert "t1" not in never.tensors and "e1" in never.tensors and "h_out" in never.tensors


def test_quantized_model_with_control_flow_matches_float():
    """The body's and the branch's products are quantized with their profiles (a branch
    without one stays float), and the answer stays near onnxruntime's in float."""
    from conftest import run_ort
    from glowgen.engine.control import Conditional, WhileLoop
    model = _control_flow_model()
    samples = _control_flow_samples(8)
    for seen in (samples, samples[1::2]):          # both branches; the else-branch only
        prof = glowgen.profile(model, seen, bins=128)
        step = (prof["y"].max - prof["y"].min) / 255
        for backend in ("cpu", "interpreter"):
            q = glowgen.compile(model, backend=backend, quantize=prof)
            for s in seen[:4]:            # within the ranges calibration saw
                expected = run_ort(model, s)["y"]
                assert np.abs(q.run(s)["y"] - expected).max() < 8 * step + 0.05 * np.abs(expected).max()
        loop = next(n for n in q.function.nodes if isinstance(n, WhileLoop))
        assert sum(n.OP == "QuantizedMatMul" for n in loop.body.nodes) == 2
        cond = next(n for n in q.function.nodes if isinstance(n, Conditional))
        assert any(n.OP == "QuantizedMatMul" for n in cond.then_branch.nodes) == ("t1" in prof.tensors)


def test_a_dequantized_shortcut_stacks_into_its_sum():
    """A residual block's shortcut, computed before the main path: the sum reads both as
    int8, here in the requantization of the shortcut's own 1x1 convolution, whose residual
    is the main path's result (quantize_conv_residual; the main path ends in a 3x3), with no
    separate pass widening either to f32 and writing 4 bytes an element."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    w = {f"w{i}": (rng.standard_normal((16, 16, k, k)) * 0.2).astype(np.float32)
         for i, k in enumerate((1, 3, 3, 1))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s"]),                       # the shortcut
             helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "s"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], w)
    samples = [{"x": rng.standard_normal(x.shape).astype(np.float32)} for _ in range(8)]
    q = glowgen.compile(model, quantize=glowgen.profile(model, samples), threads=1)
    steps = q._runner.step_names
    alone = [s for s in steps if s.split(" ")[0] == "Dequantize"]
    assert len(alone) == 1, steps           # the graph output's only (it was the shortcut's too)
    assert not any("Add" in s.split(" ")[0] for s in steps), steps
    [folded] = [n for n in q.function.nodes if n.OP == "QuantizedConv" and n.inputs[4] is not None]
    assert folded.inputs[1].type.shape[2:] == (1, 1) and folded.inputs[4].producer.OP == "QuantizedConv"
    from conftest import run_ort
    expected, got = run_ort(model, samples[0])["y"], q.run(samples[0])["y"]
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()
