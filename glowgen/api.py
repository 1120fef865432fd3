"""The Python API: `glowgen.compile(model) -> CompiledModel`, `glowgen.write_bundle`.

The front half (import, optimize, lower, LIR) is the same for every backend; the backend,
found by name through backends/base.py, prepares the program and runs it or writes it out."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import numpy as np

from . import lir, pipeline
from . import specialize as specializing
from .backends.base import Backend, get_backend
from .engine.graph import Function
from .engine.registry import Registry
from .engine.types import Type, dtype_of
from .errors import CompileTimeInputError, DataDependentError, GlowgenError, InputError
from .frontend.onnx import CheckedModel, ModelLike, import_model, load_model
from .memory_limit import MemoryLimit, format_bytes



def load(model: ModelLike, input_shapes: Optional[Mapping] = None,
         registry: Optional[Registry] = None, constant_inputs: Optional[Mapping] = None,
         max_memory=None) -> Function:
    """Import an ONNX model into a typed graph (the `loaded` stage).  `max_memory` (bytes,
    "8G", default: what the machine has available) bounds the constants it reads and folds."""
    registry = registry or Registry.default()
    limit = MemoryLimit.resolve(max_memory)

    def constant_fn(function, value, registry):
        return pipeline.constant_value(function, value, registry, max_memory=limit)

    return import_model(model, registry, constant_fn, dict(input_shapes or {}),
                        dict(constant_inputs or {}), max_memory=limit)


def lower(function: Function, registry: Optional[Registry] = None,
          backend: str = "interpreter") -> Function:
    """Lower to what `backend` implements and fold constants, without optimizing, in place."""
    pipeline.run(function, registry or Registry.default(), pipeline.UNOPTIMIZED, backend,
                 MemoryLimit.resolve(None))
    return function


def optimize(function: Function, registry: Optional[Registry] = None, stage: str = "lowered",
             backend: str = "interpreter", quantization=None) -> pipeline.PassContext:
    """Run the pipeline up to `stage` ("optimized": canonicalized; "lowered": the whole
    pipeline) over `function` in place.  Returns what the phases did (rules fired, pass
    counts, node counts per phase).  With `quantization` (`quantization_options`), the
    optimized stage is the graph after the [quantize] rules."""
    if stage not in pipeline.STAGE_PHASES:
        raise GlowgenError(f"unknown stage {stage!r}; stages: {', '.join(pipeline.STAGES)}")
    return pipeline.run(function, registry or Registry.default(), pipeline.STAGE_PHASES[stage],
                        backend, MemoryLimit.resolve(None), quantization)


def build_program(function: Function, registry: Registry, backend: Backend,
                  options: Mapping, max_memory=None) -> "lir.Program":
    """The lowered `function` as a LIR program with its memory plan, prepared by `backend`'s
    own LIR passes.  `max_memory` (a MemoryLimit): the plan must fit it, before the backend's
    passes (which may pack weights) and after them, before anything is allocated."""
    prog = lir.build(function, registry)
    check_plan(prog, max_memory)
    prog = backend.prepare(prog, registry, options)
    check_plan(prog, max_memory)
    return prog


def _buffer_kind(buf) -> str:
    if isinstance(buf, lir.WeightBuffer):
        return buf.io or "constant" if buf.region == "mutable" else "constant"
    return "activation"


def check_plan(prog: "lir.Program", max_memory: Optional[MemoryLimit],
               regions=("constant", "mutable", "activation")) -> None:
    """The memory plan's `regions` together against the limit; the message names the
    largest buffers in them."""
    if max_memory is None:
        return
    total = sum(prog.region_sizes[r] for r in regions)
    if total <= max_memory.limit:
        return
    buffers = [w for w in prog.weights if w.region in regions]
    if "activation" in regions:
        buffers += prog.activations
    largest = sorted(buffers, key=lambda b: -b.nbytes)[:3]
    named = ", ".join(f"{_buffer_kind(b)} {b.name!r} ({b.type}, {format_bytes(b.nbytes)})"
                      for b in largest)
    region_names = {"constant": "constants", "mutable": "inputs and outputs", "activation": "activations"}
    parts = " + ".join(f"{region_names[r]} {format_bytes(prog.region_sizes[r])}" for r in regions
                       if prog.region_sizes[r])
    max_memory.check(f"the compiled model ({parts}; the largest: {named})", total)


class CompiledModel:
    """A compiled model: call `run({name: array})` (or the model itself) for outputs."""

    def __init__(self, function: Function, registry: Registry, backend: "str | Backend",
                 max_memory=None, **options):
        self.function = function
        self.registry = registry
        backend = get_backend(backend)
        self.backend = backend.name
        self.options = backend.check_options(options)
        self.max_memory = MemoryLimit.resolve(max_memory, backend)
        self.program = build_program(function, registry, backend, self.options, self.max_memory)
        self._runner = backend.make_runner(self.program, registry, self.options)
        # The backend's code generation may add to the plan (packed weights, kernels'
        # scratch); one call's memory is allocated only when it first runs.
        check_plan(self.program, self.max_memory)
        self.input_types: dict[str, Type] = {p.name: p.type for p in function.placeholders}
        self.output_types: dict[str, Type] = {n: v.type for n, v in function.outputs}
        # (name, NumPy dtype, shape) of each input: run()'s quick test of its feeds.
        self._signature = tuple((n, t.np_dtype, t.shape) for n, t in self.input_types.items())

    @property
    def input_names(self) -> list[str]:
        return list(self.input_types)

    @property
    def output_names(self) -> list[str]:
        return list(self.output_types)

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate names, shapes and element types; nothing unchecked goes further."""
        if not isinstance(feeds, Mapping):
            raise InputError("run() takes a dict {input name: numpy array}")
        unknown = [k for k in feeds if k not in self.input_types]
        if unknown:
            raise InputError(f"unknown input{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(map(repr, unknown))}; the model's inputs are "
                             f"{', '.join(map(repr, self.input_names))}")
        missing = [k for k in self.input_types if k not in feeds]
        if missing:
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(map(repr, missing))} (expected "
                             + ", ".join(f"{n}: {t}" for n, t in self.input_types.items()) + ")")
        checked = {}
        for name, ty in self.input_types.items():
            arr = np.asarray(feeds[name])
            try:
                got = dtype_of(arr)
            except GlowgenError:
                raise InputError(f"input {name!r} has element type {arr.dtype}, expected {ty.dtype}") from None
            if got != ty.dtype:
                raise InputError(f"input {name!r} has element type {got} ({arr.dtype}), expected "
                                 f"{ty.dtype}; convert it with .astype(numpy.{ty.np_dtype.name})")
            if tuple(arr.shape) != ty.shape:
                raise InputError(f"input {name!r} has shape {list(arr.shape)}, expected "
                                 f"{list(ty.shape)}")
            checked[name] = arr
        return checked

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self._matches_signature(feeds):
            feeds = self.check_feeds(feeds)         # converts what it can, or says what is wrong
        return self._runner.run(feeds)

    def _matches_signature(self, feeds) -> bool:
        """Whether `feeds` is a dict of exactly the inputs, each a NumPy array of its dtype
        and shape: what check_feeds would pass on unchanged, told in a few steps.  A call
        finds the interpreter's state evicted by the run before (the model's data went
        through every cache), so each step costs microseconds: MobileNetV2 int8, 4.6 ms a
        call on Zen 3, spent about 0.1 ms in run() outside its native code."""
        if type(feeds) is not dict or len(feeds) != len(self._signature):
            return False
        for name, dtype, shape in self._signature:
            arr = feeds.get(name)
            if type(arr) is not np.ndarray or arr.dtype is not dtype or arr.shape != shape:
                return False
        return True

    def profile(self, reset: bool = False) -> list[tuple[str, int]]:
        """cpu backend, compiled with `profile=True`: (kernel, cycles) per native step
        (`Conv+Add+Relu [1, 64, 56, 56]`): its fewest cycles in one run since the last reset."""
        if not self.options.get("profile"):
            raise GlowgenError("this model was compiled without profile=True "
                               "(glowgen.compile(model, profile=True), cpu backend)")
        return self._runner.profile(reset)

    def task_profile(self, reset: bool = False) -> list[list[int]]:
        """cpu backend, compiled with `profile=True`: per native step (as in `profile`), the
        fewest cycles of each of its tasks when split among threads (empty when unsplit):
        how evenly the split shares its work out."""
        if not self.options.get("profile"):
            raise GlowgenError("this model was compiled without profile=True "
                               "(glowgen.compile(model, profile=True), cpu backend)")
        return self._runner.task_profile(reset)

    __call__ = run

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {t}" for n, t in self.input_types.items())
        outs = ", ".join(f"{n}: {t}" for n, t in self.output_types.items())
        return f"<CompiledModel backend={self.backend} ({ins}) -> ({outs})>"


