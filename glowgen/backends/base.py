"""The interface every backend implements, and the registry of backends.

A backend is what runs a compiled program.  The pipeline asks it which ops it implements
(lowering leaves those alone and rewrites the rest into them), then hands it the LIR program
with its memory plan; the backend runs its own LIR passes over that program and makes a
runner for it, or writes it out as a bundle.  Nothing outside a backend's folder knows what
is inside it: `glowgen.compile(model, backend="name")` finds it here by name.

Adding a backend is a folder and one `register_backend(MyBackend())` call (see
tests/test_backend_interface.py for a small one).
"""
from __future__ import annotations

import importlib
import mmap
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

import numpy as np

from ..errors import GlowgenError, UnsupportedError
from ..lir.ir import ALIGNMENT, Activation, Program, dynamic_views

REGIONS = ("constant", "mutable", "activation")


class Runner(Protocol):
    """A program made runnable: `run(feeds) -> outputs` on feeds already checked for names,
    shapes and element types (CompiledModel checks them: no unchecked input goes further)."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Backend:
    """What the compiler needs of a backend.  Subclasses set `name` and implement
    `implemented_ops` and `make_runner`; the rest has defaults."""

    name: str = ""
    # Options `glowgen.compile(..., **options)` passes to this backend, with their defaults.
    options: Mapping[str, Any] = {}

    # ---------------------------------------------------------------- the compiler's view
    def implemented_ops(self, registry) -> frozenset[str]:
        """The ops this backend runs natively after lowering."""
        raise NotImplementedError

    def extern_gaps(self, registry) -> list[str]:
        """The `extern` ops of the specs (the primitives lowering leaves to backends) this
        backend has no implementation of: a built-in backend must have none (checked when it
        loads, see `get_backend`)."""
        have = self.implemented_ops(registry)
        return sorted(op for op in registry.extern if op not in have)

    def lir_passes(self, options: Mapping[str, Any]) -> list[tuple[str, Callable]]:
        """(name, pass) pairs run over the program, in order, before `make_runner` or
        `write_bundle`: the backend's own decisions (packing, fusion, kernel strategies),
        recorded in the program for `glowgen dump --stage lir` to show."""
        return []

    def prepare(self, prog: Program, registry, options: Mapping[str, Any]) -> Program:
        """Run the backend's LIR passes over `prog` in place."""
        for _, lir_pass in self.lir_passes(options):
            lir_pass(prog, registry)
        return prog

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The backend's options with defaults filled in; an unknown one is an error."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise GlowgenError(f"the {self.name} backend has no option "
                               f"{', '.join(map(repr, unknown))} (its options: {known})")
        return {**self.options, **options}

    def weight_bits(self, options: Mapping[str, Any]) -> int:
        """The bits a quantizing compilation gives int8 weights when the user leaves it to
        the backend (quantization/quantizer.py: WEIGHT_BITS): 8 unless narrower weights
        run faster on the target of `options`."""
        return 8

    # ---------------------------------------------------------------- running
    def make_runner(self, prog: Program, registry, options: Mapping[str, Any]) -> Runner:
        """A runner over `prog` (already prepared)."""
        raise NotImplementedError

    def bundle_target(self, triple: Optional[str] = None, cpu: Optional[str] = None,
                      name: Optional[str] = None, source: Optional[Path] = None):
        """What a bundle is written for (target, cpu, entry-point name; `source`: the model
        file, if any), checked before anything is compiled."""
        raise UnsupportedError(f"the {self.name} backend cannot write bundles; "
                               f"use a backend that can: {', '.join(bundle_backends())}")

    def bundle_options(self, options: Mapping[str, Any], target) -> Mapping[str, Any]:
        """The options `prepare` gets for a program written as a bundle for `target` (from
        `bundle_target`): by default, the same as for running it here."""
        return options

    def write_bundle(self, prog: "Program | list[Program]", registry, out_dir, target, options: Mapping[str, Any]):
        """Write `prog` (already prepared) for `target` (from `bundle_target`) into `out_dir`;
        a list of programs is one model compiled for several sets of input shapes, written
        as one bundle of shape variants."""
        raise UnsupportedError(f"the {self.name} backend cannot write bundles; "
                               f"use a backend that can: {', '.join(bundle_backends())}")

    # ---------------------------------------------------------------- the device
    def device_memory(self) -> int:
        """Bytes of memory a program on this backend may use (default: what the machine has
        available now)."""
        return available_memory()

    def device_threads(self) -> int:
        """Threads this backend can run a program on."""
        return os.cpu_count() or 1

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


# -------------------------------------------------------------------------- execution contexts
class ContextPool:
    """Execution contexts, as Glow has them: each call of a compiled program runs in a context
    that owns the memory the call writes (the mutable and activation regions, the output
    arrays); the constant weights are shared and only read.  A call takes a free context or
    makes one, and gives it back, so calls from any number of threads run at once without
    sharing a byte, and a steady stream of calls allocates nothing."""

    def __init__(self, make: Callable[[], Any]):
        self._make = make
        self._free: list = []
        self.created = 0                 # contexts made so far: the most calls ever at once

    # list.pop and list.append are atomic, so the pool needs no lock of its own: a call on the
    # hot path of a small model pays well under a microsecond for its context.
    def acquire(self):
        try:
            return self._free.pop()
        except IndexError:
            self.created += 1            # (a count for tests and reports; races only undercount)
            return self._make()

    def release(self, ctx) -> None:
        self._free.append(ctx)


