"""A third backend, defined here through the Backend interface (glowgen/backends/base.py):
a handful of primitives in plain NumPy, everything else refused.  The pipeline lowers for
it, the API runs models on it, and onnxruntime is the oracle."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import glowgen
from glowgen import api
from glowgen.backends import Backend, get_backend, register_backend, unregister_backend
from glowgen.backends.base import REGIONS, aligned_bytes, region_view
from glowgen.errors import GlowgenError, UnsupportedError
from glowgen.lir.ir import Instr

from conftest import assert_close, make_model, run_ort

# The only primitives this backend has, each a NumPy function of the node and its operands.
TINY_KERNELS = {
    "BatchMatMul": lambda node, a, b: np.matmul(a, b),
    "Reshape": lambda node, x: x.reshape(node.outputs[0].type.shape),
    "Add": lambda node, a, b: a + b,
    "Mul": lambda node, a, b: a * b,
    "Relu": lambda node, x: np.maximum(x, 0),
}


class TinyRunner:
    """Runs the LIR over real regions, like the interpreter, with only TINY_KERNELS."""

    def __init__(self, prog):
        self.prog = prog
        self.regions = {k: aligned_bytes(prog.region_sizes[k]) for k in REGIONS}
        for w in prog.constant_weights():
            region_view(self.regions, w)[...] = w.data

    def run(self, feeds):
        view = lambda buf: region_view(self.regions, buf)  # noqa: E731
        for name, w in self.prog.inputs.items():
            view(w)[...] = feeds[name]
        for ins in self.prog.instrs:
            if ins.kind in (Instr.ALLOC, Instr.DEALLOC, Instr.VIEW):
                continue
            views = [view(b) for _, b in ins.operands]
            if ins.kind == Instr.COPY:
                np.copyto(views[0], views[1])
                continue
            np.copyto(views[0], TINY_KERNELS[ins.kind](ins.node, *views[1:]))
        return {name: view(w).copy() for name, w in self.prog.outputs.items()}


class TinyBackend(Backend):
    name = "tiny"
    options = {"trace": False}

    def __init__(self):
        self.prepared = []

    def implemented_ops(self, registry):
        return frozenset(TINY_KERNELS)

    def lir_passes(self, options):
        return [("count_instructions", lambda prog, registry: self.prepared.append(len(prog.instrs)))]

    def make_runner(self, prog, registry, options):
        return TinyRunner(prog)


@pytest.fixture
def tiny():
    backend = register_backend(TinyBackend())
    yield backend
    unregister_backend("tiny")


def _gemm_relu_model(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], alpha=0.5),
             helper.make_node("Relu", ["g"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b}), {"x": x}


def test_pipeline_lowers_to_what_a_new_backend_implements(tiny):
    model, _ = _gemm_relu_model(np.random.default_rng(0))
    function = api.load(model)
    api.optimize(function, backend="tiny")
    ops = {n.OP for n in function.nodes}
    assert ops <= set(TINY_KERNELS), ops
    assert "BatchMatMul" in ops     # Gemm became a product plus (scaled) bias


def test_a_model_runs_on_a_new_backend_and_matches_onnxruntime(tiny):
    model, feeds = _gemm_relu_model(np.random.default_rng(1))
    compiled = glowgen.compile(model, backend="tiny")
    assert compiled.backend == "tiny"
    assert tiny.prepared, "the backend's own LIR passes ran"
    assert_close(compiled.run(feeds), run_ort(model, feeds), rtol=1e-5, atol=1e-5)


def test_a_new_backend_refuses_what_it_cannot_run(tiny):
    x = np.ones((2, 3), np.float32)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"])], {"x": x}, ["y"])
    with pytest.raises(GlowgenError, match="tiny"):
        glowgen.compile(model, backend="tiny")


def test_backend_options_are_checked_and_bundles_refused(tiny):
    model, _ = _gemm_relu_model(np.random.default_rng(2))
    with pytest.raises(GlowgenError, match="no option 'stacking'"):
        glowgen.compile(model, backend="tiny", stacking=False)
    with pytest.raises(UnsupportedError, match="cannot write bundles"):
        glowgen.write_bundle(model, "unused-dir", backend="tiny")


def test_backends_are_found_by_name():
    assert get_backend("interpreter").name == "interpreter"
    with pytest.raises(GlowgenError, match="unknown backend 'nope'.*cpu.*interpreter"):
        get_backend("nope")
    with pytest.raises(GlowgenError, match="registered already"):
        register_backend(TinyBackend.__new__(type("Cpu", (TinyBackend,), {"name": "cpu"})))


def test_every_extern_op_has_a_cpu_and_an_interpreter_implementation():
    """The spec's `extern` ops (primitives lowering leaves to the backends) all have a cpu
    kernel and a NumPy reference; a missing one is an error when the backend loads."""
    from glowgen.engine.registry import Registry
    registry = Registry.default()
    assert len(registry.extern) >= 38
    for name in ("cpu", "interpreter"):
        assert get_backend(name).extern_gaps(registry) == [], name


def test_a_backend_lacking_an_extern_op_is_refused_when_it_loads():
    import copy
    from glowgen.backends.base import check_externs
    from glowgen.engine.registry import Registry
    registry = copy.copy(Registry.default())
    registry.extern = registry.extern + ("Frobnicate", "Blend")
    for name in ("cpu", "interpreter"):
        with pytest.raises(GlowgenError, match=rf"the {name} backend has no implementation of the "
                                               r"extern ops Blend, Frobnicate \(specs/cpu_kernels"):
            check_externs(get_backend(name), registry)


@pytest.mark.parametrize("size", [100, (1 << 20) + 3, 5 << 20])
def test_regions_are_zeroed_aligned_and_their_own(size):
    """aligned_bytes: zeroed, ALIGNMENT-aligned bytes; large regions from a mapping of their
    own on a 2 MB boundary (huge_page_bytes, where the platform has one), kept alive by
    the array, writable and private to it."""
    from glowgen.backends import base
    from glowgen.lir.ir import ALIGNMENT
    regions = [aligned_bytes(size) for _ in range(2)]
    for r in regions:
        assert r.nbytes == size and r.ctypes.data % ALIGNMENT == 0 and not r.any()
        if size >= base.HUGE_PAGE_MIN_BYTES and base.huge_page_bytes(1) is not None:
            assert r.ctypes.data % base.HUGE_PAGE == 0
    regions[0][::4096] = 7
    assert regions[0][-1 - (size - 1) % 4096] == 7 and not regions[1].any()


def test_regions_without_a_mapping_of_their_own(monkeypatch):
    """Where no private mapping is to be had, a large region is NumPy's zeroed bytes."""
    from glowgen.backends import base
    from glowgen.lir.ir import ALIGNMENT
    monkeypatch.setattr(base, "huge_page_bytes", lambda size: None)
    r = aligned_bytes(3 << 20)
    assert r.nbytes == 3 << 20 and not r.any() and r.ctypes.data % ALIGNMENT == 0
