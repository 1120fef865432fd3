"""The nine `light` models of ONNX's backend test data, with the input ONNX's own runner uses
(arange(n)/n): optimized, against the expected outputs shipped beside them, onnxruntime, and
the same model only lowered."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner

import glowgen
from conftest import ONNX_DATA, run_ort

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512"]


# The largest models on the cpu backend only, against their shipped outputs and onnxruntime:
# their interpreter runs took 35 s of the suite, optimized, and 25 s only lowered.
LARGE = {"bvlc_alexnet", "densenet121", "vgg19", "zfnet512"}


# The slowest compiles (16-42 s each on a 2-core Zen 3; DenseNet-121's 121 convolutions are
# 305k LLVM instructions) run with `-m slow`, which .ci/run adds after the README's command:
# the five took a minute of a suite that must stay under ten.
SLOW = {"densenet121", "inception_v1", "inception_v2", "resnet50", "vgg19"}


def _cases():
    for name in LIGHT:
        for backend in ("interpreter", "cpu"):
            if backend == "interpreter" and name in LARGE:
                continue
            marks = [pytest.mark.slow] if backend == "cpu" and name in SLOW else []
            yield pytest.param(name, backend, marks=marks, id=f"{name}-{backend}")


@pytest.mark.parametrize("name, backend", list(_cases()))
def test_light_model_matches_shipped_output(name, backend):
    path = ONNX_DATA / "light" / f"light_{name}.onnx"
    proto = onnx.load(path)
    inits = {i.name for i in proto.graph.initializer}
    feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=name, random=False)
             for x in proto.graph.input if x.name not in inits}
    model = glowgen.compile(path, backend=backend)
    outputs = model.run(feeds)
    expected = numpy_helper.to_array(onnx.load_tensor(str(ONNX_DATA / "light" / f"light_{name}_output_0.pb")))
    (actual,) = outputs.values()
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-5)
    (ort,) = run_ort(proto, feeds).values()
    np.testing.assert_allclose(actual, ort, rtol=1e-3, atol=1e-5, err_msg="against onnxruntime")
    if name in LARGE:      # their lowered graphs in NumPy took 25 s of the suite; the others check it
        return
    (unoptimized,) = glowgen.compile(path, optimize=False, backend="interpreter").run(feeds).values()
    np.testing.assert_allclose(actual, unoptimized, rtol=1e-4, atol=1e-6, err_msg="optimized vs only lowered")


def test_light_models_lower_to_what_the_backend_implements():
    model = glowgen.compile(ONNX_DATA / "light" / "light_inception_v2.onnx", backend="interpreter")
    from glowgen import pipeline
    implemented = pipeline.backend_ops("interpreter", model.registry)
    assert all(n.OP in implemented for n in model.function.nodes)
    ops = {n.OP for n in model.function.nodes}
    assert "BatchNormalization" not in ops and "Softmax" not in ops and "Gemm" not in ops
