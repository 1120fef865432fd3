"""Random valid ONNX graphs for differential fuzzing (used by tools/fuzz.py).

A graph is grown one node at a time.  Each op generator picks operands among the values
built so far (preferring the newest, so most graphs are chains) or makes fresh inputs and
initializers, draws attributes from their valid domains, and appends a node; ONNX's strict
shape inference then gives the node's result types, and a node it rejects is dropped and
another op is tried.  So the generators need to know shapes only where an attribute's domain
depends on them (axes, kernel sizes, pads, slice bounds).

Every value carries `wild`: whether it may hold NaN, infinities or huge magnitudes.  Inputs
of ops whose result depends on the order of an accumulation (MatMul, Conv, reductions,
Softmax, normalizations: 1e38 + 1e38 - 1e38 is inf or 1e38 depending on the order) or is
undefined for such values (a float to int Cast of NaN, the argmax of a NaN, sin of 1e30,
whose value depends on the range reduction) must not be wild; everything else takes them,
and that is where the special values (NaN, ±inf, ±0, denormals, 1e30) go in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
I64, I32, BOOL = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.bool_)
FLOATS = (F32, F64, F16)
INTS = (I64, I32)
NUMERIC = FLOATS + INTS

ONNX_OF = {F32: TensorProto.FLOAT, F64: TensorProto.DOUBLE, F16: TensorProto.FLOAT16,
           I64: TensorProto.INT64, I32: TensorProto.INT32, BOOL: TensorProto.BOOL}
NP_OF = {v: k for k, v in ONNX_OF.items()}
MAX_ELEMENTS = 512

# Ops whose results are correctly rounded (or move data): from exact operands any correct
# implementation gives the same bits.  Only exact float values may feed the ops whose result
# jumps with a one-ulp change of the operand (comparisons, Floor, casts to int, ArgMax...):
# otherwise the two engines' legitimate rounding differences show up as wrong answers.
EXACT_OPS = {"Abs", "Neg", "Relu", "Max", "Min", "Where", "Clip", "Transpose", "Reshape", "Flatten",
             "Squeeze", "Unsqueeze", "Slice", "Gather", "GatherElements", "Concat", "Split", "Pad",
             "Tile", "Expand", "Identity", "Cast", "Equal", "Less", "Greater", "LessOrEqual",
             "GreaterOrEqual", "And", "Or", "Xor", "Not", "Add", "Sub", "Mul", "Div", "Sqrt",
             "Floor", "Ceil", "Round", "Sign", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin",
             "ArgMax", "ArgMin", "TopK", "Hardmax", "Shape", "Size", "EyeLike", "Trilu", "IsNaN",
             "IsInf", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "OneHot",
             "DepthToSpace", "SpaceToDepth", "ThresholdedRelu"}


@dataclass
class Value:
    name: str
    dtype: np.dtype
    shape: tuple
    wild: bool          # may hold NaN, inf or huge values
    exact: bool = True  # computed exactly (bit for bit the same by any correct implementation)


@dataclass
class Source:
    """A graph input or initializer: its data is drawn by `make_data`."""
    value: Value
    initializer: bool
    positive: bool = False     # strictly positive data (divisors of integer Div / Mod)
    data: np.ndarray | None = None


class Rejected(Exception):
    """This op cannot be built on the values at hand: try another."""


@dataclass
class Builder:
    rng: np.random.Generator
    opset: int
    values: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    consts: list = field(default_factory=list)      # attribute-like initializers (axes, shapes)
    counter: int = 0

    # ---- names, operands, sources
    def name(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def chance(self, p):
        return self.rng.random() < p

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def pick(self, ok=lambda v: True, fresh=None, p_fresh=0.15):
        """An existing value satisfying `ok` (the newest are likelier), or a fresh input made by
        `fresh()` when there is none (or now and then)."""
        cands = [v for v in self.values if ok(v)]
        if cands and not (fresh is not None and self.chance(p_fresh)):
            weights = np.arange(1, len(cands) + 1, dtype=float) ** 2
            return cands[int(self.rng.choice(len(cands), p=weights / weights.sum()))]
        if fresh is None:
            raise Rejected("no operand")
        return fresh()

    def shape(self, rank=None, lo=0, hi=4):
        rank = int(self.rng.integers(lo, hi + 1)) if rank is None else rank
        dims = [int(self.choice((1, 1, 2, 2, 3, 3, 4, 5, 6, 7))) for _ in range(rank)]
        while int(np.prod(dims)) > MAX_ELEMENTS:
            dims[int(np.argmax(dims))] //= 2
        return tuple(dims)

    def source(self, dtype, shape, wild_ok=True, positive=False, initializer=None):
        if initializer is None:
            initializer = self.chance(0.2)
        wild = bool(wild_ok and dtype.kind == "f" and self.chance(0.45))
        v = Value(self.name("c" if initializer else "x"), dtype, tuple(shape), wild)
        src = Source(v, initializer, positive)
        src.data = make_data(self.rng, src)
        self.sources.append(src)
        self.values.append(v)
        return v

    def fresh(self, dtypes, wild_ok=True, rank=None, lo=0, hi=4):
        return lambda: self.source(self.choice(dtypes), self.shape(rank, lo, hi), wild_ok)

    def broadcast_partner(self, v, dtype=None, wild_ok=True, positive=False):
        """A fresh operand whose shape broadcasts with v's: some dimensions 1, leading ones
        dropped, or new leading dimensions (then the result is larger than v)."""
        dims = [d if not self.chance(0.3) else 1 for d in v.shape]
        if dims and self.chance(0.3):
            dims = dims[int(self.rng.integers(len(dims) + 1)):]
        if self.chance(0.15) and len(dims) < 4:
            dims = [int(self.choice((2, 3)))] + dims
        if self.chance(0.1):
            dims = []
        return self.source(dtype or v.dtype, dims, wild_ok, positive)

    def const(self, array, dtype=np.int64):
        """An initializer holding an attribute-like input (axes, shape, pads...)."""
        name = self.name("k")
        self.consts.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    # ---- nodes
    def node(self, op, inputs, attrs=None, n_out=1, wild=None):
        """Append a node; its results' types come from strict shape inference.  `wild` says
        whether the results may be wild (default: when any float operand is)."""
        outs = [self.name("v") for _ in range(n_out)]
        node = helper.make_node(op, [i if isinstance(i, str) else i.name for i in inputs], outs,
                                **(attrs or {}))
        types = self.infer(node, outs)
        if wild is None:
            wild = any(isinstance(i, Value) and i.wild for i in inputs)
        exact = op in EXACT_OPS and all(i.exact for i in inputs if isinstance(i, Value))
        if op in ("Sum", "Max", "Min") and len(inputs) > 2:
            exact = exact and op != "Sum"
        self.nodes.append(node)
        made = [Value(n, t[0], t[1], bool(wild) and t[0].kind == "f", exact or t[0].kind != "f")
                for n, t in zip(outs, types)]
        self.values.extend(made)
        return made

    def infer(self, node, outs):
        model = self.model(extra=[node], outputs=[])
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        except Exception as exc:
            raise Rejected(str(exc)) from None
        known = {vi.name: vi.type.tensor_type for vi in inferred.graph.value_info}
        types = []
        for n in outs:
            tt = known.get(n)
            if tt is None or tt.elem_type not in NP_OF or not tt.HasField("shape"):
                raise Rejected(f"no type for {n}")
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if any(d is None or d == 0 for d in dims) or int(np.prod(dims)) > MAX_ELEMENTS * 4:
                raise Rejected("empty, unknown or too large result")
            types.append((NP_OF[tt.elem_type], tuple(dims)))
        return types

    def model(self, extra=(), outputs=None):
        inputs = [helper.make_tensor_value_info(s.value.name, ONNX_OF[s.value.dtype], s.value.shape)
                  for s in self.sources if not s.initializer]
        inits = [numpy_helper.from_array(s.data, s.value.name) for s in self.sources if s.initializer]
        if outputs is None:
            outputs = self.outputs()
        outs = [helper.make_tensor_value_info(v.name, ONNX_OF[v.dtype], v.shape) for v in outputs]
        graph = helper.make_graph(list(self.nodes) + list(extra), "fuzz", inputs, outs,
                                  inits + list(self.consts))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=8)

    def outputs(self):
        """The values no node reads (the last one at least), at most four."""
        used = {i for n in self.nodes for i in n.input}
        made = {o for n in self.nodes for o in n.output}
        outs = [v for v in self.values if v.name in made and v.name not in used]
        return outs[-4:]


# ---- input data

SPECIAL = {
    F32: [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-42, 1.2e-38, 3e38, -3e38, 1e30, -1e20,
          88.8, -104.0, 1e-8],
    F64: [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310, -4e-320, 1e300, -1e300, 1e30, 710.0, 1e-8],
    F16: [np.nan, np.inf, -np.inf, 0.0, -0.0, 6e-8, -3e-6, 65504.0, -65504.0, 1e4, 11.1],
}


def make_data(rng, src: Source) -> np.ndarray:
    v = src.value
    shape = v.shape
    if v.dtype == BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if v.dtype.kind == "i":
        if src.positive:
            return rng.integers(1, 6, size=shape).astype(v.dtype)
        return rng.integers(-9, 10, size=shape).astype(v.dtype)
    x = rng.standard_normal(shape) * float(rng.choice([1.0, 1.0, 3.0, 0.3]))
    if src.positive:
        x = np.abs(x) + 0.5
    elif rng.random() < 0.3:
        x = np.round(x * 2) / 2        # ties: equal values, exact halves (Round, comparisons)
    if rng.random() < 0.3 and x.size:   # exact zeros and negative zeros
        mask = rng.random(shape) < 0.2
        x = np.where(mask, np.copysign(0.0, rng.standard_normal(shape)), x)
    if v.wild and x.size:
        specials = np.array(SPECIAL[v.dtype], dtype=np.float64)
        mask = rng.random(shape) < 0.35
        x = np.where(mask, specials[rng.integers(len(specials), size=shape)], x)
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(v.dtype)
