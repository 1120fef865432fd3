"""Execution contexts: one compiled model called from many threads at once gives every caller
its own answer, bit for bit the single-threaded one, and a steady stream of calls reuses its
contexts.  (ctypes releases the GIL around the native call, so the calls really overlap.)"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import helper

import glowgen

from conftest import REPO, make_model

THREADS, CALLS = 4, 200


def _mlp():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 128)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((128, 10)).astype(np.float32) * 0.1
    b1 = rng.standard_normal(128).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=1)]
    return make_model(nodes, {"x": np.zeros((8, 64), np.float32)}, ["y"], {"w1": w1, "b1": b1, "w2": w2})


def _hammer(model, inputs, calls):
    """Every (thread t, call c) runs inputs[(t * calls + c) % len(inputs)]; their outputs."""
    results = [[None] * calls for _ in range(THREADS)]
    errors = []
    start = threading.Barrier(THREADS)

    def worker(t):
        try:
            start.wait()
            for c in range(calls):
                results[t][c] = model.run(inputs[(t * calls + c) % len(inputs)])
        except Exception as e:           # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    return results


# The interpreter is much slower: fewer calls per thread there.
@pytest.mark.parametrize("backend,source,calls", [("cpu", "mlp", CALLS), ("cpu", "tiny_cnn", CALLS),
                                                  ("interpreter", "mlp", CALLS // 4)])
def test_concurrent_calls_match_the_single_threaded_answers_bit_for_bit(backend, source, calls):
    onnx_model = _mlp() if source == "mlp" else str(REPO / "examples" / "tiny_cnn.onnx")
    model = glowgen.compile(onnx_model, backend=backend)
    rng = np.random.default_rng(1)
    inputs = [{n: rng.standard_normal(t.shape).astype(t.np_dtype) for n, t in model.input_types.items()}
              for _ in range(37)]
    expected = [model.run(feeds) for feeds in inputs]
    results = _hammer(model, inputs, calls)
    for t in range(THREADS):
        for c in range(calls):
            want = expected[(t * calls + c) % len(inputs)]
            for name in want:
                assert np.array_equal(results[t][c][name], want[name]), (t, c, name)
    assert model._runner.contexts.created <= THREADS


def test_a_steady_stream_of_calls_reuses_one_context_and_outputs_never_alias():
    model = glowgen.compile(_mlp())
    x1 = {"x": np.full((8, 64), 0.5, np.float32)}
    x2 = {"x": np.full((8, 64), -0.5, np.float32)}
    first = model.run(x1)["y"]
    kept = first.copy()
    second = model.run(x2)["y"]
    assert first is not second and not np.shares_memory(first, second)
    assert np.array_equal(first, kept), "a later call wrote into an output the caller kept"
    for _ in range(50):
        model.run(x1)
    assert model._runner.contexts.created == 1
