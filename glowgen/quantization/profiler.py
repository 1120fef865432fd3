"""Profiling: run a model on calibration samples and record every float tensor's range and
histogram (Glow's profiling instructions), natively.

The model's canonicalized graph (where quantization reads the profile: pipeline.CANONICAL)
gets instruments as extra outputs, and is compiled once:

    ReduceMin, ReduceMax     each profiled tensor's extremes in one sample;
    Histogram(x, low, high)  its counts in `bins` equal bins over [low, high], two inputs of
                             the instrumented model (a scatter-add of ones: one elementwise
                             loop for the bin indices, one native scatter).

Tensors inside a run-time If's branches and a native loop's body are profiled too (their
instruments are carried out as the conditional's results and the loop's state: bodies.py),
so quantization reaches the ops there.

The samples run twice: first for the ranges (the histograms are ignored), then with those
ranges as the histograms' inputs.  Two passes give exact histograms over the final range,
where one would have to re-bin as the range grows.  The instruments are ordinary ops, so the
instrumented graph is optimized, lowered and compiled like any other, on any backend.
Samples with different input shapes (a model with dynamic dimensions) compile one
instrumented variant per shape.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

import numpy as np

from .. import pipeline
from ..engine.graph import Function, Value
from ..engine.registry import Registry
from ..engine.types import Type
from ..errors import CompileTimeInputError, GlowgenError, InputError
from ..memory_limit import MemoryLimit
from .bodies import Instruments, body_values, own_values
from .profile import Profile, TensorProfile, model_fingerprint

DEFAULT_BINS = 2048
_PREFIX = "glowgen.profile"


def _output_name(kind: str, i: int) -> str:
    return f"{_PREFIX}.{kind}.{i}"


def _instrument(function: Function, registry: Registry, bins: int) -> list[Value]:
    """Outputs min.i, max.i and histogram.i of every profiled tensor i, inputs low.i and
    high.i; returns the tensors.  Those of the function itself first, then those inside its
    branches and loop bodies (bodies.py)."""
    values = own_values(function, function.placeholders)
    inner = body_values(function)
    profiled = values + [v for vs in inner.values() for v in vs]
    bounds = [(function.add_placeholder(_output_name("low", i), Type("f32", ())),
               function.add_placeholder(_output_name("high", i), Type("f32", ())))
              for i in range(len(profiled))]
    index = {id(v): i for i, v in enumerate(profiled)}
    probes = Instruments(registry, bins, index, inner).function(function, values, bounds.__getitem__)
    for i, *results in sorted(probes, key=lambda p: p[0]):
        for kind, value in zip(("min", "max", "histogram"), results):
            function.add_output(_output_name(kind, i), value)
    return profiled


class _Variant:
    """The instrumented model for one input signature, and the tensors it profiles."""

    def __init__(self, shapes: dict):
        self.shapes = shapes
        self.model = None
        self.names: Optional[list[str]] = None


def _signature(feeds: Mapping[str, np.ndarray]) -> tuple:
    return tuple(sorted((k, tuple(np.shape(v)), np.asarray(v).dtype.str) for k, v in feeds.items()))


def _check_samples(proto, samples: list, input_shapes: Optional[Mapping]) -> None:
    """Each sample against the inputs the model declares: names, element types, ranks and
    static dimensions, with the sample's number in the message."""
    from ..engine.types import dtype_of
    from ..frontend.onnx import declared_inputs
    declared = {name: (dtype, dims) for name, dtype, dims in declared_inputs(proto)}
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise InputError(f"calibration sample {i} is a {type(s).__name__}; each sample is a "
                             f"dict {{input name: numpy array}}")
        unknown = [k for k in s if k not in declared]
        missing = [k for k in declared if k not in s]
        if unknown or missing:
            raise InputError(f"calibration sample {i}: "
                             + (f"{', '.join(map(repr, unknown))} is not an input of the model; " if unknown else "")
                             + (f"lacks {', '.join(map(repr, missing))}; " if missing else "")
                             + f"the model's inputs: {', '.join(map(repr, declared))}")
        for name, (dtype, dims) in declared.items():
            arr = np.asarray(s[name])
            try:
                got = dtype_of(arr)
            except GlowgenError:
                got = str(arr.dtype)
            if got != dtype:
                raise InputError(f"calibration sample {i}: input {name!r} has element type {got}, "
                                 f"the model declares {dtype}")
            want = input_shapes.get(name) if input_shapes else None
            want = list(want) if want is not None else dims
            if want is None:
                continue
            if arr.ndim != len(want) or any(isinstance(d, int) and d > 0 and d != a
                                            for d, a in zip(want, arr.shape)):
                shown = "x".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in want)
                raise InputError(f"calibration sample {i}: input {name!r} has shape "
                                 f"{list(arr.shape)}, the model takes {shown} (in an .npz, each "
                                 f"array is [samples, *input shape])")


