"""The Python helpers of the spec language, by domain.

Shape algebra and compile-time tables too loopy for the expression language live here, one
module per domain; each function the specs call is marked @helper (registry.py) and declared
in specs/helpers.glowdef with its parameters.  Generated code calls them as
`sl.<module>.<name>(...)`.
"""
from . import conv, quant, resize, rnn, shapes, signal  # noqa: F401  (registers the helpers)
from .registry import HELPERS, module_of  # noqa: F401

MODULES = {m.__name__.rsplit(".", 1)[-1]: m for m in (conv, quant, resize, rnn, shapes, signal)}
