"""Profile-guided quantization at precision int16 (`--precision int16`, `precision="int16"`):
i16 activations and weights, i64 sums.  Accuracy against float (onnxruntime), the cpu backend
against the interpreter, the kernels against integer arithmetic written out here, and the
command line."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import glowgen
from glowgen import pipeline
from glowgen.api import CompiledModel
from glowgen.engine.registry import Registry
from glowgen.engine.textual import parse_function
from glowgen.errors import GlowgenError
from glowgen.quantization import SCHEMAS, choose_params

from conftest import make_model, run_ort

rng = np.random.default_rng(16)


def _cnn():
    """Conv -> Relu -> MaxPool -> Conv -> Relu -> Flatten -> Gemm: two integer convolutions,
    a pooling and a product between them."""
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 8).astype(np.float32)
    w2 = rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32)
    b2 = rng.normal(0, 0.1, 8).astype(np.float32)
    w3 = rng.normal(0, 0.1, (8 * 6 * 6, 10)).astype(np.float32)
    b3 = rng.normal(0, 0.1, 10).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"])]
    return make_model(nodes, {"x": np.zeros((1, 3, 12, 12), np.float32)}, ["y"],
                      {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "b3": b3})


def _inputs(n, bound=1.0):
    return [{"x": rng.uniform(-bound, bound, (1, 3, 12, 12)).astype(np.float32)} for _ in range(n)]


def _sqnr(expected, got) -> float:
    e = np.concatenate([np.ravel(a) for a in expected]).astype(np.float64)
    g = np.concatenate([np.ravel(a) for a in got]).astype(np.float64)
    return float(10 * np.log10((e ** 2).sum() / max(((e - g) ** 2).sum(), 1e-300)))


@pytest.fixture(scope="module")
def cnn():
    model = _cnn()
    profile = glowgen.profile(model, _inputs(32))
    # Fresh inputs, a little narrower than the calibration's, so that no tensor leaves its
    # calibrated range: saturation (the same at either precision) would hide the resolution.
    tests = _inputs(8, bound=0.75)
    return model, profile, tests, [run_ort(model, s)["y"] for s in tests]


# ----------------------------------------------------------------------------- accuracy
def test_int16_is_far_closer_to_float_than_int8(cnn):
    model, profile, tests, expected = cnn
    sqnr = {}
    for precision in ("int8", "int16"):
        q = glowgen.compile(model, quantize=profile, precision=precision)
        sqnr[precision] = _sqnr(expected, [q.run(s)["y"] for s in tests])
    assert sqnr["int16"] >= 60, sqnr
    assert 25 < sqnr["int8"] < 50, sqnr
    assert sqnr["int16"] >= sqnr["int8"] + 25, sqnr


def test_int16_graph_is_integer_in_i16(cnn):
    from glowgen import api
    from glowgen.frontend.onnx import CheckedModel, load_model
    model, profile, _, _ = cnn
    checked = CheckedModel(load_model(model))
    fn = api.load(checked)
    api.optimize(fn, stage="optimized", backend="cpu",
                 quantization=api.quantization_options(checked, profile, precision="int16"))
    ops = [n.OP for n in fn.nodes]
    assert ops.count("QuantizedConv") == 2 and ops.count("QuantizedMatMul") == 1
    assert "Conv" not in ops and "MatMul" not in ops and "Relu" not in ops
    for n in fn.nodes:
        if n.OP in ("QuantizedConv", "QuantizedMatMul"):
            x, w, _, b = n.inputs[:4]
            assert (x.type.dtype, w.type.dtype, b.type.dtype, n.outputs[0].type.dtype) == ("i16", "i16", "i64", "i16")


def test_int16_cpu_equals_interpreter_bit_for_bit(cnn):
    model, profile, tests, _ = cnn
    cpu = glowgen.compile(model, quantize=profile, precision="int16")
    ref = glowgen.compile(model, backend="interpreter", quantize=profile, precision="int16")
    for s in tests:
        np.testing.assert_array_equal(cpu.run(s)["y"], ref.run(s)["y"])


def test_int8_is_still_the_default(cnn):
    model, profile, tests, _ = cnn
    default = glowgen.compile(model, quantize=profile)
    int8 = glowgen.compile(model, quantize=profile, precision="int8")
    for s in tests[:2]:
        np.testing.assert_array_equal(default.run(s)["y"], int8.run(s)["y"])


def _digits():
    from test_quantization import _digits as digits
    return digits()


@pytest.mark.parametrize("schema", ["asymmetric", "symmetric", "symmetric_power2"])
def test_digits_int16_matches_float(schema):
    model, data = _digits()
    calib = [{"input": data["calib_x"][i:i + 1]} for i in range(100)]
    profile = glowgen.profile(model, calib, input_shapes={"input": (1, 1, 8, 8)})
    x = data["test_x"][:256]
    shapes = {"input": x.shape}
    reference = run_ort(onnx.load(model), {"input": x})["logits"]
    got = {}
    for backend in ("cpu", "interpreter"):
        q = glowgen.compile(model, backend=backend, input_shapes=shapes, quantize=profile, schema=schema,
                            precision="int16")
        got[backend] = q.run({"input": x})["logits"]
    # The average pooling between the integer convolutions and products runs in float, in
    # each backend's own order of summation: a last-bit difference in an average sometimes
    # rounds to the neighbouring i16 step in the Quantize after it (at int16's steps, 256
    # times finer than int8's, now and then rather than almost never).  So: within one
    # step of the logits, and rarely.
    step = choose_params(profile["logits"].min, profile["logits"].max, schema, "i16").scale
    differ = got["cpu"] != got["interpreter"]
    assert differ.mean() < 0.01
    assert np.abs(got["cpu"] - got["interpreter"]).max() <= step * 1.001
    # Per image: the few test images whose activations leave the ranges the 100 calibration
    # images set saturate at either precision (~29 dB); the others are at ~87 dB (int8: ~38).
    per_image = [_sqnr([r], [g]) for r, g in zip(reference, got["cpu"])]
    assert np.median(per_image) >= 60, sorted(per_image)[:5]
    assert (got["cpu"].argmax(1) == reference.argmax(1)).mean() >= 0.99


# ----------------------------------------------------------------------------- kernels
def _compile_text(text, backend, **options):
    registry = Registry.default()
    fn = parse_function(text, registry)
    pipeline.run(fn, registry, pipeline.PIPELINE, backend)
    return CompiledModel(fn, registry, backend, **options)


def _dense(a):
    return "dense<[" + ", ".join(str(v) for v in np.asarray(a).reshape(-1)) + "]>"


@pytest.mark.parametrize("schema", [s for s in SCHEMAS if s != "symmetric_uint8"])
@pytest.mark.parametrize("lo,hi", [(-1.0, 3.0), (0.0, 6.0), (-5.0, -1.0), (-1e-3, 2e-3)])
@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_int16_quantize_dequantize_within_half_a_step(schema, lo, hi, backend):
    q = choose_params(lo, hi, schema, "i16")
    x = np.concatenate([rng.uniform(lo, hi, 4093), [lo, hi, 0.0]]).astype(np.float32)
    text = f"""graph rt {{
  input %x: f32[{x.size}]
  %q = Quantize(%x) {{scale = {q.scale!r}, offset = {q.offset}, dtype = "i16"}} : i16[{x.size}] q({q.scale!r}, {q.offset})
  %y = Dequantize(%q) {{in_scale = {q.scale!r}, in_offset = {q.offset}}} : f32[{x.size}]
  output "q" = %q
  output "y" = %y
}}"""
    out = _compile_text(text, backend).run({"x": x})
    # The integers as the definition says: round half to even, offset, saturate to i16.
    want = np.clip(np.rint(x / np.float32(q.scale)) + q.offset, -32768, 32767)
    np.testing.assert_array_equal(out["q"], want.astype(np.int16))
    tol = q.scale / 2 * (1 + 1e-5) + 2 * np.spacing(np.float32(max(-lo, hi)))
    assert np.abs(out["y"] - x).max() <= tol
    assert out["q"][-1] == q.offset and out["y"][-1] == 0.0


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_int16_conv_sums_beyond_i32_exactly(backend):
    """Full-scale i16 inputs and weights: sums of 2^34, far past i32; the integer product and
    its requantization written out here with NumPy's int64."""
    n, c, h, w_, m, k = 1, 16, 5, 5, 4, 3
    x = rng.integers(-32768, 32768, (n, c, h, w_)).astype(np.int16)
    x[0, :, 2, 2] = 32767                               # one window of the largest sums
    w = rng.integers(-32767, 32768, (m, c, k, k)).astype(np.int16)
    w[0] = 32767
    ws = (rng.random(m) * 1e-4 + 1e-5).astype(np.float32)
    b = rng.integers(-2 ** 40, 2 ** 40, m).astype(np.int64)
    xs, xo, ys, yo = 1e-4, -3, 3.0, 7
    text = f"""graph qc {{
  input %x: i16[{n}, {c}, {h}, {w_}] q({xs}, {xo})
  const %w: i16[{m}, {c}, {k}, {k}] = {_dense(w)}
  const %ws: f32[{m}] = {_dense(ws)}
  const %b: i64[{m}] = {_dense(b)}
  %y = QuantizedConv(%x, %w, %ws, %b) {{pads = [1, 1, 1, 1], scale = {ys}, offset = {yo}}} : i16[{n}, {m}, {h}, {w_}] q({ys}, {yo})
  output "y" = %y
}}"""
    got = _compile_text(text, backend).run({"x": x})["y"]
    xp = np.pad(x.astype(np.int64) - xo, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((n, m, h, w_), np.int64)
    for i in range(k):
        for j in range(k):
            acc += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + h, j:j + w_], w[:, :, i, j].astype(np.int64))
    acc += b.reshape(1, m, 1, 1)
    assert np.abs(acc).max() > 2 ** 33
    mult = (np.float64(xs) * ws.astype(np.float64) / np.float64(ys)).reshape(1, m, 1, 1)
    want = np.clip(np.rint(acc.astype(np.float64) * mult) + yo, -32768, 32767).astype(np.int16)
    np.testing.assert_array_equal(got, want)


