"""Specialization on demand: one model, compiled once per input signature that arrives.

glowgen compiles static graphs: every dimension, and every value that decides a shape (a
Reshape's target; an If's condition when its branches give different types; a Loop's trip
count when it has scan outputs), is known while compiling.  (Control flow whose types do
not depend on the path is compiled once and decided at run time: engine/control.py.)  A model with dynamic dimensions, or with inputs whose values decide
such things ("deciding inputs"), is therefore compiled per call signature: the shapes of
all inputs and the values of the deciding inputs.  `SpecializingModel` does that the first
time it meets a signature and keeps the compiled variants in a bounded LRU cache.

Deciding inputs are found as the importer finds them: compiling a variant raises
`CompileTimeInputError` naming the model inputs a compile-time value depends on; they join
the model's deciding set (bound to the call's arrays with `constant_inputs`) and the variant
is compiled again.  So a model pays that discovery once, on its first call.

Concurrency: run() may be called from many threads.  A signature is compiled by the first
caller that needs it; callers that ask for the same signature meanwhile wait for that
compilation (a future per key) instead of compiling it again.  Compilations of different
signatures run one at a time in this process: llvmlite's LLVM context is global and not
safe to use from two threads at once.  Running compiled variants is not serialized (a
CompiledModel's run() is thread-safe), and an evicted variant stays alive for the calls
still running it.

An op whose output shape depends on run-time values (NonZero, Unique, NonMaxSuppression, a
Compress with a computed condition) cuts the model into pieces, each a SpecializingModel of
its own that shares this one's cache: staged.py.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Mapping, Optional

import numpy as np
import onnx
from onnx import numpy_helper

from .engine.types import dtype_from_onnx, dtype_of, numpy_dtype
from .errors import (CompileTimeInputError, DataDependentError, GlowgenError, InputError,
                     UnsupportedError)
from .frontend.onnx import CheckedModel, declared_dims, declared_inputs, load_model

log = logging.getLogger("glowgen.specialize")

DEFAULT_MAX_VARIANTS = 8

# One compilation at a time in the process (see the module docstring).
_COMPILE_LOCK = threading.RLock()


@dataclass(frozen=True)
class TensorSpec:
    """A declared type: `shape` holds None for a dynamic dimension, and `dims` the
    declaration itself (an int, the dim_param's name, or None)."""
    dtype: Optional[str]
    dims: tuple

    @property
    def shape(self) -> Optional[tuple]:
        """None where no shape is declared at all."""
        return None if self.dims is None else tuple(d if isinstance(d, int) else None
                                                    for d in self.dims)

    @property
    def rank(self) -> Optional[int]:
        return None if self.dims is None else len(self.dims)

    @property
    def np_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @property
    def dynamic(self) -> bool:
        return self.dims is None or any(not isinstance(d, int) for d in self.dims)

    def __str__(self) -> str:
        dtype = self.dtype or "?"
        if self.dims is None:
            return f"{dtype}[...]"
        return f"{dtype}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"


@dataclass
class Variant:
    """One compiled specialization: the input shapes and deciding values it was compiled
    for, how long compiling took, and how often it has been called."""
    shapes: dict
    bound: dict
    compile_seconds: float
    model: object = field(repr=False)
    calls: int = 0
    piece: str = ""          # of a model cut at a data-dependent op: which piece (staged.py)

    def describe(self) -> str:
        parts = [f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in self.shapes.items()]
        parts += [f"{n}={_short(v)}" for n, v in self.bound.items()]
        return (f"[{self.piece}] " if self.piece else "") + " ".join(parts)


def _declared_output(vi: onnx.ValueInfoProto) -> TensorSpec:
    """What the model declares of an output (the element type None when it declares none)."""
    tt = vi.type.tensor_type
    dims = declared_dims(vi)
    dtype = dtype_from_onnx(tt.elem_type) if tt.elem_type else None
    return TensorSpec(dtype, tuple(dims) if dims is not None else None)


def _short(a: np.ndarray) -> str:
    flat = a.reshape(-1)
    text = ",".join(str(x) for x in flat[:6].tolist()) + (",..." if flat.size > 6 else "")
    return f"[{text}]" if a.ndim else text


def check_max_variants(max_variants) -> None:
    if not isinstance(max_variants, int) or isinstance(max_variants, bool) or max_variants < 1:
        raise GlowgenError(f"max_variants must be a positive integer, got {max_variants!r}")


def check_ops(proto: onnx.ModelProto, registry) -> None:
    """Fail now, not on the first call, on a node of an op glowgen cannot import at all (no
    clause in the specs, no ONNX function body, another domain).  Opset ranges and
    attributes are checked when a variant is compiled."""
    from onnx import defs
    from .frontend.onnx import onnx_op_name
    from .frontend.onnx_control import CONTROL_FLOW
    from .frontend.onnx_data_dependent import is_data_dependent
    for node in proto.graph.node:
        desc = f"{node.op_type} node {node.name or (node.output[0] if node.output else '?')!r}"
        if onnx_op_name(node) in registry.onnx or is_data_dependent(node):
            continue
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedError(f"{desc} is in domain {node.domain!r}, which glowgen does not "
                                   f"know {node.op_type} of. Run `glowgen ops --onnx` to list "
                                   f"supported ops.")
        if node.op_type in CONTROL_FLOW or node.op_type == "Constant":
            continue
        if defs.has(node.op_type) and (defs.get_schema(node.op_type).has_function or
                                       defs.get_schema(node.op_type).has_context_dependent_function):
            continue
        raise UnsupportedError(f"ONNX op {node.op_type} ({desc}) is not supported. Run "
                               f"`glowgen ops` to list the supported ops.")


def needs_specialization(proto, input_shapes: Mapping) -> bool:
    """Whether some input has a dynamic dimension that `input_shapes` leaves unbound."""
    return any(dims is None or any(not isinstance(d, int) for d in dims)
               for name, _, dims in declared_inputs(proto) if name not in input_shapes)


class SpecializingModel:
    """A model compiled per call signature (input shapes, values of the deciding inputs), on
    first use, with at most `max_variants` variants kept (least recently used evicted).
    Called like a CompiledModel: `run({name: array})`."""

    def __init__(self, model, compile_fn, backend: str, max_variants: int = DEFAULT_MAX_VARIANTS,
                 learned: Optional[CompileTimeInputError] = None,
                 options: Optional[Mapping] = None, decider_fn=None,
                 shared: Optional["SpecializingModel"] = None, piece: str = ""):
        check_max_variants(max_variants)
        self.proto = load_model(model)
        # compile_fn(model, input_shapes, constant_inputs) -> CompiledModel, ahead of time;
        # decider_fn(model) -> a model computing the decided values (compiled as any model).
        self._compile_fn, self._decider_fn = compile_fn, decider_fn
        self.backend = backend
        self.options = dict(options or {})      # the backend's, as every variant gets them
        self.max_variants = max_variants
        self.input_types: dict[str, TensorSpec] = {}
        for name, dtype, dims in declared_inputs(self.proto):
            self.input_types[name] = TensorSpec(dtype, tuple(dims) if dims is not None else None)
        self.output_names = [o.name for o in self.proto.graph.output]
        self.output_types = {o.name: _declared_output(o) for o in self.proto.graph.output}
        self._expected = {n: (t.np_dtype, t.shape) for n, t in self.input_types.items()}
        self._plan = Plan()
        # A piece of a model cut at a data-dependent op (`piece` names it) shares the
        # cache of the whole (`shared`): its bound, lock and statistics.
        self.piece_name = piece
        self._cache: "OrderedDict[tuple, Variant]" = OrderedDict()
        self._pending: dict[tuple, Future] = {}
        self._lock = threading.Lock()
        # compiles; hits (found compiled); waits (found being compiled by another caller)
        self.stats = {"compiles": 0, "hits": 0, "waits": 0, "evictions": 0}
        if shared is not None:
            self._cache, self._pending = shared._cache, shared._pending
            self._lock, self.stats = shared._lock, shared.stats
        self._staged = None          # a staged.Staged once the model is cut
        if isinstance(learned, DataDependentError):
            self._cut(learned)
        elif learned is not None:     # what compiling ahead of time found deciding
            self._plan = self._grown(self._plan, learned)

    # ------------------------------------------------------------------ the API
    @property
    def input_names(self) -> list[str]:
        return list(self.input_types)

    @property
    def deciding_inputs(self) -> list[str]:
        """Inputs whose values are part of the signature, since they decide shapes or control
        flow (known after the first call)."""
        return list(self._plan.inputs)

    @property
    def deciding_values(self) -> list[str]:
        """Values computed in the model (an If's condition, say) whose values are part of the
        signature: a variant per value, whatever the inputs they are computed from."""
        return list(self._plan.values)

    @property
    def variants(self) -> list[Variant]:
        """The compiled variants, least recently used first (of a model cut at data-dependent
        ops, those of all its pieces, each naming its piece)."""
        with self._lock:
            return list(self._cache.values())

    @property
    def pieces(self) -> list["SpecializingModel"]:
        """Of a model cut at an op with data-dependent output shapes: the part before it and
        the part after (itself cut again if it meets another); else []."""
        return self._staged.pieces if self._staged is not None else []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self.check_feeds(feeds)
        if self._staged is None:
            variant = self._variant(arrays)
            if variant is not None:
                return self._run_variant(variant, arrays)
        return self._staged.run(arrays)

    __call__ = run

    def _run_variant(self, variant: Variant, arrays: dict) -> dict:
        if variant.bound:
            arrays = {n: a for n, a in arrays.items() if n not in variant.bound}
        # The variant was compiled for exactly these shapes and element types (its key), so
        # its own check would find nothing: its runner takes the arrays directly.
        return variant.model._runner.run(arrays)

    def piece(self, proto: onnx.ModelProto, name: str) -> "SpecializingModel":
        """A SpecializingModel of `proto`, a piece of this one, sharing its cache."""
        whole = f"{self.piece_name} | {name}" if self.piece_name else name
        return SpecializingModel(proto, self._compile_fn, self.backend, self.max_variants,
                                 options=self.options, decider_fn=self._decider_fn,
                                 shared=self, piece=whole)

    def _cut(self, error: DataDependentError) -> None:
        from .staged import Staged
        with _COMPILE_LOCK:       # one cut, whichever caller meets the op first
            if self._staged is None:
                self._staged = Staged(self, error)

    def specialized(self, feeds: Mapping[str, np.ndarray]):
        """The CompiledModel that serves calls like `feeds` (compiled now if it is not yet),
        e.g. for `profile()` or to read its graph."""
        variant = None if self._staged is not None else self._variant(self.check_feeds(feeds))
        if variant is None:
            raise GlowgenError("the model is cut at an op whose output shape depends on run-time "
                               "values, so no one compiled model serves a call; see "
                               "model.pieces for the parts compiled on each side")
        return variant.model

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Names, element types, ranks and fixed dimensions; the rest the variant decides."""
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise InputError("run() takes a dict {input name: numpy array}")
        if feeds.keys() != self.input_types.keys():
            self._check_names(feeds)
        checked = {}
        for name, (np_dtype, fixed) in self._expected.items():
            arr = np.asarray(feeds[name])
            if arr.dtype == np_dtype and fixed is not None and arr.ndim == len(fixed) \
                    and all(d is None or s == d for s, d in zip(arr.shape, fixed)):
                checked[name] = arr              # the common case, quickly
                continue
            spec = self.input_types[name]
            try:
                got = dtype_of(arr)
            except GlowgenError:
                raise InputError(f"input {name!r} has element type {arr.dtype}, expected "
                                 f"{spec.dtype}") from None
            if got != spec.dtype:
                raise InputError(f"input {name!r} has element type {got} ({arr.dtype}), expected "
                                 f"{spec.dtype}; convert it with .astype(numpy.{spec.np_dtype.name})")
            if spec.dims is not None:
                raise InputError(f"input {name!r} has shape {list(arr.shape)}, expected "
                                 f"{spec} (? and names are dynamic)")
            checked[name] = arr
        return checked

    def _check_names(self, feeds) -> None:
        unknown = [k for k in feeds if k not in self.input_types]
        if unknown:
            raise InputError(f"unknown input{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; the model's inputs are "
                             f"{', '.join(map(repr, self.input_names))}")
        missing = [k for k in self.input_types if k not in feeds]
        if missing:
            deciding = [k for k in missing if k in self._plan.inputs
                        or k in self._plan.decider_inputs]
            why = (f"; {', '.join(map(repr, deciding))} decide{'s' if len(deciding) == 1 else ''} "
                   f"shapes or control flow, so the model is compiled for each value "
                   f"{'it takes' if len(deciding) == 1 else 'they take'}") if deciding else ""
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(repr, missing))} (expected "
                             + ", ".join(f"{n}: {t}" for n, t in self.input_types.items()) + ")"
                             + why)

    # ------------------------------------------------------------------ the cache
    def _key(self, arrays: dict, plan: "Plan", decided: dict) -> tuple:
        shapes = tuple(arrays[n].shape for n in self.input_types)
        values = tuple(np.ascontiguousarray(arrays[n]).tobytes() for n in plan.inputs)
        values += tuple((d.dtype.str, d.shape, np.ascontiguousarray(d).tobytes())
                        for d in decided.values())
        return self.piece_name, plan.inputs, plan.values, shapes, values

    def _variant(self, arrays: dict) -> Optional[Variant]:
        """The variant for `arrays`, compiled if need be; None once the model is cut."""
        while True:
            if self._staged is not None:
                return None
            plan = self._plan
            decided = plan.decide(arrays)
            key = self._key(arrays, plan, decided)
            with self._lock:
                variant = self._cache.get(key)
                if variant is not None:
                    self._cache.move_to_end(key)
                    variant.calls += 1
                    self.stats["hits"] += 1
                    return variant
                future = self._pending.get(key)
                owner = future is None
                if owner:
                    future = self._pending[key] = Future()
            if not owner:
                variant = future.result()       # raises what the compilation raised
                if variant is None:             # the plan grew: a new key
                    continue
                with self._lock:
                    variant.calls += 1
                    self.stats["waits"] += 1
                return variant
            try:
                variant = self._compile(arrays, plan, decided)
            except _MoreDeciding as more:
                with self._lock:
                    if self._plan is plan:
                        self._plan = more.plan
                self._settle(key, future)
                continue
            except DataDependentError as cut:
                try:
                    self._cut(cut)
                except BaseException as e:
                    self._settle(key, future, e)
                    raise
                self._settle(key, future)
                continue
            except BaseException as e:
                self._settle(key, future, e)
                raise
            with self._lock:
                variant.calls = 1
                self._cache[key] = variant
                del self._pending[key]
                self.stats["compiles"] += 1
                while len(self._cache) > self.max_variants:
                    _, old = self._cache.popitem(last=False)
                    self.stats["evictions"] += 1
                    log.info("evicted variant %s (least recently used; max_variants=%d)",
                             old.describe(), self.max_variants)
            future.set_result(variant)
            return variant

    def _settle(self, key, future: Future, error: Optional[BaseException] = None) -> None:
        """The compilation of `key` ended without a variant: the callers waiting for it get
        `error`, or None (look again: the plan has changed, or the model was cut)."""
        with self._lock:
            del self._pending[key]
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(None)

    def _compile(self, arrays: dict, plan: "Plan", decided: dict) -> Variant:
        bound = {n: arrays[n].copy() for n in plan.inputs}
        shapes = {n: tuple(a.shape) for n, a in arrays.items() if n not in bound}
        start = time.perf_counter()
        try:
            with _COMPILE_LOCK:
                model = CheckedModel(self.proto if not decided else with_values(self.proto, decided))
                compiled = self._compile_fn(model, shapes, bound)
        except DataDependentError:
            raise                     # cut the graph there (_variant)
        except CompileTimeInputError as e:
            raise _MoreDeciding(self._grown(plan, e)) from None
        seconds = time.perf_counter() - start
        variant = Variant(shapes, {**bound, **decided}, seconds, compiled, piece=self.piece_name)
        log.info("compiled variant %s in %.3f s (backend %s)", variant.describe(),
                 seconds, self.backend)
        return variant

    def _grown(self, plan: "Plan", e: CompileTimeInputError) -> "Plan":
        """The plan that also decides what `e` says must be known while compiling: the value
        it names, computed from the inputs by a small model of its own (so an If on
        Equal(sr, 16000) compiles two variants, not one per sample rate), or else the inputs
        behind it."""
        name = e.value
        if name and name not in plan.values and name not in self.input_types \
                and self._decider_fn is not None:
            try:
                with _COMPILE_LOCK:
                    decider = self._decider_fn(decider_model(self.proto, plan.values + (name,)))
            except (_NotDecidable, GlowgenError) as why:
                log.info("cannot compute %r on its own (%s); deciding on the inputs behind it",
                         name, why)
            else:
                log.info("the value of %r decides shapes or control flow; compiling per value",
                         name)
                return Plan(plan.inputs, plan.values + (name,), decider)
        more = [n for n in e.inputs if n in self.input_types and n not in plan.inputs]
        if not more:
            raise e
        log.info("the values of %s decide shapes or control flow; compiling per value",
                 ", ".join(map(repr, more)))
        return Plan(tuple(n for n in self.input_types if n in set(plan.inputs) | set(more)),
                    plan.values, plan.decider)

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {t}" for n, t in self.input_types.items())
        if self._staged is not None:
            return (f"<SpecializingModel backend={self.backend} ({ins}) -> "
                    f"({', '.join(self.output_names)}); cut at {self._staged.node.op_type} into "
                    f"{len(self.pieces)} pieces, {len(self._cache)} of {self.max_variants} "
                    f"variants compiled>")
        return (f"<SpecializingModel backend={self.backend} ({ins}) -> "
                f"({', '.join(self.output_names)}); {len(self._cache)} of {self.max_variants} "
                f"variants compiled>")


class _MoreDeciding(Exception):
    def __init__(self, plan: "Plan"):
        super().__init__(plan)
        self.plan = plan


class _NotDecidable(Exception):
    pass


@dataclass(frozen=True)
class Plan:
    """What a signature holds besides the input shapes: the values of the deciding `inputs`
    (bound as constants in each variant) and of computed `values` (`decider` computes them
    from the inputs; each variant has them as constants)."""
    inputs: tuple = ()
    values: tuple = ()
    decider: object = None

    @property
    def decider_inputs(self) -> tuple:
        return tuple(self.decider.input_names) if self.decider is not None else ()

    def decide(self, arrays: dict) -> dict:
        if not self.values:
            return {}
        got = self.decider.run({n: arrays[n] for n in self.decider.input_names})
        return {n: np.asarray(got[n]) for n in self.values}


def decider_model(proto: onnx.ModelProto, names: tuple) -> onnx.ModelProto:
    """The part of `proto` that computes the values `names` from the graph inputs, as a
    model of its own whose outputs they are.  Only values of the main graph computed without
    subgraphs qualify (else _NotDecidable)."""
    from .frontend.onnx_cut import ancestors, piece
    nodes = ancestors(proto, names)
    known = ({o for n in nodes for o in n.output} | {i.name for i in proto.graph.initializer}
             | {vi.name for vi in proto.graph.input})
    for node in nodes:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            raise _NotDecidable(f"{node.output[0]!r} is computed by a node with subgraphs")
    for name in [n for node in nodes for n in node.input if n] + list(names):
        if name not in known:
            raise _NotDecidable(f"{name!r} is not a value of the main graph")
    typed = onnx.shape_inference.infer_shapes(proto)
    types = {vi.name: vi for vi in list(typed.graph.value_info) + list(typed.graph.output)}
    for name in names:
        vi = types.get(name)
        if vi is None or not vi.type.tensor_type.elem_type:
            raise _NotDecidable(f"ONNX cannot infer the type of {name!r}")
    return piece(proto, nodes, list(names), types, f"{proto.graph.name}_decider")


def with_values(proto: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """`proto` with the computed values `values` replaced by constants (initializers); the
    nodes that computed them keep an output nobody reads."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for node in out.graph.node:
        for i, o in enumerate(node.output):
            if o in values:
                node.output[i] = f"{o}.decided_unused"
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n) for n, a in values.items())
    return out
