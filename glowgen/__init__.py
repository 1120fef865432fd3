"""glowgen: an ahead-of-time compiler from ONNX to fast native code, specs first."""
from .errors import GlowgenError

__version__ = "0.1.0"

__all__ = ["GlowgenError", "compile", "CompiledModel", "write_bundle"]


def __getattr__(name):
    # The API pulls in the whole pipeline; import it only when asked for.
    if name in ("compile", "CompiledModel", "write_bundle"):
        from . import api
        return getattr(api, name)
    raise AttributeError(name)
