"""What specialization costs: a LeNet-sized model with a dynamic batch (-1) against the same
model with batch 1 compiled ahead of time, and onnxruntime, side by side in one run.

    .venv/bin/python tools/bench_dynamic.py [--runs 2000] [--rounds 5]

Prints the compile time of each variant and the median latency of a cached call (the
signature lookup + the variant's run) against a plain CompiledModel.  The machine is shared,
so the rounds interleave the engines and the medians of the rounds are reported.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import glowgen


def lenet(batch) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32),
                                       f"w{len(inits)}")
    inits = []
    for shape in ((6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (400, 120), (120,), (120, 84), (84,),
                  (84, 10), (10,)):
        inits.append(w(*shape))
    n = [i.name for i in inits]
    nodes = [helper.make_node("Conv", ["x", n[0], n[1]], ["c1"], pads=[2, 2, 2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", n[2], n[3]], ["c2"]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p2"], ["f"]),
             helper.make_node("Gemm", ["f", n[4], n[5]], ["g1"]), helper.make_node("Relu", ["g1"], ["h1"]),
             helper.make_node("Gemm", ["h1", n[6], n[7]], ["g2"]), helper.make_node("Relu", ["g2"], ["h2"]),
             helper.make_node("Gemm", ["h2", n[8], n[9]], ["y"])]
    graph = helper.make_graph(nodes, "lenet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def median_call(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import onnxruntime as ort
    x = np.random.default_rng(1).standard_normal((1, 1, 28, 28)).astype(np.float32)
    t = time.perf_counter()
    plain = glowgen.compile(lenet(1), threads=1)
    plain_s = time.perf_counter() - t
    dynamic = glowgen.compile(lenet(-1), threads=1)
    for batch in (1, 4, 16):
        dynamic.run({"x": np.repeat(x, batch, axis=0)})
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(lenet(-1).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    print(f"ahead of time (batch 1)      compiled in {plain_s * 1e3:7.1f} ms")
    for v in dynamic.variants:
        print(f"variant {v.describe():20s} compiled in {v.compile_seconds * 1e3:7.1f} ms")
    np.testing.assert_allclose(dynamic.run({"x": x})["y"], plain.run({"x": x})["y"], rtol=1e-5)
    rows = {"CompiledModel (batch 1)": lambda: plain.run({"x": x}),
            "SpecializingModel, cached": lambda: dynamic.run({"x": x}),
            "onnxruntime (batch -1)": lambda: sess.run(None, {"x": x})}
    medians = {k: [] for k in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            medians[name].append(median_call(fn, args.runs))
    base = statistics.median(medians["CompiledModel (batch 1)"])
    for name, ms in medians.items():
        m = statistics.median(ms)
        print(f"{name:28s} {m * 1e6:8.1f} us/call  ({m - base:+.1e} s vs CompiledModel, "
              f"ratio {m / base:.2f})")


if __name__ == "__main__":
    main()