def test_int16_products_split_among_threads_bit_for_bit():
    """Enough work to split (shares of the filters, of the product's columns): 1 and 2
    threads give the interpreter's integers."""
    c, h, m, n = 16, 24, 32, 96
    x = rng.integers(-32768, 32768, (1, c, h, h)).astype(np.int16)
    w = rng.integers(-32767, 32768, (m, c, 3, 3)).astype(np.int16)
    w2 = rng.integers(-32767, 32768, (h, n)).astype(np.int16)
    text = f"""graph qt {{
  input %x: i16[1, {c}, {h}, {h}] q(0.001, 12)
  const %w: i16[{m}, {c}, 3, 3] = {_dense(w)}
  const %ws: f32[{m}] = {_dense(np.full(m, 3e-5, np.float32))}
  const %b: i64[{m}] = {_dense(np.arange(m) * 1000)}
  const %w2: i16[{h}, {n}] = {_dense(w2)}
  const %ws2: f32[{n}] = {_dense(np.full(n, 2e-5, np.float32))}
  const %b2: i64[{n}] = {_dense(np.zeros(n, np.int64))}
  %c = QuantizedConv(%x, %w, %ws, %b) {{pads = [1, 1, 1, 1], scale = 2.0, offset = -5}} : i16[1, {m}, {h}, {h}] q(2.0, -5)
  %y = QuantizedMatMul(%c, %w2, %ws2, %b2) {{scale = 0.5, offset = 3}} : i16[1, {m}, {h}, {n}] q(0.5, 3)
  output "y" = %y
}}"""
    want = _compile_text(text, "interpreter").run({"x": x})["y"]
    assert np.unique(want).size > 1000
    for threads in (1, 2):
        np.testing.assert_array_equal(_compile_text(text, "cpu", threads=threads).run({"x": x})["y"], want)


