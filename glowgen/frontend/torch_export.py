"""PyTorch to glowgen through ONNX: `glowgen.from_torch(module, example_inputs)`.

The module is exported in memory with PyTorch's own ONNX exporter and compiled like any ONNX
model.  Going through ONNX rather than translating torch ops one by one keeps a single
front end (frontend/onnx.py, the one the conformance suite checks) and lets PyTorch's exporter,
which PyTorch maintains for every op it has, do the decompositions.

The exporter is the dynamo-based one (`torch.onnx.export(..., dynamo=True)`, which needs the
onnxscript package); where it fails or is missing, the TorchScript exporter (dynamo=False),
and a log line on the `glowgen.torch` logger says which was used.

Only this module and frontend/torch_dynamo.py import torch, and only when called:
`import glowgen` never does.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..errors import GlowgenError, InputError

log = logging.getLogger("glowgen.torch")

# The CPU wheel the project tests with; the `torch` extra pins it.
TESTED_TORCH = "2.13.0"


def import_torch():
    try:
        import torch
    except ImportError:
        raise GlowgenError("glowgen's PyTorch front door needs PyTorch: "
                           "pip install 'glowgen[torch]'") from None
    return torch


@contextlib.contextmanager
def _quietly(caught: Optional[list] = None):
    """The exporters print progress, log their passes and warn about things that are no
    concern of ours (deprecations, torchvision ops they skip registering): keep all that off
    the user's terminal; what matters (which exporter, why not the other) is our log line."""
    loggers = {name: logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")}
    levels = {name: lg.level for name, lg in loggers.items()}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        for lg in loggers.values():
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, lg in loggers.items():
                lg.setLevel(levels[name])
            if caught is not None:
                caught.extend(recorded)


def export_onnx(module, args: tuple, input_names: Sequence[str], what: str = "module"):
    """`module(*args)` as an ONNX ModelProto with inputs `input_names` (the tensors of `args`,
    in order) and its weights as initializers.  Returns (proto, exporter name)."""
    torch = import_torch()
    errors = []
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter needs it)
    except ImportError:
        errors.append("dynamo exporter: onnxscript is not installed (pip install 'glowgen[torch]')")
    else:
        try:
            with _quietly():
                program = torch.onnx.export(module, args, dynamo=True, verbose=False,
                                            input_names=list(input_names), optimize=True)
            log.info("glowgen: %s exported to ONNX with torch.onnx.export(dynamo=True)", what)
            return program.model_proto, "dynamo"
        except Exception as e:           # any exporter failure: try the other exporter
            errors.append(f"dynamo exporter: {_first_line(e)}")
    try:
        buf = io.BytesIO()
        caught: list = []
        with _quietly(caught):
            torch.onnx.export(module, args, buf, dynamo=False, input_names=list(input_names),
                              training=torch.onnx.TrainingMode.PRESERVE, opset_version=17)
        log.warning("glowgen: %s exported to ONNX with the TorchScript exporter "
                    "(torch.onnx.export(dynamo=False)) because the dynamo exporter failed: %s",
                    what, errors[0])
        # The tracer records one path through the code: what it says about branches on
        # tensor values or Python numbers it froze must reach the user.
        for w in caught:
            if issubclass(w.category, torch.jit.TracerWarning):
                log.warning("glowgen: the trace of %s may not hold for other inputs: %s (%s:%s)",
                            what, str(w.message).splitlines()[0], w.filename, w.lineno)
        import onnx
        return onnx.load_from_string(buf.getvalue()), "torchscript"
    except Exception as e:
        errors.append(f"TorchScript exporter: {_first_line(e)}")
    raise GlowgenError(f"could not export {what} to ONNX; " + "; ".join(errors)
                       + ". Simplify the module's forward or file an issue with the module")