def _front(model: ModelLike, backend: Backend, input_shapes, registry, optimize: bool,
           constant_inputs, max_memory: MemoryLimit, quantization=None) -> tuple[Function, Registry]:
    """Import and run the pipeline for `backend`: the lowered graph.  With `quantization`
    (QuantizationOptions), the canonicalized graph is calibrated from its profile and the
    [quantize] rules run before lowering."""
    registry = registry or Registry.default()
    function = load(model, input_shapes, registry, constant_inputs, max_memory)
    phases = pipeline.PIPELINE if optimize or quantization is not None else pipeline.UNOPTIMIZED
    pipeline.run(function, registry, phases, backend, max_memory, quantization)
    return function, registry


def quantization_options(model: "CheckedModel", quantize=None, schema: str = "asymmetric",
                         calibration="minmax", keep_float=None, registry=None, precision=None,
                         weight_bits=None, backend: Optional[Backend] = None, backend_options=None):
    """The checked QuantizationOptions for compiling `model` with `quantize` (a profile or
    its path), or None without one; a profile of another model is refused.  int8 weights
    take `weight_bits`, or (None, "auto") the bits `backend` chooses for the target of
    `backend_options`."""
    from .quantization.quantizer import QuantizationOptions, check_precision
    if quantize is None:
        if precision is not None:
            check_precision(precision)      # an unknown precision says so first
        for name, value in (("precision", precision), ("weight_bits", weight_bits)):
            if value is not None:
                raise GlowgenError(f"{name}={value!r} chooses how to quantize: "
                                   f"give quantize= a profile too (glowgen.profile(...))")
        return None
    options = QuantizationOptions.make(quantize, schema, calibration, keep_float, registry=registry,
                                       precision=precision or "int8", weight_bits=weight_bits)
    options.profile.check_model(model.proto)
    if options.weight_bits is None and options.dtype == "i8" and backend is not None:
        options = dataclasses.replace(options, weight_bits=backend.weight_bits(backend_options or {}))
    return options


