#!/usr/bin/env python3
"""How a Loop with a scan output and a Scan scale with their number of iterations: compile
time and latency of glowgen (cpu backend) and onnxruntime side by side, per iteration count.

    python tools/bench_loops.py [--iterations 1000 2000] [--width 4096] [--runs 20] [--threads 1]
                                [--rnn-widths 64 256 1024] [--only-rnn]

The Loop's trip count is a model input (glowgen.compile specializes per trip count, since
the scan output's length is the trip count: the first call with a count compiles its
variant, timed as "compile"); the Scan's length is its input's first dimension (one model
per length).  The body: s <- tanh(s * w + x) and a scan output 2 * s (Loop), s <- tanh(s +
x_t) and y_t = s * x_t (Scan), on vectors of `--width` floats; with `--rnn-widths`, Scans
whose body is an RNN's, h <- tanh(h @ W + x_t) and h <- (h + tanh(h @ W + x_t)) / 2.  Latency is the median of
`--runs` calls of the best of three rounds, the runners taking turns, so that a neighbour's
load on a shared machine falls on both alike.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import glowgen

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def loop_model(n: int):
    body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "w"], ["a"]),
         helper.make_node("Add", ["a", "x"], ["b"]),
         helper.make_node("Tanh", ["b"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "two"], ["scan"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [_vi("i", I64, []), _vi("c_in", BOOL, []), _vi("s_in", F, [n])],
        [_vi("c_out", BOOL, []), _vi("s_out", F, [n]), _vi("scan", F, [n])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["y", "ys"], body=body)], "loop",
        [_vi("x", F, [n]), _vi("M", I64, [])], [_vi("y", F, [n]), _vi("ys", F, [None, n])],
        [numpy_helper.from_array(np.full(n, 0.9, np.float32), "w"),
         numpy_helper.from_array(np.array(2, np.float32), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def scan_model(length: int, n: int):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["a"]),
         helper.make_node("Tanh", ["a"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])], "body",
        [_vi("s_in", F, [n]), _vi("x_t", F, [n])], [_vi("s_out", F, [n]), _vi("y_t", F, [n])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)], "scan",
        [_vi("s0", F, [n]), _vi("xs", F, [length, n])], [_vi("s", F, [n]), _vi("ys", F, [length, n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rnn_model(length: int, n: int, leaky: bool):
    """A Scan over `length` steps of h <- tanh(h @ W + x_t) (`leaky`: h <- h - (h - tanh(...))
    / 2, whose last op reads the old state while it writes the new one), h of [1, n]."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["h_in", "W"], ["r"]),
             helper.make_node("Add", ["r", "x_t"], ["a"]),
             helper.make_node("Tanh", ["a"], ["t" if leaky else "h_out"])]
    if leaky:
        nodes += [helper.make_node("Sub", ["h_in", "t"], ["d"]),
                  helper.make_node("Mul", ["d", "half"], ["e"]),
                  helper.make_node("Sub", ["h_in", "e"], ["h_out"])]
    body = helper.make_graph(nodes, "body", [_vi("h_in", F, [1, n]), _vi("x_t", F, [1, n])],
                             [_vi("h_out", F, [1, n])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["h0", "xs"], ["h"], body=body, num_scan_inputs=1)], "rnn",
        [_vi("h0", F, [1, n]), _vi("xs", F, [length, 1, n])], [_vi("h", F, [1, n])],
        [numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), "W"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _median_best(calls: dict, runs: int) -> dict:
    best = {name: float("inf") for name in calls}
    for _ in range(3):
        for name, call in calls.items():
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            best[name] = min(best[name], statistics.median(times))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rnn-widths", type=int, nargs="*", default=[],
                    help="also RNN-like Scans (rnn_model) of these state widths, plain and leaky")
    ap.add_argument("--only-rnn", action="store_true", help="only the RNN-like Scans")
    args = ap.parse_args()
    n, rng = args.width, np.random.default_rng(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    print(f"width {n}, {args.threads} thread(s); latency: median of {args.runs} calls, best of 3 rounds")
    print(f"{'model':<6} {'iterations':>10} {'compile s':>10} {'glowgen ms':>11} {'ort ms':>9} "
          f"{'glowgen us/iter':>16} {'ort/glowgen':>12}")
    onnx_loop = loop_model(n)
    specialized = glowgen.compile(onnx_loop, threads=args.threads)
    loop_session = ort.InferenceSession(onnx_loop.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])
    for kind in () if args.only_rnn else ("Loop", "Scan"):
        for count in args.iterations:
            if kind == "Loop":
                feeds = {"x": rng.standard_normal(n).astype(np.float32), "M": np.array(count, np.int64)}
                model, session = specialized, loop_session
                start = time.perf_counter()
                model.run(feeds)                       # compiles the variant for this count
            else:
                onnx_scan = scan_model(count, n)
                feeds = {"s0": rng.standard_normal(n).astype(np.float32),
                         "xs": rng.standard_normal((count, n)).astype(np.float32)}
                start = time.perf_counter()
                model = glowgen.compile(onnx_scan, threads=args.threads)
                session = ort.InferenceSession(onnx_scan.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
            compiled = time.perf_counter() - start
            got, want = model.run(feeds), session.run(None, feeds)
            for name, ref in zip(model.output_names, want):
                np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
            t = _median_best({"glowgen": lambda: model.run(feeds),
                              "ort": lambda: session.run(None, feeds)}, args.runs)
            print(f"{kind:<6} {count:>10} {compiled:>10.2f} {1e3 * t['glowgen']:>11.3f} "
                  f"{1e3 * t['ort']:>9.3f} {1e6 * t['glowgen'] / count:>16.2f} "
                  f"{t['ort'] / t['glowgen']:>12.2f}")
    for width in args.rnn_widths:
        for leaky in (False, True):
            for count in args.iterations:
                onnx_rnn = rnn_model(count, width, leaky)
                feeds = {"h0": rng.standard_normal((1, width)).astype(np.float32),
                         "xs": rng.standard_normal((count, 1, width)).astype(np.float32)}
                start = time.perf_counter()
                model = glowgen.compile(onnx_rnn, threads=args.threads)
                compiled = time.perf_counter() - start
                session = ort.InferenceSession(onnx_rnn.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
                np.testing.assert_allclose(model.run(feeds)["h"], session.run(None, feeds)[0],
                                           rtol=1e-4, atol=1e-5)
                t = _median_best({"glowgen": lambda: model.run(feeds),
                                  "ort": lambda: session.run(None, feeds)}, args.runs)
                name = f"{'leaky' if leaky else ''}rnn{width}"
                print(f"{name:<10} {count:>6} {compiled:>10.2f} {1e3 * t['glowgen']:>11.3f} "
                      f"{1e3 * t['ort']:>9.3f} {1e6 * t['glowgen'] / count:>16.2f} "
                      f"{t['ort'] / t['glowgen']:>12.2f}")


if __name__ == "__main__":
    main()
