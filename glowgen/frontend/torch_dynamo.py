"""The `torch.compile` backend "glowgen" (registered through the `torch_dynamo_backends`
entry point in pyproject.toml): `torch.compile(model, backend="glowgen")`.

Dynamo hands a backend each FX graph it captured, with the real tensors of one call as
examples; code it cannot capture (a graph break) it runs in eager Python between graphs.
Since PyTorch 2.5 dynamo lifts a module's parameters and buffers into graph inputs; they carry
`_dynamo_static_input_type`.  An inference compiler wants them as constants (BatchNorm folded
into the convolution, weights packed once), so they are frozen into the compiled model, as
inductor's `freezing` does; a call whose weights are other tensors, or were changed in place
(their version counter moved), recompiles.

Each graph goes through ONNX (frontend/torch_export.py: one front end, PyTorch's own
exporter): the weights become initializers of a small module that calls the graph.  It is
compiled at its first call rather than when dynamo hands it over: exporting runs PyTorch's
tracer, which should not run inside dynamo's own, and the first call has concrete shapes even
for a graph dynamo made dynamic.  Compiled models are cached by the shapes and dtypes of the
graph's inputs: a second call with the same shapes runs the same native code.

A graph glowgen cannot compile (an op it lacks, an export failure) runs eagerly, with a
warning on the `glowgen.torch` logger, unless `options={"fallback": False}`; a call that
needs gradients runs eagerly too (glowgen computes none): wrap inference in torch.no_grad().
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Optional

from ..errors import GlowgenError
from .torch_export import (default_threads, export_onnx, import_torch, input_names_of, log,
                           numpy_to_tensor, tensor_to_numpy)

# How many graphs the backend was handed, compiled natively, and ran eagerly instead (the
# tests read these to be sure glowgen, not an eager fallback, computed their answers).
stats = {"graphs": 0, "compiled": 0, "fallbacks": 0, "eager_calls": 0}


def _static_kind(node, example) -> Optional[str]:
    tensor_dict = node.meta.get("tensor_dict", {}) if node is not None else {}
    return tensor_dict.get("_dynamo_static_input_type") or getattr(example, "_dynamo_static_input_type", None)


def _version(t) -> int:
    """A tensor's version counter (it moves on every in-place write); an inference-mode
    tensor has none and can only be written inside inference mode: -1."""
    try:
        return t._version
    except RuntimeError:
        return -1


def _frozen_module(gm, static: dict, scalars: dict, n_args: int):
    """The graph with its weights as buffers and its non-tensor inputs (the SymInts of a
    dynamic graph) fixed, called with the other tensors: a torch.nn.Module to export."""
    torch = import_torch()

    class Frozen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm
            for i, t in static.items():
                self.register_buffer(f"w{i}", t.detach(), persistent=False)

        def forward(self, *tensors):
            it = iter(tensors)
            args = []
            for i in range(n_args):
                if i in static:
                    args.append(getattr(self, f"w{i}"))
                elif i in scalars:
                    args.append(scalars[i])
                else:
                    args.append(next(it))
            out = self.gm(*args)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return Frozen()


class GlowgenGraph:
    """What the backend returns for one FX graph: called by dynamo with the graph's inputs
    (weights included), it returns the graph's outputs."""

    def __init__(self, gm, example_inputs, options: Mapping[str, Any]):
        torch = import_torch()
        options = dict(options or {})
        self.fallback = bool(options.pop("fallback", True))
        self.compile_options = default_threads(options)
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.n_args = len(example_inputs)
        self.static = [i for i, (n, x) in enumerate(zip(placeholders, example_inputs))
                       if isinstance(x, torch.Tensor) and _static_kind(n, x)]
        static = set(self.static)
        self.others = [i for i in range(self.n_args) if i not in static]
        self.cache: dict = {}           # input signature -> (compiled, feed index, frozen)
        self.lock = threading.Lock()
        self.eager_reason: Optional[str] = None
        self.warned_grad = False
        stats["graphs"] += 1

    # -- calling ---------------------------------------------------------------------------

    def __call__(self, *args):
        torch = import_torch()
        if self.eager_reason is not None:
            return self._eager(args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            if not self.warned_grad:
                self.warned_grad = True
                log.warning("glowgen: a call needs gradients; glowgen computes none, so this "
                            "graph runs eagerly (wrap inference in torch.no_grad())")
            return self._eager(args)
        key = self._signature(args)
        entry = self.cache.get(key)
        if entry is None or not self._weights_unchanged(entry[2], args):
            with self.lock:
                entry = self.cache.get(key)
                if entry is None or not self._weights_unchanged(entry[2], args):
                    entry = self._compile(key, args)
                    if entry is None:
                        return self._eager(args)
                    self.cache[key] = entry
        compiled, feeds_of, _ = entry
        out = compiled.run({name: tensor_to_numpy(args[i], f"graph input {i}")
                            for name, i in feeds_of})
        return tuple(numpy_to_tensor(out[n]) for n in compiled.output_names)

    def _eager(self, args):
        stats["eager_calls"] += 1
        return self.gm(*args)

    def _signature(self, args) -> tuple:
        # The inputs other than the weights (which _weights_unchanged checks by identity):
        # shapes and dtypes of tensors, values of the SymInts of a dynamic graph.
        torch = import_torch()
        key = []
        for a in (args[i] for i in self.others):
            if isinstance(a, torch.Tensor):
                key.append((tuple(a.shape), a.dtype))
            else:
                key.append(int(a) if isinstance(a, (int, torch.SymInt)) else repr(a))
        return tuple(key)

    def _weights_unchanged(self, frozen: dict, args) -> bool:
        # The same tensor objects, not written to since they were frozen.
        for i, (t, version) in frozen.items():
            a = args[i]
            if a is not t or _version(a) != version:
                return False
        return True

    # -- compiling -------------------------------------------------------------------------

    def _compile(self, key, args):
        torch = import_torch()
        from .. import api
        static = {i: args[i] for i in self.static}
        scalars = {i: args[i] for i in range(self.n_args) if not isinstance(args[i], torch.Tensor)}
        dynamic = [i for i in range(self.n_args) if i not in static and i not in scalars]
        names = [f"input_{i}" for i in dynamic]
        try:
            module = _frozen_module(self.gm, static, scalars, self.n_args)
            with torch.no_grad():
                proto, _ = export_onnx(module, tuple(args[i] for i in dynamic), names,
                                       what="torch.compile graph")
                n_out = len(module(*(args[i] for i in dynamic)))
            kept = set(input_names_of(proto))
            feeds_of = [(f"input_{i}", i) for i in dynamic if f"input_{i}" in kept]
            compiled = api.compile(proto, **self.compile_options)
            if len(compiled.output_names) != n_out:
                raise GlowgenError(f"the ONNX export has {len(compiled.output_names)} outputs, "
                                   f"the graph {n_out}")
        except Exception as e:
            if not self.fallback:
                raise
            stats["fallbacks"] += 1
            self.eager_reason = f"{type(e).__name__}: {e}"
            log.warning("glowgen: a graph of %d nodes runs eagerly: %s", len(self.gm.graph.nodes),
                        self.eager_reason)
            return None
        stats["compiled"] += 1
        log.info("glowgen: compiled a graph of %d nodes for inputs %s (%d weights frozen)",
                 len(self.gm.graph.nodes), [list(args[i].shape) for i in dynamic], len(static))
        frozen = {i: (t, _version(t)) for i, t in static.items()}
        return compiled, feeds_of, frozen


def glowgen_backend(gm, example_inputs, options: Optional[Mapping[str, Any]] = None,
                    mode: Optional[str] = None):
    """The `torch.compile` backend: `torch.compile(model, backend="glowgen",
    options={"threads": 4, "fallback": False})`.  `options` are `glowgen.compile`'s keyword
    arguments plus `fallback` (default True: a graph glowgen cannot compile runs eagerly)."""
    return GlowgenGraph(gm, example_inputs, options or {})