def compile(model: ModelLike, backend: "str | Backend" = pipeline.DEFAULT_BACKEND,
            input_shapes: Optional[Mapping] = None,
            registry: Optional[Registry] = None, optimize: bool = True,
            constant_inputs: Optional[Mapping] = None, max_memory=None, max_variants: int = 8,
            specialize: Optional[bool] = None, quantize=None, schema: str = "asymmetric",
            calibration: str = "minmax", keep_float=None, precision: Optional[str] = None,
            weight_bits=None, **options) -> "CompiledModel | specializing.SpecializingModel":
    """Compile an ONNX model (a path, bytes or an `onnx.ModelProto`).

    `input_shapes` binds dynamic dimensions: {"input": (1, 3, 224, 224)}.
    `constant_inputs` binds model inputs to fixed arrays ({"shape": np.array([2, 3])}): the
    model is specialized to them and they are no longer inputs of the compiled model.
    With neither, a model with dynamic dimensions, or with inputs whose values decide shapes
    or control flow, is compiled on demand, once per call signature (input shapes and those
    values), keeping `max_variants` variants: a `SpecializingModel` (glowgen/specialize.py).
    `specialize=False` compiles ahead of time or fails; `True` always specializes.
    `registry` selects generated code other than the built-in (see `Registry.from_dir`).
    `optimize=False` only lowers (to compare against the optimized graph).
    `backend`: "cpu" (the default: native code, JIT-compiled for this machine),
    "interpreter" (NumPy, the reference), or any backend registered with
    `glowgen.backends.register_backend`.
    Other keyword arguments are the backend's options; the cpu backend's:
    `stacking=False` emits one loop per elementwise op, for comparison;
    `winograd=False` keeps 3x3 convolutions off Winograd's minimal filtering: slower, but
    their weights stay as they are (transformed, they take 16/9 to 4 times the memory);
    `amx=False` keeps int8 products off the AMX tiles of a CPU that has them (Sapphire
    Rapids and later: backends/cpu/amx.py) on its AVX-512 VNNI products, to compare;
    `profile=True` counts cycles per native kernel: `CompiledModel.profile()`;
    `cpu="x86-64-v3"` compiles for that x86-64 level instead of this machine's CPU.
    `max_memory` (bytes, or "8G"; default: what the machine has available) is refused, at
    compile time with the tensor named, by a model whose constants, folded constants or one
    call's inputs, outputs and activations would need more (glowgen/memory_limit.py).
    `quantize` (a Profile from `glowgen.profile`, or the path of one) compiles the model with
    integer arithmetic where the profile covers it: `schema` asymmetric | symmetric |
    symmetric_uint8 | symmetric_power2, `calibration` minmax | kl | percentile=P,
    `keep_float` op kinds left in float ("Conv,MatMul" or a list), `precision` "int8" (the
    default) or "int16" (activations and weights in i16: 256 times finer steps, exact i64
    sums; compiled as plain loops, slower than float), `weight_bits` 7 or 8 for int8 weights
    (default "auto": 7 on targets without VNNI, whose int8 products are then about 1.5 times
    as fast, 8 otherwise)."""
    backend = get_backend(backend)
    options = backend.check_options(options)      # before a long compilation

    limit = MemoryLimit.resolve(max_memory, backend)
    specializing.check_max_variants(max_variants)
    if specialize is None and (input_shapes or constant_inputs):
        specialize = False
    if specialize is not False or quantize is not None:
        model = CheckedModel(load_model(model, limit))     # read and checked once for all variants
    quantization = quantization_options(model, quantize, schema, calibration, keep_float, registry,
                                        precision, weight_bits, backend, options)

    def ahead_of_time(shapes, constants, source=None):
        function, reg = _front(model if source is None else source, backend, shapes, registry,
                               optimize, constants, limit, quantization)
        return CompiledModel(function, reg, backend, max_memory=limit, **options)

    learned = None
    if specialize is None:
        specialize = specializing.needs_specialization(model.proto, {})
        if not specialize:
            try:
                return ahead_of_time(None, None)
            except DataDependentError as e:         # an op with data-dependent shapes: cut
                specialize, learned = True, e
            except CompileTimeInputError as e:      # inputs whose values decide: per value
                if not e.inputs:
                    raise
                specialize, learned = True, e
    if specialize:
        specializing.check_ops(model.proto, registry or Registry.default())

        def decider(proto):          # the small model that computes deciding values
            return compile(proto, backend, registry=registry, optimize=optimize,
                           max_memory=max_memory, max_variants=max_variants, **options)
        return specializing.SpecializingModel(
            model, lambda m, shapes, constants: ahead_of_time(shapes, constants, m),
            backend.name, max_variants, learned, options, decider)
    return ahead_of_time(input_shapes, constant_inputs)


