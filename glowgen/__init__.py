"""glowgen: an ahead-of-time compiler from ONNX to fast native code, specs first."""
from .errors import GlowgenError

__version__ = "0.1.0"

__all__ = ["GlowgenError", "compile", "CompiledModel", "write_bundle", "from_torch", "profile",
           "load_profile"]


def from_torch(module, example_inputs, **compile_options):
    """Compile a `torch.nn.Module` for inputs like `example_inputs` (a tensor or a tuple of
    them): a callable taking and returning tensors; its `.compiled` is the CompiledModel.
    Keyword arguments are `glowgen.compile`'s.  PyTorch is imported only here."""
    from .frontend.torch_export import from_torch as _from_torch
    return _from_torch(module, example_inputs, **compile_options)


def __getattr__(name):
    # The API pulls in the whole pipeline; import it only when asked for.
    if name in ("compile", "CompiledModel", "write_bundle"):
        from . import api
        return getattr(api, name)
    if name in ("profile", "load_profile"):
        from . import quantization
        return getattr(quantization, name)
    raise AttributeError(name)