def profile(model, samples: Iterable[Mapping[str, np.ndarray]], input_shapes: Optional[Mapping] = None,
            bins: int = DEFAULT_BINS, backend: str = "cpu", registry: Optional[Registry] = None,
            progress: Optional[Callable[[str, int, int], None]] = None, max_memory=None,
            **options) -> Profile:
    """Profile `model` (a path, bytes or ModelProto) on `samples`, an iterable of feed dicts
    {input name: array}: the range and a `bins`-bin histogram of every float tensor.

    `input_shapes` binds dynamic dimensions for every sample (by default each sample's own
    shapes are used, compiling once per distinct shape).  `progress(phase, done, total)` is
    called after each sample of each pass ("ranges", then "histograms").  Other keyword
    arguments are the backend's options (threads=N, ...)."""
    from ..api import CompiledModel, load
    from ..backends.base import get_backend
    from ..frontend.onnx import CheckedModel, load_model

    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 1 << 16:
        raise GlowgenError(f"bins must be an integer from 1 to 65536, not {bins!r}")
    registry = registry or Registry.default()
    backend = get_backend(backend)
    options = backend.check_options(options)
    limit = MemoryLimit.resolve(max_memory, backend)
    proto = load_model(model, limit)
    checked = CheckedModel(proto)
    samples = list(samples)
    if not samples:
        raise InputError("profiling needs at least one calibration sample")

    def build(variant: _Variant) -> None:
        try:
            function = load(checked, variant.shapes, registry, None, limit)
        except CompileTimeInputError as e:
            raise GlowgenError(f"cannot profile this model yet: {e}; bind those inputs with "
                               f"input shapes or export the model with them constant") from None
        pipeline.run(function, registry, pipeline.CANONICAL, backend, limit)
        values = _instrument(function, registry, bins)
        pipeline.run(function, registry, pipeline.AFTER_CANONICAL, backend, limit)
        variant.model = CompiledModel(function, registry, backend, max_memory=limit, **options)
        variant.names = [v.name for v in values]

    _check_samples(proto, samples, input_shapes)
    variants: dict[tuple, _Variant] = {}
    order: list[_Variant] = []
    for s in samples:
        key = _signature(s)
        if key not in variants:
            shapes = dict(input_shapes) if input_shapes else {k: tuple(np.shape(v)) for k, v in s.items()}
            variants[key] = _Variant(shapes)
        order.append(variants[key])

    names: Optional[list[str]] = None

    def run(variant: _Variant, feeds, i: int, ranges) -> dict:
        nonlocal names
        if variant.model is None:
            build(variant)
            # Every variant imports the same ONNX graph, so the same tensors (dynamic
            # shapes only change their sizes).
            if names is None:
                names = variant.names
            elif variant.names != names:
                raise GlowgenError("the model imports different tensors for different input "
                                   "shapes; profile it with one input shape (input_shapes=)")
        feeds = dict(feeds)
        for j, (lo, hi) in enumerate(ranges or [(0.0, 1.0)] * len(names)):
            feeds[_output_name("low", j)] = np.float32(lo)
            feeds[_output_name("high", j)] = np.float32(hi)
        try:
            return variant.model.run(feeds)
        except InputError as e:
            raise InputError(f"calibration sample {i}: {e}") from None

    # Pass 1: ranges.
    lows = highs = None
    for i, (variant, feeds) in enumerate(zip(order, samples)):
        out = run(variant, feeds, i, None)
        mins = np.array([out[_output_name("min", j)] for j in range(len(names))], dtype=np.float64)
        maxs = np.array([out[_output_name("max", j)] for j in range(len(names))], dtype=np.float64)
        lows = mins if lows is None else np.fmin(lows, mins)   # fmin: NaNs do not hide values
        highs = maxs if highs is None else np.fmax(highs, maxs)
        if progress:
            progress("ranges", i + 1, len(samples))
    # A tensor in a branch no sample took, or a loop body no sample ran, has no range.
    seen = lows <= highs
    bad = [n for n, lo, hi, s in zip(names, lows, highs, seen)
           if s and not (np.isfinite(lo) and np.isfinite(hi))]
    if bad:
        raise InputError(f"calibration produced non-finite values in {len(bad)} tensor"
                         f"{'s' if len(bad) > 1 else ''} ({', '.join(map(repr, bad[:3]))}"
                         f"{', ...' if len(bad) > 3 else ''}): an infinite or NaN input, or an "
                         f"overflow; quantization needs finite ranges")
    ranges = [(lo, hi) if s else (0.0, 1.0) for lo, hi, s in zip(lows.tolist(), highs.tolist(), seen)]
    # A constant tensor's one value counts in the first bin of a range of width one.
    bin_ranges = [(lo, hi if hi > lo else lo + 1.0) for lo, hi in ranges]

    # Pass 2: histograms over those ranges.
    counts = np.zeros((len(names), bins), dtype=np.int64)
    for i, (variant, feeds) in enumerate(zip(order, samples)):
        out = run(variant, feeds, i, bin_ranges)
        for j in range(len(names)):
            counts[j] += out[_output_name("histogram", j)].astype(np.int64)
        if progress:
            progress("histograms", i + 1, len(samples))

    tensors = {name: TensorProfile(lo, hi, counts[j], int(counts[j].sum()))
               for j, (name, (lo, hi)) in enumerate(zip(names, ranges)) if seen[j]}
    return Profile(tensors, model_fingerprint(proto), proto.graph.name, len(samples))
