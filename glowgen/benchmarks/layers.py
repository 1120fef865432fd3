"""`glowgen bench --layers`: single-op models over a grid of shapes, each run by glowgen and by
onnxruntime side by side, reported as time, GFLOPS, the fraction of the machine's FMA peak
(measured at start) and the ratio to onnxruntime.

The grid covers what the bench and real models use: convolutions (1/3/5/7 kernels, strides
1/2, 8 to 2048 channels, 7 to 640 pixels, depthwise and grouped), transposed convolutions,
resizes, pooling, the bench models' matrix products, elementwise stacks (GELU, HardSwish,
Sigmoid, Exp), Softmax and LayerNorm.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass
class Layer:
    name: str                   # e.g. "conv 3x3/1 64->64 @56"
    kind: str                   # conv, conv_transpose, matmul, resize, pool, elementwise, ...
    build: Callable[[], tuple[onnx.ModelProto, dict]]
    mflop: float = 0.0          # multiply-adds x 2, for products; 0 where it does not apply


@dataclass
class Row:
    name: str
    kind: str
    mflop: float
    glowgen_ms: float
    onnxruntime_ms: float
    ratio: float
    gflops: float = 0.0
    peak_fraction: float = 0.0
    error: str = ""
    notes: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- model builders
def _model(nodes, inputs: dict, initializers: dict, outputs: list[str], opset: int = 17):
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    inits = [numpy_helper.from_array(v, k) for k, v in initializers.items()]
    graph = helper.make_graph(nodes, "layer", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model), inputs


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def conv(cin, cout, size, k, stride=1, group=1, pad=None, name=None) -> Layer:
    pad = k // 2 if pad is None else pad
    out = (size + 2 * pad - k) // stride + 1
    mflop = 2 * cout * out * out * (cin // group) * k * k / 1e6
    kind = "depthwise" if group == cin == cout else ("grouped" if group > 1 else "")
    label = name or f"conv {k}x{k}/{stride} {cin}->{cout} @{size}" + (f" {kind}" if kind else "")

    def build():
        rng = np.random.default_rng(0)
        w = _rand(rng, cout, cin // group, k, k, scale=1 / math.sqrt(cin // group * k * k))
        b = _rand(rng, cout, scale=0.1)
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
                                pads=[pad] * 4, group=group)
        return _model([node], {"x": _rand(rng, 1, cin, size, size)}, {"w": w, "b": b}, ["y"])
    return Layer(label, "conv", build, mflop)


def conv_transpose(cin, cout, size, k, stride=2, pad=0, out_pad=0) -> Layer:
    mflop = 2 * cin * size * size * cout * k * k / 1e6

    def build():
        rng = np.random.default_rng(0)
        w = _rand(rng, cin, cout, k, k, scale=1 / math.sqrt(cin * k * k))
        b = _rand(rng, cout, scale=0.1)
        node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[k, k],
                                strides=[stride] * 2, pads=[pad] * 4, output_padding=[out_pad] * 2)
        return _model([node], {"x": _rand(rng, 1, cin, size, size)}, {"w": w, "b": b}, ["y"])
    return Layer(f"convT {k}x{k}/{stride} {cin}->{cout} @{size}", "conv_transpose", build, mflop)


def matmul(m, k, n, batch=None, label="") -> Layer:
    mflop = 2 * m * k * n * (batch or 1) / 1e6

    def build():
        rng = np.random.default_rng(0)
        if batch:        # both operands are activations (attention scores)
            a, b = _rand(rng, batch, m, k), _rand(rng, batch, k, n)
            return _model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, {}, ["y"])
        w = _rand(rng, k, n, scale=1 / math.sqrt(k))
        bias = _rand(rng, n, scale=0.1)
        node = helper.make_node("Gemm", ["a", "w", "bias"], ["y"])
        return _model([node], {"a": _rand(rng, m, k)}, {"w": w, "bias": bias}, ["y"])
    shape = f"[{batch}x]{m}x{k} @ {k}x{n}" if batch else f"{m}x{k} @ {k}x{n}"
    return Layer(f"matmul {shape}" + (f" ({label})" if label else ""), "matmul", build, mflop)


def resize(c, size, mode) -> Layer:
    def build():
        rng = np.random.default_rng(0)
        scales = np.array([1, 1, 2, 2], np.float32)
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode)
        return _model([node], {"x": _rand(rng, 1, c, size, size)}, {"scales": scales}, ["y"])
    return Layer(f"resize {mode} x2 {c}@{size}", "resize", build)


def pool(op, c, size, k, stride, pad=0) -> Layer:
    def build():
        rng = np.random.default_rng(0)
        if op == "GlobalAveragePool":
            node = helper.make_node(op, ["x"], ["y"])
        else:
            node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4)
        return _model([node], {"x": _rand(rng, 1, c, size, size)}, {}, ["y"])
    label = f"{op} {c}@{size}" if op == "GlobalAveragePool" else f"{op} {k}x{k}/{stride} {c}@{size}"
    return Layer(label, "pool", build)


def elementwise(kind, shape) -> Layer:
    def build():
        rng = np.random.default_rng(0)
        x = _rand(rng, *shape)
        if kind == "gelu":
            consts = {"s": np.array(1 / math.sqrt(2), np.float32), "one": np.array(1, np.float32),
                      "half": np.array(0.5, np.float32)}
            nodes = [helper.make_node("Mul", ["x", "s"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
                     helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["q"]),
                     helper.make_node("Mul", ["q", "half"], ["y"])]
            return _model(nodes, {"x": x}, consts, ["y"])
        op = {"hardswish": "HardSwish", "sigmoid": "Sigmoid", "exp": "Exp"}[kind]
        return _model([helper.make_node(op, ["x"], ["y"])], {"x": x}, {}, ["y"], opset=17)
    return Layer(f"{kind} {'x'.join(map(str, shape))}", "elementwise", build)


def softmax(shape) -> Layer:
    def build():
        rng = np.random.default_rng(0)
        return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": _rand(rng, *shape)}, {}, ["y"])
    return Layer(f"softmax {'x'.join(map(str, shape))}", "softmax", build)


def layer_norm(rows, width) -> Layer:
    def build():
        rng = np.random.default_rng(0)
        node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)
        return _model([node], {"x": _rand(rng, rows, width)},
                      {"g": _rand(rng, width), "b": _rand(rng, width)}, ["y"])
    return Layer(f"layernorm {rows}x{width}", "layernorm", build)


def grid() -> list[Layer]:
    return [
        # ResNet
        conv(3, 64, 224, 7, 2), conv(64, 64, 56, 3), conv(64, 256, 56, 1), conv(256, 64, 56, 1),
        conv(64, 128, 56, 3, 2), conv(128, 128, 28, 3), conv(256, 256, 14, 3), conv(512, 512, 7, 3),
        conv(1024, 256, 14, 1), conv(512, 2048, 7, 1), conv(256, 512, 28, 1, 2, pad=0),
        # MobileNetV2
        conv(3, 32, 224, 3, 2), conv(32, 32, 112, 3, group=32), conv(96, 96, 112, 3, 2, group=96),
        conv(144, 144, 56, 3, group=144), conv(576, 576, 14, 3, group=576), conv(960, 960, 7, 3, group=960),
        conv(32, 16, 112, 1), conv(96, 24, 56, 1), conv(320, 1280, 7, 1),
        # kernels 5, grouped, few channels at high resolution (text detectors)
        conv(240, 240, 28, 5, group=240), conv(32, 32, 112, 5), conv(128, 128, 28, 3, group=4),
        conv(64, 64, 56, 3, group=8), conv(3, 16, 640, 3, 2), conv(16, 16, 320, 3), conv(24, 24, 160, 3),
        conv(8, 8, 320, 5), conv(24, 96, 160, 1), conv(96, 24, 160, 1),
        # transposed convolutions
        conv_transpose(24, 24, 160, 2), conv_transpose(64, 32, 40, 2), conv_transpose(32, 16, 80, 4, pad=1),
        conv_transpose(64, 64, 28, 3, pad=1, out_pad=1),
        # resize and pooling
        resize(64, 80, "nearest"), resize(24, 160, "nearest"), resize(64, 80, "linear"),
        pool("MaxPool", 64, 112, 3, 2, 1), pool("AveragePool", 64, 56, 2, 2),
        pool("GlobalAveragePool", 2048, 7, 7, 1),
        # matrix products of the bench models
        matmul(1, 2048, 1000, label="resnet fc"), matmul(1, 784, 512, label="mlp"),
        matmul(128, 256, 256, label="bert proj"), matmul(128, 256, 1024, label="bert ffn"),
        matmul(128, 1024, 256, label="bert ffn out"), matmul(128, 64, 128, batch=4, label="attention"),
        # elementwise stacks, softmax, layer norm
        elementwise("gelu", (1, 96, 160, 160)), elementwise("hardswish", (1, 16, 320, 320)),
        elementwise("sigmoid", (1, 64, 160, 160)), elementwise("exp", (1, 64, 160, 160)),
        softmax((4, 128, 128)), layer_norm(128, 256),
    ]


# --------------------------------------------------------------------------- measuring
def _time(fn, budget: float, min_runs: int = 5) -> float:
    """Median seconds of `fn` over about `budget` seconds (after a short warm-up)."""
    t_end = time.perf_counter() + budget / 4
    for _ in range(3):
        fn()
    while time.perf_counter() < t_end:
        fn()
    times = []
    t_end = time.perf_counter() + budget
    while len(times) < min_runs or (time.perf_counter() < t_end and len(times) < 2000):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_layer(layer: Layer, peak_gflops: float, threads: int, budget: float,
              compile_options: Optional[dict] = None) -> Row:
    import onnxruntime as ort
    import glowgen
    model, feeds = layer.build()
    try:
        compiled = glowgen.compile(model, **{"threads": threads, **(compile_options or {})})
    except glowgen.GlowgenError as e:
        return Row(layer.name, layer.kind, layer.mflop, float("nan"), float("nan"), float("nan"),
                   error=str(e).splitlines()[0])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    g = _time(lambda: compiled.run(feeds), budget)
    o = _time(lambda: session.run(None, feeds), budget)
    row = Row(layer.name, layer.kind, layer.mflop, g * 1e3, o * 1e3, g / o)
    if layer.mflop:
        row.gflops = layer.mflop / 1e3 / g
        row.peak_fraction = row.gflops / (peak_gflops * threads)
    return row


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()


def run(filter_re: Optional[str] = None, threads: int = 1, budget: float = 0.3,
        json_path: Optional[str] = None, out=sys.stdout, compile_options: Optional[dict] = None) -> list[Row]:
    from ..backends.cpu.peak import fma_peak_gflops, vector_width
    from ..backends.cpu.target import resolve_cpu
    # The peak of the instructions the code may use: the target's (cpu=, $GLOWGEN_CPU).
    features = resolve_cpu((compile_options or {}).get("cpu")).features
    peak = fma_peak_gflops(features)
    layers = [layer for layer in grid() if not filter_re or re.search(filter_re, layer.name)]
    cpu = _cpu_name()
    print(f"machine      {cpu}, {vector_width(features) * 32}-bit FMA peak {peak:.0f} GFLOPS per core "
          f"(measured)", file=out)
    print(f"threads      {threads} (glowgen and onnxruntime); median over ~{budget:g} s per engine "
          f"and layer", file=out)
    rows = []
    for k, layer in enumerate(layers):
        _progress(f"[{k + 1}/{len(layers)}] {layer.name}")
        rows.append(run_layer(layer, peak, threads, budget, compile_options))
    _progress("")
    print(format_table(rows), file=out)
    print(summary(rows), file=out)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": cpu, "peak_gflops": peak, "threads": threads,
                       "layers": [asdict(r) for r in rows]}, f, indent=1)
    return rows


def format_table(rows: list[Row]) -> str:
    head = ("layer", "MFLOP", "glowgen ms", "GFLOPS", "of peak", "onnxruntime ms", "ratio")
    body = []
    for r in rows:
        if r.error:
            body.append((r.name, f"{r.mflop:.0f}" if r.mflop else "", "error: " + r.error[:60], "", "", "", ""))
            continue
        body.append((r.name, f"{r.mflop:.0f}" if r.mflop else "", f"{r.glowgen_ms:.3f}",
                     f"{r.gflops:.0f}" if r.mflop else "", f"{r.peak_fraction:.0%}" if r.mflop else "",
                     f"{r.onnxruntime_ms:.3f}", f"{r.ratio:.2f}"))
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(str(v).ljust(widths[0]) if i == 0 else str(v).rjust(widths[i])  # noqa: E731
                               for i, v in enumerate(r))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in body])


def summary(rows: list[Row]) -> str:
    ok = [r for r in rows if not r.error]
    if not ok:
        return "no layer ran"
    geo = math.exp(sum(math.log(r.ratio) for r in ok) / len(ok))
    worst = max(ok, key=lambda r: r.ratio)
    heavy = [r for r in ok if r.kind in ("conv", "conv_transpose", "matmul") and r.mflop >= 50]
    low = [r for r in heavy if r.peak_fraction < 0.6]
    lines = [f"{len(ok)} layers: geometric mean ratio {geo:.2f}, worst {worst.ratio:.2f} ({worst.name}), "
             f"{sum(r.ratio > 1.25 for r in ok)} above 1.25",
             f"products of at least 50 MFLOP: {len(heavy) - len(low)} of {len(heavy)} reach 60% of peak"
             + (f"; below: {', '.join(f'{r.name} ({r.peak_fraction:.0%})' for r in low)}" if low else "")]
    if any(r.mflop and r.peak_fraction > 1 for r in ok):
        lines.append("GFLOPS count a direct computation's multiply-adds: above 100% of peak, the kernel "
                     "does fewer (Winograd's F(4x4, 3x3) a quarter of them, F(2x2, 3x3) 4/9)")
    errors = [r for r in rows if r.error]
    if errors:
        lines.append(f"{len(errors)} layers failed to compile: {', '.join(r.name for r in errors)}")
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()
