"""The benchmark models of ../shared/bench/make_models.py (exported by
tools/make_bench_models.sh): optimized, against the same model only lowered and against
onnxruntime."""
from __future__ import annotations

import json

import numpy as np
import pytest

import glowgen
from conftest import require_bench_dir, run_ort

import onnx

BENCH = ["resnet50", "resnet18", "mobilenet_v2", "mlp", "tiny_bert", "lenet", "eltwise_chain"]


@pytest.mark.bench_models
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("bn", [False, True], ids=["folded_bn", "keep_bn"])
@pytest.mark.parametrize("name", BENCH)
def test_bench_model_matches_onnxruntime(name, bn, backend):
    if bn and name not in ("resnet50", "resnet18", "mobilenet_v2"):
        pytest.skip("identical to the folded-BN export: only the ResNets and MobileNetV2 keep BN")
    directory = require_bench_dir(bn)
    manifest = json.loads((directory / "manifest.json").read_text())[name]
    path = directory / manifest["file"]
    x = np.random.default_rng(7).standard_normal(manifest["input_shape"]).astype(np.float32)
    feeds = {manifest["input"]: x}
    expected = run_ort(onnx.load(path), feeds)
    actual = glowgen.compile(path, backend=backend).run(feeds)
    if backend == "interpreter":   # the optimizer's check: optimized against only lowered
        unoptimized = glowgen.compile(path, optimize=False).run(feeds)
        for k in expected:
            np.testing.assert_allclose(actual[k], unoptimized[k], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}:{k}: optimized vs only lowered")
    for k in expected:
        np.testing.assert_allclose(actual[k], expected[k], rtol=1e-3, atol=1e-4, err_msg=f"{name}:{k}")
