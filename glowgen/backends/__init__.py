"""Backends: what runs a compiled program.  The interface and the registry are in base.py."""
from .base import (DEFAULT_BACKEND, Backend, backend_names, get_backend, register_backend,
                   unregister_backend)

__all__ = ["DEFAULT_BACKEND", "Backend", "backend_names", "get_backend", "register_backend",
           "unregister_backend"]