def _first_line(e: BaseException) -> str:
    """The first line of the innermost cause (the exporters wrap the op that failed in a
    generic 'failed to convert' error), without terminal colours."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def input_names_of(proto) -> list[str]:
    """The graph inputs that are not initializers, in order: the tensors the caller feeds."""
    init = {t.name for t in proto.graph.initializer}
    return [vi.name for vi in proto.graph.input if vi.name not in init]


def tensor_to_numpy(t, where: str) -> np.ndarray:
    """A CPU tensor's memory as a numpy array, without a copy (detach() and numpy() are views);
    the runner copies only what is not C-contiguous and aligned."""
    if t.device.type != "cpu":
        raise InputError(f"{where} is on {t.device}; glowgen runs on the CPU: pass t.cpu()")
    torch = import_torch()
    if t.layout != torch.strided:
        raise InputError(f"{where} has layout {t.layout}; glowgen takes dense tensors: t.to_dense()")
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    try:
        return t.detach().numpy()
    except TypeError:                   # bfloat16 and others numpy has no type for
        raise InputError(f"{where} has dtype {t.dtype}, which glowgen's PyTorch front door "
                         "does not take yet; convert it (t.float())") from None


def numpy_to_tensor(arr: np.ndarray):
    """The runner's fresh output array as a tensor sharing its memory (from_numpy keeps the
    array alive, so the runner does not reuse it while the tensor lives)."""
    torch = import_torch()
    if not arr.flags.writeable:                 # from_numpy warns on read-only arrays
        arr = arr.copy()
    return torch.from_numpy(arr)


def default_threads(options: Mapping[str, Any]) -> dict:
    """Compile options with `threads` defaulting to PyTorch's own thread count, so that a
    model runs on as many threads under glowgen as under eager PyTorch
    (torch.set_num_threads)."""
    options = dict(options)
    if "threads" not in options and options.get("backend", "cpu") == "cpu":
        options["threads"] = import_torch().get_num_threads()
    return options


def _train_dependent():
    from torch import nn
    return (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


class TorchCompiledModel:
    """What `glowgen.from_torch` returns: call it with tensors like the module (positional
    arguments, same shapes and dtypes as the examples); it returns tensors in the module's
    output structure.  `.compiled` is the glowgen `CompiledModel`, `.onnx` the exported
    ModelProto, `.exporter` "dynamo" or "torchscript"."""

    def __init__(self, module, example_inputs: tuple, **compile_options):
        torch = import_torch()
        from torch.utils import _pytree as pytree
        from .. import api
        name = type(module).__name__
        modules = module.modules() if isinstance(module, torch.nn.Module) else ()
        if any(m.training and isinstance(m, _train_dependent()) for m in modules):
            log.warning("glowgen: %s has BatchNorm or Dropout in training mode; glowgen "
                        "compiles what it computes in that mode (call module.eval() first for "
                        "inference)", name)
        args = tuple(example_inputs)
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                raise InputError(f"from_torch: example input {i} is a {type(a).__name__}; "
                                 "glowgen compiles modules called with tensors only")
        self.n_inputs = len(args)
        self.example_types = [(tuple(a.shape), a.dtype) for a in args]
        with torch.no_grad():
            out = module(*args)
        leaves, self.out_spec = pytree.tree_flatten(out)
        if not all(isinstance(x, torch.Tensor) for x in leaves):
            raise GlowgenError(f"from_torch: {name} returns something other than tensors "
                               f"({', '.join(sorted({type(x).__name__ for x in leaves}))}); "
                               "glowgen compiles modules whose outputs are tensors")
        self.onnx, self.exporter = export_onnx(module, args, [f"input_{i}" for i in range(len(args))],
                                               what=name)
        self.feed_names = input_names_of(self.onnx)
        if len(self.feed_names) != len(args):
            # The exporter drops inputs the graph does not use; feed the ones it kept.
            kept = set(self.feed_names)
            self._feed_index = [i for i in range(len(args)) if f"input_{i}" in kept]
        else:
            self._feed_index = list(range(len(args)))
        self.compiled = api.compile(self.onnx, **default_threads(compile_options))
        if len(self.compiled.output_names) != len(leaves):
            raise GlowgenError(f"from_torch: the ONNX export of {name} has "
                               f"{len(self.compiled.output_names)} outputs, the module "
                               f"{len(leaves)}")

    def __call__(self, *args):
        from torch.utils import _pytree as pytree
        if len(args) != self.n_inputs:
            raise InputError(f"the compiled module takes {self.n_inputs} tensors, got {len(args)}")
        feeds = {}
        for name, i in zip(self.feed_names, self._feed_index):
            feeds[name] = tensor_to_numpy(args[i], f"input {i}")
        out = self.compiled.run(feeds)
        return pytree.tree_unflatten([numpy_to_tensor(out[n]) for n in self.compiled.output_names],
                                     self.out_spec)

    def __repr__(self) -> str:
        return f"<glowgen.from_torch ({self.exporter} exporter) {self.compiled!r}>"


def from_torch(module, example_inputs, **compile_options) -> TorchCompiledModel:
    """Compile a `torch.nn.Module` (or any callable torch.onnx.export takes) for inputs shaped
    like `example_inputs` (a tensor or a tuple of tensors).  Keyword arguments are
    `glowgen.compile`'s (backend="cpu", threads=...; threads defaults to
    torch.get_num_threads()).  The result computes no gradients."""
    torch = import_torch()
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InputError("from_torch: example_inputs is a tensor or a tuple of tensors, got "
                         f"{type(example_inputs).__name__}")
    return TorchCompiledModel(module, tuple(example_inputs), **compile_options)
