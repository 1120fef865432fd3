"""Registration of the Python helpers the specs call.

A helper is a plain function of numbers, shapes and lists, marked with @helper in one of the
modules of this package.  specs/helpers.glowdef declares each one with its parameters
(`helper conv.auto_pads(mode, spatial, kernel, strides, dilations, pads)`); `glowgen regen`
checks every declaration against the function registered here and every call in the specs
against its declaration, so a misspelled or miscounted call is a spec error at file:line.
"""
from __future__ import annotations

from typing import Callable

# helper name -> the function.  Names are unique across the modules: the specs call a helper
# by its bare name.
HELPERS: dict[str, Callable] = {}


def helper(fn: Callable) -> Callable:
    """Register `fn` under its name as a helper the specs may declare and call."""
    name = fn.__name__
    if name in HELPERS and HELPERS[name] is not fn:
        raise RuntimeError(f"spec helper {name!r} is registered twice ({HELPERS[name].__module__} "
                           f"and {fn.__module__})")
    HELPERS[name] = fn
    return fn


def module_of(fn: Callable) -> str:
    """The short name of the speclib module that defines `fn` ('conv' for glowgen.speclib.conv)."""
    return fn.__module__.rsplit(".", 1)[-1]
