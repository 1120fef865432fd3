"""`glowgen bench --layers`: the layer grid runs glowgen and onnxruntime side by side and
reports each layer (no timing is asserted: benchmarks print, tests check what they print)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from glowgen.benchmarks.layers import grid


def test_every_layer_of_the_grid_is_a_valid_model_onnxruntime_runs():
    import onnxruntime as ort
    for layer in grid():
        model, feeds = layer.build()
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        assert session.run(None, feeds)[0].size > 0, layer.name


def test_layer_bench_prints_a_table_and_writes_json(tmp_path):
    out = tmp_path / "layers.json"
    run = subprocess.run([sys.executable, "-m", "glowgen.cli", "bench", "--layers", "--filter",
                          "layernorm|matmul 1x784", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "FMA peak" in run.stdout and "geometric mean ratio" in run.stdout
    data = json.loads(out.read_text())
    names = [r["name"] for r in data["layers"]]
    assert names == ["matmul 1x784 @ 784x512 (mlp)", "layernorm 128x256"]
    product = data["layers"][0]
    assert product["mflop"] == 2 * 784 * 512 / 1e6 and product["gflops"] > 0
    assert all(np.isfinite(r["ratio"]) and not r["error"] for r in data["layers"])


def test_layer_bench_refuses_a_model_with_layers():
    run = subprocess.run([sys.executable, "-m", "glowgen.cli", "bench", "--layers", "m.onnx"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "leave MODEL out" in run.stderr and "Traceback" not in run.stderr


def test_layer_summary_explains_more_than_the_peak():
    """A Winograd convolution runs faster than a direct one's multiply-adds at the FMA peak
    allow: the summary says why its row reads more than 100%."""
    from glowgen.benchmarks.layers import Row, summary
    direct = Row("conv 3x3/2 64->128 @56", "conv", 116, 1.07, 1.08, 0.99, 108, 0.92)
    winograd = Row("conv 3x3/1 64->64 @56", "conv", 231, 0.68, 2.31, 0.29, 341, 2.9)
    assert "above 100% of peak" not in summary([direct])
    assert "above 100% of peak" in summary([direct, winograd])
