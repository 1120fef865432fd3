"""The compilation pipeline, as data: which phases run, in which order, how often.

    canonicalize  rules [canonicalize] + DCE + CSE + constant folding, to a fixpoint
    quantize      rules [quantize]: integer types from QDQ pairs and from a profile
    lower         rules [lower] (ops the backend implements stay as they are) + DCE
    legalize      rules [legalize]: primitives rewritten into the form that computes them
                  exactly as specified (float16 sums accumulate in float32)
    canonicalize  again, on the primitives (folds that lowering exposed)
    check         every op left is one the backend implements

`glowgen dump MODEL --passes` prints this table and what each phase did.  Constant folding
evaluates with the reference semantics (glowgen/reference): semantics are written once.
Backends are known only through their interface (backends/base.py).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .backends.base import DEFAULT_BACKEND, Backend, backend_names, get_backend
from .engine.graph import Constant, Function, Node, Placeholder, Value
from .engine.passes import Pass, PassContext, Phase, Rules, run_pipeline
from .engine.registry import Registry
from .errors import GlowgenError
from .memory_limit import MemoryLimit, check_limit
from .reference import evaluate, implemented_ops, run_node

STAGES = ("loaded", "optimized", "lowered")
_CANONICALIZE_STEPS = (Rules("canonicalize"), Pass("dce"), Pass("cse"), Pass("fold"))
_LOWER = Phase("lower", (Rules("lower", skip_native=True), Pass("dce")))
_LEGALIZE = Phase("legalize", (Rules("legalize"), Pass("dce")))
_CHECK = Phase("check", (Pass("check"),))

# [quantize]: integer types from ONNX's QuantizeLinear/DequantizeLinear pairs (QDQ models)
# and, in a compilation with a profile, from its calibrated values (glowgen/quantization).
# The rules run again once CSE has merged what rewriting each consumer duplicated, before
# constant folding turns the dequantization of integer weights into floats.
_QUANTIZE = Phase("quantize", (Rules("quantize"), Pass("dce"), Pass("cse"), Rules("quantize"), Pass("fold")),
                  fixpoint=True)

PIPELINE = (
    Phase("canonicalize", _CANONICALIZE_STEPS, fixpoint=True),
    _QUANTIZE,
    _LOWER,
    _LEGALIZE,
    Phase("canonicalize-lowered", _CANONICALIZE_STEPS, fixpoint=True),
    _CHECK,
)

# A compilation with a profile (glowgen/quantization) runs the first phase, gives the values
# the profile covers their calibrated parameters, then runs the rest, [quantize] first.
CANONICAL = PIPELINE[:1]
AFTER_CANONICAL = PIPELINE[1:]

# Lowering alone, for comparison with the optimized graph and for evaluating constants.
UNOPTIMIZED = (_LOWER, _LEGALIZE, Phase("fold", (Pass("fold"), Pass("dce"))), _CHECK)

# The phases after which each stage of `glowgen dump --stage` is printed.
STAGE_PHASES = {"loaded": (), "optimized": PIPELINE[:2], "lowered": PIPELINE}


def backend_ops(backend: "str | Backend", registry: Registry) -> frozenset:
    """The ops `backend` implements natively; lowering leaves them alone."""
    return get_backend(backend).implemented_ops(registry)


def make_context(registry: Registry, backend: "str | Backend" = "interpreter",
                 max_memory: Optional[MemoryLimit] = None) -> PassContext:
    backend = get_backend(backend)
    return PassContext(registry, backend_ops(backend, registry), _evaluator(registry, max_memory),
                       backend=backend.name, max_memory=max_memory)


def run(function: Function, registry: Registry, phases=PIPELINE,
        backend: "str | Backend" = "interpreter",
        max_memory: Optional[MemoryLimit] = None, quantization=None) -> PassContext:
    """Run `phases` over `function` in place; the context holds what each phase did.
    `max_memory` bounds what constant folding may materialize (memory_limit.py).  With
    `quantization` (quantization/quantizer.py's QuantizationOptions) and phases that begin
    with CANONICAL, the values its profile covers are calibrated after that phase."""
    ctx = make_context(registry, backend, max_memory)
    if quantization is not None and tuple(phases[:1]) == CANONICAL:
        from .quantization.quantizer import calibrate
        run_pipeline(function, phases[:1], ctx)
        calibrate(function, quantization)
        phases = phases[1:]
    run_pipeline(function, phases, ctx)
    return ctx


# ----------------------------------------------------------------------------- evaluation
def _evaluator(registry: Registry, max_memory: Optional[MemoryLimit] = None):
    """Constant folding's evaluator: the interpreter's kernel for an op it implements; for a
    high-level op, the op alone copied into a scratch graph, lowered and run (every value
    of which must fit `max_memory`)."""
    native = implemented_ops(registry)

    def evaluate_node(node: Node, args: list) -> Optional[list]:
        if node.OP in native:
            return run_node(node, args, registry)
        scratch = Function("fold")
        operands, feeds = [], {}
        for i, (v, a) in enumerate(zip(node.inputs, args)):
            if v is None:
                operands.append(None)
            elif isinstance(v, tuple):
                items = []
                for j, (x, xa) in enumerate(zip(v, a)):
                    p = scratch.add_placeholder(f"in{i}_{j}", x.type)
                    feeds[p.name] = xa
                    items.append(p)
                operands.append(tuple(items))
            else:
                p = scratch.add_placeholder(f"in{i}", v.type)
                feeds[p.name] = a
                operands.append(p)
        copy = scratch.add_node(type(node), operands, node.copy_args(), name=node.name)
        for i, o in enumerate(copy.outputs):
            scratch.add_output(str(i), o)
        try:
            run_pipeline(scratch, UNOPTIMIZED, make_context(registry, max_memory=max_memory))
        except GlowgenError:
            return None         # not foldable here; the real pipeline reports it if it matters
        check_evaluation(scratch, max_memory)
        results = evaluate(scratch, feeds, registry)
        return [results[str(i)] for i in range(len(copy.outputs))]

    return evaluate_node


def _dummy(value: Value) -> np.ndarray:
    """An array of the right type and shape that takes no memory (for shape-only ops)."""
    return np.broadcast_to(np.zeros((), value.type.np_dtype), value.type.shape)


def check_evaluation(scratch: Function, max_memory: Optional[MemoryLimit]) -> None:
    """Every result evaluating `scratch` would allocate, against the limit, before any is."""
    if max_memory is None:
        return
    for node in scratch.nodes:
        for out in node.outputs:
            check_limit(max_memory, f"computing {node.OP} node {node.name!r} at compile time: "
                        f"its result ({out.type})", out.type.nbytes)


def constant_value(function: Function, value: Value, registry: Registry,
                   max_memory: Optional[MemoryLimit] = None) -> Optional[np.ndarray]:
    """The value of `value` if it is computable at compile time, else None (the importer
    asks this of ONNX inputs that must be constant, such as Reshape's shape).

    Copies the subgraph that computes it into a scratch function, lowers it and runs it:
    the same semantics as everything else."""
    if isinstance(value, Constant):
        return value.data
    scratch = Function("fold")
    copies: dict[int, Value] = {}
    feeds: dict[str, np.ndarray] = {}

    def copy(v: Value) -> Optional[Value]:
        if id(v) in copies:
            return copies[id(v)]
        if isinstance(v, Constant):
            nv = scratch.add_constant(v.data, v.name)
        elif isinstance(v, Placeholder):
            return None
        else:
            node = v.node
            if node.has_trait("shape_only"):
                ins = []
                for x in node.inputs:
                    p = scratch.add_placeholder(x.name, x.type)
                    feeds[p.name] = _dummy(x)
                    ins.append(p)
            else:
                ins = node.map_operands(copy)
                if ins is None:
                    return None
            nn = scratch.add_node(type(node), ins, node.copy_args(), name=node.name)
            for o, no in zip(node.outputs, nn.outputs):
                copies[id(o)] = no
            nv = copies[id(v)]
        copies[id(v)] = nv
        return nv

    root = copy(value)
    if root is None:
        return None
    scratch.add_output("value", root)
    run_pipeline(scratch, UNOPTIMIZED, make_context(registry, max_memory=max_memory))
    check_evaluation(scratch, max_memory)
    return evaluate(scratch, feeds, registry)["value"]