# ----------------------------------------------------------------------------- errors
def test_bad_precisions_are_refused_clearly(cnn):
    model, profile, _, _ = cnn
    with pytest.raises(GlowgenError, match="unknown quantization precision 'int4'.*int8, int16"):
        glowgen.compile(model, quantize=profile, precision="int4")
    with pytest.raises(GlowgenError, match="symmetric_uint8 .* no meaning at precision int16"):
        glowgen.compile(model, quantize=profile, precision="int16", schema="symmetric_uint8")
    with pytest.raises(GlowgenError, match="give quantize= a profile"):
        glowgen.compile(model, precision="int16")


# ----------------------------------------------------------------------------- command line
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "glowgen.cli", *map(str, args)],
                          capture_output=True, text=True)


def test_cli_precision_int16(tmp_path, cnn):
    model, profile, _, _ = cnn
    onnx.save(model, tmp_path / "m.onnx")
    profile.save(tmp_path / "p.json")
    m, p = tmp_path / "m.onnx", tmp_path / "p.json"
    r = _cli("dump", m, "--stage", "optimized", "--quantize", p, "--precision", "int16")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "QuantizedConv(" in ln or "QuantizedMatMul(" in ln]
    assert len(lines) == 3 and all(": i16[" in ln and " q(" in ln for ln in lines), r.stdout
    assert "i8[" not in r.stdout
    r = _cli("run", m, "--quantize", p, "--precision", "int16")
    assert r.returncode == 0 and "y: shape=[1, 10]" in r.stdout, r.stderr
    for args, message in ((("--quantize", p, "--precision", "int4"), "unknown quantization precision 'int4'"),
                          (("--quantize", p, "--precision", "int16", "--schema", "symmetric_uint8"),
                           "no meaning at precision int16"),
                          (("--precision", "int16"), "add --quantize")):
        r = _cli("run", m, *args)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _cli("run", "--help")
    assert "--precision" in r.stdout and "int16" in r.stdout