# -------------------------------------------------------------------------- helpers
# Regions from this size up lie in memory of their own, in transparent huge pages where the
# kernel grants them (huge_page_bytes).
HUGE_PAGE_MIN_BYTES = 1 << 20
HUGE_PAGE = 2 << 20


def aligned_bytes(size: int) -> np.ndarray:
    """`size` zeroed bytes whose first byte is ALIGNMENT-aligned (what generated code and
    memory plans assume of every region); a large region in huge pages (huge_page_bytes)."""
    if size >= HUGE_PAGE_MIN_BYTES:
        region = huge_page_bytes(size)
        if region is not None:
            return region
    raw = np.zeros(size + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + size]


def huge_page_bytes(size: int) -> Optional[np.ndarray]:
    """`size` zeroed bytes from a private anonymous mapping of their own, starting on a 2 MB
    boundary and advised into transparent huge pages (MADV_HUGEPAGE: Linux's default THP
    mode, `madvise`, grants them only so), or None where the platform has no such mapping.
    In 4 KB pages the same model's weights ran at different speeds from one allocation to
    the next (which L2 sets their pages fall in): ResNet-50 int8, three compiles in one
    process, one thread, Emerald Rapids, sums of per-step minima 14.09-14.31, 14.29-14.65,
    13.86-13.94 ms (its 3x3 512s at 7 x 7 800-860 us, or 700-714); in huge pages 13.94-14.09,
    the 3x3s 705-715 every time."""
    if not (hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")):
        return None
    try:
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return None
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass                            # (THP off: 4 KB pages, as np.zeros's)
    raw = np.frombuffer(mapping, np.uint8)  # (holds the mapping open for as long as it lives)
    start = (-raw.ctypes.data) % HUGE_PAGE
    return raw[start:start + size]


def region_view(regions: Mapping[str, np.ndarray], buf) -> np.ndarray:
    """The NumPy view of LIR buffer `buf` at its planned place in `regions` (a loop's slice
    of a tensor, ir.SliceView, where its loop counter stands now)."""
    root = buf.root()
    region = "activation" if isinstance(root, Activation) else root.region
    if buf.nbytes == 0:
        return np.empty(buf.type.shape, buf.type.np_dtype)
    offset = root.offset
    for view in dynamic_views(buf):
        counter = int(region_view(regions, view.counter).reshape(-1)[0])
        offset += view.index(counter) * view.slice_bytes
    return np.ndarray(buf.type.shape, buf.type.np_dtype, buffer=regions[region], offset=offset)


def prepare_output_dir(out_dir) -> "Path":
    """`out_dir`, created if need be; an error now if it cannot be written (before a long
    compilation rather than after)."""
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise GlowgenError(f"output directory {str(d)!r} exists and is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GlowgenError(f"cannot create output directory {str(d)!r}: {e.strerror or e}") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise GlowgenError(f"output directory {str(d)!r} is not writable")
    return d


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, or physical memory where that is not readable."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


# -------------------------------------------------------------------------- registry
# Built-in backends load on first use (the cpu backend imports llvmlite).
_BUILTIN = {"cpu": "glowgen.backends.cpu:CpuBackend",
            "interpreter": "glowgen.backends.interpreter:InterpreterBackend"}
_REGISTERED: dict[str, Backend] = {}

DEFAULT_BACKEND = "cpu"


def register_backend(backend: Backend, replace: bool = False) -> Backend:
    """Make `backend` available by its name to glowgen.compile, the CLI and the runtime."""
    if not backend.name or not isinstance(backend.name, str):
        raise GlowgenError(f"{type(backend).__name__} has no name: set its `name` attribute")
    if not replace and (backend.name in _REGISTERED or backend.name in _BUILTIN):
        raise GlowgenError(f"a backend named {backend.name!r} is registered already "
                           f"(pass replace=True to replace it)")
    _REGISTERED[backend.name] = backend
    return backend


def unregister_backend(name: str) -> None:
    _REGISTERED.pop(name, None)


def backend_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def get_backend(backend: "str | Backend") -> Backend:
    """The backend of that name (or `backend` itself, if it is one)."""
    if isinstance(backend, Backend):
        return backend
    if backend in _REGISTERED:
        return _REGISTERED[backend]
    if backend in _BUILTIN:
        module, cls = _BUILTIN[backend].split(":")
        instance = getattr(importlib.import_module(module), cls)()
        check_externs(instance)
        _REGISTERED[backend] = instance
        return instance
    raise GlowgenError(f"unknown backend {backend!r}; available: {', '.join(backend_names())}")


def check_externs(backend: Backend, registry=None) -> None:
    """An error listing the spec's `extern` ops `backend` lacks (for the default registry
    unless given): every built-in backend implements them all, and one that does not is
    found when it loads rather than when a model happens to need the op."""
    if registry is None:
        from ..engine.registry import Registry
        registry = Registry.default()
    gaps = backend.extern_gaps(registry)
    if gaps:
        raise GlowgenError(f"the {backend.name} backend has no implementation of the extern "
                           f"op{'s' if len(gaps) > 1 else ''} {', '.join(gaps)} "
                           f"(specs/cpu_kernels.glowdef): implement "
                           f"{'them' if len(gaps) > 1 else 'it'} in the backend, or take "
                           f"{'them' if len(gaps) > 1 else 'it'} off the extern list")


def bundle_backends() -> list[str]:
    return [n for n in backend_names()
            if type(get_backend(n)).bundle_target is not Backend.bundle_target]
