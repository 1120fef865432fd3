"""The `verify py "module:function"` escape hatch: rules the spec language cannot say."""
from __future__ import annotations

import importlib
from functools import lru_cache

from ..errors import SpecError


@lru_cache(maxsize=None)
def call_py(target: str):
    """Resolve "module:function" once; the function gets (op, node, location, **names)."""
    module, _, function = target.partition(":")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as e:
        raise SpecError(f"verify py {target!r}: cannot load it ({e})") from None
