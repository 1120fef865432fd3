"""Property: on random small graphs of elementwise ops, Transpose, Reshape, MatMul and
constants (zeros and ones among them, so identities fire), the optimized graph computes what
onnxruntime computes on the original."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

import glowgen
from conftest import assert_close, make_model, run_ort

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]


class _GraphBuilder:
    """Draws one ONNX graph step by step; `values` holds (name, shape) of what exists."""

    def __init__(self, draw):
        self.draw = draw
        self.nodes, self.consts, self.values = [], {}, []
        self.rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{len(self.nodes) + len(self.consts)}"

    def const(self, shape, kind=None) -> str:
        kind = kind or self.draw(st.sampled_from(["random", "random", "zero", "one"]))
        if kind == "zero":
            data = np.zeros(shape, np.float32)
        elif kind == "one":
            data = np.ones(shape, np.float32)
        elif kind == "divisor":
            data = (self.rng.uniform(0.5, 2.0, shape) * self.rng.choice([-1, 1], shape)).astype(np.float32)
        else:
            data = self.rng.uniform(-1.5, 1.5, shape).astype(np.float32)
        name = self.fresh("c")
        self.consts[name] = data
        return name

    def emit(self, op, inputs, shape, **attrs):
        name = self.fresh("v")
        self.nodes.append(helper.make_node(op, inputs, [name], **attrs))
        self.values.append((name, tuple(shape)))
        return name

    def operand_shape(self, shape):
        """A shape that broadcasts against `shape`: all of it, its last dimension, or a scalar."""
        choice = self.draw(st.sampled_from(["full", "last", "scalar"]))
        return {"full": shape, "last": shape[-1:], "scalar": ()}[choice]

    def step(self):
        name, shape = self.draw(st.sampled_from(self.values))
        kind = self.draw(st.sampled_from(["unary", "binary", "binary", "transpose", "transpose",
                                          "reshape", "matmul"]))
        if kind == "unary":
            self.emit(self.draw(st.sampled_from(UNARY)), [name], shape)
        elif kind == "binary":
            op = self.draw(st.sampled_from(BINARY))
            same = [n for n, s in self.values if s == shape and n != name]
            if op != "Div" and same and self.draw(st.booleans()):
                other = self.draw(st.sampled_from(same))
            else:
                other = self.const(self.operand_shape(shape), "divisor" if op == "Div" else None)
            operands = [name, other] if op in ("Sub", "Div") or self.draw(st.booleans()) else [other, name]
            self.emit(op, operands, shape)
        elif kind == "transpose":
            perm = self.draw(st.permutations(range(len(shape))))
            self.emit("Transpose", [name], [shape[p] for p in perm], perm=list(perm))
        elif kind == "reshape":
            target = self.draw(st.sampled_from(_reshapes(shape)))
            self.emit("Reshape", [name, self.const_ints(target)], target)
        else:
            k = self.draw(st.integers(1, 4))
            self.emit("MatMul", [name, self.const((shape[-1], k))], tuple(shape[:-1]) + (k,))

    def const_ints(self, values) -> str:
        name = self.fresh("s")
        self.consts[name] = np.array(values, np.int64)
        return name


def _reshapes(shape):
    """Targets with as many elements: reversed, flattened, one dimension split or merged."""
    out = [tuple(reversed(shape)), (math.prod(shape),)]
    if len(shape) >= 2:
        out.append((shape[0] * shape[1],) + tuple(shape[2:]))
    for i, d in enumerate(shape):
        if d % 2 == 0 and len(shape) < 4:
            out.append(tuple(shape[:i]) + (2, d // 2) + tuple(shape[i + 1:]))
    return out


@st.composite
def graphs(draw):
    b = _GraphBuilder(draw)
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=3)))
    feeds = {"x": b.rng.uniform(-2, 2, shape).astype(np.float32)}
    b.values.append(("x", shape))
    for _ in range(draw(st.integers(1, 10))):
        b.step()
    outputs = [b.values[-1][0]]
    if len(b.values) > 2 and draw(st.booleans()):
        extra = draw(st.sampled_from(b.values[1:-1]))[0]
        outputs.append(extra)
    return make_model(b.nodes, feeds, outputs, b.consts), feeds


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(graphs())
def test_optimized_random_graph_matches_onnxruntime(case):
    model, feeds = case
    expected = run_ort(model, feeds)
    actual = glowgen.compile(model, backend="interpreter").run(feeds)
    assert_close(actual, expected, rtol=1e-4, atol=1e-5)
