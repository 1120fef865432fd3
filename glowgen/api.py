"""The Python API: `glowgen.compile(model) -> CompiledModel`."""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from . import pipeline
from .engine.graph import Function
from .engine.registry import Registry
from .engine.types import Type, dtype_of
from .errors import GlowgenError, InputError
from .frontend.onnx import ModelLike, import_model

BACKENDS = pipeline.BACKENDS


def load(model: ModelLike, input_shapes: Optional[Mapping] = None,
         registry: Optional[Registry] = None, constant_inputs: Optional[Mapping] = None) -> Function:
    """Import an ONNX model into a typed graph (the `loaded` stage)."""
    registry = registry or Registry.default()
    return import_model(model, registry, pipeline.constant_value, dict(input_shapes or {}),
                        dict(constant_inputs or {}))


def lower(function: Function, registry: Optional[Registry] = None,
          backend: str = "interpreter") -> Function:
    """Lower to what `backend` implements and fold constants, without optimizing, in place."""
    pipeline.run(function, registry or Registry.default(), pipeline.UNOPTIMIZED, backend)
    return function


def optimize(function: Function, registry: Optional[Registry] = None, stage: str = "lowered",
             backend: str = "interpreter") -> pipeline.PassContext:
    """Run the pipeline up to `stage` ("optimized": canonicalized; "lowered": the whole
    pipeline) over `function` in place.  Returns what the phases did (rules fired, pass
    counts, node counts per phase)."""
    if stage not in pipeline.STAGE_PHASES:
        raise GlowgenError(f"unknown stage {stage!r}; stages: {', '.join(pipeline.STAGES)}")
    return pipeline.run(function, registry or Registry.default(), pipeline.STAGE_PHASES[stage], backend)


class CompiledModel:
    """A compiled model: call `run({name: array})` (or the model itself) for outputs."""

    def __init__(self, function: Function, registry: Registry, backend: str, stacking: bool = True,
                 profile: bool = False):
        from . import lir
        self.function = function
        self.registry = registry
        self.backend = backend
        self.program = lir.build(function, registry)
        if backend == "cpu":
            from .backends.cpu import CpuRunner
            self._runner = CpuRunner(self.program, registry, stacking=stacking, name=function.name,
                                     profile=profile)
        else:
            from .backends.interpreter.lir_runner import LirRunner
            self._runner = LirRunner(self.program, registry)
        self.input_types: dict[str, Type] = {p.name: p.type for p in function.placeholders}
        self.output_types: dict[str, Type] = {n: v.type for n, v in function.outputs}

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
        checked = self.check_feeds(feeds)
        return self._runner.run(checked)

    def profile(self, reset: bool = False) -> list[tuple[str, int]]:
        """cpu backend, compiled with `profile=True`: (kernel, cycles) per native step
        (`Conv+Add+Relu [1, 64, 56, 56]`), summed over the runs since the last reset."""
        if self.backend != "cpu":
            raise GlowgenError("profile() needs the cpu backend")
        return self._runner.profile(reset)

    __call__ = run

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {t}" for n, t in self.input_types.items())
        outs = ", ".join(f"{n}: {t}" for n, t in self.output_types.items())
        return f"<CompiledModel backend={self.backend} ({ins}) -> ({outs})>"


def compile(model: ModelLike, backend: str = pipeline.DEFAULT_BACKEND,
            input_shapes: Optional[Mapping] = None,
            registry: Optional[Registry] = None, optimize: bool = True,
            stacking: bool = True, constant_inputs: Optional[Mapping] = None,
            profile: bool = False) -> CompiledModel:
    """Compile an ONNX model (a path, bytes or an `onnx.ModelProto`).

    `input_shapes` binds dynamic dimensions: {"input": (1, 3, 224, 224)}.
    `constant_inputs` binds model inputs to fixed arrays ({"shape": np.array([2, 3])}): the
    model is specialized to them and they are no longer inputs of the compiled model.
    `registry` selects generated code other than the built-in (see `Registry.from_dir`).
    `optimize=False` only lowers (to compare against the optimized graph).
    `stacking=False` (cpu backend) emits one loop per elementwise op, for comparison.
    `profile=True` (cpu backend) counts cycles per native kernel: `CompiledModel.profile()`.
    `backend`: "cpu" (the default: native code, JIT-compiled for this machine) or
    "interpreter" (NumPy, the reference)."""
    if backend not in BACKENDS:
        raise GlowgenError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    registry = registry or Registry.default()
    function = load(model, input_shapes, registry, constant_inputs)
    phases = pipeline.PIPELINE if optimize else pipeline.UNOPTIMIZED
    pipeline.run(function, registry, phases, backend)
    return CompiledModel(function, registry, backend, stacking=stacking, profile=profile)