def write_bundle(model: ModelLike, out_dir, name: Optional[str] = None,
                 triple: Optional[str] = None, cpu: Optional[str] = None,
                 input_shapes: Optional[Mapping] = None, backend: "str | Backend" = "cpu",
                 registry: Optional[Registry] = None, max_memory=None, quantize=None,
                 schema: str = "asymmetric", calibration: str = "minmax", keep_float=None,
                 precision: Optional[str] = None, weight_bits=None, **options):
    """Compile `model` ahead of time for `triple`/`cpu` (default: this machine) and write the
    bundle (object file, weights, header, example main.c) into `out_dir`.  `max_memory` bounds
    what compiling allocates here: the constants and folded constants (the activation arena
    is the target's to allocate, and is not checked against this machine's memory).
    `quantize`, `schema`, `calibration`, `keep_float`, `precision`, `weight_bits`: as for
    `compile` (auto: for the bundle's target).
    `input_shapes` may also be a list of such mappings: one bundle with a compiled entry
    point per shape variant, their constants shared, and a function that picks the variant
    for given input shapes (backends/cpu/bundle_variants.py)."""
    import os
    from pathlib import Path
    from .backends.base import prepare_output_dir
    backend = get_backend(backend)
    options = backend.check_options(options)
    limit = MemoryLimit.resolve(max_memory, backend)
    source = Path(model) if isinstance(model, (str, os.PathLike)) else None
    # Cheap checks first: the name, the target and the directory, before a long compilation.
    target = backend.bundle_target(triple, cpu, name, source)
    if quantize is not None:
        model = CheckedModel(load_model(model, limit))
    quantization = quantization_options(model, quantize, schema, calibration, keep_float, registry,
                                        precision, weight_bits, backend,
                                        backend.bundle_options(options, target))
    several = not isinstance(input_shapes, Mapping) and input_shapes is not None
    variants = list(input_shapes) if several else [input_shapes]
    if several and not variants:
        raise InputError("input_shapes is an empty list: give at least one shape variant")
    prepare_output_dir(out_dir)
    progs = []
    for k, shapes in enumerate(variants):
        try:
            function, registry = _front(model, backend, shapes, registry, True, None, limit,
                                        quantization)
            prog = build_program(function, registry, backend, backend.bundle_options(options, target))
        except GlowgenError as e:
            if several and len(e.args) == 1:      # say which variant: the same type, its context
                bound = ", ".join(f"{n}={'x'.join(map(str, d))}" for n, d in dict(shapes).items())
                e.args = (f"shape variant {k + 1} ({bound}): {e.args[0]}",)
            raise
        check_plan(prog, limit, regions=("constant",))
        progs.append(prog)
    return backend.write_bundle(progs if several else progs[0], registry, out_dir, target, options)
