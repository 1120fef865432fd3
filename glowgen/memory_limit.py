"""The memory a compilation and its compiled model may use: `max_memory=` / `--max-memory`.

Every place that would allocate memory in proportion to a model's shapes checks the size
first, so a model too large for the machine is a `MemoryLimitError` naming the tensor and its
size, never a NumPy `ArrayMemoryError` traceback or the kernel's out-of-memory killer:

  import        each initializer before it is read, and all of them together
  folding       each result before the evaluator computes it (frontend constants and the
                fold pass), and the constants it leaves together
  memory plan   the constant weights plus one call's inputs, outputs and activation arena,
                before the backend allocates them

The default is what the machine has available when the compilation starts (the backend's
`device_memory()`, MemAvailable on Linux).
"""
from __future__ import annotations

import re
from typing import Optional, Union

from .errors import MemoryLimitError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: Union[str, int]) -> int:
    """'8G', '512M', '1.5GiB', '4096' -> bytes (binary units: 1K = 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", str(text))
        if not m:
            raise MemoryLimitError(f"max_memory {text!r}: write a number of bytes, optionally with "
                                   f"a unit: 4096, 512M, 8G, 1.5T")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise MemoryLimitError(f"max_memory must be positive, got {text!r}")
    return n


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


class MemoryLimit:
    """A byte limit and where it came from (for messages)."""

    def __init__(self, limit: int, default: bool):
        self.limit = limit
        self.default = default

    @classmethod
    def resolve(cls, max_memory: Union[None, str, int, "MemoryLimit"] = None,
                backend=None) -> "MemoryLimit":
        """`max_memory` checked; None: what `backend`'s device (or this machine) has
        available now."""
        if isinstance(max_memory, MemoryLimit):
            return max_memory
        if max_memory is None:
            from .backends.base import available_memory
            return cls(backend.device_memory() if backend is not None else available_memory(), True)
        return cls(parse_bytes(max_memory), False)

    def describe(self) -> str:
        source = " (what this machine has available)" if self.default else ""
        return f"max_memory {format_bytes(self.limit)}{source}"

    def check(self, what: str, nbytes: int, action: str = "") -> None:
        """Refuse `nbytes` for `what` ("constant 'w' f32[...]") beyond the limit."""
        if nbytes > self.limit:
            raise MemoryLimitError(
                f"{what} needs {format_bytes(nbytes)}, more than the {self.describe()}"
                f"{'; ' + action if action else ''}. If the shapes are right and the machine has "
                f"the memory, raise the limit: max_memory= (Python) or --max-memory (command line)")


def check_limit(limit: Optional[MemoryLimit], what: str, nbytes: int, action: str = "") -> None:
    if limit is not None:
        limit.check(what, nbytes, action)
